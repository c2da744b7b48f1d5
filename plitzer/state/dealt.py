"""Balanced steps at world > 1 (SPEC section 18): the Loader's steps dealt ahead on a thread, as a mixin.

:class:`DealtSteps` holds the Loader's methods that run its balanced steps through
:class:`plitzer.readpath.ahead.Ahead`: what the read-ahead's thread makes of a step (the rank's
own rows under the loader's lock, then dealt and exchanged by :class:`plitzer.readpath.balance.Balancer`),
the consumer's side (take the step, release what the step before needed, start the next), which
steps may be dealt ahead, and the settling a seek, resume, live stage or close does first. What
they use of the loader is declared below.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from plitzer.readpath.ahead import Ahead
from plitzer.readpath.balance import Balancer
from plitzer.readpath.batch import Batch

if TYPE_CHECKING:
    from planner.run import Run
    from plitzer.readpath.packed import PackedUnit
    from plitzer.readpath.signals import SourceTotals
    from plitzer.readpath.steps import Steps
    from plitzer.state.resume import Cursor

__all__ = ["DealtSteps"]


class DealtSteps:
    """The Loader's balanced steps at world > 1 (mixed into :class:`plitzer.Loader`)."""

    if TYPE_CHECKING:
        _lock: threading.RLock
        _cursor: Cursor
        _steps: Steps
        _totals: SourceTotals
        _balancer: Balancer | None
        _ahead: Ahead[Batch] | None

        @property
        def _step(self) -> int: ...
        @property
        def _run(self) -> Run: ...
        @property
        def ended(self) -> bool: ...
        def _get(self, unit: int) -> PackedUnit: ...
        def _check_end(self) -> None: ...

    def _dealt(self, step: int) -> Batch:
        """On the read-ahead's thread: ``step``'s own rows (under the lock), then dealt over the group."""
        with self._lock:
            raw = self._steps.take(self._run, step, self._get, release=False)
        assert self._balancer is not None
        return self._balancer.balance(raw)

    def _next_dealt(self) -> Batch:
        """The next step, dealt: made ahead while the caller trained on the last one; the one after started."""
        assert self._ahead is not None
        with self._lock:
            self._check_end()
            t = self._step
        batch = self._ahead.take(t)
        assert self._balancer is not None
        self._balancer.stats.consumer_wait = self._ahead.waited
        self._balancer.handed(t)
        with self._lock:
            self._steps.release_after(self._run, t)
            self._cursor.step = t + 1
            self._cursor.resumed = None
            self._totals.add(batch)
            if not self.ended:
                self._ahead.start(t + 1)  # every rank starts the same steps: the collectives line up
        return batch

    def _may_deal(self, step: int, nxt: int) -> bool:
        """Whether the read-ahead may deal ``step`` while the consumer's next is ``nxt``: not past a
        finite run's end, nor into a layout stage the consumer has not reached (its reset of the
        schedule would drop units a checkpoint at ``nxt`` reads)."""
        run = self._run
        return (run.steps is None or step < run.steps) and run.stage_of(step) == run.stage_of(nxt)

    def _settle(self) -> None:
        """Finish and drop the step being dealt ahead (a seek, resume, live stage or close makes it stale)."""
        if self._ahead is not None:
            self._ahead.settle()
            if self._balancer is not None:
                self._balancer.drop_pending()
