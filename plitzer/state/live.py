"""Live stages: a mixture's weights changed while the run goes on, exactly and resumably.

``loader.set_weights({"web": 1, "code": 3})`` appends a stage, as if it had been in
the list of stages from the start (SPEC section 8, docs/design.md "Live stages"). A
stage that starts at step ``s`` starts at the first window whose first token is at
or after run token ``X(s)`` (the run's tokens before step ``s``,
:meth:`planner.order.layout.Layout.run_at`); the call is allowed only where that
window is one no lane has begun to consume. Lanes run in lockstep, so before step
``t`` the lanes have consumed exactly the run's tokens ``[0, X(t))``: with ``x`` the
first token of the last window begun, the earliest allowed step is the one after the
step holding ``x`` (and after the last stage's step). Worked example: lanes
4, seq_len 8 (32 tokens a step), windows starting at run tokens 0, 70, 150, ...; at
step 3 (tokens 0..95 consumed) window 1 (70..149) is begun, so the earliest step is
70 // 32 + 1 = 3, whose stage starts at window 2 (150 >= 96).

Windows read ahead past that window hold the old plan's row groups: they are
dropped and read again (:meth:`plitzer.readpath.schedule.Schedule.changed`), so prefetch
never forbids a change.

On resume, a checkpoint whose stages are the loader's followed by more (stages added
live) gives the loader those stages: a loader built with the run's first weights
resumes the run that changed them. A checkpoint may also lack sources the loader has,
when those weigh 0 in every stage starting at or before its step (a source added
mid-run). Its positions hold as they are: such a source takes no part in the merge
until it weighs something, and the mixture's epoch counts only the sources the first
stage weighs, so no window moves or changes its (epoch, window) label.

The changes themselves are the Loader's methods (:meth:`plitzer.Loader.set_weights`,
:meth:`~plitzer.Loader.set_layout`), written here in :class:`LiveChanges`, which the Loader
mixes in; this module also holds what they and a resume ask of
plain values: the checked stage (:func:`live_stage`, :func:`layout_stage`), the earliest
step, and how a checkpoint's stages line up with a loader's (:func:`reconcile`).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from planner.balance import check_microbatches
from planner.errors import CheckpointError, ConfigError
from planner.mixing.mixture import Interleave, MixturePlan
from planner.mixing.sources import Stage, parse_stages
from planner.order.epoch import check_int
from planner.order.layout import Layout, LayoutStage
from planner.order.plan import Plan
from planner.run import Run, earliest_stage_step
from plitzer.state.build import check_layout
from plitzer.state.checkpoint import layout_of

if TYPE_CHECKING:
    from plitzer.state.resume import Cursor
    from plitzer.state.settings import LoaderSettings

__all__ = [
    "LiveChanges",
    "Reconciled",
    "earliest_layout_step",
    "earliest_step",
    "layout_stage",
    "live_stage",
    "reconcile",
    "reconcile_layout",
]


def _mixture(plan: Plan) -> MixturePlan:
    if not isinstance(plan, MixturePlan) or not isinstance(plan.order, Interleave):
        msg = (
            "set_weights() needs a mixture of two or more named sources (Loader({'web': ..., 'code': ...}, "
            "weights=...)): one dataset has no weights to change"
        )
        raise ConfigError(msg)
    return plan


def earliest_step(plan: Plan, step: int, seq_len: int) -> int:
    """The earliest step a stage may start at when the next batch is ``step`` (module docstring).

    The arithmetic is the run's (:func:`planner.run.earliest_stage_step`).
    """
    return earliest_stage_step(_mixture(plan), step, seq_len)


def live_stage(plan: Plan, weights: Mapping[str, Any] | None, at_step: int | None, step: int, seq_len: int) -> Stage:
    """The stage ``set_weights(weights, at_step)`` appends at step ``step``, checked."""
    mix = _mixture(plan)
    if weights is not None and not isinstance(weights, Mapping):
        msg = (
            f"set_weights(weights={weights!r}): give one dict of source name to weight, e.g. "
            f"{dict.fromkeys(mix.names, 1)}; call it again for each later change"
        )
        raise ConfigError(msg)
    earliest = earliest_step(plan, step, seq_len)
    if at_step is None:
        at_step = earliest
    at_step = check_int("at_step", at_step, 0, "at_step is a global step")
    if at_step < earliest:
        last = mix.stages[-1].start
        why = (
            f"the last stage starts at step {last}"
            if earliest == last + 1
            else f"the loader is at step {step}, and the window a stage at step {at_step} would start at is "
            "already being consumed"
        )
        msg = (
            f"set_weights(at_step={at_step}): {why}; the earliest allowed at_step is {earliest} "
            "(leave at_step out to get it)"
        )
        raise ConfigError(msg)
    tokens = [ix.tokens for ix in mix.mixture.parts]
    got = parse_stages(weights, mix.names, tokens)[0]
    return Stage(at_step, got.weights)


def earliest_layout_step(layout: Layout, step: int) -> int:
    """The earliest step a layout stage may start at when the next batch is ``step``: it, after the last stage."""
    return max(step, layout.stages[-1].start + 1)


def layout_stage(
    layout: Layout, lanes: int | None, seq_len: int | None, at_step: int | None, step: int, world: int
) -> LayoutStage:
    """The stage ``set_layout(lanes, seq_len, at_step)`` appends when the next batch is ``step``, checked.

    ``at_step`` defaults to the earliest allowed, the next batch's (and after the last
    stage's); ``lanes`` and ``seq_len`` to those of the last stage; ``lanes`` must be a
    multiple of ``world``.
    """
    last = layout.stages[-1]
    earliest = earliest_layout_step(layout, step)
    if at_step is None:
        at_step = earliest
    at_step = check_int("at_step", at_step, 0, "at_step is a global step")
    if at_step < earliest:
        why = (
            f"the last layout stage starts at step {last.start}"
            if earliest == last.start + 1
            else f"the loader is at step {step} (its next batch)"
        )
        msg = (
            f"set_layout(at_step={at_step}): {why}; the earliest allowed at_step is {earliest} "
            "(leave at_step out to get it)"
        )
        raise ConfigError(msg)
    b = last.lanes if lanes is None else check_int("lanes", lanes, 1, "lanes is the rows of a global batch")
    n = last.seq_len if seq_len is None else check_int("seq_len", seq_len, 1, "seq_len is tokens per row")
    if b % world:
        msg = (
            f"set_layout(lanes={b}): lanes is not divisible by world={world}; every rank must own the "
            f"same number of lanes: use lanes a multiple of {world}"
        )
        raise ConfigError(msg)
    return LayoutStage(at_step, b, n)


@dataclass(frozen=True, slots=True)
class Reconciled:
    """How a loader takes a checkpoint: the configs to compare, the stages to run (empty: its own),
    and the sources it has that the checkpoint lacked."""

    checkpoint: dict[str, Any]
    loader: dict[str, Any]
    stages: list[Stage]
    added: list[str]
    layout: list[list[int]] = field(default_factory=list)  # layout stages to run (empty: its own)


def reconcile_layout(checkpoint: Mapping[str, Any], loader: dict[str, Any], step: int) -> list[list[int]]:
    """The layout stages a loader takes from a checkpoint (empty: its own), as :func:`reconcile` does for weights.

    A checkpoint whose layout stages extend the loader's (stages added live by
    ``set_layout``) gives the loader its list; one whose stages up to ``step`` extend the
    loader's gives those, followed by the loader's stages after ``step`` when these start
    later. ``loader`` (a config) is updated to the list taken, so that comparing it with
    the checkpoint's refuses only a past that differs.
    """
    theirs, ours = layout_of(checkpoint), layout_of(loader)
    past_theirs = [x for x in theirs if x[0] <= step]
    past_ours = [x for x in ours if x[0] <= step]
    take: list[list[int]] = []
    if len(theirs) > len(ours) and theirs[: len(ours)] == ours:
        take = theirs
    elif len(past_theirs) > len(past_ours) and past_theirs[: len(past_ours)] == past_ours:
        later = [x for x in ours if x[0] > step]
        if not later or later[0][0] > past_theirs[-1][0]:
            take = [*past_theirs, *later]
    if take:
        loader["layout"] = take if len(take) > 1 else []
    return take


def _full(stages: Sequence[Sequence[Any]], names: Sequence[str]) -> list[list[Any]]:
    """Stages ``[start, {name: weight}]`` with every one of ``names`` (absent: weight 0)."""
    return [[int(x[0]), {n: int(x[1].get(n, 0)) for n in names}] for x in stages]


def reconcile(checkpoint: Mapping[str, Any], loader: Mapping[str, Any], step: int, names: Sequence[str]) -> Reconciled:
    """Line up a checkpoint's mixture fields with a loader's before they are compared.

    Sources the checkpoint lacks are accepted when the checkpoint's other sources are
    the loader's (same fingerprints) and they weigh 0 in every loader stage that starts
    at or before ``step``; the fields derived from the sources (fingerprint, column)
    are then the checkpoint's. Stages: a checkpoint whose list extends the loader's
    gives the loader its list (stages added live, later ones included); one whose
    stages up to ``step`` extend the loader's gives those, followed by the loader's
    stages after ``step`` when these start later (docs/design.md, "Live stages").
    """
    ck, mine = dict(checkpoint), dict(loader)
    if not ck.get("sources") or not mine.get("sources"):
        return Reconciled(ck, mine, [], [], reconcile_layout(ck, mine, step))
    ck_src, my_src = dict(map(tuple, ck["sources"])), dict(map(tuple, mine["sources"]))
    added: list[str] = []
    if set(ck_src) < set(my_src) and all(my_src[n] == fp for n, fp in ck_src.items()):
        added = [n for n in names if n not in ck_src]
        early = [(x[0], n, x[1][n]) for x in mine["stages"] if x[0] <= step for n in added if x[1].get(n, 0)]
        if early:
            start, name, w = early[0]
            msg = (
                f"source {name!r} is not in the checkpoint (step {step}) and weighs {w} in the stage at step "
                f"{start}: a source may join a run only with weight 0 in every stage that starts at or before "
                "the checkpoint's step; give it weight 0 there and a stage after the step"
            )
            raise CheckpointError(msg)
        for k in ("sources", "fingerprint", "column"):
            mine[k] = ck[k]
        ck["stages"] = _full(ck["stages"], names)
        mine["stages"] = _full(mine["stages"], names)
    ours, theirs = mine.get("stages", []), ck.get("stages", [])
    past_ours = [x for x in ours if x[0] <= step]
    past_theirs = [x for x in theirs if x[0] <= step]
    adopt: list[list[Any]] = []
    if len(theirs) > len(ours) and theirs[: len(ours)] == ours:
        adopt = theirs[len(ours) :]  # the run's live stages, those after the step included
    elif len(past_theirs) > len(past_ours) and past_theirs[: len(past_ours)] == past_ours:
        # Live stages up to the step that this loader lacks; its own later stages follow
        # (stages after the checkpoint's step may change, as they always could).
        later = [x for x in ours if x[0] > step]
        if not later or later[0][0] > past_theirs[-1][0]:
            adopt = past_theirs[len(past_ours) :]
            mine["stages"] = [*past_theirs, *later]
    if not adopt:
        return Reconciled(ck, mine, [], added, reconcile_layout(ck, mine, step))
    if mine["stages"] == ours:
        mine["stages"] = list(theirs)
    stages = [Stage(int(s), tuple(int(w[n]) for n in names)) for s, w in mine["stages"]]
    return Reconciled(ck, mine, stages, added, reconcile_layout(ck, mine, step))


class LiveChanges:
    """The live changes of :class:`plitzer.Loader` (mixed into it): a weight stage and a layout stage, from now on.

    Methods of the loader, kept here beside their checks; what they use of the loader is
    declared below (its lock, cursor, run and the one place the run is swapped).
    """

    if TYPE_CHECKING:
        _lock: threading.RLock
        _cursor: Cursor

        @property
        def _step(self) -> int: ...
        @property
        def _run(self) -> Run: ...
        @property
        def plan(self) -> Plan: ...
        @property
        def settings(self) -> LoaderSettings: ...
        @property
        def layout(self) -> Layout: ...

        def _check_fork(self) -> None: ...
        def _settle(self) -> None: ...
        def _set_run(self, run: Run, unit: int) -> None: ...

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
        self._settle()
        with self._lock:
            stage = live_stage(self.plan, weights, at_step, self._step, self.settings.units_per_row)
            self._set_run(*self._run.with_stage(stage))
            return stage.start

    def earliest_layout_step(self) -> int:
        """The earliest step :meth:`set_layout` may start a stage at: the next batch's, after the last stage."""
        return earliest_layout_step(self.layout, self._step)

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
        self._settle()
        with self._lock:
            stage = layout_stage(self.layout, lanes, seq_len, at_step, self._step, self.settings.world)
            s = self.settings
            check_microbatches(s.microbatches, stage.lanes, s.world, s.balance)
            layout = self.layout.with_stage(stage)
            check_layout(self.plan, self.settings, layout, [stage], rebin=self._run.rebin)
            units = layout.in_units(self.settings.rule.units_per_row)
            if stage.start == self._step:  # positions a resume left: in the old layout, no longer what comes
                self._cursor.place(self._step)
            self._set_run(*self._run.with_layout(units))
            return stage.start
