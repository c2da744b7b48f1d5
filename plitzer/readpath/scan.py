"""The scanner: reads a rank's planned row groups, window by window, ahead of use.

A *unit* is one window of the run, numbered over all epochs: the sequence every
rank walks through. For each unit the scanner takes the rank's reads from the plan
(the same arrays ``Plan.reads`` shows), issues one ranged read per row group and
decodes it in a thread pool (pyarrow releases the GIL); the thread that decodes the
unit's last row group packs it (``plitzer.readpath.pack.pack_unit``: one gather per token
into step-major blocks). Each unit is a small state machine::

    READING --(last row group decoded)--> PACKING --(packed)--> READY --(released)--> gone
       \\______________________ FAILED (a read or the pack raised) ___/
       \\______________________ CANCELLED (reset, close, release) ____/

Memory: ``budget`` caps the decoded bytes held (the cost model is
:mod:`plitzer.readpath.cost`, the accounting :mod:`plitzer.readpath.budget`). A unit is
charged its estimate (decoded row groups plus the packed copy and tables) when its reads
start, and what it really holds once packed.
It is released when every lane of the rank has moved past it, but its bytes stay
charged while any batch view of its tokens is alive (``plitzer.readpath.packed.Memory``): a
caller who keeps batches slows the prefetch rather than having them overwritten.
Units are started strictly in order, only while the charge fits, so a later unit
never delays an earlier one and the consumer never waits on a read the budget
allowed to start earlier. At most ``ahead`` units past the furthest one in use are
started early.

The units a step needs are always started, and they always fit: lanes run in
lockstep, so at step ``t`` every lane is inside the run's tokens
``[t*L*B, (t+1)*L*B + B)``, and the units held are the windows overlapping that
range, a number bounded from the footers alone (:func:`plitzer.readpath.cost.budget_floor`),
which the Loader checks against ``budget`` at construction. :class:`Stats` reports
what was held; ``overruns`` counts units started past the budget by the loader's
own units (the tests assert it never happens), ``caller_overruns`` those started
past it only because the caller still holds batch views of released units.
"""

from __future__ import annotations

import contextlib
import enum
import threading
import time
import weakref
from concurrent.futures import CancelledError, Future, InvalidStateError, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from planner.catalog.rowgroups import RowGroupIndex
from planner.errors import StoppedError, UsageError
from planner.order.epoch import row_group_counts
from planner.run import Run, Segment, Start, lane_base
from planner.stores.stopping import stop, stop_on
from plitzer.readpath import shutdown
from plitzer.readpath.aligned import Columns, read_columns
from plitzer.readpath.bins import Rows, pack_bins
from plitzer.readpath.budget import Budget, Charge
from plitzer.readpath.cost import unit_estimate
from plitzer.readpath.labels import LABEL_BYTES
from plitzer.readpath.pack import pack_unit
from plitzer.readpath.packed import PackedUnit, UnitReads
from plitzer.readpath.read import read_chunk
from plitzer.readpath.recut import pack_rest

__all__ = ["AHEAD", "Scanner", "Segment", "Stats", "UnitState", "lane_base"]


AHEAD = 2  # units started past the furthest one in use (read ahead)
_WAKE_S = 0.1  # a waiting consumer looks at its signals this often (Ctrl-C during an outage)


class UnitState(enum.Enum):
    READING = "reading"
    PACKING = "packing"
    READY = "ready"
    FAILED = "failed"
    CANCELLED = "cancelled"


@dataclass(frozen=True, slots=True)
class Stats:
    """What a loader holds and has done (``Loader.stats``).

    ``held_bytes`` and ``peak_bytes``: decoded and packed bytes charged against the
    budget now, and at most so far (``held_by_caller_bytes`` of them only because
    batch views of released units are still alive). ``units_held`` (not released),
    ``units_in_flight`` (reading or packing), ``peak_units``; ``rows_read`` and
    ``bytes_read`` (one ranged read per row group); ``wait_seconds``: time the consumer
    waited for reads, decodes and packing; ``retries``: storage requests retried;
    ``storage_wait_seconds``: wall-clock time some storage request was failing and
    retried (a store that did not answer for a minute shows here, and in
    ``wait_seconds`` as far as the consumer had to wait for it).
    """

    budget: int
    held_bytes: int
    peak_bytes: int
    held_by_caller_bytes: int
    units_held: int
    units_in_flight: int
    peak_units: int
    rows_read: int
    bytes_read: int
    overruns: int
    caller_overruns: int
    wait_seconds: float
    retries: int
    storage_wait_seconds: float = 0.0


@dataclass(eq=False)
class _Unit:
    """One unit being read and packed (transitions under the scanner's lock)."""

    unit: int
    reads: UnitReads
    charge: Charge
    future: Future[PackedUnit] = field(default_factory=Future)
    state: UnitState = UnitState.READING
    chunks: list[pa.Array | None] = field(default_factory=list)
    columns: list[dict[str, NDArray[Any]] | None] = field(default_factory=list)  # aligned columns, per chunk
    left: int = 0  # row groups not decoded yet

    @property
    def live(self) -> bool:
        return self.state in (UnitState.READING, UnitState.PACKING)

    def stop(self, error: BaseException | None = None) -> None:
        """READING or PACKING -> FAILED (with ``error``) or CANCELLED."""
        if not self.live:
            return
        self.state = UnitState.CANCELLED if error is None else UnitState.FAILED
        self.chunks = []
        self.columns = []
        with contextlib.suppress(InvalidStateError):  # finished meanwhile in another thread
            if error is None:
                self.future.cancel()
            elif not self.future.done():
                self.future.set_exception(error)


class Scanner:
    """Reads and packs units for one rank, in order, within a byte budget."""

    def __init__(
        self,
        run: Run,
        *,
        budget: int,
        threads: int,
        ahead: int = AHEAD,
        columns: Columns | None = None,
        rows: Rows | None = None,
        labels: bool = False,
    ) -> None:
        self.index: RowGroupIndex = run.plan.dataset
        self.columns = columns  # aligned columns read and packed with the tokens (plitzer.readpath.aligned)
        self.labels = labels  # each token's next in its document, packed with the tokens (plitzer.readpath.labels)
        # How rows are made where the rule pads them (best-fit: plitzer.readpath.bins); None: concat.
        self.rows = rows if rows is not None and rows.rule.pads else None
        self.rank = run.rank
        self.run = run
        self._stage(0)
        self._budget = Budget(budget)
        self.ahead = ahead
        self._threads = threads
        self._pool: ThreadPoolExecutor | None = None  # started at the first read
        self._lock = threading.RLock()  # RLock: a view's finalizer may run inside a locked section
        self._units: dict[int, _Unit] = {}
        self._reads: dict[int, UnitReads] = {}
        self._next = 0
        self._released = 0
        self._wanted = 0
        self._at = Start(0, np.zeros(len(self.rank_lanes), dtype=np.int64))
        self._peak_units = 0
        self._rows_read = 0
        self._bytes_read = 0
        self._wait = 0.0
        f = self.index.frame
        self._tokens, self._rows, _ = row_group_counts(self.index)  # what each gives the stream (selected)
        self._held_per_unit = 1  # the budget's tokens a unit: a token under concat, n_g * L under best-fit
        if self.rows is not None:
            self._tokens, self._held_per_unit = self.rows.rule.counts(f)[0], self.rows.seq_len
            self.rows = replace(self.rows, bins=self._tokens, fills=columns.fills if columns else None)
        self._byte_length = f["byte_length"].to_numpy()
        self._doc_base = np.cumsum(self._rows) - self._rows
        self._dtype = np.dtype(self.index.dtype)
        self._closed = False
        self._stop = threading.Event()  # set by close(): reads waiting for a store give up at once
        shutdown.register(self)  # stopped and joined at interpreter exit if never closed

    # -- what the consumer sees --------------------------------------------------

    @property
    def stats(self) -> Stats:
        with self._lock:
            b = self._budget
            return Stats(
                budget=b.limit,
                held_bytes=b.held,
                peak_bytes=b.peak,
                held_by_caller_bytes=b.caller,
                units_held=len(self._units),
                units_in_flight=sum(u.live for u in self._units.values()),
                peak_units=self._peak_units,
                rows_read=self._rows_read,
                bytes_read=self._bytes_read,
                overruns=b.overruns,
                caller_overruns=b.caller_overruns,
                wait_seconds=self._wait,
                retries=self._retries(),
                storage_wait_seconds=self._storage_waited(),
            )

    @property
    def held_bytes(self) -> int:
        return self._budget.held

    @property
    def peak_bytes(self) -> int:
        return self._budget.peak

    @property
    def rows_read(self) -> int:
        return self._rows_read

    def _retries(self) -> int:
        storages = {id(s): s for s in (self.index.storage(i) for i in range(len(self.index.files)))}
        return sum(s.retries for s in storages.values())

    def _storage_waited(self) -> float:
        storages = {id(s): s for s in (self.index.storage(i) for i in range(len(self.index.files)))}
        return float(sum(float(getattr(s, "waited", 0.0)) for s in storages.values()))

    # -- scheduling (consumer thread only) ---------------------------------------

    def _stage(self, stage: int) -> None:
        """Pack layout stage ``stage`` of the run (its plan, lanes and rows) from now on."""
        self.stage = stage

    # What the scanner packs is (run, stage); the rest is derived from them, never mirrored.

    @property
    def segment(self) -> Segment:
        """The layout stage being packed: its lanes, its rows' length, where it began."""
        return self.run.segment(self.stage)[1]

    @property
    def rank_lanes(self) -> range:
        """This rank's lanes in the layout stage being packed."""
        return self.run.rank_lanes(self.segment.lanes)

    @property
    def seq_len(self) -> int:
        """Tokens a row (the run's layout counts units: one a row under best-fit)."""
        return self.segment.seq_len if self.rows is None else self.rows.seq_len

    def reset(self, step: int) -> None:
        """Forget every unit; the next step is ``step`` (packed in the layout stage in force there).

        Lane ``k``'s next token is in the window :meth:`planner.run.Run.start` says; a
        unit behind some lanes' positions is then needed only by the lanes at or before
        it, so only the row groups that can hold those lanes' documents are read, and
        only the steps from ``step`` on are packed: resuming reads what the positions
        need, not whole windows (docs/design.md, "Resuming").
        """
        self._stage(self.run.stage_of(step))
        at = self.run.start(step, self.stage)
        with self._lock:
            for u in self._units.values():
                self._drop(u)
            self._units.clear()
            self._reads.clear()
        self._at = at
        unit = int(at.first.min())
        self._next = self._released = self._wanted = unit

    def set_run(self, run: Run, unit: int) -> None:
        """Run ``run`` from now on, which differs from the last from ``unit`` on (a live stage).

        Units before ``unit`` are untouched (lanes may be inside them); a unit read
        ahead past the change holds row groups of the old plan and is dropped, and read
        and packed again, so prefetch never commits the stream (docs/design.md, "Live
        stages"). The layout stage packed stays until the next :meth:`reset`.
        """
        self.run = run
        self._stage(self.stage)
        with self._lock:
            for x in [x for x in self._units if x >= unit]:
                self._drop(self._units.pop(x))
            for x in [x for x in self._reads if x >= unit]:
                del self._reads[x]
        if unit <= self._at.last:  # the resumed lanes' windows may have moved
            self._at = run.start(self._at.step, self.stage)
        # A change can begin at a unit already released: windows with no token left for any
        # lane (empty ones at the lanes' place, when an epoch holds fewer tokens than a step)
        # that the new plan fills. Nothing of them was delivered: they are read again.
        self._released = min(self._released, unit)
        self._next = min(self._next, max(unit, self._released))

    def _plan_reads(self, unit: int) -> UnitReads:
        """The run's answers for ``unit`` and what its reads hold (in the consumer thread).

        What the pack needs from the plan is taken here: the plan of a mixture changes
        under set_weights, so reader threads never read it.
        """
        got = self._reads.get(unit)
        if got is not None:
            return got
        place = self.run.place(unit, self.stage, self._at)
        rgs = place.row_groups
        est = unit_estimate(
            int(self._tokens[rgs].sum()) * self._held_per_unit,
            int(self._rows[rgs].sum()),
            lanes=len(self.rank_lanes),
            seq_len=self.seq_len,
            column_bytes=(self.columns.itemsize if self.columns is not None else 0) + LABEL_BYTES * self.labels,
        )
        got = UnitReads(place, self._doc_base[rgs], int(est), self._dtype)
        self._reads[unit] = got
        return got

    def lane_base(self, unit: int) -> NDArray[np.int64]:
        """Stream positions of the rank's lanes before ``unit`` (:meth:`planner.run.Run.lane_base`)."""
        return self.run.lane_base(unit, self.stage)

    def _start(self, unit: int) -> None:
        """READING: charge ``unit`` and submit its reads; the last read packs it."""
        reads = self._plan_reads(unit)
        n = len(reads.place.row_groups)
        with self._lock:
            u = _Unit(unit=unit, reads=reads, charge=self._budget.charge(reads.estimate))
            u.chunks = [None] * n
            u.columns = [None] * n
            u.left = n
            self._units[unit] = u
            self._peak_units = max(self._peak_units, len(self._units))
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self._threads, thread_name_prefix="plitzer-scan")
        if n == 0:  # nothing to read (a window a selection left empty): packed here, at once
            self._pack(u)
        for i, g in enumerate(reads.place.row_groups.tolist()):
            self._pool.submit(self._read, u, i, g)

    def _read(self, u: _Unit, i: int, g: int) -> None:
        """Worker: decode row group ``g`` (the unit's ``i``-th); the last one packs the unit."""
        if not u.live:
            return
        try:
            with stop_on(self._stop):  # a request retrying a store that is away ends when we close
                arr = read_chunk(self.index, g)  # checked, as list<int32> or list<uint32>
                cols = read_columns(self.columns, self.index, g, arr) if self.columns is not None else None
        except BaseException as e:
            with self._lock:
                u.stop(e)
            return
        with self._lock:
            self._rows_read += 1  # read, whether or not the unit is still wanted
            self._bytes_read += int(self._byte_length[g])
            if not u.live:
                return
            u.chunks[i] = arr
            u.columns[i] = cols
            u.left -= 1
            last = u.left == 0
            if last:
                u.state = UnitState.PACKING
        if last:
            self._pack(u)

    def _pack(self, u: _Unit) -> None:
        """Worker: PACKING -> READY (or FAILED)."""
        try:
            chunks = list(u.chunks)
            assert all(c is not None for c in chunks)
            pack = pack_unit if u.reads.place.rest is None else pack_rest
            columns = self.columns.of_unit(u.columns) if self.columns is not None else None
            labels = {"labels": True} if self.labels else {}  # without: the calls of before labels existed
            if self.rows is None:
                packed = pack(chunks, u.reads, columns, **labels)
            else:
                packed = pack_bins(chunks, u.reads, columns, self.rows, pack, **labels)
        except BaseException as e:
            with self._lock:
                u.stop(e)
            return
        with self._lock:
            if not u.live:
                return  # cancelled meanwhile: its charge is gone already
            u.chunks = []  # the decoded row groups: packed, freed
            u.columns = []
            u.state = UnitState.READY
            c = u.charge
            self._budget.settle(c, packed.nbytes)
            if packed.memory is not None:
                # The bytes stay charged until the last view of the tokens is gone.
                c.tracked = True
                weakref.finalize(packed.memory, self._uncharge, c)
        with contextlib.suppress(InvalidStateError):  # cancelled by reset() or close()
            u.future.set_result(packed)

    def _uncharge(self, c: Charge) -> None:
        """The last view of a unit's tokens is gone (any thread)."""
        with self._lock:
            self._budget.free(c)

    def _drop(self, u: _Unit) -> None:
        """Release ``u`` (under the lock): stop it, and uncharge what no view holds."""
        u.stop()
        self._budget.release(u.charge)

    def _prefetch(self) -> None:
        while self._next <= min(self._wanted + self.ahead, self.run.last_unit):  # a finite run: nothing past it
            est = self._plan_reads(self._next).estimate
            with self._lock:
                fits = self._budget.fits(est)
            if not fits:
                return
            self._start(self._next)
            self._next += 1

    def get(self, unit: int) -> PackedUnit:
        """The packed ``unit``, waiting for it if needed; starts later units as the budget allows.

        A close from another thread while this waits (the store away, the reads retrying)
        ends the wait at once with a :class:`~planner.errors.StoppedError`.
        """
        if self._closed:
            msg = "the loader is closed; create a new Loader (and resume it) to go on"
            raise UsageError(msg)
        try:
            return self._get(unit)
        except (CancelledError, StoppedError, KeyError, RuntimeError) as e:
            if not self._closed:
                raise
            msg = (
                f"the loader was closed (by close() in another thread, or as the interpreter ends) while this "
                f"step waited for window {unit} of the run; create a new Loader (and resume it) to go on"
            )
            raise StoppedError(msg) from e

    def _get(self, unit: int) -> PackedUnit:
        self._wanted = max(self._wanted, unit)
        while self._next <= unit:
            self._start(self._next)
            self._next += 1
        self._prefetch()
        fut = self._units[unit].future
        if fut.done():
            return fut.result()
        t = time.perf_counter()
        try:
            while True:
                # In slices: a blocking wait is woken by a signal only if the kernel hands it to
                # this thread, and a Ctrl-C landing on a reader thread would wait for the store.
                with contextlib.suppress(FutureTimeout):
                    return fut.result(timeout=_WAKE_S)
        finally:
            self._wait += time.perf_counter() - t

    def release_before(self, unit: int) -> None:
        """Every lane has moved past the units before ``unit``: release them."""
        if unit <= self._released:
            return
        with self._lock:
            for x in range(self._released, unit):
                got = self._units.pop(x, None)
                self._reads.pop(x, None)
                if got is not None:
                    self._drop(got)
        self._released = unit
        self._prefetch()

    def close(self) -> None:
        """Stop every unit and the reader threads (waits for the running decodes).

        Reads waiting between attempts for a store that does not answer stop at once
        (:func:`planner.stores.stopping.stop_on`), and so do attempts in flight
        (:func:`planner.stores.stopping.stop`), so this returns at once, never after an
        attempt's read timeout or the storage's ``retry_deadline``.
        """
        if self._closed:
            return
        self._closed = True
        stop(self._stop)  # its pauses end, and its reads in flight (a store that never answers too)
        with self._lock:
            for u in self._units.values():
                self._drop(u)
            self._units.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    @property
    def closed(self) -> bool:
        return self._closed
