"""A step's batch: a view of the block of the unit in use, or assembled from the windows it straddles.

The scanner (``plitzer.readpath.scan``) packs each window step-major, so a step that
lies wholly inside one window is a view of that window's block (no copy, no per-lane
work); a step that straddles windows is assembled from their ends by one gather
(``plitzer.readpath.packed.assemble``). After each step the units that every lane has
left are released, and the scanner reads the next ones ahead. The loader owns the step,
the run value and the checks a resume left (it passes them in, :class:`plitzer.Loader`);
this holds the unit whose block the steps are views of.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray

from planner.run import Run
from plitzer.readpath.aligned import assemble_columns, unit_columns
from plitzer.readpath.batch import Batch, Tokens
from plitzer.readpath.labels import assemble_labels, unit_labels
from plitzer.readpath.packed import PackedUnit, Segments, assemble
from plitzer.readpath.scan import Scanner
from plitzer.state import resume
from plitzer.state.build import Locator

__all__ = ["Steps"]


class Steps:
    """The batches of a loader's steps, from its scanner's packed units (the unit in use kept)."""

    __slots__ = ("_cur", "_locate", "_now", "_scanner")

    def __init__(self, scanner: Scanner, now: resume.Now, locate: Locator) -> None:
        self._scanner = scanner
        self._now = now  # what the states of later steps record
        self._locate = locate
        self._cur: PackedUnit | None = None  # the unit whose block the steps are views of

    def forget(self, unit: int = 0) -> None:
        """Forget the unit in use if it is ``unit`` or later (every unit by default)."""
        if self._cur is not None and self._cur.unit >= unit:
            self._cur = None

    def take(self, run: Run, t: int, get: Callable[[int], PackedUnit]) -> Batch:
        """The batch of step ``t`` of ``run``; ``get`` gives a packed unit (checked where a resume left checks)."""
        if self._scanner.stage != run.stage_of(t):  # a layout stage begins: the scanner packs its lanes
            self._cur = None
            self._scanner.reset(t)
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
        rows, seq_len = len(self._scanner.rank_lanes), self._scanner.seq_len
        end = run.steps is not None and t + 1 >= run.steps  # a finite run's last step: rows padded at its end
        pad = (run.plan.packing[1], np.dtype(run.plan.dataset.dtype)) if end else None
        tokens, segments = assemble(units, t, rows, seq_len, pad)
        columns = assemble_columns(units, t, rows, seq_len, self._scanner.columns if end else None)
        self._cur = None
        labels = assemble_labels(units, t, rows, seq_len, self._scanner.labels if end else None)
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
        after = resume.state_after(self._now, t, {u.unit: u.slices for u in units})
        cur = self._cur
        if (cur is None or not (cur.t0 <= t + 1 < cur.t1)) and run.stage_of(t + 1) == self._scanner.stage:
            nxt, _ = run.units_of_step(t + 1)
            if cur is not None and cur.unit < nxt:
                self._cur = None
            self._scanner.release_before(nxt)
        return Batch(
            tokens=tokens.view(Tokens),
            step=t,
            epoch=run.epoch_of(t),
            lanes=self._scanner.rank_lanes,
            _segments=segments,
            _locate=self._locate,
            _after=after,
            columns={n: c.view(Tokens) for n, c in (columns or {}).items()},
            padded=self._scanner.rows is not None or run.steps is not None,
            labels=None if labels is None else labels.view(Tokens),
        )
