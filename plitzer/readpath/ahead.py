"""Steps made ahead of the consumer on one thread of their own, in order, a bounded number of them.

A balanced loader deals and exchanges each step over its group (``plitzer.readpath.balance``),
and a replica's reader sends each step to its peers (``plitzer.state.replica``): collective work
that must not hold up the consumer, and that every rank of the group must do for the same steps
in the same order. :class:`Ahead` runs ``make(step)`` for the steps from the consumer's next one
on, up to ``depth`` of them (and only those ``may(step, next)`` allows: not past a finite run's
end or into a layout stage the consumer has not reached), on one long-lived thread. Which steps it
makes is a function of the consumer's calls alone (the next step it will take, and ``depth``), the
same on every rank, so the collectives pair up. :meth:`settle` lets the thread make every step it
is allowed to (its peers make them too) and then stops it, dropping what it made: a seek, a
resume, a live stage or a close make them stale.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Generic, TypeVar

__all__ = ["Ahead"]

T = TypeVar("T")

_WAKE_S = 0.1  # a waiting consumer looks at its signals this often (Ctrl-C)


class Ahead(Generic[T]):
    """``make(step)`` for the consumer's next ``depth`` steps, on a thread, in order (module docstring)."""

    def __init__(self, make: Callable[[int], T], depth: int = 1, may: Callable[[int, int], bool] | None = None) -> None:
        self._make = make
        self._depth = depth
        self._may = may or (lambda step, nxt: True)
        self._cond = threading.Condition()
        self._done: dict[int, Future[T]] = {}
        self._next = 0  # the consumer's next step: the thread makes steps below next + depth
        self._made = 0  # the next step the thread makes
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.waited = 0.0
        """Seconds the consumer waited in :meth:`take` (the steps it asked for were not made yet)."""

    # -- the thread ---------------------------------------------------------------------

    def _allowed(self, step: int) -> bool:
        return step < self._next + self._depth and self._may(step, self._next)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._allowed(self._made):
                    if self._stopping:
                        return
                    self._cond.wait()
                step = self._made
                fut = self._done.setdefault(step, Future())
            try:
                fut.set_result(self._make(step))
            except BaseException as e:  # handed to the consumer, which raises it; the thread ends
                fut.set_exception(e)
                with self._cond:
                    self._stopping = True
                    self._cond.notify_all()
                return
            with self._cond:
                self._made = step + 1
                self._cond.notify_all()

    # -- the consumer ---------------------------------------------------------------------

    def start(self, step: int) -> None:
        """The consumer's next step is ``step``: the thread may make it and the ``depth - 1`` after it."""
        with self._cond:
            if self._thread is None:
                self._made, self._stopping, self._done = step, False, {}
                self._thread = threading.Thread(target=self._run, name="plitzer-ahead", daemon=True)
                self._thread.start()
            self._next = step
            self._cond.notify_all()

    def take(self, step: int) -> T:
        """``step``'s result: the one made ahead, else made now (on the thread, waited for)."""
        with self._cond:
            fut = self._done.get(step)
            coming = self._thread is not None and not self._stopping and self._made <= step
        if fut is None and not coming:
            self.settle()
        self.start(step)
        with self._cond:
            fut = self._done.setdefault(step, Future())
        t = time.perf_counter()
        try:
            while True:
                try:
                    return fut.result(timeout=_WAKE_S)  # in slices: Ctrl-C reaches a waiting consumer
                except FutureTimeout:
                    continue
        finally:
            self.waited += time.perf_counter() - t
            with self._cond:
                self._done.pop(step, None)

    def settle(self, timeout: float | None = None) -> None:
        """Let the thread make the steps it is allowed to, stop it, and drop what it made.

        ``timeout``: give up waiting after that many seconds (``close()``: a peer that is gone
        leaves the thread in its collective until the group's own timeout ends it).
        """
        with self._cond:
            thread = self._thread
            self._stopping = True
            self._cond.notify_all()
        if thread is not None:
            thread.join(timeout)
        with self._cond:
            self._thread = None
            self._done = {}
