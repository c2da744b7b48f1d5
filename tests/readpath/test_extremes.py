"""Size extremes: each works within the budget or fails at construction naming the setting."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import plitzer
from tests.conftest import docs_by_row_group, numbered_dataset, tokens_of
from tests.reference import lane_streams


def _check_against_reference(root: Path, files: list, **cfg: int) -> None:
    docs = docs_by_row_group(files)
    streams = lane_streams(docs, cfg["seed"], cfg["lanes"], cfg["window"], 12)
    steps = min(len(s) for s in streams) // cfg["seq_len"]
    assert steps > 0
    with plitzer.Loader(root, **cfg) as ld:
        for t in range(min(steps, 50)):
            got = tokens_of(ld.next_batch())
            L = cfg["seq_len"]
            want = np.array([[x for x, *_ in s[t * L : (t + 1) * L]] for s in streams])
            np.testing.assert_array_equal(got, want)


def test_one_document_longer_than_many_sequences(tmp_path: Path) -> None:
    files = numbered_dataset(tmp_path, [[[5, 10_000, 3], [7, 8]], [[2_000]]])
    _check_against_reference(tmp_path, files, seed=0, lanes=2, window=2, seq_len=16)


def test_fewer_tokens_than_one_global_batch(tmp_path: Path) -> None:
    files = numbered_dataset(tmp_path, [[[3, 4], [5]]])  # 12 tokens; a step takes 2 x 20
    with plitzer.Loader(tmp_path, lanes=2, window=1, seq_len=20) as ld:
        assert len(ld) == 1
        b = ld.next_batch()
        assert b.epoch == 0 and ld.epoch == 3  # floor(1 * 40 / 12)
        assert tokens_of(b).shape == (2, 20)
        assert len(list(ld)) == 1
    _check_against_reference(tmp_path, files, seed=0, lanes=2, window=1, seq_len=20)


def test_windows_with_fewer_tokens_than_lanes(tmp_path: Path) -> None:
    # Row groups of 1-3 tokens, windows of 2: many lanes get empty slices.
    files = numbered_dataset(tmp_path, [[[1], [2], [1, 1], [3], [2], [1]] * 3])
    _check_against_reference(tmp_path, files, seed=5, lanes=4, window=2, seq_len=3)


def test_row_group_larger_than_the_budget_fails_at_construction(tmp_path: Path) -> None:
    numbered_dataset(tmp_path, [[[50_000]]])
    with pytest.raises(
        plitzer.ConfigError, match=r"budget=100,000 bytes cannot hold the windows one step can touch.*Raise budget"
    ):
        plitzer.Loader(tmp_path, lanes=2, window=1, seq_len=16, budget=100_000)


@pytest.mark.slow
@pytest.mark.e2e  # a size extreme at scale: the e2e run's
@pytest.mark.timeout(120)
def test_twenty_thousand_tiny_row_groups(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    n = 20_000
    lengths = rng.integers(1, 8, n)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    values = pa.array(np.arange(offsets[-1], dtype=np.int32))
    pq.write_table(
        pa.table({"tokens": pa.ListArray.from_arrays(pa.array(offsets), values)}),
        tmp_path / "t.parquet",
        row_group_size=1,
    )
    ix = plitzer.index(tmp_path)
    assert ix.row_groups == n
    with plitzer.Loader(ix, lanes=16, window=512, seq_len=64, seed=3) as ld:
        seen = [tokens_of(b).ravel().copy() for b in ld]
    got = np.concatenate(seen)
    # One epoch: every token of the dataset exactly once, plus the start of the next epoch.
    total = int(offsets[-1])
    first = got[:total]
    assert len(np.unique(first)) > 0.95 * total
    counts = np.bincount(got, minlength=total)
    assert counts.min() >= 1 and counts.max() <= 2
