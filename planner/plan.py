"""Each epoch's plan as tables: row-group order, windows, lane cuts, and reads.

With G row groups, B lanes, W row groups per window and ``world`` ranks:

1. The row groups of epoch ``e`` are taken in the order ``permutation(G, key(seed, e, 1))``.
2. Windows are consecutive runs of W row groups in that order (the last may be shorter).
3. A window's stream is its row groups in that order, each one's documents in
   storage order; ``token_start`` is where a row group begins in that stream.
4. Lane cuts ``c_k = floor(k * T_w / B)`` split the stream by tokens; a document
   belongs to lane ``max{k : c_k <= start}``, so each lane's slice is one
   contiguous stretch and every document is in exactly one lane.
5. Rank ``r`` owns lanes ``[r*B/world, (r+1)*B/world)`` and reads only the row
   groups that can hold a document starting in its cut range.

A worked example: three row groups of 5, 0 and 7 tokens in one window, B = 4 lanes:
T_w = 12, cuts 0, 3, 6, 9. A row group starting at token 5 with 7 tokens holds
documents starting in [5, 11], i.e. lanes 1..3. The same numbers come out of
``Plan.lanes`` and ``Plan.row_groups``, and the loader runs from these tables.

Everything here is numpy on the index's columns: no I/O, no hidden state.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl
from numpy.typing import NDArray

from planner._hash import key, permutation
from planner.dataset import Index, ensure_index
from planner.errors import ConfigError

__all__ = ["EpochPlan", "Plan", "PlanSettings", "lane_of", "plan", "plan_epoch"]

I64 = NDArray[np.int64]


def _check_int(name: str, value: object, low: int, fix: str) -> int:
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
        _check_int("lanes", self.lanes, 1, "lanes is the number of sequences per global batch")
        _check_int("window", self.window, 1, "window is the number of row groups shuffled together")
        _check_int("world", self.world, 1, "world is the number of ranks (GPUs)")
        if self.lanes % self.world:
            divisors = [d for d in range(1, self.lanes + 1) if self.lanes % d == 0]
            msg = (
                f"lanes={self.lanes} is not divisible by world={self.world}; every rank must own "
                f"the same number of lanes: use a world among {divisors[:12]} or lanes a multiple of {self.world}"
            )
            raise ConfigError(msg)


def lane_of(x: I64, window_tokens: I64, lanes: int) -> I64:
    """Lane owning a document that starts at token ``x`` of a window of ``window_tokens``.

    ``max{k : floor(k*T/B) <= x}`` equals ``ceil((x+1)*B/T) - 1`` capped at B-1,
    computed without floating point; an empty window (T = 0) gives lane B-1.
    """
    t = np.maximum(window_tokens, 1)
    lane = np.minimum(lanes - 1, ((x + 1) * lanes - 1) // t)
    return np.where(window_tokens > 0, lane, lanes - 1)


@dataclass(frozen=True, slots=True)
class EpochPlan:
    """One epoch's plan as arrays (positions are indexes into the epoch order)."""

    epoch: int
    order: I64  # row-group id (row of the index) at each position
    window: I64  # window of each position
    token_start: I64  # first token of each position in its window's stream
    window_tokens: I64  # T_w per window
    first_rank: I64  # first rank that reads each position (-1: nobody, no rows)
    last_rank: I64
    read_window: I64  # reads, sorted by (window, rank, position)
    read_rank: I64
    read_position: I64

    @property
    def windows(self) -> int:
        return len(self.window_tokens)

    def cuts(self, window: int, lanes: int) -> I64:
        """``c_0..c_B`` of one window (with ``c_B = T_w``)."""
        k = np.arange(lanes + 1, dtype=np.int64)
        cuts: I64 = (k * self.window_tokens[window]) // lanes
        return cuts

    def reads_of(self, window: int, rank: int) -> I64:
        """Positions a rank reads in a window, in stream order."""
        lo = np.searchsorted(self.read_window, window, side="left")
        hi = np.searchsorted(self.read_window, window, side="right")
        ranks = self.read_rank[lo:hi]
        a = lo + np.searchsorted(ranks, rank, side="left")
        b = lo + np.searchsorted(ranks, rank, side="right")
        return self.read_position[a:b]


def start_range(token_start: I64, tokens: I64, empty_docs: I64) -> tuple[I64, I64]:
    """First and last token position at which a row group's documents can start.

    A row group's documents start in ``[S, E-1]`` (``E = S + tokens``), or also at
    ``E`` when it holds empty documents (they may trail), or only at ``S`` when it
    has no tokens. Only the footer's counts are needed.
    """
    return token_start, token_start + tokens - ((tokens > 0) & (empty_docs == 0))


def plan_epoch(tokens: I64, rows: I64, empty_docs: I64, settings: PlanSettings, epoch: int) -> EpochPlan:
    """The plan of one epoch, from the index's per-row-group counts."""
    s = settings
    g = len(tokens)
    order = permutation(g, key(s.seed, epoch, 1))
    pos = np.arange(g, dtype=np.int64)
    window = pos // s.window
    tok = tokens[order]
    n = rows[order]
    emp = empty_docs[order]
    starts = np.arange(0, g, s.window, dtype=np.int64)
    window_tokens = np.add.reduceat(tok, starts) if g else np.zeros(0, np.int64)
    before = np.cumsum(tok) - tok
    token_start = before - before[starts][window] if g else before
    lo, hi = start_range(token_start, tok, emp)
    t_w = window_tokens[window]
    lanes_per_rank = s.lanes // s.world
    first = lane_of(lo, t_w, s.lanes) // lanes_per_rank
    last = lane_of(hi, t_w, s.lanes) // lanes_per_rank
    first = np.where(n > 0, first, -1)
    last = np.where(n > 0, last, -1)

    # A rank with an empty cut range (c_lo == c_hi, possible when T_w < B) owns no
    # document, so it reads nothing even if a row group spans across it.
    r = np.arange(s.world, dtype=np.int64)
    c_lo = (r * lanes_per_rank)[None, :] * window_tokens[:, None] // s.lanes
    c_hi = ((r + 1) * lanes_per_rank)[None, :] * window_tokens[:, None] // s.lanes
    nonempty = c_lo < c_hi
    nonempty[:, -1] = True

    count = np.where(n > 0, last - first + 1, 0)
    rep = np.repeat(pos, count)
    offs = np.cumsum(count) - count
    rank = first[rep] + (np.arange(len(rep), dtype=np.int64) - offs[rep])
    keep = (rank == first[rep]) | (rank == last[rep]) | nonempty[window[rep], rank]
    rep, rank = rep[keep], rank[keep]
    sort = np.lexsort((rep, rank, window[rep]))
    return EpochPlan(
        epoch=epoch,
        order=order,
        window=window,
        token_start=token_start,
        window_tokens=window_tokens.astype(np.int64, copy=False),
        first_rank=first,
        last_rank=last,
        read_window=window[rep][sort],
        read_rank=rank[sort],
        read_position=rep[sort],
    )


class Plan:
    """A dataset's plan for given settings: any epoch's tables, SQL over them.

    Build one with :func:`plan`. Tables are Polars frames computed on demand
    from the index (the last few epochs are kept).
    """

    def __init__(self, idx: Index, settings: PlanSettings) -> None:
        self.dataset = idx
        self.settings = settings
        f = idx.frame
        self._tokens = f["tokens"].to_numpy().astype(np.int64)
        self._rows = f["rows"].to_numpy().astype(np.int64)
        self._empty = f["empty_docs"].to_numpy().astype(np.int64)
        self._epochs: OrderedDict[int, EpochPlan] = OrderedDict()

    def __repr__(self) -> str:
        s = self.settings
        return (
            f"Plan({self.dataset.row_groups} row groups, {self.tokens:,} tokens, seed={s.seed}, "
            f"lanes={s.lanes}, window={s.window}, world={s.world})"
        )

    @property
    def index(self) -> pl.DataFrame:
        """The row-group index (one row per row group)."""
        return self.dataset.frame

    @property
    def tokens(self) -> int:
        return int(self._tokens.sum())

    @property
    def windows(self) -> int:
        """Windows per epoch (the same for every epoch)."""
        return -(-len(self._tokens) // self.settings.window)

    def epoch(self, epoch: int) -> EpochPlan:
        """The arrays of one epoch's plan (cached)."""
        epoch = _check_int("epoch", epoch, 0, "epochs count from 0")
        got = self._epochs.get(epoch)
        if got is None:
            got = plan_epoch(self._tokens, self._rows, self._empty, self.settings, epoch)
            self._epochs[epoch] = got
            if len(self._epochs) > 4:
                self._epochs.popitem(last=False)
        else:
            self._epochs.move_to_end(epoch)
        return got

    def row_groups(self, epoch: int) -> pl.DataFrame:
        """epoch, window, position, file, row_group, rows, tokens, token_start, first_rank, last_rank."""
        ep = self.epoch(epoch)
        f = self.index[ep.order]
        read = ep.first_rank >= 0
        return pl.DataFrame(
            {
                "epoch": np.full(len(ep.order), epoch, dtype=np.int64),
                "window": ep.window,
                "position": np.arange(len(ep.order), dtype=np.int64),
                "file": f["file"],
                "row_group": f["row_group"],
                "rows": f["rows"],
                "tokens": f["tokens"],
                "token_start": ep.token_start,
                "first_rank": pl.Series(ep.first_rank).set(pl.Series(~read), None),
                "last_rank": pl.Series(ep.last_rank).set(pl.Series(~read), None),
            }
        )

    def lanes(self, epoch: int) -> pl.DataFrame:
        """epoch, window, lane, rank, token_start, token_end: each lane's cut range."""
        ep = self.epoch(epoch)
        b = self.settings.lanes
        nw = ep.windows
        window = np.repeat(np.arange(nw, dtype=np.int64), b)
        lane = np.tile(np.arange(b, dtype=np.int64), nw)
        t = ep.window_tokens[window]
        return pl.DataFrame(
            {
                "epoch": np.full(len(lane), epoch, dtype=np.int64),
                "window": window,
                "lane": lane,
                "rank": lane // (b // self.settings.world),
                "token_start": lane * t // b,
                "token_end": (lane + 1) * t // b,
            }
        )

    def reads(self, epoch: int) -> pl.DataFrame:
        """epoch, window, rank, file, row_group, bytes: each rank's reads, in order."""
        ep = self.epoch(epoch)
        f = self.index[ep.order[ep.read_position]]
        return pl.DataFrame(
            {
                "epoch": np.full(len(ep.read_position), epoch, dtype=np.int64),
                "window": ep.read_window,
                "rank": ep.read_rank,
                "file": f["file"],
                "row_group": f["row_group"],
                "bytes": f["byte_length"],
            }
        )

    def sql(self, query: str, epochs: Iterable[int] = (0,)) -> pl.DataFrame:
        """Run DuckDB SQL over ``index``, ``row_groups``, ``lanes`` and ``reads``.

        The tables hold the given epochs. Frames reach DuckDB through Arrow,
        without a copy into a database.

        Examples
        --------
        >>> import planner, plitzer.synth, tempfile
        >>> d = tempfile.mkdtemp(); _ = plitzer.synth.write(d, tokens=50_000, seed=2)
        >>> p = planner.plan(d, lanes=8, window=2, world=2)
        >>> p.sql("select count(*) as n from row_groups")["n"][0] == p.index.height
        True
        """
        import duckdb

        eps = list(epochs)
        tables = {
            "index": self.index,
            "row_groups": pl.concat([self.row_groups(e) for e in eps]) if eps else self.row_groups(0).clear(),
            "lanes": pl.concat([self.lanes(e) for e in eps]) if eps else self.lanes(0).clear(),
            "reads": pl.concat([self.reads(e) for e in eps]) if eps else self.reads(0).clear(),
        }
        con = duckdb.connect()
        try:
            for name, frame in tables.items():
                con.register(name, frame.to_arrow())
            # read_parquet('s3://...') in the query reaches the dataset's objects through
            # the same s3fs filesystem (DuckDB's httpfs extension may not be installable).
            fs = getattr(self.dataset.storage(0), "duckdb_filesystem", None)
            if fs is not None:
                con.register_filesystem(fs())
            result: pl.DataFrame = con.sql(query).pl()
            return result
        finally:
            con.close()

    def scan(self, epoch: int, rank: int = 0) -> pl.LazyFrame:
        """A LazyFrame of exactly the rows (documents) that ``rank`` reads in ``epoch``.

        Columns: epoch, window, position, file, row_group, row, and the token
        column. Nothing is read until the frame is collected.
        """
        rank = _check_int("rank", rank, 0, "ranks count from 0")
        if rank >= self.settings.world:
            msg = f"rank={rank} is out of range for world={self.settings.world}; use 0..{self.settings.world - 1}"
            raise ConfigError(msg)
        ep = self.epoch(epoch)
        sel = ep.read_rank == rank
        positions = ep.read_position[sel]
        windows = ep.read_window[sel]
        f = self.index.with_columns((pl.col("rows").cum_sum().over("file_index") - pl.col("rows")).alias("row_offset"))
        col = self.dataset.column
        parts = []
        for p, w in zip(positions.tolist(), windows.tolist(), strict=True):
            r = f.row(int(ep.order[p]), named=True)
            loc = self.dataset.location(r["file_index"])
            lf = (
                _scan_parquet(loc, self.dataset)
                .select(col)
                .slice(r["row_offset"], r["rows"])
                .with_row_index("row")
                .select(
                    pl.lit(epoch, pl.Int64).alias("epoch"),
                    pl.lit(w, pl.Int64).alias("window"),
                    pl.lit(p, pl.Int64).alias("position"),
                    pl.lit(r["file"]).alias("file"),
                    pl.lit(r["row_group"], pl.Int64).alias("row_group"),
                    pl.col("row").cast(pl.Int64),
                    pl.col(col),
                )
            )
            parts.append(lf)
        if not parts:
            return pl.LazyFrame(
                schema={
                    "epoch": pl.Int64,
                    "window": pl.Int64,
                    "position": pl.Int64,
                    "file": pl.String,
                    "row_group": pl.Int64,
                    "row": pl.Int64,
                    col: pl.List(pl.UInt32 if self.dataset.dtype == "uint32" else pl.Int32),
                }
            )
        return pl.concat(parts)


def _scan_parquet(location: str, idx: Index) -> pl.LazyFrame:
    opts = getattr(idx.storage(0), "polars_options", None)
    if location.startswith("s3://") and opts is not None:
        return pl.scan_parquet(location, storage_options=opts())
    return pl.scan_parquet(location)


def plan(
    source: Index | str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    seed: int = 0,
    lanes: int = 512,
    window: int = 64,
    world: int = 1,
    *,
    column: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> Plan:
    """The plan of ``source`` (a path, URL, list, or an :class:`Index`).

    Examples
    --------
    >>> import planner, plitzer.synth, tempfile
    >>> d = tempfile.mkdtemp(); _ = plitzer.synth.write(d, tokens=50_000, seed=3)
    >>> p = planner.plan(d, seed=0, lanes=8, window=4, world=2)
    >>> sorted(p.reads(0)["rank"].unique().to_list())
    [0, 1]
    """
    settings = PlanSettings(seed=seed, lanes=lanes, window=window, world=world)
    return Plan(ensure_index(source, column=column, storage_options=storage_options), settings)
