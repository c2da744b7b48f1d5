"""The Plan value: a dataset's plan for given settings, any epoch's tables, SQL over them.

A :class:`Plan` holds the index, the settings (:class:`PlanSettings`) and the epochs'
order (:mod:`planner.order.epoch_order`), and answers every epoch's tables as Polars frames:
``row_groups``, ``lanes``, ``reads`` (and ``steps``, ``layout`` under layout stages,
``pieces`` given the run's ``seq_len``). Each epoch's arrays are computed on demand
by :mod:`planner.order.epoch` (which states the plan's rules) and the last few are kept.
Around it, one module a purpose:

- :mod:`planner.order.epoch`: one epoch's windows, lane cuts and reads, as arrays;
- :mod:`planner.order.epoch_order`: the epochs' order over the run (one source's permutations);
- :mod:`planner.order.sql`: the tables in DuckDB (:meth:`Plan.sql`);
- :mod:`planner.order.rankscan`: the rows a rank reads, as a LazyFrame (:meth:`Plan.scan`);
- :mod:`planner.lookup.pieces`: where each piece of a document lands (:meth:`Plan.pieces`).

:class:`LanesPlan` is a plan cut again into other lanes (a layout stage). This module
also exports the epoch arithmetic its plans are built on (``PlanSettings``,
``check_int``, ``EpochPlan``, ...), where callers have always imported it from.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

import numpy as np
import polars as pl
from numpy.typing import NDArray

from planner.arraytypes import I64
from planner.bounded import Bounded
from planner.catalog.footer import give_back_memory
from planner.catalog.rowgroups import RowGroupIndex, with_selected
from planner.errors import ConfigError
from planner.lanes import window_cuts
from planner.lookup.padding import lane_padding
from planner.lookup.pieces import OneSource
from planner.order import runsteps
from planner.order.epoch import EpochPlan, PlanSettings, check_int, cut_epoch, unit_counts
from planner.order.epoch_order import EpochOrder, Permutation
from planner.order.layout import Layout
from planner.order.rankscan import rank_rows
from planner.order.sql import run_query
from planner.rules import BIN, TOKEN, UNPADDED, Packed, Rule, rule_named

__all__ = ["EPOCHS_KEPT", "LanesPlan", "Plan"]

EPOCHS_KEPT = 4
"""Epochs' plans a plan keeps (the last used): a step touches at most two."""
GIVE_BACK_FROM = 8192
"""Row groups from which an epoch's plan gives its temporaries back (:func:`_given_back`)."""


def _given_back(ep: EpochPlan) -> EpochPlan:
    """``ep``, its making's temporaries given back to the system (once an epoch).

    The epoch's arrays are made on the caller's thread, and the reads that follow on the
    scanner's: glibc keeps each thread's freed pages resident, so the first batch's
    reads (a text source's tokenizing: tens of MB) did not reuse them, and what the plan
    freed stayed in the peak, about 100-150 B a row group (docs/design.md, "Bytes a row group").
    Only from :data:`GIVE_BACK_FROM` row groups (a megabyte or more given back): the trim
    walks the whole C heap, 7 ms an epoch on the hot-path benchmark's 192 row groups (0.2 ns
    a token, in the consumer's thread), for the few kilobytes a small plan frees.
    """
    if len(ep.order) >= GIVE_BACK_FROM:
        give_back_memory()
    return ep


class Plan:
    """A dataset's plan for given settings: any epoch's tables, SQL over them.

    Build one with :func:`plan`. Tables are Polars frames computed on demand (the last few epochs kept).
    """

    def __init__(
        self, idx: RowGroupIndex, settings: PlanSettings, order: EpochOrder | None = None, packing: Packed = UNPADDED
    ) -> None:
        self.dataset = idx
        self.settings = settings
        self.packing = packing  # its rule counts the units (SPEC section 15; plitzer.state.settings.make_plan)
        self._tokens, self._rows, self._empty = unit_counts(idx, self.rule)
        self.order: EpochOrder = (
            order if order is not None else Permutation(self._tokens, self._rows, self._empty, settings)
        )
        self._epochs: Bounded[int, EpochPlan] = Bounded(EPOCHS_KEPT)
        self.layout: Layout | None = None  # layout stages (planner.order.layout), where the run has them
        self.columns: list[list[Any]] = []  # aligned columns the run carries ([name, fill]; SPEC section 13)

    def with_layout(self, layout: Layout | None) -> tuple[Plan, int]:
        """This plan under layout stages ``layout`` (a new value), and the first unit it changes.

        One dataset's windows do not depend on the layout (only its tables show it), so
        the epochs' arrays are shared and no unit changes (``1 << 62``); a mixture's do
        (:meth:`planner.mixing.mixture.MixturePlan.with_layout`).
        """
        new = copy.copy(self)
        new._epochs = self._epochs.copy()
        new.layout = layout
        return new, 1 << 62

    def __repr__(self) -> str:
        s, b = self.settings, self.bins
        return (
            f"Plan({self.dataset.row_groups} row groups, {self.tokens:,} tokens{'' if b is None else f', {b:,} bins'}, "
            f"seed={s.seed}, lanes={s.lanes}, window={s.window}, world={s.world}{self._columns_shown()})"
        )

    def _columns_shown(self) -> str:
        """``, columns=loss_mask(fill 0),weight``: the aligned columns, where the run carries some."""
        if not self.columns:
            return ""
        return ", columns=" + ",".join(n + ("" if f is None else f"(fill {f!r})") for n, f in self.columns)

    @property
    def index(self) -> pl.DataFrame:
        """The row-group index (one row per row group).

        It always has ``rows_selected``, ``tokens_selected`` and ``empty_docs_selected``
        (equal to ``rows``, ``tokens`` and ``empty_docs`` where no ``where=`` selects),
        so one query serves selected and unselected plans alike.
        """
        f = self.dataset.frame
        got = self.__dict__.get("_index")
        if got is None or got[0] is not f:
            got = (f, with_selected(f))
            self.__dict__["_index"] = got
        out: pl.DataFrame = got[1]
        return out

    @property
    def tokens(self) -> int:
        """The stream's tokens (those a ``where=`` selects), ``loader.tokens``, under either rule (:attr:`bins`)."""
        return int(self._tokens.sum()) if self.rule.unit == TOKEN else int(self.dataset.tokens)

    @property
    def bins(self) -> int | None:
        """The stream's bins (rows of ``seq_len`` tokens) under best-fit, SPEC section 15; None under concat."""
        return self.units if self.rule.unit == BIN else None

    @property
    def units(self) -> int:
        """The stream's units, what the lanes are cut over: :attr:`tokens` under concat, :attr:`bins` under best-fit."""
        return int(self._tokens.sum())

    @property
    def counts(self) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
        """Each row group's units (tokens; bins, best-fit), rows and empty documents (those a ``where=`` selects)."""
        return self._tokens, self._rows, self._empty

    @property
    def epoch_tokens(self) -> int:
        """Units of an epoch, ``T`` (tokens; bins under best-fit): :attr:`tokens`, except for a mixture whose
        first stage weighs some sources 0, where it counts the sources that stage weighs (a source that
        joins the run later moves no epoch; docs/design.md, "Epochs of a mixture")."""
        return int(self.order.total)

    def label_of(self, run: int) -> int:  # the epoch label of a step of run units ``run`` before it
        return run // self.epoch_tokens

    def label_start(self, epoch: int) -> int:  # the run's units from which steps are labelled ``epoch``
        return epoch * self.epoch_tokens

    @property
    def windows(self) -> int:
        """Windows of epoch 0 (of every epoch of one source; a mixture's may differ by a window or two)."""
        return self.order.windows

    # A *unit* is one window of the run, numbered from 0 over all epochs; the loader
    # and the scanner walk units. The epoch order (``self.order``) numbers them.

    def unit(self, epoch: int, window: int) -> int:
        """The unit of ``window`` of ``epoch``."""
        return self.order.unit(epoch, window)

    def unit_epoch_window(self, unit: int) -> tuple[int, int]:
        """The epoch and window of ``unit``."""
        return self.order.unit_epoch_window(unit)

    def windows_in(self, epoch: int) -> int:  # windows of ``epoch``
        return self.order.windows_in(epoch)

    def _extra_tables(self) -> dict[str, pl.DataFrame]:
        """More tables for :meth:`sql` (a mixture's sources and stages; ``layout`` under layout stages)."""
        return {"layout": self.layout_table()} if self.layout is not None else {}

    def run_before(self, epoch: int) -> int:
        """Tokens of the run before ``epoch`` (``epoch * T`` for one source)."""
        return self.order.run_before(epoch)

    def epoch_of_run(self, run: int) -> int:
        """The epoch holding run token ``run``."""
        return self.order.epoch_of_run(run)

    def source_epochs(self, epoch: int) -> I64:
        """Source epoch of every position of ``epoch`` (the row group's source's own epoch)."""
        return self.order.source_epochs(epoch)

    def window_starts(self, windows: int) -> I64:
        """The run's tokens before each of the first ``windows`` windows (units) of the run."""
        return self.order.window_starts(windows)

    def epoch(self, epoch: int) -> EpochPlan:
        """The arrays of one epoch's plan (cached)."""
        epoch = check_int("epoch", epoch, 0, "epochs count from 0")
        return self._epochs.get_or_make(epoch, lambda: _given_back(self.order.layout(epoch)))

    def row_groups(self, epoch: int) -> pl.DataFrame:
        """epoch, window_index, position, file, row_group, rows, tokens, token_start, first_rank, last_rank.

        A selected plan (``where=``) adds ``rows_selected`` and ``tokens_selected``:
        ``rows`` and ``tokens`` are what the row group stores, ``token_start`` counts
        the selected tokens, and a row group with no selected row is never read
        (``first_rank`` and ``last_rank`` null). ``window_index`` is the window's number
        in the epoch (``window`` is a keyword in DuckDB, so no plan table has a column of
        that name).
        """
        ep = self.epoch(epoch)
        f = self.index[ep.order]
        read = ep.first_rank >= 0
        stored = self.dataset.frame.columns  # only a selected plan's table has them (SPEC section 6's columns else)
        selected: dict[str, pl.Series] = {k: f[k] for k in ("rows_selected", "tokens_selected") if k in stored}
        out = pl.DataFrame(
            {
                "epoch": np.full(len(ep.order), epoch, dtype=np.int64),
                "window_index": ep.window,
                "position": np.arange(len(ep.order), dtype=np.int64),
                "file": f["file"],
                "row_group": f["row_group"],
                "rows": f["rows"],
                "tokens": f["tokens"],
                "token_start": ep.token_start,
                "first_rank": pl.Series(ep.first_rank).set(pl.Series(~read), None),
                "last_rank": pl.Series(ep.last_rank).set(pl.Series(~read), None),
                **selected,
            }
        )
        return self._binned(out, f)

    def _binned(self, table: pl.DataFrame, f: pl.DataFrame) -> pl.DataFrame:
        """Cuts in bins (SPEC section 15): ``bin_start``, and each row group's ``bins`` and ``padding``."""
        _, _, seq_len = self.packing
        if self.rule.unit != BIN:
            return table
        tokens = f["tokens_selected"] if "tokens_selected" in f.columns else f["tokens"]
        return table.rename({"token_start": self.cut_columns[0]}).with_columns(
            bins=f["bins"], padding=f["bins"] * seq_len - tokens
        )

    def lanes(self, epoch: int) -> pl.DataFrame:
        """epoch, window_index, lane, rank, token_start, token_end: each lane's cut range.

        Under layout stages (:mod:`planner.order.layout`) each window is cut into the lanes of
        the stage in force at its first token, and ``layout_stage`` says which; a window
        in which a stage begins is then cut again (its rest, docs/design.md "Layout
        stages"), which :meth:`layout_table` locates.
        """
        ep = self.epoch(epoch)
        lay = self.layout if self.layout is not None and self.layout.staged else None
        starts = self.run_before(epoch) + np.cumsum(ep.window_tokens) - ep.window_tokens
        stage_of = lay.stages_of_runs(starts) if lay is not None else np.zeros(ep.windows, np.int64)
        parts = []
        for i in np.unique(stage_of).tolist():
            b = lay.stages[i].lanes if lay is not None else self.settings.lanes
            wins = np.flatnonzero(stage_of == i)
            window = np.repeat(wins, b)
            lane = np.tile(np.arange(b, dtype=np.int64), len(wins))
            t, z = ep.window_tokens[window], starts[window] % b
            frame = {
                "epoch": np.full(len(lane), epoch, dtype=np.int64),
                "window_index": window,
                "lane": lane,
                "rank": lane // (b // self.settings.world),
                "token_start": window_cuts(lane, t, z, b),
                "token_end": window_cuts(lane + 1, t, z, b),
            }
            if lay is not None:
                frame["layout_stage"] = np.full(len(lane), i, np.int64)
            parts.append(pl.DataFrame(frame))
        out = pl.concat(parts) if parts else pl.DataFrame(parts)
        start, end = self.cut_columns
        if start != "token_start" and parts:  # best-fit: the cuts are bins, a lane's rows; each lane's padding
            cols = [out[c].to_numpy() for c in ("window_index", "token_start", "token_end")]
            out = out.rename({"token_start": start, "token_end": end}).with_columns(
                padding=lane_padding(self, ep, *cols)
            )
        return out

    @property
    def rule(self) -> Rule:
        """The packing rule the plan cuts by (:mod:`planner.rules`)."""
        return rule_named(self.packing[0])

    @property
    def cut_columns(self) -> tuple[str, str]:
        """The lanes table's cut range, in the rule's units: ``token_start, token_end`` or ``bin_start, bin_end``."""
        unit = self.rule.unit
        return f"{unit}_start", f"{unit}_end"

    def stage_config(self) -> dict[str, Any]:
        """The checkpoint fields of the plan's weight stages: none for one source (a mixture's: ``stages``)."""
        return {}

    def layout_table(self) -> pl.DataFrame:
        """The layout stages: layout_stage, start_step, lanes, seq_len, tokens_per_step, start_token (+ best-fit's bins)

        ``start_token`` is the run's tokens before the stage; ``recut_epoch`` and
        ``recut_window_index`` name the window its first step cuts again (null at a
        window's edge). A plan made without ``seq_len`` has no steps to place: refused.
        """
        return runsteps.layout_table(self, runsteps.steps_layout(self))

    def steps(self, epoch: int) -> pl.DataFrame:
        """One row per global step labelled ``epoch``: step, epoch, layout_stage, lanes, seq_len, tokens, token_start.

        ``token_start`` is the run's tokens before the step (``X(t)``, SPEC 12), ``tokens``
        the step's (``X(t + 1) - X(t)``: the layout stage in force's lanes times its seq_len), so the layout over
        a run is ``select layout_stage, min(step), sum(tokens) from steps group by 1``. A finite run
        (``epochs``) stops at its last step, its ``tokens`` the real ones (:mod:`planner.order.runsteps`). Best-fit's
        are slots (padding too), then bins, bin_start. A plan made without ``seq_len`` has no steps: refused.

        >>> import tempfile, planner, plitzer.synth
        >>> d = tempfile.mkdtemp(); _ = plitzer.synth.write(d, tokens=20_000, seed=0)
        >>> p = planner.plan(d, lanes=[(0, 4), (10, 2)], seq_len=[(0, 64), (10, 256)], window=2)
        >>> p.steps(0).filter(pl.col("step").is_between(9, 10)).select("step", "lanes", "seq_len", "token_start").rows()
        [(9, 4, 64, 2304), (10, 2, 256, 2560)]
        """
        return runsteps.steps_table(self, runsteps.steps_layout(self), epoch)

    def steps_in_epoch(self, epoch: int, layout: Layout | None = None) -> int:
        """The steps whose epoch label is ``epoch`` (:mod:`planner.order.runsteps`; ``layout``: default the plan's)."""
        return runsteps.steps_in_epoch(self, runsteps.steps_layout(self, layout), epoch)

    def reads(self, epoch: int) -> pl.DataFrame:
        """epoch, window_index, rank, file, row_group, bytes: each rank's reads, in order."""
        ep = self.epoch(epoch)
        f = self.index[ep.order[ep.read_position]]
        return pl.DataFrame(
            {
                "epoch": np.full(len(ep.read_position), epoch, dtype=np.int64),
                "window_index": ep.read_window,
                "rank": ep.read_rank,
                "file": f["file"],
                "row_group": f["row_group"],
                "bytes": f["byte_length"],
            }
        )

    def pieces(self, epoch: int, *, seq_len: int | None = None, lengths: Any = None) -> pl.LazyFrame:
        """One row per piece of ``epoch``: step, rank, lane, start, length, file, row_group, row, ...

        Computed a batch of windows at a time as the frame is read (:mod:`planner.lookup.pieces`).
        ``lengths`` are every document's token length in index order (default: the
        runtime's cached document pass, plitzer); ``seq_len`` is the run's (default: the
        plan's, where it was made with one). Under layout stages each piece is placed in
        the stage that delivers it (:mod:`planner.lookup.staged`), which gives the steps
        their ``seq_len``.
        """
        from planner.lookup.frames import pieces_frame

        return pieces_frame(self, epoch, seq_len, lengths)

    def costs(self, first_step: int, last_step: int, microbatches: int = 1, *, lengths: Any = None) -> pl.DataFrame:
        """One row per (step, rank, microbatch) of steps ``first_step..last_step`` (both included), SPEC 18 rule 5.

        Columns step, rank, microbatch, balanced, assigned (Int64): the rank's attention cost (the sum of
        ``n * n`` over its rows' segments) with the step's rows dealt by :func:`planner.balance.deal`, and as
        section 4 assigns them. Read from the documents' lengths alone (:mod:`planner.lookup.costs`;
        ``lengths`` as :meth:`pieces` takes them).
        """
        from planner.lookup.costs import step_costs

        view = OneSource(self, self._tokens) if isinstance(self.order, Permutation) else self
        return step_costs(self, view, (first_step, last_step), microbatches, lengths)

    def sql(
        self, query: str, epochs: Iterable[int] = (0,), *, external_access: bool = False, seq_len: int | None = None
    ) -> pl.DataFrame:
        """DuckDB SQL over ``index``, ``row_groups``, ``lanes``, ``reads`` (and ``pieces``, ``steps``, ``layout``).

        The tables hold the given epochs. Frames reach DuckDB through Arrow,
        without a copy into a database. The query is any DuckDB SQL over them, but
        it runs with DuckDB's external access off (it reads no file, URL or
        extension; a query that tries is a ConfigError saying so) unless
        ``external_access=True``: then ``read_parquet`` of the dataset's own files
        works too, through the same storages (credentials included), so pass it
        only for queries you wrote. A query that names ``pieces`` (needs ``seq_len``)
        streams :meth:`pieces` of those epochs, read once (:mod:`planner.order.sql`); one that names
        ``costs`` has :meth:`costs` of the steps labelled with those epochs (one microbatch).

        Examples
        --------
        >>> import planner, tempfile, pyarrow as pa, pyarrow.parquet as pq
        >>> d = tempfile.mkdtemp()
        >>> docs = pa.array([[i % 89] * (10 + i % 40) for i in range(300)], pa.list_(pa.int32()))
        >>> pq.write_table(pa.table({"tokens": docs}), f"{d}/part.parquet", row_group_size=30)
        >>> p = planner.plan(d, lanes=8, window=2, world=2)
        >>> p.sql("select count(*) as n from row_groups")["n"][0] == p.index.height
        True
        """
        eps = list(epochs)
        tables: dict[str, pl.DataFrame] = {
            "index": self.index,
            "row_groups": _over(self.row_groups, eps),
            "reads": _over(self.reads, eps),
        }
        tables.update(self._extra_tables())

        def pieces() -> Any:
            from planner.lookup.frames import pieces_reader

            return pieces_reader(self, eps, seq_len)

        # lanes only where named: under best-fit its padding reads the row groups a cut falls inside
        makers: dict[str, Callable[[], Any]] = {"pieces": pieces, "lanes": lambda: _over(self.lanes, eps)}
        if self.layout is not None:
            makers["steps"] = lambda: _over(self.steps, eps)
            makers["costs"] = lambda: _over(self._epoch_costs, eps)
        return run_query(query, tables, makers=makers, dataset=self.dataset, external_access=external_access)

    def _epoch_costs(self, epoch: int) -> pl.DataFrame:
        """:meth:`costs` of the steps labelled ``epoch`` (none: no row)."""
        from planner.lookup.costs import COST_COLUMNS

        step = self.steps(epoch)["step"]
        if not len(step):
            return pl.DataFrame(schema=dict.fromkeys(COST_COLUMNS, pl.Int64))
        return self.costs(int(step[0]), int(step[-1]))

    def scan(self, epoch: int, rank: int = 0) -> pl.LazyFrame:
        """A LazyFrame of exactly the rows (documents) that ``rank`` reads in ``epoch``.

        Columns: epoch, window_index, position, file, row_group, row, and the token
        column. Nothing is read until the frame is collected. A selected plan
        (``where=``) yields the selected rows only, ``row`` numbering them in the file's
        row group (:mod:`planner.order.rankscan`).
        """
        rank = check_int("rank", rank, 0, "ranks count from 0")
        if rank >= self.settings.world:
            msg = f"rank={rank} is out of range for world={self.settings.world}; use 0..{self.settings.world - 1}"
            raise ConfigError(msg)
        return rank_rows(self.dataset, self.index, self.epoch(epoch), rank)


def _over(table: Callable[[int], pl.DataFrame], epochs: list[int]) -> pl.DataFrame:
    """``table`` of every epoch of ``epochs``, one frame (no epoch: the table's columns, no row)."""
    return pl.concat([table(e) for e in epochs]) if epochs else table(0).clear()


class LanesPlan(Plan):
    """``base`` cut into ``lanes`` lanes (a layout stage, :mod:`planner.order.layout`): the same windows.

    Units, epochs and the run's tokens are the base plan's: its epoch order is read
    through the base each time (so a mixture's stage change, which gives the base a new
    order, reaches this plan too); each epoch's cuts, ``z`` and reads are computed again
    for ``lanes`` (``z`` counting the run's tokens mod ``lanes``).
    """

    def __init__(self, base: Plan, lanes: int) -> None:  # the base's index and order: nothing read again
        self.base = base
        self.dataset = base.dataset
        self.settings = replace(base.settings, lanes=lanes)
        self._tokens, self._rows, self._empty = base._tokens, base._rows, base._empty
        self._epochs = Bounded(EPOCHS_KEPT)
        self._bases: dict[int, EpochPlan] = {}
        self.layout = base.layout

    @property
    def order(self) -> EpochOrder:
        """The base plan's epoch order, as it is now."""
        return self.base.order

    @order.setter
    def order(self, order: EpochOrder) -> None:  # a LanesPlan has no order of its own: it is the base's
        self.base.order = order

    def epoch(self, epoch: int) -> EpochPlan:
        ep = self.base.epoch(epoch)
        got = self._epochs.get(epoch)
        if got is None or self._bases.get(epoch) is not ep:  # the base planned it again (a stage change)
            s = self.settings
            got = cut_epoch(
                epoch,
                ep.order,
                ep.window,
                ep.token_start,
                ep.window_tokens,
                self._tokens,
                self._rows,
                self._empty,
                lanes=s.lanes,
                world=s.world,
                run_before=self.run_before(epoch),
            )
            self._bases[epoch] = ep
            for old in self._epochs.put(epoch, got):
                self._bases.pop(old, None)
        return got
