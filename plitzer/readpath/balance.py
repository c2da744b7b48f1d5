"""Balanced steps (SPEC section 18): a step's rows dealt to the data-parallel ranks by attention cost.

Each rank packs its own lanes, as without balance (its reads and its checkpoint part are
section 4's). Then, for step ``t``: each row's cost (``planner.balance.row_costs`` over its
segments) and its number of segments are gathered over the loader's group (two integers a
row, one all-gather), every rank computes the same deal (``planner.balance.deal``), and the
rows that change rank move by one all-to-all: tokens, labels, aligned columns and the row's
segments (from which the mask, the varlen metadata and ``documents()`` follow). The rows
that stay are copied locally and never sent. At world 1 there is nothing to exchange:
``microbatches`` only orders the rank's own rows.

:class:`Exchange` is what the deal needs of a group: :class:`plitzer.state.groups.TorchGroup`
gives one over a gloo group of the loader's own, and :class:`ObjectExchange` one over any
:class:`~plitzer.state.groups.Collective` (an all-gather of objects stands in for the
all-to-all there). :class:`Ahead` runs the exchange of the next step on a thread of its own
while the consumer trains on this one (docs/design.md, "Balanced steps").
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from planner.arraytypes import I64
from planner.balance import Deal, deal, row_costs
from planner.errors import PlitzerError
from plitzer.readpath.ahead import Ahead
from plitzer.readpath.batch import Batch, Tokens
from plitzer.readpath.packed import Segments

__all__ = [
    "CLOSE_WAIT_S",
    "DEAL_AHEAD",
    "NEEDS_GROUP",
    "Ahead",
    "BalanceStats",
    "Balancer",
    "Exchange",
    "ExchangeError",
    "ObjectExchange",
]

NEEDS_GROUP = (
    "balance=True at world={world} deals each step's rows over the data-parallel ranks and needs their group: "
    "use plitzer.Loader.in_group(group, ...) (a torch.distributed ProcessGroup or a Collective), "
    "plitzer.torch.Dataset(..., group=...) or plitzer.grain.Dataset(..., group=...), or leave out balance"
)
"""The ConfigError of a plain Loader with ``balance=True`` at world > 1 (SPEC section 18 rule 4)."""

_PEER = "a peer stopped, died or took other steps; the transport's error names its address"

CLOSE_WAIT_S = 60.0

DEAL_AHEAD = 3
"""Steps a balanced loader deals ahead of its consumer (:class:`plitzer.readpath.ahead.Ahead`'s depth):
a deal slowed by the next window's decoding (up to 27 ms at world 2 on 2 cores, docs/benchmarks.md)
is absorbed by the steps already dealt."""
"""How long ``close()`` waits for a step being exchanged (its peers may be gone) before leaving it."""

_SEGMENT_FIELDS = ("length", "doc", "offset", "epoch", "window")


class ExchangeError(PlitzerError, RuntimeError):
    """A step's exchange between the ranks failed (a peer stopped, died or disagreed)."""


class Exchange(Protocol):
    """The two collectives a balanced step makes, over the loader's own group (called in step order)."""

    @property
    def rank(self) -> int: ...

    @property
    def world(self) -> int: ...

    def all_gather_ints(self, values: I64) -> I64:
        """Every rank's ``values`` (the same length on each), stacked in rank order: ``(world, n)``."""
        ...

    def all_to_all_bytes(self, parts: list[bytes], sizes: list[int]) -> list[bytes]:
        """``parts[r]`` sent to rank ``r``; what each rank sent this one, in rank order (this rank's own: ``b""``).

        ``sizes[r]``: the bytes rank ``r`` sends this one (every rank knows them from the deal).
        """
        ...


@dataclass(frozen=True, slots=True)
class ObjectExchange:
    """An :class:`Exchange` over a :class:`~plitzer.state.groups.Collective` (``all_gather`` of objects).

    The all-to-all is an all-gather of each rank's parts, so every rank receives every
    part (``world`` times the bytes of a true all-to-all): the price of a Collective that
    knows only ``broadcast`` and ``all_gather``. A Collective that also has
    ``all_to_all(parts)`` (rank ``r`` gets ``parts[r]`` of every rank) is used for it.
    """

    collective: Any

    @property
    def rank(self) -> int:
        return int(self.collective.rank)

    @property
    def world(self) -> int:
        return int(self.collective.world)

    def all_gather_ints(self, values: I64) -> I64:
        got = self.collective.all_gather(np.asarray(values, np.int64).tolist())
        return np.asarray(got, dtype=np.int64).reshape(self.world, -1)

    def all_to_all_bytes(self, parts: list[bytes], sizes: list[int]) -> list[bytes]:
        own = getattr(self.collective, "all_to_all", None)
        if own is not None:
            return [bytes(p) for p in own(parts)]
        every = self.collective.all_gather(parts)
        return [bytes(every[r][self.rank]) for r in range(self.world)]


@dataclass(slots=True)
class BalanceStats:
    """Running figures of a balanced loader (``Loader.stats``' balance fields).

    ``steps``: steps dealt; ``imbalance`` and ``imbalance_assigned``: the mean over those
    steps of the slowest rank's cost over the mean rank's, dealt and as section 4 assigns
    the rows; ``last_imbalance``, ``last_imbalance_assigned``: the last step's;
    ``rows_moved`` and ``bytes_sent``: this rank's rows and bytes sent to other ranks;
    ``exchange_seconds``: wall time spent gathering costs, dealing and moving rows (in the
    read-ahead, waiting for peers included; not the consumer's wait). At world > 1 the loader's
    ``wait_seconds`` is the consumer's wait for its dealt steps (``consumer_wait``): the reads
    are waited for on the read-ahead's thread.
    """

    steps: int = 0
    imbalance_sum: float = 0.0
    assigned_sum: float = 0.0
    last_imbalance: float = 1.0
    last_imbalance_assigned: float = 1.0
    rows_moved: int = 0
    bytes_sent: int = 0
    exchange_seconds: float = 0.0
    consumer_wait: float | None = None  # at world > 1: the consumer's wait for dealt steps (Ahead.waited)

    def add(self, d: Deal, assigned: I64) -> None:
        mean = float(d.rank_cost.mean()) if len(d.rank_cost) else 0.0
        dealt = float(d.rank_cost.max()) / mean if mean > 0 else 1.0
        was = float(assigned.max()) / mean if mean > 0 else 1.0
        self.steps += 1
        self.imbalance_sum += dealt
        self.assigned_sum += was
        self.last_imbalance, self.last_imbalance_assigned = dealt, was

    def figures(self) -> dict[str, Any]:
        n = max(self.steps, 1)
        return {
            "balanced_steps": self.steps,
            "imbalance": self.imbalance_sum / n if self.steps else 1.0,
            "imbalance_assigned": self.assigned_sum / n if self.steps else 1.0,
            "last_imbalance": self.last_imbalance,
            "last_imbalance_assigned": self.last_imbalance_assigned,
            "rows_moved": self.rows_moved,
            "exchange_bytes": self.bytes_sent,
            "exchange_seconds": self.exchange_seconds,
        } | ({} if self.consumer_wait is None else {"wait_seconds": self.consumer_wait})


def _row_arrays(batch: Batch) -> list[NDArray[Any]]:
    """The per-token arrays that move with a row, in a fixed order: tokens, labels, aligned columns by name."""
    out: list[NDArray[Any]] = [np.asarray(batch.tokens)]
    if batch.labels is not None:
        out.append(np.asarray(batch.labels))
    out.extend(np.asarray(batch.columns[n]) for n in sorted(batch.columns))
    return out


class Balancer:
    """Deals each step's rows (:meth:`balance`) over ``exchange`` (None at world 1)."""

    def __init__(self, exchange: Exchange | None, microbatches: int) -> None:
        self.exchange = exchange
        self.microbatches = microbatches
        self.stats = BalanceStats()
        self._lock = threading.Lock()
        self._pending: dict[int, tuple[Deal, I64, int, int, float]] = {}  # dealt, not yet handed out

    def balance(self, batch: Batch) -> Batch:
        """``batch`` (this rank's own lanes of a step) as the deal gives this rank's rows of it."""
        t0 = time.perf_counter()
        ex = self.exchange
        world, rank = (1, 0) if ex is None else (ex.world, ex.rank)
        segs = batch._segs()
        rows = batch.tokens.shape[0]
        cost = row_costs(segs.row, segs.length, rows)
        npieces = np.bincount(segs.row, minlength=rows).astype(np.int64)
        if ex is None:
            costs_all, pieces_all = cost, npieces
        else:
            g = self._gather(ex, batch.step, np.concatenate([[batch.step], cost, npieces]))
            if not (g[:, 0] == batch.step).all():
                steps = g[:, 0].tolist()
                msg = (
                    f"step {batch.step}: the ranks dealt different steps ({steps}); every rank must take the same steps"
                )
                raise ExchangeError(msg)
            costs_all, pieces_all = g[:, 1 : rows + 1].reshape(-1), g[:, rows + 1 :].reshape(-1)
        d = deal(costs_all, world, self.microbatches)
        first = rank * rows  # this rank's first lane (section 4)
        mine = d.lanes_of(rank)
        arrays = _row_arrays(batch)
        sent = 0
        received: dict[int, tuple[list[NDArray[Any]], Segments]] = {}
        if ex is not None and world > 1:
            parts, sent = self._parts(batch, d, rank, rows, segs, arrays)
            got = self._all_to_all(ex, batch.step, parts, self._sizes(d, rank, rows, pieces_all, arrays))
            for src in range(world):
                if src != rank and got[src]:
                    received[src] = self._decode(got[src], d, src, rank, rows, pieces_all, arrays)
        out = self._assemble(batch, mine, first, rows, segs, arrays, received)
        assigned = np.bincount(np.arange(len(costs_all)) // rows, weights=costs_all, minlength=world)
        moved = int(((d.rank[first : first + rows]) != rank).sum())
        with self._lock:  # counted when the step is handed out (:meth:`handed`), not when dealt ahead
            self._pending[batch.step] = (d, assigned, moved, sent, time.perf_counter() - t0)
        if ex is None:
            self.handed(batch.step)
        return replace(out, cost=d.cost[rank].copy())

    def handed(self, step: int) -> None:
        """Step ``step`` was handed out: its figures join ``stats``."""
        with self._lock:
            got = self._pending.pop(step, None)
            if got is None:
                return
            d, assigned, moved, sent, seconds = got
            self.stats.add(d, assigned)
            self.stats.rows_moved += moved
            self.stats.bytes_sent += sent
            self.stats.exchange_seconds += seconds

    def drop_pending(self) -> None:
        """Forget the figures of steps dealt ahead and dropped (a seek, resume, live stage)."""
        with self._lock:
            self._pending.clear()

    # -- the exchange ------------------------------------------------------------------

    @staticmethod
    def _gather(ex: Exchange, step: int, values: I64) -> I64:
        try:
            return ex.all_gather_ints(values)
        except Exception as e:
            who = f"rank {ex.rank} of {ex.world}"
            msg = f"step {step}: gathering the rows' costs over the loader's group failed ({who}; {_PEER}): {e}"
            raise ExchangeError(msg) from e

    @staticmethod
    def _sizes(d: Deal, rank: int, rows: int, pieces_all: I64, arrays: list[NDArray[Any]]) -> list[int]:
        """The bytes each rank sends this one: its rows dealt here, and their pieces."""
        row_bytes = sum(a.shape[1] * a.dtype.itemsize for a in arrays)
        here = d.rank == rank
        out = []
        for src in range(len(d.rank_cost)):
            sel = here[src * rows : (src + 1) * rows] if src != rank else np.zeros(rows, bool)
            pieces = int(pieces_all[src * rows : (src + 1) * rows][sel].sum())
            out.append(int(sel.sum()) * row_bytes + 8 * len(_SEGMENT_FIELDS) * pieces)
        return out

    @staticmethod
    def _all_to_all(ex: Exchange, step: int, parts: list[bytes], sizes: list[int]) -> list[bytes]:
        try:
            return ex.all_to_all_bytes(parts, sizes)
        except Exception as e:
            who = f"rank {ex.rank} of {ex.world}"
            msg = f"step {step}: moving the dealt rows over the loader's group failed ({who}; {_PEER}): {e}"
            raise ExchangeError(msg) from e

    @staticmethod
    def _parts(
        batch: Batch, d: Deal, rank: int, rows: int, segs: Segments, arrays: list[NDArray[Any]]
    ) -> tuple[list[bytes], int]:
        """What this rank sends each rank: its rows dealt there (in lane order), arrays then segments."""
        first = rank * rows
        dest = d.rank[first : first + rows]
        piece_rows = segs.row
        parts: list[bytes] = []
        sent = 0
        for r in range(len(d.rank_cost)):
            idx = np.flatnonzero(dest == r) if r != rank else np.zeros(0, np.int64)
            if len(idx) == 0:
                parts.append(b"")
                continue
            take = np.isin(piece_rows, idx)  # pieces in row order, so these are the rows' pieces in lane order
            body = [a[idx].tobytes() for a in arrays]
            body += [np.asarray(getattr(segs, f))[take].astype(np.int64).tobytes() for f in _SEGMENT_FIELDS]
            part = b"".join(body)
            sent += len(part)
            parts.append(part)
        return parts, sent

    @staticmethod
    def _decode(
        buf: bytes, d: Deal, src: int, rank: int, rows: int, pieces_all: I64, arrays: list[NDArray[Any]]
    ) -> tuple[list[NDArray[Any]], Segments]:
        """Rows ``src`` sent this rank: (their per-token arrays, their segments with ``row`` = their order)."""
        lanes = np.flatnonzero(d.rank[src * rows : (src + 1) * rows] == rank) + src * rows
        n = len(lanes)
        pos = 0
        got: list[NDArray[Any]] = []
        for a in arrays:
            size = n * a.shape[1] * a.dtype.itemsize
            got.append(np.frombuffer(buf, a.dtype, n * a.shape[1], pos).reshape(n, a.shape[1]))
            pos += size
        counts = pieces_all[lanes]
        total = int(counts.sum())
        fields = {}
        for f in _SEGMENT_FIELDS:
            fields[f] = np.frombuffer(buf, np.int64, total, pos)
            pos += 8 * total
        if pos != len(buf):
            msg = f"rank {src} sent {len(buf)} bytes for {n} rows, {pos} expected: the ranks' settings differ"
            raise ExchangeError(msg)
        return got, Segments(row=np.repeat(np.arange(n, dtype=np.int64), counts), **fields)

    @staticmethod
    def _assemble(
        batch: Batch,
        mine: I64,
        first: int,
        rows: int,
        segs: Segments,
        arrays: list[NDArray[Any]],
        received: dict[int, tuple[list[NDArray[Any]], Segments]],
    ) -> Batch:
        """This rank's rows ``mine`` (lanes, in batch order), from its own rows and those received.

        One fancy-index copy a source and array, and one stable sort of the pieces: rows
        from each source arrive in lane order, so a lane's place in its source's block is
        its rank among that source's lanes in ``mine``.
        """
        me = first // rows
        src = mine // rows
        out = [np.empty((len(mine), *a.shape[1:]), a.dtype) for a in arrays]
        # The pieces of every row this rank has (its own rows, then each source's), and the
        # output row of each (-1: an own row dealt elsewhere).
        pool_rows: list[NDArray[np.int64]] = []
        pool_segs: list[Segments] = []
        for s_rank in [me, *sorted(received)]:
            at = np.flatnonzero(src == s_rank)  # output rows from this source, in lane order
            if s_rank == me:
                k = mine[at] - first
                got, s = arrays, segs
                where = np.full(rows, -1, np.int64)
            else:
                got, s = received[s_rank]
                k = np.argsort(np.argsort(mine[at], kind="stable"), kind="stable")  # they arrive in lane order
                where = np.full(len(at), -1, np.int64)
            for o, a in zip(out, got, strict=True):
                o[at] = a[k]
            where[k] = at
            pool_rows.append(where[s.row])
            pool_segs.append(s)
        row = np.concatenate(pool_rows)
        keep = np.flatnonzero(row >= 0)
        order = keep[np.argsort(row[keep], kind="stable")]
        fields = {f: np.concatenate([np.asarray(getattr(s, f)) for s in pool_segs])[order] for f in _SEGMENT_FIELDS}
        new_segs = Segments(row=row[order], **fields)
        names = sorted(batch.columns)
        has_labels = batch.labels is not None
        tokens = out[0].view(Tokens)
        labels = out[1].view(Tokens) if has_labels else None
        cols = {n: out[1 + has_labels + j].view(Tokens) for j, n in enumerate(names)}
        return replace(batch, tokens=tokens, labels=labels, columns=cols, lanes=mine.copy(), _segments=new_segs)
