"""A window's documents and the rank's pieces of them, with where their tokens are.

The rule (the cuts, the pieces, the packed order) is :mod:`planner.packing`'s, which
``locate`` runs on lengths; here it runs on the decoded row groups of one window, and
each document and piece also gets where its tokens are in them: the chunk, and the
index of its first token in that chunk's values. The packer lays the pieces out
(:func:`plitzer.readpath.pack.finish_unit`); a window cut again at a layout change
takes suffixes of them (:func:`plitzer.readpath.recut.pack_rest`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from planner.arraytypes import I64
from planner.packing import cut_documents, packed_order
from plitzer.readpath.packed import arrow_ints
from plitzer.readpath.read import list_lengths, numpy_view

__all__ = ["Documents", "Pieces", "cut_pieces", "documents_of", "shuffle_pieces", "unit_documents"]


def documents_of(arr: pa.Array) -> tuple[pa.Array, I64, I64]:
    """A list chunk, its documents' lengths and the value position of each document's start.

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
class Documents:
    """The documents of a unit's decoded row groups, in stream order, and where their tokens are.

    ``arrays``: the chunks, each one's documents' values end to end from its first offset
    (:func:`documents_of`); per document: ``start`` (window stream position), ``length``,
    ``id`` (running number over the dataset), ``chunk`` and ``value`` (index of its first
    token in that chunk's values).
    """

    arrays: list[pa.Array]
    start: I64
    length: I64
    id: I64
    chunk: I64
    value: I64


_NO_OFFSETS = np.zeros(1, np.int64)


def unit_documents(chunks: list[pa.Array], token_start: I64, doc_base: I64) -> Documents:
    """The documents of ``chunks`` (row groups in stream order, chunk ``c`` at ``token_start[c]``).

    One pass over all the chunks' offsets at once: the per-chunk work is a view of
    each one's offsets (a chunk with null lists is first rebuilt by :func:`documents_of`).
    """
    arrays = [c if not c.null_count else documents_of(c)[0] for c in chunks]
    nc = len(arrays)
    if not nc:
        z = np.zeros(0, np.int64)
        return Documents(arrays, z, z, z, z, z)
    sizes = np.fromiter((len(a) for a in arrays), np.int64, nc)
    o = np.concatenate([numpy_view(a.offsets) if len(a) else _NO_OFFSETS for a in arrays]).astype(np.int64)
    head = np.cumsum(sizes + 1) - (sizes + 1)  # each chunk's first offset
    inner = np.ones(len(o), bool)
    inner[head + sizes] = False  # each chunk's last offset ends its last document
    value = o[inner]
    length = o[1:][inner[:-1]] - value
    chunk = np.repeat(np.arange(nc, dtype=np.int64), sizes)
    base = np.asarray(token_start, np.int64) - o[head]  # stream position - value position, per chunk
    first = np.cumsum(sizes) - sizes
    doc_id = np.arange(len(value), dtype=np.int64) + np.repeat(np.asarray(doc_base, np.int64) - first, sizes)
    return Documents(arrays, value + base[chunk], length, doc_id, chunk, value)


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


def cut_pieces(docs: Documents, cuts: I64, *, at_end: bool) -> Pieces:
    """Every document of the read row groups that gives the rank a piece, split at the rank's cuts.

    The rule is :func:`planner.packing.cut_documents` (the rank's lanes, one rank);
    here each piece also gets where its tokens are in the decoded row groups.
    """
    parts = cut_documents(docs.start, docs.length, cuts, per=len(cuts) - 1, at_end=at_end)
    d = parts.doc
    offset = parts.start - docs.start[d]
    return Pieces(
        start=parts.start,
        end=parts.end,
        local=parts.lane,
        doc=docs.id[d],
        offset=offset,
        chunk=docs.chunk[d],
        value=docs.value[d] + offset,
    )


def shuffle_pieces(
    pc_: Pieces, keep: NDArray[np.bool_] | None, nl: int, keys: NDArray[np.uint64] | None
) -> tuple[I64, I64]:
    """Packed order (:func:`planner.packing.packed_order`) of the kept lanes' pieces, and each lane's first.

    Returns stream-order piece ids lane by lane, each slice shuffled (``keys``: each rank
    lane's slice key, :func:`planner.packing.slice_keys`; None: stream order), and the index in them where each
    lane's pieces begin (one more at the end).
    """
    kept = np.flatnonzero(keep[pc_.local]) if keep is not None else np.arange(len(pc_.local), dtype=np.int64)
    lane = pc_.local[kept]
    bounds = np.searchsorted(lane, np.arange(nl + 1), side="left").astype(np.int64)
    return kept[packed_order(lane, None if keys is None else keys[lane])], bounds
