"""The documents a ``locate`` asks about: a predicate's matches or explicit ``(file, row)`` pairs.

Either way the answer is the documents' global row groups and rows (the index's row
groups, each source's own under a mixture), checked: a predicate naming a missing column,
or a row outside the dataset, is an error naming it and the fix.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import numpy as np
import polars as pl
import pyarrow as pa

from planner.arraytypes import I64
from planner.catalog.datasetindex import Index
from planner.catalog.rowgroups import RowGroupIndex
from planner.errors import ConfigError, SelectionError, one_line
from plitzer.selection.evaluate import SelectionPass
from plitzer.selection.predicate import available_columns, check_predicate, missing_column, normalize, predicate_columns

__all__ = ["Rows", "part_of", "target_documents"]


Rows = Sequence[tuple[Any, ...]] | pl.DataFrame
"""Explicit documents: ``(file, row)`` or ``(source, file, row)`` pairs, or a frame of them."""


def _parts(ix: RowGroupIndex) -> list[tuple[str | None, Index, int]]:
    """(source name, its row-group index, its first global row group) of every source."""
    if ix.mixed:
        base = np.concatenate([[0], np.cumsum([p.row_groups for p in ix.parts])])
        return [(n, p, int(base[i])) for i, (n, p) in enumerate(zip(ix.names, ix.parts, strict=True))]
    return [(None, cast("Index", ix), 0)]


def part_of(ix: RowGroupIndex, rg: int) -> tuple[Index, int]:
    sub, local = ix.part(rg)
    return cast("Index", sub), local


# -- the documents: a predicate, or rows given by file and row ------------------------


def _bind(part: Index, where: str) -> tuple[str, list[str]]:
    """The normalized predicate and the columns it reads; a SelectionError that lists the columns."""
    if not part.capabilities.tokenizes:
        norm = normalize(where, [*available_columns(part), part.column])
        return norm, check_predicate(part, norm, None)
    # A text source: its text column may be searched too (a contamination audit's question).
    import duckdb

    schema = part.schema()
    names = list(schema.names)
    norm = normalize(where, names)
    con = duckdb.connect()
    try:
        con.register("t", pa.table({c: pa.array([], schema.field(c).type) for c in names}))
        con.sql(f"select ({norm}) as keep from t").fetchall()  # noqa: S608  # bound on no rows: never runs on data
    except duckdb.Error as e:
        text = one_line(e)
        msg = f"where={norm!r} does not bind to {part.source!r}: {text}; available columns: {', '.join(names)}"
        raise SelectionError(msg, predicate=norm, column=missing_column(text), available=tuple(names)) from e
    finally:
        con.close()
    return norm, predicate_columns(norm, names)


def _matches(part: Index, where: str, columns: list[str], threads: int, progress: bool | None) -> list[I64]:
    """Per row group of ``part``: the stream ordinals of the documents ``where`` selects."""
    from tqdm import tqdm

    from planner.progress import progress_enabled

    p = SelectionPass(ix=part, where=where, columns=columns, length_column=None)
    stored = part.frame["rows"].to_list()

    def one(rg: int) -> I64:
        if stored[rg] == 0:
            return np.zeros(0, np.int64)
        mask = p.mask(p.table(rg, stored[rg]))
        kept = part.selected_rows(rg)
        if kept is not None:
            mask = mask[kept]  # the run's selection: its rows are the stream's
        return np.flatnonzero(mask).astype(np.int64)

    with ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="plitzer-locate") as pool:
        bar = tqdm(
            pool.map(one, range(len(stored))),
            total=len(stored),
            desc="finding documents",
            unit="row group",
            disable=not progress_enabled(progress, len(stored)),
            leave=False,
        )
        return list(bar)


def _rows_frame(rows: Rows) -> pl.DataFrame:
    """``rows=`` as a frame of source (or null), file, row_group (or null), row."""
    if isinstance(rows, pl.DataFrame):
        missing = [c for c in ("file", "row") if c not in rows.columns]
        if missing:
            msg = f"rows= frame lacks {missing}; give columns file and row (and row_group, source where known)"
            raise ConfigError(msg)
        f = rows
    else:
        items = list(rows)
        bad = [x for x in items if not isinstance(x, (tuple, list)) or len(x) not in (2, 3)]
        if bad:
            msg = (
                f"rows= item {bad[0]!r} is not (file, row) or (file, row_group, row); e.g. "
                "rows=[('part-00000.parquet', 17)] (row counted in the file)"
            )
            raise ConfigError(msg)
        f = pl.DataFrame(
            {
                "file": [str(x[0]) for x in items],
                "row_group": [x[1] if len(x) == 3 else None for x in items],
                "row": [x[-1] for x in items],
            },
            schema={"file": pl.String, "row_group": pl.Int64, "row": pl.Int64},
        )
    for c in ("source", "row_group"):
        if c not in f.columns:
            f = f.with_columns(pl.lit(None, pl.String if c == "source" else pl.Int64).alias(c))
    return f.select(
        pl.col("source").cast(pl.String),
        pl.col("file").cast(pl.String),
        pl.col("row_group").cast(pl.Int64),
        pl.col("row").cast(pl.Int64),
    )


def _resolve_rows(ix: RowGroupIndex, rows: Rows) -> tuple[I64, I64]:
    """Global row groups and stream ordinals of the documents ``rows`` names (unselected ones dropped)."""
    parts = _parts(ix)
    files = [set(p.frame["file"].to_list()) for _, p, _ in parts]
    out_rg: list[int] = []
    out_doc: list[int] = []
    for source, file, row_group, row in _rows_frame(rows).iter_rows():
        _, part, base = parts[_source_holding(ix, parts, files, source, file)]
        local, in_rg = _place(part, source, file, row_group, row)
        ordinal = in_rg
        kept = part.selected_rows(local)
        if kept is not None:
            j = int(np.searchsorted(kept, in_rg))
            if j >= len(kept) or int(kept[j]) != in_rg:
                continue  # the run's where= leaves it out: the model never saw it
            ordinal = j
        out_rg.append(base + local)
        out_doc.append(ordinal)
    return np.array(out_rg, np.int64), np.array(out_doc, np.int64)


def _source_holding(
    ix: RowGroupIndex, parts: list[tuple[str | None, Index, int]], files: list[set[str]], source: Any, file: str
) -> int:
    """The part (of :func:`_parts`) holding ``file``: the one ``source`` names, else the one source with the file."""
    if source is not None:
        by_name = {n: i for i, (n, _, _) in enumerate(parts)}
        if source not in by_name:
            msg = f"rows=: source {source!r} is not one of the mixture's sources {sorted(map(str, by_name))}"
            raise ConfigError(msg)
        where = [by_name[source]]
    else:
        where = [i for i, names in enumerate(files) if file in names]
    if not where:
        known = sorted(set().union(*files))
        msg = (
            f"rows=: file {file!r} is not a file of {ix.source!r}; name it as batch.documents() does "
            f"(its path under the source), e.g. {known[:3]}"
        )
        raise ConfigError(msg)
    if len(where) > 1:
        names = [parts[i][0] for i in where]
        msg = f"rows=: file {file!r} is in sources {names}; pass a frame with a source column to say which"
        raise ConfigError(msg)
    return where[0]


def _place(part: Index, source: Any, file: str, row_group: int | None, row: int | None) -> tuple[int, int]:
    """The row group of ``part`` (its own numbering) and the row in it of ``file``'s ``row`` (in ``row_group``)."""
    f = part.frame.with_row_index("rg").filter(pl.col("file") == file)
    if f.is_empty():
        msg = f"rows=: file {file!r} is not a file of source {source!r}"
        raise ConfigError(msg)
    counts = f["rows"].to_numpy().astype(np.int64)
    if row_group is None:
        total = int(counts.sum())
        if row is None or not 0 <= row < total:
            msg = f"rows=: row {row} is outside {file!r}, which has {total} rows (0..{total - 1}); give a row in it"
            raise ConfigError(msg)
        ends = np.cumsum(counts)
        i = int(np.searchsorted(ends, row, side="right"))
        return int(f["rg"][i]), row - int(ends[i] - counts[i])
    hit = f.filter(pl.col("row_group") == row_group)
    if hit.is_empty():
        msg = f"rows=: row group {row_group} is outside {file!r}, which has {f.height} row groups (0..{f.height - 1})"
        raise ConfigError(msg)
    n = int(hit["rows"][0])
    if row is None or not 0 <= row < n:
        msg = f"rows=: row {row} is outside {file!r} row group {row_group}, which has {n} rows (0..{n - 1})"
        raise ConfigError(msg)
    return int(hit["rg"][0]), int(row)


def target_documents(
    ix: RowGroupIndex,
    where: str | None = None,
    rows: Rows | None = None,
    *,
    threads: int | None = None,
    progress: bool | None = None,
) -> tuple[I64, I64]:
    """The documents to locate: (global row group, ordinal among the stream's documents of it).

    ``where`` is evaluated on every source of a mixture that has the columns it names
    (a source without them has no such document); naming a column no source has is a
    :class:`~planner.errors.SelectionError` that lists the columns.
    """
    if (where is None) == (rows is None):
        msg = "locate needs the documents: where= (a DuckDB predicate over the columns) or rows= (file, row pairs)"
        raise ConfigError(msg)
    if rows is not None:
        return _resolve_rows(ix, rows)
    assert where is not None
    workers = threads or os.cpu_count() or 2
    out_rg: list[I64] = []
    out_doc: list[I64] = []
    first_error: SelectionError | None = None
    bound = 0
    for _, part, base in _parts(ix):
        try:
            norm, columns = _bind(part, where)
        except SelectionError as e:
            bare = not part.capabilities.tokenizes and not available_columns(part)  # the token column alone
            if not ix.mixed or (e.column is None and not bare):
                raise
            first_error = first_error or e
            continue  # this source lacks the column: it holds no such document
        bound += 1
        for rg, docs in enumerate(_matches(part, norm, columns, workers, progress)):
            if len(docs):
                out_rg.append(np.full(len(docs), base + rg, np.int64))
                out_doc.append(docs)
    if bound == 0 and first_error is not None:
        msg = f"where={where!r} binds to none of the mixture's sources: {first_error}"
        raise SelectionError(msg, predicate=where, column=first_error.column, available=first_error.available)
    if not out_rg:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(out_rg), np.concatenate(out_doc)


# -- the token lengths of the row groups involved -------------------------------------
