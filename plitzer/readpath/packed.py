"""Packed units: a window's tokens laid out step-major, and what batches take from them.

:class:`PackedUnit` is what :func:`plitzer.readpath.pack.pack_unit` makes of one window for a
rank: the steps wholly inside the window as one ``(steps, rows, seq_len)`` block (a
step's batch is a view of it), the sub-pieces of every step it gives tokens to, and
the shuffled :class:`Slices` checkpoints need. :class:`Memory` owns the block's
memory, so the read pool learns when the last view is gone. :func:`assemble` builds a
step that straddles windows from their ends, as a few strided NumPy copies (:class:`StepCopies`).
:class:`UnitReads` is a unit's input to the packer: what the read pool read for it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
from numpy.typing import NDArray

from planner.arraytypes import I64
from planner.run import UnitPlace
from plitzer.readpath.cost import LANE_BYTES, PIECE_BYTES
from plitzer.readpath.read import numpy_view

__all__ = [
    "ColumnBlock",
    "Memory",
    "PackedUnit",
    "Segments",
    "Slices",
    "StepCopies",
    "StepRange",
    "UnitReads",
    "arrow_ints",
    "assemble",
    "edge_values",
    "gather_lists",
    "list_views",
    "padded_segments",
]


@dataclass(frozen=True, slots=True, eq=False)
class UnitReads:
    """What the read pool read for one unit: the packer's whole input.

    ``place``: the run's answers for the unit (its planned reads, cuts and lane
    positions, :meth:`planner.run.Run.place`); ``doc_base``: the running number of each
    read row group's first document; ``estimate``: the bytes it is charged while read
    (:func:`plitzer.readpath.cost.unit_estimate`); ``dtype``: the token type.
    """

    place: UnitPlace
    doc_base: I64
    estimate: int
    dtype: np.dtype[Any]


class Memory:
    """Owns the packed tokens of one unit; every batch view of them refers to it.

    NumPy views (``block[t]``), DLPack tensors and Arrow arrays made from them keep
    this object alive, so the read pool learns that the last view is gone by a
    ``weakref.finalize`` on it, and only then stops counting its bytes against the
    budget (the allocator then reuses the memory for a later window).
    """

    __slots__ = ("__array_interface__", "__weakref__", "_dtype", "_keep", "_owner", "_size")

    def __init__(self, owner: pa.Array | pa.Buffer, dtype: np.dtype[Any]) -> None:
        if isinstance(owner, pa.Buffer):
            n = owner.size // dtype.itemsize
            address = owner.address if n else 0
        else:
            buf = owner.buffers()[1]
            n = len(owner)
            address = 0 if buf is None or n == 0 else buf.address + owner.offset * dtype.itemsize
        self._owner = owner  # holds the memory
        self._keep: object = None  # an aligned column's memory keeps the tokens' (and so the unit's charge)
        self._dtype = dtype
        self._size = n
        self.__array_interface__ = {"data": (address, False), "shape": (n,), "typestr": dtype.str, "version": 3}

    def keep_alive(self, other: object) -> None:
        """Hold ``other`` as long as this memory lives (an aligned column's memory, the tokens')."""
        self._keep = other

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


@dataclass(frozen=True, slots=True, eq=False)
class ColumnBlock:
    """One aligned column of a packed unit (plitzer.readpath.aligned): laid out as the tokens are.

    ``block`` and ``edges`` hold the column's values as an unsigned integer of its width
    (``storage_dtype``); ``dtype`` is the column's own, what batches view them as.
    """

    memory: Memory | None
    block: NDArray[Any]
    edges: pa.Array
    dtype: np.dtype[Any]

    @property
    def nbytes(self) -> int:
        shared = self.memory is not None and self.memory._owner is self.edges
        return int(self.edges.nbytes if shared else self.block.nbytes + self.edges.nbytes)


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
    columns: dict[str, ColumnBlock] = field(default_factory=dict)  # aligned columns, packed with the tokens
    labels: I64 | None = None  # labels=True: the label of each sub-piece's last token (plitzer.readpath.labels)

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
        columns = sum(c.nbytes for c in self.columns.values()) + (self.labels.nbytes if self.labels is not None else 0)
        return int(tokens + columns + PIECE_BYTES * len(self.row) + LANE_BYTES * len(self.slices.lane_start))


def arrow_ints(a: NDArray[Any], typ: pa.DataType) -> pa.Array:
    """A NumPy integer array as an Arrow array of ``typ``, without ``pa.array``.

    ``pa.array`` on a NumPy array imports pandas the first time (to ask whether it
    is a pandas object: 0.23 s measured), which a fresh process's first batch would
    wait for; building from the buffer does not.
    """
    data = np.ascontiguousarray(a, dtype=typ.to_pandas_dtype())
    return pa.Array.from_buffers(typ, len(data), [None, pa.py_buffer(data)])


def list_views(values: pa.Array, starts: I64, ends: I64) -> pa.Array:
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


def gather_lists(lists: list[pa.Array], order: I64) -> pa.Array:
    """The values of lists ``order`` (indexes over all the lists, end to end), concatenated.

    Polars' list gather copies each list's values with one memcpy, in Rust, without
    the GIL, into memory its allocator recycles (about 0.4 ns/token warm,
    docs/design.md); Arrow's ``take`` on a list array builds an int64 index per token
    first and was 6x slower. No Python loop over pieces.
    """
    series = pl.Series(lists[0]) if len(lists) == 1 else pl.concat([pl.Series(c) for c in lists], rechunk=False)
    # ``gather`` runs as a query, which releases the GIL while it copies; indexing the Series
    # (``series[order]``) costs less alone but holds the GIL: measured 3x slower beside one
    # busy Python thread, and it would stall the reader threads' decodes meanwhile.
    taken = series.gather(order).to_arrow()
    if isinstance(taken, pa.ChunkedArray):
        taken = taken.combine_chunks()
    return taken.flatten()


@dataclass(frozen=True, slots=True)
class StepCopies:
    """How a step that straddles windows is copied out of their edges: strided blocks.

    Block ``i`` copies ``rows[i]`` rows of ``width[i]`` tokens that lie end to end in unit
    ``unit[i]``'s edges from ``src[i]`` on, into the step's rows from ``row[i]`` on at column
    ``col[i]``. Lanes run in lockstep, so every lane's tokens from one window are one run of
    its edges and their lengths take at most two values (lanes before and after one
    threshold): a step is a handful of blocks, not a list a piece (docs/design.md, "The hot
    path").
    """

    unit: list[int]
    src: list[int]
    row: list[int]
    col: list[int]
    rows: list[int]
    width: list[int]
    segments: Callable[[], Segments]
    dest: I64  # each sub-piece's first token in the step's rows (flat), unit after unit, each unit's in order

    @classmethod
    def of(cls, units: list[PackedUnit], step: int, seq_len: int) -> StepCopies:
        """The blocks of step ``step`` over ``units`` (the windows it takes tokens from, in order)."""
        parts = [(i, u, *u.steps.of(step)) for i, u in enumerate(units)]
        parts = [(i, u, a, b) for i, u, a, b in parts if a < b]
        sizes = [b - a for *_, a, b in parts]

        def cat(name: str) -> I64:  # none at all: a rank whose lanes all ended (a finite run's last step)
            return np.concatenate([getattr(u, name)[a:b] for _, u, a, b in parts] or [np.zeros(0, np.int64)])

        row, length, src, unit = cat("row"), cat("length"), cat("start"), np.repeat([i for i, *_ in parts], sizes)
        # The step's rows hold each row's pieces window after window, each window's in order.
        order = np.lexsort((np.arange(len(row)), unit, row))
        dest = np.empty(len(row), np.int64)
        lo, ro = length[order], row[order]
        cum = np.cumsum(lo) - lo
        head = np.ones(len(ro), bool)
        head[1:] = ro[1:] != ro[:-1]
        dest[order] = ro * seq_len + cum - np.maximum.accumulate(np.where(head, cum, 0))  # a short row ends early
        # Pieces that follow each other in a unit's edges and in one row merge into runs.
        n = len(row)
        cont = np.zeros(n, bool)
        cont[1:] = (unit[1:] == unit[:-1]) & (src[1:] == src[:-1] + length[:-1]) & (row[1:] == row[:-1])
        cont[1:] &= dest[1:] == dest[:-1] + length[:-1]
        head = np.flatnonzero(~cont)
        r_unit, r_src, r_dest, r_row = unit[head], src[head], dest[head], row[head]
        r_len = np.add.reduceat(length, head) if n else length
        # Runs of the same width in consecutive rows, at the same column, end to end in one unit: blocks.
        m = len(head)
        same = np.zeros(m, bool)
        same[1:] = (r_unit[1:] == r_unit[:-1]) & (r_len[1:] == r_len[:-1]) & (r_row[1:] == r_row[:-1] + 1)
        same[1:] &= (r_src[1:] == r_src[:-1] + r_len[:-1]) & (r_dest[1:] == r_dest[:-1] + seq_len)
        b_head = np.flatnonzero(~same)
        b_rows = np.diff(np.append(b_head, m))
        # Document boundaries only when asked (most steps never are), from small copies of the
        # tables: nothing of a window's token memory is held by them.
        docs = [(u.doc[a:b].copy(), u.offset[a:b].copy(), u.epoch, u.window) for _, u, a, b in parts]
        docs = docs or [(row, row, -1, -1)]
        segs = functools.partial(_step_segments, row, length, order, docs)
        return cls(
            unit=r_unit[b_head].tolist(),
            src=r_src[b_head].tolist(),
            row=r_row[b_head].tolist(),
            col=(r_dest[b_head] - r_row[b_head] * seq_len).tolist(),
            rows=b_rows.tolist(),
            width=r_len[b_head].tolist(),
            segments=segs,
            dest=dest,
        )

    def copy(self, edges: list[NDArray[Any]], out: NDArray[Any], full: bool = True) -> NDArray[Any]:
        """The step's ``(rows, seq_len)`` array ``out`` filled from each unit's ``edges`` (as NumPy).

        ``full`` False: the rows may end early (a finite run's last step), ``out`` keeps its padding there.
        """
        filled = sum(k * w for k, w in zip(self.rows, self.width, strict=True))
        assert filled == out.size or (not full and filled <= out.size), "a step's rows left unfilled"
        for u, s, r, c, k, w in zip(self.unit, self.src, self.row, self.col, self.rows, self.width, strict=True):
            out[r : r + k, c : c + w] = edges[u][s : s + k * w].reshape(k, w)
        return out


def edge_values(edges: pa.Array, dtype: np.dtype[Any]) -> NDArray[Any]:
    """A unit's edges (an Arrow array) as a NumPy view of ``dtype``."""
    return numpy_view(edges).view(dtype) if len(edges) else np.zeros(0, dtype)


def assemble(
    units: list[PackedUnit], step: int, rows: int, seq_len: int, pad: tuple[int, np.dtype[Any]] | None = None
) -> tuple[NDArray[Any], Callable[[], Segments]]:
    """Step ``step``'s rows from the windows it straddles (each unit's sub-pieces of that step).

    Each window's part of the step is a few strided blocks of its edges (:class:`StepCopies`),
    copied by NumPy into an array the step owns: the edges are read-only Arrow memory, and a
    read-only step breaks JAX's DLPack import and ``torch.from_numpy`` (docs/design.md,
    "Every step writable"), and a step that kept views of two windows would hold them both.
    ``pad``: a finite run's last step (SPEC section 17), whose rows end early (those of lanes that
    ended, wholly; ``units`` may then be none): ``(pad_id, the tokens' dtype)``, each row filled
    with ``pad_id`` after its last token, a piece of document -1 as best-fit's padding is.
    """
    copies = StepCopies.of(units, step, seq_len)
    dtype = units[0].block.dtype if units else np.dtype(pad[1]) if pad is not None else None
    assert dtype is not None, "a step takes tokens from a unit"
    edges = [edge_values(u.edges, dtype) for u in units]
    if pad is None:
        return copies.copy(edges, np.empty((rows, seq_len), dtype)), copies.segments
    tokens = copies.copy(edges, np.full((rows, seq_len), pad[0], dtype), full=False)
    return tokens, functools.partial(padded_segments, copies.segments, rows, seq_len)


def padded_segments(segments: Callable[[], Segments], rows: int, seq_len: int) -> Segments:
    """``segments`` with a piece of document -1 (epoch and window -1) closing each row they leave short."""
    s = segments()
    short = seq_len - np.bincount(s.row, weights=s.length, minlength=rows).astype(np.int64)
    row = np.flatnonzero(short > 0)
    order = np.argsort(np.concatenate([s.row, row]), kind="stable")  # each row's pieces, then its padding
    minus = np.full(len(row), -1, np.int64)

    def cat(a: I64, b: I64) -> I64:
        out: I64 = np.concatenate([a, b])[order]
        return out

    return Segments(
        row=cat(s.row, row),
        length=cat(s.length, short[row]),
        doc=cat(s.doc, minus),
        offset=cat(s.offset, np.zeros(len(row), np.int64)),
        epoch=cat(s.epoch, minus),
        window=cat(s.window, minus),
    )


def _step_segments(row: I64, length: I64, order: I64, docs: list[tuple[I64, I64, int, int]]) -> Segments:
    """The pieces of a straddling step, in row order (:class:`StepCopies`)."""
    sizes = [len(d) for d, _, _, _ in docs]
    return Segments(
        row=row[order],
        length=length[order],
        doc=np.concatenate([d for d, _, _, _ in docs])[order],
        offset=np.concatenate([o for _, o, _, _ in docs])[order],
        epoch=np.repeat(np.array([e for _, _, e, _ in docs], np.int64), sizes)[order],
        window=np.repeat(np.array([w for _, _, _, w in docs], np.int64), sizes)[order],
    )
