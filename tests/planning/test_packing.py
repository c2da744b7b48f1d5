"""The packing kernel (planner.packing) against the spec's naive model, and its two callers' ways of calling it.

The loader cuts one window for one rank at a time (its own cuts only); locate cuts many
windows and every rank at once (one row of cuts a window). Both are the same function,
so what is checked here is the function: against tests/reference.py (one document at a
time, straight from SPEC section 3), and one rank at a time against all at once. That
locate's answer is what the loader yields, end to end, is tests/audit/test_locate.py's.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from planner.lanes import cut_at
from planner.packing import Items, cut_again, cut_documents, packed_order, row_cuts, slice_keys, slice_offsets
from tests import reference as ref

windows_st = st.lists(st.lists(st.integers(0, 9), min_size=0, max_size=8), min_size=1, max_size=4)


def _table(lengths: list[list[int]], lanes: int, z0: int) -> tuple[np.ndarray, list[list[int]], list[int]]:
    """Each window's cuts and ``z`` (from the run's tokens before it, as the plan deals them)."""
    rows, zs, run = [], [], z0
    for docs in lengths:
        zs.append(run % lanes)
        rows.append(ref.cuts(sum(docs), lanes, run % lanes))
        run += sum(docs)
    return np.array(rows, np.int64), rows, zs


def _flat(lengths: list[list[int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[int]]:
    start, length, row, first = [], [], [], []
    for w, docs in enumerate(lengths):
        first.append(len(length))
        s = 0
        for n in docs:
            start.append(s)
            length.append(n)
            row.append(w)
            s += n
    return (np.array(start, np.int64), np.array(length, np.int64), np.array(row, np.int64), first)


@given(windows_st, st.integers(1, 6), st.integers(1, 3), st.integers(0, 50))
def test_pieces_are_the_spec_slices(lengths: list[list[int]], per: int, world: int, z0: int) -> None:
    """Every window's pieces, each rank's: the slices of SPEC section 3, empty documents included."""
    lanes = per * world
    table, cuts, zs = _table(lengths, lanes, z0)
    start, length, row, first = _flat(lengths)
    p = cut_documents(start, length, table, per=per, row=row)
    got: dict[tuple[int, int], list[tuple[int, int, int]]] = {}
    for d, s, e, k in zip(p.doc.tolist(), p.start.tolist(), p.end.tolist(), p.lane.tolist(), strict=True):
        assert cuts[row[d]][k] <= s <= e <= cuts[row[d]][k + 1]  # inside its lane
        if e > s or length[d] == 0:  # (a run of empty lanes inside a document leaves a piece of length 0)
            got.setdefault((int(row[d]), k), []).append((d - first[row[d]], s - int(start[d]), e - s))
    for w, docs in enumerate(lengths):
        want = ref.lane_slices([[[0] * n for n in docs]], [0], lanes, zs[w])
        for k in range(lanes):
            assert got.get((w, k), []) == [(r, o, n) for _, r, o, n in want[k]]


@given(windows_st, st.integers(1, 5), st.integers(1, 3), st.integers(0, 50))
def test_one_rank_at_a_time_is_every_rank_at_once(lengths: list[list[int]], per: int, world: int, z0: int) -> None:
    """The loader's call (a rank's cuts, one window) gives exactly that rank's part of locate's call."""
    lanes = per * world
    table, _, _ = _table(lengths, lanes, z0)
    start, length, row, _ = _flat(lengths)
    every = cut_documents(start, length, table, per=per, row=row)
    for w in range(len(lengths)):
        mine = np.flatnonzero(row == w)
        for rank in range(world):
            lo = rank * per
            one = cut_documents(
                start[mine], length[mine], table[w, lo : lo + per + 1], per=per, at_end=rank == world - 1
            )
            sel = np.flatnonzero((row[every.doc] == w) & (every.lane >= lo) & (every.lane < lo + per))
            assert (mine[one.doc]).tolist() == every.doc[sel].tolist()
            assert one.start.tolist() == every.start[sel].tolist()
            assert one.end.tolist() == every.end[sel].tolist()
            assert (one.lane + lo).tolist() == every.lane[sel].tolist()


@given(
    st.lists(st.integers(0, 5), min_size=1, max_size=6), st.integers(0, 2**40), st.integers(0, 9), st.integers(0, 99)
)
def test_packed_order_is_each_slices_permutation(sizes: list[int], seed: int, epoch: int, window: int) -> None:
    slice_ = np.repeat(np.arange(len(sizes), dtype=np.int64), sizes)
    keys = slice_keys(seed, epoch, window, slice_)
    order = packed_order(slice_, keys)
    want, base = [], 0
    for k, n in enumerate(sizes):
        assert int(slice_keys(seed, epoch, window, k)[0]) == ref.key(seed, epoch, window, k, 2)
        want += [base + i for i in ref.permutation(n, ref.key(seed, epoch, window, k, 2))]
        base += n
    assert order.tolist() == want
    # A piece's offset in its slice: the tokens of the pieces drawn ahead of it.
    length = np.arange(len(slice_), dtype=np.int64) % 4
    off = slice_offsets(order, length, slice_)
    for i in range(len(slice_)):
        ahead = [j for j in order[: int(np.flatnonzero(order == i)[0])] if slice_[j] == slice_[i]]
        assert off[i] == sum(int(length[j]) for j in ahead)


@given(st.lists(st.integers(0, 20), min_size=0, max_size=10), st.integers(0, 30), st.integers(1, 7))
def test_row_cuts_cut_each_piece_where_rows_end(lengths: list[int], at: int, seq_len: int) -> None:
    length = np.array(lengths, np.int64)
    lane_pos = at + np.cumsum(length) - length
    rc = row_cuts(lane_pos, length, seq_len)
    for i, (s, n) in enumerate(zip(lane_pos.tolist(), lengths, strict=True)):
        sub = np.flatnonzero(rc.piece == i)
        tokens = [x for j in sub for x in range(int(rc.start[j]), int(rc.end[j]))]
        assert tokens == list(range(s, s + n))
        assert all(rc.start[j] // seq_len == rc.step[j] == (rc.end[j] - 1) // seq_len for j in sub)
        assert rc.count[i] == len(sub)


@given(
    st.lists(st.lists(st.integers(1, 6), max_size=4), min_size=1, max_size=5),
    st.integers(1, 6),
    st.integers(0, 40),
    st.integers(0, 30),
)
def test_cut_again_is_the_rest_dealt_to_the_new_lanes(
    slices: list[list[int]], new_lanes: int, begun: int, ahead: int
) -> None:
    """What each old lane has not consumed, lane after lane, cut by rule 4 into the new lanes."""
    lanes = len(slices)
    src = np.arange(sum(map(len, slices)), dtype=np.int64)
    ln = np.array([n for s in slices for n in s], np.int64)
    lane = np.repeat(np.arange(lanes, dtype=np.int64), [len(s) for s in slices])
    pos = np.array([sum(s[:i]) for s in slices for i in range(len(s))], np.int64)
    items = Items(src, np.zeros(len(src), np.int64), ln, lane, pos)
    total = sum(map(sum, slices))
    begin = begun + min(ahead, total)
    k = np.arange(lanes, dtype=np.int64)
    used = -((k - begin) // lanes) + (k - begun) // lanes
    rest = [(int(i), x) for i in src.tolist() for x in range(int(ln[i])) if x + int(pos[i]) >= used[lane[i]]]
    q, r = divmod(len(rest), new_lanes)
    cuts = cut_at(np.arange(new_lanes + 1), q, r, begin % new_lanes, new_lanes)
    out = cut_again(items, used, cuts)
    for j in range(new_lanes):
        mine = np.flatnonzero(out.lane == j)
        tokens = [(int(out.src[i]), x) for i in mine for x in range(int(out.a[i]), int(out.a[i] + out.length[i]))]
        assert tokens == rest[int(cuts[j]) : int(cuts[j + 1])]
        assert out.pos[mine].tolist() == (np.cumsum(out.length[mine]) - out.length[mine]).tolist()
