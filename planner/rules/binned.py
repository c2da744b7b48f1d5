"""Rules whose units are bins of whole documents: what best-fit (and any rule like it) shares.

A *binned* rule (SPEC section 15 rules 1 and 3-10) cuts each row group's documents into
*items* (a document of ``n > L`` tokens is ``ceil(n / L)`` of them, an empty one an item of
length 0) and puts the items into *bins* of at most ``L`` tokens; a row is one bin, its items
in storage order, then padding. Its units are the bins: ``n_g`` a row group (the index's
``bins`` column, from the bins pass), one a lane's row. Everything but the placing of items
into bins is here; a rule is its :meth:`Binned.assign` (best-fit decreasing:
:mod:`planner.rules.bestfit`), in a file of its own.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from planner.arraytypes import I64
from planner.catalog.rowgroups import stream_counts

__all__ = ["BIN", "BINS", "Binned", "Items", "item_lengths", "row_group_bins"]

BINS = "bins"
"""The index frame's column of each row group's bins (``n_g`` at the run's ``seq_len``)."""
BIN = "bin"
"""Its unit (:attr:`planner.rules.Rule.unit`): a bin."""


class Items:
    """A row group's items in storage order: each one's document, offset in it and length."""

    __slots__ = ("doc", "length", "offset")

    def __init__(self, doc: I64, offset: I64, length: I64) -> None:
        self.doc = doc  # the document's index among those given
        self.offset = offset  # first token of the item in its document
        self.length = length


def item_lengths(lengths: I64, seq_len: int) -> Items:
    """The items of documents of ``lengths`` (rule 1): every ``seq_len`` tokens a new item."""
    lengths = np.asarray(lengths, np.int64)
    count = np.maximum(1, -(-lengths // seq_len))
    doc = np.repeat(np.arange(len(lengths), dtype=np.int64), count)
    first = np.cumsum(count) - count
    offset = (np.arange(len(doc), dtype=np.int64) - first[doc]) * seq_len
    return Items(doc=doc, offset=offset, length=np.minimum(lengths[doc] - offset, seq_len))


class Binned:
    """Units are bins; a row is one bin, padded to ``seq_len``. A rule is :meth:`assign`."""

    name = ""
    unit = BIN
    needs_counts = True  # the bins pass counts each row group's bins at seq_len (the frame's ``bins``)
    pads = True

    @property
    def binning(self) -> Binned:
        """The rule that places documents into bins: this one (:attr:`planner.rules.Rule.binning`)."""
        return self

    def assign(self, length: I64, seq_len: int) -> I64:
        """The bin of each item of one row group (items of at most ``seq_len`` tokens, storage order)."""
        raise NotImplementedError

    def bins_of(self, lengths: I64, seq_len: int) -> int:
        """``n_g``: the bins of one row group whose documents have ``lengths``."""
        items = item_lengths(lengths, seq_len)
        return int(self.assign(items.length, seq_len).max()) + 1 if len(items.length) else 0

    def counts(self, frame: pl.DataFrame) -> tuple[I64, I64, I64]:
        """Each row group's bins, rows, and no unit-less document (an empty one is an item in a bin)."""
        bins = frame[BINS].to_numpy().astype(np.int64, copy=False)
        rows = stream_counts(frame)[1].to_numpy().astype(np.int64, copy=False)
        return bins, rows, np.zeros(len(bins), np.int64)

    def units_per_row(self, seq_len: int) -> int:
        return 1

    def held_tokens(self, frame: pl.DataFrame, seq_len: int) -> I64:
        """A packed row group's tokens with its padding: ``n_g * L``."""
        out: I64 = self.counts(frame)[0] * seq_len
        return out


def row_group_bins(rule: Binned, lengths: I64, group: I64, groups: int, seq_len: int) -> tuple[Items, I64, I64]:
    """Documents of ``groups`` row groups binned by ``rule``, each row group apart (rule 2: bins never cross one).

    ``lengths``: every document's tokens, row group after row group; ``group``: each one's row
    group (non-decreasing). Returns the items (rule 1; ``doc`` numbers the documents given),
    each item's bin (numbered on from the row group before's) and each row group's bins.
    """
    items = item_lengths(lengths, seq_len)
    item_group = group[items.doc]
    bounds = np.searchsorted(item_group, np.arange(groups + 1), side="left")
    local = np.empty(len(items.length), np.int64)
    per_group = np.zeros(groups, np.int64)
    for c in range(groups):
        a, b = int(bounds[c]), int(bounds[c + 1])
        if b > a:
            local[a:b] = rule.assign(items.length[a:b], seq_len)
            per_group[c] = int(local[a:b].max()) + 1
    base = np.cumsum(per_group) - per_group
    return items, local + base[item_group], per_group
