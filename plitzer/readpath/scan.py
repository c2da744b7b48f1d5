"""The read pool: reads and packs the units the schedule starts, on threads of its own.

A *unit* is one window of the run, numbered over all epochs. The schedule
(:mod:`plitzer.readpath.schedule`) decides which units start, in which layout stage and
within the budget, and hands each one's planned reads (``UnitReads``, computed in the
consumer's thread) to :meth:`ReadPool.start`; the pool issues one ranged read per row
group and decodes it on a thread (pyarrow releases the GIL), and the thread that decodes
the unit's last row group packs it (``plitzer.readpath.pack.pack_unit``: one gather per
token into step-major blocks). Reader threads never see the run. Each unit is a small
state machine::

    READING --(last row group decoded)--> PACKING --(packed)--> READY --(released)--> gone
       \\______________________ FAILED (a read or the pack raised) ___/
       \\______________________ CANCELLED (reset, close, release) ____/

The bytes come and go here, so the pool keeps the budget's count of them
(:mod:`plitzer.readpath.budget`): a unit packed is charged what it really holds, and its
bytes stay charged while any batch view of its tokens is alive
(``plitzer.readpath.packed.Memory``); a unit dropped is uncharged. :class:`Stats` reports
what was held and read; the pool's lock guards the units and the budget.
"""

from __future__ import annotations

import contextlib
import enum
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any, Protocol

import pyarrow as pa
from numpy.typing import NDArray

from planner.arraytypes import I64
from planner.catalog.rowgroups import RowGroupIndex
from planner.errors import UsageError
from planner.stores.stopping import stop, stop_on
from plitzer.readpath import shutdown
from plitzer.readpath.aligned import Columns, read_columns
from plitzer.readpath.budget import Budget, Charge
from plitzer.readpath.pack import ColumnChunks, pack_unit
from plitzer.readpath.packed import PackedUnit, UnitReads
from plitzer.readpath.read import read_chunk
from plitzer.readpath.recut import pack_rest

__all__ = ["AHEAD", "Packing", "ReadPool", "RowMaker", "Stats", "UnitState"]


AHEAD = 2  # units the schedule starts past the furthest one in use (read ahead), by default
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
    balanced_steps: int = 0
    """``balance=True`` (SPEC section 18): the steps dealt so far; the fields below are theirs."""
    imbalance: float | None = None
    """The mean over dealt steps of the slowest rank's cost over the mean rank's (1.0: even); None without balance."""
    imbalance_assigned: float | None = None
    """The same as section 4 assigns the rows (what balance saved)."""
    last_imbalance: float | None = None
    last_imbalance_assigned: float | None = None
    rows_moved: int = 0
    """Rows this rank sent to other ranks (those the deal moved)."""
    exchange_bytes: int = 0
    """Bytes this rank sent to other ranks."""
    exchange_seconds: float = 0.0
    """Time spent dealing and exchanging (on the read-ahead's thread at world > 1, not the consumer's wait)."""
    sources: tuple[str, ...] = ()
    """The source names in source-number order (``loader.sources``), as the totals below are (SPEC section 20)."""
    source_tokens: tuple[int, ...] = ()
    """Real tokens per source of the batches handed out so far (this rank's rows)."""
    source_targets: tuple[int, ...] | None = None
    """With ``labels=True``: targets (labels other than -100) per source of the batches handed out; None without."""
    padding_tokens: int = 0
    """Padding tokens of the batches handed out (best-fit's, a finite run's end)."""


@dataclass(eq=False)
class _Unit:
    """One unit being read and packed (transitions under the pool's lock)."""

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


class RowMaker(Protocol):
    """How a rule that pads makes a unit's rows (best-fit's: :class:`plitzer.bestfit.rows.Rows`).

    ``seq_len``: a row's tokens; ``bins``: each row group's units (its bins), what the budget
    charges ``seq_len`` tokens each; :meth:`pack`: the unit's rows, its units packed by ``pack``
    (the concat packer, :func:`~plitzer.readpath.pack.pack_unit` or
    :func:`~plitzer.readpath.recut.pack_rest`), each then expanded into a padded row.
    """

    @property
    def seq_len(self) -> int: ...

    @property
    def bins(self) -> I64 | None: ...

    def counted(self, index: RowGroupIndex, fills: dict[str, Any] | None) -> RowMaker: ...

    def pack(
        self,
        chunks: list[pa.Array],
        reads: UnitReads,
        columns: ColumnChunks | None,
        pack: Callable[..., PackedUnit],
        **labels: bool,
    ) -> PackedUnit: ...


@dataclass(frozen=True, slots=True)
class Packing:
    """What a unit is packed with besides its tokens, the same for every unit of a loader.

    ``columns``: aligned columns read and packed with the tokens (:mod:`plitzer.readpath.aligned`);
    ``labels``: each token's next in its document (:mod:`plitzer.readpath.labels`); ``rows``: how
    rows are made where the rule bins documents (:class:`RowMaker`), None under concat.
    """

    columns: Columns | None = None
    labels: bool = False
    rows: RowMaker | None = None

    @classmethod
    def of(cls, index: RowGroupIndex, columns: Columns | None, rows: RowMaker | None, labels: bool) -> Packing:
        """The packing of a loader of ``index``: a rule of bins' rows get the bins and the columns' fills."""
        if rows is None:  # concat: the packer's rows are the lanes' tokens
            return cls(columns, labels, None)
        return cls(columns, labels, rows.counted(index, columns.fills if columns else None))

    @property
    def column_bytes(self) -> int:
        """The bytes a token's aligned columns add (labels add none a token: plitzer.readpath.cost.LABEL_BYTES)."""
        return self.columns.itemsize if self.columns is not None else 0


class ReadPool:
    """Reads and packs units on its threads; holds them until the schedule drops them; counts its work.

    ``units``: the units started and not dropped, by number (READING .. READY).
    """

    def __init__(self, index: RowGroupIndex, budget: Budget, packing: Packing, *, threads: int) -> None:
        self.index = index
        self.budget = budget
        self.packing = packing
        self.lock = threading.RLock()  # RLock: a view's finalizer may run inside a locked section
        self.units: dict[int, _Unit] = {}
        self._threads = threads
        self._pool: ThreadPoolExecutor | None = None  # started at the first read
        self._peak_units = 0
        self._rows_read = 0
        self._bytes_read = 0
        self._wait = 0.0
        self._byte_length = index.frame["byte_length"].to_numpy()
        self._closed = False
        self._stop = threading.Event()  # set by close(): reads waiting for a store give up at once
        shutdown.register(self)  # stopped and joined at interpreter exit if never closed

    # -- what was done -------------------------------------------------------------

    @property
    def stats(self) -> Stats:
        with self.lock:
            b = self.budget
            return Stats(
                budget=b.limit,
                held_bytes=b.held,
                peak_bytes=b.peak,
                held_by_caller_bytes=b.caller,
                units_held=len(self.units),
                units_in_flight=sum(u.live for u in self.units.values()),
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
    def rows_read(self) -> int:
        return self._rows_read

    def _storages(self) -> list[Any]:
        return list({id(s): s for s in (self.index.storage(i) for i in range(len(self.index.files)))}.values())

    def _retries(self) -> int:
        return sum(s.retries for s in self._storages())

    def _storage_waited(self) -> float:
        return float(sum(float(getattr(s, "waited", 0.0)) for s in self._storages()))

    # -- units in (consumer thread) ------------------------------------------------

    def start(self, reads: UnitReads, charge: Charge) -> None:
        """READING: submit ``reads.place.unit``'s reads, charged ``charge``; the last read packs it."""
        n = len(reads.place.row_groups)
        with self.lock:
            u = _Unit(unit=reads.place.unit, reads=reads, charge=charge)
            u.chunks = [None] * n
            u.columns = [None] * n
            u.left = n
            self.units[u.unit] = u
            self._peak_units = max(self._peak_units, len(self.units))
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self._threads, thread_name_prefix="plitzer-scan")
        if n == 0:  # nothing to read (a window a selection left empty): packed here, at once
            self._pack(u)
        for i, g in enumerate(reads.place.row_groups.tolist()):
            self._pool.submit(self._read, u, i, g)

    def wait(self, unit: int) -> PackedUnit:
        """The packed ``unit`` (started), waiting for it if needed (the wait counted in ``wait_seconds``)."""
        fut = self.units[unit].future
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

    def drop(self, units: list[int]) -> None:
        """Release ``units`` (those held): stop them, and uncharge what no view holds."""
        with self.lock:
            for x in units:
                got = self.units.pop(x, None)
                if got is not None:
                    got.stop()
                    self.budget.release(got.charge)

    def drop_from(self, unit: int) -> None:
        """Release every unit from ``unit`` on (all of them by default: 0)."""
        with self.lock:
            self.drop([x for x in self.units if x >= unit])

    # -- the threads ---------------------------------------------------------------

    def _read(self, u: _Unit, i: int, g: int) -> None:
        """Worker: decode row group ``g`` (the unit's ``i``-th); the last one packs the unit."""
        if not u.live:
            return
        columns = self.packing.columns
        try:
            with stop_on(self._stop):  # a request retrying a store that is away ends when we close
                arr = read_chunk(self.index, g)  # checked, as list<int32> or list<uint32>
                cols = read_columns(columns, self.index, g, arr) if columns is not None else None
        except BaseException as e:
            with self.lock:
                u.stop(e)
            return
        with self.lock:
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
        p = self.packing
        try:
            chunks = list(u.chunks)
            assert all(c is not None for c in chunks)
            pack = pack_unit if u.reads.place.rest is None else pack_rest
            columns = p.columns.of_unit(u.columns) if p.columns is not None else None
            labels = {"labels": True} if p.labels else {}  # without: the calls of before labels existed
            if p.rows is None:
                packed = pack(chunks, u.reads, columns, **labels)
            else:
                packed = p.rows.pack(chunks, u.reads, columns, pack, **labels)
        except BaseException as e:
            with self.lock:
                u.stop(e)
            return
        with self.lock:
            if not u.live:
                return  # cancelled meanwhile: its charge is gone already
            u.chunks = []  # the decoded row groups: packed, freed
            u.columns = []
            u.state = UnitState.READY
            c = u.charge
            self.budget.settle(c, packed.nbytes)
            if packed.memory is not None:
                # The bytes stay charged until the last view of the tokens is gone.
                c.tracked = True
                weakref.finalize(packed.memory, self._uncharge, c)
        with contextlib.suppress(InvalidStateError):  # cancelled by a drop or close()
            u.future.set_result(packed)

    def _uncharge(self, c: Charge) -> None:
        """The last view of a unit's tokens is gone (any thread)."""
        with self.lock:
            self.budget.free(c)

    # -- the end ---------------------------------------------------------------------

    def check_open(self) -> None:
        """Refuse use after :meth:`close`."""
        if self._closed:
            msg = "the loader is closed; create a new Loader (and resume it) to go on"
            raise UsageError(msg)

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
        self.drop_from(0)
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    @property
    def closed(self) -> bool:
        return self._closed
