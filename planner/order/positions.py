"""Where lanes stand: the cards rule turned into positions in windows (docs/design.md, "The order").

Lanes run in lockstep: the cuts deal the run's units to lanes like cards, so lane ``k``'s
unit ``p`` of a layout stage that began at run unit ``X`` is run unit ``X + ((k - X) mod B) +
p * B``. :func:`lane_positions` turns a step into each lane's window and offset in its slice,
:func:`lane_base` a window into each lane's stream position before it; :class:`planner.run.Run`
asks both for the stage in force.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from planner.arraytypes import I64
from planner.order.plan import Plan
from planner.packing import stage_tokens

__all__ = ["Began", "lane_base", "lane_positions"]


class Began(Protocol):
    """Where a layout stage began (:class:`planner.run.Segment`): its first step and run unit, its rows' units."""

    @property
    def begin_step(self) -> int: ...

    @property
    def begin_run(self) -> int: ...

    @property
    def units_per_row(self) -> int: ...


class _Epochs(Protocol):
    """What :func:`lane_positions` needs of a plan (``planner.order.plan.Plan`` has it)."""

    def epoch_of_run(self, run: int) -> int: ...

    def run_before(self, epoch: int) -> int: ...

    def epoch(self, epoch: int) -> Any: ...


def lane_positions(
    plan: _Epochs, step: int, units_per_row: int, lanes: int, rank_lanes: range, begin_step: int = 0, begin_run: int = 0
) -> I64:
    """Where ``rank_lanes`` are before global step ``step``, from the windows' tokens alone.

    Rows ``[lane, epoch, window, -1, offset in the lane's slice]``. The cuts deal the
    run's tokens like cards, so lane ``k``'s next token is run token ``X(step) + k``
    (:meth:`planner.order.layout.Layout.run_at`, here one stage from step 0); its window
    is found by one ``searchsorted`` over the epoch's window tokens, and lane ``k`` has
    received ``ceil((R - k) / B)`` tokens once the run has ``R``. (The piece ordinal
    needs the window's documents: the loader resolves it once the window is packed.)

    Under a layout stage that began at step ``begin_step``, run token ``begin_run``
    (:mod:`planner.order.layout`), the cards start there: lane ``k``'s next token is the run
    token ``begin_run + ((k - begin_run) mod B) + p * B`` with ``p = (step - begin_step)
    * units_per_row`` its units of the stage (tokens under concat), and the window holding ``begin_run`` (the one
    cut again at the change) is counted from ``begin_run``.
    """
    ks = np.arange(rank_lanes.start, rank_lanes.stop, dtype=np.int64)
    p = (step - begin_step) * units_per_row
    run = begin_run + (ks - begin_run) % lanes + p * lanes
    lo, hi = plan.epoch_of_run(int(run.min())), plan.epoch_of_run(int(run.max()))
    if hi - lo <= 1:
        epoch = np.where(run >= plan.run_before(hi), hi, lo)
    else:  # epochs of fewer tokens than a step's lanes: the lanes' next tokens span several
        epoch = np.array([plan.epoch_of_run(int(x)) for x in run.tolist()], np.int64)
    rows = np.zeros((len(ks), 5), np.int64)
    rows[:, 0] = ks
    rows[:, 3] = -1
    for e in np.unique(epoch).tolist():
        sel = epoch == e
        window_tokens = plan.epoch(int(e)).window_tokens
        ends = np.cumsum(window_tokens)
        start = plan.run_before(int(e))
        w = np.searchsorted(ends, run[sel] - start, side="right")
        before = np.maximum(start + (ends[w] - window_tokens[w]), begin_run)
        got = stage_tokens(before, ks[sel], lanes, begin_run)
        rows[sel, 1] = e
        rows[sel, 2] = w
        rows[sel, 4] = p - got
    return rows


def lane_base(plan: Plan, unit: int, rank_lanes: range, segment: Began | None = None) -> I64:
    """Stream positions of ``rank_lanes`` before ``unit``: ``ceil((R - k) / B)`` after R run tokens.

    The cards rule (docs/design.md, "The order"): lane ``k`` gets run tokens ``k, k + B,
    k + 2B, ...``, so its slice of the unit is its stream positions from here on. Under a
    layout stage (``segment``), the cards begin at the stage's first run token, and
    positions count from the stage's first step times its ``units_per_row`` (so that position
    ``p`` is in step ``p // units_per_row``).
    """
    epoch, window = plan.unit_epoch_window(unit)
    ep = plan.epoch(epoch)
    lanes = plan.settings.lanes
    run = plan.run_before(epoch) + int(ep.window_tokens[:window].sum())
    ks = np.arange(rank_lanes.start, rank_lanes.stop, dtype=np.int64)
    if segment is None or segment.begin_run == 0:
        return stage_tokens(run, ks, lanes, 0)
    got = stage_tokens(max(run, segment.begin_run), ks, lanes, segment.begin_run)
    out = segment.begin_step * segment.units_per_row + got
    return out
