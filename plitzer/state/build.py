"""Building a loader: its plan, its run value, its schedule and read pool, and its checkpoint config, checked.

What :class:`plitzer.Loader` is made of, apart from delivering: :func:`open_plan` (the
I/O: listing and footers), :func:`check_layout` (layout stages the data or the budget
cannot hold are refused, with the fix), :func:`make_config` (the fields a checkpoint
records), :class:`Locator` (a batch's documents back to files and rows), and
:func:`parts` that puts them together for one rank.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from planner.arraytypes import I64
from planner.catalog.rowgroups import RowGroupIndex
from planner.errors import ConfigError, DataError, PerformanceWarning
from planner.order.epoch import row_group_counts
from planner.order.layout import Layout, LayoutStage
from planner.order.plan import Plan
from planner.order.rebin import Rebinner
from planner.run import Run
from plitzer.bestfit.counts import BinSpec
from plitzer.bestfit.rebin import Rebin, rebin_at
from plitzer.bestfit.rows import rows_of
from plitzer.readpath.aligned import resolve
from plitzer.readpath.batch import Located
from plitzer.readpath.budget import Budget
from plitzer.readpath.cost import budget_floor
from plitzer.readpath.scan import Packing, ReadPool
from plitzer.readpath.schedule import Schedule
from plitzer.readpath.signals import SourceMap, SourceTotals
from plitzer.selection.select import source_rows
from plitzer.sources import index_of
from plitzer.state.settings import LoaderSettings, Source, checkpoint_config, default_threads, make_plan

__all__ = ["Locator", "Parts", "check_layout", "held_counts", "make_config", "open_plan", "parts", "rebin"]


def open_plan(source: Source, settings: LoaderSettings) -> Plan:
    """The plan a loader of ``settings`` runs from: lists files and reads footers (the I/O)."""
    return make_plan(index_of(source, settings), settings)


def held_counts(plan: Plan, settings: LoaderSettings) -> tuple[I64, I64, I64]:
    """Each row group's tokens as packed (padding included: the rule's), rows and empty documents."""
    _, rows, empty = row_group_counts(plan.dataset)  # the selected ones where selected
    return settings.rule.held_tokens(plan.dataset.frame, settings.seq_len), rows, empty


def check_layout(
    plan: Plan,
    settings: LoaderSettings,
    layout: Layout,
    new: Sequence[LayoutStage],
    tok: I64 | None = None,
    rows: I64 | None = None,
    column_bytes: int | None = None,
    rebin: Rebinner | None = None,
) -> int:
    """Refuse stages ``new`` of ``layout`` that the data or the budget cannot hold.

    Returns the bytes that two windows in flight need (below them, a warning).

    The floor is every stage's (the schedule packs one layout stage at a time; docs/design.md,
    "Layout stages"), named with the stage that needs the most.
    """
    s = settings
    if tok is None or rows is None:
        tok, rows, _ = held_counts(plan, s)
    if column_bytes is None:
        cols = resolve(plan.dataset, s.columns) if s.columns is not None else None
        column_bytes = cols.itemsize if cols is not None else 0
    cb, lb = column_bytes, s.labels  # labels: a piece's 8 bytes (plitzer.readpath.cost.LABEL_BYTES)
    for st in new:  # a binned rule's units at another seq_len are that seq_len's bins (the bins pass's)
        units = plan.units if rebin is None or st.seq_len == s.seq_len else rebin.plan_at(st.seq_len).units
        if units < st.lanes:
            at = f" at seq_len={st.seq_len}" if s.stages.staged and s.rule.needs_counts else ""
            msg = (
                f"lanes={st.lanes} exceeds the dataset's {units} {s.rule.unit}s{at}: some lanes could never "
                "receive a document. Lower lanes (or use more data)"
            )
            raise ConfigError(msg)
    floors = [
        (budget_floor(tok, rows, lanes=st.lanes, window=s.window, seq_len=st.seq_len, column_bytes=cb, labels=lb), st)
        for st in new
    ]
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
    inflight, _ = budget_floor(
        tok, rows, lanes=worst.lanes, window=s.window, seq_len=worst.seq_len, ahead=1, column_bytes=cb, labels=lb
    )
    return int(inflight)


def rebin(plan: Plan, settings: LoaderSettings) -> Rebin | None:
    """What the run asks at a ``seq_len`` change under a rule of bins (None under concat); each ``seq_len`` of the
    layout binned now, so the bins passes all run before the first batch (split between the ranks)."""
    s = settings
    if not s.rule.needs_counts:
        return None
    spec = BinSpec(s.seq_len, s.rule.name, s.selection.length_column)
    return rebin_at(plan, spec, [st.seq_len for st in s.stages.stages], threads=s.threads, split=(s.rank, s.world))


def make_config(settings: LoaderSettings, run: Run) -> dict[str, Any]:
    """The settings that fix the order, as a checkpoint records them (under the run's layout stages)."""
    return checkpoint_config(run.plan, settings.with_unit_layout(run.layout))


class Locator:
    """A batch's documents (running numbers) as file, row group, row and source: what ``documents()`` shows.

    Small and apart from the loader (it holds the index and three arrays), so that a
    batch keeps alive only what its views need.
    """

    __slots__ = ("_doc_base", "index")

    def __init__(self, index: RowGroupIndex) -> None:
        self.index = index
        self._doc_base: I64 | None = None  # made on the first call: most runs never ask

    def __call__(self, doc_ids: I64) -> Located:
        if self._doc_base is None:
            _, rows, _ = row_group_counts(self.index)  # the selected ones where selected
            self._doc_base = np.cumsum(rows) - rows
        base = self._doc_base
        rg = np.searchsorted(base, doc_ids, side="right") - 1
        frame = self.index.frame
        # Gathered from the frame for the rows asked: no per-row-group copy of the file
        # names (an object array is some 60 bytes a row group) is kept.
        at = pl.Series(rg, dtype=pl.Int64)
        return (
            frame["file"].gather(at).to_list(),
            frame["row_group"].gather(at).to_numpy().astype(np.int64),
            source_rows(self.index, rg, (doc_ids - base[rg]).astype(np.int64)),
            frame["source"].gather(at).to_list() if self.index.mixed else None,
        )


@dataclass(frozen=True, slots=True)
class Parts:
    """What a loader is made of: its run value, its schedule (over its read pool), its locator, its source totals."""

    run: Run
    schedule: Schedule
    locate: Locator
    totals: SourceTotals  # and their map of document numbers to sources (SPEC section 20)


def parts(plan: Plan, settings: LoaderSettings) -> Parts:
    """Check ``settings`` against ``plan`` and build a loader's parts (no thread starts yet)."""
    s = settings
    if plan.units == 0:  # best-fit: empty documents are bins too (SPEC section 15 rule 1)
        msg = f"dataset {plan.dataset.source!r} has no tokens (every document is empty); nothing to train on"
        raise DataError(msg)
    layout = s.stages
    tok, rows, _ = held_counts(plan, s)  # the selected ones where selected
    columns = resolve(plan.dataset, s.columns)  # aligned columns, checked against every source
    column_bytes = columns.itemsize if columns else 0  # labels add none a token (a piece's 8 B: check_layout)
    binned = rebin(plan, s)
    inflight = check_layout(plan, s, layout, layout.stages, tok, rows, column_bytes, binned)
    if s.budget < inflight:
        # Works, but the next window is read only once the current one is released:
        # decoding and training take turns instead of overlapping.
        warnings.warn(
            f"budget={s.budget:,} bytes holds the windows a step uses but not the next one as well, so "
            f"reads wait for the consumer; set budget to at least {inflight:,} bytes for two windows in "
            "flight (docs/design.md, 'The budget')",
            PerformanceWarning,
            stacklevel=5,
        )
    run = Run(plan, s.unit_layout, s.world, s.rank, binned)
    threads = s.threads or default_threads(plan.dataset)
    made = rows_of(s.rule, s.seq_len, s.pad_id)  # how the rule makes rows (best-fit: padded bins; None: concat's)
    pool = ReadPool(plan.dataset, Budget(s.budget), Packing.of(plan.dataset, columns, made, s.labels), threads=threads)
    return Parts(run, Schedule(pool), Locator(plan.dataset), SourceTotals(SourceMap.of(plan.dataset), s.labels))
