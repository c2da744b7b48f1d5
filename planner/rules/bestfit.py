"""The best-fit rule (SPEC section 15): every document of at most L tokens whole in one row.

A rule says what a row group's *units* are and how a lane's units become rows
(:mod:`planner.rules`). Under best-fit a row group's units are its *bins*: each row of a
batch is one bin, its items' tokens in storage order, then ``pad_id`` up to ``L``. The
lane cuts, the slice shuffles and ``X(t)`` are the concat rule's arithmetic over units
(a bin is one unit, a row one unit a lane), so windows, ranks' reads, checkpoints, seeks
and layout stages need nothing of their own; this module states only what is new: the
items and their bins.

1. Items of a row group: its documents (after ``where=``, ``dedupe=``, ``exclude=``) in
   storage order; a document of ``n > L`` tokens is ``ceil(n / L)`` items, its tokens
   ``[0, L), [L, 2L), ...``; an empty document is one item of length 0.
2. Bins by best-fit decreasing: items by length, longest first (ties: the earlier item
   first); each one goes into the open bin with the least room left that still holds it
   (the lowest-numbered on a tie), else into a new bin (numbered in order of opening).
   A bin lists its items in storage order.

A worked example, ``L = 8``, one row group of five documents of 5, 3, 10, 0 and 2 tokens.
The third is two items (8 and 2 tokens), so the items are ``5, 3, 8, 2, 0, 2`` (document
2's items are items 2 and 3). Longest first: 8 (item 2) opens bin 0 (room 0); 5 (item 0)
opens bin 1 (room 3); 3 (item 1) fits bin 1 exactly (room 0); 2 (item 3) opens bin 2
(room 6); 2 (item 5) goes to bin 2 (room 4); 0 (item 4) goes to the bin with the least
room that holds it, bin 0 (room 0, the lowest of the two at 0):

>>> items = item_lengths(np.array([5, 3, 10, 0, 2]), 8)
>>> items.length.tolist(), items.doc.tolist(), items.offset.tolist()
([5, 3, 8, 2, 0, 2], [0, 1, 2, 2, 3, 4], [0, 0, 0, 8, 0, 0])
>>> best_fit(items.length, 8).tolist()
[1, 1, 0, 2, 0, 2]
>>> int(bins_of(np.array([5, 3, 10, 0, 2]), 8))
3

Three rows: bin 0 is document 2's first 8 tokens (and the empty document), bin 1
documents 0 and 1 (8 tokens, no padding), bin 2 document 2's last 2 tokens and
document 4 (4 tokens of padding). The floor is ``ceil(20 / 8) = 3`` bins: none wasted.

Why bins never cross a row group: ``n_g`` then depends on the row group's lengths and
``L`` alone (not on the seed, the epoch, the window or the world size), so the bins
pass runs once a job, a rank reads only the row groups whose bins meet its lanes, and a
step's position stays arithmetic (docs/design.md, "Whole documents").
"""

from __future__ import annotations

import bisect

import numpy as np

from planner.arraytypes import I64
from planner.rules.binned import Binned, item_lengths  # noqa: F401  (item_lengths: the worked example's)

__all__ = ["NAME", "BestFit", "best_fit", "bins_of"]

NAME = "best-fit"


def best_fit(length: I64, seq_len: int) -> I64:
    """The bin of each item (rule 2: best-fit decreasing), items of at most ``seq_len`` tokens.

    The loop over items is sequential by nature (each placement depends on every earlier
    one); the sort is NumPy's. ``open_`` holds ``(room, bin)`` sorted, so the bin with the
    least room that holds an item of ``n`` tokens, lowest-numbered on a tie, is the
    first entry at or after ``(n, -1)``: one bisection and one list edit an item (about
    1 us an item; docs/design.md, "Whole documents").
    """
    length = np.asarray(length, np.int64)
    order = np.argsort(-length, kind="stable")  # longest first, ties in storage order
    out = np.empty(len(length), np.int64)
    sorted_len = length[order]
    # Whole-array where the rule is known without the loop: an item of more than L/2 tokens
    # fits no bin an earlier (so as long) item opened, so each opens its own, in order.
    big = int(np.searchsorted(-sorted_len, -(seq_len // 2), side="left"))
    out[order[:big]] = np.arange(big, dtype=np.int64)
    open_ = sorted(zip((seq_len - sorted_len[:big]).tolist(), range(big), strict=True))
    opened = big
    # Empty items, last in the order, all go to the bin with the least room (lowest-numbered):
    # adding nothing changes no room. The loop places the rest.
    empty = len(sorted_len) - int(np.searchsorted(-sorted_len, 0, side="left"))
    stop = len(order) - empty
    for i, n in zip(order[big:stop].tolist(), sorted_len[big:stop].tolist(), strict=True):
        at = bisect.bisect_left(open_, (n, -1))
        if at == len(open_):
            b, room = opened, seq_len - n
            opened += 1
        else:
            room, b = open_.pop(at)
            room -= n
        out[i] = b
        bisect.insort(open_, (room, b))
    if empty:
        out[order[stop:]] = open_[0][1] if open_ else 0
    return out


def bins_of(lengths: I64, seq_len: int) -> int:
    """``n_g``: the bins of one row group whose documents have ``lengths``."""
    return BestFit().bins_of(lengths, seq_len)


class BestFit(Binned):
    """Best-fit decreasing (rule 2), :func:`best_fit`; the rest is :class:`~planner.rules.binned.Binned`'s."""

    name = NAME

    def assign(self, length: I64, seq_len: int) -> I64:
        return best_fit(length, seq_len)
