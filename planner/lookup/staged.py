"""Pieces under layout stages (SPEC section 12): each stage's windows in its own lanes, and the window cut again.

Layout stage ``i`` runs steps ``[s_i, s_{i+1})`` with ``B_i`` lanes of ``L_i`` tokens and
delivers the run's tokens ``[X_i, X_{i+1})`` (docs/design.md, "Layout stages"). So a
piece's place follows from the stage that delivers it:

- a window that begins at or after ``X_i`` is cut into ``B_i`` lanes like any window
  (:func:`planner.lookup.cut.window_pieces`, ``z = R_w mod B_i``), each lane's position
  counted from the stage's first step: lane ``k`` has received ``ceil((R_w - k) / B_i) -
  ceil((X_i - k) / B_i)`` tokens of the stage before the window;
- the window holding ``X_i`` strictly inside (its *rest*) is cut as at its start, into
  the lanes of the stage then in force, its slices shuffled (every lane at once, as the
  loader cuts it again: ``plitzer.readpath.recut.pack_rest``), then by each change inside
  it in turn: what every lane has not consumed, laid end to end lane after lane, each in
  packed order, is cut into the new lanes by section 3 rule 4 with ``z = X mod B'`` and no
  second shuffle (:func:`rest_pieces`, the same arithmetic on token ranges). The new
  lanes' rests start at the stage's first step.

Each stage keeps the pieces of its own steps; the windows a change crosses give pieces to
both sides.

>>> import planner, tempfile, pyarrow as pa, pyarrow.parquet as pq
>>> from planner.lookup.lengths import lengths_from_array
>>> d = tempfile.mkdtemp()
>>> sizes = [12, 13, 10, 15, 20, 5, 9, 16]  # the worked example of docs/design.md, "Layout stages"
>>> docs = pa.array([[i] * n for i, n in enumerate(sizes)], pa.list_(pa.int32()))
>>> pq.write_table(pa.table({"tokens": docs}), f"{d}/a.parquet", row_group_size=2)
>>> p = planner.plan(d, lanes=[(0, 4), (1, 2)], seq_len=[(0, 8), (1, 32)], window=2)
>>> got = staged_pieces(p, p.layout, 0, lengths_from_array(np.array(sizes), np.array([2, 2, 2, 2])))
>>> step1 = got.take(np.flatnonzero(got.step == 1)).sorted()  # the rest, then window 1 (two documents a lane)
>>> [(int(k), int(s), int(n)) for k, s, n in zip(step1.lane, step1.start, step1.length)]
[(0, 0, 5), (0, 5, 4), (0, 9, 9), (0, 18, 14), (1, 0, 1), (1, 1, 4), (1, 5, 4), (1, 9, 12), (1, 21, 11)]
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from planner.arraytypes import I64
from planner.bounded import Bounded
from planner.lookup.cut import Cut, Pieces, PlanView, rows_of, window_pieces, window_slices
from planner.lookup.lengths import Lengths
from planner.lookup.pieces import LayoutView, PlanBacked, Positions, locate_pieces, windows_meeting
from planner.packing import Items, cut_again_at

__all__ = ["LanesView", "rest_pieces", "stage_pieces", "stage_steps", "staged_pieces"]


class LanesView(PlanBacked):
    """A plan's windows cut into ``lanes`` lanes (``z = R_w mod lanes``), at ``world`` ranks (default the plan's)."""

    def __init__(self, plan: PlanView, lanes: int, world: int | None = None) -> None:
        self.plan = plan
        s = plan.settings
        self.settings = replace(s, lanes=lanes, world=s.world if world is None else world)
        self._same = int(s.lanes) == lanes
        self._cache: Bounded[int, tuple[Any, Positions]] = Bounded(4)  # a few epochs

    def epoch(self, epoch: int) -> Any:
        ep = self.plan.epoch(epoch)
        if self._same:
            return ep
        got = self._cache.get(epoch)
        if got is None or got[0] is not ep:
            b = int(self.settings.lanes)
            prefix = np.cumsum(ep.window_tokens) - ep.window_tokens
            z = (self.plan.run_before(epoch) % b + prefix % b) % b
            got = (ep, Positions(ep.order, ep.window, ep.token_start, ep.window_tokens, z.astype(np.int64)))
            self._cache.put(epoch, got)
        return got[1]


def _rest_window(plan: PlanView, epoch: int, x: int) -> int | None:
    """The window of ``epoch`` holding run token ``x`` strictly inside (None: none, or ``x`` at a window's edge)."""
    if x <= 0 or plan.epoch_of_run(x) != epoch:
        return None
    ep = plan.epoch(epoch)
    ends = np.cumsum(ep.window_tokens)
    run0 = plan.run_before(epoch)
    w = int(np.searchsorted(ends, x - run0, side="right"))
    if w >= len(ends):
        return None
    return w if run0 + int(ends[w] - ep.window_tokens[w]) < x else None


def rest_pieces(plan: PlanView, layout: LayoutView, i: int, epoch: int, window: int, lengths: Lengths) -> Pieces:
    """The pieces stage ``i`` of ``layout`` delivers of ``window``, the window it cuts again (begun before ``X_i``).

    The window is cut into the lanes of the stage in force at its start, every lane at
    once, its slices shuffled; then by every change inside it up to stage ``i``'s. Steps
    from ``s_i`` on (the caller keeps the stage's).
    """
    ep = plan.epoch(epoch)
    start = plan.run_before(epoch) + int(ep.window_tokens[:window].sum())
    end = start + int(ep.window_tokens[window])
    stages, begins = layout.stages, layout.begins()
    j = max(m for m in range(i + 1) if begins[m] <= start)
    got = window_slices(LanesView(plan, int(stages[j].lanes), world=1), epoch, np.array([window]), lengths)
    if got is None:
        return Pieces.empty()
    docs, cut, offset = got
    live = np.flatnonzero(cut.end > cut.start)
    live = live[np.lexsort((offset[live], cut.lane[live]))]  # lane after lane, each in packed order
    items = Items(live, np.zeros(len(live), np.int64), (cut.end - cut.start)[live], cut.lane[live], offset[live])
    changes = [(int(stages[m].lanes), int(begins[m])) for m in range(j + 1, i + 1)]
    items = cut_again_at(items, int(stages[j].lanes), start, end, changes)
    first = cut.start[items.src] + items.a
    moved = Cut(
        start=first, end=first + items.length, lane=items.lane, doc=cut.doc[items.src], window=cut.window[items.src]
    )
    st = stages[i]
    return rows_of(epoch, docs, moved, int(st.start) * int(st.seq_len) + items.pos, int(st.seq_len))


def _steps_of(p: Pieces, lo: int, hi: int | None) -> Pieces:
    if not len(p):
        return p
    keep = p.step >= lo if hi is None else (p.step >= lo) & (p.step < hi)
    return p.take(np.flatnonzero(keep))


def staged_pieces(
    plan: PlanView,
    layout: LayoutView,
    epoch: int,
    lengths: Lengths,
    *,
    windows: I64 | None = None,
    targets: tuple[I64, I64] | None = None,
    steps: tuple[int, int] | None = None,
) -> Pieces:
    """The pieces of ``epoch``'s windows under the layout stages of ``layout`` (one stage: one layout).

    ``windows``: only these windows; ``targets``: only the documents ``(row_groups,
    ordinals)`` (reading the lengths of the row groups that share their lanes, and of a
    window cut again where it holds one of them); ``steps``: only steps ``[start, stop)``.
    Stage ``i`` delivers the run's tokens ``[X(s_i), X(s_{i+1}))`` (``layout.run_at``).
    """
    parts = [
        stage_pieces(plan, layout, i, epoch, lengths, windows=windows, targets=targets, steps=steps)
        for i in range(len(layout.stages))
    ]
    return Pieces.concat(parts)


def stage_steps(layout: LayoutView, i: int, steps: tuple[int, int] | None) -> tuple[int, int | None] | None:
    """The steps of stage ``i`` of ``layout`` within ``steps`` (None: none)."""
    st, end = layout.stages[i], layout.end_of(i)
    s_lo, s_hi = int(st.start), None if end is None else end[0]
    if steps is not None:
        s_lo, s_hi = max(s_lo, steps[0]), steps[1] if s_hi is None else min(s_hi, steps[1])
    return None if s_hi is not None and s_lo >= s_hi else (s_lo, s_hi)


def stage_pieces(
    plan: PlanView,
    layout: LayoutView,
    i: int,
    epoch: int,
    lengths: Lengths,
    *,
    windows: I64 | None = None,
    targets: tuple[I64, I64] | None = None,
    steps: tuple[int, int] | None = None,
    rest: bool = True,
) -> Pieces:
    """The pieces stage ``i`` of ``layout`` delivers of ``epoch`` (:func:`staged_pieces`' for one stage).

    ``plan``: the stage's view of the run (its units); ``rest``: with the window it cuts again.
    """
    span = stage_steps(layout, i, steps)
    if span is None:
        return Pieces.empty()
    s_lo, s_hi = span
    st, begins = layout.stages[i], layout.begins()
    wins = windows_meeting(plan, epoch, layout.run_at(s_lo), None if s_hi is None else layout.run_at(s_hi))
    if windows is not None:
        wins = wins[np.isin(wins, windows)]
    if not len(wins):
        return Pieces.empty()
    rw = _rest_window(plan, epoch, begins[i]) if i > 0 else None
    normal = wins[wins != rw] if rw is not None else wins
    view = LanesView(plan, int(st.lanes))
    stage = (int(st.start), int(begins[i]))
    if targets is not None:
        got = locate_pieces(view, epoch, *targets, lengths, int(st.seq_len), windows=normal, stage=stage)
    else:
        got = window_pieces(view, epoch, normal, lengths, int(st.seq_len), stage=stage)
    parts = [_steps_of(got, s_lo, s_hi)]
    if rest and rw is not None and rw in wins:
        ep = plan.epoch(epoch)
        if targets is None or np.isin(ep.order[ep.window == rw], np.unique(targets[0])).any():
            got = _steps_of(rest_pieces(plan, layout, i, epoch, rw, lengths), s_lo, s_hi)
            if targets is not None and len(got):
                want = np.unique((np.asarray(targets[0], np.int64) << 32) | np.asarray(targets[1], np.int64))
                got = got.take(np.flatnonzero(np.isin((got.row_group << 32) | got.doc, want)))
            parts.append(got)
    return Pieces.concat(parts)
