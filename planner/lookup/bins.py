"""Reverse lookup under best-fit (SPEC section 15): a document's items, in which bin, and where in its row.

Best-fit's order is concat's arithmetic over bins (:mod:`planner.rules`), so a bin's step,
lane and window follow from the plan and the row groups' bin counts exactly as a piece's
do under concat with rows of one unit (:func:`planner.lookup.staged.staged_pieces` over
*unit lengths*: every bin one unit long). What is best-fit's own is inside the row group:
which bin holds each item of a document and where in the bin's row it starts (the bin's
earlier items' tokens, in storage order), from the documents' token lengths alone
(the rule's :meth:`~planner.rules.binned.Binned.assign`). :class:`BinnedLengths` gives both;
:func:`rows_of_bins` turns the bins' pieces back into the documents' pieces.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import polars as pl

from planner.arraytypes import I64
from planner.lanes import window_cuts
from planner.lookup.cut import Pieces
from planner.lookup.lengths import Lengths
from planner.packing import Items, cut_again_at, slice_keys
from planner.rules.binned import Binned, item_lengths
from planner.rules.rebin import rest_bins

__all__ = ["BinItems", "BinnedLengths", "RestWindow", "rebinned_rest_pieces", "rows_of_bins"]


@dataclass(frozen=True, slots=True)
class BinItems:
    """One row group's items: each one's document (ordinal in the stream), offset, length, bin and start in its row."""

    doc: I64
    offset: I64
    length: I64
    bin: I64
    start: I64


class BinnedLengths:
    """:data:`~planner.lookup.lengths.Lengths` of bins (one unit each), from the documents' token lengths.

    ``items(rg)`` is row group ``rg``'s items and where each lies in its bin's row.
    """

    def __init__(self, lengths: Lengths, seq_len: int, rule: Binned) -> None:
        self.lengths = lengths
        self.seq_len = seq_len
        self.rule = rule  # how items go into bins (best-fit decreasing)
        self._memo: dict[int, BinItems] = {}

    def items(self, rg: int) -> BinItems:
        got = self._memo.get(rg)
        if got is None:
            got = self._bin(rg, self.lengths(np.array([rg], np.int64))[0])
        return got

    def _bin(self, rg: int, lengths: I64) -> BinItems:
        it = item_lengths(np.asarray(lengths, np.int64), self.seq_len)
        b = self.rule.assign(it.length, self.seq_len)
        # A bin lists its items in storage order: each one starts after the earlier ones of its bin.
        order = np.lexsort((np.arange(len(b)), b))
        placed = np.empty(len(b), np.int64)
        ln = it.length[order]
        first = np.ones(len(b), bool)
        first[1:] = b[order][1:] != b[order][:-1]
        cum = np.cumsum(ln) - ln
        placed[order] = cum - np.maximum.accumulate(np.where(first, cum, 0))
        got = BinItems(doc=it.doc, offset=it.offset, length=it.length, bin=b, start=placed)
        self._memo[rg] = got
        return got

    def __call__(self, rgs: I64) -> Sequence[I64]:
        rgs = np.asarray(rgs, np.int64)
        todo = [g for g in dict.fromkeys(rgs.tolist()) if g not in self._memo]
        if todo:  # one call of the token lengths for every row group not binned yet (it reads in parallel)
            for g, lengths in zip(todo, self.lengths(np.array(todo, np.int64)), strict=True):
                self._bin(g, lengths)
        return [np.ones(int(self._memo[g].bin.max()) + 1 if len(self._memo[g].bin) else 0, np.int64) for g in rgs]

    def targets(self, row_groups: I64, docs: I64) -> tuple[I64, I64]:
        """The bins ``(row group, bin)`` holding the documents ``(row_groups, docs)``, each once."""
        out: set[tuple[int, int]] = set()
        for g in np.unique(row_groups).tolist():
            items = self.items(g)
            want = np.isin(items.doc, docs[row_groups == g])
            out.update((g, int(b)) for b in np.unique(items.bin[want]).tolist())
        pairs = sorted(out)
        return np.array([p[0] for p in pairs], np.int64), np.array([p[1] for p in pairs], np.int64)


def rows_of_bins(bins: Pieces, binned: BinnedLengths, row_groups: I64, docs: I64) -> Pieces:
    """The documents' pieces from their bins' (``bins.doc`` is a bin of ``bins.row_group``): one an item."""
    if not len(bins):
        return Pieces.empty()
    frames = []
    for g in np.unique(bins.row_group).tolist():
        it = binned.items(g)
        keep = np.isin(it.doc, docs[row_groups == g]) & (it.length > 0)
        frames.append(
            pl.DataFrame(
                {
                    "row_group": np.full(int(keep.sum()), g, np.int64),
                    "bin": it.bin[keep],
                    "doc": it.doc[keep],
                    "offset": it.offset[keep],
                    "length": it.length[keep],
                    "in_row": it.start[keep],
                }
            )
        )
    items = pl.concat(frames)
    units = pl.DataFrame(
        {
            "step": bins.step,
            "lane": bins.lane,
            "position": bins.position,
            "row_group": bins.row_group,
            "bin": bins.doc,
            "epoch": bins.epoch,
            "window": bins.window,
        }
    )
    j = units.join(items, on=["row_group", "bin"], how="inner")

    def col(name: str) -> I64:
        return j[name].to_numpy().astype(np.int64)

    return Pieces(
        step=col("step"),
        lane=col("lane"),
        start=col("in_row"),
        length=col("length"),
        position=col("position"),
        row_group=col("row_group"),
        doc=col("doc"),
        token_offset=col("offset"),
        epoch=col("epoch"),
        window=col("window"),
    )


@dataclass(frozen=True, slots=True)
class RestWindow:
    """A window cut again by layout changes of which one changes ``seq_len`` (``planner.run.Segment``'s rest).

    ``row_groups`` and ``positions``: its row groups in stream order and their positions in
    the epoch; ``start``: the run's units before it; ``tokens`` and ``lanes``: the layout
    when it began; ``changes``: ``(lanes, begin, tokens)`` of each change inside it, up to
    the stage asked about, which began at step ``step``.
    """

    epoch: int
    window: int
    row_groups: I64
    positions: I64
    start: int
    tokens: int
    lanes: int
    changes: list[tuple[int, int, int]]
    step: int


def rebinned_rest_pieces(rule: Binned, lengths: Lengths, rest: RestWindow, seed: int | None) -> Pieces:
    """The pieces of the rest of a window binned again at a ``seq_len`` change, as the stage after it delivers them.

    :func:`planner.rules.rebin.rest_bins` (the packer's and the run's statement of it) gives
    the rest's bins as of its last ``seq_len`` change; they are cut into that change's lanes
    with no shuffle and then by the ``lanes`` changes after it; a bin's step is the stage's
    first step plus its place in its lane, and each of its items one piece, in the bin's order.
    """
    lens = [np.asarray(x, np.int64) for x in lengths(rest.row_groups)]
    keys = slice_keys(seed, rest.epoch, rest.window, np.arange(rest.lanes))
    got = rest_bins(rule, lens, rest.tokens, rest.lanes, rest.start, keys, rest.changes)
    m, b = got.count, got.lanes
    cuts = window_cuts(np.arange(b + 1, dtype=np.int64), m, got.begin % b, b)
    src = np.arange(m, dtype=np.int64)
    lane = np.searchsorted(cuts, src, side="right").astype(np.int64) - 1
    units = Items(src, np.zeros(m, np.int64), np.ones(m, np.int64), lane, src - cuts[lane])
    later = [(lanes, begin) for lanes, begin, _ in rest.changes[got.applied :]]
    units = cut_again_at(units, b, got.begin, got.begin + m, later)
    bin_of = got.bin_of_items()
    step = np.full(m, -1, np.int64)
    lane_of = np.full(m, -1, np.int64)
    step[units.src], lane_of[units.src] = rest.step + units.pos, units.lane
    before = np.cumsum(got.length) - got.length
    in_row = before - before[got.first[bin_of]]  # the bin's earlier items' tokens
    keep = np.flatnonzero((got.length > 0) & (step[bin_of] >= 0))
    sizes = np.array([len(x) for x in lens], np.int64)
    base = np.cumsum(sizes) - sizes  # each row group's first document in the window's numbering
    r = np.searchsorted(base, got.doc[keep], side="right") - 1
    n = len(keep)
    return Pieces(
        step=step[bin_of[keep]],
        lane=lane_of[bin_of[keep]],
        start=in_row[keep],
        length=got.length[keep],
        position=rest.positions[r],
        row_group=rest.row_groups[r],
        doc=got.doc[keep] - base[r],
        token_offset=got.offset[keep],
        epoch=np.full(n, rest.epoch, np.int64),
        window=np.full(n, rest.window, np.int64),
    )
