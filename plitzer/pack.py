"""The packer: a window's documents into each lane's token stream, vectorized.

A worked example. One window, B = 2 lanes, three documents in stream order::

    d0 = [a a a]        stream positions 0..2
    d1 = [b b]          3..4
    d2 = [c c c c c]    5..9            T_w = 10, z = 0: cuts c_0 = 0, c_1 = 5, c_2 = 10

Lane ``k`` gets the tokens ``[c_k, c_{k+1})`` of the stream, as *pieces*: lane 0
gets d0 and d1 (positions 0..4), lane 1 gets d2. Had the cut fallen at 4, d1 would
be split there: ``[b]`` the last piece of lane 0, ``[b]`` the first of lane 1. Each
lane's slice of pieces is then shuffled by ``permutation(n, key(seed, epoch, window,
lane, 2))``; say lane 0's becomes d1, d0. The lanes' streams continue from the
previous window::

    lane 0: ... | b b a a a
    lane 1: ... | c c c c c

and with ``seq_len = 4`` every step takes the next 4 tokens of every lane, so a
sequence can hold the end of one document and the start of the next, or a piece
of a document longer than a sequence. Nothing is padded and nothing is dropped,
and since the cuts hand every lane ``q`` or ``q + 1`` tokens, round-robin over the
run, the lanes stay in lockstep (SPEC section 3, rule 4).

This module does the per-window part with whole-array operations: the pieces of
every document (cuts inside it, by ``searchsorted``), the lane of every piece, the
per-slice shuffles (one ``lexsort`` over hashes), and, for every packed piece,
where its tokens lie in the decoded row groups. Then, by default, one Polars list
``gather`` over list arrays whose offsets are the piece boundaries (zero-copy views
of the decoded columns) lays the rank's lanes out contiguously (``flat``), in a
worker thread, without the GIL, so that the per-step part (``take L tokens from
every lane``, in ``plitzer.loader``) is one slice copy per lane. With ``copy=False``
the gather is skipped: the stream stays a sequence of views into the decoded
columns and the step copies piece by piece. The scanner asks for that when the
consumer is already waiting for the window (the first batch, a resume, a budget
that cannot read ahead): the batch then waits for the decode alone.
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
from plitzer.read import list_lengths, numpy_view

__all__ = ["PackedWindow", "pack_window"]


@dataclass(slots=True, eq=False)
class PackedWindow:
    """Some of the rank's lanes of one window, each slice's pieces in shuffled order.

    It holds the rank's lanes ``first, first + 1, ...`` (counted within the rank;
    the scanner packs a window in parts). Positions are in the part's *stream*: the
    lanes' slices end to end, each slice's packed pieces in order. With
    ``j = i - first``, positions ``[lane_start[j], lane_start[j+1])`` are the rank's
    ``i``-th lane in this window, and its pieces are ``lane_piece[j]:lane_piece[j+1]``
    (shuffled; empty documents are pieces of length 0). Packed piece ``p`` ends at
    ``piece_end[p]``; it is tokens ``[piece_offset[p], piece_offset[p] + length)`` of
    source document ``doc_id[p]`` (a running number over the dataset's rows), and
    its token at stream position ``x`` is ``values[src_chunk[p]][src_base[p] + x]``,
    and, when the window was packed with a copy, ``flat[x]``. :meth:`tokens` copies
    any stretch of the stream; :meth:`copy_into` is the step's copy.
    """

    unit: int
    epoch: int
    window: int
    values: list[NDArray[Any]]  # the decoded row groups' tokens (int32 or uint32), shared
    lane_start: NDArray[np.int64]
    lane_piece: NDArray[np.int64]
    piece_end: NDArray[np.int64]
    src_chunk: NDArray[np.int64]
    src_base: NDArray[np.int64]
    doc_id: NDArray[np.int64]
    piece_offset: NDArray[np.int64]
    first: int = 0
    flat: NDArray[Any] | None = None  # the stream, contiguous (packed with a copy)

    def slice_of(self, lane: int) -> tuple[int, int]:
        """Start and end (stream positions) of rank lane ``lane``'s slice."""
        j = lane - self.first
        return int(self.lane_start[j]), int(self.lane_start[j + 1])

    def pieces_of(self, lane: int) -> tuple[int, int]:
        """Rank lane ``lane``'s packed pieces: ``p0:p1``."""
        j = lane - self.first
        return int(self.lane_piece[j]), int(self.lane_piece[j + 1])

    @property
    def nbytes(self) -> int:
        """Bytes of the piece tables and the packed copy (decoded values are counted by the scanner)."""
        return int(
            (0 if self.flat is None else self.flat.nbytes)
            + self.lane_start.nbytes
            + self.lane_piece.nbytes
            + self.piece_end.nbytes
            + self.src_chunk.nbytes
            + self.src_base.nbytes
            + self.doc_id.nbytes
            + self.piece_offset.nbytes
        )

    def piece_start(self, p: int, lane: int) -> int:
        """Start (stream position) of packed piece ``p`` of rank lane ``lane``."""
        j = lane - self.first
        return int(self.piece_end[p - 1]) if p > self.lane_piece[j] else int(self.lane_start[j])

    def copy_into(self, dst: NDArray[Any], start: int, piece: int) -> int:
        """Copy stream positions ``[start, start + len(dst))`` into ``dst``.

        ``piece`` is a packed piece at or before the one holding ``start`` (the
        lane's cursor keeps it); returns the piece holding the last token copied.
        """
        n = len(dst)
        if self.flat is not None:
            dst[:] = self.flat[start : start + n]
            return piece
        ends, base, chunk, values = self.piece_end, self.src_base, self.src_chunk, self.values
        x, col = start, 0
        while col < n:
            pe = int(ends[piece])
            if pe <= x:  # used up, or an empty document
                piece += 1
                continue
            t = min(pe - x, n - col)
            b = int(base[piece]) + x
            dst[col : col + t] = values[chunk[piece]][b : b + t]
            x += t
            col += t
        return piece

    def tokens(self, start: int, end: int) -> NDArray[Any]:
        """Stream positions ``[start, end)`` as a new array (for tests and tools)."""
        dtype = self.flat.dtype if self.flat is not None else self.values[0].dtype if self.values else np.int32
        out = np.empty(end - start, dtype=dtype)
        if end > start:
            self.copy_into(out, start, int(np.searchsorted(self.piece_end, start, side="right")))
        return out


def packed_bytes(tokens: Any, rows: Any, lanes: int) -> Any:
    """An upper bound of :attr:`PackedWindow.nbytes` for ``lanes`` rank lanes.

    4 bytes per token (the packed copy), 40 per piece (five int64 tables); a window
    has at most one piece per document plus one per cut inside a document (fewer
    than ``lanes + 1``). Each part adds a row to the two 8-byte lane tables, and
    there are at most as many parts as row groups, so at most ``rows``.
    """
    return 4 * tokens + 40 * (rows + lanes + 1) + 16 * (lanes + 1 + rows)


def arrow_ints(a: NDArray[Any], typ: pa.DataType) -> pa.Array:
    """A NumPy integer array as an Arrow array of ``typ``, without ``pa.array``.

    ``pa.array`` on a NumPy array imports pandas the first time (to ask whether it
    is a pandas object: 0.23 s measured), which a fresh process's first batch would
    wait for; building from the buffer does not.
    """
    data = np.ascontiguousarray(a, dtype=typ.to_pandas_dtype())
    return pa.Array.from_buffers(typ, len(data), [None, pa.py_buffer(data)])


def _gather(parts: list[pa.Array], order: NDArray[np.int64]) -> NDArray[Any]:
    """The tokens of pieces ``order`` (indexes over all parts' lists), concatenated.

    Polars' list gather copies each piece's values with one memcpy, in Rust,
    without the GIL, and reuses its allocator's memory (about 0.4 ns/token warm,
    measured in docs/design.md); Arrow's ``take`` on a list array first builds an
    int64 index per token and was 6x slower. No Python loop over pieces.
    """
    series = pl.concat([pl.Series(c) for c in parts], rechunk=False) if len(parts) > 1 else pl.Series(parts[0])
    taken = series.gather(order).to_arrow()
    if isinstance(taken, pa.ChunkedArray):
        taken = taken.combine_chunks()
    return numpy_view(taken.flatten())


def slice_keys(seed: int, epoch: int, window: int, lanes: range) -> NDArray[np.uint64]:
    """``key(seed, epoch, window, k, 2)`` for every lane ``k`` (a few hundred at most)."""
    prefix = np.uint64(key(seed, epoch, window))
    h = mix_array(prefix ^ np.arange(lanes.start, lanes.stop, dtype=np.uint64))
    return mix_array(h ^ np.uint64(2))


def _documents(arr: pa.Array) -> tuple[pa.Array, NDArray[np.int64], NDArray[np.int64]]:
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


def pack_window(
    chunks: list[pa.Array],
    chunk_token_start: list[int],
    chunk_doc_base: list[int],
    *,
    window_tokens: int,
    window_z: int,
    lanes: int,
    rank_lanes: range,
    seed: int,
    epoch: int,
    window: int,
    unit: int,
    dtype: np.dtype[Any],
    keep: NDArray[np.bool_] | None = None,
    first: int = 0,
    copy: bool = True,
) -> PackedWindow:
    """Pack the decoded row groups a rank read in one window into its lanes.

    ``chunks`` are the token columns of the rank's row groups in stream order,
    ``chunk_token_start`` where each starts in the window's stream, and
    ``chunk_doc_base`` the running number of each one's first document.
    ``window_z`` is the run's tokens before this window, mod ``lanes``.
    ``keep`` (one flag per rank lane) leaves out the pieces of lanes that will
    never read this window (after a resume); their slices are then empty.
    ``first`` is the index within the rank of ``rank_lanes.start`` (when packing
    part of the rank's lanes): what :class:`PackedWindow` methods subtract.
    ``copy=False`` skips the gather into ``flat``: the result then refers to the
    decoded columns, which stay alive as long as it does.
    """
    nl = len(rank_lanes)
    q, r = divmod(window_tokens, lanes)
    # The rank's cuts c_{k0} .. c_{k1}: its lanes' token ranges, end to end.
    cuts = cut_at(np.arange(rank_lanes.start, rank_lanes.stop + 1), q, r, window_z, lanes)
    c0, c1 = int(cuts[0]), int(cuts[-1])
    at_end = rank_lanes.stop == lanes  # an empty document at T_w is lane B-1's

    arrays, starts_p, lens_p, vbase_p, ids_p, chunk_p = [], [], [], [], [], []
    for c, (chunk_arr, start, base) in enumerate(zip(chunks, chunk_token_start, chunk_doc_base, strict=True)):
        arr, lens, vstart = _documents(chunk_arr)
        ds = start + np.cumsum(lens) - lens
        arrays.append(arr)
        starts_p.append(ds)
        lens_p.append(lens)
        vbase_p.append(vstart - ds)  # stream position + vbase = index into arr.values
        ids_p.append(np.arange(base, base + len(arr), dtype=np.int64))
        chunk_p.append(np.full(len(arr), c, np.int64))
    if chunks:
        ds, lens = np.concatenate(starts_p), np.concatenate(lens_p)
        vbase, ids, chunk = np.concatenate(vbase_p), np.concatenate(ids_p), np.concatenate(chunk_p)
    else:
        ds = lens = vbase = ids = chunk = np.zeros(0, np.int64)
    de = ds + lens

    # Only the documents that give this rank a piece: tokens in [c0, c1), or an empty
    # document at a position in [c0, c1) (or at T_w, for the rank of lane B-1). In
    # stream order these are one contiguous run of documents.
    mine = np.where(
        lens > 0,
        (np.minimum(de, c1) > np.maximum(ds, c0)),
        ((ds >= c0) & (ds < c1)) | (at_end & (ds == c1)),
    )
    sel = np.flatnonzero(mine)
    ds, de, lens, vbase, ids, chunk = ds[sel], de[sel], lens[sel], vbase[sel], ids[sel], chunk[sel]

    # Pieces: each document split at the rank's cuts strictly inside it, clipped to
    # [c0, c1). Cuts inside document d are cuts[lo[d]:hi[d]].
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
    local = np.minimum(np.searchsorted(cuts, p_start, side="right") - 1, nl - 1)

    # Where each piece's tokens are: row group (chunk) and the index in its values of
    # the piece's first token (pieces never cross a row group).
    p_chunk = chunk[rep]
    v_start = p_start + vbase[rep]
    parts = []
    if copy:
        # The list arrays of the pieces, one per chunk: offsets are the piece
        # boundaries in the chunk's values, values are shared.
        v_end = p_end + vbase[rep]
        bounds_c = np.searchsorted(p_chunk, np.arange(len(chunks) + 1), side="left")
        for c in range(len(chunks)):
            i0, i1 = int(bounds_c[c]), int(bounds_c[c + 1])
            if i0 == i1:
                continue
            offsets = np.empty(i1 - i0 + 1, np.int64)
            offsets[:-1] = v_start[i0:i1]
            offsets[-1] = v_end[i1 - 1]
            arr = arrays[c]
            large = pa.types.is_large_list(arr.type)
            cls = pa.LargeListArray if large else pa.ListArray
            off = arrow_ints(offsets, pa.int64() if large else pa.int32())
            parts.append(cls.from_arrays(off, arr.values))

    kept = np.flatnonzero(keep[local]) if keep is not None else np.arange(len(local), dtype=np.int64)
    lane = local[kept]
    bounds = np.searchsorted(lane, np.arange(nl + 1), side="left")
    ordinal = np.arange(len(lane), dtype=np.int64) - bounds[lane]
    keys = slice_keys(seed, epoch, window, rank_lanes)
    h = mix_array(keys[lane] ^ ordinal.astype(np.uint64))
    order = kept[np.lexsort((ordinal, h, lane))]

    packed_len = (p_end - p_start)[order]
    piece_end = np.cumsum(packed_len)
    lane_piece = bounds.astype(np.int64)
    lane_start = np.concatenate([[0], piece_end])[lane_piece]

    total = int(piece_end[-1]) if len(piece_end) else 0
    assert len(lane_start) == nl + 1
    flat = None
    values: list[NDArray[Any]] = []
    if copy:
        flat = _gather(parts, order).view(dtype) if total else np.zeros(0, dtype=dtype)
        assert len(flat) == total
        src_chunk = src_base = np.zeros(0, np.int64)
    else:
        for arr in arrays:
            v = numpy_view(arr.values)
            assert v.dtype.itemsize == np.dtype(dtype).itemsize, (v.dtype, dtype)
            values.append(v.view(dtype))
        src_chunk = p_chunk[order]
        # Token at stream position x of piece p: values[src_chunk[p]][src_base[p] + x].
        src_base = v_start[order] - (piece_end - packed_len)
    return PackedWindow(
        unit=unit,
        epoch=epoch,
        window=window,
        values=values,
        lane_start=lane_start.astype(np.int64, copy=False),
        lane_piece=lane_piece,
        piece_end=piece_end,
        src_chunk=src_chunk,
        src_base=src_base,
        doc_id=ids[rep][order],
        piece_offset=(p_start - ds[rep])[order],
        first=first,
        flat=flat,
    )
