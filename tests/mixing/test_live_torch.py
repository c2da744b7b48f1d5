"""set_weights through plitzer.torch.Dataset: one process, and two gloo ranks (same call; different calls refused)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

import plitzer
import plitzer.torch
from tests.conftest import tokens_of
from tests.live_worker import SETTINGS, W0
from tests.mixing.test_live import two
from tests.net import gloo_job

__all__ = ["two"]  # the fixture, imported for pytest

ROOT = Path(__file__).resolve().parents[2]


def test_dataset_set_weights_equals_the_loader(two: dict[str, str]) -> None:
    with plitzer.torch.Dataset(two, weights=W0, **SETTINGS) as ds, plitzer.Loader(two, weights=W0, **SETTINGS) as ld:
        for _ in range(5):
            ds.next_batch(), ld.next_batch()
        assert ds.set_weights({"a": 1, "b": 3}) == ld.set_weights({"a": 1, "b": 3})
        for _ in range(20):
            np.testing.assert_array_equal(ds.next_batch().tokens.numpy(), tokens_of(ld.next_batch()))
        assert plitzer.state.checkpoint.decode(ds.state_dict()["checkpoint"]).config["stages"] == ld.config["stages"]


def _job(two: dict[str, str], mode: str, out: Path) -> list[dict]:  # type: ignore[type-arg]
    return gloo_job("live_worker.py", ["--sources", json.dumps(two), "--mode", mode], out, mode)


@pytest.mark.slow  # real processes and gloo (the checkout run of .ci/run runs it)
def test_gloo_ranks_same_call_and_different_calls(two: dict[str, str], tmp_path: Path) -> None:
    same = _job(two, "same", tmp_path)
    assert same[0]["at"] == same[1]["at"] and "error" not in same[0]
    with plitzer.Loader(two, weights=[(0, W0), (same[0]["at"], {"a": 1, "b": 3})], **SETTINGS) as ref:
        ref.seek(5)
        for t in range(10):
            rows = np.concatenate([np.array(same[r]["rows"][t]) for r in range(2)])
            np.testing.assert_array_equal(rows, tokens_of(ref.next_batch()), err_msg=f"step {5 + t}")
    # The merged state resumes in one process, built with the first weights only.
    with plitzer.Loader(two, weights=W0, **SETTINGS) as one, plitzer.Loader(two, weights=W0, **SETTINGS) as live:
        one.resume(bytes.fromhex(same[0]["state"]))
        live.next_batch()  # a run that makes the call itself, for the reference
        live.seek(5)
        live.set_weights({"a": 1, "b": 3}, at_step=same[0]["at"])
        live.seek(15)
        for _ in range(10):
            np.testing.assert_array_equal(tokens_of(one.next_batch()), tokens_of(live.next_batch()))
    differ = _job(two, "differ", tmp_path)
    for r in range(2):
        assert "set_weights() differs across ranks" in differ[r]["error"]
        assert (
            "rank 0: step 5, at_step None, weights #1; rank 1: step 5, at_step None, weights #2" in differ[r]["error"]
        )
        assert differ[r]["stages"] == [[0, W0]]  # no rank changed its mixture
