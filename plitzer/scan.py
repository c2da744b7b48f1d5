"""The scanner: reads a rank's planned row groups, window by window, ahead of use.

A *unit* is one window of one epoch, numbered ``epoch * windows + window``: the
sequence every rank walks through. For each unit the scanner takes the rank's
reads from the plan (the same arrays ``Plan.reads`` shows), issues one ranged
read per row group and decodes it in a thread pool (pyarrow releases the GIL),
then packs the unit's lanes (``plitzer.pack``) in the same pool.

Memory: ``budget`` caps the decoded bytes held. A unit is charged its estimate
(decoded row groups plus the packed copy, from the footers) when its reads are
started, and its real size once packed; it is released when every lane of the
rank has moved past it. Units are started strictly in order, only while the
charge fits, so a later unit never delays an earlier one and the consumer never
waits on a read the budget allowed to start earlier. At most ``ahead`` units
past the furthest one in use are started early.

The units a step needs are always started, and they always fit: lanes run in
lockstep (SPEC section 3, rule 4), so at step ``t`` every lane is inside the run's
tokens ``[t*L*B, (t+1)*L*B + B)``, and the units held are the windows overlapping
that range, a number bounded from the footers alone (``plitzer.loader.budget_floor``),
which the Loader checks against ``budget`` at construction. ``peak_bytes`` and
``peak_units`` record what was held; ``overruns`` counts units started past the
budget, which the tests assert never happens.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from planner.dataset import Index
from planner.errors import UsageError
from planner.lanes import piece_range
from planner.plan import EpochPlan, Plan
from plitzer.pack import PackedWindow, pack_window, packed_bytes
from plitzer.read import read_chunk

__all__ = ["Scanner", "budget_floor", "unit_estimate"]


def unit_estimate(tokens: Any, rows: Any, lanes: int) -> Any:
    """Bytes charged while a unit is read and packed: decoded plus packed copy.

    ``lanes`` is the rank's lane count (each cut inside a document adds a piece).
    """
    return (4 * tokens + 8 * rows) + packed_bytes(tokens, rows, lanes)


@dataclass(eq=False)
class _Unit:
    unit: int
    future: Future[PackedWindow]
    charge: int
    chunks: list[pa.Array | None] = field(default_factory=list)
    left: int = 0


class Scanner:
    """Reads and packs units for one rank, in order, within a byte budget."""

    def __init__(
        self,
        plan: Plan,
        *,
        rank: int,
        budget: int,
        threads: int,
        ahead: int = 2,
    ) -> None:
        self.plan = plan
        self.index: Index = plan.dataset
        s = plan.settings
        per = s.lanes // s.world
        self.rank = rank
        self.rank_lanes = range(rank * per, (rank + 1) * per)
        self.budget = budget
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="plitzer-scan")
        self._lock = threading.Lock()
        self._units: dict[int, _Unit] = {}
        self._next = 0
        self._released = 0
        self._wanted = 0
        self.ahead = ahead
        self.held_bytes = 0
        self.peak_bytes = 0
        self.peak_units = 0
        self.overruns = 0
        self.rows_read = 0
        self.bytes_read = 0
        f = self.index.frame
        self._tokens = f["tokens"].to_numpy()
        self._rows = f["rows"].to_numpy()
        self._empty = f["empty_docs"].to_numpy()
        self._doc_base = np.cumsum(self._rows) - self._rows
        self.lanes = plan.settings.lanes
        self._first = np.zeros(len(self.rank_lanes), dtype=np.int64)
        self._first_max = 0
        self._dtype = np.dtype(self.index.dtype)
        self._closed = False

    # -- scheduling (consumer thread only) ---------------------------------------

    def reset(self, first_units: Sequence[int]) -> None:
        """Forget every unit; lane ``i`` of the rank next needs unit ``first_units[i]``.

        After a resume, lanes sit in different units. A unit behind some lanes'
        positions is then needed only by the lanes at or before it, so only the row
        groups that can hold those lanes' documents are read: resuming reads what
        the positions need, not whole windows (docs/design.md, "Resuming").
        """
        first = np.asarray(first_units, dtype=np.int64)
        unit = int(first.min())
        self._first = first
        self._first_max = int(first.max())
        with self._lock:
            for u in self._units.values():
                u.future.cancel()
            self._units.clear()
            self.held_bytes = 0
        self._next = unit
        self._released = unit
        self._wanted = unit

    def _reads(self, unit: int) -> tuple[int, int, np.ndarray, np.ndarray]:
        epoch, window = self.plan.unit_epoch_window(unit)
        ep = self.plan.epoch(epoch)
        positions = ep.reads_of(window, self.rank)
        if unit < self._first_max:
            positions = positions[self._needed_positions(ep, positions, unit)]
        return epoch, window, ep.order[positions], ep.token_start[positions]

    def _needed(self, unit: int) -> NDArray[np.bool_] | None:
        """Which of the rank's lanes need ``unit`` (None: all of them)."""
        return None if unit >= self._first_max else self._first <= unit

    def _needed_positions(self, ep: EpochPlan, positions: NDArray[np.int64], unit: int) -> NDArray[np.bool_]:
        """Of a window's read positions, those that can hold a needed lane's documents."""
        needed = self._needed(unit)
        assert needed is not None
        rgs = ep.order[positions]
        tok = self._tokens[rgs]
        lo, hi = piece_range(ep.token_start[positions], tok, self._empty[rgs])
        w = self.plan.unit_epoch_window(unit)[1]
        first = self.rank_lanes.start
        a = np.clip(ep.lane_of(w, lo, self.lanes) - first, 0, len(needed) - 1)
        b = np.clip(ep.lane_of(w, hi, self.lanes) - first, 0, len(needed) - 1)
        count = np.concatenate([[0], np.cumsum(needed)])
        has: NDArray[np.bool_] = count[b + 1] - count[a] > 0
        return has

    def _estimate(self, unit: int) -> int:
        _, _, rgs, _ = self._reads(unit)
        return int(unit_estimate(int(self._tokens[rgs].sum()), int(self._rows[rgs].sum()), len(self.rank_lanes)))

    def _start(self, unit: int, charge: int) -> None:
        epoch, window, rgs, starts = self._reads(unit)
        fut: Future[PackedWindow] = Future()
        u = _Unit(unit=unit, future=fut, charge=charge, chunks=[None] * len(rgs), left=len(rgs))
        self._units[unit] = u
        with self._lock:
            if self.held_bytes + charge > self.budget:
                self.overruns += 1
            self.held_bytes += charge
            self.peak_bytes = max(self.peak_bytes, self.held_bytes)
            self.peak_units = max(self.peak_units, len(self._units))
        token_start = [int(x) for x in starts]
        doc_base = [int(self._doc_base[g]) for g in rgs]
        ep = self.plan.epoch(epoch)
        window_tokens = int(ep.window_tokens[window])
        window_z = int(ep.window_z[window])
        keep = self._needed(unit)

        def pack() -> None:
            try:
                chunks = [c for c in u.chunks if c is not None]
                u.chunks = []
                pw = pack_window(
                    chunks,
                    token_start,
                    doc_base,
                    window_tokens=window_tokens,
                    window_z=window_z,
                    lanes=self.plan.settings.lanes,
                    rank_lanes=self.rank_lanes,
                    keep=keep,
                    seed=self.plan.settings.seed,
                    epoch=epoch,
                    window=window,
                    unit=unit,
                    dtype=self._dtype,
                )
            except BaseException as e:
                fut.set_exception(e)
                return
            with self._lock:
                if unit in self._units:
                    self.held_bytes += pw.nbytes - u.charge
                    u.charge = pw.nbytes
            fut.set_result(pw)

        if not len(rgs):
            self._pool.submit(pack)
            return

        def read(i: int, g: int) -> None:
            if fut.done():
                return
            try:
                arr = read_chunk(self.index, g)  # checked, as list<int32> or list<uint32>
            except BaseException as e:
                if not fut.done():
                    fut.set_exception(e)
                return
            with self._lock:
                u.chunks[i] = arr
                u.left -= 1
                last = u.left == 0
                self.rows_read += 1
                self.bytes_read += int(self.index.frame["byte_length"][g])
            if last:
                pack()

        for i, g in enumerate(rgs.tolist()):
            self._pool.submit(read, i, g)

    def _prefetch(self) -> None:
        while self._next <= self._wanted + self.ahead:
            est = self._estimate(self._next)
            with self._lock:
                fits = self.held_bytes + est <= self.budget
            if not fits:
                return
            self._start(self._next, est)
            self._next += 1

    def get(self, unit: int) -> PackedWindow:
        """The packed unit, waiting for it if needed; starts later units as budget allows."""
        if self._closed:
            msg = "the loader is closed; create a new Loader (and resume it) to go on"
            raise UsageError(msg)
        self._wanted = max(self._wanted, unit)
        while self._next <= unit:
            self._start(self._next, self._estimate(self._next))
            self._next += 1
        self._prefetch()
        return self._units[unit].future.result()

    def release_before(self, unit: int) -> None:
        """Every lane has moved past the units before ``unit``: free them."""
        if unit <= self._released:
            return
        with self._lock:
            for u in range(self._released, unit):
                got = self._units.pop(u, None)
                if got is not None:
                    self.held_bytes -= got.charge
        self._released = unit
        self._prefetch()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with self._lock:
            for u in self._units.values():
                u.future.cancel()
            self._units.clear()
            self.held_bytes = 0
        self._pool.shutdown(wait=True, cancel_futures=True)


def budget_floor(
    tokens: NDArray[Any], rows: NDArray[Any], *, lanes: int, window: int, seq_len: int, ahead: int = 0
) -> tuple[int, int]:
    """Bytes the units of one step can hold at most, and how many units that is.

    With ``ahead``, as many more worst-case windows (prefetch: ``ahead=1`` is what two
    windows in flight need, the one in use being read while the next is decoded).

    At step ``t`` every lane is inside the run's tokens ``[t*L*B - B, (t+1)*L*B)``
    (lockstep), so the units in use are the windows overlapping ``X = (L + 1) * B``
    tokens of the run: the two at its ends, and those wholly inside it, which exist
    only when a window can hold at most ``X`` tokens (with tiny row groups, or the
    short last window of an epoch). Any epoch may put the largest row groups
    together, so the bound takes the largest row groups for each unit. Checked once
    at construction, it means no step ever starts a read past the budget.
    """
    tok = np.asarray(tokens, dtype=np.int64)
    est = np.sort(8 * tok + 32 * np.asarray(rows, dtype=np.int64))[::-1]  # decoded + packed, per row group
    g, total = len(tok), int(tok.sum())
    if g == 0:
        return 0, 0
    x = (seq_len + 1) * lanes
    per_epoch = -(-g // window)
    epochs = x // max(total, 1) + 2  # epochs an interval of x tokens can touch
    asc = np.sort(tok)
    full = int(asc[:window].sum()) if g >= window else None
    short = g % window
    inside_full = 0
    if full is not None:
        inside_full = x // full if full > 0 else epochs * per_epoch
    inside_short = epochs - 1 if short and int(asc[:short].sum()) <= x else 0
    base = min(2 + inside_full + inside_short, epochs * per_epoch)
    count = (min(2 + inside_full, base) + ahead) * window + inside_short * short
    units = base + ahead
    whole, part = divmod(count, g)
    need = whole * int(est.sum()) + int(est[:part].sum()) + units * int(packed_bytes(0, 0, lanes))
    return need, units
