"""The scanner: reads a rank's planned row groups, window by window, ahead of use.

A *unit* is one window of one epoch, numbered ``epoch * windows + window``: the
sequence every rank walks through. For each unit the scanner takes the rank's
reads from the plan (the same arrays ``Plan.reads`` shows), issues one ranged
read per row group and decodes it in a thread pool (pyarrow releases the GIL),
then packs the unit's lanes (``plitzer.pack``) in the same pool, in parts: a
lane's slice is a stretch of the window stream, so the lanes whose row groups
are decoded are packed at once, in the reader thread that finished the last of
them, while the other row groups still decode. Row groups are read in stream
order, so the first batch waits for the window's decode plus the packing of its
last part only (about one row group's worth), not of the whole window.

Memory: ``budget`` caps the decoded bytes held. A unit is charged its estimate
(decoded row groups plus the packed copy and tables, from the footers) when its reads are
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

import contextlib
import threading
from bisect import bisect_right
from collections.abc import Sequence
from concurrent.futures import Future, InvalidStateError, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from planner.dataset import Index
from planner.errors import UsageError
from planner.lanes import piece_range
from planner.plan import EpochPlan, Plan
from plitzer import _shutdown
from plitzer.pack import PackedWindow, pack_window, packed_bytes
from plitzer.read import read_chunk

__all__ = ["Scanner", "budget_floor", "unit_estimate"]


def unit_estimate(tokens: Any, rows: Any, lanes: int) -> Any:
    """Bytes charged while a unit is read and packed: decoded, plus the packed copy and tables.

    ``lanes`` is the rank's lane count (each cut inside a document adds a piece).
    A unit packed without the copy holds less; its charge drops to what it holds.
    """
    return (4 * tokens + 8 * rows) + packed_bytes(tokens, rows, lanes)


@dataclass(eq=False)
class _Unit:
    """One unit being read and packed: its row groups, and its lanes in parts.

    Part ``j`` packs the rank lanes ``[lane0[j], lane0[j+1])`` as soon as the row
    groups their slices touch (``users``: the parts each row group serves) are
    decoded, in the reader thread that decoded the last of them, so packing runs
    while later row groups decode and the first lanes are ready first.
    """

    unit: int
    parts: list[Future[PackedWindow]]
    lane0: list[int]
    charge: int
    chunks: list[pa.Array | None] = field(default_factory=list)
    users: list[list[int]] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)
    left: int = 0  # parts not packed yet
    packed: int = 0  # bytes so far: row groups decoded and the parts' piece tables
    dead: bool = False  # failed or cancelled: nothing more to do

    def kill(self, error: BaseException | None = None) -> None:
        self.dead = True
        for f in self.parts:
            with contextlib.suppress(InvalidStateError):  # finished meanwhile in another thread
                if error is None:
                    f.cancel()
                elif not f.done():
                    f.set_exception(error)


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
        self._urgent = -1
        self._dtype = np.dtype(self.index.dtype)
        self._closed = False
        _shutdown.register(self)  # stopped and joined at interpreter exit if never closed

    # -- scheduling (consumer thread only) ---------------------------------------

    def reset(self, first_units: Sequence[int], urgent_through: int = -1) -> None:
        """Forget every unit; lane ``i`` of the rank next needs unit ``first_units[i]``.

        After a resume, lanes sit in different units. A unit behind some lanes'
        positions is then needed only by the lanes at or before it, so only the row
        groups that can hold those lanes' documents are read: resuming reads what
        the positions need, not whole windows (docs/design.md, "Resuming").
        Units up to ``urgent_through`` (those the next step reaches) are packed
        without the copy, so that the first batch waits for their decode only.
        """
        first = np.asarray(first_units, dtype=np.int64)
        unit = int(first.min())
        self._first = first
        self._first_max = int(first.max())
        self._urgent = urgent_through
        with self._lock:
            for u in self._units.values():
                u.kill()
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

    def _start(self, unit: int, charge: int, *, copy: bool = True) -> None:
        """Read and pack ``unit``; ``copy=False`` when the consumer already waits for it.

        A unit packed without the copy is ready as soon as its row groups are decoded
        (the packer only builds its piece tables); the step then copies from the
        decoded row groups piece by piece, which costs more per step with short
        documents, so units read ahead are packed with the copy.
        """
        epoch, window, rgs, starts = self._reads(unit)
        ep = self.plan.epoch(epoch)
        nl = len(self.rank_lanes)
        # Parts of about equal lanes, as many as row groups: lanes' slices are
        # consecutive stretches of the window stream, so part j is ready about when
        # row group j is, and the first batch waits for the last part's packing only.
        n_parts = max(1, min(len(rgs), nl))
        lane0 = [j * nl // n_parts for j in range(n_parts + 1)]
        parts: list[Future[PackedWindow]] = [Future() for _ in range(n_parts)]
        u = _Unit(unit=unit, parts=parts, lane0=lane0, charge=charge, chunks=[None] * len(rgs), left=n_parts)
        # The row groups each part needs: those whose tokens [s, s + n] meet the part's
        # cut range [c_a, c_b] (closed: empty documents sit at the ends of either).
        cuts = ep.cuts(window, self.lanes, np.asarray(lane0, dtype=np.int64) + self.rank_lanes.start)
        tok = self._tokens[rgs]
        first = np.searchsorted(starts + tok, cuts[:-1], side="left")
        last = np.searchsorted(starts, cuts[1:], side="right")
        needs = [range(int(first[j]), int(last[j])) for j in range(n_parts)]
        u.users = [[] for _ in rgs]
        for j, r in enumerate(needs):
            for c in r:
                u.users[c].append(j)
        u.waiting = [len(r) for r in needs]
        self._units[unit] = u
        with self._lock:
            if self.held_bytes + charge > self.budget:
                self.overruns += 1
            self.held_bytes += charge
            self.peak_bytes = max(self.peak_bytes, self.held_bytes)
            self.peak_units = max(self.peak_units, len(self._units))
        token_start = [int(x) for x in starts]
        doc_base = [int(self._doc_base[g]) for g in rgs]
        window_tokens = int(ep.window_tokens[window])
        window_z = int(ep.window_z[window])
        keep = self._needed(unit)
        settings = self.plan.settings

        def pack(j: int) -> None:
            """Pack part ``j`` (its row groups are decoded), then free what no part needs."""
            if u.dead:
                return
            a, b = lane0[j], lane0[j + 1]
            r = needs[j]
            try:
                pw = pack_window(
                    [u.chunks[c] for c in r],  # type: ignore[misc]
                    token_start[r.start : r.stop],
                    doc_base[r.start : r.stop],
                    window_tokens=window_tokens,
                    window_z=window_z,
                    lanes=settings.lanes,
                    rank_lanes=range(self.rank_lanes.start + a, self.rank_lanes.start + b),
                    keep=None if keep is None else keep[a:b],
                    seed=settings.seed,
                    epoch=epoch,
                    window=window,
                    unit=unit,
                    dtype=self._dtype,
                    first=a,
                    copy=copy,
                )
            except BaseException as e:
                u.kill(e)
                return
            with self._lock:
                for c in r:
                    u.users[c].remove(j)
                    if not u.users[c]:
                        u.chunks[c] = None  # packed (or held by the parts as views, without the copy)
                u.packed += pw.nbytes
                u.left -= 1
                if u.left == 0 and self._units.get(unit) is u:
                    self.held_bytes += u.packed - u.charge
                    u.charge = u.packed
            with contextlib.suppress(InvalidStateError):  # cancelled by reset() or close()
                parts[j].set_result(pw)

        for j in range(n_parts):
            if not u.waiting[j]:
                self._pool.submit(pack, j)

        def read(i: int, g: int) -> None:
            if u.dead:
                return
            try:
                arr = read_chunk(self.index, g)  # checked, as list<int32> or list<uint32>
            except BaseException as e:
                u.kill(e)
                return
            ready = []
            with self._lock:
                u.chunks[i] = arr
                if not copy:
                    u.packed += arr.nbytes  # the decoded tokens stay: they are the parts' streams
                for j in u.users[i]:
                    u.waiting[j] -= 1
                    if u.waiting[j] == 0:
                        ready.append(j)
                self.rows_read += 1
                self.bytes_read += int(self.index.frame["byte_length"][g])
            for j in sorted(ready):
                pack(j)

        for i, g in enumerate(rgs.tolist()):
            self._pool.submit(read, i, g)

    def _prefetch(self) -> None:
        while self._next <= self._wanted + self.ahead:
            est = self._estimate(self._next)
            with self._lock:
                fits = self.held_bytes + est <= self.budget
            if not fits:
                return
            self._start(self._next, est, copy=self._next > self._urgent)
            self._next += 1

    def get(self, unit: int, lane: int = 0) -> PackedWindow:
        """The packed part of ``unit`` that holds rank lane ``lane``, waiting for it if needed.

        Starts later units as the budget allows.
        """
        if self._closed:
            msg = "the loader is closed; create a new Loader (and resume it) to go on"
            raise UsageError(msg)
        self._wanted = max(self._wanted, unit)
        while self._next <= unit:
            self._start(self._next, self._estimate(self._next), copy=False)
            self._next += 1
        self._prefetch()
        u = self._units[unit]
        return u.parts[bisect_right(u.lane0, lane) - 1].result()

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
                u.kill()
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
    est = np.sort(8 * tok + 64 * np.asarray(rows, dtype=np.int64))[::-1]  # decoded + packed, per row group
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
