"""The Loader: one rank's view of the global batch, step by step, resumable.

Lanes run in lockstep: the cuts deal the run's tokens to lanes like cards (token
``i`` of the run goes to lane ``i mod B``, docs/design.md "The order"), so lane
``k``'s token ``P`` is run token ``P*B + k``, and at step ``t`` every lane takes its
tokens ``[t*L, (t+1)*L)``. The step alone says where every lane is: there are no
per-lane cursors. The scanner (``plitzer.scan``) packs each window step-major, so a
step that lies wholly inside one window is a view of that window's block (no
copy, no per-lane work); a step that straddles windows is assembled from their ends
by one gather (``plitzer.pack.assemble``). Units that every lane has left are
released; the scanner reads the next ones ahead, within ``budget``.

The loader owns the step, the epoch edge (the epoch label of step ``t`` is
``floor(t * lanes * seq_len / T)``) and the state; ``checkpoint`` derives each
lane's position from the step when it is called, and the positions do not depend
on the number of ranks.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any, Unpack

import numpy as np
from numpy.typing import NDArray

from planner.errors import CheckpointError, ConfigError, DataError, PerformanceWarning, UsageError
from planner.lanes import lane_positions
from planner.layout import Layout, LayoutStage
from planner.mixture import MixtureIndex, MixturePlan
from planner.parameters import document
from planner.plan import LanesPlan, Plan, check_int, row_group_counts
from plitzer import live
from plitzer import state as ckpt
from plitzer.batch import Batch, Located, Tokens
from plitzer.cost import budget_floor
from plitzer.pack import PackedUnit, Recut, Segments, Slices, assemble
from plitzer.scan import Scanner, Segment, Stats, lane_base
from plitzer.select import source_rows
from plitzer.settings import (
    Keywords,
    LoaderSettings,
    Source,
    bind,
    checkpoint_config,
    default_threads,
    make_plan,
    open_source,
    signature,
)

__all__ = ["Loader", "LoaderSettings", "budget_floor"]

I64 = NDArray[np.int64]


def open_plan(source: Source, settings: LoaderSettings) -> Plan:
    """The plan a loader of ``settings`` runs from: lists files and reads footers (the I/O)."""
    return make_plan(open_source(source, settings), settings)


def positions_at(
    plan: Plan,
    step: int,
    seq_len: int,
    rank_lanes: range,
    slices: Callable[[int], Slices],
    segment: Segment | None = None,
) -> I64:
    """Checkpoint rows ``[lane, epoch, window, piece, offset]`` of ``rank_lanes`` before ``step``.

    The step says where each lane is (:func:`planner.lanes.lane_positions`: the window
    of its next token and the offset in its slice); ``slices(unit)`` turns an offset
    inside a slice into the shuffled piece and the offset in it. A lane at its
    slice's start is ``(0, 0)`` there. ``segment``: the layout stage in force at ``step``.
    """
    lanes = plan.settings.lanes
    g = segment or Segment(lanes, seq_len)
    rows = lane_positions(plan, step, seq_len, lanes, rank_lanes, g.begin_step, g.begin_run)
    offsets = rows[:, 4].copy()
    rows[:, 3:] = 0
    inside = np.flatnonzero(offsets > 0)
    if len(inside):
        units = np.array([plan.unit(int(e), int(w)) for e, w in rows[inside, 1:3].tolist()], np.int64)
        for unit in np.unique(units).tolist():
            sel = inside[units == unit]
            rows[sel, 3], rows[sel, 4] = slices(int(unit)).positions(sel, offsets[sel])
    return rows


class LayoutSegments:
    """A run's layout stages over its plan: each stage's plan (cut into its lanes) and :class:`Segment`.

    Small and apart from the loader (it holds the plan, not the loader), so that the
    state after a batch can be encoded under the layout in force when it is read.
    """

    def __init__(self, plan: Plan, layout: Layout, world: int, rank: int) -> None:
        self.plan, self.layout, self.world, self.rank = plan, layout, world, rank
        self._segs: dict[int, tuple[Plan, Segment]] = {}

    def rank_lanes(self, seg: Segment) -> range:
        per = seg.lanes // self.world
        return range(self.rank * per, (self.rank + 1) * per)

    def at(self, step: int) -> tuple[Plan, Segment]:
        """The stage in force at global step ``step``."""
        return self.segment(self.layout.index_at(step))

    def forget(self, keep: int) -> None:
        """The plan's windows changed (a live weight stage): forget the stages after ``keep``."""
        self._segs = {i: v for i, v in self._segs.items() if i <= keep}

    def _window_at(self, run: int) -> tuple[int, int]:
        """The unit holding run token ``run`` and the run's tokens before it."""
        e = self.plan.epoch_of_run(run)
        wt = self.plan.epoch(e).window_tokens
        ends = np.cumsum(wt)
        start = self.plan.run_before(e)
        w = int(np.searchsorted(ends, run - start, side="right"))
        return self.plan.unit(e, w), start + int(ends[w] - wt[w])

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
            unit, start = self._window_at(x)
            if start == x:  # at a window's edge: nothing to cut again
                seg = Segment(st.lanes, st.seq_len, st.start, x)
            else:  # cut first as the stage in force at the window's start did, then by every change inside it
                j = max(m for m in range(i + 1) if begins[m] <= start)
                recuts = tuple(Recut(self.layout.stages[m].lanes, begins[m]) for m in range(j + 1, i + 1))
                seg = Segment(st.lanes, st.seq_len, st.start, x, unit, self.layout.stages[j].lanes, recuts)
        got = (plan, seg)
        self._segs[i] = got
        return got


@document()
class Loader:
    """Deterministic, resumable batches of full sequences for one rank.

    Parameters
    ----------
    source : str, PathLike, list, dict of named sources, or planner.Index
        Local folder or file, ``s3://bucket/prefix``, ``gs://bucket/prefix``,
        ``az://container/prefix`` (or ``abfs://``), or a list of these; a dict of
        named sources is a mixture (SPEC section 8).
    <settings>

    The settings after ``source`` are keywords (``seed`` .. ``storage_options`` may also
    be given by position, in this order); each is defined once, with its documentation,
    in :data:`planner.parameters.PARAMETERS`.

    Examples
    --------
    >>> import plitzer, plitzer.synth, tempfile, numpy as np
    >>> d = tempfile.mkdtemp(); _ = plitzer.synth.write(d, tokens=100_000, seed=0)
    >>> loader = plitzer.Loader(d, seed=0, lanes=8, window=4, seq_len=128)
    >>> batch = next(iter(loader))
    >>> np.from_dlpack(batch.tokens).shape, batch.step, loader.step
    ((8, 128), 0, 1)
    >>> state = loader.checkpoint()
    >>> other = plitzer.Loader(d, seed=0, lanes=8, window=4, seq_len=128, world=2, rank=1)
    >>> other.resume(state)
    >>> np.array_equal(next(iter(other)).tokens[:], next(iter(loader)).tokens[4:])
    True
    """

    def __init__(self, source: Source, *args: Any, **settings: Unpack[Keywords]) -> None:
        cfg = LoaderSettings.of(**bind("Loader", args, settings))
        self._build(open_plan(source, cfg), cfg)

    @classmethod
    def from_settings(cls, source: Source, settings: LoaderSettings) -> Loader:
        """A Loader of already-built settings (what torch.Dataset, explain and the CLI use)."""
        return cls.from_plan(open_plan(source, settings), settings)

    @classmethod
    def from_plan(cls, plan: Plan, settings: LoaderSettings) -> Loader:
        """A Loader that runs ``plan`` (no I/O: the footers are in the plan's index).

        ``plan`` must have been made for ``settings`` (:func:`open_plan`); no thread
        starts before the first batch.
        """
        loader = cls.__new__(cls)
        loader._build(plan, settings)
        return loader

    def _build(self, plan: Plan, settings: LoaderSettings) -> None:
        self.settings = settings
        s = settings
        budget = s.budget
        self.plan = plan
        self.index = plan.dataset
        self.tokens = plan.tokens
        self.epoch_tokens = plan.epoch_tokens  # T; less than tokens for a mixture whose first stage weighs a source 0
        if self.tokens == 0:
            msg = f"dataset {self.index.source!r} has no tokens (every document is empty); nothing to train on"
            raise DataError(msg)
        self.layout: Layout = s.stages
        frame = self.index.frame
        tok, rows, _ = row_group_counts(self.index)  # the selected ones where selected
        inflight = self._check_layout(self.layout, self.layout.stages, tok, rows)
        if budget < inflight:
            # Works, but the next window is read only once the current one is released:
            # decoding and training take turns instead of overlapping.
            warnings.warn(
                f"budget={budget:,} bytes holds the windows a step uses but not the next one as well, so "
                f"reads wait for the consumer; set budget to at least {inflight:,} bytes for two windows in "
                "flight (docs/design.md, 'The budget')",
                PerformanceWarning,
                stacklevel=4,
            )
        self._doc_base = np.cumsum(rows) - rows
        self._files = frame["file"].to_numpy()
        self._row_groups = frame["row_group"].to_numpy()
        self._sources = frame["source"].to_numpy() if isinstance(self.index, MixtureIndex) else None
        threads = s.threads or default_threads(self.index)
        self._scanner = Scanner(plan, rank=s.rank, budget=budget, threads=threads, seq_len=s.seq_len)
        self._layouts = LayoutSegments(plan, self.layout, s.world, s.rank)
        self._seg = 0
        self._pid = os.getpid()
        self._lock = threading.RLock()
        self._window_ends: dict[int, I64] = {}
        self._config = self._make_config()
        # What batches' states after them record (set_weights and set_layout renew it).
        self._cell: list[Any] = [self._config, self._layouts]
        self._place(0)

    def _check_layout(
        self, layout: Layout, new: Sequence[LayoutStage], tok: I64 | None = None, rows: I64 | None = None
    ) -> int:
        """Refuse stages ``new`` of ``layout`` that the data or the budget cannot hold.

        Returns the bytes that two windows in flight need (below them, a warning).

        The floor is every stage's (the scanner packs one layout stage at a time; docs/design.md,
        "Layout stages"), named with the stage that needs the most.
        """
        s = self.settings
        if tok is None or rows is None:
            tok, rows, _ = row_group_counts(self.index)
        big = max(new, key=lambda st: st.lanes)
        if self.tokens < big.lanes:
            msg = (
                f"lanes={big.lanes} exceeds the dataset's {self.tokens} tokens: some lanes could never "
                "receive a document. Lower lanes (or use more data)"
            )
            raise ConfigError(msg)
        floors = [(budget_floor(tok, rows, lanes=st.lanes, window=s.window, seq_len=st.seq_len), st) for st in new]
        (need, units), worst = max(floors, key=lambda f: f[0][0])
        if s.budget < need:
            stage = (
                f" of the layout stage from step {worst.start} ({worst.lanes} lanes of {worst.seq_len} tokens)"
                if layout.staged
                else ""
            )
            msg = (
                f"budget={s.budget:,} bytes cannot hold the windows one step{stage} can touch: up to {need:,} bytes "
                f"({units} windows of the largest row groups, decoded and packed: the window in use and the "
                f"next, and any window shorter than a step). Raise budget to at least {need:,}, or lower window"
            )
            raise ConfigError(msg)
        inflight, _ = budget_floor(tok, rows, lanes=worst.lanes, window=s.window, seq_len=worst.seq_len, ahead=1)
        return int(inflight)

    def _relayout(self, layout: Layout) -> None:
        """Run ``layout`` from now on (a live stage, a resume's): the plan, the segments, the config."""
        old = self.layout
        self.layout = layout
        self.settings = replace(self.settings, layout=layout)
        unit = self.plan.relayout(layout) if isinstance(self.plan, MixturePlan) else None
        self.plan.layout = layout
        self._window_ends.clear()
        keep = self._layouts
        self._layouts = LayoutSegments(self.plan, layout, self.settings.world, self.settings.rank)
        for i in range(min(len(old), len(layout))):  # the stages both share keep their (computed) segments
            if old.stages[i] != layout.stages[i] or unit is not None:
                break
            if i in keep._segs:
                self._layouts._segs[i] = keep._segs[i]
        if unit is not None:
            self._scanner.replan_from(unit)
        self._config = self._make_config()
        self._cell[0], self._cell[1] = self._config, self._layouts

    # -- state -----------------------------------------------------------------

    @property
    def config(self) -> dict[str, Any]:
        """The settings that fix the order, as a checkpoint records them."""
        return dict(self._config)

    def _make_config(self) -> dict[str, Any]:
        return checkpoint_config(self.plan, self.settings)

    @property
    def step(self) -> int:
        """Global step of the next batch."""
        return self._step

    @property
    def epoch(self) -> int:
        """Epoch label of the next batch."""
        return self._epoch_of(self._step)

    def _epoch_of(self, step: int) -> int:
        """``floor(X(step) / T)``: the run's tokens before the step (``step * lanes * seq_len`` in one layout)."""
        return self.layout.run_at(step) // self.epoch_tokens

    def __len__(self) -> int:
        """Batches left in the current epoch."""
        end = self.layout.step_at_run((self.epoch + 1) * self.epoch_tokens)
        return end - self._step

    # -- layout stages -------------------------------------------------------------

    @property
    def rank_lanes(self) -> range:
        """This rank's lanes in the layout stage of the next batch."""
        return self._layouts.rank_lanes(self._layouts.at(self._step)[1])

    @property
    def seq_len(self) -> int:
        """Tokens per row in the layout stage of the next batch."""
        return self._segment(self.layout.index_at(self._step))[1].seq_len

    @property
    def lanes(self) -> int:
        """Lanes (rows of the global batch) in the layout stage of the next batch."""
        return self._segment(self.layout.index_at(self._step))[1].lanes

    def _segment(self, i: int) -> tuple[Plan, Segment]:
        """Layout stage ``i``: the plan cut into its lanes, and where it began (:class:`LayoutSegments`)."""
        return self._layouts.segment(i)

    def _enter(self, step: int) -> None:
        """Make the scanner pack the layout stage of ``step`` (then reset it)."""
        self._seg = self.layout.index_at(step)
        plan, seg = self._segment(self._seg)
        self._scanner.set_segment(plan, seg)

    @property
    def stats(self) -> Stats:
        """Bytes held (and by batches the caller still holds), peak, units in flight, reads, waits, retries."""
        return self._scanner.stats

    @property
    def held_bytes(self) -> int:
        """Decoded bytes held now (prefetched and queued)."""
        return self._scanner.held_bytes

    @property
    def peak_bytes(self) -> int:
        """Most decoded bytes held at once since construction."""
        return self._scanner.peak_bytes

    @property
    def reads(self) -> int:
        """Row groups read so far (one ranged read each)."""
        return self._scanner.rows_read

    def _place(self, step: int) -> None:
        """Make ``step`` the next step: forget the units in use, start over from the footers."""
        self._step = step
        self._cur: PackedUnit | None = None
        self._cur_block: NDArray[Any] | None = None
        self._resumed: NDArray[np.int64] | None = None
        self._checks: dict[int, tuple[I64, I64, I64, I64]] = {}
        self._enter(step)
        self._scanner.reset(step)

    def _unit_of_run(self, run: int) -> int:
        """The unit holding run token ``run``."""
        e = self.plan.epoch_of_run(run)
        ends = self._window_ends.get(e)
        if ends is None:
            ends = np.cumsum(self.plan.epoch(e).window_tokens)
            if len(self._window_ends) > 4:
                self._window_ends.clear()
            self._window_ends[e] = ends
        w = int(np.searchsorted(ends, run - self.plan.run_before(e), side="right"))
        return self.plan.unit(e, w)

    def _units_of_step(self, step: int) -> tuple[int, int]:
        """The first and last unit step ``step`` takes tokens from, for this rank's lanes."""
        _, g = self._segment(self._seg)
        b, n = g.lanes, g.seq_len
        # Lane k's token p of the stage is run token begin + ((k - begin) mod B) + p * B.
        mine = self._scanner.rank_lanes
        ks = np.arange(mine.start, mine.stop, dtype=np.int64)
        off = (ks - g.begin_run) % b
        p = (step - g.begin_step) * n
        first = self._unit_of_run(g.begin_run + int(off.min()) + p * b)
        last = self._unit_of_run(g.begin_run + int(off.max()) + (p + n - 1) * b)
        return first, last

    def _get(self, unit: int) -> PackedUnit:
        """The packed ``unit``, checking the positions a resume left to check there."""
        u = self._scanner.get(unit)
        check = self._checks.get(unit)
        if check is not None:
            lanes, pieces, offsets, want = check
            got = u.slices.offsets(lanes, pieces, offsets)
            bad = np.flatnonzero(got != want)
            if len(bad):
                i = int(bad[0])
                lane, where = int(lanes[i]), f"(piece {int(pieces[i])}, offset {int(offsets[i])})"
                sl = u.slices
                n = int(sl.lane_piece[lane + 1] - sl.lane_piece[lane])
                size = int(sl.lane_start[lane + 1] - sl.lane_start[lane])
                problem = (
                    f"is past its slice of {n} pieces ({size} tokens)"
                    if got[i] < 0
                    else f"is not where step {self._step} puts it (token {int(want[i])} of its slice)"
                )
                msg = (
                    f"checkpoint position of lane {self._scanner.rank_lanes.start + lane} {where} in epoch {u.epoch} "
                    f"window {u.window} {problem}: the checkpoint does not belong to this dataset or settings"
                )
                raise CheckpointError(msg)
            del self._checks[unit]
        return u

    def checkpoint(self) -> bytes:
        """This rank's state: its lanes' positions before the next batch."""
        self._check_fork()
        with self._lock:
            rows = self._resumed
            if rows is None:
                # At a layout stage's first step every lane is at a slice's start: no window needed.
                plan, g = self._layouts.at(self._step)
                rows = positions_at(
                    plan, self._step, g.seq_len, self.rank_lanes, lambda u: self._get(u).slices, segment=g
                )
            return ckpt.encode(ckpt.State(self._config, self._step, rows))

    def _state_after(self, step: int, units: dict[int, Slices]) -> Callable[[], bytes]:
        """The checkpoint right after step ``step``, encoded when called.

        Lanes inside a slice after the step are in windows the step took tokens
        from, whose slices ``units`` holds (small tables: not the tokens).
        """
        cell = self._cell

        def encode() -> bytes:  # holds the plan and small tables, not the loader
            layouts: LayoutSegments = cell[1]
            plan, g = layouts.at(step + 1)
            lanes = layouts.rank_lanes(g)
            rows = positions_at(plan, step + 1, g.seq_len, lanes, units.__getitem__, segment=g)
            return ckpt.encode(ckpt.State(cell[0], step + 1, rows))

        return encode

    def set_weights(self, weights: Mapping[str, Any] | None, at_step: int | None = None) -> int:
        """Append a stage of ``weights`` from global step ``at_step``; the step it starts at.

        A live change of the mixture (docs/design.md, "Live stages"): the run is the one
        made with this stage in the list of stages from the start, and the stage is in
        every later checkpoint, the plan tables and the audit. ``at_step`` defaults to
        the earliest allowed, the first step whose window no lane has begun to consume
        (windows read ahead past it are read again); an earlier one is a ConfigError
        naming it. Every rank must make the same call at the same step
        (:meth:`plitzer.torch.Dataset.set_weights` checks it).

        Examples
        --------
        >>> import plitzer, plitzer.synth, tempfile
        >>> a, b = tempfile.mkdtemp(), tempfile.mkdtemp()
        >>> _ = plitzer.synth.write(a, tokens=60_000, seed=1); _ = plitzer.synth.write(b, tokens=60_000, seed=2)
        >>> loader = plitzer.Loader({"a": a, "b": b}, weights={"a": 1, "b": 1}, lanes=4, window=2, seq_len=64)
        >>> _ = [loader.next_batch() for _ in range(3)]
        >>> start = loader.set_weights({"a": 3, "b": 1})
        >>> start >= loader.step - 3, loader.config["stages"][-1] == [start, {"a": 3, "b": 1}]
        (True, True)
        >>> loader.close()
        """
        self._check_fork()
        with self._lock:
            s = self.settings
            stage = live.live_stage(self.plan, weights, at_step, self._step, s.seq_len)
            assert isinstance(self.plan, MixturePlan)
            unit = self.plan.add_stage(stage)
            self._window_ends.clear()
            self._layouts.forget(self._seg)
            self._scanner.replan_from(unit)
            self._config = self._make_config()
            self._cell[0] = self._config
            return stage.start

    def earliest_layout_step(self) -> int:
        """The earliest step :meth:`set_layout` may start a stage at: the next batch's, after the last stage."""
        return max(self._step, self.layout.stages[-1].start + 1)

    def set_layout(self, lanes: int | None = None, seq_len: int | None = None, at_step: int | None = None) -> int:
        """Append a layout stage: ``lanes`` rows of ``seq_len`` tokens from global step ``at_step``; the step.

        A live change of the layout (docs/design.md, "Layout stages"): the run is the one
        made with this stage in ``lanes=``/``seq_len=`` from the start (the rule of SPEC
        section 12 applies at the step exactly, so no window needs to be unbegun), and the
        stage is in every later checkpoint and the plan. ``lanes`` and ``seq_len`` default
        to those in force; ``at_step`` to the earliest allowed, the next batch's step (and
        after the last stage's); an earlier one is a ConfigError naming it. ``lanes`` must
        be a multiple of the world size, and the budget must hold the new layout's floor.
        Every rank must make the same call at the same step
        (:meth:`plitzer.torch.Dataset.set_layout` checks it).

        Examples
        --------
        >>> import plitzer, plitzer.synth, tempfile
        >>> d = tempfile.mkdtemp(); _ = plitzer.synth.write(d, tokens=60_000, seed=1)
        >>> loader = plitzer.Loader(d, lanes=4, window=2, seq_len=64)
        >>> _ = [loader.next_batch() for _ in range(3)]
        >>> loader.set_layout(lanes=2, seq_len=256)
        3
        >>> loader.next_batch().tokens.shape, loader.config["layout"]
        ((2, 256), [[0, 4, 64], [3, 2, 256]])
        >>> loader.close()
        """
        self._check_fork()
        with self._lock:
            last = self.layout.stages[-1]
            earliest = self.earliest_layout_step()
            if at_step is None:
                at_step = earliest
            at_step = check_int("at_step", at_step, 0, "at_step is a global step")
            if at_step < earliest:
                why = (
                    f"the last layout stage starts at step {last.start}"
                    if earliest == last.start + 1
                    else f"the loader is at step {self._step} (its next batch)"
                )
                msg = (
                    f"set_layout(at_step={at_step}): {why}; the earliest allowed at_step is {earliest} "
                    "(leave at_step out to get it)"
                )
                raise ConfigError(msg)
            b = last.lanes if lanes is None else check_int("lanes", lanes, 1, "lanes is the rows of a global batch")
            n = last.seq_len if seq_len is None else check_int("seq_len", seq_len, 1, "seq_len is tokens per row")
            world = self.settings.world
            if b % world:
                msg = (
                    f"set_layout(lanes={b}): lanes is not divisible by world={world}; every rank must own the "
                    f"same number of lanes: use lanes a multiple of {world}"
                )
                raise ConfigError(msg)
            stage = LayoutStage(at_step, b, n)
            layout = Layout((*self.layout.stages, stage))
            self._check_layout(layout, [stage])
            if at_step == self._step:  # positions a resume left: in the old layout, no longer what comes
                self._resumed, self._checks = None, {}
            self._relayout(layout)
            return at_step

    def seek(self, step: int) -> None:
        """Jump to global step ``step``, as if every step before it had been taken.

        No checkpoint is needed and nothing is replayed: lane ``k``'s next token is
        run token ``step * seq_len * lanes + k`` (the cuts deal tokens like cards), so
        its window and the offset in its slice follow from the windows' token counts.
        Only the windows those positions need are read.
        """
        self._check_fork()
        step = check_int("step", step, 0, "steps count from 0")
        with self._lock:
            self._place(step)

    def resume(self, state: bytes) -> None:
        """Continue from a checkpoint taken at any world size.

        ``state`` is a merged global checkpoint, or any part that covers this
        rank's lanes. A checkpoint of other settings or another dataset is
        refused with every differing field.
        """
        self._check_fork()
        st = ckpt.decode(state)
        fit = self.fit(st)
        mine = np.arange(self.lanes_after(fit, st.step).start, self.lanes_after(fit, st.step).stop)
        lanes = st.positions[:, 0]
        idx = np.searchsorted(lanes, mine)
        ok = (idx < len(lanes)) & (lanes[np.minimum(idx, len(lanes) - 1)] == mine)
        if not ok.all():
            missing = mine[~ok]
            msg = (
                f"checkpoint lacks lanes {missing[:10].tolist()} of rank {self.settings.rank}; "
                "resume from plitzer.merge(parts of every rank)"
            )
            raise CheckpointError(msg)
        rows = st.positions[idx]
        with self._lock:
            stages = self.plan.stages if isinstance(self.plan, MixturePlan) else None
            layout = self.layout
            self.take_stages(fit)
            try:
                checks = self._check_positions(st.step, rows)
            except BaseException:
                # A refused resume leaves the loader as it was: its own stages back.
                if fit.layout:
                    self._relayout(layout)
                if fit.stages and isinstance(self.plan, MixturePlan) and stages is not None:
                    self.plan.restage(stages)
                    self._window_ends.clear()
                    self._config = self._make_config()
                    self._cell[0] = self._config
                raise
            self._place(st.step)
            self._resumed = rows
            self._checks = checks

    def fit(self, st: ckpt.State, what: str = "checkpoint") -> live.Reconciled:
        """How checkpoint ``st`` lines up with this loader; a mismatch is refused with every differing field.

        Stages the checkpoint has after this loader's (added live by the run that wrote
        it) and sources it lacks that weigh 0 up to its step are accepted (:mod:`plitzer.live`).
        """
        names = self.plan.names if isinstance(self.plan, MixturePlan) else []
        fit = live.reconcile(st.config, self.config, st.step, names)
        diffs = ckpt.diff_config(fit.checkpoint, fit.loader, step=st.step)
        diffs += ckpt.diff_revisions(fit.checkpoint, fit.loader)
        if diffs:
            msg = f"{what} does not match this loader: " + "; ".join(diffs)
            raise CheckpointError(msg)
        return fit

    def lanes_after(self, fit: live.Reconciled, step: int) -> range:
        """This rank's lanes at ``step`` once checkpoint ``fit`` is taken (its layout stages, where it brings them)."""
        runs = Layout.from_config(fit.layout) if fit.layout else self.layout
        per = runs.at(step).lanes // self.settings.world
        return range(self.settings.rank * per, (self.settings.rank + 1) * per)

    def take_stages(self, fit: live.Reconciled) -> None:
        """Run the stages a checkpoint brought (its live ones; before placing the loader)."""
        if fit.layout:
            layout = Layout.from_config(fit.layout)
            with self._lock:
                self._check_layout(layout, layout.stages)
                self._relayout(layout)
        if not fit.stages:
            return
        assert isinstance(self.plan, MixturePlan)
        with self._lock:
            self.plan.restage(fit.stages)
            self._window_ends.clear()
            self._config = self._make_config()
            self._cell[0] = self._config

    def _check_positions(self, step: int, rows: I64) -> dict[int, tuple[I64, I64, I64, I64]]:
        """Refuse positions that are not where ``step`` puts the lanes; what needs the pieces, later.

        Lanes run in lockstep, so a checkpoint's positions follow from its step.
        A position at a slice's start (piece 0, offset 0) is checked from the footers;
        one inside a slice must be in the lane's window, and its piece and offset are
        checked when that window is packed (:meth:`_get`).
        """
        plan, g = self._segment(self.layout.index_at(step))
        per = g.lanes // self.settings.world
        rank_lanes = range(self.settings.rank * per, (self.settings.rank + 1) * per)
        for _, e, w, _, _ in rows.tolist():
            nw = self.plan.windows_in(e)
            if w >= nw:
                msg = f"checkpoint position window {w} is out of range: epoch {e} of the dataset has {nw} windows"
                raise CheckpointError(msg)
        want = lane_positions(plan, step, g.seq_len, g.lanes, rank_lanes, g.begin_step, g.begin_run)
        at_start = (rows[:, 3] == 0) & (rows[:, 4] == 0)
        later: dict[int, list[int]] = {}
        for i in range(len(rows)):
            e, w = int(rows[i, 1]), int(rows[i, 2])
            unit = self.plan.unit(e, w)
            if at_start[i]:
                if int(lane_base(plan, unit, rank_lanes, g)[i]) != step * g.seq_len:
                    self._refuse(rows[i], step, want[i])
            elif (e, w) != (int(want[i, 1]), int(want[i, 2])):
                self._refuse(rows[i], step, want[i])
            else:
                later.setdefault(unit, []).append(i)
        checks: dict[int, tuple[I64, I64, I64, I64]] = {}
        for unit, sel in later.items():
            ix = np.array(sel, np.int64)
            checks[unit] = (ix, rows[ix, 3], rows[ix, 4], want[ix, 4])
        return checks

    def _refuse(self, row: I64, step: int, want: I64) -> None:
        msg = (
            f"checkpoint position of lane {int(row[0])} (epoch {int(row[1])}, window {int(row[2])}, piece "
            f"{int(row[3])}, offset {int(row[4])}) is not where step {step} puts it (epoch {int(want[1])}, "
            f"window {int(want[2])}, token {int(want[4])} of its slice): the checkpoint does not belong to "
            "this dataset or settings"
        )
        raise CheckpointError(msg)

    # -- iteration ---------------------------------------------------------------

    def __iter__(self) -> Iterator[Batch]:
        """The rest of the current epoch; the next loop gives the next epoch."""
        epoch = self.epoch
        while self.epoch == epoch:
            yield self.next_batch()

    def next_batch(self) -> Batch:
        """The batch of the next step, whatever its epoch.

        A step is all or nothing: if it is interrupted (KeyboardInterrupt, a storage
        error), the step does not advance, so ``checkpoint()`` still describes the
        batch that was not delivered and a retry resumes cleanly.
        """
        self._check_fork()
        with self._lock:
            return self._next_batch()

    def _next_batch(self) -> Batch:
        t = self._step
        if self._seg != self.layout.index_at(t):  # a layout stage begins: the scanner packs its lanes
            self._cur, self._cur_block = None, None
            self._enter(t)
            self._scanner.reset(t)
        cur = self._cur
        if cur is not None and cur.t0 <= t < cur.t1:  # the common case: a view of the block
            assert self._cur_block is not None
            return self._deliver(t, self._cur_block[t - cur.t0], functools.partial(cur.segments, t), [cur])
        first, last = self._units_of_step(t)
        if first == last:
            u = self._get(first)
            if u.t0 <= t < u.t1:
                self._cur, self._cur_block = u, u.block
                return self._deliver(t, self._cur_block[t - u.t0], functools.partial(u.segments, t), [u])
        units = [self._get(x) for x in range(first, last + 1)]
        tokens, segments = assemble(units, t, len(self._scanner.rank_lanes), self._scanner.seq_len)
        self._cur, self._cur_block = None, None
        return self._deliver(t, tokens, segments, units)

    def _deliver(
        self,
        t: int,
        tokens: NDArray[Any],
        segments: Segments | Callable[[], Segments],
        units: list[PackedUnit],
    ) -> Batch:
        """Advance past step ``t`` (which took tokens from ``units``); release what no lane needs."""
        after = self._state_after(t, {u.unit: u.slices for u in units})
        self._step = t + 1
        self._resumed = None
        cur = self._cur
        if (cur is None or not (cur.t0 <= t + 1 < cur.t1)) and self.layout.index_at(t + 1) == self._seg:
            nxt, _ = self._units_of_step(t + 1)
            if cur is not None and cur.unit < nxt:
                self._cur, self._cur_block = None, None
            self._scanner.release_before(nxt)
        return Batch(
            tokens=tokens.view(Tokens),
            step=t,
            epoch=self._epoch_of(t),
            lanes=self._scanner.rank_lanes,
            _segments=segments,
            _locate=self._locate,
            _after=after,
        )

    def _locate(self, doc_ids: NDArray[np.int64]) -> Located:
        rg = np.searchsorted(self._doc_base, doc_ids, side="right") - 1
        return (
            self._files[rg].tolist(),
            self._row_groups[rg].astype(np.int64),
            source_rows(self.index, rg, (doc_ids - self._doc_base[rg]).astype(np.int64)),
            None if self._sources is None else self._sources[rg].tolist(),
        )

    # -- lifecycle ---------------------------------------------------------------

    def _check_fork(self) -> None:
        if os.getpid() != self._pid:
            msg = (
                "this Loader was created in another process and its reader threads did not "
                "survive fork(); create the Loader in the process that uses it (with PyTorch: "
                "num_workers=0)"
            )
            raise UsageError(msg)

    def close(self) -> None:
        """Stop the reader threads and free every buffer."""
        self._scanner.close()
        self._cur, self._cur_block = None, None

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # At interpreter exit the threading machinery may already be torn down; the
        # process is ending anyway, so there is nothing to stop.
        if sys.is_finalizing():
            return
        scanner = getattr(self, "_scanner", None)
        if scanner is not None and getattr(self, "_pid", None) == os.getpid():
            scanner.close()

    def __repr__(self) -> str:
        s = self.settings
        return (
            f"Loader(step={self._step}, epoch={self.epoch}, lanes={self.lanes}, seq_len={self.seq_len}, "
            f"window={s.window}, rank={s.rank}, world={s.world}, tokens={self.tokens:,})"
        )


_SELF_SOURCE = [
    inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
    inspect.Parameter("source", inspect.Parameter.POSITIONAL_OR_KEYWORD),
]
Loader.__init__.__signature__ = signature(before=_SELF_SOURCE)  # type: ignore[attr-defined]  # help() and IDEs
