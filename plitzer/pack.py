"""The packer: a window's documents into each lane's token stream, vectorized.

A worked example. One window, B = 2 lanes, three documents in stream order::

    d0 = [a a a]        starts at 0
    d1 = [b b]          starts at 3
    d2 = [c c c c c]    starts at 5          T_w = 10, cuts c_0 = 0, c_1 = 5

Document ``d`` belongs to lane ``max{k : c_k <= start_d}``: lane 0 gets d0, d1
(starts 0 and 3), lane 1 gets d2. Each lane's slice is then shuffled by
``permutation(n, key(seed, epoch, window, lane, 2))``; say lane 0's becomes
d1, d0. The lanes' streams continue from the previous window::

    lane 0: ... | b b a a a
    lane 1: ... | c c c c c

and with ``seq_len = 4`` every step takes the next 4 tokens of every lane, so a
sequence can hold the end of one document and the start of the next, or a piece
of a document longer than a sequence. Nothing is padded and nothing is dropped.

This module does the per-window part with whole-array operations: lane of every
document (integer arithmetic), the per-slice shuffles (one ``lexsort`` over
hashes), and one Polars list ``gather`` that lays out the rank's lanes contiguously. It
runs in a worker thread; Polars releases the GIL for the copy. The per-step part
(``take L tokens from every lane``) is in ``plitzer.loader``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from planner._hash import key, mix_array
from planner.plan import lane_of

__all__ = ["PackedWindow", "pack_window"]


@dataclass(slots=True, eq=False)
class PackedWindow:
    """The rank's lanes of one window, each slice's documents in shuffled order.

    ``flat[lane_start[i]:lane_start[i+1]]`` is the token stream of the rank's
    ``i``-th lane in this window. Packed document ``d`` ends at ``doc_end[d]``
    (a position in ``flat``) and is source document ``doc_id[d]`` (a running
    number over the dataset's rows); lane ``i``'s documents are
    ``lane_doc[i]:lane_doc[i+1]``, in shuffled order, empty documents included.
    """

    unit: int
    epoch: int
    window: int
    flat: NDArray[Any]  # int32 or uint32
    lane_start: NDArray[np.int64]
    lane_doc: NDArray[np.int64]
    doc_end: NDArray[np.int64]
    doc_id: NDArray[np.int64]

    @property
    def nbytes(self) -> int:
        return int(
            self.flat.nbytes + self.lane_start.nbytes + self.lane_doc.nbytes + self.doc_end.nbytes + self.doc_id.nbytes
        )

    def doc_start(self, d: int, lane: int) -> int:
        """Start (in ``flat``) of packed document ``d`` of rank lane ``lane``."""
        return int(self.doc_end[d - 1]) if d > self.lane_doc[lane] else int(self.lane_start[lane])


def _gather(chunks: list[pa.Array], order: NDArray[np.int64]) -> NDArray[Any]:
    """The tokens of documents ``order`` (indexes over all chunks), concatenated.

    Polars' list gather copies each document's values with one memcpy, in Rust,
    without the GIL, and reuses its allocator's memory (about 0.4 ns/token warm,
    measured in docs/design.md); Arrow's ``take`` on a list array first builds an
    int64 index per token and was 6x slower. No Python loop over documents.
    """
    series = pl.concat([pl.Series(c) for c in chunks], rechunk=False) if len(chunks) > 1 else pl.Series(chunks[0])
    taken = series.gather(order).to_arrow()
    if isinstance(taken, pa.ChunkedArray):
        taken = taken.combine_chunks()
    return taken.flatten().to_numpy(zero_copy_only=True)  # type: ignore[no-any-return]


def slice_keys(seed: int, epoch: int, window: int, lanes: range) -> NDArray[np.uint64]:
    """``key(seed, epoch, window, k, 2)`` for every lane ``k`` (a few hundred at most)."""
    prefix = np.uint64(key(seed, epoch, window))
    h = mix_array(prefix ^ np.arange(lanes.start, lanes.stop, dtype=np.uint64))
    return mix_array(h ^ np.uint64(2))


def pack_window(
    chunks: list[pa.Array],
    chunk_token_start: list[int],
    chunk_doc_base: list[int],
    *,
    window_tokens: int,
    lanes: int,
    rank_lanes: range,
    seed: int,
    epoch: int,
    window: int,
    unit: int,
    dtype: np.dtype[Any],
    keep: NDArray[np.bool_] | None = None,
) -> PackedWindow:
    """Pack the decoded row groups a rank read in one window into its lanes.

    ``chunks`` are the token columns of the rank's row groups in stream order,
    ``chunk_token_start`` where each starts in the window's stream, and
    ``chunk_doc_base`` the running number of each one's first document.
    ``keep`` (one flag per rank lane) leaves out the documents of lanes that will
    never read this window (after a resume); their slices are then empty.
    """
    lengths_parts = []
    starts_parts = []
    ids_parts = []
    for arr, start, base in zip(chunks, chunk_token_start, chunk_doc_base, strict=True):
        n = len(arr)
        lens = pc.list_value_length(arr).fill_null(0).to_numpy().astype(np.int64, copy=False)
        lengths_parts.append(lens)
        starts_parts.append(start + np.cumsum(lens) - lens)
        ids_parts.append(np.arange(base, base + n, dtype=np.int64))
    nl = len(rank_lanes)
    if not chunks:
        lengths = starts = ids = np.zeros(0, np.int64)
    else:
        lengths = np.concatenate(lengths_parts)
        starts = np.concatenate(starts_parts)
        ids = np.concatenate(ids_parts)

    lane = lane_of(starts, np.int64(window_tokens), lanes)  # type: ignore[arg-type]
    # Documents are in stream order, so lanes are sorted: the rank's documents are
    # one contiguous run, and each lane's slice one contiguous run inside it.
    lo = int(np.searchsorted(lane, rank_lanes.start, side="left"))
    hi = int(np.searchsorted(lane, rank_lanes.stop, side="left"))
    lane = lane[lo:hi]
    if keep is not None:
        kept = np.flatnonzero(keep[lane - rank_lanes.start]) + lo
        lane = lane[kept - lo]
    else:
        kept = np.arange(lo, hi, dtype=np.int64)
    bounds = np.searchsorted(lane, np.arange(rank_lanes.start, rank_lanes.stop + 1), side="left")
    ordinal = np.arange(len(lane), dtype=np.int64) - bounds[lane - rank_lanes.start]
    keys = slice_keys(seed, epoch, window, rank_lanes)
    h = mix_array(keys[lane - rank_lanes.start] ^ ordinal.astype(np.uint64))
    order = kept[np.lexsort((ordinal, h, lane))]

    packed_len = lengths[order]
    doc_end = np.cumsum(packed_len)
    lane_doc = bounds.astype(np.int64)
    lane_start = np.concatenate([[0], doc_end])[lane_doc]

    total = int(doc_end[-1]) if len(doc_end) else 0
    flat = _gather(chunks, order).view(dtype) if total else np.zeros(0, dtype=dtype)
    assert len(flat) == total and len(lane_start) == nl + 1
    return PackedWindow(
        unit=unit,
        epoch=epoch,
        window=window,
        flat=flat,
        lane_start=lane_start.astype(np.int64, copy=False),
        lane_doc=lane_doc,
        doc_end=doc_end,
        doc_id=ids[order],
    )
