"""The AIMD cap on a storage's requests in flight (:class:`Throttle`, one a :class:`~planner.stores.retry.Retrier`).

The throttle is AIMD, as TCP's congestion window: requests in flight are capped
by a limit that starts at the storage's concurrency; a throttling answer (S3's 503
SlowDown or a 429, GCS's and Azure's 429 or 503) halves it, once per round of
requests (a throttle seen by requests that started before the last cut does not
cut again), and each round of ``limit`` successes adds one slot, back up to the
start (integer arithmetic: exactly one slot per round). A server that asks us to slow down
gets fewer requests at once instead of the same number retried.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

__all__ = ["Throttle"]


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
