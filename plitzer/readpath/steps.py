"""A step's batch: a view of the block of the unit in use, or assembled from the windows it straddles.

The read pool (:mod:`plitzer.readpath.scan`) packs each window step-major, so a step that
lies wholly inside one window is a view of that window's block (no copy, no per-lane
work); a step that straddles windows is assembled from their ends by one gather
(``plitzer.readpath.packed.assemble``). After each step the units that every lane has
left are released, and the schedule (:mod:`plitzer.readpath.schedule`) starts the next
ones. The run is an argument of :meth:`Steps.take`, the only way in: the loader owns the
run, the step and the checks a resume left (``get``), and what a batch's state records
(``after``); this holds the unit whose block the steps are views of.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray

from planner.run import Run
from plitzer.readpath.aligned import assemble_columns, unit_columns
from plitzer.readpath.batch import Batch, Locate, Tokens
from plitzer.readpath.labels import assemble_labels, unit_labels
from plitzer.readpath.packed import PackedUnit, Segments, Slices, assemble
from plitzer.readpath.schedule import Schedule

__all__ = ["After", "Steps"]

# The state after a step, encoded when called: ``after(step, {unit: slices})`` (the loader's).
After = Callable[[int, dict[int, Slices]], Callable[[], bytes]]


class Steps:
    """The batches of a loader's steps, from its schedule's packed units (the unit in use kept)."""

    __slots__ = ("_after", "_cur", "_locate", "_schedule")

    def __init__(self, schedule: Schedule, locate: Locate, after: After) -> None:
        self._schedule = schedule
        self._locate = locate
        self._after = after  # what the states of later steps record
        self._cur: PackedUnit | None = None  # the unit whose block the steps are views of

    def forget(self, unit: int = 0) -> None:
        """Forget the unit in use if it is ``unit`` or later (every unit by default)."""
        if self._cur is not None and self._cur.unit >= unit:
            self._cur = None

    def take(self, run: Run, t: int, get: Callable[[int], PackedUnit]) -> Batch:
        """The batch of step ``t`` of ``run``; ``get`` gives a packed unit (checked where a resume left checks)."""
        sched = self._schedule
        if sched.stage != run.stage_of(t):  # a layout stage begins: the schedule packs its lanes
            self._cur = None
            sched.reset(run, t)
        cur = self._cur
        if cur is not None and cur.t0 <= t < cur.t1:  # the common case: a view of the block
            return self._view(run, cur, t)
        first, last = run.units_of_step(t)
        if first == last:
            u = get(first)
            if u.t0 <= t < u.t1:
                self._cur = u
                return self._view(run, u, t)
        units = [get(x) for x in range(first, last + 1)]
        rows, seq_len = len(sched.rank_lanes(run)), sched.seq_len(run)
        end = run.steps is not None and t + 1 >= run.steps  # a finite run's last step: rows padded at its end
        pad = (run.plan.packing[1], np.dtype(run.plan.dataset.dtype)) if end else None
        packing = sched.pool.packing
        tokens, segments = assemble(units, t, rows, seq_len, pad)
        columns = assemble_columns(units, t, rows, seq_len, packing.columns if end else None)
        self._cur = None
        labels = assemble_labels(units, t, rows, seq_len, packing.labels if end else None)
        return self._deliver(run, t, tokens, segments, units, columns, labels)

    def _view(self, run: Run, u: PackedUnit, t: int) -> Batch:
        """Step ``t`` as a view of the block of ``u``, the unit in use."""
        segments = functools.partial(u.segments, t)
        return self._deliver(run, t, u.block[t - u.t0], segments, [u], unit_columns(u, t), unit_labels(u, t))

    def _deliver(
        self,
        run: Run,
        t: int,
        tokens: NDArray[Any],
        segments: Segments | Callable[[], Segments],
        units: list[PackedUnit],
        columns: dict[str, NDArray[Any]] | None = None,
        labels: NDArray[Any] | None = None,
    ) -> Batch:
        """Step ``t``'s batch (it took tokens from ``units``); release what no lane needs after it."""
        after = self._after(t, {u.unit: u.slices for u in units})
        sched = self._schedule
        cur = self._cur
        if (cur is None or not (cur.t0 <= t + 1 < cur.t1)) and run.stage_of(t + 1) == sched.stage:
            nxt, _ = run.units_of_step(t + 1)
            if cur is not None and cur.unit < nxt:
                self._cur = None
            sched.release_before(run, nxt)
        return Batch(
            tokens=tokens.view(Tokens),
            step=t,
            epoch=run.epoch_of(t),
            lanes=sched.rank_lanes(run),
            _segments=segments,
            _locate=self._locate,
            _after=after,
            columns={n: c.view(Tokens) for n, c in (columns or {}).items()},
            padded=sched.pool.packing.rows is not None or run.steps is not None,
            labels=None if labels is None else labels.view(Tokens),
        )
