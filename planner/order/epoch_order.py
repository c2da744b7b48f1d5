"""The epochs' order over the run: which row groups each epoch takes, and how the run's windows are numbered.

A *unit* is one window of the run, numbered from 0 over all epochs (docs/glossary.md).
:class:`EpochOrder` is what a plan asks of its order; :class:`Permutation` is one
source's (every epoch all row groups, in ``permutation(G, key(seed, e, 1))``), and a
mixture's interleave (:class:`planner.mixing.interleave.Interleave`) merges several sources'
streams instead.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from planner.arraytypes import I64
from planner.order.epoch import EpochPlan, PlanSettings, plan_epoch

__all__ = ["EpochOrder", "Permutation", "window_starts"]


class EpochOrder(Protocol):
    """Which row groups each epoch takes, in which order, and how the run's windows are numbered.

    A *unit* is one window of the run, numbered from 0 over all epochs; the loader
    and the scanner walk units (docs/glossary.md). :class:`Permutation` orders one
    source; a mixture's interleave (:class:`planner.mixing.interleave.Interleave`) merges several.
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
        return window_starts(self, windows)


def window_starts(order: EpochOrder, windows: int) -> I64:
    """The run's tokens before each of the first ``windows`` units of ``order``, epoch after epoch."""
    out = np.zeros(windows, np.int64)
    u = e = 0
    while u < windows:
        wt = order.layout(e).window_tokens
        if not len(wt):
            break
        n = min(len(wt), windows - u)
        out[u : u + n] = order.run_before(e) + (np.cumsum(wt) - wt)[:n]
        u, e = u + n, e + 1
    return out
