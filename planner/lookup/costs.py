"""Each step's attention cost per rank and microbatch, dealt and as assigned: ``plan.costs`` (SPEC section 18 rule 5).

A row's cost is the sum of ``n * n`` over its segments as a batch's ``doc_lengths`` gives
them: pieces under concat, items under best-fit, a row's padding one segment of its own
(a best-fit bin's, and the padding after a finite run's end). So a row's cost is
``S + (L - F) ** 2``, with ``S`` the sum of its real segments' squares and ``F`` their
tokens: under concat ``F = L`` but where a finite run has ended, under best-fit ``L - F``
is the bin's padding. Those come from the pieces of the steps asked about
(:func:`planner.lookup.staged.staged_pieces`, the arithmetic of ``plitzer.locate``: layout
stages, mixtures and finite runs as the loader packs them), which read the documents'
lengths only; under best-fit a piece is a bin, whose items and padding are its row group's
(:class:`planner.lookup.bins.BinnedLengths`, as ``plan.lanes``' padding reads them).

The B rows of a step (row ``k`` is lane ``k``'s) are then given to the ``world`` ranks two
ways: ``assigned`` as section 4 assigns them (rank ``r`` owns lanes ``[r*B/world,
(r+1)*B/world)``, its microbatches consecutive blocks of ``B / (world * microbatches)`` of
them) and ``balanced`` as :func:`planner.balance.deal` deals them.

>>> import tempfile, plitzer, plitzer.synth
>>> d = tempfile.mkdtemp(); _ = plitzer.synth.write(d, tokens=40_000, seed=0, docs_per_row_group=40, mean_length=60)
>>> p = plitzer.plan(d, lanes=8, window=2, world=2, seq_len=128)
>>> got = p.costs(0, 3, microbatches=2)
>>> got.columns, got.height
(['step', 'rank', 'microbatch', 'balanced', 'assigned'], 16)
>>> per_step = got.group_by("step").agg(pl.col("balanced").sum(), pl.col("assigned").sum())
>>> (per_step["balanced"] == per_step["assigned"]).all()  # the same rows, given out two ways
True
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import polars as pl

from planner.arraytypes import I64
from planner.balance import check_microbatches, deal
from planner.errors import ConfigError
from planner.lookup.bins import BinnedLengths
from planner.lookup.cut import Pieces
from planner.lookup.lengths import Lengths, as_lengths
from planner.lookup.pieces import epochs_of_steps
from planner.lookup.staged import staged_pieces
from planner.rules import rule_named

__all__ = ["COST_COLUMNS", "lane_costs", "step_costs"]

COST_COLUMNS = ("step", "rank", "microbatch", "balanced", "assigned")
"""``plan.costs``' columns, every one Int64."""

CHUNK_UNITS = 1 << 26
"""Run units (tokens; bins under best-fit) whose pieces are made at once, or a window where one is larger."""


def _step(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        msg = f"{name}={value!r} must be an integer >= 0: steps count from 0 (global steps of the run)"
        raise ConfigError(msg)
    return int(value)


def _layout(plan: Any) -> Any:
    """The plan's layout stages in its rule's units (a ConfigError without steps, or with seq_len stages binned)."""
    layout = plan.layout
    if layout is None:
        msg = "plan.costs needs the run's steps: give seq_len= (tokens per sequence) to planner.plan"
        raise ConfigError(msg)
    if layout.changes_tokens:
        msg = (
            f"plan.costs under packing={plan.packing[0]!r} with seq_len stages ({layout.in_tokens(0).as_config()}) "
            "is not in this release (the rest of a window is binned again at the change); ask for each seq_len's steps "
            "from a plan of that seq_len alone"
        )
        raise ConfigError(msg)
    return layout


def _check(plan: Any, layout: Any, steps: tuple[object, object], microbatches: object) -> tuple[int, int, int]:
    """The first and last step and ``microbatches``, checked: ConfigErrors naming the field, the value and the fix."""
    first, last = _step("first_step", steps[0]), _step("last_step", steps[1])
    if first > last:
        msg = f"first_step={first} is after last_step={last}: give first_step <= last_step (both are included)"
        raise ConfigError(msg)
    epochs = plan.settings.epochs
    if epochs is not None:
        n = layout.step_at_run(plan.run_before(epochs))
        if last >= n:
            msg = (
                f"last_step={last} is past the run's end: epochs={epochs} ends it after {n} steps; "
                f"use last_step <= {n - 1}"
            )
            raise ConfigError(msg)
    world, checked = int(plan.settings.world), 1
    for i in range(layout.index_at(first), layout.index_at(last) + 1):  # the stages the steps meet
        stage = layout.stages[i]
        checked = check_microbatches(microbatches, stage.lanes, world, True, start=stage.start)
    return first, last, checked


def _bin_costs(binned: BinnedLengths, pieces: Pieces) -> tuple[I64, I64]:
    """Each bin piece's real segments' squares and tokens: its row group's items in that bin."""
    squares = np.zeros(len(pieces), np.int64)
    tokens = np.zeros(len(pieces), np.int64)
    for g in np.unique(pieces.row_group).tolist():
        it = binned.items(g)
        n = int(it.bin.max()) + 1 if len(it.bin) else 0
        sq = np.bincount(it.bin, weights=it.length * it.length, minlength=n).astype(np.int64)
        fill = np.bincount(it.bin, weights=it.length, minlength=n).astype(np.int64)
        at = np.flatnonzero(pieces.row_group == g)
        squares[at], tokens[at] = sq[pieces.doc[at]], fill[pieces.doc[at]]
    return squares, tokens


def _chunks(view: Any, layout: Any, first: int, last: int) -> Iterator[tuple[int, int]]:
    """Steps ``[a, b)`` covering ``first..last``, each about :data:`CHUNK_UNITS` run units (a window at least)."""
    ep = view.epoch(view.epoch_of_run(layout.run_at(first)))
    budget = max(CHUNK_UNITS, int(ep.window_tokens.max()) if len(ep.window_tokens) else 0)
    a = first
    while a <= last:
        b = min(last + 1, max(a + 1, int(layout.step_at_run(layout.run_at(a) + budget))))
        yield a, b
        a = b


def lane_costs(plan: Any, view: Any, first: int, last: int, lengths: Lengths) -> tuple[I64, I64]:
    """Every row's cost in steps ``first..last``, each step's rows in lane order: (row cost, each step's first row).

    ``view``: the plan's epochs (the plan, or one that lays them out without the reads);
    ``lengths``: the documents' token lengths.
    """
    layout = _layout(plan)
    steps = np.arange(first, last + 1, dtype=np.int64)
    lanes = layout.lanes_at(steps)
    row_at = np.concatenate([[0], np.cumsum(lanes)]).astype(np.int64)
    row_tokens = np.array([s.tokens or s.seq_len for s in layout.stages], np.int64)[layout.indices_at(steps)]
    binning = rule_named(plan.packing[0]).binning
    binned = BinnedLengths(lengths, int(plan.packing[2]), binning) if binning is not None else None
    epochs = plan.settings.epochs
    squares = np.zeros(int(row_at[-1]), np.int64)
    tokens = np.zeros(int(row_at[-1]), np.int64)
    for a, b in _chunks(view, layout, first, last):
        for e in epochs_of_steps(view, layout, (a, b)):
            if epochs is not None and e >= epochs:
                break  # a finite run's lanes end with its last epoch: padding after
            got = staged_pieces(view, layout, e, binned if binned is not None else lengths, steps=(a, b))
            row = row_at[got.step - first] + got.lane
            if binned is not None:
                sq, n = _bin_costs(binned, got)
            else:
                sq, n = got.length * got.length, got.length
            # Float sums of integers stay exact below 2 ** 53 (a row's squares are at most seq_len ** 2).
            squares += np.bincount(row, weights=sq, minlength=len(squares)).astype(np.int64)
            tokens += np.bincount(row, weights=n, minlength=len(tokens)).astype(np.int64)
    pad = np.repeat(row_tokens, lanes) - tokens
    assert (pad >= 0).all(), "a row holds more tokens than seq_len"
    out: I64 = squares + pad * pad
    return out, row_at[:-1]


def step_costs(
    plan: Any, view: Any, steps: tuple[object, object], microbatches: object = 1, lengths: Any = None
) -> pl.DataFrame:
    """``plan.costs(first_step, last_step, microbatches)``: one row per (step, rank, microbatch), :data:`COST_COLUMNS`.

    ``view``: the plan's epochs, as :func:`lane_costs` takes them; ``lengths`` as :meth:`Plan.pieces` takes them.
    """
    layout = _layout(plan)
    first, last, m = _check(plan, layout, steps, microbatches)
    world = int(plan.settings.world)
    costs, row_at = lane_costs(plan, view, first, last, as_lengths(plan, lengths))
    lanes = layout.lanes_at(np.arange(first, last + 1, dtype=np.int64))
    n = last - first + 1
    balanced = np.empty((n, world * m), np.int64)
    assigned = np.empty((n, world * m), np.int64)
    for i in range(n):
        c = costs[row_at[i] : row_at[i] + lanes[i]]
        balanced[i] = deal(c, world, m).cost.reshape(-1)
        assigned[i] = c.reshape(world * m, -1).sum(axis=1)
    return pl.DataFrame(
        {
            "step": np.repeat(np.arange(first, last + 1, dtype=np.int64), world * m),
            "rank": np.tile(np.repeat(np.arange(world, dtype=np.int64), m), n),
            "microbatch": np.tile(np.arange(m, dtype=np.int64), n * world),
            "balanced": balanced.reshape(-1),
            "assigned": assigned.reshape(-1),
        }
    )
