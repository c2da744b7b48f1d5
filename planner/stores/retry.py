"""Retries and throttling shared by the object stores (S3, GCS, Azure; docs/storage.md).

Every request to an object store runs through a :class:`Retrier`: one attempt at a
time per request, inside a slot of its :class:`~planner.stores.throttle.Throttle`,
retried with jittered exponential backoff (capped at 10 s) where the failure is
transient, counted (:attr:`Retrier.retries`), and reported as a :class:`StorageError`
naming the object, the range and the last cause when it is not.

Retries are bounded by time, not by a count: a store that stops answering (an
incident of minutes, a restarted endpoint) is waited for, by default for 10 minutes
of failing (``storage_options`` ``retry_deadline``; 0 fails at once; ``attempts``
bounds the count as well where given). A request failing for more than
:data:`PATIENCE` seconds warns once that it waits (and for what), and once more
when the store answers again (:class:`~planner.errors.StorageWaitWarning`); past the
deadline the StorageError names the object, the time waited and the option.
:attr:`Retrier.waited` is the wall-clock time some request was failing (``Loader.stats``).

Its waits end when their owner stops (:mod:`planner.stores.stopping`), and its requests
in flight are capped by an AIMD :class:`~planner.stores.throttle.Throttle`.
"""

from __future__ import annotations

import asyncio
import math
import random
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from planner.errors import ConfigError, FileChangedError, StoppedError, StorageError, StorageWaitWarning, warn_caller
from planner.stores.stopping import STOPPED, pause, stop_event
from planner.stores.throttle import Throttle

__all__ = [
    "DEFAULT_DEADLINE",
    "PATIENCE",
    "Changed",
    "Fatal",
    "Retrier",
    "Retrying",
    "Throttled",
    "Transient",
    "check_body",
    "with_deadline",
]

T = TypeVar("T")

_RETRY_CAP = 10.0
DEFAULT_DEADLINE = 600.0
"""Seconds a request keeps retrying a store that does not answer (``storage_options`` ``retry_deadline``)."""
PATIENCE = 10.0
"""Seconds of failing after which a request is waiting for the store (warned once, and when it is back)."""


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
    early when the thread's requests are stopped (:func:`~planner.stores.stopping.stop_on`),
    and a stopped request raises :class:`~planner.errors.StoppedError` before its next
    attempt.
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
        sleep: Callable[[float], None] = pause,
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
            warn_caller(msg, StorageWaitWarning)

    def _note_waiting(self, what: str, first: float, cause: str) -> None:
        with self._lock:
            if self._outage_since is not None or first < self._recovered_at:
                return  # warned already (this outage, or one this request was part of)
            self._outage_since = first
        msg = (
            f"{what}: the store does not answer ({cause}); waiting for it, up to storage_options "
            f"retry_deadline={self.deadline:g} s, retrying at least every {_RETRY_CAP * 1.5:g} s"
        )
        warn_caller(msg, StorageWaitWarning)

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
        stop = stop_event()
        cause = ""
        while True:
            if stop.is_set():
                why = f" ({cause})" if cause else ""
                msg = f"{what}: stopped while waiting for the store{why}: {STOPPED}"
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
                    msg = f"{what}: stopped during a request to the store ({_cause(e)}): {STOPPED}"
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
