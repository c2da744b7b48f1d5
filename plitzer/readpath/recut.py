"""The window cut again at a layout change inside it (docs/design.md, "Layout stages").

A layout stage that begins strictly inside a window changes the lanes there: what
the old lanes have not consumed of the window is cut again into the new lanes
(:func:`pack_rest`, by :func:`planner.packing.cut_again_at`), and then packed like any window
(:func:`plitzer.readpath.pack.finish_unit`).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from planner.lanes import window_cuts
from planner.packing import Items, cut_again_at, slice_keys, slice_offsets
from plitzer.readpath.pack import ColumnChunks, finish_unit
from plitzer.readpath.packed import PackedUnit, UnitReads
from plitzer.readpath.pieces import Pieces, cut_pieces, shuffle_pieces, unit_documents

__all__ = ["pack_rest"]


def pack_rest(
    chunks: list[pa.Array],
    reads: UnitReads,
    columns: ColumnChunks | None = None,
    *,
    gather: bool = True,
    labels: bool = False,
) -> PackedUnit:
    """Pack a window cut again by layout changes inside it (docs/design.md, "Layout stages").

    ``chunks`` are every row group of the window (stream order). The window is first
    cut into ``base_lanes`` lanes and shuffled as usual (``z`` from ``window_start``,
    the run's tokens before it; ``reads.place.rest``); then, for each change in
    ``recuts`` (at run token ``begin``, into ``lanes``), what each lane has not consumed
    of its slice by then (lane ``k`` consumed ``ceil((begin - k) / B) - ceil((S - k) / B)``
    tokens of it, ``S`` where its slices began) is laid end to end, lane 0's first, each
    in packed order, and cut into the new lanes by section 3.4 with ``z = begin mod
    lanes``, with no second shuffle. The last cut's lanes ``rank_lanes`` are packed like
    a window's (``lane_base``: their stream positions before it).
    """
    p = reads.place
    assert p.rest is not None
    window_start, b0, recuts, _ = p.rest  # the last: a rule of bins' tokens a row (plitzer.bestfit.rows)
    rank_lanes, keep = p.rank_lanes, p.keep
    cuts = window_cuts(np.arange(b0 + 1), p.window_tokens, window_start % b0, b0)
    docs = unit_documents(chunks, p.token_start, reads.doc_base)
    pc_ = cut_pieces(docs, cuts, at_end=True)
    order, _ = shuffle_pieces(pc_, None, b0, slice_keys(p.seed, p.epoch, p.window, np.arange(b0)))
    # The current slicing, in packed order: piece, its tokens [a, a + length), lane, place in the lane's slice.
    length = pc_.end - pc_.start
    zero = np.zeros(len(order), np.int64)
    items = Items(order, zero, length[order], pc_.local[order], slice_offsets(order, length, pc_.local)[order])
    changes = [(rc.lanes, rc.begin) for rc in recuts]
    items = cut_again_at(items, b0, window_start, window_start + p.window_tokens, changes)
    src, a, e, lane = items.src, items.a, items.a + items.length, items.lane
    # The rank's lanes of the last cut.
    mine = (lane >= rank_lanes.start) & (lane < rank_lanes.stop)
    local = lane - rank_lanes.start
    if keep is not None:
        mine &= keep[np.clip(local, 0, len(keep) - 1)]
    src, a, e, local = src[mine], a[mine], e[mine], local[mine]
    ln = e - a
    end = np.cumsum(ln)
    rest = Pieces(
        start=end - ln,
        end=end,
        local=local,
        doc=pc_.doc[src],
        offset=pc_.offset[src] + a,
        chunk=pc_.chunk[src],
        value=pc_.value[src] + a,
    )
    bounds = np.searchsorted(local, np.arange(len(rank_lanes) + 1), side="left").astype(np.int64)
    ident = np.arange(len(src), dtype=np.int64)
    return finish_unit(
        docs.arrays, rest, ident, bounds, reads, tiled=False, columns=columns, gather=gather, labels=labels
    )
