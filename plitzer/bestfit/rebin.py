"""A ``seq_len`` change under a rule of bins: the runtime's answers to the run (SPEC section 15 rule 9).

The rest of a window begun before the change is binned again at the new ``seq_len``
(:func:`planner.rules.rebin.rest_bins`), and the windows after it cut the bins the bins pass
counts at that ``seq_len``: the run (:class:`planner.order.rebin.Rebinner`) asks for the plan
over the index binned at ``L`` (:meth:`Rebin.plan_at`) and for a window's documents' lengths
(:meth:`Rebin.lengths`). :func:`rebin_at` makes one and bins every ``seq_len`` of a layout up
front, so the passes all run before the first batch (split between the ranks).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

import numpy as np

from planner.arraytypes import I64
from planner.order.plan import Plan
from planner.rules import Binned
from plitzer.bestfit.counts import BinSpec, bin_index, document_lengths

__all__ = ["Rebin", "rebin_at"]


class Rebin:
    """What a run of a binned rule asks at a ``seq_len`` change (:class:`planner.order.rebin.Rebinner`).

    ``plan_at(L)``: the run's plan over its index binned at ``L`` (the bins pass at ``L``, split
    and cached as the first one; 8 bytes a row group more, a frame of its own);
    ``lengths(row groups)``: a window's documents' lengths (:func:`document_lengths`), read when
    a change inside it is first asked about.
    """

    def __init__(self, plan: Plan, spec: BinSpec, *, threads: int | None = None, split: tuple[int, int] = (0, 1)):
        self._plan, self._spec, self._threads, self._split = plan, spec, threads, split
        self._plans: dict[int, Plan] = {spec.seq_len: plan}

    @property
    def rule(self) -> Binned:
        return self._spec.rule

    def plan_at(self, seq_len: int) -> Plan:
        got = self._plans.get(seq_len)
        if got is None:
            spec = replace(self._spec, seq_len=seq_len)
            base = self._plan
            packing = (base.packing[0], base.packing[1], seq_len)
            got = Plan(
                bin_index(base.dataset, spec, threads=self._threads, split=self._split), base.settings, packing=packing
            )
            got.layout, got.columns = base.layout, base.columns
            self._plans[seq_len] = got
        return got

    def lengths(self, row_groups: I64) -> list[I64]:
        ix, column = self._plan.dataset, self._spec.length_column
        return [document_lengths(ix, int(g), column) for g in np.asarray(row_groups).tolist()]


def rebin_at(
    plan: Plan, spec: BinSpec, seq_lens: Iterable[int], *, threads: int | None = None, split: tuple[int, int] = (0, 1)
) -> Rebin:
    """The run's :class:`Rebin` over ``plan`` (binned by ``spec``), each of ``seq_lens`` binned now."""
    got = Rebin(plan, spec, threads=threads, split=split)
    for seq_len in seq_lens:
        got.plan_at(seq_len)
    return got
