"""The run: one immutable value that answers every step, window and lane question.

Lanes run in lockstep (docs/design.md, "The order"): the cuts deal the run's tokens
to lanes like cards, so lane ``k``'s token ``p`` of a layout stage that began at run
token ``X`` is run token ``X + ((k - X) mod B) + p * B``, and at step ``t`` every lane
takes its tokens ``[t*L, (t+1)*L)``. The step alone says where every lane is. This
module is the one place that turns a step into windows, lanes and positions:

- which units (windows of the run, numbered over all epochs) step ``t`` takes tokens
  from, and so which units every lane has left (:meth:`Run.units_of_step`);
- where each lane stands before step ``t`` (:meth:`Run.positions`, the checkpoint rows
  of :meth:`Run.checkpoint_rows`, the units of :meth:`Run.start`);
- a unit's planned reads for a rank and its place in the lanes' streams
  (:meth:`Run.place`, from the plan's arrays);
- epoch labels and edges (:meth:`Run.epoch_of`, :meth:`Run.epoch_end`, :meth:`Run.steps_in_epoch`),
  and a finite run's end (:attr:`Run.steps`, :attr:`Run.last_unit`);
- the layout stage in force at a step and where it began (:meth:`Run.segment`);
- the earliest step a live weight stage may start at (:func:`earliest_stage_step`).

A :class:`Run` is never changed: a live weight stage or a layout change is
:meth:`Run.with_stages` / :meth:`Run.with_layout`, which return a new run and the first
unit the change can touch. Its caches (window ends per epoch, layout segments) live on
the value and go with it. A mixture's change is a new plan as well
(:meth:`planner.mixing.mixture.MixturePlan.with_stages`), so the run replaced still answers as
it did; one dataset's plan only records the layout stages for its tables. The loader holds
the run (``plitzer.state.resume.Now``) and swaps it in one place; the read path is given it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from planner.arraytypes import I64
from planner.errors import ConfigError
from planner.lanes import piece_range
from planner.mixing.mixture import Interleave, MixturePlan
from planner.mixing.sources import Stage
from planner.order import runsteps
from planner.order.layout import Layout
from planner.order.plan import LanesPlan, Plan
from planner.packing import stage_tokens

__all__ = [
    "NEVER",
    "Recut",
    "Run",
    "Segment",
    "Start",
    "UnitPlace",
    "earliest_stage_step",
    "lane_base",
    "lane_positions",
]


NEVER = 1 << 62  # the first unit a change touches, when it touches none


@dataclass(frozen=True, slots=True)
class Recut:
    """A layout change inside a window: from run token ``begin`` on, the rest is cut into ``lanes``."""

    lanes: int
    begin: int


@dataclass(frozen=True, slots=True)
class Segment:
    """A layout stage (:mod:`planner.order.layout`) over the run: its lanes and rows, where it began.

    ``begin_step`` and ``begin_run``: the stage's first step and the run tokens consumed
    before it. ``rest_unit``: the window holding run token ``begin_run`` strictly inside
    it, cut again at the change (-1: none, the stage began at a window's edge), first
    into ``base_lanes`` and then by ``recuts`` (every change inside that window, this
    one last; :func:`plitzer.readpath.recut.pack_rest`).
    """

    lanes: int
    seq_len: int
    begin_step: int = 0
    begin_run: int = 0
    rest_unit: int = -1
    base_lanes: int = 0
    recuts: tuple[Recut, ...] = ()


class _Epochs(Protocol):
    """What :func:`lane_positions` needs of a plan (``planner.order.plan.Plan`` has it)."""

    def epoch_of_run(self, run: int) -> int: ...

    def run_before(self, epoch: int) -> int: ...

    def epoch(self, epoch: int) -> Any: ...


class _Slices(Protocol):
    """A window's shuffled slices (``plitzer.readpath.packed.Slices``): offsets into them as pieces."""

    def positions(self, lanes: I64, offsets: I64) -> tuple[I64, I64]: ...


def lane_positions(
    plan: _Epochs, step: int, seq_len: int, lanes: int, rank_lanes: range, begin_step: int = 0, begin_run: int = 0
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
    * seq_len`` its tokens of the stage, and the window holding ``begin_run`` (the one
    cut again at the change) is counted from ``begin_run``.
    """
    ks = np.arange(rank_lanes.start, rank_lanes.stop, dtype=np.int64)
    p = (step - begin_step) * seq_len
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


def lane_base(plan: Plan, unit: int, rank_lanes: range, segment: Segment | None = None) -> I64:
    """Stream positions of ``rank_lanes`` before ``unit``: ``ceil((R - k) / B)`` after R run tokens.

    The cards rule (docs/design.md, "The order"): lane ``k`` gets run tokens ``k, k + B,
    k + 2B, ...``, so its slice of the unit is its stream positions from here on. Under a
    layout stage (``segment``), the cards begin at the stage's first run token, and
    positions count from the stage's first step times its ``seq_len`` (so that position
    ``p`` is in step ``p // seq_len``).
    """
    epoch, window = plan.unit_epoch_window(unit)
    ep = plan.epoch(epoch)
    lanes = plan.settings.lanes
    run = plan.run_before(epoch) + int(ep.window_tokens[:window].sum())
    ks = np.arange(rank_lanes.start, rank_lanes.stop, dtype=np.int64)
    if segment is None or segment.begin_run == 0:
        return stage_tokens(run, ks, lanes, 0)
    got = stage_tokens(max(run, segment.begin_run), ks, lanes, segment.begin_run)
    out = segment.begin_step * segment.seq_len + got
    return out


def earliest_stage_step(plan: MixturePlan, step: int, seq_len: int) -> int:
    """The earliest step a weight stage may start at when the next batch is ``step``.

    A stage that starts at step ``s`` starts at the first window whose first token is at
    or after run token ``X(s)``; it is allowed only where that window is one no lane has
    begun: with ``x`` the first token of the last window begun, the earliest step is the
    first step past the one holding ``x`` (:meth:`planner.order.layout.Layout.step_at_run`
    of ``x + 1``), and after the last stage's step (docs/design.md, "Live stages").
    """
    order = plan.order
    if not isinstance(order, Interleave):
        msg = "set_weights() needs a mixture of two or more named sources: one dataset has no weights to change"
        raise ConfigError(msg)
    unbegun = order.first_window_at(order.run_at(step))
    last = 0 if unbegun == 0 else order.window_start(unbegun - 1)  # the last window begun
    layout = order.layout_stages if order.layout_stages is not None else Layout.one(plan.settings.lanes, seq_len)
    begun = 0 if unbegun == 0 else layout.step_at_run(last + 1)
    return max(begun, plan.stages[-1].start + 1)


@dataclass(frozen=True, slots=True, eq=False)
class Start:
    """Where a rank's lanes stood when the scanner was placed: at ``step``, in the units ``first``.

    A unit behind some lanes' positions is needed only by the lanes at or before it
    (resuming reads what the positions need, not whole windows).
    """

    step: int
    first: I64  # the unit of each rank lane's next token

    @property
    def last(self) -> int:
        """The furthest of those units: from it on, every lane needs every unit."""
        return int(self.first.max())

    def needed(self, unit: int) -> NDArray[np.bool_] | None:
        """Which of the rank's lanes need ``unit`` (None: all of them)."""
        return None if unit >= self.last else self.first <= unit


@dataclass(frozen=True, slots=True, eq=False)
class UnitPlace:
    """One unit of the run as a rank packs it: its planned reads and where its slices lie.

    ``row_groups`` and ``token_start``: the rank's planned reads, in stream order, and
    where each starts in the window's stream; ``window_z``: the run's tokens before the
    window, mod ``lanes``; ``lane_base``: the tokens each rank lane received before it;
    ``keep``: the rank's lanes that need it (None: all); ``from_step``: the first step
    packed; ``rest``: a window cut again at a layout change, ``(run tokens before it,
    base lanes, recuts)`` (:class:`Segment`).
    """

    unit: int
    epoch: int
    window: int
    row_groups: I64
    token_start: I64
    window_tokens: int
    window_z: int
    lanes: int
    rank_lanes: range
    lane_base: I64
    seq_len: int
    seed: int | None  # the slices' shuffle seed (None: stream order, shuffle=False)
    keep: NDArray[np.bool_] | None = None
    from_step: int = 0
    rest: tuple[int, int, tuple[Recut, ...]] | None = None


@dataclass(frozen=True, slots=True, eq=False)
class Run:
    """A run's plan, layout stages and rank: every step question, answered from the footers.

    Immutable: :meth:`with_stages` and :meth:`with_layout` return a new run. The caches
    (``_ends``: window ends per epoch; ``_segs``: layout stages) belong to this value.
    """

    plan: Plan
    layout: Layout
    world: int
    rank: int
    stages: tuple[Stage, ...] | None = field(init=False)  # a mixture's weight stages (None: one dataset)
    _ends: dict[int, I64] = field(default_factory=dict, repr=False)
    _segs: dict[int, tuple[Plan, Segment]] = field(default_factory=dict, repr=False)
    _end: dict[str, int] = field(default_factory=dict, repr=False)  # a finite run's end (last_unit)

    def __post_init__(self) -> None:
        # The weight stages this run was made with (a mixture's; None for one dataset).
        object.__setattr__(self, "stages", self.plan.stages if isinstance(self.plan, MixturePlan) else None)

    # -- layout stages ---------------------------------------------------------------------

    def stage_of(self, step: int) -> int:
        """The index of the layout stage in force at global step ``step``."""
        return self.layout.index_at(step)

    def at(self, step: int) -> tuple[Plan, Segment]:
        """The stage in force at global step ``step``: its plan and :class:`Segment`."""
        return self.segment(self.layout.index_at(step))

    def rank_lanes(self, lanes: int) -> range:
        """This rank's lanes among ``lanes``."""
        per = lanes // self.world
        return range(self.rank * per, (self.rank + 1) * per)

    def lanes_at(self, step: int) -> range:
        """This rank's lanes in the stage in force at ``step``."""
        return self.rank_lanes(self.at(step)[1].lanes)

    def segment(self, i: int) -> tuple[Plan, Segment]:
        """Layout stage ``i``: the plan cut into its lanes, and where it began (docs/design.md, "Layout stages")."""
        got = self._segs.get(i)
        if got is not None:
            return got
        st = self.layout.stages[i]
        plan = self.plan if st.lanes == self.plan.settings.lanes else LanesPlan(self.plan, st.lanes)
        if i == 0:
            seg = Segment(st.lanes, st.seq_len)
        else:
            begins = self.layout.begins()
            x = begins[i]
            unit, start = self.window_at(x)
            if start == x:  # at a window's edge: nothing to cut again
                seg = Segment(st.lanes, st.seq_len, st.start, x)
            else:  # cut first as the stage in force at the window's start did, then by every change inside it
                j = max(m for m in range(i + 1) if begins[m] <= start)
                recuts = tuple(Recut(self.layout.stages[m].lanes, begins[m]) for m in range(j + 1, i + 1))
                seg = Segment(st.lanes, st.seq_len, st.start, x, unit, self.layout.stages[j].lanes, recuts)
        got = (plan, seg)
        self._segs[i] = got
        return got

    # -- steps, epochs and units -----------------------------------------------------------

    def epoch_of(self, step: int) -> int:
        """The epoch label of ``step``: ``floor(X(step) / T)`` (``X``: the run's tokens before it).

        A finite run's labels stop at its last epoch, ``epochs - 1`` (SPEC section 17).
        """
        label, n = self.layout.run_at(step) // self.plan.epoch_tokens, self.plan.settings.epochs
        return label if n is None else min(label, n - 1)

    def epoch_end(self, epoch: int) -> int:
        """The first step of epoch label ``epoch + 1`` (a finite run's steps, past its last epoch)."""
        return runsteps.epoch_start(self.plan, self.layout, epoch + 1)

    def steps_in_epoch(self, epoch: int) -> int:
        """The steps whose epoch label is ``epoch`` (:func:`planner.order.runsteps.steps_in_epoch`)."""
        return runsteps.steps_in_epoch(self.plan, self.layout, epoch)

    @property
    def steps(self) -> int | None:
        """A finite run's steps (``epochs``, SPEC section 17); None: the run never ends."""
        return runsteps.run_steps(self.plan, self.layout)

    @property
    def last_unit(self) -> int:
        """The last unit of a finite run (its lanes' streams end with it); :data:`NEVER` when it never ends."""
        if "unit" not in self._end:
            n = self.plan.settings.epochs
            self._end["unit"] = NEVER if n is None else self.plan.unit(n, 0) - 1
        return self._end["unit"]

    def _window_ends(self, epoch: int) -> I64:
        ends = self._ends.get(epoch)
        if ends is None:
            ends = np.cumsum(self.plan.epoch(epoch).window_tokens)
            if len(self._ends) > 4:
                self._ends.clear()
            self._ends[epoch] = ends
        return ends

    def window_at(self, run: int) -> tuple[int, int]:
        """The unit holding run token ``run``, and the run's tokens before that unit."""
        e = self.plan.epoch_of_run(run)
        ends = self._window_ends(e)
        start = self.plan.run_before(e)
        w = int(np.searchsorted(ends, run - start, side="right"))
        wt = int(ends[w] - (ends[w - 1] if w else 0))
        return self.plan.unit(e, w), start + int(ends[w]) - wt

    def units_of_step(self, step: int) -> tuple[int, int]:
        """The first and last unit step ``step`` takes tokens from, for this rank's lanes.

        Every lane has left the units before the first: they may be released. None past :attr:`last_unit`.
        """
        _, g = self.at(step)
        b, n = g.lanes, g.seq_len
        # Lane k's token p of the stage is run token begin + ((k - begin) mod B) + p * B.
        mine = self.rank_lanes(b)
        ks = np.arange(mine.start, mine.stop, dtype=np.int64)
        off = (ks - g.begin_run) % b
        p = (step - g.begin_step) * n
        first, _ = self.window_at(g.begin_run + int(off.min()) + p * b)
        last, _ = self.window_at(g.begin_run + int(off.max()) + (p + n - 1) * b)
        return first, min(last, self.last_unit)  # a finite run reads nothing past its end

    def positions(self, step: int, stage: int | None = None) -> I64:
        """Rows ``[lane, epoch, window, -1, offset in its slice]`` of this rank's lanes before ``step``.

        ``stage``: the layout stage to count in (default: the one in force at ``step``).
        """
        plan, g = self.segment(self.stage_of(step) if stage is None else stage)
        return lane_positions(plan, step, g.seq_len, g.lanes, self.rank_lanes(g.lanes), g.begin_step, g.begin_run)

    def start(self, step: int, stage: int) -> Start:
        """The units this rank's lanes are in before ``step``, counted in layout stage ``stage``."""
        rows = self.positions(step, stage)
        units = [self.plan.unit(int(e), int(w)) for e, w in rows[:, 1:3].tolist()]
        return Start(step, np.array(units, dtype=np.int64))

    def checkpoint_rows(self, step: int, slices: Callable[[int], _Slices]) -> I64:
        """Checkpoint rows ``[lane, epoch, window, piece, offset]`` of this rank's lanes before ``step``.

        ``slices(unit)`` turns an offset inside a slice into the shuffled piece and the
        offset in it. A lane at its slice's start is ``(0, 0)`` there (so at a layout
        stage's first step no window is needed). A lane whose stream has ended keeps piece 0 and
        its offset into the slice of the window past the run, which is not read (:attr:`last_unit`).
        """
        plan = self.at(step)[0]
        rows = self.positions(step)
        offsets = rows[:, 4].copy()
        rows[:, 3:] = 0
        inside = np.flatnonzero(offsets > 0)
        if len(inside):
            units = np.array([plan.unit(int(e), int(w)) for e, w in rows[inside, 1:3].tolist()], np.int64)
            for unit in np.unique(units).tolist():
                sel = inside[units == unit]
                if unit > self.last_unit:
                    rows[sel, 4] = offsets[sel]
                    continue
                rows[sel, 3], rows[sel, 4] = slices(int(unit)).positions(sel, offsets[sel])
        return rows

    def lane_base(self, unit: int, stage: int) -> I64:
        """Stream positions of this rank's lanes before ``unit``, in layout stage ``stage`` (:func:`lane_base`)."""
        plan, g = self.segment(stage)
        return lane_base(plan, unit, self.rank_lanes(g.lanes), g)

    # -- reads -------------------------------------------------------------------------------

    def place(self, unit: int, stage: int, start: Start) -> UnitPlace:
        """``unit`` as this rank packs it in layout stage ``stage``, after being placed at ``start``.

        The reads are the plan's (``EpochPlan.reads_of``); the window cut again at the
        stage's change reads every row group of the window; a unit behind some lanes'
        positions reads only the row groups that can hold the needed lanes' documents.
        """
        plan, g = self.segment(stage)
        epoch, window = plan.unit_epoch_window(unit)
        ep = plan.epoch(epoch)
        rest = None
        if unit == g.rest_unit:  # cut again at the layout change: every row group of the window
            positions = np.flatnonzero(ep.window == window).astype(np.int64)
            before = plan.run_before(epoch) + int(ep.window_tokens[:window].sum())
            rest = (before, g.base_lanes, g.recuts)
        else:
            positions = ep.reads_of(window, self.rank)
            if unit < start.last:
                positions = positions[self._needed_reads(plan, g, unit, positions, start)]
        return UnitPlace(
            unit=unit,
            epoch=epoch,
            window=window,
            row_groups=ep.order[positions],
            token_start=ep.token_start[positions],
            window_tokens=int(ep.window_tokens[window]),
            window_z=int(ep.window_z[window]),
            lanes=g.lanes,
            rank_lanes=self.rank_lanes(g.lanes),
            lane_base=lane_base(plan, unit, self.rank_lanes(g.lanes), g),
            seq_len=g.seq_len,
            seed=plan.settings.slice_seed,
            keep=start.needed(unit),
            from_step=start.step if unit <= start.last else g.begin_step,
            rest=rest,
        )

    def _needed_reads(self, plan: Plan, g: Segment, unit: int, positions: I64, start: Start) -> NDArray[np.bool_]:
        """Of a window's read positions, those that can hold a needed lane's documents."""
        needed = start.needed(unit)
        assert needed is not None
        epoch, window = plan.unit_epoch_window(unit)
        ep = plan.epoch(epoch)
        rgs = ep.order[positions]
        tokens, _, empty = plan.counts
        lo, hi = piece_range(ep.token_start[positions], tokens[rgs], empty[rgs])
        first = self.rank_lanes(g.lanes).start
        a = np.clip(ep.lane_of(window, lo, g.lanes) - first, 0, len(needed) - 1)
        b = np.clip(ep.lane_of(window, hi, g.lanes) - first, 0, len(needed) - 1)
        count = np.concatenate([[0], np.cumsum(needed)])
        has: NDArray[np.bool_] = count[b + 1] - count[a] > 0
        return has

    # -- changes: a new run -------------------------------------------------------------------

    def _mixture(self, what: str) -> MixturePlan:
        if not isinstance(self.plan, MixturePlan):
            msg = f"{what} needs a mixture of named sources (Loader({{'web': ..., 'code': ...}}, weights=...))"
            raise ConfigError(msg)
        return self.plan

    def with_stage(self, stage: Stage) -> tuple[Run, int]:
        """This run with weight stage ``stage`` appended (a live ``set_weights``); the first unit it changes."""
        mix = self._mixture("set_weights()")
        if stage.start <= mix.stages[-1].start:
            msg = f"a stage at step {stage.start} must start after the last one, at step {mix.stages[-1].start}"
            raise ConfigError(msg)
        plan, unit = mix.with_stages((*mix.stages, stage))
        return Run(plan, self.layout, self.world, self.rank), unit

    def with_stages(self, stages: Sequence[Stage]) -> tuple[Run, int]:
        """This run with the weight stages ``stages`` (same first one; a resume's); the first unit they change."""
        mix = self._mixture("a checkpoint's weight stages")
        if not isinstance(mix.order, Interleave):
            return self, NEVER
        plan, unit = mix.with_stages(stages)
        return Run(plan, self.layout, self.world, self.rank), unit

    def with_layout(self, layout: Layout) -> tuple[Run, int]:
        """This run with the layout stages ``layout`` (a live ``set_layout``, a resume's); the first unit touched.

        A mixture's interleave places its weight stages by the layout, so its windows
        may move from that unit on; one dataset's windows do not depend on the layout
        (:data:`NEVER`).
        """
        plan, unit = self.plan.with_layout(layout)  # one dataset's windows stay (NEVER); a mixture's may move
        return Run(plan, layout, self.world, self.rank), unit
