"""The run's units after a ``seq_len`` change under a rule of bins (SPEC section 15 rule 9, ``L' != L``).

Under best-fit a run counts *bins* (:mod:`planner.rules`), and a bin's size is the ``L`` it
was binned at: a ``seq_len`` change changes the currency. At a change at run unit ``X``
(``L``-bins consumed before it) strictly inside window ``w`` (of epoch ``e``, begun at run
unit ``S``), the old lanes' unconsumed bins are binned again at ``L'`` as one group, ``M`` of
them (:func:`planner.rules.rebin.rest_bins`), and the windows after ``w`` are binned at
``L'``. So from the change on the run counts:

- the windows before ``w``: their ``L``-bins, as before (all consumed);
- window ``w``: its consumed ``L``-bins and then the rest's ``M``: ``X - S + M``;
- every later window: its ``L'``-bins (the index binned at ``L'``, the bins pass once per ``L``).

:class:`Rebinned` is that order (an :class:`~planner.order.epoch_order.EpochOrder`), made of the
order in force before the change and the plan binned at ``L'``; :class:`CurrencyPlan` is the
plan over it, whose epoch labels count each epoch's own units (``epoch_of_run``: under
stages of one ``L``, ``floor(X / T)`` as before). Several changes chain: each one's "before"
is the last one's order. A change at a window's edge re-bins nothing (``M = 0`` on the
window before it). What it needs of the runtime is a :class:`Rebinner`: the plan binned at
another ``L``, and a window's document lengths (``M`` is not a sum of per-row-group counts,
so a change inside a window reads that window's lengths once, when the stage is first asked
about).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from planner.arraytypes import I64
from planner.order.epoch import EpochPlan, cut_epoch
from planner.order.epoch_order import window_starts
from planner.order.plan import Plan
from planner.rules.binned import Binned

__all__ = ["CurrencyPlan", "Rebinned", "Rebinner"]


class Rebinner(Protocol):
    """What a run of a binned rule asks the runtime at a ``seq_len`` change."""

    @property
    def rule(self) -> Binned: ...

    def plan_at(self, seq_len: int) -> Plan:
        """The run's plan (its first layout stage's lanes), its index binned at ``seq_len``."""
        ...

    def lengths(self, row_groups: I64) -> Sequence[I64]:
        """The documents' token lengths of each of ``row_groups``, in stream order (the rows a selection keeps)."""
        ...


class Rebinned:
    """The epoch order after a ``seq_len`` change inside ``(epoch, window)`` (the module's docstring).

    ``before``: the plan in force at the change (its units the old bins); ``after``: the plan
    binned at the new ``seq_len``; ``start``: the run's units before the window; ``x``: before
    the change; ``m``: the rest's new bins. Both plans' epochs are read through their caches.
    """

    def __init__(self, before: Plan, after: Plan, at: tuple[int, int], start: int, x: int, m: int) -> None:
        self.before, self.after = before, after
        self.epoch, self.window = at
        self.x, self.m, self.start = x, m, start
        self.total = after.order.total
        tail = int(after.epoch(self.epoch).window_tokens[self.window + 1 :].sum())
        self._next = x + m + tail  # the run's units before epoch + 1
        self._shift = self._next - after.order.run_before(self.epoch + 1)

    @property
    def windows(self) -> int:
        return self.after.order.windows

    def windows_in(self, epoch: int) -> int:
        return self.after.order.windows_in(epoch)

    def unit(self, epoch: int, window: int) -> int:
        return self.after.order.unit(epoch, window)

    def unit_epoch_window(self, unit: int) -> tuple[int, int]:
        return self.after.order.unit_epoch_window(unit)

    def run_before(self, epoch: int) -> int:
        if epoch <= self.epoch:
            return self.before.run_before(epoch)
        return self.after.order.run_before(epoch) + self._shift

    def epoch_of_run(self, run: int) -> int:
        if run >= self._next:
            return self.after.order.epoch_of_run(run - self._shift)
        return self.epoch if run >= self.start else self.before.epoch_of_run(run)

    def source_epochs(self, epoch: int) -> I64:
        return self.after.order.source_epochs(epoch)

    def layout(self, epoch: int) -> EpochPlan:
        if epoch < self.epoch:
            return self.before.epoch(epoch)
        new = self.after.epoch(epoch)
        counts, tokens, start = self.after.counts, new.window_tokens, new.token_start
        if epoch == self.epoch:  # the windows up to the change in the old units, the rest's M, then the new
            old = self.before.epoch(epoch)
            w = self.window
            done = new.window <= w
            tokens = np.concatenate([old.window_tokens[:w], [self.x - self.start + self.m], tokens[w + 1 :]])
            start = np.where(done, old.token_start, start)
            hybrid = counts[0].copy()
            hybrid[new.order[done]] = self.before.counts[0][new.order[done]]
            counts = (hybrid, counts[1], counts[2])
        s = self.after.settings
        return cut_epoch(
            epoch,
            new.order,
            new.window,
            start,
            tokens.astype(np.int64, copy=False),
            *counts,
            lanes=s.lanes,
            world=s.world,
            run_before=self.run_before(epoch),
        )

    def window_starts(self, windows: int) -> I64:
        return window_starts(self, windows)


class CurrencyPlan(Plan):
    """The plan of a layout stage whose units are another ``seq_len``'s bins: ``after``'s index over :class:`Rebinned`.

    Its epoch labels are the epochs of the run's units (``epoch_of_run``), since its epochs
    are no longer ``T`` units each.
    """

    def __init__(self, order: Rebinned) -> None:
        after = order.after
        super().__init__(after.dataset, after.settings, order, packing=after.packing)
        self.layout, self.columns = after.layout, after.columns

    def label_of(self, run: int) -> int:
        return self.order.epoch_of_run(run)

    def label_start(self, epoch: int) -> int:
        return self.order.run_before(epoch)
