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
- the earliest step a live weight stage may start at (:func:`earliest_stage_step`, a mixture's).

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
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from planner.arraytypes import I64
from planner.errors import ConfigError
from planner.lanes import piece_range
from planner.mixing.mixture import Interleave, MixturePlan, earliest_stage_step
from planner.mixing.sources import Stage
from planner.order import runsteps
from planner.order.layout import Layout
from planner.order.plan import LanesPlan, Plan
from planner.order.positions import lane_base, lane_positions
from planner.order.rebin import CurrencyPlan, Rebinned, Rebinner
from planner.packing import slice_keys
from planner.rules.rebin import RestBins, rest_bins

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
    """A layout change inside a window: from run token ``begin`` on, the rest is cut into ``lanes``.

    ``tokens``: the rows' tokens from there on under a rule of bins (0 under concat); where it
    differs from the last, the rest is binned again (:mod:`planner.rules.rebin`).
    """

    lanes: int
    begin: int
    tokens: int = 0


@dataclass(frozen=True, slots=True)
class Segment:
    """A layout stage (:mod:`planner.order.layout`) over the run: its lanes and rows, where it began.

    ``begin_step`` and ``begin_run``: the stage's first step and the run tokens consumed
    before it. ``rest_unit``: the window holding run token ``begin_run`` strictly inside
    it, cut again at the change (-1: none, the stage began at a window's edge), first
    into ``base_lanes`` and then by ``recuts`` (every change inside that window, this
    one last; :func:`plitzer.readpath.recut.pack_rest`). ``base_tokens``: the rows' tokens
    when that window began, under a rule of bins (0 under concat).
    """

    lanes: int
    units_per_row: int  # the rule's units a lane's row takes (tokens under concat, one bin under best-fit)
    begin_step: int = 0
    begin_run: int = 0
    rest_unit: int = -1
    base_lanes: int = 0
    recuts: tuple[Recut, ...] = ()
    base_tokens: int = 0

    def changes(self) -> list[tuple[int, int, int]]:
        """The changes inside the rest's window, ``(lanes, begin, tokens)``, as :func:`planner.rules.rebin.rest_bins`
        takes them."""
        return [(rc.lanes, rc.begin, rc.tokens) for rc in self.recuts]


class _Slices(Protocol):
    """A window's shuffled slices (``plitzer.readpath.packed.Slices``): offsets into them as pieces."""

    def positions(self, lanes: I64, offsets: I64) -> tuple[I64, I64]: ...


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
    base lanes, recuts, base tokens)`` (:class:`Segment`); ``row_tokens``: a row's tokens
    under a rule of bins (``units_per_row`` counts units there; 0 under concat).
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
    units_per_row: int  # the rule's units a lane's row takes (its tokens are ``row_tokens`` under a rule of bins)
    seed: int | None  # the slices' shuffle seed (None: stream order, shuffle=False)
    keep: NDArray[np.bool_] | None = None
    from_step: int = 0
    rest: tuple[int, int, tuple[Recut, ...], int] | None = None
    row_tokens: int = 0


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
    rebin: Rebinner | None = None  # what a seq_len change under a rule of bins asks the runtime
    stages: tuple[Stage, ...] | None = field(init=False)  # a mixture's weight stages (None: one dataset)
    _ends: dict[tuple[int, int], I64] = field(default_factory=dict, repr=False)
    _segs: dict[int, tuple[Plan, Segment]] = field(default_factory=dict, repr=False)
    _began: dict[int, Segment] = field(default_factory=dict, repr=False)
    _cur: dict[int, Plan] = field(default_factory=dict, repr=False)
    _end: dict[str, int] = field(default_factory=dict, repr=False)  # a finite run's end (last_unit)

    def __post_init__(self) -> None:
        # The weight stages this run was made with (a mixture's; None for one dataset).
        object.__setattr__(self, "stages", self.plan.stages if isinstance(self.plan, MixturePlan) else None)
        if self.layout.changes_tokens and (self.rebin is None or self.stages is not None):
            msg = (
                "seq_len stages under packing='best-fit' are for one dataset in this release (a mixture's "
                "interleave balances bins of one length); keep one seq_len for a mixture, or change lanes only"
            )
            raise ConfigError(msg)

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
        if got is None:
            st, cur = self.layout.stages[i], self.currency(i)
            got = (cur if st.lanes == cur.settings.lanes else LanesPlan(cur, st.lanes), self.began(i))
            self._segs[i] = got
        return got

    def began(self, i: int) -> Segment:
        """Where layout stage ``i`` began, and the window it cut again (counted in the stage before's units)."""
        got = self._began.get(i)
        if got is not None:
            return got
        stages = self.layout.stages
        st = stages[i]
        if i == 0:
            got = Segment(st.lanes, st.seq_len)
        else:
            begins = self.layout.begins()
            x = begins[i]
            unit, start = self._window_at(self.currency(i - 1), x)
            if start == x:  # at a window's edge: nothing to cut again
                got = Segment(st.lanes, st.seq_len, st.start, x)
            else:  # cut first as the stage in force at the window's start did, then by every change inside it
                j = max(m for m in range(i + 1) if begins[m] <= start)
                recuts = tuple(Recut(stages[m].lanes, begins[m], stages[m].tokens) for m in range(j + 1, i + 1))
                got = Segment(st.lanes, st.seq_len, st.start, x, unit, stages[j].lanes, recuts, stages[j].tokens)
        self._began[i] = got
        return got

    def currency(self, i: int) -> Plan:
        """The plan whose units layout stage ``i`` counts: the run's, or after a ``seq_len`` change under a rule
        of bins, the plan binned at the new ``seq_len`` over the run's units so far (:mod:`planner.order.rebin`)."""
        if i == 0 or not self.layout.changes_tokens:
            return self.plan
        got = self._cur.get(i)
        if got is None:
            before = self.currency(i - 1)
            same = self.layout.stages[i].tokens == self.layout.stages[i - 1].tokens
            got = before if same else self._rebinned(i, before)
            self._cur[i] = got
        return got

    def _rebinned(self, i: int, before: Plan) -> Plan:
        """The currency of stage ``i``, whose ``seq_len`` differs from the stage before's."""
        assert self.rebin is not None  # __post_init__ refused a run without one
        g = self.began(i)
        after = self.rebin.plan_at(self.layout.stages[i].tokens)
        if g.rest_unit < 0:  # at a window's edge: the window before it ends there, nothing binned again
            e, w = before.unit_epoch_window(self._window_at(before, g.begin_run)[0] - 1)
            start, m = g.begin_run - int(before.epoch(e).window_tokens[w]), 0
        else:
            e, w = before.unit_epoch_window(g.rest_unit)
            start = self._window_at(before, g.begin_run)[1]
            m = self.rest_of(before, g, start).count
        return CurrencyPlan(Rebinned(before, after, (e, w), start, g.begin_run, m))

    def rest_of(self, plan: Plan, g: Segment, start: int) -> RestBins:
        """The rest of ``g``'s window after its changes (:func:`planner.rules.rebin.rest_bins`), from its lengths."""
        assert self.rebin is not None
        e, w = plan.unit_epoch_window(g.rest_unit)
        ep = plan.epoch(e)
        keys = slice_keys(plan.settings.slice_seed, e, w, np.arange(g.base_lanes))
        lengths = self.rebin.lengths(ep.order[ep.window == w])
        return rest_bins(self.rebin.rule, lengths, g.base_tokens, g.base_lanes, start, keys, g.changes())

    # -- steps, epochs and units -----------------------------------------------------------

    def epoch_of(self, step: int) -> int:
        """The epoch label of ``step``: ``floor(X(step) / T)`` (``X``: the run's tokens before it).

        A finite run's labels stop at its last epoch, ``epochs - 1`` (SPEC section 17).
        """
        label, n = self.labels.label_of(self.layout.run_at(step)), self.plan.settings.epochs
        return label if n is None else min(label, n - 1)

    @property
    def labels(self) -> Plan:
        """The plan that labels epochs: the last stage's currency (:meth:`currency`; the run's plan, but after a
        ``seq_len`` change under a rule of bins, whose epochs then count each epoch's own units)."""
        return self.currency(len(self.layout) - 1)

    def epoch_end(self, epoch: int) -> int:
        """The first step of epoch label ``epoch + 1`` (a finite run's steps, past its last epoch)."""
        return runsteps.epoch_start(self.labels, self.layout, epoch + 1)

    def steps_in_epoch(self, epoch: int) -> int:
        """The steps whose epoch label is ``epoch`` (:func:`planner.order.runsteps.steps_in_epoch`)."""
        return runsteps.steps_in_epoch(self.labels, self.layout, epoch)

    @property
    def steps(self) -> int | None:
        """A finite run's steps (``epochs``, SPEC section 17); None: the run never ends."""
        return runsteps.run_steps(self.labels, self.layout)

    @property
    def last_unit(self) -> int:
        """The last unit of a finite run (its lanes' streams end with it); :data:`NEVER` when it never ends."""
        if "unit" not in self._end:
            n = self.plan.settings.epochs
            self._end["unit"] = NEVER if n is None else self.plan.unit(n, 0) - 1
        return self._end["unit"]

    def _window_ends(self, plan: Plan, epoch: int) -> I64:
        ends = self._ends.get((id(plan), epoch))
        if ends is None:
            ends = np.cumsum(plan.epoch(epoch).window_tokens)
            if len(self._ends) > 4:
                self._ends.clear()
            self._ends[(id(plan), epoch)] = ends
        return ends

    def window_at(self, run: int) -> tuple[int, int]:
        """The unit holding run token ``run``, and the run's tokens before that unit (in the first stage's units)."""
        return self._window_at(self.plan, run)

    def _window_at(self, plan: Plan, run: int) -> tuple[int, int]:
        """:meth:`window_at` in ``plan``'s units (a stage's :meth:`currency`)."""
        e = plan.epoch_of_run(run)
        ends = self._window_ends(plan, e)
        start = plan.run_before(e)
        w = int(np.searchsorted(ends, run - start, side="right"))
        wt = int(ends[w] - (ends[w - 1] if w else 0))
        return plan.unit(e, w), start + int(ends[w]) - wt

    def units_of_step(self, step: int) -> tuple[int, int]:
        """The first and last unit step ``step`` takes tokens from, for this rank's lanes.

        Every lane has left the units before the first: they may be released. None past :attr:`last_unit`.
        """
        i = self.stage_of(step)
        g, cur = self.began(i), self.currency(i)
        b, n = g.lanes, g.units_per_row
        # Lane k's token p of the stage is run token begin + ((k - begin) mod B) + p * B.
        mine = self.rank_lanes(b)
        ks = np.arange(mine.start, mine.stop, dtype=np.int64)
        off = (ks - g.begin_run) % b
        p = (step - g.begin_step) * n
        first, _ = self._window_at(cur, g.begin_run + int(off.min()) + p * b)
        last, _ = self._window_at(cur, g.begin_run + int(off.max()) + (p + n - 1) * b)
        return first, min(last, self.last_unit)  # a finite run reads nothing past its end

    def positions(self, step: int, stage: int | None = None) -> I64:
        """Rows ``[lane, epoch, window, -1, offset in its slice]`` of this rank's lanes before ``step``.

        ``stage``: the layout stage to count in (default: the one in force at ``step``).
        """
        plan, g = self.segment(self.stage_of(step) if stage is None else stage)
        return lane_positions(plan, step, g.units_per_row, g.lanes, self.rank_lanes(g.lanes), g.begin_step, g.begin_run)

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
            rest = (before, g.base_lanes, g.recuts, g.base_tokens)
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
            units_per_row=g.units_per_row,
            seed=plan.settings.slice_seed,
            keep=start.needed(unit),
            from_step=start.step if unit <= start.last else g.begin_step,
            rest=rest,
            row_tokens=self.layout.stages[stage].tokens,
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
        return Run(plan, self.layout, self.world, self.rank, self.rebin), unit

    def with_stages(self, stages: Sequence[Stage]) -> tuple[Run, int]:
        """This run with the weight stages ``stages`` (same first one; a resume's); the first unit they change."""
        mix = self._mixture("a checkpoint's weight stages")
        if not isinstance(mix.order, Interleave):
            return self, NEVER
        plan, unit = mix.with_stages(stages)
        return Run(plan, self.layout, self.world, self.rank, self.rebin), unit

    def with_layout(self, layout: Layout) -> tuple[Run, int]:
        """This run with the layout stages ``layout`` (a live ``set_layout``, a resume's); the first unit touched.

        A mixture's interleave places its weight stages by the layout, so its windows
        may move from that unit on; one dataset's windows do not depend on the layout
        (:data:`NEVER`).
        """
        plan, unit = self.plan.with_layout(layout)  # one dataset's windows stay (NEVER); a mixture's may move
        return Run(plan, layout, self.world, self.rank, self.rebin), unit
