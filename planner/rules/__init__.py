"""Packing rules: what a row group's units are, and how a lane's units become rows.

The order (windows, lane cuts over units, slice shuffles, ``X(t)``, epochs, ranks'
reads, checkpoints, seeks and layout stages) is one arithmetic over *units*, written
once (:mod:`planner.lanes`, :mod:`planner.packing`, :mod:`planner.order`, :mod:`planner.run`).
A rule is one value that says what the units are:

- :mod:`planner.rules.concat` (the default): a unit is a token and a row ``L`` of them;
  documents run on from row to row (SPEC sections 3-4).
- :mod:`planner.rules.bestfit`: a unit is a *bin* of whole documents (best-fit
  decreasing within each row group) and a row is one bin, padded to ``L`` (SPEC section 15);
  what every rule of bins shares (items, the ``bins`` column, a row one unit) is
  :mod:`planner.rules.binned`, so such a rule is one method, :meth:`Binned.assign`.

What a rule answers (:class:`Rule`): each row group's units, rows and unit-less documents
(:meth:`Rule.counts`, what the plan cuts), the units of one row of a lane
(:meth:`Rule.units_per_row`: what step ``t`` consumes), and the tokens a packed row group
holds (:meth:`Rule.held_tokens`, the budget's); and the questions the rest of the code asks
instead of naming a rule: what its unit is (:attr:`Rule.unit`: :data:`TOKEN` or :data:`BIN`,
what the plan's tables count), whether a pass over the documents counts its units
(:attr:`Rule.needs_counts`: the bins pass before the plan, again at a ``seq_len`` change),
how it places documents into bins (:attr:`Rule.binning`: the :class:`Binned` rule, None
under concat; what the bins pass, the packer's rows and locate's lookups call) and whether
a row may end in padding (:attr:`Rule.pads`: ``batch.mask`` can be False). The plan records
its rule's name (``plan.packing``), and everything asks that rule, never the index.
The runtime's side of a rule (the concat packer, best-fit's bins pass, its bins expanded
into padded rows, a ``seq_len`` change's bins again) is ``plitzer.readpath.pack`` and
the package ``plitzer.bestfit``.

*Where a newcomer adds a rule*: one file here (its units, with a worked example on top) and
its name in :data:`RULES`. A rule of bins subclasses :class:`Binned` and writes ``assign``:
the bins pass, the packer's expansion of bins into rows (``plitzer.bestfit``) and
locate's lookup (:mod:`planner.lookup.bins`) ask the run's rule for it (its ``binning``). Its
reference test compares it with an independent implementation (tests/planning/test_bestfit.py).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import polars as pl

from planner.arraytypes import I64
from planner.catalog.column import TokenDtype, token_range
from planner.errors import ConfigError
from planner.rules.bestfit import NAME as BEST_FIT
from planner.rules.bestfit import BestFit
from planner.rules.binned import BIN, BINS, Binned
from planner.rules.concat import NAME as CONCAT
from planner.rules.concat import TOKEN, Concat

__all__ = [
    "BEST_FIT",
    "BIN",
    "BINS",
    "CONCAT",
    "Packed",
    "RULES",
    "TOKEN",
    "UNPADDED",
    "BestFit",
    "Binned",
    "Rule",
    "binned_rule",
    "check_packing",
    "check_pad_id",
    "rule_named",
]


class Rule(Protocol):
    """What a packing rule answers: its units (see the module's docstring)."""

    name: str
    unit: str  # what the units are, what the plan tables count: TOKEN (token_start) or BIN (bin_start)
    needs_counts: bool  # a pass over the documents' lengths counts the units (the bins pass), not the footers
    pads: bool  # rows may end in padding (batch.mask can be False)

    @property
    def binning(self) -> Binned | None:
        """How documents are placed into bins (the :class:`Binned` rule), None where units are tokens."""
        ...

    def counts(self, frame: pl.DataFrame) -> tuple[I64, I64, I64]: ...

    def units_per_row(self, seq_len: int) -> int: ...

    def held_tokens(self, frame: pl.DataFrame, seq_len: int) -> I64: ...


RULES: dict[str, Rule] = {CONCAT: Concat(), BEST_FIT: BestFit()}
"""Every rule by its name (``packing=``)."""

Packed = tuple[str, int, int]
"""What a plan records of its packing (``plan.packing``): its rule's name, ``pad_id`` and a row's tokens."""
UNPADDED: Packed = (CONCAT, 0, 0)
"""A plan's packing where none is given: concat (nothing padded), ``pad_id`` 0, no row's tokens recorded."""


def check_packing(packing: object) -> str:
    """``packing=`` checked: a rule's name, else a ConfigError naming the choices."""
    if packing not in RULES:
        names = ", ".join(repr(n) for n in RULES)
        msg = (
            f"packing={packing!r} is not a packing rule; use one of {names} ('concat': documents run on "
            "from row to row; 'best-fit': each document whole in one row, padded)"
        )
        raise ConfigError(msg)
    return str(packing)


def check_pad_id(pad_id: object, dtype: TokenDtype | None = None, column: str = "", source: str = "") -> int:
    """``pad_id=`` checked: a token id, ``0 <= pad_id <=`` the largest token of the batches' ``dtype``.

    The one check of every entry point (docs/design.md, "The pad token"): without ``dtype``
    (before the data is opened) the integer and its sign, with it (the index's batch dtype,
    of ``column`` in ``source``) also its upper end, so a pad token the batches cannot hold
    is refused where the run is set up, not at its first padded row.
    """
    fix = "e.g. the tokenizer's pad or EOS id"
    if isinstance(pad_id, bool) or not isinstance(pad_id, (int, np.integer)):
        msg = f"pad_id={pad_id!r} must be a token id, an integer >= 0 ({fix})"
        raise ConfigError(msg)
    if pad_id < 0:
        msg = (
            f"pad_id={pad_id} is negative: a pad token is a token id, 0..{2**31 - 1} for int32 token batches "
            f"(0..{2**32 - 1} for uint32 ones); give one ({fix})"
        )
        raise ConfigError(msg)
    high = token_range(dtype)[1] if dtype is not None else pad_id
    if pad_id > high:
        msg = (
            f"pad_id={pad_id} does not fit the batches: column {column!r} of {source} gives {dtype} token "
            f"batches, which hold 0..{high}; give a pad token id in 0..{high} ({fix})"
        )
        raise ConfigError(msg)
    return int(pad_id)


def rule_named(name: str) -> Rule:
    return RULES[check_packing(name)]


def binned_rule(name: str) -> Binned:
    """The binned rule of that name (a ConfigError naming the rules that bin, for another)."""
    got = rule_named(name).binning
    if got is None:
        binned = ", ".join(repr(n) for n, r in RULES.items() if r.binning is not None)
        msg = f"packing={name!r} packs no bins: the bins pass serves {binned}"
        raise ConfigError(msg)
    return got
