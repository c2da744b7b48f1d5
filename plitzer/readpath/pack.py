"""The packer: a window's documents into step-major blocks of full sequences, vectorized.

A worked example. One window, B = 2 lanes, three documents in stream order::

    d0 = [a a a]        stream positions 0..2
    d1 = [b b]          3..4
    d2 = [c c c c c]    5..9            T_w = 10, z = 0: cuts c_0 = 0, c_1 = 5, c_2 = 10

Lane ``k`` gets the tokens ``[c_k, c_{k+1})`` of the stream, as *pieces*: lane 0
gets d0 and d1 (positions 0..4), lane 1 gets d2. Had the cut fallen at 4, d1 would
be split there: ``[b]`` the last piece of lane 0, ``[b]`` the first of lane 1. Each
lane's slice of pieces is then shuffled by ``permutation(n, key(seed, epoch, window,
lane, 2))``; say lane 0's becomes d1, d0. The lanes' streams continue from the
previous window (here each lane had 3 tokens before it, ``x`` and ``y``)::

    lane 0:  x x x | b b a a a
    lane 1:  y y y | c c c c c

With ``seq_len = 4``, step ``t`` takes tokens ``[4t, 4t + 4)`` of every lane: step 0
is ``x x x b`` / ``y y y c`` (it straddles two windows), step 1 is ``b a a a`` /
``c c c c`` (wholly in this window). So every piece is also cut where a row ends,
and the window's *sub-pieces* are ordered by (step, lane, position in the lane): laid
out in that order, a step wholly inside the window is ``lanes x seq_len``
consecutive tokens, and its batch is a view of the packed block, not a copy. A
step that straddles windows (at most one at each end of a window, or a few for
windows shorter than a step) is assembled from the ends of the windows it touches
(:func:`assemble`). Nothing is padded and nothing is dropped, and since the cuts
hand every lane ``q`` or ``q + 1`` tokens, round-robin over the run, the lanes stay
in lockstep (docs/design.md, "The order").

All of it is whole-array work: the pieces of every document (cuts inside it, by
``searchsorted``), their lanes, the per-slice shuffles (one ``lexsort`` over
hashes), the row cuts (one ``repeat``) are the packing rule of :mod:`planner.packing`,
which ``locate`` runs on lengths; this module adds where each piece's tokens are in
the decoded row groups, and the layout: one Polars list ``gather``
over list arrays whose offsets are the sub-pieces' boundaries in the decoded columns
(zero-copy views) writes each token once, in Rust, without the GIL, into memory
its allocator recycles (docs/design.md, "The hot path"). No Python loop over
documents, pieces or lanes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from planner.lanes import cut_at
from planner.packing import cut_documents, packed_order, row_cuts, slice_keys, slice_offsets
from plitzer.readpath.aligned import aligned_chunks, storage_dtype
from plitzer.readpath.packed import (
    ColumnBlock,
    Memory,
    PackedUnit,
    Segments,
    Slices,
    StepRange,
    UnitReads,
    arrow_ints,
    assemble,
    gather_lists,
    list_views,
)
from plitzer.readpath.read import list_lengths, numpy_view

__all__ = [
    "ColumnChunks",
    "Memory",
    "PackedUnit",
    "Pieces",
    "Segments",
    "Slices",
    "StepRange",
    "UnitReads",
    "assemble",
    "cut_pieces",
    "documents_of",
    "finish_unit",
    "pack_unit",
    "shuffle_pieces",
]

I64 = NDArray[np.int64]
ColumnChunks = dict[str, tuple[list[NDArray[Any]], np.dtype[Any]]]
"""Aligned columns of a unit's chunks: name -> (each chunk's values end to end, the column's dtype)."""


def documents_of(arr: pa.Array) -> tuple[pa.Array, I64, I64]:
    """A list chunk, its documents' lengths and the value index of each document's start.

    A null list is an empty document. Arrow lets a null slot span values; the
    Parquet reader never writes one, but if one comes, the chunk is rebuilt so that
    every document's values start where the previous one's end.
    """
    lens = list_lengths(arr)
    offsets = numpy_view(arr.offsets).astype(np.int64, copy=False)
    if len(lens) and int(offsets[-1] - offsets[0]) != int(lens.sum()):
        ends = np.cumsum(lens)
        cls = pa.LargeListArray if pa.types.is_large_list(arr.type) else pa.ListArray
        arr = cls.from_arrays(arrow_ints(np.concatenate([[0], ends]), pa.int64()), pc.list_flatten(arr))
        offsets = numpy_view(arr.offsets).astype(np.int64, copy=False)
    return arr, lens, offsets[:-1]


@dataclass(frozen=True, slots=True)
class Pieces:
    """A window's pieces for the rank's lanes, in stream order (see :func:`cut_pieces`)."""

    start: I64  # window stream position
    end: I64
    local: I64  # rank lane (within the rank)
    doc: I64
    offset: I64  # of the first token in its document
    chunk: I64  # decoded row group holding it
    value: I64  # index of its first token in that row group's values


def cut_pieces(
    arrays: list[pa.Array], chunk_token_start: list[int], chunk_doc_base: list[int], cuts: I64, *, at_end: bool
) -> Pieces:
    """Every document of the read row groups that gives the rank a piece, split at the rank's cuts.

    The rule is :func:`planner.packing.cut_documents` (the rank's lanes, one rank);
    here each piece also gets where its tokens are in the decoded row groups.
    """
    starts_p, lens_p, vbase_p, ids_p, chunk_p = [], [], [], [], []
    for c, (arr, start, base) in enumerate(zip(arrays, chunk_token_start, chunk_doc_base, strict=True)):
        _, lens, vstart = documents_of(arr)
        ds = start + np.cumsum(lens) - lens
        starts_p.append(ds)
        lens_p.append(lens)
        vbase_p.append(vstart - ds)  # stream position + vbase = index into arr.values
        ids_p.append(np.arange(base, base + len(arr), dtype=np.int64))
        chunk_p.append(np.full(len(arr), c, np.int64))
    if arrays:
        ds, lens = np.concatenate(starts_p), np.concatenate(lens_p)
        vbase, ids, chunk = np.concatenate(vbase_p), np.concatenate(ids_p), np.concatenate(chunk_p)
    else:
        ds = lens = vbase = ids = chunk = np.zeros(0, np.int64)
    parts = cut_documents(ds, lens, cuts, per=len(cuts) - 1, at_end=at_end)
    d = parts.doc
    return Pieces(
        start=parts.start,
        end=parts.end,
        local=parts.lane,
        doc=ids[d],
        offset=parts.start - ds[d],
        chunk=chunk[d],
        value=parts.start + vbase[d],
    )


def _layout(order: I64, nsub: I64, first_step: I64, local: I64, from_step: int, lanes: int) -> I64:
    """Stream-order sub-piece ids in (step, lane, position) order: a counting sort, O(n).

    Walked in packed order (lane by lane, each lane's pieces in stream position), the
    sub-pieces of one (step, lane) are consecutive and in position order, so each one's
    place is its key's start (counts of smaller keys) plus its rank in the run. A
    lexsort would cost O(n log n) per window, and with short rows there is a sub-piece
    every ``seq_len`` tokens.
    """
    sub_base = np.cumsum(nsub) - nsub  # first stream-order sub-piece of each piece
    n_p = nsub[order]
    rep = np.repeat(order, n_p)  # pieces in packed order, once per sub-piece
    k = np.arange(len(rep), dtype=np.int64) - np.repeat(np.cumsum(n_p) - n_p, n_p)
    step = first_step[rep] + k
    ids = sub_base[rep] + k
    keep = step >= from_step
    if not keep.all():
        step, ids, rep = step[keep], ids[keep], rep[keep]
    if not len(ids):
        return ids
    s0 = int(step.min())
    key = (step - s0) * lanes + local[rep]
    counts = np.bincount(key)
    key_start = np.cumsum(counts) - counts
    i = np.arange(len(key), dtype=np.int64)
    new_run = np.ones(len(key), bool)
    new_run[1:] = key[1:] != key[:-1]
    run_start = np.maximum.accumulate(np.where(new_run, i, 0))
    out = np.empty(len(ids), np.int64)
    out[key_start[key] + i - run_start] = ids
    return out


@dataclass(frozen=True, slots=True)
class _Subs:
    """A window's sub-pieces (pieces cut where rows end) in stream order, and the layout."""

    step: I64
    lane: I64
    start: I64  # lane stream position
    end: I64
    value: I64  # index of the first token in its row group's values
    chunk: I64
    piece: I64  # the stream-order piece it comes from
    layout: I64  # stream-order sub-piece ids in (step, lane, position) order, from from_step on


def shuffle_pieces(pc_: Pieces, keep: NDArray[np.bool_] | None, nl: int, keys: NDArray[np.uint64]) -> tuple[I64, I64]:
    """Packed order (:func:`planner.packing.packed_order`) of the kept lanes' pieces, and each lane's first.

    Returns stream-order piece ids lane by lane, each slice shuffled (``keys``: each rank
    lane's slice key, :func:`planner.packing.slice_keys`), and the index in them where each
    lane's pieces begin (one more at the end).
    """
    kept = np.flatnonzero(keep[pc_.local]) if keep is not None else np.arange(len(pc_.local), dtype=np.int64)
    lane = pc_.local[kept]
    bounds = np.searchsorted(lane, np.arange(nl + 1), side="left").astype(np.int64)
    return kept[packed_order(lane, keys[lane])], bounds


def _sub_pieces(pc_: Pieces, order: I64, lane_pos: I64, seq_len: int, from_step: int, nl: int) -> _Subs:
    """Every kept, non-empty piece cut where its lane's rows end (:func:`planner.packing.row_cuts`)."""
    length = pc_.end - pc_.start
    live = np.zeros(len(length), bool)
    live[order] = True
    rc = row_cuts(lane_pos, length, seq_len, live)
    rep = rc.piece
    return _Subs(
        step=rc.step,
        lane=pc_.local[rep],
        start=rc.start,
        end=rc.end,
        value=pc_.value[rep] + (rc.start - lane_pos[rep]),
        chunk=pc_.chunk[rep],
        piece=rep,
        layout=_layout(order, rc.count, rc.first, pc_.local, from_step, nl),
    )


def _chunk_lists(arrays: list[pa.Array], chunk: I64, value: I64, length: I64) -> list[pa.Array]:
    """List arrays over each row group's values: list i is item i (items tile each chunk's values)."""
    cb = np.searchsorted(chunk, np.arange(len(arrays) + 1), side="left")
    lists = []
    for c, arr in enumerate(arrays):
        i0, i1 = int(cb[c]), int(cb[c + 1])
        if i0 < i1:
            lists.append(list_views(arr.values, value[i0:i1], value[i0:i1] + length[i0:i1]))
    return lists


# Below this many tokens per sub-piece, a direct step-major gather spends more on its
# per-list overhead (about 100 ns a list in Polars) than a lane-major gather and one
# strided transpose cost together (docs/design.md, "Short rows").
SHORT_ROWS = 128


def _direct(
    arrays: list[pa.Array],
    subs: _Subs,
    dtype: np.dtype[Any],
    block_at: tuple[int, int, int, int, int],
    *,
    tiled: bool = True,
) -> tuple[Memory | None, NDArray[Any], pa.Array, I64]:
    """One gather of the sub-pieces: the block's steps (sub-pieces ``first:stop``) first, then the edges.

    The block leads the gathered memory, so its steps start on the allocation's
    alignment (a page, for Polars' large buffers): JAX takes memory without a copy
    only at 64-byte alignment, and each step is ``rows * seq_len`` tokens on from it.
    """
    lay = subs.layout
    length = (subs.end - subs.start)[lay]
    first, stop, n, rows, seq_len = block_at
    rot = np.concatenate([np.arange(first, stop), np.arange(first), np.arange(stop, len(lay))]).astype(np.int64)
    if len(lay) and tiled:
        values = gather_lists(_chunk_lists(arrays, subs.chunk, subs.value, subs.end - subs.start), lay[rot])
        assert values.type == pa.from_numpy_dtype(dtype), (values.type, dtype)
    elif len(lay):
        lists, ids = _scattered(arrays, subs.chunk, subs.value, subs.end - subs.start)
        values = gather_lists(lists, ids[lay[rot]])
        assert values.type == pa.from_numpy_dtype(dtype), (values.type, dtype)
    else:
        values = arrow_ints(np.zeros(0, dtype), pa.from_numpy_dtype(dtype))
    memory = Memory(values, dtype) if len(values) else None
    flat = memory.array() if memory is not None else np.zeros(0, dtype)
    start = np.empty(len(lay), np.int64)
    start[rot] = np.cumsum(length[rot]) - length[rot]
    block = flat[: n * rows * seq_len].reshape(n, rows, seq_len)
    return memory, block, values, start


def _transposed(
    arrays: list[pa.Array],
    pc_: Pieces,
    order: I64,
    lane_piece: I64,
    lane_base: I64,
    n_lane: I64,
    subs: _Subs,
    dtype: np.dtype[Any],
    t0: int,
    t1: int,
    seq_len: int,
) -> tuple[Memory | None, NDArray[Any], pa.Array, I64]:
    """Short rows: gather lane by lane, then transpose the block's steps in one strided copy.

    Lanes are in lockstep, so every lane's slice starts at stream position ``X0`` or
    ``X0 + 1`` and holds ``q`` or ``q + 1`` tokens: laid out one lane a row, padded by
    at most two tokens, the steps ``[t0, t1)`` are a regular ``(lanes, steps, L)`` view,
    and one NumPy copy (GIL released) writes them step-major. The edge steps' tokens
    are copied out by one index.
    """
    nl = len(n_lane)
    x0 = int(lane_base.min())
    front = lane_base - x0
    width = int((front + n_lane).max())
    back = width - front - n_lane
    assert int(front.max()) <= 1 and int(back.max()) <= 2
    length = pc_.end - pc_.start
    lists = _chunk_lists(arrays, pc_.chunk, pc_.value, length)
    pad_ids = sum(len(x) for x in lists)  # lists of 0, 1 and 2 filler tokens follow the pieces
    lists.append(
        list_views(arrow_ints(np.zeros(3, dtype), pa.from_numpy_dtype(dtype)), np.array([0, 0, 1]), np.array([0, 1, 3]))
    )
    lane_of = np.repeat(np.arange(nl, dtype=np.int64), np.diff(lane_piece))
    seq = np.empty(len(order) + 2 * nl, np.int64)
    seq[lane_piece[:-1] + 2 * np.arange(nl)] = pad_ids + front
    seq[np.arange(len(order)) + 2 * lane_of + 1] = order
    seq[lane_piece[1:] + 2 * np.arange(nl) + 1] = pad_ids + back
    lanes2d = numpy_view(gather_lists(lists, seq)).view(dtype).reshape(nl, width)
    n = t1 - t0
    buf = pa.allocate_buffer(n * nl * seq_len * dtype.itemsize)  # Arrow's pool: recycled pages
    memory = Memory(buf, dtype)
    block = memory.array().reshape(n, nl, seq_len)
    block[...] = lanes2d[:, t0 * seq_len - x0 : t1 * seq_len - x0].reshape(nl, n, seq_len).transpose(1, 0, 2)
    # The edge steps: their sub-pieces, in layout order, from the lane rows.
    lay = subs.layout
    st = subs.step[lay]
    edge = (st < t0) | (st >= t1)
    at = subs.lane[lay][edge] * width + (subs.start[lay][edge] - x0)
    ln = (subs.end - subs.start)[lay][edge]
    cum = np.cumsum(ln) - ln
    idx = np.repeat(at - cum, ln) + np.arange(int(ln.sum()), dtype=np.int64)
    edges_np = lanes2d.reshape(-1)[idx]
    edges = arrow_ints(edges_np, pa.from_numpy_dtype(dtype))
    start = np.full(len(lay), -1, np.int64)
    start[np.flatnonzero(edge)] = cum
    return memory, block, edges, start


def pack_unit(chunks: list[pa.Array], reads: UnitReads, columns: ColumnChunks | None = None) -> PackedUnit:
    """Pack the decoded row groups a rank read in one window into step-major blocks.

    ``chunks`` are the token columns of the rank's row groups in stream order (the
    reads of ``reads.place``, each starting at its ``token_start`` in the window's
    stream). ``window_z`` is the run's tokens before this window, mod ``lanes``;
    ``lane_base`` the tokens each rank lane received before this window (so its slice
    is lane stream positions ``[lane_base[i], lane_base[i] + n_i)``, and step ``t`` is
    ``[t * seq_len, (t + 1) * seq_len)`` of every lane). ``keep`` (one flag per rank
    lane) leaves out lanes that will never read this window, and ``from_step`` the
    steps before it (after a resume). ``columns``: each aligned column's values of every
    chunk and its dtype (:func:`plitzer.readpath.aligned.read_columns`), packed alike.
    """
    p = reads.place
    rank_lanes = p.rank_lanes
    nl = len(rank_lanes)
    q, r = divmod(p.window_tokens, p.lanes)
    # The rank's cuts c_{k0} .. c_{k1}: its lanes' token ranges, end to end.
    cuts = cut_at(np.arange(rank_lanes.start, rank_lanes.stop + 1), q, r, p.window_z, p.lanes)
    arrays = [documents_of(c)[0] for c in chunks]
    starts, bases = p.token_start.tolist(), reads.doc_base.tolist()
    pc_ = cut_pieces(arrays, starts, bases, cuts, at_end=rank_lanes.stop == p.lanes)
    order, lane_piece = shuffle_pieces(
        pc_, p.keep, nl, slice_keys(p.seed, p.epoch, p.window, np.arange(rank_lanes.start, rank_lanes.stop))
    )
    return finish_unit(arrays, pc_, order, lane_piece, reads, tiled=True, columns=columns)


def _whole_steps(
    lane_base: I64, n_lane: I64, seq_len: int, from_step: int, keep: NDArray[np.bool_] | None
) -> tuple[int, int]:
    """Steps ``[t0, t1)`` wholly inside this window for every rank lane (from ``from_step`` on)."""
    nl = len(n_lane)
    t0 = max(-(-int(lane_base.max()) // seq_len) if nl else 0, from_step)
    t1 = int((lane_base + n_lane).min()) // seq_len if nl else t0
    if keep is not None and not keep.all():
        t1 = t0  # lanes left out: no step is whole here (they all straddle or are past)
    return t0, max(t1, t0)


def finish_unit(
    arrays: list[pa.Array],
    pc_: Pieces,
    order: I64,
    lane_piece: I64,
    reads: UnitReads,
    *,
    tiled: bool,
    columns: ColumnChunks | None = None,
) -> PackedUnit:
    """The rank's pieces in packed order (slices ``lane_piece``) laid out step-major: the packed unit.

    ``tiled``: the pieces in stream order tile the decoded values (a window's own
    cut); a window cut again at a layout change (:func:`plitzer.readpath.recut.pack_rest`) takes
    suffixes of its slices, which leave gaps, and gathers them through :func:`_scattered`.
    """
    p = reads.place
    lane_base, seq_len, dtype = p.lane_base, p.seq_len, reads.dtype
    nl = len(lane_piece) - 1
    length = pc_.end - pc_.start
    packed_len = length[order]
    piece_end = np.cumsum(packed_len)
    lane_start = np.concatenate([[0], piece_end])[lane_piece]
    # Each piece's place in its lane's stream, in stream order (where pieces tile the
    # decoded values, as the list arrays need).
    lane_pos = lane_base[pc_.local] + slice_offsets(order, length, pc_.local)
    subs = _sub_pieces(pc_, order, lane_pos, seq_len, p.from_step, nl)
    n_lane = np.diff(lane_start)
    t0, t1 = _whole_steps(lane_base, n_lane, seq_len, p.from_step, p.keep)
    lay = subs.layout
    out_step = subs.step[lay]
    s_first = int(out_step[0]) if len(out_step) else t0
    s_stop = int(out_step[-1]) + 1 if len(out_step) else t0
    step_bounds = np.searchsorted(out_step, np.arange(s_first, s_stop + 1), side="left").astype(np.int64)
    first = int(step_bounds[t0 - s_first]) if t1 > t0 else 0
    stop = int(step_bounds[t1 - s_first]) if t1 > t0 else 0
    short = len(lay) > 0 and int((subs.end - subs.start).sum()) < SHORT_ROWS * len(lay)

    # Lanes left out (``keep``, after a resume) leave gaps between the kept lanes' pieces in
    # the decoded values, so those pieces no longer tile them and are gathered as scattered.
    tiled = tiled and len(order) == len(pc_.local)

    def gather(arrs: list[pa.Array], dt: np.dtype[Any]) -> tuple[Memory | None, NDArray[Any], pa.Array, I64]:
        if tiled and short and t1 > t0:
            return _transposed(arrs, pc_, order, lane_piece, lane_base, n_lane, subs, dt, t0, t1, seq_len)
        return _direct(arrs, subs, dt, (first, stop, t1 - t0, nl, seq_len), tiled=tiled)

    memory, block, edges, start = gather(arrays, dtype)
    # Aligned columns: the same pieces, row cuts and layout, one more gather each (plitzer.readpath.aligned).
    packed_columns = {}
    for name, (values, cdt) in (columns or {}).items():
        c_mem, c_block, c_edges, _ = gather(aligned_chunks(arrays, values, cdt), storage_dtype(cdt))
        if c_mem is not None:
            c_mem.keep_alive(memory)
        packed_columns[name] = ColumnBlock(c_mem, c_block, c_edges, cdt)
    return PackedUnit(
        unit=p.unit,
        epoch=p.epoch,
        window=p.window,
        rows=nl,
        seq_len=seq_len,
        t0=t0,
        t1=t1,
        memory=memory,
        block=block,
        edges=edges,
        steps=StepRange(s_first, step_bounds),
        row=subs.lane[lay],
        length=(subs.end - subs.start)[lay],
        doc=pc_.doc[subs.piece][lay],
        offset=(pc_.offset[subs.piece] + (subs.start - lane_pos[subs.piece]))[lay],
        start=start,
        slices=Slices(lane_start.astype(np.int64, copy=False), lane_piece, piece_end),
        columns=packed_columns,
    )


def _scattered(arrays: list[pa.Array], chunk: I64, value: I64, length: I64) -> tuple[list[pa.Array], I64]:
    """List arrays over the row groups' values holding items that need not tile them, and each item's list.

    Items (``chunk``, first ``value``, ``length``) do not overlap; sorted by place and
    with a filler list over each gap, they tile each row group's values from the first
    item to the last, as :func:`list_views` needs. Returns the lists and the index of each
    item's list among them (end to end).
    """
    n = len(chunk)
    srt = np.lexsort((value, chunk))
    c, v, ln = chunk[srt], value[srt], length[srt]
    prev_end = np.empty(n, np.int64)
    if n:
        prev_end[0] = v[0]
        prev_end[1:] = v[:-1] + ln[:-1]
        new_chunk = np.ones(n, bool)
        new_chunk[1:] = c[1:] != c[:-1]
        prev_end = np.where(new_chunk, v, prev_end)
    gap = v > prev_end
    # The combined sequence: [gap, item] per sorted item; position of each item in it.
    before = np.cumsum(gap)  # gaps up to and including this item's
    at = np.arange(n, dtype=np.int64) + before
    seq_c = np.empty(n + int(gap.sum()), np.int64)
    seq_s = np.empty_like(seq_c)
    seq_e = np.empty_like(seq_c)
    seq_c[at], seq_s[at], seq_e[at] = c, v, v + ln
    g = np.flatnonzero(gap)
    seq_c[at[g] - 1], seq_s[at[g] - 1], seq_e[at[g] - 1] = c[g], prev_end[g], v[g]
    ids = np.empty(n, np.int64)
    ids[srt] = at
    return _chunk_lists(arrays, seq_c, seq_s, seq_e - seq_s), ids
