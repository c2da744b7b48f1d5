"""Lanes in lockstep over long runs: memory stays flat however long the run (issue 11).

A real run reads hundreds of thousands of windows. These runs are scaled down (many
tiny row groups, one or two per window) but go through thousands of windows, and
check what the contract promises at every step: the units held never exceed the
step's windows plus the prefetch, and the bytes held never exceed ``budget``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import plitzer
from plitzer.loader import budget_floor
from plitzer.readpath.scan import AHEAD


@pytest.fixture(scope="module")
def tiny_row_groups(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """5,100 row groups of 3 documents of 15-40 tokens (45-120 tokens each)."""
    root = tmp_path_factory.mktemp("tiny")
    rng = np.random.default_rng(11)
    lengths = rng.integers(15, 41, 15_300)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    values = pa.array(np.arange(int(offsets[-1]), dtype=np.int32) % 50_000)
    table = pa.table({"tokens": pa.ListArray.from_arrays(pa.array(offsets), values)})
    pq.write_table(table, root / "part-0.parquet", row_group_size=3)
    return root


@pytest.mark.slow
@pytest.mark.e2e  # thousands of windows: a long run, the e2e run's
@pytest.mark.filterwarnings("ignore::plitzer.PerformanceWarning")  # the floor has no room to prefetch
@pytest.mark.parametrize(("window", "world", "budget"), [(1, 1, "floor"), (2, 2, "large")])
def test_thousands_of_windows_hold_two_plus_prefetch(
    tiny_row_groups: Path, window: int, world: int, budget: str
) -> None:
    cfg = {"lanes": 4, "window": window, "seq_len": 8, "seed": 5}
    ix = plitzer.index(tiny_row_groups)
    need, units = budget_floor(
        ix.frame["tokens"].to_numpy(),
        ix.frame["rows"].to_numpy(),
        **{k: cfg[k] for k in ("lanes", "window", "seq_len")},
    )
    assert units == 2  # every window holds more than a step's (L + 1) * B tokens
    limit = need if budget == "floor" else 8 << 30
    windows_per_epoch = -(-ix.row_groups // window)
    for rank in (world - 1,):
        with plitzer.Loader(ix, budget=limit, rank=rank, world=world, **cfg) as loader:
            epochs = window  # at least 5,000 windows either way
            while loader.epoch < epochs:
                loader.next_batch()
                assert loader.held_bytes <= limit
            assert windows_per_epoch * epochs >= 5_000
            stats = loader.stats
            assert stats.overruns == 0 and stats.caller_overruns == 0
            assert 0 < loader.peak_bytes <= limit
            # Held at once: the window in use, the next, and what the prefetch adds.
            assert stats.peak_units <= 2 + AHEAD


def test_old_rule_would_have_drifted(tiny_row_groups: Path) -> None:
    """The first lane rule (whole documents to the lane of their start) on the same data:
    lanes drift apart by many windows over the same run, where the new rule keeps them
    within one token. This is the regression the lockstep rule fixes."""
    ix = plitzer.index(tiny_row_groups)
    plan = plitzer.plan(ix, lanes=4, window=1)
    ep = plan.epoch(0)
    from plitzer.tools.explain import document_lengths

    lengths = document_lengths(ix)
    rows = ix.frame["rows"].to_numpy()
    base = np.cumsum(rows) - rows
    old = np.zeros(4, np.int64)
    new = np.zeros(4, np.int64)
    worst_old = worst_new = 0
    for w in range(plan.windows):
        g = int(ep.order[w])
        docs = lengths[base[g] : base[g] + rows[g]]
        t = int(docs.sum())
        starts = np.cumsum(docs) - docs
        lane = np.minimum(3, ((starts + 1) * 4 - 1) // t)  # max{k : floor(k*t/4) <= start}
        old += np.bincount(lane, weights=docs, minlength=4).astype(np.int64)
        new += np.diff(ep.cuts(w, 4))
        worst_old, worst_new = max(worst_old, int(old.max() - old.min())), max(worst_new, int(new.max() - new.min()))
    assert worst_new <= 1
    assert worst_old > 1000  # tokens: whole windows' worth apart


@pytest.mark.filterwarnings("ignore::plitzer.PerformanceWarning")
@pytest.mark.parametrize(("seq_len", "window", "steps"), [(64, 1, 300), (300, 2, 100), (2048, 3, 25)])
def test_windows_shorter_than_a_step_stay_within_the_floor(
    tiny_row_groups: Path, seq_len: int, window: int, steps: int
) -> None:
    """When a step spans several windows, the floor counts them all; the run never passes it."""
    cfg = {"lanes": 4, "window": window, "seq_len": seq_len, "seed": 1}
    ix = plitzer.index(tiny_row_groups)
    need, units = budget_floor(
        ix.frame["tokens"].to_numpy(),
        ix.frame["rows"].to_numpy(),
        **{k: cfg[k] for k in ("lanes", "window", "seq_len")},
    )
    assert units > 2
    with plitzer.Loader(ix, budget=need, **cfg) as loader:
        for _ in range(steps):
            loader.next_batch()
            assert loader.held_bytes <= need
        assert loader.stats.overruns == 0 and loader.peak_bytes <= need
