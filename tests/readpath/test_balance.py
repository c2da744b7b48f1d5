"""Balanced steps (SPEC section 18): the deal against a reference, and loaders whose ranks deal their rows.

The ranks here are threads over a Collective (tests/share_fixtures.ThreadGroup), so the
exchange is the object one; the same with real gloo process groups (the torch exchange) is
tests/readpath/test_balance_gloo.py. Every check compares with what a reference computes apart: the
deal with tests/balance_reference.py, the rows with a ``world=1`` loader without balance
(the global batch, row ``k`` lane ``k``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import plitzer
import plitzer.synth
from planner.balance import deal, row_costs
from plitzer.errors import ConfigError
from tests import balance_reference as ref
from tests.share_fixtures import ThreadGroup, run_ranks

CFG: dict[str, Any] = {"seed": 5, "lanes": 8, "window": 2, "seq_len": 256, "threads": 2}
SHAPE: dict[str, Any] = {"mean_length": 150, "sigma": 1.4, "docs_per_row_group": 60, "row_groups_per_file": 4}
"""Lengths from a few tokens to several rows: rows of very different cost."""


@st.composite
def _deals(draw: st.DrawFn) -> tuple[list[int], int, int]:
    world = draw(st.sampled_from([1, 2, 3, 4, 8]))
    micro = draw(st.sampled_from([1, 2, 4]))
    per = micro * draw(st.integers(1, 4))
    # Few distinct values, so that ties (the rule's lower lane, lower rank, lower microbatch) are common.
    costs = draw(
        st.lists(st.sampled_from([0, 1, 4, 9, 16, 100, 4096, 10**12]), min_size=world * per, max_size=world * per)
    )
    return costs, world, micro


@settings(max_examples=300, deadline=None)
@given(_deals())
def test_the_deal_is_the_reference(case: tuple[list[int], int, int]) -> None:
    costs, world, micro = case
    d = deal(costs, world, micro)
    want = ref.deal(costs, world, micro)
    per = len(costs) // world
    for r in range(world):
        assert d.lanes_of(r).tolist() == [k for mb in want[r] for k in mb]
        assert d.cost[r].tolist() == [sum(costs[k] for k in mb) for mb in want[r]]
        for m, mb in enumerate(want[r]):
            assert len(mb) == per // micro
            assert all(d.rank[k] == r and d.microbatch[k] == m for k in mb)
    assert sorted(d.order.tolist()) == list(range(len(costs)))


def test_row_costs_are_squared_segments() -> None:
    assert row_costs(np.array([0, 0, 1, 2, 2, 2]), np.array([3, 5, 8, 1, 1, 6]), 4).tolist() == [34, 64, 38, 0]
    assert ref.cost_of_row([3, 5]) == 34


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("balance")
    plitzer.synth.write(
        d, tokens=120_000, seed=11, mean_length=150, sigma=1.4, docs_per_row_group=60, row_groups_per_file=4
    )
    return d


@pytest.fixture(scope="module")
def bestfit_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Documents with a per-token loss mask (an aligned column), for best-fit, labels and columns together."""
    d = tmp_path_factory.mktemp("balance-bf")
    rng = np.random.default_rng(3)
    for f in range(2):
        docs = [rng.integers(1, 1000, int(n)).tolist() for n in rng.integers(1, 300, 240)]
        masks = [(np.arange(len(x)) % 3 != 0).tolist() for x in docs]
        table = pa.table(
            {"input_ids": pa.array(docs, pa.list_(pa.int32())), "loss_mask": pa.array(masks, pa.list_(pa.bool_()))}
        )
        pq.write_table(table, d / f"part-{f}.parquet", row_group_size=40)
    return d


def _global(source: Any, steps: int, **kw: Any) -> list[dict[str, Any]]:
    """Step by step, the global batch of a world-1 loader without balance: rows, costs, documents."""
    out = []
    with plitzer.Loader(source, **{**CFG, **kw}) as ld:
        for _ in range(steps):
            b = ld.next_batch()
            out.append(
                {
                    "tokens": np.asarray(b.tokens).copy(),
                    "labels": None if b.labels is None else np.asarray(b.labels).copy(),
                    "mask": b.mask.copy(),
                    "columns": {n: np.asarray(c).copy() for n, c in b.columns.items()},
                    "doc_lengths": [x.tolist() for x in b.doc_lengths],
                    "position_ids": b.position_ids.copy(),
                    "documents": b.documents().drop("batch_row").sort("lane", "start"),
                }
            )
    return out


def _dealt(source: Any, world: int, steps: int, micro: int = 1, **kw: Any) -> list[list[Any]]:
    """Each rank's batches of a balanced loader in a group of ``world`` threads: per rank, per step."""
    group = ThreadGroup(world)
    opts = {**CFG, **kw, "balance": True, "microbatches": micro}

    def rank(r: int) -> list[Any]:
        with plitzer.Loader.in_group(group.member(r), source, rank=r, world=world, **opts) as ld:
            return [ld.next_batch() for _ in range(steps)]

    return run_ranks(world, rank)


def _check_step(want: dict[str, Any], got: list[Any], world: int, micro: int) -> None:
    """The ranks' rows at one step are the global batch's, dealt as the reference deals them."""
    costs = [ref.cost_of_row(x) for x in want["doc_lengths"]]
    dealt = ref.deal(costs, world, micro)
    seen: list[int] = []
    for r, b in enumerate(got):
        lanes = b.lanes.tolist()
        assert lanes == [k for mb in dealt[r] for k in mb]
        assert b.cost.tolist() == [sum(costs[k] for k in mb) for mb in dealt[r]]
        assert np.array_equal(np.asarray(b.tokens), want["tokens"][lanes])
        assert np.array_equal(b.mask, want["mask"][lanes])
        assert np.array_equal(b.position_ids, want["position_ids"][lanes])
        assert [x.tolist() for x in b.doc_lengths] == [want["doc_lengths"][k] for k in lanes]
        if want["labels"] is not None:
            assert np.array_equal(np.asarray(b.labels), want["labels"][lanes])
        for n, c in want["columns"].items():
            assert np.asarray(b.columns[n]).dtype == c.dtype
            assert np.array_equal(np.asarray(b.columns[n]), c[lanes])
        docs = b.documents()
        assert docs["lane"].to_list() == [lanes[i] for i in docs["batch_row"].to_list()]
        seen += lanes
    assert sorted(seen) == list(range(len(costs)))


@pytest.mark.parametrize(("world", "micro"), [(1, 2), (2, 1), (2, 2), (4, 2)])
def test_ranks_deal_the_global_batch(data: Path, world: int, micro: int) -> None:
    steps = 7
    want = _global(data, steps)
    got = _dealt(data, world, steps, micro)
    for t in range(steps):
        _check_step(want[t], [got[r][t] for r in range(world)], world, micro)
    assert any(got[0][t].lanes.tolist() != list(range(len(got[0][t].lanes))) for t in range(steps))  # rows moved


def test_best_fit_labels_and_columns_follow_their_rows(bestfit_data: Path) -> None:
    kw = {"packing": "best-fit", "labels": True, "columns": ["loss_mask"], "seq_len": 320}
    want = _global(bestfit_data, 6, **kw)
    got = _dealt(bestfit_data, 4, 6, 2, **kw)
    for t in range(6):
        _check_step(want[t], [got[r][t] for r in range(4)], 4, 2)
    assert any((~w["mask"]).any() for w in want)  # padding was dealt too


def test_mixture_where_and_a_layout_stage(data: Path, bestfit_data: Path) -> None:
    src = {"a": data, "b": {"path": bestfit_data, "column": "input_ids"}}
    kw = {"weights": {"a": 2, "b": 1}, "lanes": [(0, 8), (3, 4)], "seq_len": [(0, 256), (3, 512)]}
    want = _global(src, 6, **kw)
    got = _dealt(src, 2, 6, **kw)
    for t in range(6):
        _check_step(want[t], [got[r][t] for r in range(2)], 2, 1)


def test_where_and_dedupe(data: Path) -> None:
    kw = {"where": "int_score >= 2", "dedupe": "tokens"}
    want = _global(data, 5, **kw)
    got = _dealt(data, 4, 5, 2, **kw)
    for t in range(5):
        _check_step(want[t], [got[r][t] for r in range(4)], 4, 2)


def test_checkpoints_are_the_same_bytes_and_resume_anywhere(data: Path) -> None:
    """Parts and merged checkpoints do not change with balance; a resume deals again at another world."""
    world, steps = 2, 5
    group = ThreadGroup(world)

    def rank(r: int) -> tuple[bytes, bytes]:
        opts = {**CFG, "rank": r, "world": world}
        with plitzer.Loader.in_group(group.member(r), data, balance=True, **opts) as ld:
            for _ in range(steps):
                ld.next_batch()
            part = ld.checkpoint()
        with plitzer.Loader(data, **opts) as plain:
            plain.seek(steps)
            return part, plain.checkpoint()

    parts = run_ranks(world, rank)
    assert [p for p, _ in parts] == [q for _, q in parts]
    state = plitzer.merge([p for p, _ in parts])
    want = _global(data, steps + 3)[steps:]
    with plitzer.Loader(data, **CFG) as one:  # balance off across the resume, world 1
        one.resume(state)
        for w in want:
            assert np.array_equal(np.asarray(one.next_batch().tokens), w["tokens"])
    group4 = ThreadGroup(4)

    def rank4(r: int) -> list[Any]:
        with plitzer.Loader.in_group(group4.member(r), data, rank=r, world=4, balance=True, **CFG) as ld:
            ld.resume(state)
            return [ld.next_batch() for _ in range(3)]

    got = run_ranks(4, rank4)
    for t in range(3):
        _check_step(want[t], [got[r][t] for r in range(4)], 4, 1)


def test_seek_and_a_finite_run(data: Path) -> None:
    kw = {"epochs": 1, "shuffle": False}
    with plitzer.Loader(data, **CFG, **kw) as ld:
        n = len(ld)
    want = _global(data, n, **kw)
    group = ThreadGroup(2)

    def rank(r: int) -> list[Any]:
        with plitzer.Loader.in_group(group.member(r), data, rank=r, world=2, balance=True, **CFG, **kw) as ld:
            ld.seek(n - 3)
            got = list(ld)
            assert ld.ended
            return got

    got = run_ranks(2, rank)
    assert [b.step for b in got[0]] == [n - 3, n - 2, n - 1]
    for i, t in enumerate(range(n - 3, n)):
        _check_step(want[t], [got[r][i] for r in range(2)], 2, 1)


def test_stats_carry_the_imbalance(data: Path) -> None:
    got = []
    group = ThreadGroup(2)

    def rank(r: int) -> Any:
        with plitzer.Loader.in_group(group.member(r), data, rank=r, world=2, balance=True, **CFG) as ld:
            for _ in range(6):
                ld.next_batch()
            return ld.stats

    got = run_ranks(2, rank)
    s = got[0]
    assert s.balanced_steps == 6
    assert s.imbalance is not None and s.imbalance_assigned is not None
    assert 1.0 <= s.imbalance <= s.imbalance_assigned
    moved = sum(x.rows_moved for x in got)
    assert moved > 0 and all((x.exchange_bytes > 0) == (x.rows_moved > 0) for x in got)
    with plitzer.Loader(data, **CFG) as plain:
        assert plain.stats.imbalance is None and plain.stats.balanced_steps == 0


def test_refusals(data: Path) -> None:
    with pytest.raises(ConfigError, match="group="):
        plitzer.Loader(data, **{**CFG, "world": 2}, balance=True)
    with pytest.raises(ConfigError, match="balance"):
        plitzer.Loader(data, **CFG, microbatches=2)
    with pytest.raises(ConfigError, match="microbatches=3 must divide"):
        plitzer.Loader(data, **CFG, balance=True, microbatches=3)
    with pytest.raises(ConfigError, match="microbatches=4 must divide"):
        plitzer.Loader(data, **{**CFG, "lanes": [(0, 8), (10, 2)]}, balance=True, microbatches=4)
    with plitzer.Loader(data, **CFG, balance=True, microbatches=4) as ld:
        with pytest.raises(ConfigError, match="microbatches=4 must divide"):
            ld.set_layout(lanes=2)
    with plitzer.Loader(data, **CFG) as plain:
        b = plain.next_batch()
        assert b.cost is None and b.lanes.tolist() == list(range(8)) and b.lanes.dtype == np.int64


def test_grain_deals_over_a_collective(data: Path) -> None:
    grain_ds = pytest.importorskip("plitzer.grain")
    want = _global(data, 4)
    group = ThreadGroup(2)

    def rank(r: int) -> list[Any]:
        ds = grain_ds.Dataset(data, group=group.member(r), rank=r, world=2, balance=True, microbatches=2, **CFG)
        it = iter(ds)
        try:
            return [next(it) for _ in range(4)]
        finally:
            it.close()

    got = run_ranks(2, rank)
    for t in range(4):
        costs = [ref.cost_of_row(x) for x in want[t]["doc_lengths"]]
        dealt = ref.deal(costs, 2, 2)
        for r in range(2):
            e = got[r][t]
            assert e["lanes"].tolist() == [k for mb in dealt[r] for k in mb]
            assert e["cost"].tolist() == [sum(costs[k] for k in mb) for mb in dealt[r]]
            assert np.array_equal(e["tokens"], want[t]["tokens"][e["lanes"]])
            assert np.array_equal(e["position_ids"], want[t]["position_ids"][e["lanes"]])


def test_the_worked_example_of_the_design() -> None:
    """docs/design.md, "Balanced steps": the deal of costs [9, 1, 4, 4, 16, 0, 2, 3] to 2 ranks of 2 microbatches."""
    d = deal([9, 1, 4, 4, 16, 0, 2, 3], world=2, microbatches=2)
    assert (d.lanes_of(0).tolist(), d.lanes_of(1).tolist()) == ([4, 5, 1, 7], [0, 6, 2, 3])
    assert d.cost.tolist() == [[16, 4], [11, 8]] and d.rank_cost.tolist() == [20, 19]


def test_live_changes_while_a_step_is_dealt_ahead(data: Path, bestfit_data: Path) -> None:
    """set_layout and set_weights settle the step being exchanged ahead, then the run is the one with the stages."""
    src = {"a": data, "b": {"path": bestfit_data, "column": "input_ids"}}
    kw: dict[str, Any] = {"weights": {"a": 1, "b": 1}}

    def steps(ld: Any) -> list[Any]:
        out = [ld.next_batch() for _ in range(3)]
        ld.set_layout(lanes=4)
        out += [ld.next_batch() for _ in range(3)]
        ld.set_weights({"a": 1, "b": 3})
        return out + [ld.next_batch() for _ in range(4)]

    with plitzer.Loader(src, **CFG, **kw) as one:
        want = [(np.asarray(b.tokens).copy(), [x.tolist() for x in b.doc_lengths]) for b in steps(one)]
    group = ThreadGroup(2)

    def rank(r: int) -> list[Any]:
        with plitzer.Loader.in_group(group.member(r), src, rank=r, world=2, balance=True, **CFG, **kw) as ld:
            return [(b.lanes.copy(), np.asarray(b.tokens).copy()) for b in steps(ld)]

    got = run_ranks(2, rank)
    for t, (tokens, lengths) in enumerate(want):
        dealt = ref.deal([ref.cost_of_row(x) for x in lengths], 2)
        for r in range(2):
            lanes, rows = got[r][t]
            assert lanes.tolist() == dealt[r][0], f"step {t} rank {r}"
            assert np.array_equal(rows, tokens[lanes])
