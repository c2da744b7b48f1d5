"""Lane arithmetic (docs/glossary.md, "Cut"): where each lane's slice of a window starts.

With ``q, r = divmod(T_w, B)`` and ``z`` the run's tokens before the window, mod B,
lane ``k`` gets ``q + 1`` tokens when ``(k - z) mod B < r``, else ``q``: the run's
tokens are dealt to lanes like cards. These functions are that rule and its inverse,
in integer arithmetic on whole arrays; :mod:`planner.plan` lays epochs out with them, and
:mod:`planner.run` answers where a step puts each lane.

A worked example (docs/design.md, "Windows, token cuts and lanes (lockstep)"): B = 4,
T_w = 10, z = 3 gives q = 2, r = 2; lanes 3 and 0 get 3 tokens, lanes 1 and 2 get 2:
cuts 0, 3, 5, 7, 10; the next window has z = (3 + 10) mod 4 = 1.

>>> cut_at(np.arange(5), 2, 2, 3, 4).tolist()
[0, 3, 5, 7, 10]
>>> lane_of(np.arange(10), 2, 2, 3, 4).tolist()
[0, 0, 0, 1, 1, 2, 2, 3, 3, 3]
"""

from __future__ import annotations

from typing import Any

import numpy as np

from planner.arraytypes import I64

__all__ = ["cut_at", "lane_of", "piece_range", "split_at_cuts", "window_cuts", "window_lane", "window_offsets"]


def cut_at(k: Any, q: Any, r: Any, z: Any, lanes: int) -> I64:
    """Cut ``c_k`` of windows with ``q, r = divmod(T_w, B)`` and offset ``z`` (arrays broadcast).

    ``c_k = k*q + (extra tokens of lanes below k)``; the extra tokens go to lanes
    ``z, z+1, ..., z+r-1`` (mod B), so below ``k`` there are ``clip(k - z, 0, r)`` of
    them plus, when that run wraps past lane B-1, ``min(z + r - B, k)``.
    """
    k, q, r, z = (np.asarray(x, dtype=np.int64) for x in (k, q, r, z))
    extra = np.clip(k - z, 0, r) + np.maximum(0, np.minimum(z + r - lanes, k))
    out: I64 = k * q + extra
    return out


def window_cuts(k: Any, total: Any, z: Any, lanes: int) -> I64:
    """Cut ``c_k`` of windows of ``total`` units and offset ``z``: :func:`cut_at` with ``q, r = divmod(total, B)``.

    What every caller means (the plan's tables, the packer, locate, a window cut again):
    the one place the quotient and remainder are taken. Arrays broadcast.
    """
    t = np.asarray(total, dtype=np.int64)
    return cut_at(k, t // lanes, t % lanes, z, lanes)


def window_lane(x: Any, total: Any, z: Any, lanes: int) -> I64:
    """Lane holding position ``x`` of windows of ``total`` units and offset ``z`` (:func:`lane_of`)."""
    t = np.asarray(total, dtype=np.int64)
    return lane_of(x, t // lanes, t % lanes, z, lanes)


def lane_of(x: Any, q: Any, r: Any, z: Any, lanes: int) -> I64:
    """Lane holding token position ``x`` of a window: ``max{k < B : c_k <= x}``.

    The cuts are piecewise linear in ``k`` (slopes ``q`` and ``q + 1`` on at most
    three runs of lanes), so each run is inverted with one integer division: no
    floating point, no per-window cut table, any number of positions at once.
    An empty document at position ``x`` belongs to this lane too (docs/glossary.md, "Piece").
    """
    x, q, r, z = (np.asarray(v, dtype=np.int64) for v in (x, q, r, z))
    wrap = z + r > lanes
    k1 = np.where(wrap, z + r - lanes, z)  # first run: lanes [0, k1)
    k2 = np.where(wrap, z, z + r)  # second run: lanes [k1, k2); third: [k2, B]
    m1 = np.where(wrap, q + 1, q)  # tokens per lane in the first and third runs
    m2 = np.where(wrap, q, q + 1)
    c1 = cut_at(k1, q, r, z, lanes)
    c2 = cut_at(k2, q, r, z, lanes)

    def last(k0: I64, k_end: Any, c0: I64, m: I64) -> I64:
        # The last k in [k0, k_end] with c0 + (k - k0) * m <= x (given c0 <= x).
        step = np.where(m > 0, (x - c0) // np.maximum(m, 1), k_end - k0)
        out: I64 = np.minimum(k_end, k0 + step)
        return out

    zero = np.zeros_like(k1)
    lane = np.where(x >= c2, last(k2, lanes, c2, m1), np.where(x >= c1, last(k1, k2, c1, m2), last(zero, k1, zero, m1)))
    out: I64 = np.minimum(lane, lanes - 1)
    return out


def window_offsets(window_tokens: I64, epoch: int, dataset_tokens: int, lanes: int) -> I64:
    """``z`` of every window of an epoch: the run's tokens before it, mod B.

    ``(e * T + tokens of windows 0..w-1) mod B``, in int64 without overflow.
    """
    before = np.cumsum(window_tokens) - window_tokens
    head = (epoch % lanes) * (dataset_tokens % lanes) % lanes
    out: I64 = (head + before % lanes) % lanes
    return out


def piece_range(token_start: I64, tokens: I64, empty_docs: I64) -> tuple[I64, I64]:
    """First and last stream position of a row group's pieces, from the footer's counts.

    Its tokens are ``[S, E-1]`` (``E = S + tokens``); an empty document sits at a
    position in ``[S, E]`` (it may trail, at ``E``), so with empty documents the
    range reaches ``E``; with no tokens it is just ``S``. The lanes of the two ends,
    and those between, are the lanes the row group gives pieces to.
    """
    return token_start, token_start + tokens - ((tokens > 0) & (empty_docs == 0))


def split_at_cuts(start: I64, end: I64, cuts: I64) -> tuple[I64, I64, I64, I64]:
    """Intervals ``[start, end)`` (increasing, tiling their range) split at ``cuts`` inside them.

    Returns each part's interval index, start, end and lane (``max{k : cuts[k] <= start}``,
    at most ``len(cuts) - 2``): the step of :mod:`planner.packing` that splits documents at
    a window's cuts, and its cut again at a layout change.
    """
    lo = np.searchsorted(cuts, start, side="right")
    hi = np.searchsorted(cuts, end, side="left")
    npieces = 1 + np.maximum(hi - lo, 0)
    rep = np.repeat(np.arange(len(start), dtype=np.int64), npieces)
    j = np.arange(len(rep), dtype=np.int64) - (np.cumsum(npieces) - npieces)[rep]
    last_cut = len(cuts) - 1
    p_start = np.where(j == 0, start[rep], cuts[np.minimum(lo[rep] + j - 1, last_cut)])
    p_end = np.where(j == npieces[rep] - 1, end[rep], cuts[np.minimum(lo[rep] + j, last_cut)])
    lane = np.minimum(np.searchsorted(cuts, p_start, side="right") - 1, len(cuts) - 2)
    return rep, p_start, p_end, lane
