"""The window cut again at a layout change inside it (docs/design.md, "Layout stages").

A layout stage that begins strictly inside a window changes the lanes there: what
the old lanes have not consumed of the window is cut again into the new lanes
(:func:`pack_rest`), and then packed like any window (:func:`plitzer.readpath.pack._finish`).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from planner.lanes import cut_at, split_at_cuts
from planner.order.layout import stage_tokens
from planner.run import Recut
from plitzer.readpath.pack import ColumnChunks, _documents, _finish, _Pieces, _pieces, _shuffle, slice_keys
from plitzer.readpath.packed import PackedUnit, UnitReads

__all__ = ["pack_rest"]

I64 = NDArray[np.int64]


def _recut(
    src: I64, a: I64, e: I64, lane: I64, lanes: int, begun: int, end_run: int, rc: Recut
) -> tuple[I64, I64, I64, I64]:
    """The slicing ``(src, a, e, lane)`` of ``lanes`` lanes begun at run token ``begun``, cut again at ``rc``.

    Items are stream piece ``src``'s tokens ``[a, e)``, lane after lane, each in packed
    order. What each lane consumed by ``rc.begin`` is dropped; the rest, laid end to
    end, is cut into ``rc.lanes`` lanes by section 3.4 with ``z = begin mod lanes``.
    """
    ln = e - a
    cum = np.cumsum(ln)
    lane_first = np.searchsorted(lane, np.arange(lanes + 1), side="left")
    slice_start = np.concatenate([[0], cum])[lane_first]
    pos = cum - ln - slice_start[lane]  # each item's start in its lane's slice
    used = stage_tokens(rc.begin, np.arange(lanes), lanes, begun)[lane]
    cut_in = np.clip(used - pos, 0, ln)
    live = ln - cut_in > 0
    src, a, e = src[live], (a + cut_in)[live], e[live]
    ln = e - a
    rest_end = np.cumsum(ln)
    rest_start = rest_end - ln
    q, r = divmod(end_run - rc.begin, rc.lanes)
    new_cuts = cut_at(np.arange(rc.lanes + 1), q, r, rc.begin % rc.lanes, rc.lanes)
    rep, ps, pe, lane = split_at_cuts(rest_start, rest_end, new_cuts)
    src, a = src[rep], a[rep] + (ps - rest_start[rep])
    return src, a, a + (pe - ps), lane


def pack_rest(chunks: list[pa.Array], reads: UnitReads, columns: ColumnChunks | None = None) -> PackedUnit:
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
    window_start, b0, recuts = p.rest
    rank_lanes, keep = p.rank_lanes, p.keep
    q, r = divmod(p.window_tokens, b0)
    cuts = cut_at(np.arange(b0 + 1), q, r, window_start % b0, b0)
    arrays = [_documents(c)[0] for c in chunks]
    pc_ = _pieces(arrays, p.token_start.tolist(), reads.doc_base.tolist(), cuts, at_end=True)
    order, _ = _shuffle(pc_, None, b0, slice_keys(p.seed, p.epoch, p.window, range(b0)))
    # The current slicing, in packed order: stream piece, token range [a, e) inside it, lane.
    length = pc_.end - pc_.start
    src, a, e, lane = order, np.zeros(len(order), np.int64), length[order], pc_.local[order]
    lanes, begun = b0, window_start
    for rc in recuts:
        src, a, e, lane = _recut(src, a, e, lane, lanes, begun, window_start + p.window_tokens, rc)
        lanes, begun = rc.lanes, rc.begin
    # The rank's lanes of the last cut.
    mine = (lane >= rank_lanes.start) & (lane < rank_lanes.stop)
    local = lane - rank_lanes.start
    if keep is not None:
        mine &= keep[np.clip(local, 0, len(keep) - 1)]
    src, a, e, local = src[mine], a[mine], e[mine], local[mine]
    ln = e - a
    end = np.cumsum(ln)
    rest = _Pieces(
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
    return _finish(arrays, rest, ident, bounds, reads, tiled=False, columns=columns)
