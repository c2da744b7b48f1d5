"""Layout stages (SPEC section 12): lanes and seq_len that change at global steps.

The reference below is the rule's text, naively: pure Python, one token at a time,
no code shared with plitzer but tests/reference.py's hashing and cuts (SPEC section 3).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import docs_by_row_group, numbered_dataset, tokens_of
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reference import cuts, epoch_windows, key, permutation

import plitzer

Stage = tuple[int, int, int]  # (start step, lanes, seq_len)


def reference_layout(
    rg_docs: list[list[list[int]]], seed: int, window: int, stages: list[Stage], steps: int
) -> list[list[list[int]]]:
    """The global batches (rows of tokens) of ``steps`` steps under layout ``stages``, per SPEC section 12.

    Windows are appended to the lanes as the lanes need them, each cut into the lanes
    in force by rule 4 (z = the run's tokens before it, mod B) and shuffled by rule 5.
    At a change at step s: the windows some lane has begun (consumed a token of) give
    their unconsumed tokens, lane 0's first, each lane's in its order; that rest is cut
    into the new lanes by rule 4 with z = (tokens consumed) mod B', keeping its order;
    windows appended but not begun are cut again into the new lanes, as usual.
    """
    g = len(rg_docs)
    total = sum(len(d) for rg in rg_docs for d in rg)

    def windows():  # (uid, epoch, window, tokens in stream order)
        uid = 0
        e = 0
        while True:
            for w, group in enumerate(epoch_windows(g, seed, window, e)):
                yield uid, e, w, group
                uid += 1
            e += 1

    gen = windows()
    appended: list[tuple[int, int, int, list[int], int]] = []  # uid, e, w, group, run before it
    run = 0

    def slices(e: int, w: int, group: list[int], lanes: int, z: int) -> list[list[int]]:
        docs = [d for rg in group for d in rg_docs[rg]]
        stream = [x for d in docs for x in d]
        c = cuts(len(stream), lanes, z)
        out = []
        for k in range(lanes):
            # pieces of lane k: documents split at the cuts, in stream order
            pieces, s = [], 0
            for d in docs:
                lo, hi = max(s, c[k]), min(s + len(d), c[k + 1])
                if lo < hi:
                    pieces.append(stream[lo:hi])
                s += len(d)
            order = permutation(len(pieces), key(seed, e, w, k, 2))
            out.append([x for i in order for x in pieces[i]])
        return out

    b, n = stages[0][1], stages[0][2]
    pending: list[list[tuple[int, int]]] = [[] for _ in range(b)]  # (token, window uid)
    begun: set[int] = set()
    consumed = 0
    out = []
    later = {s: (lanes, seq) for s, lanes, seq in stages[1:]}
    for t in range(steps):
        if t in later:
            b2, n2 = later[t]
            rest = [x for k in range(b) for x in pending[k] if x[1] in begun]
            c = cuts(len(rest), b2, consumed % b2)
            pending = [rest[c[k] : c[k + 1]] for k in range(b2)]
            for uid, e, w, group, before in appended:
                if uid not in begun:
                    for k, sl in enumerate(slices(e, w, group, b2, before % b2)):
                        pending[k].extend((x, uid) for x in sl)
            b, n = b2, n2
        while any(len(p) < n for p in pending):
            uid, e, w, group = next(gen)
            appended.append((uid, e, w, group, run))
            for k, sl in enumerate(slices(e, w, group, b, run % b)):
                pending[k].extend((x, uid) for x in sl)
            run += sum(len(d) for rg in group for d in rg_docs[rg])
        out.append([[x for x, _ in p[:n]] for p in pending])
        begun.update(u for p in pending for _, u in p[:n])
        pending = [p[n:] for p in pending]
        consumed += b * n
    assert total > 0
    return out


def run_loader(path: Path, steps: int, world: int, **kw: object) -> list[list[list[int]]]:
    ranks = [plitzer.Loader(path, rank=r, world=world, **kw) for r in range(world)]  # type: ignore[arg-type]
    out = []
    for _ in range(steps):
        rows: list[list[int]] = []
        for ld in ranks:
            rows.extend(tokens_of(ld.next_batch()).tolist())
        out.append(rows)
    for ld in ranks:
        assert ld.stats.overruns == 0
        ld.close()
    return out


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[list[list[int]]]]:
    rng = np.random.default_rng(7)
    lengths = [[[int(x) for x in rng.integers(0, 40, rng.integers(1, 8))] for _ in range(3)] for _ in range(4)]
    root = tmp_path_factory.mktemp("layout")
    files = numbered_dataset(root, lengths)
    return root, docs_by_row_group(files)


def test_worked_example_matches_the_reference(data: tuple[Path, list[list[list[int]]]]) -> None:
    path, docs = data
    kw = {"seed": 3, "window": 2, "lanes": [(0, 4), (5, 2)], "seq_len": [(0, 8), (5, 32)]}
    want = reference_layout(docs, 3, 2, [(0, 4, 8), (5, 2, 32)], 14)
    got = run_loader(path, 14, 1, **kw)
    assert got == want
    assert [len(b) for b in got] == [4] * 5 + [2] * 9
    assert {len(r) for b in got[5:] for r in b} == {32}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 5),
    window=st.integers(1, 4),
    first=st.tuples(st.sampled_from([1, 2, 4, 8]), st.integers(1, 24)),
    changes=st.lists(st.tuples(st.integers(1, 12), st.sampled_from([1, 2, 4, 8]), st.integers(1, 40)), max_size=3),
    world=st.sampled_from([1, 2, 4]),
)
def test_random_layouts_equal_the_reference_at_every_world(
    data: tuple[Path, list[list[list[int]]]],
    seed: int,
    window: int,
    first: tuple[int, int],
    changes: list[tuple[int, int, int]],
    world: int,
) -> None:
    path, docs = data
    stages = [(0, *first)]
    for gap, b, n in changes:
        stages.append((stages[-1][0] + gap, b, n))
    stages = [(s, max(b, world), n) for s, b, n in stages]  # powers of 2: a multiple of the world
    total = sum(len(d) for rg in docs for d in rg)
    # several epochs: run until the run's tokens pass 3 epochs (or 200 steps)
    steps, x = 0, 0
    while x < 3 * total and steps < 200:
        b, n = next((b, n) for s, b, n in reversed(stages) if s <= steps)
        x += b * n
        steps += 1
    want = reference_layout(docs, seed, window, stages, steps)
    kw = {
        "seed": seed,
        "window": window,
        "lanes": [(s, b) for s, b, _ in stages],
        "seq_len": [(s, n) for s, _, n in stages],
    }
    got = run_loader(path, steps, world, **kw)
    assert got == want
    # nothing lost or repeated: every token delivered as often as every other, within one (epochs)
    counts = np.bincount([x for bt in got for r in bt for x in r], minlength=total)
    assert int(counts.max()) - int(counts.min()) <= 1
    assert int(counts.sum()) == sum(len(r) for bt in got for r in bt)


def test_a_stage_repeating_the_layout_changes_nothing(data: tuple[Path, list[list[list[int]]]]) -> None:
    path, _ = data
    plain = run_loader(path, 30, 1, seed=1, window=2, lanes=4, seq_len=8)
    for at in (1, 3, 7, 12):
        staged = run_loader(path, 30, 2, seed=1, window=2, lanes=[(0, 4), (at, 4)], seq_len=8)
        assert staged == plain
