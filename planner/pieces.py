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
in the shuffle); :func:`locate_pieces` keeps a few documents' rows, reading the lengths
of only the row groups that share their lanes.

Everything is numpy on whole arrays per epoch: no loop over documents, pieces or lanes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, fields
from typing import Any, Protocol

import numpy as np
import polars as pl
from numpy.typing import NDArray

from planner.errors import ConfigError
from planner.hashing import key, mix_array, permutation
from planner.lanes import cut_at, lane_of
from planner.rowgroups import RowGroupIndex, SelectedRows

__all__ = [
    "Lengths",
    "OneSource",
    "Positions",
    "as_lengths",
    "Pieces",
    "epoch_pieces",
    "epochs_of_steps",
    "lengths_from_array",
    "locate_pieces",
    "pieces_frame",
    "pieces_reader",
    "pieces_schema",
    "positions",
    "set_length_reader",
    "stream_rows",
    "window_pieces",
    "windows_of_steps",
]

I64 = NDArray[np.int64]

Lengths = Callable[[I64], Sequence[I64]]
"""Row groups (ids, rows of the index) -> each one's documents' token lengths, in stream order.

A selected row group (``where=``) gives its selected documents only."""

LengthReader = Callable[[RowGroupIndex], Lengths]
"""What makes :data:`Lengths` for an index that reads data: the runtime's (plitzer sets it)."""

_reader: LengthReader | None = None


def set_length_reader(reader: LengthReader) -> None:
    """Make ``reader`` where :meth:`planner.plan.Plan.pieces` gets document lengths (plitzer calls this)."""
    global _reader  # noqa: PLW0603  # one process-wide default, as planner.api's selector
    _reader = reader


def _default_lengths(index: RowGroupIndex) -> Lengths:
    if _reader is None:
        msg = (
            "plan.pieces needs each document's token length, which is data: import plitzer first (its "
            "cached document pass reads them), or pass lengths= (every document's length, in index order)"
        )
        raise ConfigError(msg)
    return _reader(index)


class _Plan(Protocol):
    """What the arithmetic needs of a plan (:class:`planner.plan.Plan` has it)."""

    @property
    def settings(self) -> Any: ...

    def epoch(self, epoch: int) -> Any: ...

    def run_before(self, epoch: int) -> int: ...

    def epoch_of_run(self, run: int) -> int: ...

    def windows_in(self, epoch: int) -> int: ...


@dataclass(frozen=True, slots=True)
class Positions:
    """What the arithmetic reads of an epoch's plan: the order, windows, token starts and cuts' offsets.

    :class:`planner.plan.EpochPlan` has these and the reads besides; :func:`positions`
    computes only these (the reads of every rank are most of an epoch's layout).
    """

    order: I64
    window: I64
    token_start: I64
    window_tokens: I64
    window_z: I64


def positions(order: I64, tokens: I64, lanes: int, window: int, run_before: int) -> Positions:
    """The :class:`Positions` of row groups ``order`` (the first steps of :func:`planner.plan.layout_epoch`)."""
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


class OneSource:
    """A one-source plan seen through :class:`Positions` only: epoch ``e`` is ``permutation(G, key(seed, e, 1))``.

    Same answers as the plan's own layouts, without the reads (docs/design.md, "Locating documents").
    """

    def __init__(self, plan: _Plan, tokens: I64) -> None:
        self.plan = plan
        self.tokens = np.asarray(tokens, np.int64)
        self._cache: dict[int, Positions] = {}

    @property
    def settings(self) -> Any:
        return self.plan.settings

    def epoch(self, epoch: int) -> Positions:
        got = self._cache.get(epoch)
        if got is None:
            s = self.plan.settings
            order = permutation(len(self.tokens), key(s.seed, epoch, 1))
            got = positions(order, self.tokens, int(s.lanes), int(s.window), self.plan.run_before(epoch))
            if len(self._cache) > 4:
                self._cache.clear()
            self._cache[epoch] = got
        return got

    def run_before(self, epoch: int) -> int:
        return self.plan.run_before(epoch)

    def epoch_of_run(self, run: int) -> int:
        return self.plan.epoch_of_run(run)

    def windows_in(self, epoch: int) -> int:
        return self.plan.windows_in(epoch)


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


def _ranges(starts: I64, counts: I64) -> tuple[I64, I64]:
    """``concat(arange(s, s + c))`` and the index of the range each element comes from."""
    rep = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    j = np.arange(len(rep), dtype=np.int64) - (np.cumsum(counts) - counts)[rep]
    return starts[rep] + j, rep


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


def window_pieces(
    plan: _Plan,
    epoch: int,
    windows: I64,
    lengths: Lengths,
    seq_len: int,
    *,
    lanes: I64 | None = None,
) -> Pieces:
    """Every piece of the given windows of ``epoch`` (only lanes ``lanes`` of them, if given).

    ``lanes`` holds keys ``window * B + lane`` (sorted, unique). Only the row groups
    whose token range meets one of those lanes are asked for their lengths. The pieces
    are made exactly as the loader's packer makes them at the plan's ``world``: each
    rank splits its documents at the cuts inside its own range, and an empty document
    is a piece of length 0 in the lane ``max{k < B : c_k <= s}``; pieces of length 0
    take part in the shuffle but are not returned.
    """
    s = plan.settings
    b, per = int(s.lanes), int(s.lanes) // int(s.world)
    ep = plan.epoch(epoch)
    windows = np.unique(np.asarray(windows, np.int64))
    if not len(windows):
        return Pieces.empty()
    size = int(s.window)
    g = len(ep.order)
    first = windows * size
    pos, _ = _ranges(first, np.minimum(first + size, g) - first)
    win = ep.window[pos]
    t_w = ep.window_tokens[win]
    q, r, z = t_w // b, t_w % b, ep.window_z[win]
    tok = _position_tokens(ep)[pos]
    start = ep.token_start[pos]
    if lanes is not None:
        lanes = np.asarray(lanes, np.int64)
        lo = win * b + lane_of(start, q, r, z, b)
        hi = win * b + lane_of(start + tok, q, r, z, b)  # conservative: trailing empty documents
        need = np.searchsorted(lanes, lo, side="left") < np.searchsorted(lanes, hi, side="right")
        pos, win, start, tok = pos[need], win[need], start[need], tok[need]
    if not len(pos):
        return Pieces.empty()
    rgs = ep.order[pos].astype(np.int64)
    uniq, inv = np.unique(rgs, return_inverse=True)
    got = lengths(uniq)
    per_rg = [np.asarray(x, np.int64) for x in got]
    counts_u = np.array([len(x) for x in per_rg], np.int64)
    flat = np.concatenate(per_rg) if per_rg else np.zeros(0, np.int64)
    base_u = np.cumsum(counts_u) - counts_u
    csum = np.concatenate([[0], np.cumsum(flat)])
    # Documents in stream order: position by position, each row group's in storage order.
    first_doc, n_doc = base_u[inv], counts_u[inv]
    if lanes is not None:
        # Only the documents that can reach a lane asked about. On one axis, window * span +
        # position, each lane's closed range [c_k, c_{k+1}] is sorted as the lanes are; a row
        # group's documents that meet the first and the last range it meets are found by two
        # binary searches in the running token count (docs/design.md, "Locating documents").
        # A document's pieces, zero-length ones included, lie in those ranges.
        span = int(ep.window_tokens.max()) + 1
        kw, kk = lanes // b, lanes % b
        kt = ep.window_tokens[kw]
        kq, kr, kz = kt // b, kt % b, ep.window_z[kw]
        r_lo = kw * span + cut_at(kk, kq, kr, kz, b)
        r_hi = kw * span + cut_at(kk + 1, kq, kr, kz, b)
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
        first_doc, n_doc = first_doc + j0, j1 - j0
    di, pi = _ranges(first_doc, n_doc)
    length = flat[di]
    ordinal = di - base_u[inv][pi]
    ds = start[pi] + (csum[di] - csum[base_u[inv][pi]])
    de = ds + length
    dw = win[pi]
    t_d = ep.window_tokens[dw]
    qd, rd, zd = t_d // b, t_d % b, ep.window_z[dw]

    # Each document split per rank: clipped to the rank's range, cut at the cuts inside it.
    full = length > 0
    r_s = np.where(full, lane_of(ds, qd, rd, zd, b) // per, 0)
    r_e = np.where(full, lane_of(np.maximum(de - 1, 0), qd, rd, zd, b) // per, 0)
    rk, ri = _ranges(r_s, r_e - r_s + 1)
    cq, cr, cz = qd[ri], rd[ri], zd[ri]
    c_lo = cut_at(rk * per, cq, cr, cz, b)
    c_hi = cut_at((rk + 1) * per, cq, cr, cz, b)
    s_clip = np.where(full[ri], np.maximum(ds[ri], c_lo), ds[ri])
    e_clip = np.where(full[ri], np.minimum(de[ri], c_hi), ds[ri])
    keep = ~full[ri] | (e_clip > s_clip)
    rk, ri, s_clip, e_clip, cq, cr, cz = (a[keep] for a in (rk, ri, s_clip, e_clip, cq, cr, cz))
    f = full[ri]
    k_lo = np.where(f, lane_of(s_clip, cq, cr, cz, b) + 1, 0)
    k_hi = np.where(f, lane_of(np.maximum(e_clip - 1, 0), cq, cr, cz, b) + 1, 0)
    n_p = 1 + np.maximum(k_hi - k_lo, 0)
    j, xi = _ranges(np.zeros(len(n_p), np.int64), n_p)
    x_q, x_r, x_z = cq[xi], cr[xi], cz[xi]
    p_start = np.where(j == 0, s_clip[xi], cut_at(k_lo[xi] + j - 1, x_q, x_r, x_z, b))
    p_end = np.where(j == n_p[xi] - 1, e_clip[xi], cut_at(k_lo[xi] + j, x_q, x_r, x_z, b))
    p_end = np.maximum(p_end, p_start)
    lane = np.minimum(lane_of(p_start, x_q, x_r, x_z, b), np.where(f[xi], (rk[xi] + 1) * per - 1, b - 1))
    doc_of = ri[xi]  # the stream-order document of each piece
    pw = dw[doc_of]
    group = pw * b + lane
    if lanes is not None:
        mine = np.isin(group, lanes)
        p_start, p_end, lane, doc_of, pw, group = (a[mine] for a in (p_start, p_end, lane, doc_of, pw, group))
    if not len(group):
        return Pieces.empty()

    # The shuffle of each slice: ordinals in stream order, sorted by (mix(key ^ ordinal), ordinal).
    idx = np.arange(len(group), dtype=np.int64)
    by_group = np.lexsort((idx, group))
    g_sorted = group[by_group]
    new = np.ones(len(g_sorted), bool)
    new[1:] = g_sorted[1:] != g_sorted[:-1]
    g_first = np.maximum.accumulate(np.where(new, np.arange(len(g_sorted)), 0))
    ordinal_in_slice = np.empty(len(group), np.int64)
    ordinal_in_slice[by_group] = np.arange(len(g_sorted)) - g_first
    slice_key = mix_array(
        mix_array(mix_array(np.uint64(key(s.seed, epoch)) ^ pw.astype(np.uint64)) ^ lane.astype(np.uint64))
        ^ np.uint64(2)
    )
    h = mix_array(slice_key ^ ordinal_in_slice.astype(np.uint64))
    packed = np.lexsort((ordinal_in_slice, h, group))
    plen = (p_end - p_start)[packed]
    gp = group[packed]
    newp = np.ones(len(gp), bool)
    newp[1:] = gp[1:] != gp[:-1]
    cum = np.cumsum(plen) - plen
    offset_in_slice = np.empty(len(group), np.int64)
    offset_in_slice[packed] = cum - np.maximum.accumulate(np.where(newp, cum, 0))

    # Where the lane is at the window's start: ceil((R - k) / B) tokens received.
    prefix = np.cumsum(ep.window_tokens) - ep.window_tokens
    run = plan.run_before(epoch) + prefix[pw]
    lane_pos = (run - lane + b - 1) // b + offset_in_slice

    # Cut where rows end; pieces of length 0 hold no token and are not listed.
    n_tok = p_end - p_start
    live = n_tok > 0
    first_step = lane_pos // seq_len
    n_sub = np.where(live, (lane_pos + n_tok - 1) // seq_len - first_step + 1, 0)
    step, si = _ranges(first_step, n_sub)
    sub_start = np.maximum(lane_pos[si], step * seq_len)
    sub_end = np.minimum(lane_pos[si] + n_tok[si], (step + 1) * seq_len)
    d = doc_of[si]
    return Pieces(
        step=step,
        lane=lane[si],
        start=sub_start - step * seq_len,
        length=sub_end - sub_start,
        position=pos[pi][d],
        row_group=rgs[pi][d],
        doc=ordinal[d],
        token_offset=(p_start[si] - ds[d]) + (sub_start - lane_pos[si]),
        epoch=np.full(len(step), epoch, np.int64),
        window=pw[si],
    )


def windows_of_steps(plan: _Plan, epoch: int, steps: tuple[int, int], seq_len: int) -> I64:
    """The windows of ``epoch`` that give tokens to steps ``[steps[0], steps[1])``.

    Run token ``i`` is lane ``i mod B``'s token ``i // B``, so it is in step
    ``i // (B * L)`` whatever the shuffle: a window of run tokens ``[R, R + T_w)``
    feeds steps ``R // (B L)`` to ``(R + T_w - 1) // (B L)``.
    """
    b = int(plan.settings.lanes)
    ep = plan.epoch(epoch)
    ends = np.cumsum(ep.window_tokens)
    run0 = plan.run_before(epoch)
    lo, hi = steps[0] * b * seq_len - run0, steps[1] * b * seq_len - run0
    a = int(np.searchsorted(ends, lo, side="right"))
    z = int(np.searchsorted(ends - ep.window_tokens, hi, side="left"))
    return np.arange(a, max(a, z), dtype=np.int64)


def epochs_of_steps(plan: _Plan, steps: tuple[int, int], seq_len: int) -> range:
    """The epochs whose windows give tokens to steps ``[steps[0], steps[1])``."""
    if steps[1] <= steps[0]:
        return range(0)
    per_step = int(plan.settings.lanes) * seq_len
    first = plan.epoch_of_run(steps[0] * per_step)
    last = plan.epoch_of_run(steps[1] * per_step - 1)
    return range(first, last + 1)


def locate_pieces(
    plan: _Plan,
    epoch: int,
    row_groups: I64,
    docs: I64,
    lengths: Lengths,
    seq_len: int,
    *,
    steps: tuple[int, int] | None = None,
) -> Pieces:
    """Every piece of documents ``(row_groups[i], docs[i])`` in the windows of ``epoch``.

    ``docs`` are ordinals among the documents the stream takes from each row group.
    The lengths asked for are those of the documents' own row groups and of the row
    groups that share a lane with one of their pieces: a few per document, whatever
    the epoch or step. ``steps`` keeps the pieces of steps ``[start, stop)``.
    """
    b = int(plan.settings.lanes)
    ep = plan.epoch(epoch)
    want = np.unique((np.asarray(row_groups, np.int64) << 32) | np.asarray(docs, np.int64))
    t_rg = want >> 32
    u_rg, t_first = np.unique(t_rg, return_index=True)
    t_count = np.diff(np.concatenate([t_first, [len(want)]]))
    pos = np.flatnonzero(np.isin(ep.order, u_rg)).astype(np.int64)
    if steps is not None:
        ok = windows_of_steps(plan, epoch, steps, seq_len)
        pos = pos[np.isin(ep.window[pos], ok)]
    if not len(pos) or not len(want):
        return Pieces.empty()
    rg = ep.order[pos].astype(np.int64)
    ui = np.searchsorted(u_rg, rg)
    # The targets' stream positions: their row group's start plus the lengths before them.
    hit_rg = np.unique(rg)
    per_rg = [np.asarray(x, np.int64) for x in lengths(hit_rg)]
    n_rg = np.array([len(x) for x in per_rg], np.int64)
    flat = np.concatenate(per_rg) if per_rg else np.zeros(0, np.int64)
    base = np.cumsum(n_rg) - n_rg
    csum = np.concatenate([[0], np.cumsum(flat)])
    ti, pi = _ranges(t_first[ui], t_count[ui])
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
    t = ep.window_tokens[w]
    q, r, z = t // b, t % b, ep.window_z[w]
    full = l_doc > 0
    ls = lane_of(ds, q, r, z, b)[full]
    le = lane_of(ds + l_doc - 1, q, r, z, b)[full]
    k, ki = _ranges(ls, le - ls + 1)
    keys = np.unique(w[full][ki] * b + k)
    if not len(keys):
        return Pieces.empty()
    got = window_pieces(plan, epoch, np.unique(keys // b), lengths, seq_len, lanes=keys)
    mine = np.isin((got.row_group << 32) | got.doc, want)
    if steps is not None:
        mine &= (got.step >= steps[0]) & (got.step < steps[1])
    return got.take(np.flatnonzero(mine))


def epoch_pieces(plan: _Plan, epoch: int, lengths: Lengths, seq_len: int, *, batch: int = 64) -> Iterator[Pieces]:
    """Every piece of ``epoch``, a batch of ``batch`` windows at a time (window order)."""
    n = plan.windows_in(epoch)
    for a in range(0, n, batch):
        yield window_pieces(plan, epoch, np.arange(a, min(n, a + batch), dtype=np.int64), lengths, seq_len)


def lengths_from_array(lengths: I64, rows: I64) -> Lengths:
    """:data:`Lengths` from every document's length in index order (``rows`` documents per row group)."""
    lengths = np.asarray(lengths, np.int64)
    rows = np.asarray(rows, np.int64)
    if len(lengths) != int(rows.sum()):
        msg = (
            f"lengths= holds {len(lengths)} documents but the index's row groups give the stream "
            f"{int(rows.sum())}; pass one length per document, in index order (plitzer.explain.document_lengths)"
        )
        raise ConfigError(msg)
    base = np.cumsum(rows) - rows

    def of(rgs: I64) -> list[I64]:
        return [lengths[int(base[g]) : int(base[g] + rows[g])] for g in np.asarray(rgs).tolist()]

    return of


def _frame(p: Pieces, index: pl.DataFrame, rank_lanes: int, sources: bool) -> pl.DataFrame:
    cols: dict[str, Any] = {
        "epoch": p.epoch,
        "window_index": p.window,
        "step": p.step,
        "rank": p.lane // rank_lanes,
        "lane": p.lane,
        "start": p.start,
        "length": p.length,
    }
    if sources:
        cols["source"] = index["source"].gather(p.row_group)
    cols.update(
        {
            "file": index["file"].gather(p.row_group),
            "row_group": index["row_group"].gather(p.row_group).cast(pl.Int64),
            "doc": p.doc,
            "token_offset": p.token_offset,
            "position": p.position,
        }
    )
    return pl.DataFrame(cols)


def pieces_schema(sources: bool) -> dict[str, Any]:
    """The columns of :func:`pieces_frame` (``source`` only for a mixture)."""
    out: dict[str, Any] = {
        "epoch": pl.Int64,
        "window_index": pl.Int64,
        "step": pl.Int64,
        "rank": pl.Int64,
        "lane": pl.Int64,
        "start": pl.Int64,
        "length": pl.Int64,
    }
    if sources:
        out["source"] = pl.String
    out.update({"file": pl.String, "row_group": pl.Int64, "row": pl.Int64, "token_offset": pl.Int64})
    return out


Rows = Callable[[I64, I64], I64]
"""(row groups, stream ordinals) -> the rows in their row groups (a selection's rows are sparse)."""


def stream_rows(index: RowGroupIndex) -> Rows:
    """:data:`Rows` of ``index``: the ordinal itself, or the selected row it names (``where=``)."""
    if not isinstance(index, SelectedRows):
        return lambda _rgs, docs: docs

    def rows(rgs: I64, docs: I64) -> I64:
        out = np.asarray(docs, np.int64).copy()
        for g in np.unique(rgs).tolist():
            kept = index.selected_rows(int(g))
            if kept is not None:
                sel = rgs == g
                out[sel] = kept[docs[sel]]
        return out

    return rows


def _pieces_batches(
    plan: Any, epochs: Sequence[int], lengths: Lengths, seq_len: int, rows: Rows, batch: int
) -> Iterator[pl.DataFrame]:
    index = plan.index
    sources = "source" in index.columns
    per = int(plan.settings.lanes) // int(plan.settings.world)
    for e in epochs:
        for got in epoch_pieces(plan, e, lengths, seq_len, batch=batch):
            if not len(got):
                continue
            p = got.sorted()
            f = _frame(p, index, per, sources)
            row = rows(p.row_group, p.doc)
            yield f.with_columns(pl.Series("row", row, pl.Int64)).select(list(pieces_schema(sources)))


def _seq_len(plan: Any, seq_len: int | None) -> int:
    got = seq_len if seq_len is not None else getattr(plan, "seq_len", None)
    if got is None:
        msg = "pieces need the run's seq_len (tokens per sequence) to place steps: pass seq_len="
        raise ConfigError(msg)
    if isinstance(got, bool) or not isinstance(got, (int, np.integer)) or got < 1:
        msg = f"seq_len={got!r} must be an integer >= 1, the run's tokens per sequence"
        raise ConfigError(msg)
    return int(got)


def as_lengths(plan: Any, lengths: Any) -> Lengths:
    """``lengths=`` as :data:`Lengths`: a callable as it is, an array of every document's length, or the default."""
    if lengths is None:
        return _default_lengths(plan.dataset)
    if callable(lengths):
        out: Lengths = lengths
        return out
    from planner.rowgroups import stream_counts

    return lengths_from_array(np.asarray(lengths), stream_counts(plan.dataset.frame)[1].to_numpy())


def pieces_frame(
    plan: Any, epoch: int, seq_len: int | None, lengths: Any = None, rows: Rows | None = None, batch: int = 64
) -> pl.LazyFrame:
    """One row per piece of ``epoch``, computed a batch of windows at a time as the frame is read.

    Columns: epoch, window_index, step, rank, lane, start, length, source (a mixture's),
    file, row_group, row, token_offset: those of ``batch.documents()`` (without
    ``batch_row``), with the step and the rank. Rows come in window order, each
    batch of windows' pieces in (step, lane, start) order.
    """
    from polars.io.plugins import register_io_source

    length = _seq_len(plan, seq_len)
    get = as_lengths(plan, lengths)
    to_rows = rows if rows is not None else stream_rows(plan.dataset)
    sources = "source" in plan.index.columns
    schema = pieces_schema(sources)

    def source(
        with_columns: list[str] | None, predicate: pl.Expr | None, n_rows: int | None, _batch_size: int | None
    ) -> Iterator[pl.DataFrame]:
        left = n_rows
        for df in _pieces_batches(plan, [epoch], get, length, to_rows, batch):
            out = df
            if predicate is not None:
                out = out.filter(predicate)
            if with_columns is not None:
                out = out.select(with_columns)
            if left is not None:
                out = out.head(left)
                left -= out.height
            yield out
            if left is not None and left <= 0:
                return

    return register_io_source(source, schema=schema)


def pieces_reader(
    plan: Any, epochs: Sequence[int], seq_len: int | None, lengths: Any = None, rows: Rows | None = None
) -> Any:
    """The pieces of ``epochs`` as a ``pyarrow.RecordBatchReader`` (for DuckDB: streamed, read once)."""
    import pyarrow as pa

    length = _seq_len(plan, seq_len)
    get = as_lengths(plan, lengths)
    to_rows = rows if rows is not None else stream_rows(plan.dataset)
    schema = pl.DataFrame(schema=pieces_schema("source" in plan.index.columns)).to_arrow().schema

    def batches() -> Iterator[Any]:
        for df in _pieces_batches(plan, list(epochs), get, length, to_rows, 64):
            yield from df.to_arrow().cast(schema).to_batches()

    return pa.RecordBatchReader.from_batches(schema, batches())
