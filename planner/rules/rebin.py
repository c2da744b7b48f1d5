"""The rest of a window binned again at a ``seq_len`` change (SPEC section 15 rule 9, ``L' != L``).

A layout stage that changes ``seq_len`` strictly inside a window, under a rule of bins: the
old lanes have consumed ``s`` bins each; what they have not consumed of the window (each
old lane's unconsumed bins, lane 0's first, each lane's in the order it would have packed
them) gives its items, in that order, to the rule again at ``L'`` *as one group*, and the
rest's new bins (numbered in order of opening) are cut into the new lanes by section 3
rule 4 with ``z = X mod B'`` (``X``: the run's units before the change) and no second
shuffle. A change of ``lanes`` alone in between cuts the rest's bins again as they are
(:func:`planner.packing.cut_again_at`). An item longer than ``L'`` (``L'`` shorter than the
``L`` it was cut at) is split every ``L'`` tokens from its start, by rule 1, as a document
would be (docs/design.md, "Whole documents").

A worked example, ``L = 8`` becoming ``L' = 16`` at run unit 1 with one lane: one row
group of documents of 5, 3, 10 and 2 tokens is bins ``[doc 2 (8)]``, ``[doc 0, doc 1]``,
``[doc 2 (2), doc 3]`` at ``L = 8``; unshuffled, the lane consumes the first; the other two
bins' items, ``5, 3, 2, 2`` tokens, are binned again at 16 as one group: one bin.

>>> from planner.rules.bestfit import BestFit
>>> rest = rest_bins(BestFit(), [np.array([5, 3, 10, 2])], 8, 1, 0, None, [(1, 1, 16)])
>>> rest.count, rest.length.tolist(), rest.doc.tolist(), rest.offset.tolist()
(1, [5, 3, 2, 2], [0, 1, 2, 3], [0, 0, 8, 0])

One statement of it for the three that need it: the run (the rest's bin count ``M``, which
the units of the stage's run count: :mod:`planner.order.rebin`), the packer (the rest's
rows: ``plitzer.bestfit.rows``) and ``locate``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from planner.arraytypes import I64, U64
from planner.lanes import window_cuts
from planner.packing import Items, cut_again_at, packed_order, stage_tokens
from planner.rules.binned import Binned, item_lengths, row_group_bins

__all__ = ["RestBins", "rest_bins", "window_bins"]


@dataclass(frozen=True, slots=True)
class RestBins:
    """Bins in order, each one's items (in the order the bin lists them): where they begin and what they hold.

    ``doc`` numbers the window's documents in stream order (row group after row group);
    ``offset`` is the item's first token in its document. ``begin``, ``lanes`` and
    ``applied``: the run unit of the last ``seq_len`` change binned (the window's start when
    none), the lanes it was cut into, and how many of the changes given came before it (the
    ones after are ``lanes`` changes alone, for the caller to cut again).
    """

    first: I64  # bin j's items are [first[j], first[j + 1])
    doc: I64
    offset: I64
    length: I64
    begin: int
    lanes: int
    applied: int

    @property
    def count(self) -> int:
        return len(self.first) - 1

    def bin_of_items(self) -> I64:
        """Each item's bin."""
        out: I64 = np.repeat(np.arange(self.count, dtype=np.int64), np.diff(self.first))
        return out


def _grouped(doc: I64, offset: I64, length: I64, bins: I64, count: int) -> tuple[I64, I64, I64, I64]:
    """Items sorted by bin, each bin's in the given order; and each bin's first item."""
    order = np.argsort(bins, kind="stable")
    first = np.concatenate([[0], np.cumsum(np.bincount(bins, minlength=count))]).astype(np.int64)
    return first, doc[order], offset[order], length[order]


def window_bins(rule: Binned, lengths: Sequence[I64], seq_len: int) -> tuple[I64, I64, I64, I64]:
    """A window's bins at ``seq_len`` (rules 1-2, row group by row group): ``(first, doc, offset, length)``."""
    sizes = np.array([len(x) for x in lengths], np.int64)
    flat = np.concatenate([np.asarray(x, np.int64) for x in lengths]) if len(sizes) else np.zeros(0, np.int64)
    group = np.repeat(np.arange(len(sizes), dtype=np.int64), sizes)
    items, bins, per_group = row_group_bins(rule, flat, group, len(sizes), seq_len)
    return _grouped(items.doc, items.offset, items.length, bins, int(per_group.sum()))


def _items_of(first: I64, bins: I64) -> I64:
    """The items of ``bins`` (indexes), bin after bin."""
    count = first[bins + 1] - first[bins]
    out: I64 = np.repeat(first[bins] - (np.cumsum(count) - count), count) + np.arange(int(count.sum()))
    return out


def _rebin(rule: Binned, doc: I64, offset: I64, length: I64, seq_len: int) -> tuple[I64, I64, I64, I64]:
    """Items (in the rest's order) binned again at ``seq_len`` as one group; longer ones split first (rule 1)."""
    split = item_lengths(length, seq_len)  # each item as a document of its own
    d, o, ln = doc[split.doc], offset[split.doc] + split.offset, split.length
    if not len(ln):
        return np.zeros(1, np.int64), d, o, ln
    b = rule.assign(ln, seq_len)
    return _grouped(d, o, ln, b, int(b.max()) + 1)


def rest_bins(
    rule: Binned,
    lengths: Sequence[I64],
    seq_len: int,
    lanes: int,
    window_start: int,
    keys: U64 | None,
    changes: Sequence[tuple[int, int, int]],
) -> RestBins:
    """The bins of a window after its layout changes, as of the last that changes ``seq_len``.

    ``lengths``: the window's row groups' documents' token lengths, in stream order;
    ``seq_len`` and ``lanes``: the layout in force when the window began; ``window_start``:
    the run's units before it; ``keys``: each lane's slice key (None: stream order);
    ``changes``: ``(lanes, run unit it begins at, seq_len)`` in run order, all inside the window.
    """
    first, doc, offset, length = window_bins(rule, lengths, seq_len)
    n = len(first) - 1
    cuts = window_cuts(np.arange(lanes + 1, dtype=np.int64), n, window_start % lanes, lanes)
    lane = np.searchsorted(cuts, np.arange(n, dtype=np.int64), side="right").astype(np.int64) - 1
    seq = packed_order(lane, None if keys is None else keys[lane])
    pos = np.arange(n, dtype=np.int64) - cuts[lane[seq]]  # each bin's place in its lane's packed slice
    units = Items(seq, np.zeros(n, np.int64), np.ones(n, np.int64), lane[seq], pos)
    begun, end, begin, cut_lanes, applied = window_start, window_start + n, window_start, lanes, 0
    for i, (new_lanes, x, new_len) in enumerate(changes):
        if new_len == seq_len:
            units = cut_again_at(units, lanes, begun, end, [(new_lanes, x)])
        else:  # the unconsumed bins, lane 0's first, their items binned again as one group
            used = stage_tokens(x, units.lane, lanes, begun)
            left = units.src[units.pos >= used]
            k = _items_of(first, left)
            first, doc, offset, length = _rebin(rule, doc[k], offset[k], length[k], new_len)
            m = len(first) - 1
            cuts = window_cuts(np.arange(new_lanes + 1, dtype=np.int64), m, x % new_lanes, new_lanes)
            lane = np.searchsorted(cuts, np.arange(m, dtype=np.int64), side="right").astype(np.int64) - 1
            src = np.arange(m, dtype=np.int64)
            units = Items(src, np.zeros(m, np.int64), np.ones(m, np.int64), lane, src - cuts[lane])
            end, seq_len, begin, cut_lanes, applied = x + m, new_len, x, new_lanes, i + 1
        lanes, begun = new_lanes, x
    return RestBins(first, doc, offset, length, begin, cut_lanes, applied)
