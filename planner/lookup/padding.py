"""Each lane's padding tokens under a rule of bins (SPEC section 15 rule 10): ``plan.lanes``' ``padding``.

A lane's cut is a stretch ``[c_k, c_{k+1})`` of its window's bin stream (the window's row
groups in order, each one's bins in order of opening). Its padding is the sum of ``L`` less
each bin's tokens over that stretch, so with ``P(x)`` the padding of the stream's first ``x``
bins it is ``P(c_{k+1}) - P(c_k)``. ``P`` at a row group's edge is a sum of the row groups'
own padding (``n_g * L - T_g``, the index's counts, no read); only a cut strictly inside a
row group needs its bins' fills, from its documents' lengths (:class:`BinnedLengths`): at
most ``B - 1`` row groups a window, each read once.

>>> import numpy as np
>>> from planner.lookup.lengths import lengths_from_array
>>> from planner.rules import BestFit
>>> lengths = lengths_from_array(np.array([5, 3, 10, 2, 8]), np.array([4, 1]))  # row groups of 4 and 1
>>> binned = BinnedLengths(lengths, 8, BestFit())  # bins [8], [5 3], [2 2]; then [8]
>>> cut = np.array([0, 2, 4])  # two lanes over the window's 4 bins, the cut inside row group 0
>>> stream_padding(np.array([0, 1]), np.array([0, 3]), np.array([3, 1]), np.array([4, 0]), cut, binned, 8).tolist()
[0, 0, 4]
"""

from __future__ import annotations

from typing import Any

import numpy as np

from planner.arraytypes import I64
from planner.lookup.bins import BinnedLengths
from planner.lookup.lengths import default_lengths
from planner.rules import rule_named

__all__ = ["lane_padding", "stream_padding"]


def lane_padding(plan: Any, ep: Any, window: I64, first: I64, end: I64) -> I64:
    """The padding tokens of each lane cut ``[first, end)`` (bins) of ``window`` in epoch plan ``ep`` of ``plan``.

    Reads the documents' lengths (the runtime's reader) of the row groups a cut falls inside.
    """
    name, _, seq_len = plan.packing
    rule = rule_named(name).binning
    assert rule is not None, name  # the plan's tables give padding under a rule of bins only
    bins, _, _ = plan.counts
    tokens = plan.dataset.frame
    real = (tokens["tokens_selected"] if "tokens_selected" in tokens.columns else tokens["tokens"]).to_numpy()
    rgs = ep.order
    window_start = np.cumsum(ep.window_tokens) - ep.window_tokens
    start = window_start[ep.window] + ep.token_start
    padding = bins[rgs] * seq_len - real[rgs].astype(np.int64)
    binned = BinnedLengths(default_lengths(plan.dataset), seq_len, rule)
    cuts = np.concatenate([window_start[window] + first, window_start[window] + end])
    at = stream_padding(rgs, start, bins[rgs], padding, cuts, binned, seq_len)
    out: I64 = at[len(window) :] - at[: len(window)]
    return out


def stream_padding(row_groups: I64, start: I64, bins: I64, padding: I64, x: I64, binned: BinnedLengths, L: int) -> I64:
    """``P(x)``: the padding tokens of a bin stream's first ``x`` bins, for each of ``x``.

    The stream is ``row_groups`` in order, each ``bins`` long from ``start`` (non-decreasing),
    with ``padding`` tokens in all; ``binned`` gives a row group's bins' fills where a cut falls
    inside it.
    """
    x = np.asarray(x, np.int64)
    before = np.concatenate([[0], np.cumsum(padding)]).astype(np.int64)
    p = np.maximum(np.searchsorted(start, x, side="right") - 1, 0)
    k = x - start[p]  # bins of row group p before x
    out: I64 = before[p] + np.where(k >= bins[p], padding[p], 0)
    inside = np.flatnonzero((k > 0) & (k < bins[p]))
    for g in np.unique(row_groups[p[inside]]).tolist():
        it = binned.items(int(g))
        fill = np.bincount(it.bin, weights=it.length, minlength=int(it.bin.max()) + 1).astype(np.int64)
        pad = np.concatenate([[0], np.cumsum(L - fill)]).astype(np.int64)
        sel = inside[row_groups[p[inside]] == g]
        out[sel] += pad[k[sel]]
    return out
