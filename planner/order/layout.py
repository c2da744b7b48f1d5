"""Layout stages: ``lanes`` and ``seq_len`` that change at global steps (SPEC section 12).

A layout is a list of stages ``(start step, lanes, seq_len)`` from step 0. Stage ``i``
runs the steps ``[s_i, s_{i+1})`` with ``B_i`` lanes of ``L_i`` tokens, so the run
tokens consumed before step ``t`` are ``X(t) = sum of (steps of each earlier stage) *
B * L`` (:meth:`Layout.run_at`). At the change to stage ``i`` the lanes have consumed
exactly the run's tokens ``[0, X_i)``; the window holding run token ``X_i`` (the last one
begun) is cut again: what the old lanes have not consumed of it (lane 0's rest first,
each in the order it would have packed it) is a stream of ``T = R_{b+1} - X_i`` tokens
cut into ``B_i`` lanes by the rule of section 3.4 with ``z = X_i mod B_i`` and no
second shuffle; later windows are cut into ``B_i`` lanes as usual. From the change on,
run token ``x >= X_i`` goes to lane ``x mod B_i`` (cards again), so lane ``k`` of stage
``i`` has received ``ceil((x - k) / B_i) - ceil((X_i - k) / B_i)`` tokens of the stage
once the run has ``x`` (:func:`stage_tokens`). docs/design.md, "Layout stages", has a
worked example.

>>> lay = Layout.of(lanes=[(0, 4), (3, 2)], seq_len=[(0, 8), (3, 32)])
>>> lay.stages
(LayoutStage(start=0, lanes=4, seq_len=8), LayoutStage(start=3, lanes=2, seq_len=32))
>>> lay.run_at(3), lay.run_at(5), lay.step_at_run(97)
(96, 224, 4)

The same questions for many steps or tokens at once (the audit's tables, locate's
pieces) are :meth:`Layout.runs_at`, :meth:`Layout.steps_at_runs`,
:meth:`Layout.steps_holding` and :meth:`Layout.indices_at`:

>>> lay.runs_at([0, 3, 5]).tolist(), lay.steps_holding([95, 96, 159, 160]).tolist()
([0, 96, 224], [2, 3, 3, 4])

This module is the one place that turns steps into the run's tokens and back: a run
of one ``lanes`` and one ``seq_len`` is a layout of one stage (:meth:`Layout.one`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from planner.arraytypes import I64
from planner.errors import ConfigError
from planner.packing import stage_tokens

__all__ = ["Layout", "LayoutStage", "parse_values", "stage_tokens"]


@dataclass(frozen=True, slots=True)
class LayoutStage:
    """From global step ``start`` on: ``lanes`` sequences of ``seq_len`` tokens a step.

    In a packing rule's units (:meth:`Layout.in_units`), ``seq_len`` counts units a row and
    ``tokens`` the tokens of a row (0: the units are tokens).
    """

    start: int
    lanes: int
    seq_len: int
    tokens: int = field(default=0, repr=False)

    @property
    def per_step(self) -> int:
        return self.lanes * self.seq_len


def _is_int(v: object) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def parse_values(name: str, value: object, fix: str) -> list[tuple[int, int]]:
    """``lanes=`` or ``seq_len=`` as stages ``[(step, value), ...]`` (an int is one stage from 0), checked."""
    if _is_int(value):
        if int(value) < 1:  # type: ignore[call-overload]
            msg = f"{name}={value} must be >= 1; {fix}"
            raise ConfigError(msg)
        pairs: list[tuple[Any, Any]] = [(0, value)]
    elif (
        isinstance(value, (list, tuple)) and value and all(isinstance(p, (list, tuple)) and len(p) == 2 for p in value)
    ):
        pairs = [(p[0], p[1]) for p in value]
    else:
        msg = f"{name}={value!r} must be an integer >= 1, or stages [(global step, value), ...] from step 0; {fix}"
        raise ConfigError(msg)
    out: list[tuple[int, int]] = []
    for step, v in pairs:
        if not _is_int(step) or step < 0:
            msg = f"{name}: stage step {step!r} must be an integer >= 0 (a global step); {fix}"
            raise ConfigError(msg)
        if not _is_int(v) or v < 1:
            msg = f"{name}={v!r} (the stage at step {step}) must be an integer >= 1; {fix}"
            raise ConfigError(msg)
        if out and step <= out[-1][0]:
            msg = f"{name}: stage steps must increase, got {step} after {out[-1][0]}; {fix}"
            raise ConfigError(msg)
        out.append((int(step), int(v)))
    if out[0][0] != 0:
        msg = f"{name}: the first stage must start at step 0, got {out[0][0]}; give (0, value) first. {fix}"
        raise ConfigError(msg)
    return out


@dataclass(frozen=True, slots=True)
class Layout:
    """The layout stages of a run (one stage when ``lanes`` and ``seq_len`` are ints)."""

    stages: tuple[LayoutStage, ...]

    @classmethod
    def of(cls, *, lanes: object, seq_len: object) -> Layout:
        """The stages of ``lanes`` and ``seq_len`` (each an int or ``[(step, value), ...]``), merged."""
        lv = parse_values("lanes", lanes, "lanes is the number of sequences per global batch")
        sv = parse_values("seq_len", seq_len, "seq_len is the tokens per sequence, e.g. 2048")
        steps = sorted({s for s, _ in lv} | {s for s, _ in sv})
        out: list[LayoutStage] = []
        for s in steps:
            b = next(v for st, v in reversed(lv) if st <= s)
            n = next(v for st, v in reversed(sv) if st <= s)
            out.append(LayoutStage(s, b, n))
        return cls(tuple(out))

    @classmethod
    def one(cls, lanes: int, seq_len: int) -> Layout:
        """The layout of one stage: ``lanes`` sequences of ``seq_len`` tokens every step."""
        return cls.of(lanes=int(lanes), seq_len=int(seq_len))

    @classmethod
    def from_config(cls, rows: Sequence[Sequence[int]]) -> Layout:
        return cls(tuple(LayoutStage(int(a), int(b), int(c)) for a, b, c in rows))

    def as_config(self) -> list[list[int]]:
        """``[[start, lanes, seq_len], ...]``, as checkpoints record it."""
        return [[s.start, s.lanes, s.seq_len] for s in self.stages]

    def in_units(self, units_per_row: Callable[[int], int]) -> Layout:
        """These stages in a packing rule's units (:mod:`planner.rules`): each row ``units_per_row(seq_len)`` units.

        Concat's units are tokens (the same layout); best-fit's are bins, one a row, and each
        stage keeps its rows' tokens (``tokens``): a ``seq_len`` change there bins the rest of
        the window begun again (SPEC section 15 rule 9; :mod:`planner.order.rebin`).
        """
        units = tuple(LayoutStage(s.start, s.lanes, units_per_row(s.seq_len)) for s in self.stages)
        if all(u.seq_len == s.seq_len for u, s in zip(units, self.stages, strict=True)):
            return self
        return Layout(tuple(LayoutStage(s.start, s.lanes, units_per_row(s.seq_len), s.seq_len) for s in self.stages))

    def in_tokens(self, seq_len: int) -> Layout:
        """The inverse of :meth:`in_units`: every stage's rows its ``tokens`` (``seq_len`` where it has none)."""
        return Layout(tuple(LayoutStage(s.start, s.lanes, s.tokens or seq_len) for s in self.stages))

    @property
    def changes_tokens(self) -> bool:
        """Stages in a rule's units whose rows' tokens differ (a ``seq_len`` change under best-fit)."""
        return len({s.tokens for s in self.stages}) > 1

    @property
    def first(self) -> LayoutStage:
        return self.stages[0]

    @property
    def staged(self) -> bool:
        """More than one stage."""
        return len(self.stages) > 1

    def index_at(self, step: int) -> int:
        """The stage in force at global step ``step``."""
        i = 0
        for j, s in enumerate(self.stages):
            if s.start <= step:
                i = j
        return i

    def at(self, step: int) -> LayoutStage:
        return self.stages[self.index_at(step)]

    def begins(self) -> list[int]:
        """The run token each stage begins at (``X_i``)."""
        out, x = [0], 0
        for a, b in zip(self.stages, self.stages[1:], strict=False):
            x += (b.start - a.start) * a.per_step
            out.append(x)
        return out

    def run_at(self, step: int) -> int:
        """Run tokens consumed before global step ``step``: ``X(step)``."""
        i = self.index_at(step)
        return self.begins()[i] + (step - self.stages[i].start) * self.stages[i].per_step

    def step_at_run(self, run: int) -> int:
        """The first step ``t`` with ``X(t) >= run``."""
        begins = self.begins()
        i = 0
        for j, x in enumerate(begins):
            if x <= run:
                i = j
        s = self.stages[i]
        return s.start + max(0, -(-(run - begins[i]) // s.per_step))

    # -- the same questions for many steps or run tokens at once -------------------------------

    def _columns(self) -> tuple[I64, I64, I64, I64]:
        """Each stage's first step, lanes, tokens per step and first run token, as arrays."""
        starts = np.array([s.start for s in self.stages], np.int64)
        lanes = np.array([s.lanes for s in self.stages], np.int64)
        per_step = np.array([s.per_step for s in self.stages], np.int64)
        return starts, lanes, per_step, np.array(self.begins(), np.int64)

    def indices_at(self, steps: Any) -> I64:
        """The stage in force at each of ``steps`` (global steps >= 0): :meth:`index_at`, vectorized."""
        starts = self._columns()[0]
        out: I64 = np.maximum(np.searchsorted(starts, np.asarray(steps, np.int64), side="right") - 1, 0)
        return out

    def lanes_at(self, steps: Any) -> I64:
        """The lanes of the stage in force at each of ``steps``."""
        out: I64 = self._columns()[1][self.indices_at(steps)]
        return out

    def seq_lens_at(self, steps: Any) -> I64:
        """The ``seq_len`` of the stage in force at each of ``steps``."""
        out: I64 = np.array([s.seq_len for s in self.stages], np.int64)[self.indices_at(steps)]
        return out

    def runs_at(self, steps: Any) -> I64:
        """Run tokens consumed before each of ``steps``: :meth:`run_at` (``X(t)``), vectorized."""
        t = np.asarray(steps, np.int64)
        starts, _, per_step, begins = self._columns()
        i = np.maximum(np.searchsorted(starts, t, side="right") - 1, 0)
        out: I64 = begins[i] + (t - starts[i]) * per_step[i]
        return out

    def steps_at_runs(self, runs: Any) -> I64:
        """The first step ``t`` with ``X(t) >= x`` for each ``x`` of ``runs``: :meth:`step_at_run`, vectorized."""
        x = np.asarray(runs, np.int64)
        starts, _, per_step, begins = self._columns()
        i = np.maximum(np.searchsorted(begins, x, side="right") - 1, 0)
        out: I64 = starts[i] + np.maximum(0, -(-(x - begins[i]) // per_step[i]))
        return out

    def steps_holding(self, runs: Any) -> I64:
        """The step that delivers run token ``x`` (``X(t) <= x < X(t + 1)``) for each ``x >= 0`` of ``runs``."""
        out: I64 = self.steps_at_runs(np.asarray(runs, np.int64) + 1) - 1
        return out

    def stages_of_runs(self, runs: Any) -> I64:
        """The stage that delivers run token ``x`` (``X_i <= x < X_{i+1}``) for each ``x >= 0`` of ``runs``."""
        out: I64 = np.maximum(np.searchsorted(self._columns()[3], np.asarray(runs, np.int64), side="right") - 1, 0)
        return out

    def end_of(self, i: int) -> tuple[int, int] | None:
        """Where stage ``i`` ends: the next stage's first step and run token (None: the last stage never ends)."""
        if i + 1 >= len(self.stages):
            return None
        return self.stages[i + 1].start, self.begins()[i + 1]

    def with_stage(self, stage: LayoutStage) -> Layout:
        """This layout and ``stage`` after it (a live change)."""
        return Layout((*self.stages, stage))

    def __len__(self) -> int:
        return len(self.stages)
