"""Steps of epochs and a finite run's end: the step questions a trainer sizes a run with (SPEC section 17).

The epoch label of step ``t`` is ``floor(X(t) / T)`` (``X``: the run's units before the step,
:class:`planner.order.layout.Layout`; ``T``: an epoch's), so epoch ``e`` is the steps from
``step_at_run(e * T)`` to ``step_at_run((e + 1) * T)``. Lanes run on across epochs, so epochs
differ by a step or so, and a layout stage changes the units a step takes.

A finite run (``epochs=N``) is the windows of its ``N`` epochs: it ends at run unit
``run_before(N)`` (``N * T`` for one dataset; a mixture's epoch ends at a window's edge,
SPEC section 8), each lane's stream ends there, and its last step is the last that holds a
real unit: the run has ``step_at_run(end)`` steps. Its labels stop at ``N - 1`` (a mixture's
last window may reach past ``N * T``).

>>> import tempfile, planner, plitzer.synth
>>> d = tempfile.mkdtemp(); _ = plitzer.synth.write(d, tokens=20_000, seed=0)
>>> p = planner.plan(d, lanes=4, seq_len=64, window=2, epochs=2)
>>> p.tokens, run_steps(p, p.layout), [steps_in_epoch(p, p.layout, e) for e in range(3)]
(20176, 158, [79, 79, 0])
>>> p.steps(1)["tokens"].to_list()[-2:]  # the last step holds 160 real tokens of its 256
[256, 160]
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import polars as pl

from planner.errors import ConfigError
from planner.order.epoch import check_int
from planner.order.layout import Layout
from planner.rules import BIN, rule_named

__all__ = ["epoch_start", "layout_table", "run_end", "run_steps", "steps_in_epoch", "steps_table", "steps_layout"]


class _Epochs(Protocol):
    """What these questions ask of a plan (:class:`planner.order.plan.Plan` has it)."""

    settings: Any
    layout: Layout | None
    packing: tuple[str, int, int]

    @property
    def epoch_tokens(self) -> int: ...

    def run_before(self, epoch: int) -> int: ...

    def label_start(self, epoch: int) -> int: ...


def steps_layout(plan: _Epochs, layout: Layout | None = None) -> Layout:
    """``layout``, else the plan's (given with ``seq_len``): a plan without one has no steps, refused."""
    lay = layout if layout is not None else plan.layout
    if lay is None:
        msg = "the plan has no layout: give seq_len= (and lanes= in stages, if any) to planner.plan"
        raise ConfigError(msg)
    return lay


def run_end(plan: _Epochs) -> int | None:
    """The run's units when ``epochs`` ends it (the units of its epochs); None: the run never ends."""
    n = plan.settings.epochs
    return None if n is None else plan.run_before(n)


def run_steps(plan: _Epochs, layout: Layout) -> int | None:
    """A finite run's steps: its last step holds its last real unit; None: the run never ends."""
    end = run_end(plan)
    return None if end is None else layout.step_at_run(end)


def epoch_start(plan: _Epochs, layout: Layout, epoch: int) -> int:
    """The first step whose epoch label is ``epoch`` or later; a finite run's steps past its last epoch."""
    first = layout.step_at_run(plan.label_start(epoch))
    n, epochs = run_steps(plan, layout), plan.settings.epochs
    if n is None or epochs is None:
        return first
    return n if epoch >= epochs else min(first, n)


def steps_in_epoch(plan: _Epochs, layout: Layout, epoch: int) -> int:
    """The steps whose epoch label is ``epoch`` (what ``for batch in loader`` gives in that epoch)."""
    epoch = check_int("epoch", epoch, 0, "epochs count from 0")
    return epoch_start(plan, layout, epoch + 1) - epoch_start(plan, layout, epoch)


def steps_table(plan: _Epochs, layout: Layout, epoch: int) -> pl.DataFrame:
    """:meth:`planner.order.plan.Plan.steps` of ``epoch``: a finite run's stop at its last step, real units counted."""
    first, stop = layout.step_at_run(plan.run_before(epoch)), layout.step_at_run(plan.run_before(epoch + 1))
    end, n = run_end(plan), run_steps(plan, layout)
    if n is not None:
        first, stop = min(first, n), min(stop, n)
    step = np.arange(first, stop, dtype=np.int64)
    token_start = layout.runs_at(np.arange(first, stop + 1, dtype=np.int64))
    if end is not None:
        token_start = np.minimum(token_start, end)
    lanes, units = layout.lanes_at(step), np.diff(token_start)
    if not _binned(plan):
        return pl.DataFrame(
            {
                "step": step,
                "epoch": np.full(len(step), epoch, np.int64),
                "layout_stage": layout.indices_at(step),
                "lanes": lanes,
                "seq_len": layout.seq_lens_at(step),
                "tokens": units,
                "token_start": token_start[:-1],
            }
        )
    rows = layout.in_tokens(plan.packing[2])  # best-fit: the steps in tokens, a row's bin seq_len of them
    seq_len = rows.seq_lens_at(step)
    return pl.DataFrame(
        {
            "step": step,
            "epoch": np.full(len(step), epoch, np.int64),
            "layout_stage": layout.indices_at(step),
            "lanes": lanes,
            "seq_len": seq_len,
            "tokens": units * seq_len,
            "token_start": rows.runs_at(step),
            "bins": units,
            "bin_start": token_start[:-1],
        }
    )


def _binned(plan: Any) -> bool:
    """Whether ``plan`` cuts bins (best-fit, SPEC section 15): its steps' tables then give tokens and bins."""
    return rule_named(plan.packing[0]).unit == BIN


def layout_table(plan: Any, layout: Layout) -> pl.DataFrame:
    """:meth:`planner.order.plan.Plan.layout_table`: each stage, and the window its first step cuts again."""
    begins = layout.begins()
    ep_of, win_of = [], []
    for x in begins:
        e = plan.epoch_of_run(x)
        wt = plan.epoch(e).window_tokens
        ends = np.cumsum(wt)
        w = int(np.searchsorted(ends, x - plan.run_before(e), side="right"))
        inside = x > 0 and plan.run_before(e) + int(ends[w] - wt[w]) < x
        ep_of.append(e if inside else None)
        win_of.append(w if inside else None)
    rows = layout.in_tokens(plan.packing[2]) if _binned(plan) else layout  # best-fit: stages in tokens
    out = pl.DataFrame(
        {
            "layout_stage": list(range(len(layout))),
            "start_step": [s.start for s in layout.stages],
            "lanes": [s.lanes for s in layout.stages],
            "seq_len": [s.seq_len for s in rows.stages],
            "tokens_per_step": [s.per_step for s in rows.stages],
            "start_token": rows.begins(),
            "recut_epoch": pl.Series(ep_of, dtype=pl.Int64),
            "recut_window_index": pl.Series(win_of, dtype=pl.Int64),
        }
    )
    if rows is layout:
        return out
    return out.with_columns(
        bins_per_step=pl.Series([s.per_step for s in layout.stages], dtype=pl.Int64),
        start_bin=pl.Series(begins, dtype=pl.Int64),
    )
