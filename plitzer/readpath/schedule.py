"""The schedule: which units a rank reads, in which layout stage, ahead of use and within the budget.

A *unit* is one window of the run, numbered over all epochs: the sequence every rank
walks through. For each unit the schedule asks the run (:class:`planner.run.Run`, passed
to every call: the schedule holds none) for the rank's planned reads and the unit's place
in the lanes' streams (``Run.place``), estimates what it will hold, charges the budget and
hands it to the read pool (:mod:`plitzer.readpath.scan`), which reads and packs it on its
threads.

Memory: ``budget`` caps the decoded bytes held (the cost model is
:mod:`plitzer.readpath.cost`, the accounting :mod:`plitzer.readpath.budget`). A unit is
charged its estimate (decoded row groups plus the packed copy and tables) when its reads
start, and what it really holds once packed. It is released when every lane of the rank
has moved past it, but its bytes stay charged while any batch view of its tokens is alive
(``plitzer.readpath.packed.Memory``): a caller who keeps batches slows the prefetch rather
than having them overwritten. Units are started strictly in order, only while the charge
fits, so a later unit never delays an earlier one and the consumer never waits on a read
the budget allowed to start earlier. At most ``ahead`` units past the furthest one in use
are started early.

The units a step needs are always started, and they always fit: lanes run in lockstep,
so at step ``t`` every lane is inside the run's tokens ``[t*L*B, (t+1)*L*B + B)``, and the
units held are the windows overlapping that range, a number bounded from the footers alone
(:func:`plitzer.readpath.cost.budget_floor`), which the Loader checks against ``budget`` at
construction. :class:`plitzer.readpath.scan.Stats` reports what was held; ``overruns``
counts units started past the budget by the loader's own units (the tests assert it never
happens), ``caller_overruns`` those started past it only because the caller still holds
batch views of released units.
"""

from __future__ import annotations

from concurrent.futures import CancelledError

import numpy as np
from numpy.typing import NDArray

from planner.errors import StoppedError
from planner.order.epoch import row_group_counts
from planner.run import Run, Segment, Start
from plitzer.readpath.cost import unit_estimate
from plitzer.readpath.packed import PackedUnit, UnitReads
from plitzer.readpath.scan import AHEAD, ReadPool, Stats

__all__ = ["Schedule"]


class Schedule:
    """Which units one rank starts, in order, in one layout stage at a time, within the pool's budget.

    It holds no run: every call that needs one is given the run in force (the loader's).
    """

    def __init__(self, pool: ReadPool, *, ahead: int = AHEAD) -> None:
        self.pool = pool
        self.ahead = ahead
        self.stage = 0  # the layout stage being packed (the run's stage index)
        self._reads: dict[int, UnitReads] = {}  # the run's answers for units not released
        self._next = 0  # the next unit to start
        self._released = 0  # the units before it are released
        self._wanted = 0  # the furthest unit asked for
        self._at = Start(0, np.zeros(0, dtype=np.int64))  # where the lanes stood when placed (reset)
        index = pool.index
        rows = pool.packing.rows
        self._tokens, self._rows, _ = row_group_counts(index)  # what each gives the stream (selected)
        self._held_per_unit = 1  # the budget's tokens a unit: a token under concat, n_g * L under best-fit
        if rows is not None:
            assert rows.bins is not None  # Packing.of counted them
            self._tokens, self._held_per_unit = rows.bins, rows.seq_len
        self._doc_base = np.cumsum(self._rows) - self._rows
        self._dtype = np.dtype(index.dtype)

    # -- what the consumer sees --------------------------------------------------

    @property
    def stats(self) -> Stats:
        return self.pool.stats

    @property
    def held_bytes(self) -> int:
        return self.pool.budget.held

    @property
    def peak_bytes(self) -> int:
        return self.pool.budget.peak

    @property
    def rows_read(self) -> int:
        return self.pool.rows_read

    # What is packed is (run, stage); the rest is derived from them, never mirrored.

    def segment(self, run: Run) -> Segment:
        """The layout stage being packed: its lanes, its rows' length, where it began."""
        return run.segment(self.stage)[1]

    def rank_lanes(self, run: Run) -> range:
        """This rank's lanes in the layout stage being packed."""
        return run.rank_lanes(self.segment(run).lanes)

    def seq_len(self, run: Run) -> int:
        """Tokens a row (the run's layout counts units: one a row under best-fit)."""
        rows = self.pool.packing.rows
        return self.segment(run).units_per_row if rows is None else run.layout.stages[self.stage].tokens or rows.seq_len

    def lane_base(self, run: Run, unit: int) -> NDArray[np.int64]:
        """Stream positions of the rank's lanes before ``unit`` (:meth:`planner.run.Run.lane_base`)."""
        return run.lane_base(unit, self.stage)

    # -- placing and changing (consumer thread only) ------------------------------

    def reset(self, run: Run, step: int) -> None:
        """Forget every unit; the next step is ``step`` (packed in the layout stage in force there).

        Lane ``k``'s next token is in the window :meth:`planner.run.Run.start` says; a
        unit behind some lanes' positions is then needed only by the lanes at or before
        it, so only the row groups that can hold those lanes' documents are read, and
        only the steps from ``step`` on are packed: resuming reads what the positions
        need, not whole windows (docs/design.md, "Resuming").
        """
        self.stage = run.stage_of(step)
        at = run.start(step, self.stage)
        self.pool.drop_from(0)
        self._reads.clear()
        self._at = at
        unit = int(at.first.min())
        self._next = self._released = self._wanted = unit

    def changed(self, run: Run, unit: int) -> None:
        """``run`` is in force from now on, and differs from the last from ``unit`` on (a live stage).

        Units before ``unit`` are untouched (lanes may be inside them); a unit read
        ahead past the change holds row groups of the old plan and is dropped, and read
        and packed again, so prefetch never commits the stream (docs/design.md, "Live
        stages"). The layout stage packed stays until the next :meth:`reset`.
        """
        self.pool.drop_from(unit)
        for x in [x for x in self._reads if x >= unit]:
            del self._reads[x]
        if unit <= self._at.last:  # the resumed lanes' windows may have moved
            self._at = run.start(self._at.step, self.stage)
        # A change can begin at a unit already released: windows with no token left for any
        # lane (empty ones at the lanes' place, when an epoch holds fewer tokens than a step)
        # that the new plan fills. Nothing of them was delivered: they are read again.
        self._released = min(self._released, unit)
        self._next = min(self._next, max(unit, self._released))

    # -- starting units ------------------------------------------------------------

    def _plan_reads(self, run: Run, unit: int) -> UnitReads:
        """The run's answers for ``unit`` and what its reads hold (in the consumer thread).

        What the pack needs from the plan is taken here: the plan of a mixture changes
        under set_weights, so reader threads never read it.
        """
        got = self._reads.get(unit)
        if got is not None:
            return got
        place = run.place(unit, self.stage, self._at)
        rgs = place.row_groups
        est = unit_estimate(
            int(self._tokens[rgs].sum()) * self._held_per_unit,
            int(self._rows[rgs].sum()),
            lanes=len(place.rank_lanes),
            seq_len=self.seq_len(run),
            column_bytes=self.pool.packing.column_bytes,
            labels=self.pool.packing.labels,
        )
        got = UnitReads(place, self._doc_base[rgs], int(est), self._dtype)
        self._reads[unit] = got
        return got

    def _start(self, run: Run, unit: int) -> None:
        """Charge ``unit`` and hand its reads to the pool."""
        reads = self._plan_reads(run, unit)
        pool = self.pool
        with pool.lock:
            charge = pool.budget.charge(reads.estimate)
        pool.start(reads, charge)

    def _prefetch(self, run: Run) -> None:
        pool = self.pool
        while self._next <= min(self._wanted + self.ahead, run.last_unit):  # a finite run: nothing past it
            est = self._plan_reads(run, self._next).estimate
            with pool.lock:
                fits = pool.budget.fits(est)
            if not fits:
                return
            self._start(run, self._next)
            self._next += 1

    def get(self, run: Run, unit: int) -> PackedUnit:
        """The packed ``unit`` of ``run``, waiting for it if needed; starts later units as the budget allows.

        A close from another thread while this waits (the store away, the reads retrying)
        ends the wait at once with a :class:`~planner.errors.StoppedError`.
        """
        self.pool.check_open()
        try:
            self._wanted = max(self._wanted, unit)
            while self._next <= unit:
                self._start(run, self._next)
                self._next += 1
            self._prefetch(run)
            return self.pool.wait(unit)
        except (CancelledError, StoppedError, KeyError, RuntimeError) as e:
            if not self.pool.closed:
                raise
            msg = (
                f"the loader was closed (by close() in another thread, or as the interpreter ends) while this "
                f"step waited for window {unit} of the run; create a new Loader (and resume it) to go on"
            )
            raise StoppedError(msg) from e

    def release_before(self, run: Run, unit: int) -> None:
        """Every lane has moved past the units before ``unit``: release them."""
        if unit <= self._released:
            return
        self.pool.drop(list(range(self._released, unit)))
        for x in range(self._released, unit):
            self._reads.pop(x, None)
        self._released = unit
        self._prefetch(run)

    def close(self) -> None:
        """Stop every unit and the reader threads (:meth:`plitzer.readpath.scan.ReadPool.close`)."""
        self.pool.close()

    @property
    def closed(self) -> bool:
        return self.pool.closed
