"""Mixtures: named sources with weights and stages, interleaved into one stream of row groups, and their plan.

A mixture is a few named sources (each a dataset as :func:`planner.index` takes it, with its own
column and storage options) and weights: shares of *tokens*, constant or in stages
that start at global steps. Everything here is integer arithmetic on footer counts.
Its parts, one module a purpose:

- :mod:`planner.mixing.mixindex`: the sources' indexes side by side (:class:`MixtureIndex`);
- :mod:`planner.mixing.streams`: each source's infinite stream of row groups, and the merge's key;
- :mod:`planner.mixing.interleave`: the streams merged by virtual finish time, stage by stage
  (:class:`Interleave`, the mixture's epoch order);
- here, :class:`MixturePlan`: the plan over the merged stream, and its tables.

A mixture epoch is ``T`` = the tokens of the sources the first stage weighs
(so a source joining later moves no epoch): epoch ``e`` holds the windows whose first
token falls in ``[e*T, (e+1)*T)``. With weights
proportional to the sources' sizes each source's epochs line up with the mixture's;
a source weighted above its size repeats, one below is partly used per mixture epoch.

A mixture of one source is exactly that source's own plan (docs/design.md, "The order").

>>> from planner.mixing.mixture import interleave_demo
>>> interleave_demo([[3, 3, 3, 3], [2, 2, 2, 2]], weights=[1, 1])  # (source, row group) in stream order
[(1, 0), (0, 0), (1, 1), (0, 1), (1, 2), (1, 3), (0, 2), (0, 3)]
>>> interleave_demo([[3, 3, 3, 3], [2, 2, 2, 2]], weights=[3, 1])
[(0, 0), (0, 1), (1, 0), (0, 2), (0, 3), (1, 1), (1, 2), (1, 3)]
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import polars as pl

from planner.bounded import Bounded
from planner.errors import ConfigError
from planner.mixing.interleave import UNCHANGED, Interleave
from planner.mixing.mixindex import MixtureIndex, is_mixture, mixture_index
from planner.mixing.sources import Stage
from planner.mixing.streams import finish_keys, interleave_demo, source_key
from planner.order.epoch import PlanSettings, unit_counts
from planner.order.epoch_order import EpochOrder, Permutation
from planner.order.layout import Layout
from planner.order.plan import EPOCHS_KEPT, Plan
from planner.rules import UNPADDED, Packed, rule_named

__all__ = [
    "Interleave",
    "MixtureIndex",
    "MixturePlan",
    "earliest_stage_step",
    "finish_keys",
    "interleave_demo",
    "is_mixture",
    "mixture_index",
    "source_key",
]

_NO_SEQ_LEN = "weights in stages start at global steps: give seq_len= to place them (tokens per step)"


class MixturePlan(Plan):
    """The plan of a mixture: the windows and lanes of docs/design.md over the interleaved stream.

    Its epoch order is :class:`Interleave`; a mixture of one source is that source's
    own plan (:class:`planner.order.plan.Permutation`), whatever its weights. On top of
    :class:`Plan` it adds each row group's ``source`` and ``source_epoch`` to the
    tables and the ``sources`` and ``stages`` tables.
    """

    def __init__(
        self,
        idx: MixtureIndex,
        settings: PlanSettings,
        stages: Sequence[Stage],
        seq_len: int | None = None,
        layout: Layout | None = None,
        *,
        packing: Packed = UNPADDED,
    ) -> None:
        self.mixture = idx
        self.stages = tuple(stages)
        if len(self.stages) > 1 and seq_len is None:
            msg = _NO_SEQ_LEN
            raise ConfigError(msg)
        self.seq_len = seq_len
        self.names = idx.names
        counts = unit_counts(idx, rule_named(packing[0]))
        order: EpochOrder = (
            Permutation(*counts, settings)
            if len(idx.parts) == 1
            else Interleave(idx, counts, settings, self.stages, seq_len, layout)
        )
        super().__init__(idx, settings, order, packing=packing)

    def __repr__(self) -> str:
        s = self.settings
        return (
            f"MixturePlan({len(self.names)} sources, {self.dataset.row_groups} row groups, {self.tokens:,} tokens, "
            f"seed={s.seed}, lanes={s.lanes}, window={s.window}, world={s.world}, stages={len(self.stages)}"
            f"{self._columns_shown()})"
        )

    # -- stage changes: a new value, this one unchanged ----------------------------------------

    def with_stages(self, stages: Sequence[Stage]) -> tuple[MixturePlan, int]:
        """This plan under ``stages`` (the same first stage) as a new value, and the first unit the change can touch.

        The new plan is the one made with ``stages`` from the start: the windows from
        that unit on are planned again (:meth:`Interleave.with_stages`). This plan is
        unchanged, its cached epochs its own; the new one computes its epochs afresh.
        """
        order, unit = self._interleave().with_stages(stages)
        if order is self.order:  # the same stages: the same value
            return self, unit
        return self._with_order(order, self.layout, keep_epochs=False), unit

    def with_layout(self, layout: Layout | None) -> tuple[MixturePlan, int]:
        """This plan under other layout stages (a live ``set_layout``, a resume's), and the first unit it touches."""
        if layout == self.layout:
            return self, UNCHANGED
        if not isinstance(self.order, Interleave):
            return self._with_order(self.order, layout, keep_epochs=True), UNCHANGED
        order, unit = self.order.with_layout(layout)
        return self._with_order(order, layout, keep_epochs=unit == UNCHANGED), unit

    def _interleave(self) -> Interleave:
        """The interleave whose stages change (a ConfigError where the plan has none, or no steps)."""
        if not isinstance(self.order, Interleave):
            msg = f"weights of a mixture of one source ({self.names[0]!r}) cannot change: it has nothing to mix"
            raise ConfigError(msg)
        if self.seq_len is None:
            msg = _NO_SEQ_LEN
            raise ConfigError(msg)
        return self.order

    def _with_order(self, order: EpochOrder, layout: Layout | None, *, keep_epochs: bool) -> MixturePlan:
        """A copy of this plan over ``order`` and ``layout`` (its epochs kept only where the order's windows are)."""
        new = copy.copy(self)
        new.order = order
        new.stages = order.stages if isinstance(order, Interleave) else self.stages
        new.layout = layout
        new._epochs = self._epochs.copy() if keep_epochs else Bounded(EPOCHS_KEPT)
        return new

    # -- the in-place forms, kept while a holder of the plan mutates it -------------------------

    def add_stage(self, stage: Stage) -> int:
        """Append a stage (a live change, docs/design.md "Live stages"); the first unit it can change.

        The plan then is the one made with every stage from the start: this plan
        becomes :meth:`with_stages`'s new value (the windows from that unit on are
        planned again).
        """
        self._interleave()
        if stage.start <= self.stages[-1].start:
            msg = f"a stage at step {stage.start} must start after the last one, at step {self.stages[-1].start}"
            raise ConfigError(msg)
        return self._become(*self.with_stages((*self.stages, stage)))

    def restage(self, stages: Sequence[Stage]) -> int:
        """Take another list of stages with the same first one (a resume's) in place; the first unit it can change."""
        if not isinstance(self.order, Interleave):
            return 0
        return self._become(*self.with_stages(stages))

    def _become(self, other: MixturePlan, unit: int) -> int:
        """Take ``other``'s state whole (nothing of this plan's is kept, so nothing is cleared); ``unit``."""
        if other is not self:
            self.__dict__.update(vars(other))
        return unit

    # -- tables ------------------------------------------------------------------------------

    def row_groups(self, epoch: int) -> pl.DataFrame:
        """As :meth:`Plan.row_groups`, with ``source`` and ``source_epoch``."""
        ep = self.epoch(epoch)
        return (
            super()
            .row_groups(epoch)
            .with_columns(
                pl.Series("source", self.index["source"].to_numpy()[ep.order], dtype=pl.String),
                pl.Series("source_epoch", self.source_epochs(epoch), dtype=pl.Int64),
            )
        )

    def reads(self, epoch: int) -> pl.DataFrame:
        """As :meth:`Plan.reads`, with ``source`` and ``source_epoch``."""
        ep = self.epoch(epoch)
        return (
            super()
            .reads(epoch)
            .with_columns(
                pl.Series("source", self.index["source"].to_numpy()[ep.order[ep.read_position]], dtype=pl.String),
                pl.Series("source_epoch", self.source_epochs(epoch)[ep.read_position], dtype=pl.Int64),
            )
        )

    def sources(self) -> pl.DataFrame:
        """name, path, column, fingerprint, tokens, row_groups, files: one row per source."""
        return self.mixture.sources_table()

    def stage_config(self) -> dict[str, Any]:
        """The checkpoint field of the weight stages: ``[[start step, {source: weight}], ...]``."""
        return {"stages": [[st.start, st.as_dict(self.mixture.names)] for st in self.stages]}

    def stages_table(self) -> pl.DataFrame:
        """stage, start_step, source, weight, target_share: the weights of every stage."""
        rows: dict[str, list[Any]] = {"stage": [], "start_step": [], "source": [], "weight": [], "target_share": []}
        for i, st in enumerate(self.stages):
            total = sum(st.weights)
            for n, w in zip(self.names, st.weights, strict=True):
                rows["stage"].append(i)
                rows["start_step"].append(st.start)
                rows["source"].append(n)
                rows["weight"].append(w)
                rows["target_share"].append(w / total)
        return pl.DataFrame(rows)

    def _extra_tables(self) -> dict[str, pl.DataFrame]:
        return {"sources": self.sources(), "stages": self.stages_table(), **super()._extra_tables()}


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
