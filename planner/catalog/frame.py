"""The index frame: every file's counted rows as one Polars frame, and its fingerprint.

:func:`build_frame` checks that every file's token column gives the same batches and lays
every file's rows out a field at a time (each file's let go once copied: docs/design.md,
"Bytes a row group"); :func:`fingerprint_of` hashes its files' names, rows and tokens.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl
from numpy.typing import NDArray

from planner.catalog.counting import Counted
from planner.catalog.files import FileEntry
from planner.catalog.rowlists import INDEX_SCHEMA, ROW_FIELDS
from planner.errors import DataError

__all__ = ["LaidOut", "build_frame", "fingerprint_of"]


def fingerprint_of(frame: pl.DataFrame, extra: str = "") -> str:
    """sha256 of ``name\trows\ttokens\n`` for every row group, then ``extra``.

    The lines are formatted by Polars, a million row groups a second, in slices so
    that the text held at once stays small.
    """
    h = hashlib.sha256()
    step = 1 << 12  # Polars' formatting takes about 450 B a line while it runs: 2 MB a slice
    for a in range(0, frame.height, step):
        lines = frame.slice(a, step).select(pl.format("{}\t{}\t{}\n", "file", "rows", "tokens").str.join(""))
        h.update(lines.item().encode())
    h.update(extra.encode())
    return h.hexdigest()


@dataclass(frozen=True, slots=True)
class LaidOut:
    """Every file's rows in frame order already (the shares of a job: :func:`planner.catalog.jobshare.take_counted`).

    ``per``: each file's row-group count; ``fields``: one int64 column a field of
    :data:`~planner.catalog.rowlists.ROW_FIELDS`, which the frame takes over without a copy.
    """

    per: NDArray[np.int64]
    fields: list[NDArray[np.int64]]


def build_frame(entries: list[FileEntry], counted: list[Counted], laid_out: LaidOut | None = None) -> pl.DataFrame:
    """The index frame of every file's rows; every file's column must give the same batches.

    The rows are ``counted``'s, or ``laid_out``'s (then ``counted`` gives each file's column alone).
    """
    first = counted[0]
    names = []
    for entry, c in zip(entries, counted, strict=True):
        # list and large_list, and integer widths, may differ between files as long
        # as the batches they give have the same dtype.
        if c.column != first.column or c.dtype != first.dtype:
            msg = (
                f"{entry.stat.location}: token column {c.column!r} of type {c.stored} (batches of "
                f"{c.dtype}) differs from {first.column!r} of type {first.stored} (batches of "
                f"{first.dtype}) in {entries[0].stat.location}; all files must agree: rewrite this file "
                "or pass column="
            )
            raise DataError(msg)
        names.append(entry.stat.name)
    if laid_out is None:
        per = np.asarray([len(c.rows) for c in counted], np.int64)
        fields = _lay_out(counted, int(per.sum()))
    else:
        per, fields = laid_out.per, laid_out.fields
    file_index = np.repeat(np.arange(len(entries), dtype=np.int64), per)
    cols: dict[str, Any] = {
        "file": pl.Series(names, dtype=pl.String).gather(file_index) if len(file_index) else [],
        "file_index": file_index,
        **{name: fields[k] for k, name in enumerate(ROW_FIELDS) if name != "needs_check"},
        "needs_check": fields[ROW_FIELDS.index("needs_check")].astype(bool),
    }
    return pl.DataFrame(cols).select(
        pl.col(k).cast(v) if k in cols else pl.lit(None, v).alias(k) for k, v in INDEX_SCHEMA.items()
    )


def _lay_out(counted: list[Counted], total: int) -> list[NDArray[np.int64]]:
    """Each field of every file's rows as one column, a file at a time, each file's rows let go once copied.

    ``counted`` keeps their columns and dtypes, not their rows: the peak is the frame and
    what is left of the rows, not the rows twice (docs/design.md, "Bytes a row group").
    """
    fields = [np.empty(total, np.int64) for _ in ROW_FIELDS]
    at = 0
    for i, c in enumerate(counted):
        rows = np.asarray(c.rows, dtype=np.int64).reshape(-1, len(ROW_FIELDS))
        for k, out in enumerate(fields):
            out[at : at + len(rows)] = rows[:, k]
        at += len(rows)
        counted[i] = dataclasses.replace(c, rows=_NO_ROWS)
        del rows
    return fields


_NO_ROWS = np.zeros((0, len(ROW_FIELDS)), np.int64)
