"""Balanced steps over real gloo process groups (SPEC section 18), through ``plitzer.torch.Dataset``.

Worlds 2 and 4 of processes (tests/balance_worker.py): each rank's rows, lanes and costs
against the reference deal (tests/balance_reference.py) of the global batch that a world-1
loader without balance gives; the union of the ranks' rows is that batch; a checkpoint taken
at world 2 with balance resumes at world 4 with balance and at world 1 without.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import plitzer
import plitzer.synth
from tests import balance_reference as ref
from tests.balance_worker import SETTINGS
from tests.net import gloo_job

pytest.importorskip("torch")
pytestmark = pytest.mark.slow  # real processes and gloo (the checkout run of .ci/run runs it)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("balance-gloo")
    plitzer.synth.write(
        d, tokens=120_000, seed=11, mean_length=150, sigma=1.4, docs_per_row_group=60, row_groups_per_file=4
    )
    return d


def _global(data: Path, first: int, steps: int) -> list[Any]:
    with plitzer.Loader(data, **SETTINGS) as ld:
        ld.seek(first)
        return [ld.next_batch() for _ in range(steps)]


def _check(want: list[Any], got: list[dict[str, Any]], world: int, micro: int = 1) -> None:
    for i, w in enumerate(want):
        costs = [ref.cost_of_row(x.tolist()) for x in w.doc_lengths]
        dealt = ref.deal(costs, world, micro)
        seen = []
        for r in range(world):
            s = got[r]["steps"][i]
            assert s["step"] == w.step
            assert s["lanes"] == [k for mb in dealt[r] for k in mb], f"step {w.step} rank {r}"
            assert s["cost"] == [sum(costs[k] for k in mb) for mb in dealt[r]]
            np.testing.assert_array_equal(np.array(s["tokens"]), np.asarray(w.tokens)[s["lanes"]])
            np.testing.assert_array_equal(np.array(s["labels"]), np.asarray(w.labels)[s["lanes"]])
            assert s["doc_lengths"] == [w.doc_lengths[k].tolist() for k in s["lanes"]]
            seen += s["lanes"]
        assert sorted(seen) == list(range(SETTINGS["lanes"]))  # type: ignore[call-overload]


def test_worlds_2_and_4_deal_the_global_batch_and_resume(data: Path, tmp_path: Path) -> None:
    two = gloo_job("balance_worker.py", ["--data", str(data), "--steps", "6", "--state-at", "3"], tmp_path, "w2", 2)
    _check(_global(data, 0, 6), two, 2)
    assert sum(g["stats"]["rows_moved"] for g in two) > 0
    state = bytes.fromhex(two[0]["state"])
    assert two[1]["state"] == two[0]["state"]
    four = gloo_job(
        "balance_worker.py",
        ["--data", str(data), "--steps", "3", "--microbatches", "2", "--resume", state.hex()],
        tmp_path,
        "w4",
        4,
    )
    _check(_global(data, 3, 3), four, 4, 2)
    with plitzer.Loader(data, **SETTINGS) as one:  # world 1, balance off
        one.resume(state)
        for s in range(3, 6):
            b = one.next_batch()
            rows = {
                lane: row
                for r in range(2)
                for lane, row in zip(two[r]["steps"][s]["lanes"], two[r]["steps"][s]["tokens"], strict=True)
            }
            np.testing.assert_array_equal(np.asarray(b.tokens), np.array([rows[k] for k in range(8)]))


def test_a_rank_that_dies_ends_its_peers_wait_with_an_error(data: Path, tmp_path: Path) -> None:
    """Rank 1 exits mid-run: rank 0's next exchange raises, naming the step, instead of waiting for ever."""
    import json
    import subprocess
    import sys

    from tests import prefork
    from tests.net import free_port, gloo_env

    env, port = gloo_env(2), free_port()
    script = Path(__file__).resolve().parents[1] / "balance_worker.py"
    procs = []
    for rank in range(2):
        out = tmp_path / f"die.{rank}.json"
        cmd = [sys.executable, str(script), "--data", str(data), "--steps", "6", "--die-at", "3"]
        cmd += ["--port", str(port), "--out", str(out)]
        procs.append(prefork.Popen(cmd, env={**env, "RANK": str(rank)}, stderr=subprocess.PIPE))
    try:
        errs = [p.communicate(timeout=120)[1].decode(errors="replace") for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert procs[1].returncode == 3 and procs[0].returncode == 0, errs[0][-3000:]
    got = json.loads((tmp_path / "die.0.json").read_text())
    assert got["error"].startswith("ExchangeError: step ") and "rank 0 of 2" in got["error"], got
