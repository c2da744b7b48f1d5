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
hashes), the row cuts (one ``repeat``), and the layout: one Polars list ``gather``
over list arrays whose offsets are the sub-pieces' boundaries in the decoded columns
(zero-copy views) writes each token once, in Rust, without the GIL, into memory
its allocator recycles (docs/design.md, "The hot path"). No Python loop over
documents, pieces or lanes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from planner.hashing import key, mix_array
from planner.lanes import cut_at
from plitzer.cost import LANE_BYTES, PIECE_BYTES
from plitzer.read import list_lengths, numpy_view

__all__ = ["Memory", "PackedUnit", "Recut", "Segments", "Slices", "StepRange", "assemble", "pack_rest", "pack_unit"]

I64 = NDArray[np.int64]


class Memory:
    """Owns the packed tokens of one unit; every batch view of them refers to it.

    NumPy views (``block[t]``), DLPack tensors and Arrow arrays made from them keep
    this object alive, so the scanner learns that the last view is gone by a
    ``weakref.finalize`` on it, and only then stops counting its bytes against the
    budget (the allocator then reuses the memory for a later window).
    """

    __slots__ = ("__array_interface__", "__weakref__", "_dtype", "_owner", "_size")

    def __init__(self, owner: pa.Array | pa.Buffer, dtype: np.dtype[Any]) -> None:
        if isinstance(owner, pa.Buffer):
            n = owner.size // dtype.itemsize
            address = owner.address if n else 0
        else:
            buf = owner.buffers()[1]
            n = len(owner)
            address = 0 if buf is None or n == 0 else buf.address + owner.offset * dtype.itemsize
        self._owner = owner  # holds the memory
        self._dtype = dtype
        self._size = n
        self.__array_interface__ = {"data": (address, False), "shape": (n,), "typestr": dtype.str, "version": 3}

    def array(self) -> NDArray[Any]:
        """The tokens as a NumPy array whose base is this object."""
        if self._size == 0:
            return np.zeros(0, self._dtype)
        return np.asarray(self)


@dataclass(frozen=True, slots=True)
class Segments:
    """The pieces of some rows, in row order: what a batch's document boundaries come from.

    ``row`` (within the rank's rows), ``length`` (> 0), ``doc`` (a running number over
    the dataset's documents), ``offset`` (of the piece's first token in the document),
    and the piece's ``epoch`` and ``window``.
    """

    row: I64
    length: I64
    doc: I64
    offset: I64
    epoch: I64
    window: I64


@dataclass(frozen=True, slots=True)
class StepRange:
    """Steps ``[first, stop)`` that one unit gives sub-pieces to, and where each step's are."""

    first: int
    bounds: I64  # step first + i's sub-pieces are bounds[i]:bounds[i+1]

    @property
    def stop(self) -> int:
        return self.first + len(self.bounds) - 1

    def of(self, step: int) -> tuple[int, int]:
        i = step - self.first
        if i < 0 or i >= len(self.bounds) - 1:
            return 0, 0
        return int(self.bounds[i]), int(self.bounds[i + 1])


@dataclass(frozen=True, slots=True, eq=False)
class Slices:
    """The rank's shuffled slices of one window: where a lane's position is a piece and offset.

    Rank lane ``i``'s pieces are ``lane_piece[i]:lane_piece[i+1]``, ending at
    ``piece_end`` (positions in the rank's slices laid end to end; lane ``i``'s slice
    starts at ``lane_start[i]``). Small (16 bytes a piece), and apart from the packed
    tokens, so a checkpoint taken later can hold it without holding them.
    """

    lane_start: I64
    lane_piece: I64
    piece_end: I64

    def positions(self, lanes: I64, offsets: I64) -> tuple[I64, I64]:
        """A checkpoint's ``(piece, offset)`` of rank lanes ``lanes`` at ``offsets`` into their slices.

        The piece is the first of the shuffled slice whose end is past the offset
        (empty documents and used-up pieces before it are skipped); offset 0 is
        ``(0, 0)``, the slice's start, whatever its first pieces are.
        """
        target = self.lane_start[lanes] + offsets
        j = np.searchsorted(self.piece_end, target, side="right")
        prev = np.where(j > 0, self.piece_end[np.maximum(j - 1, 0)], 0) if len(self.piece_end) else target
        prev = np.maximum(prev, self.lane_start[lanes])
        zero = offsets == 0
        piece = np.where(zero, 0, j - self.lane_piece[lanes])
        offset = np.where(zero, 0, target - prev)
        return piece.astype(np.int64), offset.astype(np.int64)

    def offsets(self, lanes: I64, pieces: I64, offsets: I64) -> I64:
        """The inverse of :meth:`positions`: tokens into each slice, -1 where out of range."""
        ends = np.concatenate([[0], self.piece_end])  # ends[g + 1] is piece g's end
        p0, p1 = self.lane_piece[lanes], self.lane_piece[lanes + 1]
        s = self.lane_start[lanes]
        ok = (pieces >= 0) & (pieces <= p1 - p0) & (offsets >= 0)
        g = np.clip(p0 + pieces, 0, len(self.piece_end))
        start = np.maximum(np.where(pieces > 0, ends[g], s), s)
        end = np.where(pieces < p1 - p0, ends[np.minimum(g + 1, len(self.piece_end))], start)
        ok &= offsets <= end - start
        out: I64 = np.where(ok, start + offsets - s, -1)
        return out


@dataclass(slots=True, eq=False)
class PackedUnit:
    """The rank's lanes of one window, packed step-major.

    The steps ``[t0, t1)`` whose rows lie wholly in this window are ``block``, a
    ``(t1 - t0, rows, seq_len)`` array, so step ``t``'s batch is ``block[t - t0]``, a
    view. The sub-pieces of every step this unit gives tokens to (``row``, ``length``,
    ``doc``, ``offset``) are in (step, lane, position) order, ``steps`` says where each
    step's are; those of the steps at the window's ends, which straddle into the
    windows before or after, have their tokens at ``start`` in ``edges``.
    ``slices`` are the shuffled slices, what checkpoints need.
    """

    unit: int
    epoch: int
    window: int
    rows: int  # the rank's lanes
    seq_len: int
    t0: int
    t1: int
    memory: Memory | None  # owns block's memory (and edges', when they share it)
    block: NDArray[Any]
    edges: pa.Array
    steps: StepRange
    row: I64
    length: I64
    doc: I64
    offset: I64
    start: I64
    slices: Slices

    def segments(self, step: int) -> Segments:
        """The sub-pieces of ``step`` in this unit (views of the tables)."""
        a, b = self.steps.of(step)
        n = b - a
        return Segments(
            row=self.row[a:b],
            length=self.length[a:b],
            doc=self.doc[a:b],
            offset=self.offset[a:b],
            epoch=np.full(n, self.epoch, np.int64),
            window=np.full(n, self.window, np.int64),
        )

    @property
    def nbytes(self) -> int:
        """Bytes held: the packed tokens and the tables (the cost model's ``packed_bytes``)."""
        shared = self.memory is not None and self.memory._owner is self.edges
        tokens = self.edges.nbytes if shared else self.block.nbytes + self.edges.nbytes
        return int(tokens + PIECE_BYTES * len(self.row) + LANE_BYTES * len(self.slices.lane_start))


def arrow_ints(a: NDArray[Any], typ: pa.DataType) -> pa.Array:
    """A NumPy integer array as an Arrow array of ``typ``, without ``pa.array``.

    ``pa.array`` on a NumPy array imports pandas the first time (to ask whether it
    is a pandas object: 0.23 s measured), which a fresh process's first batch would
    wait for; building from the buffer does not.
    """
    data = np.ascontiguousarray(a, dtype=typ.to_pandas_dtype())
    return pa.Array.from_buffers(typ, len(data), [None, pa.py_buffer(data)])


def _lists(values: pa.Array, starts: I64, ends: I64) -> pa.Array:
    """A large-list array over ``values``: list ``i`` is ``values[starts[i]:ends[i]]``.

    Consecutive lists must tile a stretch of ``values`` (``ends[i] == starts[i+1]``).
    The values are sliced to that stretch and the offsets start at 0: given offsets
    that start further in, Polars copies the whole values buffer on import (1.7 ms
    against 0.07 ms for a 131 k-token step out of a 6 M-token window, measured).
    """
    lo = int(starts[0]) if len(starts) else 0
    hi = int(ends[-1]) if len(ends) else lo
    offsets = np.empty(len(starts) + 1, np.int64)
    offsets[:-1] = starts - lo
    offsets[-1] = hi - lo
    return pa.LargeListArray.from_arrays(arrow_ints(offsets, pa.int64()), values.slice(lo, hi - lo))


def _gather(lists: list[pa.Array], order: I64) -> pa.Array:
    """The values of lists ``order`` (indexes over all the lists, end to end), concatenated.

    Polars' list gather copies each list's values with one memcpy, in Rust, without
    the GIL, into memory its allocator recycles (about 0.4 ns/token warm,
    docs/design.md); Arrow's ``take`` on a list array builds an int64 index per token
    first and was 6x slower. No Python loop over pieces.
    """
    series = pl.Series(lists[0]) if len(lists) == 1 else pl.concat([pl.Series(c) for c in lists], rechunk=False)
    taken = series.gather(order).to_arrow()
    if isinstance(taken, pa.ChunkedArray):
        taken = taken.combine_chunks()
    return taken.flatten()


def slice_keys(seed: int, epoch: int, window: int, lanes: range) -> NDArray[np.uint64]:
    """``key(seed, epoch, window, k, 2)`` for every lane ``k`` (a few hundred at most)."""
    prefix = np.uint64(key(seed, epoch, window))
    h = mix_array(prefix ^ np.arange(lanes.start, lanes.stop, dtype=np.uint64))
    return mix_array(h ^ np.uint64(2))


def _documents(arr: pa.Array) -> tuple[pa.Array, I64, I64]:
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
class _Pieces:
    """A window's pieces for the rank's lanes, in stream order (see :func:`_pieces`)."""

    start: I64  # window stream position
    end: I64
    local: I64  # rank lane (within the rank)
    doc: I64
    offset: I64  # of the first token in its document
    chunk: I64  # decoded row group holding it
    value: I64  # index of its first token in that row group's values


def _pieces(
    arrays: list[pa.Array], chunk_token_start: list[int], chunk_doc_base: list[int], cuts: I64, *, at_end: bool
) -> _Pieces:
    """Every document of the read row groups that gives the rank a piece, split at the rank's cuts."""
    starts_p, lens_p, vbase_p, ids_p, chunk_p = [], [], [], [], []
    for c, (arr, start, base) in enumerate(zip(arrays, chunk_token_start, chunk_doc_base, strict=True)):
        _, lens, vstart = _documents(arr)
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
    de = ds + lens
    c0, c1 = int(cuts[0]), int(cuts[-1])
    # Only the documents that give this rank a piece: tokens in [c0, c1), or an empty
    # document at a position in [c0, c1) (or at T_w, for the rank of lane B-1). In
    # stream order these are one contiguous run of documents.
    mine = np.where(
        lens > 0,
        (np.minimum(de, c1) > np.maximum(ds, c0)),
        ((ds >= c0) & (ds < c1)) | (at_end & (ds == c1)),
    )
    sel = np.flatnonzero(mine)
    ds, de, vbase, ids, chunk = ds[sel], de[sel], vbase[sel], ids[sel], chunk[sel]
    # Each document split at the rank's cuts strictly inside it, clipped to [c0, c1).
    # Cuts inside document d are cuts[lo[d]:hi[d]].
    s_clip, e_clip = np.maximum(ds, c0), np.minimum(de, c1)
    lo = np.searchsorted(cuts, s_clip, side="right")
    hi = np.searchsorted(cuts, e_clip, side="left")
    npieces = 1 + np.maximum(hi - lo, 0)
    rep = np.repeat(np.arange(len(ds), dtype=np.int64), npieces)
    j = np.arange(len(rep), dtype=np.int64) - (np.cumsum(npieces) - npieces)[rep]
    last_cut = len(cuts) - 1
    p_start = np.where(j == 0, s_clip[rep], cuts[np.minimum(lo[rep] + j - 1, last_cut)])
    p_end = np.where(j == npieces[rep] - 1, e_clip[rep], cuts[np.minimum(lo[rep] + j, last_cut)])
    p_end = np.maximum(p_end, p_start)  # empty documents: length 0
    nl = len(cuts) - 1
    local = np.minimum(np.searchsorted(cuts, p_start, side="right") - 1, nl - 1)
    return _Pieces(
        start=p_start,
        end=p_end,
        local=local,
        doc=ids[rep],
        offset=p_start - ds[rep],
        chunk=chunk[rep],
        value=p_start + vbase[rep],
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


def _shuffle(pc_: _Pieces, keep: NDArray[np.bool_] | None, nl: int, keys: NDArray[np.uint64]) -> tuple[I64, I64]:
    """Packed order (stream-order piece ids, lane by lane, each slice shuffled; docs/glossary.md, "Piece").

    The ordinal of each piece in its lane's slice in stream order, then one lexsort by
    (lane, mix(key_lane ^ ordinal), ordinal): ``permutation(n, key(seed, e, w, k, 2))``.
    """
    kept = np.flatnonzero(keep[pc_.local]) if keep is not None else np.arange(len(pc_.local), dtype=np.int64)
    lane = pc_.local[kept]
    bounds = np.searchsorted(lane, np.arange(nl + 1), side="left").astype(np.int64)
    ordinal = np.arange(len(lane), dtype=np.int64) - bounds[lane]
    h = mix_array(keys[lane] ^ ordinal.astype(np.uint64))
    return kept[np.lexsort((ordinal, h, lane))], bounds


def _row_cuts(pc_: _Pieces, order: I64, lane_pos: I64, seq_len: int, from_step: int, nl: int) -> _Subs:
    """Every kept, non-empty piece cut where its lane's rows end: steps floor(s/L)..floor((e-1)/L)."""
    length = pc_.end - pc_.start
    live = np.zeros(len(length), bool)
    live[order] = True
    live &= length > 0
    s_lane, e_lane = lane_pos, lane_pos + length
    first_step = s_lane // seq_len
    nsub = np.where(live, (e_lane - 1) // seq_len - first_step + 1, 0)
    rep = np.repeat(np.arange(len(length), dtype=np.int64), nsub)
    k = np.arange(len(rep), dtype=np.int64) - (np.cumsum(nsub) - nsub)[rep]
    step = first_step[rep] + k
    start = np.maximum(s_lane[rep], step * seq_len)
    return _Subs(
        step=step,
        lane=pc_.local[rep],
        start=start,
        end=np.minimum(e_lane[rep], (step + 1) * seq_len),
        value=pc_.value[rep] + (start - s_lane[rep]),
        chunk=pc_.chunk[rep],
        piece=rep,
        layout=_layout(order, nsub, first_step, pc_.local, from_step, nl),
    )


def _chunk_lists(arrays: list[pa.Array], chunk: I64, value: I64, length: I64) -> list[pa.Array]:
    """List arrays over each row group's values: list i is item i (items tile each chunk's values)."""
    cb = np.searchsorted(chunk, np.arange(len(arrays) + 1), side="left")
    lists = []
    for c, arr in enumerate(arrays):
        i0, i1 = int(cb[c]), int(cb[c + 1])
        if i0 < i1:
            lists.append(_lists(arr.values, value[i0:i1], value[i0:i1] + length[i0:i1]))
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
        values = _gather(_chunk_lists(arrays, subs.chunk, subs.value, subs.end - subs.start), lay[rot])
        assert values.type == pa.from_numpy_dtype(dtype), (values.type, dtype)
    elif len(lay):
        lists, ids = _scattered(arrays, subs.chunk, subs.value, subs.end - subs.start)
        values = _gather(lists, ids[lay[rot]])
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
    pc_: _Pieces,
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
        _lists(arrow_ints(np.zeros(3, dtype), pa.from_numpy_dtype(dtype)), np.array([0, 0, 1]), np.array([0, 1, 3]))
    )
    lane_of = np.repeat(np.arange(nl, dtype=np.int64), np.diff(lane_piece))
    seq = np.empty(len(order) + 2 * nl, np.int64)
    seq[lane_piece[:-1] + 2 * np.arange(nl)] = pad_ids + front
    seq[np.arange(len(order)) + 2 * lane_of + 1] = order
    seq[lane_piece[1:] + 2 * np.arange(nl) + 1] = pad_ids + back
    lanes2d = numpy_view(_gather(lists, seq)).view(dtype).reshape(nl, width)
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


def pack_unit(
    chunks: list[pa.Array],
    chunk_token_start: list[int],
    chunk_doc_base: list[int],
    *,
    window_tokens: int,
    window_z: int,
    lanes: int,
    rank_lanes: range,
    lane_base: I64,
    seq_len: int,
    seed: int,
    epoch: int,
    window: int,
    unit: int,
    dtype: np.dtype[Any],
    keep: NDArray[np.bool_] | None = None,
    from_step: int = 0,
) -> PackedUnit:
    """Pack the decoded row groups a rank read in one window into step-major blocks.

    ``chunks`` are the token columns of the rank's row groups in stream order,
    ``chunk_token_start`` where each starts in the window's stream, and
    ``chunk_doc_base`` the running number of each one's first document.
    ``window_z`` is the run's tokens before this window, mod ``lanes``; ``lane_base``
    the tokens each rank lane received before this window (so its slice is lane
    stream positions ``[lane_base[i], lane_base[i] + n_i)``, and step ``t`` is
    ``[t * seq_len, (t + 1) * seq_len)`` of every lane). ``keep`` (one flag per rank
    lane) leaves out lanes that will never read this window, and ``from_step`` the
    steps before it (after a resume).
    """
    nl = len(rank_lanes)
    q, r = divmod(window_tokens, lanes)
    # The rank's cuts c_{k0} .. c_{k1}: its lanes' token ranges, end to end.
    cuts = cut_at(np.arange(rank_lanes.start, rank_lanes.stop + 1), q, r, window_z, lanes)
    arrays = [_documents(c)[0] for c in chunks]
    pc_ = _pieces(arrays, chunk_token_start, chunk_doc_base, cuts, at_end=rank_lanes.stop == lanes)
    order, lane_piece = _shuffle(pc_, keep, nl, slice_keys(seed, epoch, window, rank_lanes))
    return _finish(
        arrays, pc_, order, lane_piece, lane_base, seq_len, from_step, keep, dtype, (unit, epoch, window), tiled=True
    )


def _finish(
    arrays: list[pa.Array],
    pc_: _Pieces,
    order: I64,
    lane_piece: I64,
    lane_base: I64,
    seq_len: int,
    from_step: int,
    keep: NDArray[np.bool_] | None,
    dtype: np.dtype[Any],
    where: tuple[int, int, int],
    *,
    tiled: bool,
) -> PackedUnit:
    """The rank's pieces in packed order (slices ``lane_piece``) laid out step-major: the packed unit.

    ``tiled``: the pieces in stream order tile the decoded values (a window's own
    cut); a window cut again at a layout change (:func:`pack_rest`) takes suffixes
    of its slices, which leave gaps, and gathers them through :func:`_scattered`.
    """
    unit, epoch, window = where
    nl = len(lane_piece) - 1
    length = pc_.end - pc_.start
    packed_len = length[order]
    piece_end = np.cumsum(packed_len)
    lane_start = np.concatenate([[0], piece_end])[lane_piece]
    # Each piece's place in its lane's stream, in stream order (where pieces tile the
    # decoded values, as the list arrays need).
    lane_pos = np.zeros(len(length), np.int64)
    loc = pc_.local[order]
    lane_pos[order] = lane_base[loc] + (piece_end - packed_len) - lane_start[loc]
    subs = _row_cuts(pc_, order, lane_pos, seq_len, from_step, nl)

    # Steps wholly inside this window for every rank lane: [t0, t1).
    n_lane = np.diff(lane_start)
    t0 = max(-(-int(lane_base.max()) // seq_len) if nl else 0, from_step)
    t1 = int((lane_base + n_lane).min()) // seq_len if nl else t0
    if keep is not None and not keep.all():
        t1 = t0  # lanes left out: no step is whole here (they all straddle or are past)
    t1 = max(t1, t0)
    lay = subs.layout
    out_step = subs.step[lay]
    s_first = int(out_step[0]) if len(out_step) else t0
    s_stop = int(out_step[-1]) + 1 if len(out_step) else t0
    step_bounds = np.searchsorted(out_step, np.arange(s_first, s_stop + 1), side="left").astype(np.int64)
    first = int(step_bounds[t0 - s_first]) if t1 > t0 else 0
    stop = int(step_bounds[t1 - s_first]) if t1 > t0 else 0
    short = len(lay) > 0 and int((subs.end - subs.start).sum()) < SHORT_ROWS * len(lay)
    if tiled and short and t1 > t0:
        memory, block, edges, start = _transposed(
            arrays, pc_, order, lane_piece, lane_base, n_lane, subs, dtype, t0, t1, seq_len
        )
    else:
        memory, block, edges, start = _direct(arrays, subs, dtype, (first, stop, t1 - t0, nl, seq_len), tiled=tiled)
    return PackedUnit(
        unit=unit,
        epoch=epoch,
        window=window,
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
    )


def _scattered(arrays: list[pa.Array], chunk: I64, value: I64, length: I64) -> tuple[list[pa.Array], I64]:
    """List arrays over the row groups' values holding items that need not tile them, and each item's list.

    Items (``chunk``, first ``value``, ``length``) do not overlap; sorted by place and
    with a filler list over each gap, they tile each row group's values from the first
    item to the last, as :func:`_lists` needs. Returns the lists and the index of each
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


@dataclass(frozen=True, slots=True)
class Recut:
    """A layout change inside a window: from run token ``begin`` on, the rest is cut into ``lanes``."""

    lanes: int
    begin: int


def _split(start: I64, end: I64, cuts: I64) -> tuple[I64, I64, I64, I64]:
    """Intervals ``[start, end)`` (increasing, tiling their range) split at ``cuts`` inside them.

    Returns each part's interval index, start, end and lane (``max{k : cuts[k] <= start}``).
    """
    lo = np.searchsorted(cuts, start, side="right")
    hi = np.searchsorted(cuts, end, side="left")
    npieces = 1 + np.maximum(hi - lo, 0)
    rep = np.repeat(np.arange(len(start), dtype=np.int64), npieces)
    j = np.arange(len(rep), dtype=np.int64) - (np.cumsum(npieces) - npieces)[rep]
    last_cut = len(cuts) - 1
    p_start = np.where(j == 0, start[rep], cuts[np.minimum(lo[rep] + j - 1, last_cut)])
    p_end = np.where(j == npieces[rep] - 1, end[rep], cuts[np.minimum(lo[rep] + j, last_cut)])
    lane = np.minimum(np.searchsorted(cuts, p_start, side="right") - 1, len(cuts) - 2)
    return rep, p_start, p_end, lane


def pack_rest(
    chunks: list[pa.Array],
    chunk_token_start: list[int],
    chunk_doc_base: list[int],
    *,
    window_tokens: int,
    window_start: int,
    base_lanes: int,
    recuts: list[Recut],
    rank_lanes: range,
    lane_base: I64,
    seq_len: int,
    seed: int,
    epoch: int,
    window: int,
    unit: int,
    dtype: np.dtype[Any],
    keep: NDArray[np.bool_] | None = None,
    from_step: int = 0,
) -> PackedUnit:
    """Pack a window cut again by layout changes inside it (docs/design.md, "Layout stages").

    ``chunks`` are every row group of the window (stream order). The window is first
    cut into ``base_lanes`` lanes and shuffled as usual (``z`` from ``window_start``,
    the run's tokens before it); then, for each change in ``recuts`` (at run token
    ``begin``, into ``lanes``), what each lane has not consumed of its slice by then
    (lane ``k`` consumed ``ceil((begin - k) / B) - ceil((S - k) / B)`` tokens of it,
    ``S`` where its slices began) is laid end to end, lane 0's first, each in packed
    order, and cut into the new lanes by section 3.4 with ``z = begin mod lanes``, with
    no second shuffle. The last cut's lanes ``rank_lanes`` are packed like a window's
    (``lane_base``: their stream positions before it).
    """
    from planner.layout import stage_tokens

    b0 = base_lanes
    q, r = divmod(window_tokens, b0)
    cuts = cut_at(np.arange(b0 + 1), q, r, window_start % b0, b0)
    arrays = [_documents(c)[0] for c in chunks]
    pc_ = _pieces(arrays, chunk_token_start, chunk_doc_base, cuts, at_end=True)
    order, _ = _shuffle(pc_, None, b0, slice_keys(seed, epoch, window, range(b0)))
    # The current slicing, in packed order: stream piece, token range [a, e) inside it, lane.
    length = pc_.end - pc_.start
    src, a, e, lane = order, np.zeros(len(order), np.int64), length[order], pc_.local[order]
    lanes, begun = b0, window_start
    end_run = window_start + window_tokens
    for rc in recuts:
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
        total = end_run - rc.begin
        q, r = divmod(total, rc.lanes)
        new_cuts = cut_at(np.arange(rc.lanes + 1), q, r, rc.begin % rc.lanes, rc.lanes)
        rep, ps, pe, lane = _split(rest_start, rest_end, new_cuts)
        src, a = src[rep], a[rep] + (ps - rest_start[rep])
        e = a + (pe - ps)
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
    nl = len(rank_lanes)
    bounds = np.searchsorted(local, np.arange(nl + 1), side="left").astype(np.int64)
    ident = np.arange(len(src), dtype=np.int64)
    return _finish(
        arrays, rest, ident, bounds, lane_base, seq_len, from_step, keep, dtype, (unit, epoch, window), tiled=False
    )


def assemble(units: list[PackedUnit], step: int, rows: int, seq_len: int) -> tuple[NDArray[Any], Segments]:
    """Step ``step``'s rows from the windows it straddles (each unit's sub-pieces of that step).

    One Polars gather: every unit's sub-pieces of the step are lists over its packed
    tokens; ordered by (row, unit) they are the step's rows, end to end.
    """
    lists, row_p, unit_p, parts = [], [], [], []
    for u_i, u in enumerate(units):
        a, b = u.steps.of(step)
        if a == b:
            continue
        lists.append(_lists(u.edges, u.start[a:b], u.start[a:b] + u.length[a:b]))
        row_p.append(u.row[a:b])
        unit_p.append(np.full(b - a, u_i, np.int64))
        parts.append((u, a, b))
    row = np.concatenate(row_p)
    unit_of = np.concatenate(unit_p)
    order = np.lexsort((np.arange(len(row)), unit_of, row))
    dtype = units[0].block.dtype
    values = _gather(lists, order)
    # A copy into memory the step owns: the gather's Arrow buffer is read-only, and a
    # read-only step breaks JAX's DLPack import and torch.from_numpy (docs/design.md,
    # "Every step writable"). Straddling steps are a few per window, so the copy is a
    # small fraction of the tokens.
    tokens = np.empty((rows, seq_len), dtype)
    tokens.reshape(-1)[:] = numpy_view(values).view(dtype)

    def cat(name: str) -> I64:
        return np.concatenate([getattr(u, name)[a:b] for u, a, b in parts])[order]

    segs = Segments(
        row=row[order],
        length=cat("length"),
        doc=cat("doc"),
        offset=cat("offset"),
        epoch=np.concatenate([np.full(b - a, u.epoch, np.int64) for u, a, b in parts])[order],
        window=np.concatenate([np.full(b - a, u.window, np.int64) for u, a, b in parts])[order],
    )
    return tokens, segs
