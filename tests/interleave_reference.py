"""The 0.3 interleave, kept as a reference: it replays a mixture's stream from step 0 and keeps it.

:class:`planner.mixing.mixture.Interleave` computes any window from its stage's start instead;
tests compare the two window for window (same batch order, by construction).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from planner.hashing import key, permutation
from planner.mixing.mixture import MixtureIndex, finish_keys, source_key
from planner.mixing.sources import Stage
from planner.order.epoch import EpochPlan, PlanSettings, layout_epoch

I64 = NDArray[np.int64]


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


class ReplayInterleave:
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
    ) -> None:
        self._tokens, self._rows, self._empty = counts
        self.settings = settings
        self.stages = tuple(stages)
        self.seq_len = seq_len
        sizes = idx.rg_base
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
            return self.stages[self._stage + 1].start * self.settings.lanes * self.seq_len
        return math.inf

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

    def with_stages(self, stages: Sequence[Stage]) -> tuple[ReplayInterleave, int]:
        """The interleave under ``stages`` as a new value (this one unchanged), and the first unit it can change."""
        new = copy.copy(self)
        new._consumed, new._stage_given = list(self._consumed), list(self._stage_given)
        new._stage_first, new._stage_consumed = list(self._stage_first), [list(c) for c in self._stage_consumed]
        return new, new.restage(stages)

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
        made = len(self._wtok)
        cut = int(np.searchsorted(self._wstart[:made], first * self.settings.lanes * self.seq_len, side="left"))
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
        return int(self._wstart[self._first_window(epoch)])

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
