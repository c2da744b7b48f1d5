"""Mixtures: named sources with weights and stages, interleaved into one stream of row groups.

A mixture is a few named sources (each a dataset as :func:`planner.index` takes it, with its own
column and storage options) and weights: shares of *tokens*, constant or in stages
that start at global steps. Everything here is integer arithmetic on footer counts.

Each source has its own infinite stream of row groups: its epochs one after the
other, source epoch ``k`` being ``permutation(G_s, key(seed, source_key(name), k, 3))``
of its row groups. Within a stage, the sources' streams are merged by *virtual finish time*, as weighted
fair queueing does: the ``m``-th row group a source gives in the stage gets the key
``floor(C_s(m) * W / w_s)``, with ``C_s(m)`` its tokens in the stage through that row
group, ``w_s`` its weight and ``W`` the stage's total weight: the position in the
stage's token stream at which the source *should* have given that much. The mixture
takes row groups in key order (ties: source order, then stream order). Integers only:
no floating point decides the order (weights are exact integers; see
:func:`parse_stages`). After any prefix of a stage a source is behind its weight's
share by less than one of its own row groups, and ahead by at most its share of one
largest row group of every source (docs/design.md, "Mixtures", proves it and gives a
worked example).

The merged stream is cut into windows of W row groups over the whole run, each
window cut into lanes as one source's are (docs/glossary.md, "Cut"; the run's tokens so far give ``z``). A stage
that starts at step ``t`` starts at the first window whose first token is at or after
run token ``t * lanes * seq_len``; every source goes on from where the previous stage
left it. A mixture epoch is ``T`` = the tokens of the sources the first stage weighs
(so a source joining later moves no epoch): epoch ``e`` holds the windows whose first
token falls in ``[e*T, (e+1)*T)``. With weights
proportional to the sources' sizes each source's epochs line up with the mixture's;
a source weighted above its size repeats, one below is partly used per mixture epoch.

A mixture of one source is exactly that source's own plan (docs/design.md, "The order").

>>> from planner.mixture import interleave_demo
>>> interleave_demo([[3, 3, 3, 3], [2, 2, 2, 2]], weights=[1, 1])  # (source, row group) in stream order
[(1, 0), (0, 0), (1, 1), (0, 1), (1, 2), (1, 3), (0, 2), (0, 3)]
>>> interleave_demo([[3, 3, 3, 3], [2, 2, 2, 2]], weights=[3, 1])
[(0, 0), (0, 1), (1, 0), (0, 2), (0, 3), (1, 1), (1, 2), (1, 3)]
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl
import pyarrow.parquet as pq
from numpy.typing import NDArray

from planner.column import TokenDtype
from planner.dataset import Index, ensure_index
from planner.errors import ConfigError
from planner.hashing import key, permutation
from planner.layout import Layout
from planner.plan import EpochOrder, EpochPlan, Permutation, Plan, PlanSettings, layout_epoch, row_group_counts
from planner.rowgroups import stream_counts, with_selected
from planner.sources import SourceSpec, Stage, source_specs
from planner.storage import FileStat, Storage

__all__ = [
    "Interleave",
    "MixtureIndex",
    "MixturePlan",
    "finish_keys",
    "interleave_demo",
    "is_mixture",
    "mixture_index",
    "source_key",
]

I64 = NDArray[np.int64]


def is_mixture(source: object) -> bool:
    """A dict of named sources (or an index built from one)."""
    return isinstance(source, (Mapping, MixtureIndex))


def source_key(name: str) -> int:
    """The 64-bit key of a source's name in its permutations (first 8 bytes of sha256)."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little")


class MixtureIndex:
    """The sources' indexes side by side: one frame, one run of files.

    ``frame`` is the sources' frames one after the other (sources in name order),
    with ``source`` and ``source_index`` columns and ``file_index`` numbered over
    all files; row-group ids (rows of the frame) are global. :meth:`part` maps a
    global row group to its source's index and row.
    """

    def __init__(self, specs: Sequence[SourceSpec], parts: Sequence[Index]) -> None:
        self.specs = list(specs)
        self.parts = list(parts)
        self.names = [s.name for s in specs]
        dtypes = {ix.dtype for ix in parts}
        if len(dtypes) > 1:
            each = ", ".join(f"{n}: {ix.dtype}" for n, ix in zip(self.names, parts, strict=True))
            msg = (
                f"sources deliver different token dtypes ({each}); a batch has one dtype: use sources whose "
                "columns all fit int32, or all need uint32"
            )
            raise ConfigError(msg)
        for n, ix in zip(self.names, parts, strict=True):
            if ix.tokens == 0:
                msg = f"source {n!r} ({ix.source}) has no tokens; remove it from the mixture"
                raise ConfigError(msg)
        self.dtype: TokenDtype = parts[0].dtype
        files = np.array([len(ix.files) for ix in parts], dtype=np.int64)
        rgs = np.array([ix.row_groups for ix in parts], dtype=np.int64)
        self._file_base = np.concatenate([[0], np.cumsum(files)])
        self._rg_base = np.concatenate([[0], np.cumsum(rgs)])
        frames = []
        selected = any("tokens_selected" in ix.frame.columns for ix in parts)
        for i, (n, ix) in enumerate(zip(self.names, parts, strict=True)):
            frames.append(
                (with_selected(ix.frame) if selected else ix.frame).with_columns(
                    (pl.col("file_index") + int(self._file_base[i])).alias("file_index"),
                    pl.lit(n).alias("source"),
                    pl.lit(i, pl.Int64).alias("source_index"),
                    pl.int_range(pl.len(), dtype=pl.Int64).alias("source_row_group"),
                )
            )
        self.frame = pl.concat(frames, how="vertical_relaxed")
        self.column = ",".join(f"{n}={ix.column}" for n, ix in zip(self.names, parts, strict=True))
        h = hashlib.sha256()
        for n, ix in zip(self.names, parts, strict=True):
            h.update(f"{n}\t{ix.fingerprint}\n".encode())
        self.fingerprint = h.hexdigest()
        self.source = "{" + ", ".join(f"{n!r}: {ix.source!r}" for n, ix in zip(self.names, parts, strict=True)) + "}"

    def __repr__(self) -> str:
        return f"MixtureIndex({len(self.parts)} sources, {self.row_groups} row groups, {self.tokens:,} tokens)"

    @property
    def files(self) -> list[FileStat]:
        return [f for ix in self.parts for f in ix.files]

    @property
    def tokens(self) -> int:
        return int(stream_counts(self.frame)[0].sum())

    @property
    def row_groups(self) -> int:
        return self.frame.height

    def _file(self, file_index: int) -> tuple[Index, int]:
        i = int(np.searchsorted(self._file_base, file_index, side="right")) - 1
        return self.parts[i], file_index - int(self._file_base[i])

    def part(self, row_group: int) -> tuple[Index, int]:
        """The source index holding global row group ``row_group``, and its row there."""
        i = int(np.searchsorted(self._rg_base, row_group, side="right")) - 1
        return self.parts[i], row_group - int(self._rg_base[i])

    def selected_rows(self, row_group: int) -> NDArray[np.int64] | None:
        """The rows of global ``row_group`` its source's selection keeps (None: every row)."""
        sub, local = self.part(row_group)
        return sub.selected_rows(local)

    def config_fields(self) -> dict[str, Any]:
        """The checkpoint fields of a mixture: its sources (name, fingerprint), and their selections by name."""
        each = [(n, p.config_fields()) for n, p in zip(self.names, self.parts, strict=True)]
        out: dict[str, Any] = {"sources": [[n, p.fingerprint] for n, p in zip(self.names, self.parts, strict=True)]}
        where = [[n, c["where"]] for n, c in each if "where" in c]
        lengths = [[n, c["length_column"]] for n, c in each if c.get("length_column")]
        if where:
            out["where"] = where
        if lengths:
            out["length_column"] = lengths
        return out

    def source_of(self, row_group: int) -> str:
        return self.names[int(np.searchsorted(self._rg_base, row_group, side="right")) - 1]

    def storage(self, file_index: int) -> Storage:
        ix, fi = self._file(file_index)
        return ix.storage(fi)

    def file(self, file_index: int) -> FileStat:
        ix, fi = self._file(file_index)
        return ix.file(fi)

    def metadata(self, file_index: int) -> pq.FileMetaData:
        ix, fi = self._file(file_index)
        return ix.metadata(fi)

    def location(self, file_index: int, row_group: int | None = None) -> str:
        ix, fi = self._file(file_index)
        return ix.location(fi, row_group)

    def column_of(self, file_index: int) -> str:
        return self._file(file_index)[0].column

    def sources_table(self) -> pl.DataFrame:
        """name, path, column, fingerprint, tokens, row_groups, files: one row per source."""
        return pl.DataFrame(
            {
                "name": self.names,
                "path": [s.path if isinstance(s.path, str) else ",".join(s.path) for s in self.specs],
                "column": [ix.column for ix in self.parts],
                "fingerprint": [ix.fingerprint for ix in self.parts],
                "tokens": [ix.tokens for ix in self.parts],
                "row_groups": [ix.row_groups for ix in self.parts],
                "files": [len(ix.files) for ix in self.parts],
            }
        )


def mixture_index(
    sources: Mapping[str, Any] | MixtureIndex,
    *,
    column: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    where: str | None = None,
    length_column: str | None = None,
    select: Callable[[Index, SourceSpec], Index] | None = None,
    text: Callable[[SourceSpec], Index] | None = None,
) -> MixtureIndex:
    """Index every source of a dict of named sources (footers only, cached).

    A source with a ``where`` (its own, else the one given here) is selected by
    ``select`` (the runtime's selection pass, ``plitzer.select``), and a text source
    (one with a ``tokenizer``) is indexed by ``text`` (its counting pass tokenizes):
    plitzer passes both, planner runs neither, and without them such a source is a
    ConfigError.
    """
    if isinstance(sources, MixtureIndex):
        return sources
    specs = source_specs(
        sources, column=column, storage_options=storage_options, where=where, length_column=length_column
    )
    parts = []
    for s in specs:
        if s.text is not None:
            if text is None:
                msg = (
                    f"source {s.name!r} is text (tokenizer=): its token counts come from a tokenizing pass, "
                    "which planner does not run; plan it through plitzer (plitzer.Loader(...).plan)"
                )
                raise ConfigError(msg)
            parts.append(text(s))
            continue
        ix = ensure_index(s.path, column=s.column, storage_options=s.storage_options)
        if s.where is not None:
            if select is None:
                msg = f"source {s.name!r}: where= needs the runtime's selection pass; import plitzer first"
                raise ConfigError(msg)
            ix = select(ix, s)
        parts.append(ix)
    return MixtureIndex(specs, parts)


class _Source:
    """One source's infinite stream of row groups: its epochs' permutations in turn.

    ``cum(p)`` is the tokens of the stream's first ``p`` items and ``count_below(a)``
    how many leading items hold fewer than ``a`` tokens together: each needs the
    permutation of one source epoch (a few are kept), never the items before it.
    """

    def __init__(self, name: str, tokens: I64, base: int, seed: int) -> None:
        self.g = len(tokens)
        self.tokens = tokens
        self.base = base
        self.key = source_key(name)
        self.seed = seed
        self.epoch_tokens = int(tokens.sum())
        self.largest = int(tokens.max()) if self.g else 0
        self._perm: dict[int, tuple[I64, I64]] = {}

    def _epoch(self, e: int) -> tuple[I64, I64]:
        """Source epoch ``e``'s permutation and its prefix sums of tokens (``g + 1`` of them)."""
        got = self._perm.get(e)
        if got is None:
            perm = permutation(self.g, key(self.seed, self.key, e, 3))
            prefix = np.zeros(self.g + 1, np.int64)
            np.cumsum(self.tokens[perm], out=prefix[1:])
            if len(self._perm) > 8:
                self._perm.clear()
            got = self._perm[e] = (perm, prefix)
        return got

    def items(self, start: int, stop: int) -> tuple[I64, I64, I64]:
        """Items ``[start, stop)`` of the stream: global row group, tokens, source epoch."""
        j = np.arange(start, stop, dtype=np.int64)
        k = j // self.g
        out = np.empty(len(j), np.int64)
        for e in np.unique(k).tolist():
            perm = self._epoch(e)[0]
            sel = k == e
            out[sel] = perm[j[sel] - e * self.g]
        return out + self.base, self.tokens[out], k

    def cum(self, p: int) -> int:
        """Tokens of the stream's first ``p`` items."""
        e, r = divmod(p, self.g)
        return e * self.epoch_tokens + (int(self._epoch(e)[1][r]) if r else 0)

    def count_below(self, a: int) -> int:
        """How many leading items hold fewer than ``a`` tokens (the largest ``p`` with ``cum(p) < a``)."""
        if a <= 0:
            return 0
        e = (a - 1) // self.epoch_tokens
        r = a - e * self.epoch_tokens
        return e * self.g + int(np.searchsorted(self._epoch(e)[1][1:], r, side="left"))

    def count_bounds(self, a: int) -> tuple[int, int]:
        """Bounds on :meth:`count_below` from the epoch arithmetic alone (no permutation)."""
        if a <= 0:
            return 0, 0
        e = (a - 1) // self.epoch_tokens
        return e * self.g, (e + 1) * self.g


@dataclass(frozen=True)
class _Entry:
    """Where a stage entered the run: its first window, the run's tokens before it, and
    the items each source had given by then (``pos``) with their tokens (``cum``)."""

    stage: int
    window: int
    run: int
    pos: tuple[int, ...]
    cum: tuple[int, ...]


class Interleave:
    """A mixture's epoch order: the sources' streams merged by virtual finish time, in stages.

    Units (windows) are numbered over the whole run; epoch ``e`` holds the windows
    whose first token is in ``[e*T, (e+1)*T)``, ``T`` being the tokens of the sources
    the first stage weighs (so a source that joins later, at weight 0 until then, moves
    no epoch: docs/design.md, "Epochs of a mixture").

    Nothing is replayed from the run's start (docs/design.md, "Seeking a mixture"): a
    stage's merge takes every item of key below ``K`` first, so the items each source
    has given after ``n`` items of a stage follow from one binary search over ``K`` (each
    probe a ``searchsorted`` per source in one source epoch's prefix sums). What is kept is
    one entry per stage entered, a few source epochs' permutations, and the last few
    epochs' items: nothing grows with the run's length.
    """

    def __init__(
        self,
        idx: MixtureIndex,
        counts: tuple[I64, I64, I64],
        settings: PlanSettings,
        stages: Sequence[Stage],
        seq_len: int | None,
        layout: Layout | None = None,
    ) -> None:
        self._tokens, self._rows, self._empty = counts
        self.settings = settings
        self.stages = tuple(stages)
        self.seq_len = seq_len
        self.layout_stages = layout  # places the weight stages' steps in the run's tokens
        sizes = idx._rg_base
        first = self.stages[0].weights
        self.total = sum(int(self._tokens[int(sizes[i]) : int(sizes[i + 1])].sum()) for i, w in enumerate(first) if w)
        self.total = self.total or int(self._tokens.sum())  # the first stage's sources hold no token
        self._rg_base = sizes
        self._sources = [
            _Source(n, self._tokens[int(sizes[i]) : int(sizes[i + 1])], int(sizes[i]), settings.seed)
            for i, n in enumerate(idx.names)
        ]
        n = len(self._sources)
        self._entries = [_Entry(0, 0, 0, (0,) * n, (0,) * n)]
        self._states: dict[tuple[int, int], tuple[int, ...]] = {}
        self._segments: OrderedDict[int, tuple[I64, I64]] = OrderedDict()
        self._firsts: dict[int, int] = {}

    @property
    def items_kept(self) -> int:
        """Items (row groups of the stream) held now: the cached epochs' and the kept permutations'."""
        seg = sum(len(a) for a, _ in self._segments.values())
        return seg + sum(len(p) for s in self._sources for p, _ in s._perm.values())

    # -- one stage: counts after n items, found by key --------------------------------------

    def _active(self, ent: _Entry) -> tuple[list[tuple[int, int]], int]:
        weights = self.stages[ent.stage].weights
        active = [(i, w) for i, w in enumerate(weights) if w > 0]
        return active, sum(w for _, w in active)

    def _at_key(self, ent: _Entry, k: int) -> list[int]:
        """Items each source gave in the stage before key ``k`` (every item of key < k)."""
        active, total_w = self._active(ent)
        out = [0] * len(self._sources)
        for i, w in active:
            # key < k  <=>  C * W < k * w  <=>  C < ceil(k * w / W)
            a = ent.cum[i] + -(-k * w // total_w)
            out[i] = max(0, self._sources[i].count_below(a) - ent.pos[i])
        return out

    def _at_key_bounds(self, ent: _Entry, k: int) -> tuple[int, int]:
        active, total_w = self._active(ent)
        lo = hi = 0
        for i, w in active:
            a, b = self._sources[i].count_bounds(ent.cum[i] + -(-k * w // total_w))
            lo += max(0, a - ent.pos[i])
            hi += max(0, b - ent.pos[i])
        return lo, hi

    def _given(self, ent: _Entry, counts: Sequence[int]) -> int:
        """Tokens the stage gave with ``counts`` items of each source."""
        return sum(
            s.cum(ent.pos[i] + c) - ent.cum[i] for i, (s, c) in enumerate(zip(self._sources, counts, strict=True)) if c
        )

    def _ties(self, ent: _Entry, k: int, counts: list[int]) -> list[tuple[int, I64]]:
        """The items of key exactly ``k`` after ``counts``, per source in source order: (source, tokens)."""
        nxt = self._at_key(ent, k + 1)
        out = []
        for i, (a, b) in enumerate(zip(counts, nxt, strict=True)):
            if b > a:
                p = ent.pos[i]
                out.append((i, self._sources[i].items(p + a, p + b)[1]))
        return out

    def _state(self, ent: _Entry, n: int) -> tuple[int, ...]:
        """Items each source gave in the first ``n`` items of the stage."""
        got = self._states.get((ent.stage, n))
        if got is not None:
            return got
        active, _ = self._active(ent)
        biggest = max(self._sources[i].largest for i, _ in active)
        lo, hi = 0, (n + 1) * max(1, biggest) + sum(self._sources[i].largest for i, _ in active) + 1
        while hi - lo > 1:  # the largest key k with fewer than n + 1 items before it
            mid = (lo + hi) // 2
            b_lo, b_hi = self._at_key_bounds(ent, mid)
            if b_hi <= n or (b_lo <= n and sum(self._at_key(ent, mid)) <= n):
                lo = mid
            else:
                hi = mid
        counts = self._at_key(ent, lo)
        left = n - sum(counts)
        for i, tok in self._ties(ent, lo, counts) if left else []:
            take = min(left, len(tok))
            counts[i] += take
            left -= take
        out = tuple(counts)
        if len(self._states) > 4096:
            self._states.clear()
        self._states[(ent.stage, n)] = out
        return out

    def _first_reaching(self, ent: _Entry, y: int) -> int:
        """The fewest items of the stage that hold at least ``y`` tokens."""
        if y <= 0:
            return 0
        active, _ = self._active(ent)
        # Before key k the stage holds D tokens with k - sum(t_s) <= D < k (docs/design.md).
        lo, hi = y, y + sum(self._sources[i].largest for i, _ in active) + 1
        while self._given(ent, self._at_key(ent, hi)) < y:
            lo, hi = hi, 2 * hi
        while hi - lo > 1:  # the largest key k before which the stage holds fewer than y tokens
            mid = (lo + hi) // 2
            if self._given(ent, self._at_key(ent, mid)) < y:
                lo = mid
            else:
                hi = mid
        counts = self._at_key(ent, lo)
        d, n = self._given(ent, counts), sum(counts)
        for _, tok in self._ties(ent, lo, counts):
            c = d + np.cumsum(tok)
            j = int(np.searchsorted(c, y, side="left"))
            if j < len(tok):
                return n + j + 1
            d, n = int(c[-1]), n + len(tok)
        msg = f"interleave: no item of key {lo} reaches token {y} of stage {ent.stage}"  # unreachable by the bound
        raise AssertionError(msg)

    # -- the stages of the run -------------------------------------------------------------

    def run_at(self, step: int) -> int:
        """The run's tokens before global step ``step`` (under the layout stages, :mod:`planner.layout`)."""
        if self.layout_stages is not None:
            return self.layout_stages.run_at(step)
        assert self.seq_len is not None
        return step * self.settings.lanes * self.seq_len

    def _enter(self, ent: _Entry, windows: int) -> _Entry:
        """The entry ``windows`` windows into ``ent``'s stage, as if the next stage began there."""
        c = self._state(ent, windows * self.settings.window)
        pos = tuple(p + x for p, x in zip(ent.pos, c, strict=True))
        cum = tuple(s.cum(p) if x else q for s, p, x, q in zip(self._sources, pos, c, ent.cum, strict=True))
        return _Entry(ent.stage + 1, ent.window + windows, ent.run + self._given(ent, c), pos, cum)

    def _next(self) -> _Entry | None:
        """The entry of the stage after the last one computed (None after the last stage)."""
        last = self._entries[-1]
        if last.stage + 1 >= len(self.stages):
            return None
        end = self.run_at(self.stages[last.stage + 1].start)
        n = self._first_reaching(last, end - last.run)
        ent = self._enter(last, -(-n // self.settings.window))
        self._entries.append(ent)
        return ent

    def _entry_of_unit(self, unit: int) -> _Entry:
        """The entry of the stage that holds window ``unit``."""
        while self._entries[-1].window <= unit and self._next() is not None:
            pass
        return next(e for e in reversed(self._entries) if e.window <= unit)

    def window_start(self, unit: int) -> int:
        """The run's tokens before window ``unit``."""
        ent = self._entry_of_unit(unit)
        return ent.run + self._given(ent, self._state(ent, (unit - ent.window) * self.settings.window))

    def first_window_at(self, run: int) -> int:
        """The first window (unit) whose first token is at or after run token ``run``."""
        if run <= 0:
            return 0
        got = self._firsts.get(run)
        if got is None:
            while self._entries[-1].run < run and self._next() is not None:
                pass
            ent = next(e for e in reversed(self._entries) if e.run < run)
            got = ent.window + -(-self._first_reaching(ent, run - ent.run) // self.settings.window)
            if len(self._firsts) > 4096:
                self._firsts.clear()
            self._firsts[run] = got
        return got

    def _segment(self, a: int, b: int) -> tuple[I64, I64]:
        """Windows ``[a, b)`` of the stream: each position's global row group and source epoch."""
        w = self.settings.window
        ids_l, sep_l = [], []
        u = a
        while u < b:
            ent = self._entry_of_unit(u)
            nxt = self._entries[ent.stage + 1].window if ent.stage + 1 < len(self._entries) else b
            stop = min(b, nxt)
            c0, c1 = self._state(ent, (u - ent.window) * w), self._state(ent, (stop - ent.window) * w)
            active, total_w = self._active(ent)
            parts = []
            for i, wt in active:
                src, p = self._sources[i], ent.pos[i]
                ids, tok, sep = src.items(p + c0[i], p + c1[i])
                given = src.cum(p + c0[i]) - ent.cum[i]
                keys = finish_keys(given + np.cumsum(tok), wt, total_w)
                parts.append((ids, sep, keys, np.full(len(ids), i, np.int64), np.arange(len(ids), dtype=np.int64)))
            ids, sep, keys, srcs, nums = (np.concatenate(x) for x in zip(*parts, strict=True))
            order = np.lexsort((nums, srcs, keys))
            ids_l.append(ids[order])
            sep_l.append(sep[order])
            u = stop
        if not ids_l:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return np.concatenate(ids_l), np.concatenate(sep_l)

    def add_stage(self, stage: Stage) -> int:
        """Append ``stage`` (after every stage so far); the first unit (window) it can change."""
        assert stage.start > self.stages[-1].start
        return self.restage((*self.stages, stage))

    def restage(self, stages: Sequence[Stage]) -> int:
        """Take ``stages`` (the same first stage); the first unit (window) the change can touch.

        With ``k`` the first stage that differs, that is the first window at or after the
        earlier of the two stages' steps (the windows before it are in the stages both lists
        share). The entries of stage ``k`` on are forgotten and found again under the new
        stages, so the stream is the one an up-front list of ``stages`` gives. The caller
        forgets every layout it derived from the windows from that unit on
        (docs/design.md, "Live stages").
        """
        assert self.seq_len is not None and stages[0] == self.stages[0]
        old, new = self.stages, tuple(stages)
        k = next((i for i, (a, b) in enumerate(zip(old, new, strict=False)) if a != b), min(len(old), len(new)))
        if k == len(old) == len(new):
            return 1 << 62  # nothing changes
        first = min(x.start for x in (*old[k : k + 1], *new[k : k + 1]))
        self.stages = new
        return self._rewind(k, self.run_at(first))

    def relayout(self, layout: Layout | None) -> int:
        """Take other layout stages, which place the weight stages' steps; the first unit the change can touch."""
        old, self.layout_stages = self.layout_stages, layout
        for k, st in enumerate(self.stages[1:], 1):
            a = old.run_at(st.start) if old is not None else None
            b = layout.run_at(st.start) if layout is not None else None
            if a != b:
                return self._rewind(k, min(x for x in (a, b) if x is not None))
        return 1 << 62  # no stage moves

    def _rewind(self, k: int, run: int) -> int:
        """Forget the entries of stage ``k`` on; the first window at or after run token ``run``.

        The windows before it are in the stages before ``k``, the same under the old and
        the new stages (and layout), so the answer does not depend on which entries of
        stage ``k`` on were computed; those are forgotten and found again when asked.
        """
        cut = self.first_window_at(run)
        self._entries = self._entries[:k]
        self._states = {key: v for key, v in self._states.items() if key[0] < k}
        self._segments.clear()
        self._firsts.clear()
        return cut

    # -- epochs and units ----------------------------------------------------------------

    def _first_window(self, epoch: int) -> int:
        """The first window (unit) of ``epoch``: the first starting at or after e*T."""
        return self.first_window_at(epoch * self.total)

    def unit(self, epoch: int, window: int) -> int:
        return self._first_window(epoch) + window

    def unit_epoch_window(self, unit: int) -> tuple[int, int]:
        e = self.window_start(unit) // self.total
        return e, unit - self._first_window(e)

    def windows_in(self, epoch: int) -> int:
        return self._first_window(epoch + 1) - self._first_window(epoch)

    @property
    def windows(self) -> int:
        return self.windows_in(0)

    def run_before(self, epoch: int) -> int:
        return self.window_start(self._first_window(epoch))

    def epoch_of_run(self, run: int) -> int:
        return self.window_start(self.first_window_at(run + 1) - 1) // self.total

    def _epoch_items(self, epoch: int) -> tuple[I64, I64]:
        got = self._segments.get(epoch)
        if got is None:
            got = self._segment(self._first_window(epoch), self._first_window(epoch + 1))
            self._segments[epoch] = got
            if len(self._segments) > 2:
                self._segments.popitem(last=False)
        else:
            self._segments.move_to_end(epoch)
        return got

    def layout(self, epoch: int) -> EpochPlan:
        order = self._epoch_items(epoch)[0]
        return layout_epoch(order, self._tokens, self._rows, self._empty, self.settings, epoch, self.run_before(epoch))

    def window_starts(self, windows: int) -> I64:
        w = self.settings.window
        ids, _ = self._segment(0, windows)
        wtok = self._tokens[ids].reshape(windows, w).sum(axis=1)
        out: I64 = np.cumsum(wtok) - wtok
        return out

    def source_epochs(self, epoch: int) -> I64:
        return self._epoch_items(epoch)[1]


class MixturePlan(Plan):
    """The plan of a mixture: the windows and lanes of docs/design.md over the interleaved stream.

    Its epoch order is :class:`Interleave`; a mixture of one source is that source's
    own plan (:class:`planner.plan.Permutation`), whatever its weights. On top of
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
    ) -> None:
        self.mixture = idx
        self.stages = tuple(stages)
        if len(self.stages) > 1 and seq_len is None:
            msg = "weights in stages start at global steps: give seq_len= to place them (tokens per step)"
            raise ConfigError(msg)
        self.seq_len = seq_len
        self.names = idx.names
        counts = row_group_counts(idx)
        order: EpochOrder = (
            Permutation(*counts, settings)
            if len(idx.parts) == 1
            else Interleave(idx, counts, settings, self.stages, seq_len, layout)
        )
        super().__init__(idx, settings, order)

    def __repr__(self) -> str:
        s = self.settings
        return (
            f"MixturePlan({len(self.names)} sources, {self.dataset.row_groups} row groups, {self.tokens:,} tokens, "
            f"seed={s.seed}, lanes={s.lanes}, window={s.window}, world={s.world}, stages={len(self.stages)})"
        )

    def add_stage(self, stage: Stage) -> int:
        """Append a stage (a live change, docs/design.md "Live stages"); the first unit it can change.

        The plan then is the one made with every stage from the start: the windows
        from that unit on are planned again, and the cached epoch layouts are dropped.
        """
        if not isinstance(self.order, Interleave):
            msg = f"weights of a mixture of one source ({self.names[0]!r}) cannot change: it has nothing to mix"
            raise ConfigError(msg)
        if self.seq_len is None:
            msg = "weights in stages start at global steps: give seq_len= to place them (tokens per step)"
            raise ConfigError(msg)
        unit = self.order.add_stage(stage)
        self.stages = self.order.stages
        self._epochs.clear()
        return unit

    def relayout(self, layout: Layout | None) -> int:
        """Take other layout stages (a live ``set_layout``, a resume's); the first unit the change can touch."""
        self.layout = layout
        if not isinstance(self.order, Interleave):
            return 1 << 62
        unit = self.order.relayout(layout)
        self._epochs.clear()
        return unit

    def restage(self, stages: Sequence[Stage]) -> int:
        """Take another list of stages with the same first one (a resume's); the first unit it can change."""
        if not isinstance(self.order, Interleave):
            return 0
        unit = self.order.restage(stages)
        self.stages = self.order.stages
        self._epochs.clear()
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


def finish_keys(c: I64, weight: int, total: int) -> I64:
    """``floor(c * total / weight)`` without overflow (``total <= 2**24``, keys about the stage's tokens)."""
    q, r = np.divmod(c, weight)
    out: I64 = q * total + (r * total) // weight
    return out


def interleave_demo(tokens: Sequence[Sequence[int]], weights: Sequence[int]) -> list[tuple[int, int]]:
    """The merge rule on its own, for the docs: sources' row groups in stream order, one stage.

    ``tokens[s]`` are source s's row groups' token counts in its stream order (no
    shuffle here); returns (source, row group) pairs in the order the mixture takes them.
    """
    total = sum(weights)
    items = []
    for s, (ts, w) in enumerate(zip(tokens, weights, strict=True)):
        c = 0
        for m, t in enumerate(ts):
            c += t
            items.append((c * total // w, s, m))
    return [(s, m) for _, s, m in sorted(items)]
