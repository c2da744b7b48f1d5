"""The concat rule (SPEC sections 3-4): documents run on from row to row; the units are tokens.

A row group's units are its tokens (the selected ones, under ``where=``, ``dedupe=`` or
``exclude=``), an empty document is a unit-less piece, and a row is ``L`` units of its lane:
the cut arithmetic of :mod:`planner.lanes` and the packing kernel of :mod:`planner.packing`
are this rule's, and the other rules reuse them over their own units (:mod:`planner.rules`).
Nothing is padded, so a row's mask is all True and a row holds ``L`` tokens of ``L`` units.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from planner.arraytypes import I64
from planner.catalog.rowgroups import stream_counts

__all__ = ["NAME", "TOKEN", "Concat"]

NAME = "concat"
TOKEN = "token"  # noqa: S105  (a unit's name, not a secret)
"""Its unit (:attr:`planner.rules.Rule.unit`): a token."""


class Concat:
    """Units are tokens; a row is ``seq_len`` units of one lane; nothing is padded."""

    name = NAME
    unit = TOKEN
    needs_counts = False  # the footers count its units
    binning = None  # no bins: documents run on from row to row
    pads = False

    def counts(self, frame: pl.DataFrame) -> tuple[I64, I64, I64]:
        """Each row group's units (its stream tokens), rows and unit-less documents (its empty ones)."""
        tokens, rows, empty = stream_counts(frame)
        return (
            tokens.to_numpy().astype(np.int64, copy=False),
            rows.to_numpy().astype(np.int64, copy=False),
            empty.to_numpy().astype(np.int64, copy=False),
        )

    def units_per_row(self, seq_len: int) -> int:
        return seq_len

    def held_tokens(self, frame: pl.DataFrame, seq_len: int) -> I64:
        """The tokens a packed row group holds (the budget's count): its stream tokens."""
        return self.counts(frame)[0]
