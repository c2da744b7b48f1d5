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
from plitzer.readpath.signals import SourceMap

__all__ = ["After", "Steps"]

# The state after a step, encoded when called: ``after(step, {unit: slices})`` (the loader's).
After = Callable[[int, dict[int, Slices]], Callable[[], bytes]]


class Steps:
    """The batches of a loader's steps, from its schedule's packed units (the unit in use kept)."""

    __slots__ = ("_after", "_cur", "_locate", "_schedule", "_sources")

    def __init__(self, schedule: Schedule, locate: Locate, after: After, sources: SourceMap) -> None:
        self._schedule = schedule
        self._locate = locate
        self._sources = sources  # a batch's document numbers to source numbers
        self._after = after  # what the states of later steps record
        self._cur: PackedUnit | None = None  # the unit whose block the steps are views of

    def forget(self, unit: int = 0) -> None:
        """Forget the unit in use if it is ``unit`` or later (every unit by default)."""
        if self._cur is not None and self._cur.unit >= unit:
            self._cur = None

    def take(self, run: Run, t: int, get: Callable[[int], PackedUnit], *, release: bool = True) -> Batch:
        """The batch of step ``t`` of ``run``; ``get`` gives a packed unit (checked where a resume left checks).

        ``release=False``: keep what step ``t + 1`` does not need until :meth:`release_after` (a
        balanced loader takes a step ahead of its cursor, and a checkpoint at the cursor may still
        need the units of the step before).
        """
        sched = self._schedule
        if sched.stage != run.stage_of(t):  # a layout stage begins: the schedule packs its lanes
            self._cur = None
            sched.reset(run, t)
        cur = self._cur
        if cur is not None and cur.t0 <= t < cur.t1:  # the common case: a view of the block
            return self._view(run, cur, t, release)
        first, last = run.units_of_step(t)
        if first == last:
            u = get(first)
            if u.t0 <= t < u.t1:
                self._cur = u
                return self._view(run, u, t, release)
        units = [get(x) for x in range(first, last + 1)]
        rows, seq_len = len(sched.rank_lanes(run)), sched.seq_len(run)
        end = run.steps is not None and t + 1 >= run.steps  # a finite run's last step: rows padded at its end
        pad = (run.plan.packing[1], np.dtype(run.plan.dataset.dtype)) if end else None
        packing = sched.pool.packing
        tokens, segments = assemble(units, t, rows, seq_len, pad)
        columns = assemble_columns(units, t, rows, seq_len, packing.columns if end else None)
        self._cur = None
        labels = assemble_labels(units, t, tokens, packing.labels if end else None)
        return self._deliver(run, t, tokens, segments, units, columns, labels, release=release)

    def _view(self, run: Run, u: PackedUnit, t: int, release: bool = True) -> Batch:
        """Step ``t`` as a view of the block of ``u``, the unit in use."""
        segments = functools.partial(u.segments, t)
        tokens = u.block[t - u.t0]
        return self._deliver(
            run, t, tokens, segments, [u], unit_columns(u, t), unit_labels(u, t, tokens), release=release
        )

    def _deliver(
        self,
        run: Run,
        t: int,
        tokens: NDArray[Any],
        segments: Segments | Callable[[], Segments],
        units: list[PackedUnit],
        columns: dict[str, NDArray[Any]] | None = None,
        labels: NDArray[Any] | None = None,
        *,
        release: bool = True,
    ) -> Batch:
        """Step ``t``'s batch (it took tokens from ``units``); release what no lane needs after it."""
        after = self._after(t, {u.unit: u.slices for u in units})
        sched = self._schedule
        if release:
            self.release_after(run, t)
        return Batch(
            tokens=tokens.view(Tokens),
            step=t,
            epoch=run.epoch_of(t),
            lanes=np.arange(sched.rank_lanes(run).start, sched.rank_lanes(run).stop, dtype=np.int64),
            _segments=segments,
            _locate=self._locate,
            _after=after,
            columns={n: c.view(Tokens) for n, c in (columns or {}).items()},
            padded=sched.pool.packing.rows is not None or run.steps is not None,
            labels=None if labels is None else labels.view(Tokens),
            _sources=self._sources,
        )

    def release_after(self, run: Run, t: int) -> None:
        """Step ``t`` was delivered: release the units no lane needs from step ``t + 1`` on."""
        sched = self._schedule
        cur = self._cur
        if (cur is None or not (cur.t0 <= t + 1 < cur.t1)) and run.stage_of(t + 1) == sched.stage:
            nxt, _ = run.units_of_step(t + 1)
            if cur is not None and cur.unit < nxt:
                self._cur = None
            sched.release_before(run, nxt)
