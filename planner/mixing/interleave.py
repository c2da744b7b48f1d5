"""A mixture's epoch order: the sources' streams merged by virtual finish time, in stages.

Each source has its own infinite stream of row groups (:class:`planner.mixing.streams.SourceStream`).
Within a stage, the sources' streams are merged by *virtual finish time*, as weighted
fair queueing does: the ``m``-th row group a source gives in the stage gets the key
``floor(C_s(m) * W / w_s)``, with ``C_s(m)`` its tokens in the stage through that row
group, ``w_s`` its weight and ``W`` the stage's total weight: the position in the
stage's token stream at which the source *should* have given that much. The mixture
takes row groups in key order (ties: source order, then stream order). Integers only:
no floating point decides the order (weights are exact integers; see
:func:`planner.mixing.sources.parse_stages`). After any prefix of a stage a source is behind its weight's
share by less than one of its own row groups, and ahead by at most its share of one
largest row group of every source (docs/design.md, "Mixtures", proves it and gives a
worked example; :func:`planner.mixing.streams.interleave_demo` computes it).

The merged stream is cut into windows of W row groups over the whole run, each
window cut into lanes as one source's are (docs/glossary.md, "Cut"; the run's tokens so far give ``z``). A stage
that starts at step ``t`` starts at the first window whose first token is at or after
run token ``X(t)``, the run's tokens before step ``t`` under the layout
(:meth:`planner.order.layout.Layout.run_at`; one ``lanes`` and ``seq_len`` are a layout of
one stage); every source goes on from where the previous stage left it.

An :class:`Interleave` is a value: a change of its stages (a live stage, a resume's)
is :meth:`Interleave.with_stages` or :meth:`Interleave.with_layout`, which give a new
interleave and the first unit the change can touch, and leave this one as it was; its
caches live and die with it (docs/design.md, "Live stages").
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from planner.arraytypes import I64
from planner.bounded import Bounded
from planner.mixing.sources import Stage
from planner.mixing.streams import SourceStream, finish_keys
from planner.order.epoch import EpochPlan, PlanSettings, layout_epoch
from planner.order.layout import Layout

if TYPE_CHECKING:
    from planner.mixing.mixindex import MixtureIndex

__all__ = ["UNCHANGED", "Interleave"]


UNCHANGED = 1 << 62
"""The first unit a change touches when it touches none (past any run)."""


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
        self.layout_stages = self._layout(layout)  # places the weight stages' steps in the run's tokens
        sizes = idx.rg_base
        first = self.stages[0].weights
        self.total = sum(int(self._tokens[int(sizes[i]) : int(sizes[i + 1])].sum()) for i, w in enumerate(first) if w)
        self.total = self.total or int(self._tokens.sum())  # the first stage's sources hold no token
        self._rg_base = sizes
        self._sources = [
            SourceStream(
                n, self._tokens[int(sizes[i]) : int(sizes[i + 1])], int(sizes[i]), settings.seed, settings.shuffle
            )
            for i, n in enumerate(idx.names)
        ]
        n = len(self._sources)
        self._entries = [_Entry(0, 0, 0, (0,) * n, (0,) * n)]
        self._states: dict[tuple[int, int], tuple[int, ...]] = {}
        self._segments: Bounded[int, tuple[I64, I64]] = Bounded(2)
        self._firsts: dict[int, int] = {}

    @property
    def items_kept(self) -> int:
        """Items (row groups of the stream) held now: the cached epochs' and the kept permutations'."""
        seg = sum(len(a) for a, _ in self._segments.values())
        return seg + sum(s.items_kept() for s in self._sources)

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

    def _layout(self, layout: Layout | None) -> Layout | None:
        """``layout``, or one stage of the settings' lanes and ``seq_len`` (None: no ``seq_len``, no steps)."""
        if layout is not None or self.seq_len is None:
            return layout
        return Layout.one(self.settings.lanes, self.seq_len)

    def run_at(self, step: int) -> int:
        """The run's tokens before global step ``step`` (under the layout stages, :mod:`planner.order.layout`)."""
        assert self.layout_stages is not None  # weight stages at steps need seq_len (MixturePlan refuses them)
        return self.layout_stages.run_at(step)

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

    # -- stage changes: a new value, this one unchanged --------------------------------------

    def with_stages(self, stages: Sequence[Stage]) -> tuple[Interleave, int]:
        """This interleave under ``stages`` (the same first stage), and the first unit (window) the change can touch.

        With ``k`` the first stage that differs, that unit is the first window at or after
        the earlier of the two stages' steps (the windows before it are in the stages both
        lists share). The new interleave keeps the entries of the stages before ``k`` and
        finds the later ones again under the new stages when asked, so its stream is the
        one an up-front list of ``stages`` gives; this one is unchanged. Whoever derived
        layouts from the windows from that unit on derives them again from the new value
        (docs/design.md, "Live stages").
        """
        assert self.seq_len is not None and stages[0] == self.stages[0]
        old, new = self.stages, tuple(stages)
        k = next((i for i, (a, b) in enumerate(zip(old, new, strict=False)) if a != b), min(len(old), len(new)))
        if k == len(old) == len(new):
            return self, UNCHANGED
        first = min(x.start for x in (*old[k : k + 1], *new[k : k + 1]))
        # The windows before that one, and where it starts, are in the stages before k, the
        # same under the old and the new stages: this value answers for both.
        unit = self.first_window_at(self.run_at(first))
        return self._successor(new, self.layout_stages, k), unit

    def with_layout(self, layout: Layout | None) -> tuple[Interleave, int]:
        """This interleave under other layout stages, and the first unit the change can touch.

        The layout stages place the weight stages' steps in the run's tokens; with ``k``
        the first weight stage that moves, the entries from it on are found again.
        """
        old, layout = self.layout_stages, self._layout(layout)
        if layout == old:
            return self, UNCHANGED
        for k, st in enumerate(self.stages[1:], 1):
            assert old is not None and layout is not None  # weight stages at steps: both have seq_len
            a, b = old.run_at(st.start), layout.run_at(st.start)
            if a != b:
                unit = self.first_window_at(min(a, b))  # as in with_stages
                return self._successor(self.stages, layout, k), unit
        return self._successor(self.stages, layout, None), UNCHANGED  # no stage moves

    def _successor(self, stages: tuple[Stage, ...], layout: Layout | None, k: int | None) -> Interleave:
        """A new interleave under ``stages`` and ``layout`` that keeps what this one knows of the stages before ``k``.

        ``k`` None: no stage moves, and everything this one computed holds for the new
        one too. The sources' streams (pure functions of the source, each keeping a few
        permutations) are shared; every other cache is the new value's own.
        """
        new = copy.copy(self)
        new.stages, new.layout_stages = stages, self._layout(layout)
        if k is None:
            new._entries = list(self._entries)
            new._states = dict(self._states)
            new._segments = self._segments.copy()
            new._firsts = dict(self._firsts)
        else:
            new._entries = self._entries[:k]
            new._states = {key: v for key, v in self._states.items() if key[0] < k}
            new._segments = Bounded(2)
            new._firsts = {}
        return new

    # -- the in-place forms, kept while a holder of the interleave mutates it -----------------

    def add_stage(self, stage: Stage) -> int:
        """Append ``stage`` (after every stage so far) in place; the first unit (window) it can change."""
        assert stage.start > self.stages[-1].start
        return self.restage((*self.stages, stage))

    def restage(self, stages: Sequence[Stage]) -> int:
        """Take ``stages`` (the same first stage) in place: this interleave becomes :meth:`with_stages`'s value."""
        new, unit = self.with_stages(stages)
        self._become(new)
        return unit

    def _become(self, other: Interleave) -> None:
        """Take ``other``'s state whole (nothing of this one's is kept, so nothing is cleared)."""
        if other is not self:
            self.__dict__.update(vars(other))

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
        return self._segments.get_or_make(
            epoch, lambda: self._segment(self._first_window(epoch), self._first_window(epoch + 1))
        )

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
