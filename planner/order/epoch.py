"""One epoch's plan as arrays: row-group order, windows, lane cuts, and which rank reads what.

With G row groups, B lanes, W row groups per window and ``world`` ranks:

1. The row groups of epoch ``e`` are taken in the order ``permutation(G, key(seed, e, 1))``
   (in index order under ``shuffle=False``, SPEC section 17).
2. Windows are consecutive runs of W row groups in that order (the last may be shorter).
3. A window's stream is its row groups in that order, each one's documents in
   storage order; ``token_start`` is where a row group begins in that stream.
4. Lane cuts split the stream at exact token positions. With ``q, r = divmod(T_w, B)``
   and ``z`` the run's tokens before this window mod B, lane ``k`` gets ``q + 1``
   tokens when ``(k - z) mod B < r``, else ``q``: the cut arithmetic deals the run's
   tokens to lanes like cards (token ``i`` of the run counts to lane ``i mod B``),
   so every lane has received within one token of every other, at every window of
   every run. A document that crosses a cut is split there into *pieces*.
5. Rank ``r`` owns lanes ``[r*B/world, (r+1)*B/world)`` and reads only the row
   groups whose tokens meet its cut range (and those whose empty documents fall in it).

A worked example (docs/design.md, "Windows, token cuts and lanes (lockstep)"): B = 4,
T_w = 10, z = 3 gives q = 2, r = 2; lanes 3 and 0 get 3 tokens, lanes 1 and 2 get 2:
cuts 0, 3, 5, 7, 10; the next window has z = (3 + 10) mod 4 = 1.

The lane arithmetic itself is :mod:`planner.lanes`.

Everything here is numpy on the index's columns: no I/O, no hidden state. The
epochs' order over the run is :mod:`planner.order.epoch_order`; the tables over these arrays
are :class:`planner.order.plan.Plan`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from planner.arraytypes import I64
from planner.catalog.rowgroups import RowGroupIndex, stream_counts
from planner.errors import ConfigError
from planner.hashing import key, order_of
from planner.lanes import piece_range, window_cuts, window_lane
from planner.rules import Rule

__all__ = [
    "EpochPlan",
    "PlanSettings",
    "Traversal",
    "check_int",
    "cut_epoch",
    "layout_epoch",
    "plan_epoch",
    "row_group_counts",
    "unit_counts",
]


CUT_SLICE = 1 << 15
"""Positions whose lane cuts :func:`cut_epoch` computes at once (bounds its temporaries)."""


def check_int(name: str, value: object, low: int, fix: str) -> int:
    """``value`` as an int ``>= low``, or a ConfigError naming the field, the value and ``fix``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        msg = f"{name}={value!r} must be an integer >= {low}; {fix}"
        raise ConfigError(msg)
    if value < low:
        msg = f"{name}={value} must be >= {low}; {fix}"
        raise ConfigError(msg)
    return int(value)


@dataclass(frozen=True, slots=True, kw_only=True)
class Traversal:
    """How a run goes over the stream (SPEC section 17): its order, and its length in epochs (None: no end).

    ``shuffle`` False: row groups in index order and each lane's slice in stream order
    (the permutations of SPEC section 3 rules 1 and 5 are the identity).
    """

    shuffle: bool = True
    epochs: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.shuffle, (bool, np.bool_)):
            msg = f"shuffle={self.shuffle!r} must be True (the seed's order) or False (storage order, for evaluation)"
            raise ConfigError(msg)
        if self.epochs is not None:
            check_int("epochs", self.epochs, 1, "epochs is the run's length in epochs, or None for a run without end")


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanSettings:
    """The settings that shape a plan; each checks itself."""

    seed: int = 0
    lanes: int = 512
    window: int = 64
    world: int = 1
    traversal: Traversal = field(default_factory=Traversal)

    def __post_init__(self) -> None:
        if isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer)):
            msg = f"seed={self.seed!r} must be an integer"
            raise ConfigError(msg)
        check_int("lanes", self.lanes, 1, "lanes is the number of sequences per global batch")
        check_int("window", self.window, 1, "window is the number of row groups shuffled together")
        check_int("world", self.world, 1, "world is the number of ranks (GPUs)")
        if self.lanes % self.world:
            divisors = [d for d in range(1, self.lanes + 1) if self.lanes % d == 0]
            msg = (
                f"lanes={self.lanes} is not divisible by world={self.world}; every rank must own "
                f"the same number of lanes: use a world among {divisors[:12]} or lanes a multiple of {self.world}"
            )
            raise ConfigError(msg)

    @property
    def shuffle(self) -> bool:
        """False: storage order (:class:`Traversal`)."""
        return bool(self.traversal.shuffle)

    @property
    def epochs(self) -> int | None:
        """The run's epochs (None: no end; :class:`Traversal`)."""
        return self.traversal.epochs

    @property
    def slice_seed(self) -> int | None:
        """The seed of the slices' shuffles (SPEC section 3 rule 5); None: each slice in stream order."""
        return int(self.seed) if self.shuffle else None


@dataclass(frozen=True, slots=True)
class EpochPlan:
    """One epoch's plan as arrays (a position is a place in the epoch order)."""

    epoch: int
    order: I64  # row-group id (row of the index) at each position
    window: I64  # window of each position
    token_start: I64  # first token of each position in its window's stream
    window_tokens: I64  # T_w per window
    window_z: I64  # z per window: the run's tokens before it, mod B
    first_rank: I64  # first rank that reads each position (-1: nobody, no rows)
    last_rank: I64
    # Windows of fewer tokens than lanes (the only ones where a rank can own no token, and
    # so read nothing of a row group spanning it), and which ranks own a token there.
    short_windows: I64
    short_owns: NDArray[np.bool_]  # (len(short_windows), world)
    _reads: list[tuple[I64, I64, I64]] = field(default_factory=list, repr=False, compare=False)

    @property
    def windows(self) -> int:
        return len(self.window_tokens)

    # Every rank's reads, (window, rank, position) sorted so, built on first use (the plan's
    # tables): about positions x world / W of them, so a rank's loader, which asks
    # :meth:`reads_of` only, never builds them (docs/design.md, "One index per job").

    @property
    def read_window(self) -> I64:
        return self._all_reads()[0]

    @property
    def read_rank(self) -> I64:
        return self._all_reads()[1]

    @property
    def read_position(self) -> I64:
        return self._all_reads()[2]

    def _owns(self, window: Any, rank: Any) -> NDArray[np.bool_]:
        """Whether ``rank`` owns a token of ``window`` (arrays broadcast)."""
        w, r = np.broadcast_arrays(np.asarray(window, np.int64), np.asarray(rank, np.int64))
        out = np.ones(w.shape, bool)
        if len(self.short_windows):
            i = np.minimum(np.searchsorted(self.short_windows, w), len(self.short_windows) - 1)
            sel = self.short_windows[i] == w
            out[sel] = self.short_owns[i[sel], r[sel]]
        return out

    def _all_reads(self) -> tuple[I64, I64, I64]:
        if not self._reads:
            first, last = self.first_rank, self.last_rank
            count = np.where(first >= 0, last - first + 1, 0)
            rep = np.repeat(np.arange(len(first), dtype=np.int64), count)
            offs = np.cumsum(count) - count
            rank = first[rep] + (np.arange(len(rep), dtype=np.int64) - offs[rep])
            keep = (rank == first[rep]) | (rank == last[rep]) | self._owns(self.window[rep], rank)
            rep, rank = rep[keep], rank[keep]
            sort = np.lexsort((rep, rank, self.window[rep]))
            self._reads.append((self.window[rep][sort], rank[sort], rep[sort]))
        return self._reads[0]

    def cuts(self, window: int, lanes: int, k: Any = None) -> I64:
        """``c_0..c_B`` of one window (with ``c_B = T_w``), or ``c_k`` for the given ``k``."""
        if k is None:
            k = np.arange(lanes + 1, dtype=np.int64)
        return window_cuts(k, int(self.window_tokens[window]), int(self.window_z[window]), lanes)

    def lane_of(self, window: Any, x: Any, lanes: int) -> I64:
        """Lane of token position ``x`` of ``window`` (both arrays broadcast)."""
        return window_lane(x, self.window_tokens[window], self.window_z[window], lanes)

    def reads_of(self, window: int, rank: int) -> I64:
        """Positions a rank reads in a window, in stream order (from the window's positions alone)."""
        lo = int(np.searchsorted(self.window, window, side="left"))
        hi = int(np.searchsorted(self.window, window, side="right"))
        first, last = self.first_rank[lo:hi], self.last_rank[lo:hi]
        hit = (first <= rank) & (rank <= last)  # -1, -1: a position nobody reads
        inner = hit & (first != rank) & (last != rank)
        if inner.any() and not bool(self._owns(window, rank)):
            hit &= ~inner
        out: I64 = lo + np.flatnonzero(hit)
        return out


def plan_epoch(tokens: I64, rows: I64, empty_docs: I64, settings: PlanSettings, epoch: int) -> EpochPlan:
    """The plan of one epoch, from the index's per-row-group counts (docs/design.md, "The order")."""
    order = order_of(len(tokens), key(settings.seed, epoch, 1), settings.shuffle)
    run_before = epoch * int(tokens.sum())
    return layout_epoch(order, tokens, rows, empty_docs, settings, epoch, run_before)


def layout_epoch(
    order: I64, tokens: I64, rows: I64, empty_docs: I64, settings: PlanSettings, epoch: int, run_before: int
) -> EpochPlan:
    """Windows, lane cuts and reads of an epoch whose row groups come in ``order``.

    ``order`` holds row-group ids (rows of the index) in stream order; windows are
    consecutive runs of W of them; ``run_before`` is the run's tokens before the
    epoch (``z`` of its first window is that mod B). Shared by one source's epochs and
    a mixture's (:mod:`planner.mixing.mixture`).
    """
    s = settings
    g = len(order)
    window = np.arange(g, dtype=np.int64)
    window //= s.window
    starts = np.arange(0, g, s.window, dtype=np.int64)
    # token_start: each position's tokens before it in its window (the running sum less
    # the window's first), built in place: one array of 8 bytes a row group, not four.
    token_start = tokens[order]
    window_tokens = np.add.reduceat(token_start, starts) if g else np.zeros(0, np.int64)
    np.cumsum(token_start, out=token_start)
    token_start -= tokens[order]
    token_start -= np.repeat(np.cumsum(window_tokens) - window_tokens, np.diff(np.append(starts, g)))
    return cut_epoch(
        epoch,
        order,
        window,
        token_start,
        window_tokens.astype(np.int64, copy=False),
        tokens,
        rows,
        empty_docs,
        lanes=s.lanes,
        world=s.world,
        run_before=run_before,
    )


def cut_epoch(
    epoch: int,
    order: I64,
    window: I64,
    token_start: I64,
    window_tokens: I64,
    tokens: I64,
    rows: I64,
    empty_docs: I64,
    *,
    lanes: int,
    world: int,
    run_before: int,
) -> EpochPlan:
    """An epoch's lane cuts and reads for ``lanes`` lanes over ``world`` ranks (its windows given).

    What :func:`layout_epoch` does after placing the windows; a layout stage with
    other lanes (:mod:`planner.order.layout`) cuts the same windows again with it.
    """
    prefix = np.cumsum(window_tokens) - window_tokens
    window_z = (run_before % lanes + prefix % lanes) % lanes
    lanes_per_rank = lanes // world
    first = np.empty(len(order), np.int64)
    last = np.empty(len(order), np.int64)
    # In slices of CUT_SLICE positions: the lane arithmetic makes a dozen temporaries of
    # its arguments' size, which over a whole epoch were most of a rank's peak memory
    # (docs/design.md, "Bytes a row group"); a slice's are a few MB at any size.
    for a in range(0, len(order), CUT_SLICE):
        b = min(a + CUT_SLICE, len(order))
        at = order[a:b]
        tok, n, emp = tokens[at], rows[at], empty_docs[at]
        lo, hi = piece_range(token_start[a:b], tok, emp)
        w = window[a:b]
        t_w, z = window_tokens[w], window_z[w]
        first[a:b] = np.where(n > 0, window_lane(lo, t_w, z, lanes) // lanes_per_rank, -1)
        last[a:b] = np.where(n > 0, window_lane(hi, t_w, z, lanes) // lanes_per_rank, -1)

    short, owns = _short_windows(window_tokens, window_z, lanes=lanes, world=world)
    return EpochPlan(
        epoch=epoch,
        order=order,
        window=window,
        token_start=token_start,
        window_tokens=window_tokens,
        window_z=window_z,
        first_rank=first,
        last_rank=last,
        short_windows=short,
        short_owns=owns,
    )


def _short_windows(window_tokens: I64, window_z: I64, *, lanes: int, world: int) -> tuple[I64, NDArray[np.bool_]]:
    """The windows of fewer tokens than lanes, and which ranks own a token of each.

    A rank with an empty cut range (c_lo == c_hi) owns no token, so it reads nothing
    even if a row group spans across it. That needs T_w < B (else every lane gets
    q >= 1 tokens), so only those windows get a (windows x world) table: memory
    that grew with windows times ranks on every rank (docs/design.md, "One index per job").
    """
    lanes_per_rank = lanes // world
    short = np.flatnonzero(window_tokens < lanes).astype(np.int64)
    rk = np.arange(world, dtype=np.int64)[None, :]
    wt, wz = window_tokens[short][:, None], window_z[short][:, None]
    c_lo = window_cuts(rk * lanes_per_rank, wt, wz, lanes)
    c_hi = window_cuts((rk + 1) * lanes_per_rank, wt, wz, lanes)
    owns = c_lo < c_hi
    owns[:, -1] = True
    return short, owns


def unit_counts(idx: RowGroupIndex, rule: Rule) -> tuple[I64, I64, I64]:
    """Units, rows and unit-less documents of every row group, as the plan's packing rule counts them.

    The units the order cuts (:mod:`planner.rules`): tokens under concat (:func:`row_group_counts`),
    bins under best-fit (an index the bins pass counted at the run's ``seq_len``).
    """
    return rule.counts(idx.frame)


def row_group_counts(idx: RowGroupIndex) -> tuple[I64, I64, I64]:
    """Tokens, rows and empty documents of every row group of ``idx`` in the stream, as int64 arrays.

    Those a selection (``where=``) keeps where the index is selected
    (:func:`planner.catalog.rowgroups.stream_counts`).
    """
    tokens, rows, empty = stream_counts(idx.frame)
    # Views of the frame's own buffers (int64, no nulls), not copies: each caller (the plan,
    # the scanner) held three arrays of 8 bytes a row group of its own.
    return (
        tokens.to_numpy().astype(np.int64, copy=False),
        rows.to_numpy().astype(np.int64, copy=False),
        empty.to_numpy().astype(np.int64, copy=False),
    )
