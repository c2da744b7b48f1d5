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
which ``locate`` runs on lengths; :mod:`plitzer.readpath.pieces` adds where each piece's
tokens are in the decoded row groups, and this module the layout: one Polars list ``gather``
over list arrays whose offsets are the sub-pieces' boundaries in the decoded columns
(zero-copy views) writes each token once, in Rust, without the GIL, into memory
its allocator recycles (docs/design.md, "The hot path"). No Python loop over
documents, pieces or lanes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from planner.arraytypes import I64
from planner.lanes import window_cuts
from planner.packing import row_cuts, slice_keys, slice_offsets
from planner.run import UnitPlace
from plitzer.readpath.aligned import aligned_chunks, storage_dtype
from plitzer.readpath.labels import end_labels
from plitzer.readpath.packed import (
    ColumnBlock,
    Memory,
    PackedUnit,
    Slices,
    StepRange,
    UnitReads,
    arrow_ints,
    gather_lists,
    list_views,
)
from plitzer.readpath.pieces import Pieces, cut_pieces, shuffle_pieces, unit_documents
from plitzer.readpath.read import numpy_view

__all__ = ["SHORT_ROWS", "ColumnChunks", "chunk_lists", "finish_unit", "gather_layout", "pack_unit"]

ColumnChunks = dict[str, tuple[list[NDArray[Any]], np.dtype[Any]]]
"""Aligned columns of a unit's chunks: name -> (each chunk's values end to end, the column's dtype)."""


@dataclass(frozen=True, slots=True)
class _Layout:
    """A window's sub-pieces (pieces cut where rows end), as the gather needs them.

    In stream order (``*_s``: they tile the decoded values where the pieces do, as the
    gather's lists need), each one's chunk, first value position and length; in layout
    order, (step, lane, position) from ``from_step`` on, each one's stream-order id,
    step, row (rank lane), first position in the lane's stream, length, document and
    offset in it.
    """

    chunk_s: I64
    value_s: I64
    length_s: I64
    sid: I64
    step: I64
    row: I64
    start: I64
    length: I64
    doc: I64
    offset: I64


def _lay_out(pc_: Pieces, order: I64, lane_base: I64, seq_len: int, from_step: int) -> _Layout:
    """Every packed piece cut where its lane's rows end (:func:`planner.packing.row_cuts`), laid out step-major.

    The pieces are cut in packed order (lane by lane, each lane's in stream position), so
    the sub-pieces come out in (lane, position) order and one stable sort by step lays
    them out in (step, lane, position) order.
    """
    length = pc_.end - pc_.start
    packed_len = length[order]
    lane_o = pc_.local[order]
    pos_o = lane_base[lane_o] + slice_offsets(order, length, pc_.local)[order]
    rc = row_cuts(pos_o, packed_len, seq_len)
    j = rc.piece  # in packed order
    pid = order[j]  # the stream-order piece
    into = rc.start - pos_o[j]  # tokens of the piece before the sub-piece
    sub_len = rc.end - rc.start
    # Stream-order ids: a piece's sub-pieces follow the sub-pieces of the pieces before it.
    count = np.zeros(len(length), np.int64)
    count[order] = rc.count
    sid = (np.cumsum(count) - count)[pid] + (rc.step - rc.first[j])
    chunk_s, value_s, length_s = np.empty((3, len(sid)), np.int64)
    chunk_s[sid] = pc_.chunk[pid]
    value_s[sid] = pc_.value[pid] + into
    length_s[sid] = sub_len
    step = rc.step
    if from_step > 0 and len(step) and int(step.min()) < from_step:
        live = np.flatnonzero(step >= from_step)
        j, pid, into, sub_len, sid, step = j[live], pid[live], into[live], sub_len[live], sid[live], step[live]
        start = rc.start[live]
    else:
        start = rc.start
    lay = np.argsort(step, kind="stable")
    return _Layout(
        chunk_s=chunk_s,
        value_s=value_s,
        length_s=length_s,
        sid=sid[lay],
        step=step[lay],
        row=lane_o[j[lay]],
        start=start[lay],
        length=sub_len[lay],
        doc=pc_.doc[pid[lay]],
        offset=pc_.offset[pid[lay]] + into[lay],
    )


def chunk_lists(arrays: list[pa.Array], chunk: I64, value: I64, length: I64) -> list[pa.Array]:
    """List arrays over each row group's values: list i is item i (items tile each chunk's values).

    Every list's offsets come from one array (each chunk's item starts and its end, from 0):
    the work per chunk is two slices and a list array over them.
    """
    cb = np.searchsorted(chunk, np.arange(len(arrays) + 1), side="left")
    used = np.flatnonzero(cb[1:] > cb[:-1])
    if not len(used):
        return []
    i0, i1 = cb[used], cb[used + 1]
    lo, hi = value[i0], value[i1 - 1] + length[i1 - 1]
    offsets = np.insert(value, i1, hi) - np.repeat(lo, i1 - i0 + 1)
    at = i0 + np.arange(len(used))  # where each chunk's offsets begin
    spans = zip(used.tolist(), at.tolist(), (i1 - i0 + 1).tolist(), lo.tolist(), hi.tolist(), strict=True)
    return [
        pa.LargeListArray.from_arrays(arrow_ints(offsets[a : a + n], pa.int64()), arrays[c].values.slice(v0, v1 - v0))
        for c, a, n, v0, v1 in spans
    ]


# Below this many tokens per sub-piece, a direct step-major gather spends more on its
# per-list overhead (about 100 ns a list in Polars) than a lane-major gather and one
# strided transpose cost together (docs/design.md, "Short rows").
SHORT_ROWS = 128


def _direct(
    arrays: list[pa.Array],
    lay: _Layout,
    dtype: np.dtype[Any],
    block_at: tuple[int, int, int, int, int],
    *,
    tiled: bool = True,
) -> tuple[Memory | None, NDArray[Any], pa.Array, I64]:
    """One gather of the sub-pieces (:func:`gather_layout`), as lists over the decoded values.

    Tiled: the sub-pieces in stream order tile the values, one list each; else
    :func:`_scattered` fills the gaps between them.
    """
    if tiled:
        lists, list_of = chunk_lists(arrays, lay.chunk_s, lay.value_s, lay.length_s), lay.sid
    else:
        lists, at = _scattered(arrays, lay.chunk_s, lay.value_s, lay.length_s)
        list_of = at[lay.sid]
    return gather_layout(lists, list_of, lay.length_s[lay.sid], dtype, block_at)


def gather_layout(
    lists: list[pa.Array],
    list_of: I64,
    length: I64,
    dtype: np.dtype[Any],
    block_at: tuple[int, int, int, int, int],
) -> tuple[Memory | None, NDArray[Any], pa.Array, I64]:
    """One gather of sub-pieces given in layout order: the block's steps (sub-pieces ``first:stop``) first.

    ``list_of[i]``: the list (of ``lists``, end to end) holding layout sub-piece ``i``, of
    ``length[i]`` values. The block leads the gathered memory, so its steps start on the
    allocation's alignment (a page, for Polars' large buffers): JAX takes memory without a
    copy only at 64-byte alignment, and each step is ``rows * seq_len`` tokens on from it.
    Returns the memory, the ``(steps, rows, seq_len)`` block, the gathered values (the
    edges) and each sub-piece's first value in them, in layout order.
    """
    first, stop, n, rows, seq_len = block_at
    nb = stop - first
    ids = np.concatenate([list_of[first:stop], list_of[:first], list_of[stop:]])
    if len(ids):
        values = gather_lists(lists, ids)
        assert values.type == pa.from_numpy_dtype(dtype), (values.type, dtype)
    else:
        values = arrow_ints(np.zeros(0, dtype), pa.from_numpy_dtype(dtype))
    memory = Memory(values, dtype) if len(values) else None
    flat = memory.array() if memory is not None else np.zeros(0, dtype)
    ln = np.concatenate([length[first:stop], length[:first], length[stop:]])
    placed = np.cumsum(ln) - ln  # in gather order; back to layout order:
    start = np.concatenate([placed[nb : nb + first], placed[:nb], placed[stop:]])
    block = flat[: n * rows * seq_len].reshape(n, rows, seq_len)
    return memory, block, values, start


def _transposed(
    arrays: list[pa.Array],
    pc_: Pieces,
    order: I64,
    lane_piece: I64,
    lane_base: I64,
    n_lane: I64,
    lay: _Layout,
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
    lists = chunk_lists(arrays, pc_.chunk, pc_.value, length)
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
    edge = (lay.step < t0) | (lay.step >= t1)
    at = lay.row[edge] * width + (lay.start[edge] - x0)
    ln = lay.length[edge]
    cum = np.cumsum(ln) - ln
    idx = np.repeat(at - cum, ln) + np.arange(int(ln.sum()), dtype=np.int64)
    edges_np = lanes2d.reshape(-1)[idx]
    edges = arrow_ints(edges_np, pa.from_numpy_dtype(dtype))
    start = np.full(len(lay.sid), -1, np.int64)
    start[np.flatnonzero(edge)] = cum
    return memory, block, edges, start


def pack_unit(
    chunks: list[pa.Array],
    reads: UnitReads,
    columns: ColumnChunks | None = None,
    *,
    gather: bool = True,
    labels: bool = False,
) -> PackedUnit:
    """Pack the decoded row groups a rank read in one window into step-major blocks.

    ``chunks`` are the token columns of the rank's row groups in stream order (the
    reads of ``reads.place``, each starting at its ``token_start`` in the window's
    stream). ``window_z`` is the run's tokens before this window, mod ``lanes``;
    ``lane_base`` the tokens each rank lane received before this window (so its slice
    is lane stream positions ``[lane_base[i], lane_base[i] + n_i)``, and step ``t`` is
    ``[t * seq_len, (t + 1) * seq_len)`` of every lane). ``keep`` (one flag per rank
    lane) leaves out lanes that will never read this window, and ``from_step`` the
    steps before it (after a resume). ``columns``: each aligned column's values of every
    chunk and its dtype (:func:`plitzer.readpath.aligned.read_columns`), packed alike, and
    ``labels`` each sub-piece's last label (:mod:`plitzer.readpath.labels`). ``gather=False``: the layout's
    tables and slices only, no token copied (best-fit's units, :mod:`plitzer.bestfit.rows`).
    """
    p = reads.place
    rank_lanes = p.rank_lanes
    nl = len(rank_lanes)
    if not chunks:  # nothing read: no document, so no piece
        return _empty_unit(reads, columns, labels)
    # The rank's cuts c_{k0} .. c_{k1}: its lanes' token ranges, end to end.
    cuts = window_cuts(np.arange(rank_lanes.start, rank_lanes.stop + 1), p.window_tokens, p.window_z, p.lanes)
    docs = unit_documents(chunks, p.token_start, reads.doc_base)
    pc_ = cut_pieces(docs, cuts, at_end=rank_lanes.stop == p.lanes)
    order, lane_piece = shuffle_pieces(
        pc_, p.keep, nl, slice_keys(p.seed, p.epoch, p.window, np.arange(rank_lanes.start, rank_lanes.stop))
    )
    return finish_unit(
        docs.arrays, pc_, order, lane_piece, reads, tiled=True, columns=columns, gather=gather, labels=labels
    )


def _empty_unit(reads: UnitReads, columns: ColumnChunks | None, labels: bool) -> PackedUnit:
    """The unit of a window with nothing read (a selection left it empty): what :func:`finish_unit` makes of no pieces.

    Built directly: a step can span thousands of such windows, and the general path's
    layout, row cuts and gather on empty arrays cost about 0.1 ms a window. No step lies
    wholly inside it (every lane's slice is empty), no sub-piece, every slice empty.
    """
    p = reads.place
    nl = len(p.rank_lanes)
    t0, _ = _whole_steps(p.lane_base, np.zeros(nl, np.int64), p.units_per_row, p.from_step, p.keep)
    z = np.zeros(0, np.int64)

    def nothing(dt: np.dtype[Any]) -> tuple[NDArray[Any], pa.Array]:
        return np.zeros((0, nl, p.units_per_row), dt), arrow_ints(np.zeros(0, dt), pa.from_numpy_dtype(dt))

    block, edges = nothing(reads.dtype)
    packed_columns = {
        name: ColumnBlock(None, *nothing(storage_dtype(cdt)), cdt) for name, (_, cdt) in (columns or {}).items()
    }
    slices = Slices(np.zeros(nl + 1, np.int64), np.zeros(nl + 1, np.int64), z)
    lay = _Layout(z, z, z, z, z, z, z, z, z, z)
    unit = _unit(
        p, (t0, t0), (None, block, edges, z), StepRange(t0, np.zeros(1, np.int64)), lay, slices, packed_columns
    )
    return replace(unit, labels=z) if labels else unit


def _unit(
    p: UnitPlace,
    steps_in: tuple[int, int],
    gathered: tuple[Memory | None, NDArray[Any], pa.Array, I64],
    steps: StepRange,
    lay: _Layout,
    slices: Slices,
    columns: dict[str, ColumnBlock],
) -> PackedUnit:
    """The packed unit of ``p``: steps ``steps_in`` whole in its block, the gather's memory, block, edges and each
    sub-piece's start in the edges, and the sub-pieces' tables in layout order."""
    memory, block, edges, start = gathered
    return PackedUnit(
        unit=p.unit,
        epoch=p.epoch,
        window=p.window,
        rows=len(slices.lane_start) - 1,
        seq_len=p.units_per_row,  # tokens under concat; a rule of bins' rows are expanded after
        t0=steps_in[0],
        t1=steps_in[1],
        memory=memory,
        block=block,
        edges=edges,
        steps=steps,
        row=lay.row,
        length=lay.length,
        doc=lay.doc,
        offset=lay.offset,
        start=start,
        slices=slices,
        columns=columns,
    )


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
    gather: bool = True,
    labels: bool = False,
) -> PackedUnit:
    """The rank's pieces in packed order (slices ``lane_piece``) laid out step-major: the packed unit.

    ``tiled``: the pieces in stream order tile the decoded values (a window's own
    cut); a window cut again at a layout change (:func:`plitzer.readpath.recut.pack_rest`) takes
    suffixes of its slices, which leave gaps, and gathers them through :func:`_scattered`.
    """
    p = reads.place
    lane_base, per_row, dtype = p.lane_base, p.units_per_row, reads.dtype
    nl = len(lane_piece) - 1
    length = pc_.end - pc_.start
    piece_end = np.cumsum(length[order])
    lane_start = np.concatenate([[0], piece_end])[lane_piece]
    lay = _lay_out(pc_, order, lane_base, per_row, p.from_step)
    n_lane = np.diff(lane_start)
    t0, t1 = _whole_steps(lane_base, n_lane, per_row, p.from_step, p.keep)
    out_step = lay.step
    s_first = int(out_step[0]) if len(out_step) else t0
    s_stop = int(out_step[-1]) + 1 if len(out_step) else t0
    step_bounds = np.searchsorted(out_step, np.arange(s_first, s_stop + 1), side="left").astype(np.int64)
    first = int(step_bounds[t0 - s_first]) if t1 > t0 else 0
    stop = int(step_bounds[t1 - s_first]) if t1 > t0 else 0
    short = len(out_step) > 0 and int(lay.length_s.sum()) < SHORT_ROWS * len(out_step)

    # Lanes left out (``keep``, after a resume) leave gaps between the kept lanes' pieces in
    # the decoded values, so those pieces no longer tile them and are gathered as scattered.
    tiled = tiled and len(order) == len(pc_.local)

    def gathered_as(arrs: list[pa.Array], dt: np.dtype[Any]) -> tuple[Memory | None, NDArray[Any], pa.Array, I64]:
        if not gather:  # the tables alone: nothing gathered
            z = np.zeros(0, dt)
            return None, z.reshape(0, nl, per_row), arrow_ints(z, pa.from_numpy_dtype(dt)), np.zeros(0, np.int64)
        if tiled and short and t1 > t0:
            return _transposed(arrs, pc_, order, lane_piece, lane_base, n_lane, lay, dt, t0, t1, per_row)
        return _direct(arrs, lay, dt, (first, stop, t1 - t0, nl, per_row), tiled=tiled)

    gathered = gathered_as(arrays, dtype)

    # Aligned columns: the same pieces, row cuts and layout, one more gather each.
    def column(lists: list[pa.Array], cdt: np.dtype[Any]) -> ColumnBlock:
        c_mem, c_block, c_edges, _ = gathered_as(lists, storage_dtype(cdt))
        if c_mem is not None:
            c_mem.keep_alive(gathered[0])
        return ColumnBlock(c_mem, c_block, c_edges, cdt)

    packed_columns = {n: column(aligned_chunks(arrays, v, cdt), cdt) for n, (v, cdt) in (columns or {}).items()}
    slices = Slices(lane_start.astype(np.int64, copy=False), lane_piece, piece_end)
    unit = _unit(p, (t0, t1), gathered, StepRange(s_first, step_bounds), lay, slices, packed_columns)
    return replace(unit, labels=_end_labels(arrays, lay)) if labels else unit


def _end_labels(arrays: list[pa.Array], lay: _Layout) -> I64:
    """The label of each sub-piece's last token, in layout order (:func:`plitzer.readpath.labels.end_labels`).

    The labels kept with a unit: every other token's label is the token after it in its row.
    """
    sid = lay.sid
    return end_labels(arrays, lay.chunk_s[sid], lay.value_s[sid] + lay.length_s[sid] - 1)


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
    return chunk_lists(arrays, seq_c, seq_s, seq_e - seq_s), ids
