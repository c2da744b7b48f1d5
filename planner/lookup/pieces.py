"""Every piece of a window, and where in which step each one lands: from the plan and document lengths.

A *piece* is the part of a document that one row of one step holds (what a batch's
``documents()`` lists). Where it lands is arithmetic on the plan (docs/design.md,
"Locating documents"): the window's stream is cut into lanes (:mod:`planner.lanes`),
each lane's slice of pieces is shuffled by ``permutation(n, key(seed, e, w, k, 2))``,
the lane has received ``ceil((R - k) / B)`` tokens before the window (``R`` the run's
tokens before it), and step ``t`` is tokens ``[t*L, (t+1)*L)`` of every lane. The only
data it needs are the lengths of the documents of the row groups that hold the lanes
asked about: the shuffle places a piece after the pieces it draws ahead of it, so their
lengths decide its offset. planner reads no data, so those lengths come in through
``lengths`` (plitzer reads them: token lengths, a ``length_column``, or its cached
document pass).

A worked example: one file of two row groups (rg 0: documents of 3 and 2 tokens; rg 1:
one of 5), B = 2, W = 2, seq_len 4, seed 0. Epoch 0 takes rg 1 first, so the window's
stream is rg 1's document (positions 0..4), then rg 0's (5..7, 8..9); T_w = 10 gives the
cuts 0, 5, 10. Lane 0's slice is rg 1's document: 4 tokens in step 0, the last one in
step 1. Lane 1's slice is rg 0's two documents, shuffled: document 1 (2 tokens) then
document 0, whose first 2 tokens end step 0 and whose last one starts step 1. Rows are
(step, lane, start, length, row group, document):

>>> import planner, tempfile, pyarrow as pa, pyarrow.parquet as pq
>>> d = tempfile.mkdtemp()
>>> docs = pa.array([[1] * 3, [2] * 2, [3] * 5], pa.list_(pa.int32()))
>>> pq.write_table(pa.table({"tokens": docs}), f"{d}/a.parquet", row_group_size=2)
>>> p = planner.plan(d, lanes=2, window=2)
>>> got = window_pieces(p, 0, np.array([0]), lengths_from_array(np.array([3, 2, 5]), np.array([2, 1])), 4).sorted()
>>> list(zip(*(getattr(got, c).tolist() for c in ("step", "lane", "start", "length", "row_group", "doc"))))
[(0, 0, 0, 4, 1, 0), (0, 1, 0, 2, 0, 1), (0, 1, 2, 2, 0, 0), (1, 0, 0, 1, 1, 0), (1, 1, 0, 1, 0, 0)]

:func:`window_pieces` makes those rows for any window, lane and world exactly as the
loader packs them (zero-length pieces at duplicate cuts included, since they take part
loader packs them (zero-length pieces at duplicate cuts included, since they take part
in the shuffle; its arithmetic is :mod:`planner.lookup.cut`); :func:`locate_pieces` keeps
a few documents' rows, reading the lengths of only the row groups that share their
lanes. The lengths come in as :mod:`planner.lookup.lengths` describes; the pieces as Polars
frames and DuckDB's stream are :mod:`planner.lookup.frames`'s.

Everything is numpy on whole arrays per epoch: no loop over documents, pieces or lanes.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from planner.arraytypes import I64
from planner.bounded import Bounded
from planner.errors import ConfigError
from planner.hashing import key, order_of
from planner.lanes import window_lane
from planner.lookup.cut import Pieces, PlanView, window_pieces
from planner.lookup.lengths import Lengths, as_lengths, lengths_from_array
from planner.packing import concat_ranges

__all__ = [
    "Lengths",
    "OneSource",
    "PlanBacked",
    "Pieces",
    "Positions",
    "as_lengths",
    "epoch_pieces",
    "LayoutView",
    "epochs_of_steps",
    "lengths_from_array",
    "locate_pieces",
    "positions",
    "window_pieces",
    "windows_meeting",
]


@dataclass(frozen=True, slots=True)
class Positions:
    """What the arithmetic reads of an epoch's plan: the order, windows, token starts and cuts' offsets.

    :class:`planner.order.plan.EpochPlan` has these and the reads besides; :func:`positions`
    computes only these (the reads of every rank are most of an epoch's layout).
    """

    order: I64
    window: I64
    token_start: I64
    window_tokens: I64
    window_z: I64


def positions(order: I64, tokens: I64, lanes: int, window: int, run_before: int) -> Positions:
    """The :class:`Positions` of row groups ``order`` (the first steps of :func:`planner.order.plan.layout_epoch`)."""
    g = len(order)
    pos = np.arange(g, dtype=np.int64)
    win = pos // window
    tok = tokens[order]
    starts = np.arange(0, g, window, dtype=np.int64)
    window_tokens = np.add.reduceat(tok, starts).astype(np.int64) if g else np.zeros(0, np.int64)
    before = np.cumsum(tok) - tok
    token_start = before - before[starts][win] if g else before
    prefix = np.cumsum(window_tokens) - window_tokens
    window_z = (run_before % lanes + prefix % lanes) % lanes
    return Positions(order, win, token_start, window_tokens, window_z)


class PlanBacked:
    """A view of ``self.plan`` that answers the run's epoch edges as the plan does (its own epochs aside)."""

    plan: PlanView

    def run_before(self, epoch: int) -> int:
        return self.plan.run_before(epoch)

    def epoch_of_run(self, run: int) -> int:
        return self.plan.epoch_of_run(run)

    def windows_in(self, epoch: int) -> int:
        return self.plan.windows_in(epoch)


class OneSource(PlanBacked):
    """A one-source plan seen through :class:`Positions` only: epoch ``e`` is ``permutation(G, key(seed, e, 1))``.

    Same answers as the plan's own layouts, without the reads (docs/design.md, "Locating documents").
    """

    def __init__(self, plan: PlanView, tokens: I64) -> None:
        self.plan = plan
        self.tokens = np.asarray(tokens, np.int64)
        self._cache: Bounded[int, Positions] = Bounded(4)  # a few epochs

    @property
    def settings(self) -> Any:
        return self.plan.settings

    def epoch(self, epoch: int) -> Positions:
        def make() -> Positions:
            s = self.plan.settings
            order = order_of(len(self.tokens), key(s.seed, epoch, 1), s.shuffle)
            return positions(order, self.tokens, int(s.lanes), int(s.window), self.plan.run_before(epoch))

        return self._cache.get_or_make(epoch, make)


class LayoutView(Protocol):
    """The layout stages the pieces are placed by (:class:`planner.order.layout.Layout`; one stage in one layout).

    This layer sits below ``planner.order``: it asks the layout, never restates it.
    """

    @property
    def stages(self) -> Sequence[Any]: ...  # (start, lanes, seq_len) of each stage

    def begins(self) -> list[int]: ...

    def run_at(self, step: int) -> int: ...

    def end_of(self, i: int) -> tuple[int, int] | None: ...

    def lanes_at(self, steps: Any) -> I64: ...


def windows_meeting(plan: PlanView, epoch: int, lo: int, hi: int | None) -> I64:
    """The windows of ``epoch`` that hold some of the run's tokens ``[lo, hi)`` (``hi`` None: to the epoch's end)."""
    ep = plan.epoch(epoch)
    ends = np.cumsum(ep.window_tokens)
    run0 = plan.run_before(epoch)
    a = int(np.searchsorted(ends, lo - run0, side="right"))
    z = len(ends) if hi is None else int(np.searchsorted(ends - ep.window_tokens, hi - run0, side="left"))
    return np.arange(a, max(a, z), dtype=np.int64)


def epochs_of_steps(plan: PlanView, layout: LayoutView, steps: tuple[int, int]) -> range:
    """The epochs whose windows give tokens to steps ``[steps[0], steps[1])``: those of run tokens ``[X(a), X(b))``."""
    if steps[1] <= steps[0]:
        return range(0)
    first = plan.epoch_of_run(layout.run_at(steps[0]))
    last = plan.epoch_of_run(layout.run_at(steps[1]) - 1)
    return range(first, last + 1)


def locate_pieces(
    plan: PlanView,
    epoch: int,
    row_groups: I64,
    docs: I64,
    lengths: Lengths,
    seq_len: int,
    *,
    steps: tuple[int, int] | None = None,
    windows: I64 | None = None,
    stage: tuple[int, int] = (0, 0),
) -> Pieces:
    """Every piece of documents ``(row_groups[i], docs[i])`` in the windows of ``epoch``.

    ``docs`` are ordinals among the documents the stream takes from each row group.
    The lengths asked for are those of the documents' own row groups and of the row
    groups that share a lane with one of their pieces: a few per document, whatever
    the epoch or step. ``steps`` keeps the pieces of steps ``[start, stop)``;
    ``windows`` (given) only those windows; ``stage`` is the layout stage the windows
    are cut in (:func:`planner.lookup.cut.window_pieces`; ``windows`` must then be given).
    """
    b = int(plan.settings.lanes)
    ep = plan.epoch(epoch)
    want = np.unique((np.asarray(row_groups, np.int64) << 32) | np.asarray(docs, np.int64))
    pos = np.flatnonzero(np.isin(ep.order, np.unique(want >> 32))).astype(np.int64)
    if windows is not None:
        pos = pos[np.isin(ep.window[pos], windows)]
    if not len(pos) or not len(want):
        return Pieces.empty()
    keys = _target_lanes(ep, pos, want, lengths, b)
    if not len(keys):
        return Pieces.empty()
    got = window_pieces(plan, epoch, np.unique(keys // b), lengths, seq_len, lanes=keys, stage=stage)
    mine = np.isin((got.row_group << 32) | got.doc, want)
    if steps is not None:
        mine &= (got.step >= steps[0]) & (got.step < steps[1])
    return got.take(np.flatnonzero(mine))


def _target_lanes(ep: Any, pos: I64, want: I64, lengths: Lengths, b: int) -> I64:
    """The lanes (keys ``window * B + lane``) the target documents ``want`` reach at positions ``pos``.

    ``want`` holds ``row_group << 32 | ordinal``, sorted; a target's stream position is
    its row group's start plus the lengths of the documents before it.
    """
    t_rg = want >> 32
    u_rg, t_first = np.unique(t_rg, return_index=True)
    t_count = np.diff(np.concatenate([t_first, [len(want)]]))
    rg = ep.order[pos].astype(np.int64)
    ui = np.searchsorted(u_rg, rg)
    hit_rg = np.unique(rg)
    per_rg = [np.asarray(x, np.int64) for x in lengths(hit_rg)]
    n_rg = np.array([len(x) for x in per_rg], np.int64)
    flat = np.concatenate(per_rg) if per_rg else np.zeros(0, np.int64)
    base = np.cumsum(n_rg) - n_rg
    csum = np.concatenate([[0], np.cumsum(flat)])
    ti, pi = concat_ranges(t_first[ui], t_count[ui])
    ords = want[ti] & 0xFFFFFFFF
    hi = np.searchsorted(hit_rg, rg[pi])
    beyond = ords >= n_rg[hi]
    if beyond.any():
        i = int(np.flatnonzero(beyond)[0])
        msg = f"row group {int(rg[pi][i])} has {int(n_rg[hi][i])} documents in the stream, not document {ords[i]}"
        raise ConfigError(msg)
    at = base[hi] + ords
    s_doc, l_doc = csum[at] - csum[base[hi]], flat[at]
    w = ep.window[pos][pi]
    ds = ep.token_start[pos][pi] + s_doc
    t, z = ep.window_tokens[w], ep.window_z[w]
    full = l_doc > 0
    ls = window_lane(ds, t, z, b)[full]
    le = window_lane(ds + l_doc - 1, t, z, b)[full]
    k, ki = concat_ranges(ls, le - ls + 1)
    out: I64 = np.unique(w[full][ki] * b + k)
    return out


def epoch_pieces(plan: PlanView, epoch: int, lengths: Lengths, seq_len: int, *, batch: int = 64) -> Iterator[Pieces]:
    """Every piece of ``epoch``, a batch of ``batch`` windows at a time (window order)."""
    n = plan.windows_in(epoch)
    for a in range(0, n, batch):
        yield window_pieces(plan, epoch, np.arange(a, min(n, a + batch), dtype=np.int64), lengths, seq_len)
