"""The deduplication pass's cached result, from phase 2's :class:`~plitzer.selection.firsts.Resolved`.

:func:`dropped_tokens` counts the tokens and empty documents of each row group's dropped
rows (from phase 1's token counts, a :data:`~plitzer.selection.held.Known`, or the token
chunk read again); :func:`result_arrays` lays the dropped rows and those counts out as
the arrays the cache stores (docs/design.md, "Deduplication and exclusion").
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from planner.arraytypes import I64
from planner.catalog.datasetindex import Index
from planner.threads import map_ahead
from plitzer.readpath.read import list_lengths
from plitzer.selection.firsts import Resolved
from plitzer.selection.held import Known
from plitzer.selection.keying import stream_tokens, token_run

__all__ = ["Counted", "dropped_tokens", "result_arrays"]


Counted = list[tuple[I64, I64]]
"""Per part: each row group's tokens and empty documents among its dropped rows."""


def dropped_tokens(
    parts: Sequence[Index],
    chunks: list[tuple[int, int, int]],
    res: Resolved,
    threads: int,
    known: Known,
    only: Sequence[int] | None,
) -> Counted:
    """The tokens and empty documents of each row group's dropped rows, for the row groups of ``only`` (chunks).

    A row group with a dropped row needs its rows' token counts: phase 1's where it kept
    them (``"tokens"``), else its token chunk is read once more (a column key never decoded
    it), a chunk's row groups through one footer made for them (:func:`token_run`).
    """
    from concurrent.futures import ThreadPoolExecutor

    mine = None if only is None else set(only)
    todo = [
        c
        for c, (p, a, b) in enumerate(chunks)
        if (mine is None or c in mine)
        and (res.dup[p].starts[b] > res.dup[p].starts[a] or res.excl[p].starts[b] > res.excl[p].starts[a])
    ]

    def chunk(c: int) -> list[tuple[int, int, int]]:
        p, a, b = chunks[c]
        ix = parts[p]
        h = known(c)
        have = h is not None and len(h["len"]) == int(h["n"].sum())
        offs = np.concatenate([[0], np.cumsum(h["n"])]) if h is not None and have else None
        run = None
        out = []
        for rg in range(a, b):
            gone = res.gone(p, rg)
            if not len(gone):
                continue
            if offs is not None:
                assert h is not None
                lengths = h["len"][offs[rg - a] : offs[rg - a + 1]].astype(np.int64)
            else:
                run = token_run(ix, a, b) if run is None else run
                lengths = list_lengths(stream_tokens(ix, rg, run))
            out.append((rg, int(lengths[gone].sum()), int((lengths[gone] == 0).sum())))
        return out

    counted: Counted = [(np.zeros(ix.row_groups, np.int64), np.zeros(ix.row_groups, np.int64)) for ix in parts]
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="plitzer-dedupe") as pool:
        for c, got in zip(todo, map_ahead(pool, chunk, todo), strict=True):
            tok, empty = counted[chunks[c][0]]
            for rg, t, e in got:
                tok[rg], empty[rg] = t, e
    return counted


def result_arrays(parts: Sequence[Index], res: Resolved, counted: Counted) -> dict[str, np.ndarray]:
    """The cached result: per part, the dropped rows by row group and the tokens they held (``counted``)."""
    out: dict[str, np.ndarray] = {}
    for p in range(len(parts)):
        dup, excl = res.dup[p], res.excl[p]
        out[f"rg_dup{p}"] = dup.counts
        out[f"rg_excl{p}"] = excl.counts
        out[f"pos_dup{p}"] = dup.pos
        out[f"pos_excl{p}"] = excl.pos
        out[f"tok{p}"], out[f"empty{p}"] = counted[p]
        out[f"dups{p}"] = res.duplicates[p].astype(np.int64, copy=False).reshape(-1, 5)
    return out
