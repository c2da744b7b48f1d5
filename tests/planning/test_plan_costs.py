"""``plan.costs`` (SPEC section 18 rule 5) against the loader's own batches and tests/balance_reference.py.

A row's cost is the sum of ``n * n`` over the loader's ``doc_lengths`` of that row, read from a
``world=1`` loader (whose batch is the global batch, row ``k`` lane ``k``); ``assigned`` is section
4's blocks of lanes, ``balanced`` the naive reference deal of those costs. Concat and best-fit,
layout stages, a finite run's end, mixtures and a selection.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl
import pytest

import plitzer
from planner.errors import ConfigError
from plitzer.tools.explain import document_lengths
from tests.balance_reference import cost_of_row, deal
from tests.conftest import SynthDataset


@pytest.fixture(scope="module")
def data(synth_dataset: SynthDataset) -> Path:
    return synth_dataset(200_000, seed=3, docs_per_row_group=40, mean_length=300)


@pytest.fixture(scope="module")
def short(synth_dataset: SynthDataset) -> Path:
    return synth_dataset(60_000, seed=4, docs_per_row_group=30, mean_length=80)


def _loader_costs(source: Any, cfg: dict[str, Any], first: int, last: int) -> dict[int, list[int]]:
    """Each step's row costs from a world-1 loader's batches (row ``k`` is lane ``k``)."""
    out = {}
    with plitzer.Loader(source, world=1, rank=0, **cfg) as loader:
        loader.seek(first)
        for t in range(first, last + 1):
            out[t] = [cost_of_row([int(n) for n in row]) for row in loader.next_batch().doc_lengths]
    return out


def _check(source: Any, cfg: dict[str, Any], world: int, first: int, last: int, microbatches: int = 1) -> None:
    got = plitzer.plan(source, world=world, **cfg).costs(first, last, microbatches)
    assert got.columns == ["step", "rank", "microbatch", "balanced", "assigned"]
    assert all(dtype == pl.Int64 for dtype in got.dtypes)
    assert got.height == (last - first + 1) * world * microbatches
    for t, costs in _loader_costs(source, cfg, first, last).items():
        rows = got.filter(pl.col("step") == t).sort("rank", "microbatch")
        assert rows["rank"].to_list() == [r for r in range(world) for _ in range(microbatches)]
        per = len(costs) // (world * microbatches)
        assert rows["assigned"].to_list() == [sum(costs[i * per : (i + 1) * per]) for i in range(world * microbatches)]
        dealt = deal(costs, world, microbatches)
        assert rows["balanced"].to_list() == [sum(costs[k] for k in mb) for rank in dealt for mb in rank]


@pytest.mark.parametrize(
    ("cfg", "world", "steps", "microbatches"),
    [
        ({"seed": 1, "lanes": 8, "window": 3, "seq_len": 128}, 2, (5, 30), 1),
        ({"seed": 2, "lanes": 8, "window": 3, "seq_len": 128}, 4, (0, 24), 2),
        ({"seed": 1, "lanes": 8, "window": 3, "seq_len": 128, "packing": "best-fit", "pad_id": 7}, 4, (3, 40), 2),
        ({"seed": 3, "lanes": 16, "window": 2, "seq_len": 64, "packing": "best-fit"}, 2, (0, 20), 4),
    ],
    ids=["concat", "concat-microbatches", "best-fit", "best-fit-world-2"],
)
def test_costs_are_the_loaders(
    data: Path, cfg: dict[str, Any], world: int, steps: tuple[int, int], microbatches: int
) -> None:
    _check(data, cfg, world, *steps, microbatches)


@pytest.mark.parametrize(
    "cfg",
    [
        {"seed": 1, "lanes": [(0, 8), (10, 4)], "window": 3, "seq_len": [(0, 128), (20, 256)]},
        {"seed": 1, "lanes": [(0, 8), (10, 4)], "window": 3, "seq_len": 128, "packing": "best-fit"},
    ],
    ids=["concat", "best-fit"],
)
def test_costs_under_layout_stages(data: Path, cfg: dict[str, Any]) -> None:
    _check(data, cfg, 2, 0, 30, 2)  # each stage's lanes, the window cut again at a change


@pytest.mark.parametrize("packing", ["concat", "best-fit"])
def test_costs_at_a_finite_runs_end(data: Path, packing: str) -> None:
    # The last steps: lanes whose stream has ended give rows of padding, one segment each.
    cfg: dict[str, Any] = {
        "seed": 1,
        "lanes": 8,
        "window": 3,
        "seq_len": 128,
        "epochs": 1,
        "packing": packing,
        "shuffle": False,
    }
    with plitzer.Loader(data, **cfg) as loader:
        n = len(loader)
    _check(data, cfg, 2, n - 12, n - 1)
    with pytest.raises(ConfigError, match=rf"last_step={n} is past the run's end: epochs=1 ends it after {n} steps"):
        plitzer.plan(data, world=2, **cfg).costs(0, n)


@pytest.mark.parametrize(
    "cfg",
    [
        {"weights": {"a": 1, "b": 1}},
        {"weights": [(0, {"a": 1, "b": 1}), (15, {"a": 1, "b": 3})]},
        {"weights": {"a": 1, "b": 2}, "packing": "best-fit"},
    ],
    ids=["weights", "weight-stages", "best-fit"],
)
def test_costs_of_a_mixture(data: Path, short: Path, cfg: dict[str, Any]) -> None:
    _check({"a": data, "b": short}, {"seed": 1, "lanes": 8, "window": 3, "seq_len": 128, **cfg}, 2, 0, 40, 2)


def test_costs_of_a_selection(data: Path) -> None:
    _check(data, {"seed": 1, "lanes": 8, "window": 3, "seq_len": 128, "where": "score > 2"}, 2, 0, 30)


def test_lengths_given_are_the_default_pass(data: Path) -> None:
    p = plitzer.plan(data, lanes=8, window=3, seq_len=128, world=4)
    assert p.costs(0, 9, lengths=document_lengths(data)).equals(p.costs(0, 9))


def test_costs_in_sql(data: Path) -> None:
    p = plitzer.plan(data, lanes=8, window=3, seq_len=128, world=2, epochs=1)
    with plitzer.Loader(data, lanes=8, window=3, seq_len=128, epochs=1) as loader:
        n = len(loader)
    got = p.sql("select count(*) as rows, max(step) as last, sum(assigned) = sum(balanced) as same from costs")
    assert got.row(0) == (n * 2, n - 1, True)
    want = p.costs(0, n - 1).filter(pl.col("step") == 3).sort("rank")
    assert p.sql("select * from costs where step = 3 order by rank").equals(want)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((5, 2), r"first_step=5 is after last_step=2: give first_step <= last_step"),
        ((-1, 2), r"first_step=-1 must be an integer >= 0"),
        ((0, 1.5), r"last_step=1.5 must be an integer >= 0"),
        ((0, 2, 0), r"microbatches=0 must be an integer >= 1"),
        (
            (0, 2, 3),
            r"microbatches=3 must divide the 4 rows a rank holds \(lanes=8 / world=2, from step 0\); "
            r"use one of \[1, 2, 4\]",
        ),
    ],
)
def test_bad_arguments_name_the_field_and_the_fix(data: Path, args: tuple[Any, ...], match: str) -> None:
    p = plitzer.plan(data, lanes=8, window=3, seq_len=128, world=2)
    with pytest.raises(ConfigError, match=match):
        p.costs(*args)


def test_microbatches_must_divide_every_stage_the_steps_meet(data: Path) -> None:
    p = plitzer.plan(data, lanes=[(0, 8), (10, 4)], window=3, seq_len=128, world=2)
    assert p.costs(0, 9, microbatches=4).height == 10 * 8  # the first stage alone: 4 rows a rank
    with pytest.raises(
        ConfigError, match=r"microbatches=4 must divide the 2 rows a rank holds \(lanes=4 / world=2, from step 10\)"
    ):
        p.costs(5, 12, microbatches=4)


def test_a_plan_without_steps_is_refused(data: Path) -> None:
    with pytest.raises(ConfigError, match=r"plan.costs needs the run's steps: give seq_len="):
        plitzer.plan(data, lanes=8, window=3).costs(0, 1)


@pytest.mark.parametrize("packing", ["concat", "best-fit"])
def test_steps_in_chunks_are_the_steps_at_once(data: Path, packing: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import planner.lookup.costs as costs

    p = plitzer.plan(data, lanes=[(0, 8), (50, 4)], window=1, seq_len=64, world=2, packing=packing)
    whole = p.costs(0, 120, microbatches=2)
    monkeypatch.setattr(costs, "CHUNK_UNITS", 1)  # then the largest window's units a chunk
    assert len(list(costs._chunks(p, p.layout, 0, 120))) >= 3  # a chunk boundary inside a window, one in stage 1
    assert p.costs(0, 120, microbatches=2).equals(whole)
