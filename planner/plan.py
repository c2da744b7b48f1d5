"""Each epoch's plan as tables: row-group order, windows, lane cuts, and reads.

With G row groups, B lanes, W row groups per window and ``world`` ranks:

1. The row groups of epoch ``e`` are taken in the order ``permutation(G, key(seed, e, 1))``.
2. Windows are consecutive runs of W row groups in that order (the last may be shorter).
3. A window's stream is its row groups in that order, each one's documents in
   storage order; ``token_start`` is where a row group begins in that stream.
4. Lane cuts split the stream at exact token positions. With ``q, r = divmod(T_w, B)``
   and ``z`` the run's tokens before this window mod B, lane ``k`` gets ``q + 1``
   tokens when ``(k - z) mod B < r``, else ``q``: the cut arithmetic deals the run's
   tokens to lanes like cards (token ``i`` of the run counts to lane ``i mod B``),
   so every lane has received within one token of every other, at every window of
   every run. A document that crosses a cut is split there into *pieces*.
5. Rank ``r`` owns lanes ``[r*B/world, (r+1)*B/world)`` and reads only the row
   groups whose tokens meet its cut range (and those whose empty documents fall in it).

A worked example (docs/design.md, "Windows, token cuts and lanes (lockstep)"): B = 4,
T_w = 10, z = 3 gives q = 2, r = 2; lanes 3 and 0 get 3 tokens, lanes 1 and 2 get 2:
cuts 0, 3, 5, 7, 10; the next window has z = (3 + 10) mod 4 = 1.

The lane arithmetic itself is :mod:`planner.lanes`.

Everything here is numpy on the index's columns: no I/O, no hidden state.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np
import polars as pl
from numpy.typing import NDArray

from planner.errors import ConfigError
from planner.hashing import key, permutation
from planner.lanes import cut_at, lane_of, piece_range
from planner.layout import Layout
from planner.rowgroups import RowGroupIndex, SelectedRows, stream_counts, with_selected
from planner.storage import Storage, duckdb_filesystems

__all__ = [
    "EpochOrder",
    "EpochPlan",
    "LanesPlan",
    "Permutation",
    "Plan",
    "PlanSettings",
    "check_int",
    "cut_epoch",
    "epoch_of_step",
    "layout_epoch",
    "plan_epoch",
    "row_group_counts",
]

I64 = NDArray[np.int64]


def epoch_of_step(step: int, *, lanes: int, seq_len: int, tokens: int) -> int:
    """Epoch label of global step ``step``: ``floor(step * lanes * seq_len / tokens)`` (docs/glossary.md, "Step")."""
    return step * lanes * seq_len // tokens


def check_int(name: str, value: object, low: int, fix: str) -> int:
    """``value`` as an int ``>= low``, or a ConfigError naming the field, the value and ``fix``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        msg = f"{name}={value!r} must be an integer >= {low}; {fix}"
        raise ConfigError(msg)
    if value < low:
        msg = f"{name}={value} must be >= {low}; {fix}"
        raise ConfigError(msg)
    return int(value)


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanSettings:
    """The settings that shape a plan; each checks itself."""

    seed: int = 0
    lanes: int = 512
    window: int = 64
    world: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer)):
            msg = f"seed={self.seed!r} must be an integer"
            raise ConfigError(msg)
        check_int("lanes", self.lanes, 1, "lanes is the number of sequences per global batch")
        check_int("window", self.window, 1, "window is the number of row groups shuffled together")
        check_int("world", self.world, 1, "world is the number of ranks (GPUs)")
        if self.lanes % self.world:
            divisors = [d for d in range(1, self.lanes + 1) if self.lanes % d == 0]
            msg = (
                f"lanes={self.lanes} is not divisible by world={self.world}; every rank must own "
                f"the same number of lanes: use a world among {divisors[:12]} or lanes a multiple of {self.world}"
            )
            raise ConfigError(msg)


@dataclass(frozen=True, slots=True)
class EpochPlan:
    """One epoch's plan as arrays (positions are indexes into the epoch order)."""

    epoch: int
    order: I64  # row-group id (row of the index) at each position
    window: I64  # window of each position
    token_start: I64  # first token of each position in its window's stream
    window_tokens: I64  # T_w per window
    window_z: I64  # z per window: the run's tokens before it, mod B
    first_rank: I64  # first rank that reads each position (-1: nobody, no rows)
    last_rank: I64
    # Windows of fewer tokens than lanes (the only ones where a rank can own no token, and
    # so read nothing of a row group spanning it), and which ranks own a token there.
    short_windows: I64
    short_owns: NDArray[np.bool_]  # (len(short_windows), world)
    _reads: list[tuple[I64, I64, I64]] = field(default_factory=list, repr=False, compare=False)

    @property
    def windows(self) -> int:
        return len(self.window_tokens)

    # Every rank's reads, (window, rank, position) sorted so, built on first use (the plan's
    # tables): about positions x world / W of them, so a rank's loader, which asks
    # :meth:`reads_of` only, never builds them (docs/design.md, "One index per job").

    @property
    def read_window(self) -> I64:
        return self._all_reads()[0]

    @property
    def read_rank(self) -> I64:
        return self._all_reads()[1]

    @property
    def read_position(self) -> I64:
        return self._all_reads()[2]

    def _owns(self, window: Any, rank: Any) -> NDArray[np.bool_]:
        """Whether ``rank`` owns a token of ``window`` (arrays broadcast)."""
        w, r = np.broadcast_arrays(np.asarray(window, np.int64), np.asarray(rank, np.int64))
        out = np.ones(w.shape, bool)
        if len(self.short_windows):
            i = np.minimum(np.searchsorted(self.short_windows, w), len(self.short_windows) - 1)
            sel = self.short_windows[i] == w
            out[sel] = self.short_owns[i[sel], r[sel]]
        return out

    def _all_reads(self) -> tuple[I64, I64, I64]:
        if not self._reads:
            first, last = self.first_rank, self.last_rank
            count = np.where(first >= 0, last - first + 1, 0)
            rep = np.repeat(np.arange(len(first), dtype=np.int64), count)
            offs = np.cumsum(count) - count
            rank = first[rep] + (np.arange(len(rep), dtype=np.int64) - offs[rep])
            keep = (rank == first[rep]) | (rank == last[rep]) | self._owns(self.window[rep], rank)
            rep, rank = rep[keep], rank[keep]
            sort = np.lexsort((rep, rank, self.window[rep]))
            self._reads.append((self.window[rep][sort], rank[sort], rep[sort]))
        return self._reads[0]

    def cuts(self, window: int, lanes: int, k: Any = None) -> I64:
        """``c_0..c_B`` of one window (with ``c_B = T_w``), or ``c_k`` for the given ``k``."""
        if k is None:
            k = np.arange(lanes + 1, dtype=np.int64)
        q, r = divmod(int(self.window_tokens[window]), lanes)
        return cut_at(k, q, r, int(self.window_z[window]), lanes)

    def lane_of(self, window: Any, x: Any, lanes: int) -> I64:
        """Lane of token position ``x`` of ``window`` (both arrays broadcast)."""
        t = self.window_tokens[window]
        return lane_of(x, t // lanes, t % lanes, self.window_z[window], lanes)

    def reads_of(self, window: int, rank: int) -> I64:
        """Positions a rank reads in a window, in stream order (from the window's positions alone)."""
        lo = int(np.searchsorted(self.window, window, side="left"))
        hi = int(np.searchsorted(self.window, window, side="right"))
        first, last = self.first_rank[lo:hi], self.last_rank[lo:hi]
        hit = (first <= rank) & (rank <= last)  # -1, -1: a position nobody reads
        inner = hit & (first != rank) & (last != rank)
        if inner.any() and not bool(self._owns(window, rank)):
            hit &= ~inner
        out: I64 = lo + np.flatnonzero(hit)
        return out


def plan_epoch(tokens: I64, rows: I64, empty_docs: I64, settings: PlanSettings, epoch: int) -> EpochPlan:
    """The plan of one epoch, from the index's per-row-group counts (docs/design.md, "The order")."""
    order = permutation(len(tokens), key(settings.seed, epoch, 1))
    run_before = epoch * int(tokens.sum())
    return layout_epoch(order, tokens, rows, empty_docs, settings, epoch, run_before)


def layout_epoch(
    order: I64, tokens: I64, rows: I64, empty_docs: I64, settings: PlanSettings, epoch: int, run_before: int
) -> EpochPlan:
    """Windows, lane cuts and reads of an epoch whose row groups come in ``order``.

    ``order`` holds row-group ids (rows of the index) in stream order; windows are
    consecutive runs of W of them; ``run_before`` is the run's tokens before the
    epoch (``z`` of its first window is that mod B). Shared by one source's epochs and
    a mixture's (:mod:`planner.mixture`).
    """
    s = settings
    g = len(order)
    pos = np.arange(g, dtype=np.int64)
    window = pos // s.window
    tok = tokens[order]
    starts = np.arange(0, g, s.window, dtype=np.int64)
    window_tokens = np.add.reduceat(tok, starts) if g else np.zeros(0, np.int64)
    before = np.cumsum(tok) - tok
    token_start = before - before[starts][window] if g else before
    return cut_epoch(
        epoch,
        order,
        window,
        token_start,
        window_tokens.astype(np.int64, copy=False),
        tokens,
        rows,
        empty_docs,
        lanes=s.lanes,
        world=s.world,
        run_before=run_before,
    )


def cut_epoch(
    epoch: int,
    order: I64,
    window: I64,
    token_start: I64,
    window_tokens: I64,
    tokens: I64,
    rows: I64,
    empty_docs: I64,
    *,
    lanes: int,
    world: int,
    run_before: int,
) -> EpochPlan:
    """An epoch's lane cuts and reads for ``lanes`` lanes over ``world`` ranks (its windows given).

    What :func:`layout_epoch` does after placing the windows; a layout stage with
    other lanes (:mod:`planner.layout`) cuts the same windows again with it.
    """
    tok = tokens[order]
    n = rows[order]
    emp = empty_docs[order]
    prefix = np.cumsum(window_tokens) - window_tokens
    window_z = (run_before % lanes + prefix % lanes) % lanes
    lo, hi = piece_range(token_start, tok, emp)
    t_w = window_tokens[window]
    q, r, z = t_w // lanes, t_w % lanes, window_z[window]
    lanes_per_rank = lanes // world
    first = lane_of(lo, q, r, z, lanes) // lanes_per_rank
    last = lane_of(hi, q, r, z, lanes) // lanes_per_rank
    first = np.where(n > 0, first, -1)
    last = np.where(n > 0, last, -1)

    # A rank with an empty cut range (c_lo == c_hi) owns no token, so it reads nothing
    # even if a row group spans across it. That needs T_w < B (else every lane gets
    # q >= 1 tokens), so only those windows get a (windows x world) table: memory
    # that grew with windows times ranks on every rank (docs/design.md, "One index per job").
    short = np.flatnonzero(window_tokens < lanes).astype(np.int64)
    rk = np.arange(world, dtype=np.int64)[None, :]
    wq = (window_tokens[short] // lanes)[:, None]
    wr = (window_tokens[short] % lanes)[:, None]
    wz = window_z[short][:, None]
    c_lo = cut_at(rk * lanes_per_rank, wq, wr, wz, lanes)
    c_hi = cut_at((rk + 1) * lanes_per_rank, wq, wr, wz, lanes)
    owns = c_lo < c_hi
    owns[:, -1] = True
    return EpochPlan(
        epoch=epoch,
        order=order,
        window=window,
        token_start=token_start,
        window_tokens=window_tokens,
        window_z=window_z,
        first_rank=first,
        last_rank=last,
        short_windows=short,
        short_owns=owns,
    )


def row_group_counts(idx: RowGroupIndex) -> tuple[I64, I64, I64]:
    """Tokens, rows and empty documents of every row group of ``idx`` in the stream, as int64 arrays.

    Those a selection (``where=``) keeps where the index is selected
    (:func:`planner.dataset.stream_counts`).
    """
    tokens, rows, empty = stream_counts(idx.frame)
    return (
        tokens.to_numpy().astype(np.int64),
        rows.to_numpy().astype(np.int64),
        empty.to_numpy().astype(np.int64),
    )


class EpochOrder(Protocol):
    """Which row groups each epoch takes, in which order, and how the run's windows are numbered.

    A *unit* is one window of the run, numbered from 0 over all epochs; the loader
    and the scanner walk units (docs/glossary.md). :class:`Permutation` orders one
    source; a mixture's interleave (:class:`planner.mixture.Interleave`) merges several.
    """

    total: int
    """Tokens of an epoch, ``T``."""

    @property
    def windows(self) -> int:
        """Windows of epoch 0."""
        ...

    def windows_in(self, epoch: int) -> int: ...

    def unit(self, epoch: int, window: int) -> int: ...

    def unit_epoch_window(self, unit: int) -> tuple[int, int]: ...

    def run_before(self, epoch: int) -> int:
        """Tokens of the run before ``epoch``."""
        ...

    def epoch_of_run(self, run: int) -> int:
        """The epoch holding run token ``run``."""
        ...

    def layout(self, epoch: int) -> EpochPlan:
        """The arrays of one epoch's plan (computed, not cached)."""
        ...

    def source_epochs(self, epoch: int) -> I64:
        """Each position's source epoch (its source's own epoch) in ``epoch``."""
        ...

    def window_starts(self, windows: int) -> I64:
        """The run's tokens before each of the first ``windows`` units."""
        ...


class Permutation:
    """One source's epochs: epoch ``e`` takes all row groups in ``permutation(G, key(seed, e, 1))``.

    Every epoch has the same ``windows`` units and ``T`` tokens.
    """

    def __init__(self, tokens: I64, rows: I64, empty_docs: I64, settings: PlanSettings) -> None:
        self._tokens, self._rows, self._empty = tokens, rows, empty_docs
        self.settings = settings
        self.total = int(tokens.sum())

    @property
    def windows(self) -> int:
        return -(-len(self._tokens) // self.settings.window)

    def windows_in(self, epoch: int) -> int:
        return self.windows

    def unit(self, epoch: int, window: int) -> int:
        return epoch * self.windows + window

    def unit_epoch_window(self, unit: int) -> tuple[int, int]:
        e, w = divmod(unit, self.windows)
        return e, w

    def run_before(self, epoch: int) -> int:
        return epoch * self.total

    def epoch_of_run(self, run: int) -> int:
        return run // self.total

    def layout(self, epoch: int) -> EpochPlan:
        return plan_epoch(self._tokens, self._rows, self._empty, self.settings, epoch)

    def source_epochs(self, epoch: int) -> I64:
        return np.full(len(self._tokens), epoch, np.int64)

    def window_starts(self, windows: int) -> I64:
        out = np.zeros(windows, np.int64)
        for u in range(0, windows, max(1, self.windows)):
            e = u // max(1, self.windows)
            wt = self.layout(e).window_tokens
            n = min(len(wt), windows - u)
            out[u : u + n] = self.run_before(e) + (np.cumsum(wt) - wt)[:n]
        return out


class Plan:
    """A dataset's plan for given settings: any epoch's tables, SQL over them.

    Build one with :func:`plan`. Tables are Polars frames computed on demand
    from the index (the last few epochs are kept).
    """

    def __init__(self, idx: RowGroupIndex, settings: PlanSettings, order: EpochOrder | None = None) -> None:
        self.dataset = idx
        self.settings = settings
        self._tokens, self._rows, self._empty = row_group_counts(idx)
        self.order: EpochOrder = (
            order if order is not None else Permutation(self._tokens, self._rows, self._empty, settings)
        )
        self._epochs: OrderedDict[int, EpochPlan] = OrderedDict()
        self.layout: Layout | None = None  # layout stages (planner.layout), where the run has them

    def __repr__(self) -> str:
        s = self.settings
        return (
            f"Plan({self.dataset.row_groups} row groups, {self.tokens:,} tokens, seed={s.seed}, "
            f"lanes={s.lanes}, window={s.window}, world={s.world})"
        )

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
        """The stream's tokens: every row group's (those a ``where=`` selects)."""
        return int(self._tokens.sum())

    @property
    def epoch_tokens(self) -> int:
        """Tokens of an epoch, ``T``: :attr:`tokens`, except for a mixture whose first stage
        weighs some sources 0, where it counts the sources that stage weighs (a source that
        joins the run later moves no epoch; docs/design.md, "Epochs of a mixture")."""
        return int(self.order.total)

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

    def windows_in(self, epoch: int) -> int:
        """Windows of ``epoch``."""
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
        got = self._epochs.get(epoch)
        if got is None:
            got = self.order.layout(epoch)
            self._epochs[epoch] = got
            if len(self._epochs) > 4:
                self._epochs.popitem(last=False)
        else:
            self._epochs.move_to_end(epoch)
        return got

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
        return pl.DataFrame(
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

    def lanes(self, epoch: int) -> pl.DataFrame:
        """epoch, window_index, lane, rank, token_start, token_end: each lane's cut range.

        Under layout stages (:mod:`planner.layout`) each window is cut into the lanes of
        the stage in force at its first token, and ``layout_stage`` says which; a window
        in which a stage begins is then cut again (its rest, docs/design.md "Layout
        stages"), which :meth:`layout_table` locates.
        """
        ep = self.epoch(epoch)
        staged = self.layout is not None and self.layout.staged
        nw = ep.windows
        starts = self.run_before(epoch) + np.cumsum(ep.window_tokens) - ep.window_tokens
        if staged:
            assert self.layout is not None
            stage_of = np.searchsorted(np.array(self.layout.begins(), np.int64), starts, side="right") - 1
        else:
            stage_of = np.zeros(nw, np.int64)
        parts = []
        for i in np.unique(stage_of).tolist():
            b = self.layout.stages[i].lanes if staged and self.layout is not None else self.settings.lanes
            wins = np.flatnonzero(stage_of == i)
            window = np.repeat(wins, b)
            lane = np.tile(np.arange(b, dtype=np.int64), len(wins))
            t = ep.window_tokens[window]
            q, r, z = t // b, t % b, starts[window] % b
            frame = {
                "epoch": np.full(len(lane), epoch, dtype=np.int64),
                "window_index": window,
                "lane": lane,
                "rank": lane // (b // self.settings.world),
                "token_start": cut_at(lane, q, r, z, b),
                "token_end": cut_at(lane + 1, q, r, z, b),
            }
            if staged:
                frame["layout_stage"] = np.full(len(lane), i, np.int64)
            parts.append(pl.DataFrame(frame))
        return pl.concat(parts) if parts else pl.DataFrame(parts)

    def stage_config(self) -> dict[str, Any]:
        """The checkpoint fields of the plan's weight stages: none for one source (a mixture's: ``stages``)."""
        return {}

    def layout_table(self) -> pl.DataFrame:
        """The layout stages: layout_stage, start_step, lanes, seq_len, tokens_per_step, start_token.

        ``start_token`` is the run's tokens before the stage; ``recut_epoch`` and
        ``recut_window_index`` name the window its first step cuts again (null at a
        window's edge). A plan made without ``seq_len`` has no steps to place: refused.
        """
        lay = self.layout
        if lay is None:
            msg = "the plan has no layout: give seq_len= (and lanes= in stages, if any) to planner.plan"
            raise ConfigError(msg)
        begins = lay.begins()
        ep_of, win_of = [], []
        for x in begins:
            e = self.epoch_of_run(x)
            wt = self.epoch(e).window_tokens
            ends = np.cumsum(wt)
            w = int(np.searchsorted(ends, x - self.run_before(e), side="right"))
            inside = x > 0 and self.run_before(e) + int(ends[w] - wt[w]) < x
            ep_of.append(e if inside else None)
            win_of.append(w if inside else None)
        return pl.DataFrame(
            {
                "layout_stage": list(range(len(lay))),
                "start_step": [s.start for s in lay.stages],
                "lanes": [s.lanes for s in lay.stages],
                "seq_len": [s.seq_len for s in lay.stages],
                "tokens_per_step": [s.per_step for s in lay.stages],
                "start_token": begins,
                "recut_epoch": pl.Series(ep_of, dtype=pl.Int64),
                "recut_window_index": pl.Series(win_of, dtype=pl.Int64),
            }
        )

    def steps(self, epoch: int) -> pl.DataFrame:
        """One row per global step labelled ``epoch``: step, epoch, layout_stage, lanes, seq_len, tokens, token_start.

        ``token_start`` is the run's tokens before the step (``X(t)``, SPEC 12), ``tokens``
        the step's (``lanes * seq_len`` of the layout stage in force), so the layout over
        a run is ``select layout_stage, min(step), sum(tokens) from steps group by 1``.
        A plan made without ``seq_len`` has no steps: refused.

        >>> import tempfile, planner, plitzer.synth
        >>> d = tempfile.mkdtemp(); _ = plitzer.synth.write(d, tokens=20_000, seed=0)
        >>> p = planner.plan(d, lanes=[(0, 4), (10, 2)], seq_len=[(0, 64), (10, 256)], window=2)
        >>> p.steps(0).filter(pl.col("step").is_between(9, 10)).select("step", "lanes", "seq_len", "token_start").rows()
        [(9, 4, 64, 2304), (10, 2, 256, 2560)]
        """
        lay = self.layout
        if lay is None:
            msg = "the plan has no layout: give seq_len= (and lanes= in stages, if any) to planner.plan"
            raise ConfigError(msg)
        first, stop = lay.step_at_run(self.run_before(epoch)), lay.step_at_run(self.run_before(epoch + 1))
        step = np.arange(first, stop, dtype=np.int64)
        stage = np.searchsorted(np.array([s.start for s in lay.stages], np.int64), step, side="right") - 1
        lanes = np.array([s.lanes for s in lay.stages], np.int64)[stage]
        seq_len = np.array([s.seq_len for s in lay.stages], np.int64)[stage]
        begins = np.array(lay.begins(), np.int64)[stage]
        starts = np.array([s.start for s in lay.stages], np.int64)[stage]
        return pl.DataFrame(
            {
                "step": step,
                "epoch": np.full(len(step), epoch, np.int64),
                "layout_stage": stage.astype(np.int64),
                "lanes": lanes,
                "seq_len": seq_len,
                "tokens": lanes * seq_len,
                "token_start": begins + (step - starts) * lanes * seq_len,
            }
        )

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

        Computed a batch of windows at a time as the frame is read (:mod:`planner.pieces`).
        ``lengths`` are every document's token length in index order (default: the
        runtime's cached document pass, plitzer); ``seq_len`` is the run's.
        """
        from planner.pieces import pieces_frame

        return pieces_frame(self, epoch, seq_len, lengths)

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
        streams :meth:`pieces` of those epochs, read once.

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
        import duckdb

        eps = list(epochs)
        tables: dict[str, pl.DataFrame] = {
            "index": self.index,
            "row_groups": pl.concat([self.row_groups(e) for e in eps]) if eps else self.row_groups(0).clear(),
            "lanes": pl.concat([self.lanes(e) for e in eps]) if eps else self.lanes(0).clear(),
            "reads": pl.concat([self.reads(e) for e in eps]) if eps else self.reads(0).clear(),
        }
        tables.update(self._extra_tables())
        if self.layout is not None and re.search(r"\bsteps\b", query, re.IGNORECASE):
            tables["steps"] = pl.concat([self.steps(e) for e in eps]) if eps else self.steps(0).clear()
        con = duckdb.connect(config={"enable_external_access": bool(external_access)})
        try:
            for name, frame in tables.items():
                con.register(name, frame.to_arrow())
            if re.search(r"\bpieces\b", query, re.IGNORECASE):
                from planner.pieces import pieces_reader

                con.register("pieces", pieces_reader(self, eps, seq_len))
            # read_parquet('s3://...') in the query reaches the dataset's objects through
            # the same s3fs filesystem (DuckDB's httpfs extension may not be installable).
            for fs in _duckdb_filesystems(self.dataset) if external_access else ():
                con.register_filesystem(fs)
            try:
                result: pl.DataFrame = con.sql(query).pl()
            except duckdb.PermissionException as e:
                msg = (
                    f"the query reads a file or URL ({' '.join(str(e).split())}), and plan.sql runs with "
                    "DuckDB's external access off: it sees the plan's tables only. For a query you wrote, "
                    "pass plan.sql(query, external_access=True) (CLI: plitzer plan ... --external-access)"
                )
                raise ConfigError(msg) from e
            return result
        finally:
            con.close()

    def scan(self, epoch: int, rank: int = 0) -> pl.LazyFrame:
        """A LazyFrame of exactly the rows (documents) that ``rank`` reads in ``epoch``.

        Columns: epoch, window_index, position, file, row_group, row, and the token
        column. Nothing is read until the frame is collected. A selected plan
        (``where=``) yields the selected rows only, ``row`` numbering them in the file's
        row group.
        """
        rank = check_int("rank", rank, 0, "ranks count from 0")
        if rank >= self.settings.world:
            msg = f"rank={rank} is out of range for world={self.settings.world}; use 0..{self.settings.world - 1}"
            raise ConfigError(msg)
        ep = self.epoch(epoch)
        sel = ep.read_rank == rank
        positions = ep.read_position[sel]
        windows = ep.read_window[sel]
        f = self.index.with_columns((pl.col("rows").cum_sum().over("file_index") - pl.col("rows")).alias("row_offset"))
        col = self.dataset.column
        selected = self.dataset if isinstance(self.dataset, SelectedRows) else None
        parts = []
        for p, w in zip(positions.tolist(), windows.tolist(), strict=True):
            rg = int(ep.order[p])
            r = f.row(rg, named=True)
            loc = self.dataset.location(r["file_index"])
            lf = (
                _scan_parquet(loc, self.dataset.storage(r["file_index"]))
                .select(col)
                .slice(r["row_offset"], r["rows"])
                .with_row_index("row")
            )
            kept = None if selected is None else selected.selected_rows(rg)
            if kept is not None:
                lf = lf.filter(pl.col("row").is_in(pl.Series(kept, dtype=pl.UInt32).implode()))
            lf = lf.select(
                pl.lit(epoch, pl.Int64).alias("epoch"),
                pl.lit(w, pl.Int64).alias("window_index"),
                pl.lit(p, pl.Int64).alias("position"),
                pl.lit(r["file"]).alias("file"),
                pl.lit(r["row_group"], pl.Int64).alias("row_group"),
                pl.col("row").cast(pl.Int64),
                pl.col(col),
            )
            parts.append(lf)
        if not parts:
            return pl.LazyFrame(
                schema={
                    "epoch": pl.Int64,
                    "window_index": pl.Int64,
                    "position": pl.Int64,
                    "file": pl.String,
                    "row_group": pl.Int64,
                    "row": pl.Int64,
                    col: pl.List(pl.UInt32 if self.dataset.dtype == "uint32" else pl.Int32),
                }
            )
        return pl.concat(parts)


class LanesPlan(Plan):
    """``base`` cut into ``lanes`` lanes (a layout stage, :mod:`planner.layout`): the same windows.

    Units, epochs and the run's tokens are the base plan's (its epoch order is shared,
    so a mixture's live stages reach it); each epoch's cuts, ``z`` and reads are
    computed again for ``lanes`` (``z`` counting the run's tokens mod ``lanes``).
    """

    def __init__(self, base: Plan, lanes: int) -> None:  # the base's index and order: nothing read again
        self.base = base
        self.dataset = base.dataset
        self.settings = replace(base.settings, lanes=lanes)
        self._tokens, self._rows, self._empty = base._tokens, base._rows, base._empty
        self.order = base.order
        self._epochs = OrderedDict()
        self._bases: dict[int, EpochPlan] = {}
        self.layout = base.layout

    def epoch(self, epoch: int) -> EpochPlan:
        ep = self.base.epoch(epoch)
        got = self._epochs.get(epoch)
        if got is None or self._bases.get(epoch) is not ep:  # the base planned it again (a live stage)
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
            self._epochs[epoch] = got
            self._bases[epoch] = ep
            if len(self._epochs) > 4:
                old, _ = self._epochs.popitem(last=False)
                self._bases.pop(old, None)
        return got


def _scan_parquet(location: str, storage: Storage) -> pl.LazyFrame:
    """Polars' scan of one file, with the options of the storage that listed it."""
    return pl.scan_parquet(location, storage_options=storage.polars_options() or None)


def _duckdb_filesystems(idx: RowGroupIndex) -> list[Any]:
    """The filesystems DuckDB needs: one per protocol, routing each path to its own source's storage."""
    seen: dict[int, Storage] = {}
    for f in range(len(idx.files)):
        st = idx.storage(f)
        seen.setdefault(id(st), st)
    return duckdb_filesystems(list(seen.values()))
