"""Every piece of some windows, exactly as the loader packs them: the arithmetic of :mod:`planner.lookup.pieces`.

:func:`window_pieces` takes the windows of one epoch in four passes, each on whole
arrays (no loop over documents, pieces or lanes). Steps 2 to 4 are the packing rule
itself, the loader's own functions (:mod:`planner.packing`) run on lengths:

1. the positions of the windows (those meeting the lanes asked about) and their
   documents in stream order, from the row groups' document lengths;
2. each document split per rank at the rank's range, then at the cuts inside it
   (:func:`planner.packing.cut_documents`, one row of cuts a window): the pieces, each
   in one lane;
3. each lane's slice of pieces shuffled by ``permutation(n, key(seed, e, w, k, 2))``
   (:func:`planner.packing.packed_order`): a piece's offset in its slice is the length
   of the pieces drawn ahead of it;
4. the lane has received ``ceil((R - k) / B)`` tokens before the window (``R`` the
   run's tokens before it), and step ``t`` is tokens ``[t*L, (t+1)*L)`` of every lane:
   each piece cut where rows end (:func:`planner.packing.row_cuts`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import Any, Protocol

import numpy as np

from planner.arraytypes import I64
from planner.lanes import window_cuts, window_lane
from planner.lookup.lengths import Lengths
from planner.packing import (
    concat_ranges,
    cut_documents,
    packed_order,
    row_cuts,
    slice_keys,
    slice_offsets,
    stage_tokens,
)

__all__ = ["Cut", "Docs", "Pieces", "PlanView", "rows_of", "window_pieces", "window_slices"]


class PlanView(Protocol):
    """What the piece arithmetic needs of a plan (:class:`planner.order.plan.Plan` has it)."""

    @property
    def settings(self) -> Any: ...

    def epoch(self, epoch: int) -> Any: ...

    def run_before(self, epoch: int) -> int: ...

    def epoch_of_run(self, run: int) -> int: ...

    def windows_in(self, epoch: int) -> int: ...


@dataclass(frozen=True, slots=True)
class Pieces:
    """Pieces (parts of a document inside one row of one step), arrays of one length.

    ``position`` is the row group's position in the epoch's order, ``row_group`` its id
    (row of the index), ``doc`` the document's ordinal among the documents the stream
    takes from the row group; ``start`` is the piece's first token in the row and
    ``token_offset`` in the document.
    """

    step: I64
    lane: I64
    start: I64
    length: I64
    position: I64
    row_group: I64
    doc: I64
    token_offset: I64
    epoch: I64
    window: I64

    @classmethod
    def empty(cls) -> Pieces:
        z = np.zeros(0, np.int64)
        return cls(*(z for _ in fields(cls)))

    def __len__(self) -> int:
        return len(self.step)

    def take(self, idx: Any) -> Pieces:
        return Pieces(*(getattr(self, f.name)[idx] for f in fields(self)))

    @staticmethod
    def concat(parts: Iterable[Pieces]) -> Pieces:
        got = list(parts)
        if not got:
            return Pieces.empty()
        return Pieces(*(np.concatenate([getattr(p, f.name) for p in got]) for f in fields(Pieces)))

    def sorted(self) -> Pieces:
        """In the order batches list them: step, then lane, then start in the row."""
        return self.take(np.lexsort((self.start, self.lane, self.step)))


def _position_tokens(ep: Any) -> I64:
    """Tokens of every position of an epoch (from the token starts inside each window)."""
    g = len(ep.order)
    nxt = np.empty(g, np.int64)
    if g:
        nxt[:-1] = ep.token_start[1:]
        last = np.ones(g, bool)
        last[:-1] = ep.window[1:] != ep.window[:-1]
        nxt[last] = ep.window_tokens[ep.window[last]]
    out: I64 = nxt - ep.token_start
    return out


@dataclass(frozen=True, slots=True)
class Docs:
    """Documents of some positions of an epoch, in stream order: where each one is in its window's stream."""

    position: I64  # its row group's position in the epoch's order
    row_group: I64
    ordinal: I64  # among the documents the stream takes from the row group
    start: I64  # first token in the window's stream
    length: I64
    window: I64


@dataclass(frozen=True, slots=True)
class Cut:
    """Pieces before the shuffle: each one's token range in its window's stream, lane and document."""

    start: I64
    end: I64
    lane: I64
    doc: I64  # its position in the :class:`Docs`
    window: I64


def window_pieces(
    plan: PlanView,
    epoch: int,
    windows: I64,
    lengths: Lengths,
    seq_len: int,
    *,
    lanes: I64 | None = None,
    stage: tuple[int, int] = (0, 0),
) -> Pieces:
    """Every piece of the given windows of ``epoch`` (only lanes ``lanes`` of them, if given).

    ``lanes`` holds keys ``window * B + lane`` (sorted, unique). Only the row groups
    whose token range meets one of those lanes are asked for their lengths. The pieces
    are made exactly as the loader's packer makes them at the plan's ``world``: each
    rank splits its documents at the cuts inside its own range, and an empty document
    is a piece of length 0 in the lane ``max{k < B : c_k <= s}``; pieces of length 0
    take part in the shuffle but are not returned.

    ``stage``: ``(first step, run tokens before it)`` of the layout stage the windows
    are cut in (docs/design.md, "Layout stages"; the windows begin at or after its first
    token): the cards start there, and lane positions count from the stage's first step.
    """
    got = window_slices(plan, epoch, windows, lengths, lanes=lanes)
    if got is None:
        return Pieces.empty()
    docs, cut, offset = got
    ep = plan.epoch(epoch)
    b = int(plan.settings.lanes)
    # Where the lane is at the window's start: ceil((R - k) / B) tokens received
    # (of the stage, since its first run token X: ceil((R - k) / B) - ceil((X - k) / B)).
    first_step, begin = stage
    prefix = np.cumsum(ep.window_tokens) - ep.window_tokens
    run = plan.run_before(epoch) + prefix[cut.window]
    lane_pos = first_step * seq_len + stage_tokens(run, cut.lane, b, begin) + offset
    return rows_of(epoch, docs, cut, lane_pos, seq_len)


def window_slices(
    plan: PlanView, epoch: int, windows: I64, lengths: Lengths, *, lanes: I64 | None = None
) -> tuple[Docs, Cut, I64] | None:
    """The documents, the pieces (zero-length ones included) and each piece's offset in its shuffled slice.

    What :func:`window_pieces` places in steps; None when the windows hold no piece.
    """
    s = plan.settings
    b, per = int(s.lanes), int(s.lanes) // int(s.world)
    ep = plan.epoch(epoch)
    windows = np.unique(np.asarray(windows, np.int64))
    if not len(windows):
        return None
    keys = None if lanes is None else np.asarray(lanes, np.int64)
    pos, win, start, tok = _window_positions(ep, windows, int(s.window), b, keys)
    if not len(pos):
        return None
    docs = _documents(ep, pos, win, start, tok, lengths, b, keys)
    cut = _split(ep, docs, b, per)
    if keys is not None:
        mine = np.flatnonzero(np.isin(cut.window * b + cut.lane, keys))
        cut = Cut(*(getattr(cut, f.name)[mine] for f in fields(Cut)))
    if not len(cut.lane):
        return None
    return docs, cut, _slice_offsets(cut, s.slice_seed, epoch, b)


def _window_positions(ep: Any, windows: I64, size: int, b: int, lanes: I64 | None) -> tuple[I64, I64, I64, I64]:
    """The positions of ``windows`` (those whose token range meets ``lanes``): position, window, start, tokens."""
    g = len(ep.order)
    first = windows * size
    pos, _ = concat_ranges(first, np.minimum(first + size, g) - first)
    win = ep.window[pos]
    t_w, z = ep.window_tokens[win], ep.window_z[win]
    tok = _position_tokens(ep)[pos]
    start = ep.token_start[pos]
    if lanes is not None:
        lo = win * b + window_lane(start, t_w, z, b)
        hi = win * b + window_lane(start + tok, t_w, z, b)  # conservative: trailing empty documents
        need = np.searchsorted(lanes, lo, side="left") < np.searchsorted(lanes, hi, side="right")
        pos, win, start, tok = pos[need], win[need], start[need], tok[need]
    return pos, win, start, tok


def _documents(ep: Any, pos: I64, win: I64, start: I64, tok: I64, lengths: Lengths, b: int, lanes: I64 | None) -> Docs:
    """The documents of positions ``pos`` in stream order (those that can reach ``lanes``, if given)."""
    rgs = ep.order[pos].astype(np.int64)
    uniq, inv = np.unique(rgs, return_inverse=True)
    per_rg = [np.asarray(x, np.int64) for x in lengths(uniq)]
    counts_u = np.array([len(x) for x in per_rg], np.int64)
    flat = np.concatenate(per_rg) if per_rg else np.zeros(0, np.int64)
    base_u = np.cumsum(counts_u) - counts_u
    csum = np.concatenate([[0], np.cumsum(flat)])
    # Documents in stream order: position by position, each row group's in storage order.
    first_doc, n_doc = base_u[inv], counts_u[inv]
    if lanes is not None:
        first_doc, n_doc = _near_lanes(ep, lanes, b, win, start, tok, csum, first_doc, n_doc)
    di, pi = concat_ranges(first_doc, n_doc)
    return Docs(
        position=pos[pi],
        row_group=rgs[pi],
        ordinal=di - base_u[inv][pi],
        start=start[pi] + (csum[di] - csum[base_u[inv][pi]]),
        length=flat[di],
        window=win[pi],
    )


def _near_lanes(
    ep: Any, lanes: I64, b: int, win: I64, start: I64, tok: I64, csum: I64, first_doc: I64, n_doc: I64
) -> tuple[I64, I64]:
    """Each position's first document and count, kept to those that can reach a lane of ``lanes``.

    On one axis, window * span + position, each lane's closed range [c_k, c_{k+1}] is
    sorted as the lanes are; a row group's documents that meet the first and the last
    range it meets are found by two binary searches in the running token count
    (docs/design.md, "Locating documents"). A document's pieces, zero-length ones
    included, lie in those ranges.
    """
    span = int(ep.window_tokens.max()) + 1
    kw, kk = lanes // b, lanes % b
    kt, kz = ep.window_tokens[kw], ep.window_z[kw]
    r_lo = kw * span + window_cuts(kk, kt, kz, b)
    r_hi = kw * span + window_cuts(kk + 1, kt, kz, b)
    axis = win * span + start
    ka = np.searchsorted(r_hi, axis, side="left")  # the first range ending at or after the start
    kb = np.searchsorted(r_lo, axis + tok, side="right") - 1  # the last starting at or before the end
    ok = ka <= kb
    x_lo = np.maximum(r_lo[np.minimum(ka, len(r_lo) - 1)] - axis, 0)
    x_hi = np.minimum(r_hi[np.maximum(kb, 0)] - axis, tok)
    at = csum[first_doc]
    j0 = np.searchsorted(csum, at + x_lo, side="left") - 1 - first_doc  # first document ending at or after x_lo
    j1 = np.searchsorted(csum, at + x_hi, side="right") - first_doc  # documents starting at or before x_hi
    j0 = np.clip(j0, 0, n_doc)
    j1 = np.clip(j1, 0, n_doc)
    j1 = np.where(ok, np.maximum(j1, j0), j0)
    return first_doc + j0, j1 - j0


def _split(ep: Any, docs: Docs, b: int, per: int) -> Cut:
    """Each document split per rank, then at the cuts inside it (:func:`planner.packing.cut_documents`).

    One row of cuts for every window the documents are in (``B + 1`` cuts each).
    """
    wins, row = np.unique(docs.window, return_inverse=True)
    t_w = ep.window_tokens[wins][:, None]
    cuts = window_cuts(np.arange(b + 1, dtype=np.int64)[None, :], t_w, ep.window_z[wins][:, None], b)
    parts = cut_documents(docs.start, docs.length, cuts, per=per, row=row.astype(np.int64, copy=False))
    return Cut(start=parts.start, end=parts.end, lane=parts.lane, doc=parts.doc, window=docs.window[parts.doc])


def _slice_offsets(cut: Cut, seed: int | None, epoch: int, b: int) -> I64:
    """Each piece's offset in its lane's slice after the shuffle (:func:`planner.packing.packed_order`)."""
    group = cut.window * b + cut.lane
    order = packed_order(group, slice_keys(seed, epoch, cut.window, cut.lane))
    return slice_offsets(order, cut.end - cut.start, group)


def rows_of(epoch: int, docs: Docs, cut: Cut, lane_pos: I64, seq_len: int) -> Pieces:
    """The pieces cut where rows end (``lane_pos``: each one's first token in its lane); those of length 0 dropped."""
    rc = row_cuts(lane_pos, cut.end - cut.start, seq_len)
    step, si = rc.step, rc.piece
    d = cut.doc[si]
    token_offset = np.asarray((cut.start[si] - docs.start[d]) + (rc.start - lane_pos[si]), np.int64)
    return Pieces(
        step=step,
        lane=cut.lane[si],
        start=rc.start - step * seq_len,
        length=rc.end - rc.start,
        position=docs.position[d],
        row_group=docs.row_group[d],
        doc=docs.ordinal[d],
        token_offset=token_offset,
        epoch=np.full(len(step), epoch, np.int64),
        window=cut.window[si],
    )
