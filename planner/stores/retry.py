"""Retries and throttling shared by the object stores (S3, GCS, Azure; docs/storage.md).

Every request to an object store runs through a :class:`Retrier`: one attempt at a
time per request, inside a slot of its :class:`Throttle`, retried with jittered
exponential backoff (capped at 10 s) where the failure is transient, counted
(:attr:`Retrier.retries`), and reported as a :class:`StorageError` naming the
object, the range and the last cause when it is not.

Retries are bounded by time, not by a count: a store that stops answering (an
incident of minutes, a restarted endpoint) is waited for, by default for 10 minutes
of failing (``storage_options`` ``retry_deadline``; 0 fails at once; ``attempts``
bounds the count as well where given). A request failing for more than
:data:`PATIENCE` seconds warns once that it waits (and for what), and once more
when the store answers again (:class:`~planner.errors.StorageWaitWarning`); past the
deadline the StorageError names the object, the time waited and the option.
:attr:`Retrier.waited` is the wall-clock time some request was failing (``Loader.stats``).

A wait is never longer than its owner's life (docs/reliability.md, "Stopping during an
outage"): the pause between attempts is a wait on an event, not a sleep. A thread that
reads for a scanner runs its requests inside :func:`stop_on` (the scanner's event, set by
``close()``), and :func:`stop_every_request` (run as the interpreter ends) sets every
such event and a global one; a request whose event is set makes no further attempt and
raises :class:`~planner.errors.StoppedError` at once. An attempt in flight stops too,
whatever the store does (a store that accepts and never answers included): an attempt
on an event loop (S3, GCS, Azure) runs through :func:`on_loop`, which cancels its task,
and a blocking socket read (HTTP) runs inside :func:`interruptible`, whose socket
:func:`stop` shuts down. The deadline of a run that goes on is untouched.

The throttle is AIMD, as TCP's congestion window: requests in flight are capped
by a limit that starts at the storage's concurrency; a throttling answer (S3's 503
SlowDown or a 429, GCS's and Azure's 429 or 503) halves it, once per round of
requests (a throttle seen by requests that started before the last cut does not
cut again), and each round of ``limit`` successes adds one slot, back up to the
start (integer arithmetic: exactly one slot per round). A server that asks us to slow down
gets fewer requests at once instead of the same number retried.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import math
import random
import socket
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from planner.errors import ConfigError, FileChangedError, StoppedError, StorageError, StorageWaitWarning

__all__ = [
    "DEFAULT_DEADLINE",
    "PATIENCE",
    "Fatal",
    "Retrier",
    "Throttle",
    "Throttled",
    "Transient",
    "check_body",
    "interruptible",
    "on_loop",
    "stop",
    "stop_every_request",
    "stop_on",
    "with_deadline",
]

T = TypeVar("T")

_RETRY_CAP = 10.0
DEFAULT_DEADLINE = 600.0
"""Seconds a request keeps retrying a store that does not answer (``storage_options`` ``retry_deadline``)."""
PATIENCE = 10.0
"""Seconds of failing after which a request is waiting for the store (warned once, and when it is back)."""


_STOPPED = "its loader was closed, or the interpreter is ending"


class _Stops:
    """The events that end waiting requests: one per :func:`stop_on` block, and the process's."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.active: set[threading.Event] = set()
        self.everything = threading.Event()  # set as the interpreter ends
        self.local = threading.local()
        self.sockets: dict[socket.socket, threading.Event] = {}  # in a blocking read: its thread's event


_STOPS = _Stops()


@contextlib.contextmanager
def stop_on(event: threading.Event) -> Iterator[None]:
    """Inside the block, this thread's requests stop waiting (StoppedError) once ``event`` is set.

    >>> ev = threading.Event()
    >>> r = Retrier(attempts=None, backoff=10.0, concurrency=1, transient=lambda e: True,
    ...             throttled=lambda e: False, hint="", patience=60.0)
    >>> def away():
    ...     ev.set()  # closed while the attempt is in flight: no pause, no further attempt
    ...     raise Transient("connection refused")
    >>> with stop_on(ev):  # doctest: +ELLIPSIS
    ...     r.run("reading x", away)
    Traceback (most recent call last):
    planner.errors.StoppedError: reading x: stopped during a request to the store (connection refused): its loader ...
    """
    s = _STOPS
    outer = getattr(s.local, "event", None)
    with s.lock:
        s.active.add(event)
        if s.everything.is_set():
            event.set()
    s.local.event = event
    try:
        yield
    finally:
        s.local.event = outer
        with s.lock:
            s.active.discard(event)


def stop(event: threading.Event) -> None:
    """Set ``event``: the requests of the threads inside ``stop_on(event)`` stop, in flight too.

    Their pauses end, and the sockets they block on (:func:`interruptible`) are shut down,
    so a read from a store that never answers ends now rather than at its read timeout.
    """
    s = _STOPS
    with s.lock:
        event.set()
        socks = [k for k, ev in s.sockets.items() if ev is event]
    for sock in socks:
        _shut(sock)


def stop_every_request() -> None:
    """End every wait between attempts and every blocking read, now and from now on: the interpreter is ending."""
    s = _STOPS
    with s.lock:
        s.everything.set()
        for ev in s.active:
            ev.set()
        socks = list(s.sockets)
    for sock in socks:
        _shut(sock)


def _shut(sock: socket.socket) -> None:
    # shutdown, not close: it wakes a recv (or poll) blocked in another thread, which close does not on Linux.
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


@contextlib.contextmanager
def interruptible(sock: socket.socket | None) -> Iterator[None]:
    """Inside the block, stopping this thread's requests shuts ``sock`` down (its blocking read fails at once)."""
    if sock is None:
        yield
        return
    s = _STOPS
    ev = _stop_event()
    with s.lock:
        s.sockets[sock] = ev
        stopped = ev.is_set()
    if stopped:
        _shut(sock)
    try:
        yield
    finally:
        with s.lock:
            s.sockets.pop(sock, None)


def on_loop(loop: asyncio.AbstractEventLoop, make: Callable[..., Any], *args: Any) -> Any:
    """``await make(*args)`` on ``loop`` (another thread's), from this thread; stoppable in flight.

    fsspec's ``sync`` waits for the coroutine whatever happens; this waits in slices of
    0.1 s, and once this thread's requests are stopped it cancels the task (aiohttp then
    closes its connection) and raises :class:`~planner.errors.StoppedError`.
    """
    fut = asyncio.run_coroutine_threadsafe(make(*args), loop)
    stop_ev = _stop_event()
    try:
        while True:
            try:
                return fut.result(timeout=0.1)
            except concurrent.futures.TimeoutError:
                if stop_ev.is_set():
                    msg = f"stopped during a request to the store: {_STOPPED}"
                    raise StoppedError(msg) from None
    finally:
        fut.cancel()  # a no-op once done; else (stopped, Ctrl-C) the task ends on the loop


def _stop_event() -> threading.Event:
    got = getattr(_STOPS.local, "event", None)
    return got if got is not None else _STOPS.everything


def _pause(seconds: float) -> None:
    """Wait ``seconds`` between attempts, or less when this thread's requests are stopped.

    The main thread waits in slices: a signal (Ctrl-C) that the kernel hands to another
    thread does not wake a wait, so a listing waiting for the store in the main thread
    would otherwise take its KeyboardInterrupt only at the end of the pause.
    """
    stop = _stop_event()
    if threading.current_thread() is not threading.main_thread():
        stop.wait(seconds)
        return
    end = time.monotonic() + seconds
    while not stop.is_set() and (left := end - time.monotonic()) > 0:
        stop.wait(min(left, 0.1))


class Fatal(Exception):
    """A failure that retrying cannot fix; carries the message for StorageError."""


class Changed(Fatal):
    """The object changed (or vanished) after it was indexed: a FileChangedError naming it."""

    def __init__(self, msg: str, *, location: str | None = None) -> None:
        super().__init__(msg)
        self.location = location


class Transient(Exception):
    """A failure worth another attempt (the message names the cause)."""


class Throttled(Transient):
    """The server asked us to slow down (503 SlowDown, 429): retried, and the throttle cuts."""


class Throttle:
    """An AIMD cap on requests in flight (module docstring).

    >>> t = Throttle(8)
    >>> with t.slot() as s:
    ...     t.cut(s)
    >>> t.limit, t.cuts
    (4, 1)
    >>> for _ in range(4 + 5):  # one slot per round of `limit` successes
    ...     with t.slot():
    ...         t.grow()
    >>> t.limit
    6
    """

    def __init__(self, limit: int) -> None:
        self.top = max(1, int(limit))
        self._limit = self.top
        self._credit = 0  # successes since the limit last grew
        self._inflight = 0
        self._round = 0
        self._cuts = 0
        self._lowest = self.top
        self._cond = threading.Condition()

    @property
    def limit(self) -> int:
        """Requests allowed in flight now."""
        with self._cond:
            return self._limit

    @property
    def lowest(self) -> int:
        """The lowest limit so far."""
        with self._cond:
            return self._lowest

    @property
    def cuts(self) -> int:
        """How many times the limit was halved."""
        with self._cond:
            return self._cuts

    @contextlib.contextmanager
    def slot(self) -> Iterator[int]:
        """Wait for a free slot; yields the round the request started in."""
        with self._cond:
            while self._inflight >= self._limit:
                self._cond.wait()
            self._inflight += 1
            started = self._round
        try:
            yield started
        finally:
            with self._cond:
                self._inflight -= 1
                self._cond.notify()

    def cut(self, started: int) -> None:
        """A throttling answer to a request that started in round ``started``."""
        with self._cond:
            if started != self._round:
                return  # this round was cut already
            self._round += 1
            self._cuts += 1
            self._limit = max(1, self._limit // 2)
            self._credit = 0
            self._lowest = min(self._lowest, self._limit)

    def grow(self) -> None:
        """A success: additive increase (one slot per round of ``limit`` successes), up to the start."""
        with self._cond:
            if self._limit < self.top:
                self._credit += 1
                if self._credit >= self._limit:
                    self._limit += 1
                    self._credit = 0
                    self._cond.notify_all()


class Retrier:
    """Attempts, backoff, the deadline and the throttle of one storage; thread-safe.

    ``transient(e)`` says whether another attempt may succeed, ``throttled(e)``
    whether the server asked to slow down; ``hint`` ends the message of a
    request that failed for good (which options or variables to check).

    A request is retried while it keeps failing for less than ``deadline`` seconds
    (``storage_options`` ``retry_deadline``, 10 minutes by default; 0 fails at once),
    and, where ``attempts`` is given, for at most that many attempts. A request that
    has failed for ``patience`` seconds (with its next wait) is waiting for the store:
    one :class:`~planner.errors.StorageWaitWarning` says so, naming what it waits for,
    and one more says when the store answers again. ``clock`` and ``sleep`` are the
    time the loop reads and waits (a test passes a fake one); the default wait ends
    early when the thread's requests are stopped (:func:`stop_on`), and a stopped request
    raises :class:`~planner.errors.StoppedError` before its next attempt.
    """

    def __init__(
        self,
        *,
        attempts: int | None,
        backoff: float,
        concurrency: int,
        transient: Callable[[BaseException], bool],
        throttled: Callable[[BaseException], bool],
        hint: str,
        deadline: float = DEFAULT_DEADLINE,
        patience: float = PATIENCE,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = _pause,
    ) -> None:
        self.attempts = attempts
        self.backoff = backoff
        self.deadline = deadline
        self.patience = patience
        self.throttle = Throttle(concurrency)
        self._transient = transient
        self._throttled = throttled
        self._hint = hint
        self._clock = clock
        self._sleep = sleep
        self._retries = 0
        self._lock = threading.Lock()
        self._failing = 0  # requests failing now (between their first failure and their end)
        self._failing_since = 0.0
        self._waited = 0.0  # seconds during which some request was failing, before now
        self._outage_since: float | None = None  # a waiting request's first failure, while warned
        self._recovered_at = -math.inf

    @property
    def retries(self) -> int:
        """Attempts beyond the first, over every request so far."""
        with self._lock:
            return self._retries

    @property
    def waited(self) -> float:
        """Seconds (wall clock) during which at least one request was failing and being retried."""
        with self._lock:
            open_now = self._clock() - self._failing_since if self._failing else 0.0
            return self._waited + open_now

    def _wait(self, attempt_number: int) -> float:
        # Attempt k (from 1) waits backoff * 2**(k-1), jittered by 0.5..1.5, capped.
        return float(min(_RETRY_CAP, self.backoff * 2.0 ** (attempt_number - 1)) * (0.5 + random.random()))

    def _begin_failing(self, now: float) -> None:
        with self._lock:
            if not self._failing:
                self._failing_since = now
            self._failing += 1

    def _end_failing(self, now: float, what: str, *, recovered: bool) -> None:
        with self._lock:
            self._failing -= 1
            if not self._failing:
                self._waited += now - self._failing_since
            since = self._outage_since
            back = recovered and since is not None
            if back:
                self._outage_since = None
                self._recovered_at = now
            elif not self._failing:
                self._outage_since = None  # every request of the outage gave up: the next one warns anew
        if back and since is not None:
            msg = f"{what}: the store answers again, after {now - since:.0f} s; reading goes on"
            warnings.warn(msg, StorageWaitWarning, stacklevel=4)

    def _note_waiting(self, what: str, first: float, cause: str) -> None:
        with self._lock:
            if self._outage_since is not None or first < self._recovered_at:
                return  # warned already (this outage, or one this request was part of)
            self._outage_since = first
        msg = (
            f"{what}: the store does not answer ({cause}); waiting for it, up to storage_options "
            f"retry_deadline={self.deadline:g} s, retrying at least every {_RETRY_CAP * 1.5:g} s"
        )
        warnings.warn(msg, StorageWaitWarning, stacklevel=4)

    def run(self, what: str, attempt: Callable[[], T], *, location: str | None = None) -> T:
        """``attempt()`` until it succeeds, fails for good, or the deadline (or the attempts) are spent.

        ``location`` is the object read (what a ``FileChangedError`` names).
        """
        failing: list[float] = []  # the first failure's time, once there is one
        ok = False
        try:
            out = self._attempts(what, attempt, location, failing)
            ok = True
            return out
        finally:
            # However the request ends (an answer, an error, an interrupt): it fails no more.
            if failing:
                self._end_failing(self._clock(), what, recovered=ok)

    def _attempts(self, what: str, attempt: Callable[[], T], location: str | None, failing: list[float]) -> T:
        tries = 0
        stop = _stop_event()
        cause = ""
        while True:
            if stop.is_set():
                why = f" ({cause})" if cause else ""
                msg = f"{what}: stopped while waiting for the store{why}: {_STOPPED}"
                raise StoppedError(msg)
            tries += 1
            try:
                with self.throttle.slot() as started:
                    try:
                        out = attempt()
                    except Exception as e:
                        if self._throttled(e):
                            self.throttle.cut(started)
                        raise
                self.throttle.grow()
                return out
            except StoppedError as e:
                msg = f"{what}: {e}"
                raise StoppedError(msg) from None
            except Changed as e:
                msg = f"{what}: {e}"
                raise FileChangedError(msg, file=e.location or location) from e.__cause__
            except Fatal as e:
                msg = f"{what}: {e}"
                raise StorageError(msg) from e.__cause__
            except Exception as e:
                if stop.is_set():  # the attempt failed because it was stopped (its socket shut down)
                    msg = f"{what}: stopped during a request to the store ({_cause(e)}): {_STOPPED}"
                    raise StoppedError(msg) from None
                if not self._transient(e):
                    msg = f"{what}: {type(e).__name__}: {e}; {self._hint}"
                    raise StorageError(msg) from e
                now = self._clock()
                if not failing:
                    failing.append(now)
                    self._begin_failing(now)
                first = failing[0]
                delay = self._next_delay(e, what, tries, now - first)
                if now - first + delay >= self.patience:
                    self._note_waiting(what, first, _cause(e))
                with self._lock:
                    self._retries += 1
                cause = _cause(e)
                self._sleep(delay)

    def _next_delay(self, e: Exception, what: str, tries: int, waited: float) -> float:
        """The wait before the next attempt, or the StorageError that ends the request."""
        cause = _cause(e)
        if self.attempts is not None and tries >= self.attempts:
            msg = (
                f"{what} failed after {self.attempts} attempts; last cause: {cause}. Check the "
                "endpoint and the network; if the server throttles or is slow, raise "
                "storage_options attempts, backoff or read_timeout"
            )
            raise StorageError(msg) from e
        left = self.deadline - waited
        if left <= 0:
            if self.deadline <= 0:
                msg = (
                    f"{what} failed; cause: {cause}. storage_options retry_deadline=0 fails at once: "
                    "give it the seconds to wait for the store (e.g. {'retry_deadline': 600})"
                )
            else:
                msg = (
                    f"{what}: the store did not answer for {waited:.0f} s ({tries} attempts; last cause: {cause}); "
                    f"storage_options retry_deadline={self.deadline:g} s is the most a request waits for the store: "
                    "raise it to wait longer (e.g. {'retry_deadline': 3600}), or check the endpoint and the network"
                )
            raise StorageError(msg) from e
        return min(self._wait(tries), left)


def _cause(e: BaseException) -> str:
    return str(e) if isinstance(e, Transient) else f"{type(e).__name__}: {e}"


class Retrying:
    """What every object store's storage shares: its retry loop, and the counters it shows.

    A backend sets ``_retrier`` in its constructor (:meth:`make_retrier`); ``retries`` is
    then the ``Storage`` protocol's counter, and ``throttle`` the AIMD cap.
    """

    _retrier: Retrier
    attempts: int | None
    retry_deadline: float
    backoff: float
    read_timeout: float
    connect_timeout: float
    concurrency: int
    list_page_size: int

    #: plitzer's own keys of ``storage_options`` (the rest go to the store's client).
    TUNING = (
        "attempts",
        "backoff",
        "concurrency",
        "list_page_size",
        "read_timeout",
        "connect_timeout",
        "retry_deadline",
    )

    def checkpoint_revision(self) -> tuple[str, str] | None:
        """None: an object store's URL names no revision (the Hub's storage overrides it)."""
        return None

    def take_tuning(self, opts: dict[str, Any], *, attempts: int | None = None, backoff: float = 0.1) -> None:
        """Pop plitzer's tuning keys from ``opts`` into attributes, each checked.

        ``retry_deadline`` (seconds, default :data:`DEFAULT_DEADLINE`; 0 fails at once)
        bounds how long a request waits for a store that does not answer; ``attempts``
        (default: no bound but the deadline) bounds the attempts as well.
        """
        raw_attempts = opts.pop("attempts", attempts)
        self.attempts = None if raw_attempts is None else int(raw_attempts)
        self.retry_deadline = float(opts.pop("retry_deadline", DEFAULT_DEADLINE))
        if not math.isfinite(self.retry_deadline) or self.retry_deadline < 0:
            msg = (
                f"storage_options retry_deadline={self.retry_deadline} must be a number of seconds >= 0 "
                "(0 fails at once; the default waits 600 s for a store to come back)"
            )
            raise ConfigError(msg)
        self.backoff = float(opts.pop("backoff", backoff))
        self.read_timeout = float(opts.pop("read_timeout", 30))
        self.connect_timeout = float(opts.pop("connect_timeout", 10))
        self.concurrency = int(opts.pop("concurrency", 16))
        self.list_page_size = int(opts.pop("list_page_size", 1000))
        for name, value, low in (
            ("attempts", 1 if self.attempts is None else self.attempts, 1),
            ("concurrency", self.concurrency, 1),
            ("list_page_size", self.list_page_size, 1),
            ("read_timeout", self.read_timeout, 1e-3),
            ("connect_timeout", self.connect_timeout, 1e-3),
            ("backoff", self.backoff, 0),
        ):
            if value < low:
                msg = f"storage_options {name}={value} must be >= {low}"
                raise ConfigError(msg)

    def make_retrier(
        self,
        *,
        transient: Callable[[BaseException], bool],
        hint: str,
        throttled: Callable[[BaseException], bool] | None = None,
    ) -> Retrier:
        """The retry loop of this store, read by ``concurrency`` threads, as :meth:`take_tuning` set it.

        Footers are fetched by up to 32 threads at once, so the throttle starts above that.
        """
        return Retrier(
            attempts=self.attempts,
            backoff=self.backoff,
            concurrency=max(64, 2 * self.concurrency),
            transient=transient,
            throttled=throttled or (lambda e: isinstance(e, Throttled)),
            hint=hint,
            deadline=self.retry_deadline,
        )

    @property
    def retries(self) -> int:
        """Attempts beyond the first, over every request of this storage (thread-safe)."""
        return self._retrier.retries

    @property
    def waited(self) -> float:
        """Seconds during which some request of this storage was failing and retried (``Loader.stats``)."""
        return self._retrier.waited

    @property
    def throttle(self) -> Throttle:
        """The AIMD cap on requests in flight (``limit``, ``lowest``, ``cuts``)."""
        return self._retrier.throttle


def check_body(data: Any, offset: int, length: int) -> bytes:
    """A body of exactly ``length`` bytes, or a Transient (never a short read returned)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        msg = f"unexpected body type {type(data).__name__}"
        raise Transient(msg)
    if len(data) != length:
        # By hand: no client library retries a body that ends early.
        msg = f"short body: {len(data)} of {length} bytes at offset {offset}"
        raise Transient(msg)
    return bytes(data)


async def with_deadline(make: Callable[[], Any], deadline: float) -> Any:
    """``await make()``, a Transient if no complete response came within ``deadline`` seconds."""
    cm = asyncio.timeout(deadline)
    try:
        async with cm:
            return await make()
    except TimeoutError as e:
        if cm.expired():
            msg = f"no complete response within {deadline:.1f} s"
        else:  # the read timeout, while waiting for the headers or the body
            msg = f"timed out: {type(e).__name__}: {e}".rstrip(": ")
        raise Transient(msg) from e
