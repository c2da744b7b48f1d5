"""The packing rule, written once: documents into pieces, their packed order, their row cuts.

SPEC section 3 rule 4 and docs/glossary.md ("Cut", "Piece", "Slice"). Four steps, each
on whole arrays (no loop over documents, pieces or lanes), each used by both sides:

1. :func:`cut_documents`: every document split per rank (clipped to the rank's range of
   the window's stream), then at the cuts inside it; each part is a *piece* in one lane.
   An empty document is one piece of length 0, in lane ``max{k < B : c_k <= s}``.
2. :func:`slice_keys` and :func:`packed_order`: each lane's slice of pieces shuffled by
   ``permutation(n, key(seed, epoch, window, lane, 2))`` (left in stream order under
   ``shuffle=False``); :func:`slice_offsets` is each piece's first token in its shuffled slice.
3. :func:`cut_again_at`: at a layout change inside a window, what the old lanes have not
   consumed, laid end to end lane after lane, cut into the new lanes (no second shuffle).
4. :func:`row_cuts`: each piece cut where its lane's rows end (step ``t`` is the lane's
   tokens ``[t * L, (t + 1) * L)``).

The loader (``plitzer.readpath.pack``, ``plitzer.readpath.recut``) runs it on the
documents of decoded row groups, one window and one rank at a time; ``locate``
(:mod:`planner.lookup.cut`, :mod:`planner.lookup.staged`) on token lengths alone, many
windows and every rank at once. That both give the same pieces in the same order is
then not a property two copies must keep, but one function's (docs/design.md, "The
packing kernel").

A worked example: one window of 10 tokens, B = 2 lanes (z = 0: cuts 0, 5, 10), three
documents of 3, 2 and 5 tokens. Lane 0 gets the first two, lane 1 the third:

>>> cuts = np.array([0, 5, 10])
>>> p = cut_documents(np.array([0, 3, 5]), np.array([3, 2, 5]), cuts, per=2)
>>> p.doc.tolist(), p.start.tolist(), p.end.tolist(), p.lane.tolist()
([0, 1, 2], [0, 3, 5], [3, 5, 10], [0, 0, 1])

Had the cut fallen at 4, the second document would be split there:

>>> p = cut_documents(np.array([0, 3, 5]), np.array([3, 2, 5]), np.array([0, 4, 10]), per=2)
>>> p.doc.tolist(), p.start.tolist(), p.end.tolist(), p.lane.tolist()
([0, 1, 1, 2], [0, 3, 4, 5], [3, 4, 5, 10], [0, 0, 1, 1])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from planner.arraytypes import I64, U64
from planner.hashing import key, mix_array
from planner.lanes import split_at_cuts, window_cuts

__all__ = [
    "Items",
    "Parts",
    "RowCuts",
    "concat_ranges",
    "cut_again",
    "cut_again_at",
    "cut_documents",
    "packed_order",
    "row_cuts",
    "slice_keys",
    "slice_offsets",
    "slice_starts",
    "stage_tokens",
]


def concat_ranges(starts: I64, counts: I64) -> tuple[I64, I64]:
    """``concat(arange(s, s + c))`` and the position of the range each element comes from."""
    rep = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    j = np.arange(len(rep), dtype=np.int64) - (np.cumsum(counts) - counts)[rep]
    return starts[rep] + j, rep


@dataclass(frozen=True, slots=True)
class Parts:
    """Pieces in stream order (:func:`cut_documents`): each one's document, token range and lane."""

    doc: I64  # position of its document among those given
    start: I64  # first token in the window's stream
    end: I64
    lane: I64  # lane among the cut table's, 0 .. n-1


def cut_documents(
    start: I64, length: I64, cuts: I64, *, per: int, row: I64 | None = None, at_end: bool = True
) -> Parts:
    """Every document split per rank (clipped to the rank's range), then at the cuts inside it.

    ``start`` and ``length``: the documents in stream order, ``start`` each one's first
    token in its window's stream. ``cuts``: the cuts ``c_{k0} .. c_{k0+n}`` of ``n``
    consecutive lanes, one window (1-D) or one row a window (2-D, ``row`` naming each
    document's); ``per`` lanes a rank (``n`` a multiple of it): each rank splits its
    documents at the cuts inside its own range only, so a run of empty lanes at a rank's
    edge makes no piece there (the pieces depend on ``world`` only there). ``at_end``:
    the last cut is the window's end (the rank of lane B-1), where a trailing empty
    document belongs. Documents that give the lanes no piece are left out; a document is
    one piece a lane it meets, cut where the lanes' ranges meet (a piece of length 0
    where a lane inside it is empty).
    """
    table = np.atleast_2d(np.asarray(cuts, np.int64))
    rows, width = table.shape
    n = width - 1
    if not len(start) or n <= 0:
        z = np.zeros(0, np.int64)
        return Parts(z, z, z, z)
    flat, first, ds = _axis(table, start, length, row)
    de = ds + length
    full = length > 0
    k_s = np.searchsorted(flat, ds, side="right") - 1 - first  # max{k : c_k <= s}: < 0 below c_0
    # An empty document: in the lanes' range, or at the window's end for the last rank.
    empty_in = (k_s >= 0) & ((k_s < n) | (at_end & (ds == flat[first + n])))
    if per == n:  # one rank: the documents that meet its range, clipped to it
        mine = np.where(full, np.minimum(de, flat[first + n]) > np.maximum(ds, flat[first]), empty_in)
        d = np.flatnonzero(mine)
        fd = first if rows == 1 else first[d]
        s_clip, e_clip = np.maximum(ds[d], flat[fd]), np.minimum(de[d], flat[fd + n])
    else:  # every rank it meets, each clipped to its range (an empty document's range holds it)
        k_e = np.where(full, np.searchsorted(flat, np.maximum(de - 1, ds), side="right") - 1 - first, k_s)
        g_s = np.clip(k_s, 0, n - 1) // per
        count = np.where(full, np.clip(k_e, 0, n - 1) // per - g_s + 1, empty_in)
        g, d = concat_ranges(g_s, count)
        fd = first if rows == 1 else first[d]
        s_clip = np.maximum(ds[d], flat[fd + g * per])
        e_clip = np.minimum(de[d], flat[fd + (g + 1) * per])
        keep = (e_clip > s_clip) | ~full[d]
        if not keep.all():
            g, d, s_clip, e_clip = g[keep], d[keep], s_clip[keep], e_clip[keep]
    rep, p_start, p_end, at = split_at_cuts(s_clip, e_clip, flat)
    p_end = np.maximum(p_end, p_start)  # empty documents: length 0
    doc = d[rep]
    cap = n - 1 if per == n else (g[rep] + 1) * per - 1  # the last lane of the piece's rank
    if rows == 1:
        return Parts(doc=doc, start=p_start, end=p_end, lane=np.minimum(at, cap))
    at0 = ds[doc] - start[doc]  # the row's place on the axis
    return Parts(doc=doc, start=p_start - at0, end=p_end - at0, lane=np.minimum(at - first[doc], cap))


def _axis(table: I64, start: I64, length: I64, row: I64 | None) -> tuple[I64, Any, I64]:
    """The cuts on one sorted axis, each document's first cut on it (0 for one row) and its start there.

    One row (the loader's call, one window) is its own axis. Several: row * span + position,
    with a gap between rows, so that one sorted array holds every row's cuts and one binary
    search finds a lane.
    """
    rows, width = table.shape
    if rows == 1:
        return table[0], 0, start
    assert row is not None
    span = max(int(table.max()), int((start + length).max())) + 1
    flat = ((np.arange(rows, dtype=np.int64) * span)[:, None] + table).reshape(-1)
    return flat, row * width, row * span + start


def slice_keys(seed: int | None, epoch: int, window: Any, lane: Any) -> U64 | None:
    """``key(seed, epoch, window, lane, 2)``, the key of a slice's shuffle (arrays broadcast).

    ``seed`` None (``shuffle=False``, SPEC section 17): no keys, every slice in stream order.
    """
    if seed is None:
        return None
    w, k = np.broadcast_arrays(np.atleast_1d(window).astype(np.uint64), np.atleast_1d(lane).astype(np.uint64))
    h = mix_array(mix_array(np.uint64(key(seed, epoch)) ^ w) ^ k)
    out: U64 = mix_array(h ^ np.uint64(2))
    return out


def _ordinals(slice_: I64) -> I64:
    """Each element's position in its run of equal ``slice_`` values (``slice_`` grouped, as sorted)."""
    i = np.arange(len(slice_), dtype=np.int64)
    new = np.ones(len(slice_), bool)
    new[1:] = slice_[1:] != slice_[:-1]
    out: I64 = i - np.maximum.accumulate(np.where(new, i, 0))
    return out


def packed_order(slice_: I64, keys: U64 | None) -> I64:
    """Packed order: the pieces' positions slice after slice, each slice's shuffled.

    ``slice_`` names each piece's slice (non-decreasing: pieces in stream order, slices
    numbered in lane order, as :func:`cut_documents` gives them), ``keys`` each piece's
    slice key (:func:`slice_keys`). A slice's stream-order ordinals ``i`` are sorted by
    ``(mix(key ^ i), i)``: ``permutation(n, key)``, all slices in one lexsort. ``keys`` None:
    no shuffle, each slice in stream order.
    """
    if keys is None:
        stream: I64 = np.argsort(slice_, kind="stable")
        return stream
    ordinal = _ordinals(slice_)
    h = mix_array(keys ^ ordinal.astype(np.uint64))
    # lexsort is stable and each slice comes in ordinal order, so ties of h keep it.
    out: I64 = np.lexsort((h, slice_))
    return out


def slice_starts(length: I64) -> I64:
    """The first token of each of consecutive items ``length`` laid end to end (an exclusive cumsum)."""
    out: I64 = np.cumsum(length) - length
    return out


def slice_offsets(order: I64, length: I64, slice_: I64) -> I64:
    """Each piece's first token in its slice after the shuffle, by piece position (0 for those not in ``order``)."""
    cum = slice_starts(length[order])
    s = slice_[order]
    new = np.ones(len(s), bool)
    new[1:] = s[1:] != s[:-1]
    out = np.zeros(len(length), np.int64)
    out[order] = cum - np.maximum.accumulate(np.where(new, cum, 0))
    return out


@dataclass(frozen=True, slots=True)
class Items:
    """Token ranges of pieces as lanes hold them, lane after lane, each lane's in packed order.

    Item ``i`` is piece ``src[i]``'s tokens ``[a, a + length)``, in lane ``lane[i]`` from
    the slice's token ``pos[i]`` on.
    """

    src: I64
    a: I64
    length: I64
    lane: I64
    pos: I64


def cut_again(items: Items, used: I64, cuts: I64) -> Items:
    """``items`` cut again at a layout change inside their window (docs/design.md, "Layout stages").

    ``used``: the tokens each old lane consumed of its slice by the change; what is left,
    laid end to end lane after lane (each in packed order), is cut at ``cuts`` (the new
    lanes' cuts of it, ``c_0 = 0``) with no second shuffle. Returns the new lanes' items.
    """
    cut_in = np.clip(used[items.lane] - items.pos, 0, items.length)
    live = np.flatnonzero(items.length - cut_in > 0)
    src, a, ln = items.src[live], (items.a + cut_in)[live], (items.length - cut_in)[live]
    start = slice_starts(ln)
    rep, ps, pe, lane = split_at_cuts(start, start + ln, cuts)
    return Items(src[rep], a[rep] + (ps - start[rep]), pe - ps, lane, ps - cuts[lane])


def stage_tokens(x: Any, k: Any, lanes: int, begin: int) -> I64:
    """Tokens lane ``k`` of a stage that began at run token ``begin`` has received once the run has ``x``.

    ``ceil((x - k) / B) - ceil((begin - k) / B)`` (for ``x >= begin``): the stage deals
    run tokens ``begin, begin + 1, ...`` to lanes ``x mod B`` like cards. The one statement
    of the lane-consumption rule: :func:`cut_again_at` asks it what each old lane has consumed
    at a change, and :mod:`planner.order.layout` and :mod:`planner.run` where a lane stands.
    """
    xa, ka = np.asarray(x, np.int64), np.asarray(k, np.int64)
    out: I64 = -((ka - xa) // lanes) + (ka - begin) // lanes
    return out


def cut_again_at(items: Items, lanes: int, begun: int, end_run: int, changes: list[tuple[int, int]]) -> Items:
    """``items`` of ``lanes`` lanes, their cards begun at run token ``begun``, cut at every change in turn.

    ``changes``: ``(new lanes, run token it begins at)``, in run order, all inside the
    window that ends at run token ``end_run``. At a change to ``B'`` lanes at ``X``, lane
    ``k`` has consumed ``stage_tokens(X, k, B, begun)`` tokens of its slice;
    the rest is cut into ``B'`` lanes by section 3 rule 4 with ``z = X mod B'``
    (:func:`cut_again`).
    """
    for new_lanes, begin in changes:
        used = stage_tokens(begin, np.arange(lanes, dtype=np.int64), lanes, begun)
        cuts = window_cuts(np.arange(new_lanes + 1, dtype=np.int64), end_run - begin, begin % new_lanes, new_lanes)
        items = cut_again(items, used, cuts)
        lanes, begun = new_lanes, begin
    return items


@dataclass(frozen=True, slots=True)
class RowCuts:
    """Pieces cut where their lane's rows end (*sub-pieces*), in piece order (:func:`row_cuts`)."""

    piece: I64  # the piece it is part of
    step: I64
    start: I64  # first token in the lane's stream
    end: I64
    first: I64  # of each piece: its first step
    count: I64  # of each piece: its sub-pieces (0 for a piece left out)


def row_cuts(lane_pos: I64, length: I64, seq_len: int, live: NDArray[np.bool_] | None = None) -> RowCuts:
    """Every live, non-empty piece cut where its lane's rows end: steps ``floor(s/L) .. floor((e-1)/L)``.

    ``lane_pos``: each piece's first token in its lane's stream; ``live``: the pieces to cut
    (default all). Pieces of length 0 give none.
    """
    alive = length > 0 if live is None else live & (length > 0)
    first = lane_pos // seq_len
    count = np.where(alive, (lane_pos + length - 1) // seq_len - first + 1, 0)
    step, piece = concat_ranges(first, count)
    s = lane_pos[piece]
    return RowCuts(
        piece=piece,
        step=step,
        start=np.maximum(s, step * seq_len),
        end=np.minimum(s + length[piece], (step + 1) * seq_len),
        first=first,
        count=count,
    )
