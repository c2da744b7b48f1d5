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
import math
from collections.abc import Callable, Mapping, Sequence
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
from planner.rowgroups import SelectedRows, stream_counts, with_selected
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
        return sub.selected_rows(local) if isinstance(sub, SelectedRows) else None

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
    """One source's infinite stream of row groups: its epochs' permutations in turn."""

    def __init__(self, name: str, tokens: I64, base: int, seed: int) -> None:
        self.g = len(tokens)
        self.tokens = tokens
        self.base = base
        self.key = source_key(name)
        self.seed = seed
        self._perm: dict[int, I64] = {}

    def items(self, start: int, stop: int) -> tuple[I64, I64, I64]:
        """Items ``[start, stop)`` of the stream: global row group, tokens, source epoch."""
        j = np.arange(start, stop, dtype=np.int64)
        k = j // self.g
        out = np.empty(len(j), np.int64)
        for e in np.unique(k).tolist():
            perm = self._perm.get(e)
            if perm is None:
                perm = permutation(self.g, key(self.seed, self.key, e, 3))
                if len(self._perm) > 8:
                    self._perm.clear()
                self._perm[e] = perm
            sel = k == e
            out[sel] = perm[j[sel] - e * self.g]
        return out + self.base, self.tokens[out], k


class Interleave:
    """A mixture's epoch order: the sources' streams merged by virtual finish time, in stages.

    Units (windows) are numbered over the whole run; epoch ``e`` holds the windows
    whose first token is in ``[e*T, (e+1)*T)``, ``T`` being the tokens of the sources
    the first stage weighs (so a source that joins later, at weight 0 until then, moves
    no epoch: docs/design.md, "Epochs of a mixture"). The stream is generated lazily, a
    batch of windows at a time, and kept (a few int64 per row group of the run).
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
        self._row_groups = len(self._tokens)
        self._rg_base = sizes
        self._sources = [
            _Source(n, self._tokens[int(sizes[i]) : int(sizes[i + 1])], int(sizes[i]), settings.seed)
            for i, n in enumerate(idx.names)
        ]
        # the stream generated so far, in whole windows
        self._items = np.zeros(0, np.int64)
        self._sepochs = np.zeros(0, np.int64)
        self._wtok = np.zeros(0, np.int64)
        self._wstart = np.zeros(1, np.int64)  # run tokens before each window (and after the last)
        self._consumed = [0] * len(self._sources)  # items of each source's stream taken
        self._stage_given = [0] * len(self._sources)  # tokens of each source in this stage
        self._stage = 0
        self._stage_first = [0]  # the window at which each stage entered so far began
        self._stage_consumed = [[0] * len(self._sources)]  # and the items each source had given then

    # -- the stream ----------------------------------------------------------------------

    def _stage_end(self) -> float:
        if self._stage + 1 < len(self.stages):
            assert self.seq_len is not None
            return self.run_at(self.stages[self._stage + 1].start)
        return math.inf

    def run_at(self, step: int) -> int:
        """The run's tokens before global step ``step`` (under the layout stages, :mod:`planner.layout`)."""
        if self.layout_stages is not None:
            return self.layout_stages.run_at(step)
        assert self.seq_len is not None
        return step * self.settings.lanes * self.seq_len

    def _candidates(self, windows: int) -> tuple[list[int], list[I64], list[I64], list[I64], list[I64], list[I64]]:
        """Each active source's next items (its share of ``windows`` windows plus one of its epochs of slack).

        Returns the active sources and, per source, its items' global row groups,
        tokens, source epochs, keys and stream numbers. Keys are virtual finish times
        ``floor(C_s(m) * W / w_s)``, C_s counting the source's tokens since the stage began.
        """
        stage = self.stages[self._stage]
        active = [i for i, w in enumerate(stage.weights) if w > 0]
        total_w = sum(stage.weights[i] for i in active)
        need = windows * self.settings.window
        ids_l, tok_l, sep_l, key_l, num_l = [], [], [], [], []
        for i in active:
            src = self._sources[i]
            start = self._consumed[i]
            stop = start + -(-need * stage.weights[i] // total_w) + src.g
            ids, tok, sep = src.items(start, stop)
            ids_l.append(ids)
            tok_l.append(tok)
            sep_l.append(sep)
            key_l.append(finish_keys(self._stage_given[i] + np.cumsum(tok), stage.weights[i], total_w))
            num_l.append(np.arange(start, stop, dtype=np.int64))
        return active, ids_l, tok_l, sep_l, key_l, num_l

    def _grow(self, windows: int) -> None:
        """Generate at least ``windows`` more whole windows of the stream (or up to a stage's end)."""
        w_size = self.settings.window
        active, ids_l, tok_l, sep_l, key_l, num_l = self._candidates(windows)
        # Only keys below every source's last generated key are certain: a source's
        # later items have keys at least its last one.
        horizon = min(int(k[-1]) for k in key_l)
        keys = np.concatenate(key_l)
        srcs = np.concatenate([np.full(len(ids), i, np.int64) for i, ids in zip(active, ids_l, strict=True)])
        order = np.lexsort((np.concatenate(num_l), srcs, keys))
        if len(active) > 1:
            order = order[keys[order] < horizon]
        n_win = len(order) // w_size
        if n_win == 0:  # too few certain items for one window: ask for more
            self._grow(2 * windows)
            return
        order = order[: n_win * w_size]
        ids, tok = np.concatenate(ids_l)[order], np.concatenate(tok_l)[order]
        sep, srcs = np.concatenate(sep_l)[order], srcs[order]
        wtok = tok.reshape(n_win, w_size).sum(axis=1)
        starts = int(self._wstart[-1]) + np.cumsum(wtok) - wtok
        end = self._stage_end()
        # The first window starting at or after the next stage's first token is that stage's.
        cut = int(np.searchsorted(starts, end, side="left")) if end != math.inf else n_win
        if cut > 0:
            k = cut * w_size
            self._append(ids[:k], sep[:k], wtok[:cut])
            counts = np.bincount(srcs[:k], minlength=len(self._sources))
            gave = np.bincount(srcs[:k], weights=tok[:k], minlength=len(self._sources))
            for i in range(len(self._sources)):
                self._consumed[i] += int(counts[i])
                self._stage_given[i] += int(gave[i])
        if cut < n_win:
            self._stage += 1
            self._stage_given = [0] * len(self._sources)
            self._stage_first.append(len(self._wtok))
            self._stage_consumed.append(list(self._consumed))

    def _append(self, ids: I64, sep: I64, wtok: I64) -> None:
        self._items = np.concatenate([self._items, ids])
        self._sepochs = np.concatenate([self._sepochs, sep])
        self._wtok = np.concatenate([self._wtok, wtok])
        self._wstart = np.concatenate([self._wstart, int(self._wstart[-1]) + np.cumsum(wtok)])

    def _ensure_run(self, run: int) -> None:
        """Generate windows until the stream reaches past run token ``run``."""
        while int(self._wstart[-1]) <= run:
            left = run - int(self._wstart[-1])
            mean = max(1, self.total // max(1, self._row_groups))
            self._grow(max(1, min(4096, left // (mean * self.settings.window) + 1)))

    def first_window_at(self, run: int) -> int:
        """The first window (unit) whose first token is at or after run token ``run``."""
        self._ensure_run(run)
        return int(np.searchsorted(self._wstart[:-1], run, side="left"))

    def add_stage(self, stage: Stage) -> int:
        """Append ``stage`` (after every stage so far); the first unit (window) it can change."""
        assert stage.start > self.stages[-1].start
        return self.restage((*self.stages, stage))

    def restage(self, stages: Sequence[Stage]) -> int:
        """Take ``stages`` (the same first stage); the first unit (window) the change can touch.

        With ``k`` the first stage that differs, windows already generated from the first
        one at or after the earlier of the two stages' steps are dropped, and the merge
        state (items taken per source, tokens given in the stage in effect) is rewound to
        that window, so the stream is the one an up-front list of ``stages`` gives. The
        caller forgets every layout it derived from the dropped windows (docs/design.md,
        "Live stages").
        """
        assert self.seq_len is not None and stages[0] == self.stages[0]
        old, new = self.stages, tuple(stages)
        k = next((i for i, (a, b) in enumerate(zip(old, new, strict=False)) if a != b), min(len(old), len(new)))
        if k == len(old) == len(new):
            return len(self._wtok)
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
        return len(self._wtok)

    def _rewind(self, k: int, run: int) -> int:
        """Drop the windows from the first one at or after run token ``run``; stages before ``k`` are kept."""
        made = len(self._wtok)
        cut = int(np.searchsorted(self._wstart[:made], run, side="left"))
        # Rewind to window `cut`: the stage in effect there (one of the first k, which
        # both lists share), and what each source had given by then, counted from that
        # stage's first window (so a change costs the items of that stage, not the run's).
        w = self.settings.window
        j = min(int(np.searchsorted(np.array(self._stage_first), cut, side="right")) - 1, k - 1)
        self._stage_first, self._stage_consumed = self._stage_first[: j + 1], self._stage_consumed[: j + 1]
        self._stage = j
        items = self._items[self._stage_first[j] * w : cut * w]
        srcs = np.searchsorted(self._rg_base, items, side="right") - 1
        n = len(self._sources)
        counts = np.bincount(srcs, minlength=n)
        gave = np.bincount(srcs, weights=self._tokens[items], minlength=n)
        self._consumed = [int(a) + int(c) for a, c in zip(self._stage_consumed[j], counts, strict=True)]
        self._stage_given = [int(g) for g in gave]
        self._items, self._sepochs = self._items[: cut * w], self._sepochs[: cut * w]
        self._wtok, self._wstart = self._wtok[:cut], self._wstart[: cut + 1]
        # Windows not generated yet are generated under the new stages: the first unit
        # the change can touch is at most the first one not generated (nothing planned it).
        return cut

    # -- epochs and units ----------------------------------------------------------------

    def _first_window(self, epoch: int) -> int:
        """The first window (unit) of ``epoch``: the first starting at or after e*T."""
        self._ensure_run(epoch * self.total)
        return int(np.searchsorted(self._wstart[:-1], epoch * self.total, side="left"))

    def unit(self, epoch: int, window: int) -> int:
        return self._first_window(epoch) + window

    def unit_epoch_window(self, unit: int) -> tuple[int, int]:
        while len(self._wtok) <= unit:
            self._ensure_run(int(self._wstart[-1]))
        e = int(self._wstart[unit]) // self.total
        return e, unit - self._first_window(e)

    def windows_in(self, epoch: int) -> int:
        return self._first_window(epoch + 1) - self._first_window(epoch)

    @property
    def windows(self) -> int:
        return self.windows_in(0)

    def run_before(self, epoch: int) -> int:
        first = self._first_window(epoch)  # first: it may grow the stream, which replaces _wstart
        return int(self._wstart[first])

    def epoch_of_run(self, run: int) -> int:
        self._ensure_run(run)
        u = int(np.searchsorted(self._wstart, run, side="right")) - 1
        return int(self._wstart[u]) // self.total

    def layout(self, epoch: int) -> EpochPlan:
        a, b = self._first_window(epoch), self._first_window(epoch + 1)
        w = self.settings.window
        order = self._items[a * w : b * w]
        return layout_epoch(order, self._tokens, self._rows, self._empty, self.settings, epoch, int(self._wstart[a]))

    def window_starts(self, windows: int) -> I64:
        while len(self._wtok) < windows:
            self._ensure_run(int(self._wstart[-1]))
        out: I64 = self._wstart[:windows]
        return out

    def source_epochs(self, epoch: int) -> I64:
        a, b = self._first_window(epoch), self._first_window(epoch + 1)
        w = self.settings.window
        out: I64 = self._sepochs[a * w : b * w]
        return out


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
