"""What a deduplicated index dropped, for the tools: the audit's table, locate's answers.

:func:`dropped_of` says why a row is not in the stream (a duplicate of which kept document,
or excluded); :func:`base_of` is the index before the deduplication; :func:`dedupe_table`
is the audit's per-source table; :func:`split_targets` splits documents that ``locate``
looks for into those the stream has and those the pass dropped.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl
from numpy.typing import NDArray

from planner.arraytypes import I64
from planner.catalog.rowgroups import RowGroupIndex, with_selected
from plitzer.selection.dedupe import DedupedIndex

__all__ = ["base_of", "dedupe_table", "dropped_of", "split_targets"]

U8 = NDArray[np.uint8]


def _stored(ix: RowGroupIndex, rg: int, pos: int) -> int:
    stream = ix.selected_rows(rg)
    return pos if stream is None else int(stream[pos])


def dropped_of(ix: DedupedIndex, rg: int, row: int) -> tuple[str, tuple[str, int, int] | None] | None:
    """Why stored row ``row`` of row group ``rg`` was dropped: ``("duplicate", (source, row group, row))``
    naming the document kept (its source's name, ``""`` for one dataset; its row group and row there),
    ``("excluded", None)``, or None where it is kept or ``where=`` left it out."""
    assert ix.base is not None
    stream = ix.base.selected_rows(rg)
    if stream is None:
        pos = row
    else:
        i = int(np.searchsorted(stream, row))
        if i >= len(stream) or int(stream[i]) != row:
            return None
        pos = i
    kept = ix.selected_rows(rg)
    j = int(np.searchsorted(kept, row))
    if j < len(kept) and int(kept[j]) == row:
        return None
    d = ix.duplicates
    hit = d[(d[:, 0] == rg) & (d[:, 1] == pos)]
    if len(hit):
        kp, krg, kpos = (int(x) for x in hit[0, 2:])
        return "duplicate", (ix.order[kp] if ix.order else "", krg, kpos)
    return "excluded", None


def base_of(ix: RowGroupIndex) -> RowGroupIndex:
    """The index a deduplication was made over (itself where none was)."""
    out: RowGroupIndex = ix.unwrapped()
    return out


def dedupe_table(ix: RowGroupIndex) -> pl.DataFrame:
    """Per source (one row for one dataset): rows, rows_kept, rows_duplicate, rows_excluded, tokens, tokens_kept."""
    f = ix.frame
    base = base_of(ix).frame
    src = f["source"] if "source" in f.columns else pl.Series("source", [""] * f.height)
    before = with_selected(base)["tokens_selected"]
    g = pl.DataFrame(
        {
            "source": src,
            "rows": f["rows"],
            "rows_kept": f["rows_kept"] if "rows_kept" in f.columns else f["rows"],
            "rows_duplicate": f["rows_duplicate"] if "rows_duplicate" in f.columns else pl.zeros(f.height, pl.Int64),
            "rows_excluded": f["rows_excluded"] if "rows_excluded" in f.columns else pl.zeros(f.height, pl.Int64),
            "tokens": before,
            "tokens_kept": f["tokens_selected"],
        }
    )
    return g.group_by("source", maintain_order=True).sum()


def split_targets(ix: RowGroupIndex, rgs: I64, ordinals: I64) -> tuple[I64, I64, pl.DataFrame]:
    """Documents given over :func:`base_of`'s stream: those kept (their ordinals in ``ix``'s stream),
    and a frame of those dropped: source, file, row_group, row, dropped (``duplicate`` or ``excluded``)
    and the kept document's kept_source, kept_file, kept_row_group, kept_row."""
    parts = list(ix.parts)
    names = list(ix.names)
    starts = np.concatenate([[0], np.cumsum([p.row_groups for p in parts])]).astype(np.int64)
    keep_rg: list[int] = []
    keep_doc: list[int] = []
    rows: list[dict[str, Any]] = []
    for g, o in zip(np.asarray(rgs).tolist(), np.asarray(ordinals).tolist(), strict=True):
        i = int(np.searchsorted(starts, g, side="right")) - 1
        part, local = parts[i], g - int(starts[i])
        if part.unwrapped() is part:
            keep_rg.append(g)
            keep_doc.append(o)
            continue
        pos = part.stream_positions(local)
        j = int(np.searchsorted(pos, o))
        if j < len(pos) and int(pos[j]) == o:
            keep_rg.append(g)
            keep_doc.append(j)
            continue
        row = _stored(part.base, local, o)
        why = dropped_of(part, local, row)
        assert why is not None
        entry: dict[str, Any] = {
            "source": names[i] or None,
            "file": part.frame["file"][local],
            "row_group": int(part.frame["row_group"][local]),
            "row": row,
            "dropped": why[0],
            "kept_source": None,
            "kept_file": None,
            "kept_row_group": None,
            "kept_row": None,
        }
        if why[1] is not None:
            kname, krg, kpos = why[1]
            kpart = parts[names.index(kname)] if kname else part
            kbase = kpart.unwrapped()
            entry.update(
                kept_source=kname or None,
                kept_file=kpart.frame["file"][krg],
                kept_row_group=int(kpart.frame["row_group"][krg]),
                kept_row=_stored(kbase, krg, kpos),
            )
        rows.append(entry)
    schema = {
        "source": pl.String, "file": pl.String, "row_group": pl.Int64, "row": pl.Int64, "dropped": pl.String,
        "kept_source": pl.String, "kept_file": pl.String, "kept_row_group": pl.Int64, "kept_row": pl.Int64,
    }  # fmt: skip
    return np.array(keep_rg, np.int64), np.array(keep_doc, np.int64), pl.DataFrame(rows, schema=schema)
