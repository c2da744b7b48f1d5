"""What grew with ranks on every rank: the epoch layout's tables of every rank's reads.

``layout_epoch`` built every rank's reads (about positions x world / W) and a (windows x
world) table on every rank: 1.1 GB and 15 s an epoch at 10^6 row groups and 1,024 ranks.
A rank's loader now asks only its own reads of a window, from the window's positions;
the (windows x world) table is built only for windows shorter than the lanes (the only
ones where a rank can own no token), and every rank's reads only when a plan table asks.
Both must be what the full tables gave.

And the cluster benchmark's real run (benchmarks/cluster.py --real), at a tiny size: what it
counts and prints.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from planner.lanes import cut_at
from planner.order.epoch import PlanSettings, layout_epoch

ROOT = Path(__file__).resolve().parents[2]


def _reads_with_the_full_table(
    order: np.ndarray, tok: np.ndarray, rows: np.ndarray, emp: np.ndarray, s: PlanSettings, run_before: int
) -> set[tuple[int, int, int]]:
    """(window, rank, position) of every read, filtering by the whole (windows x world) table."""
    ep = layout_epoch(order, tok, rows, emp, s, 0, run_before)
    per = s.lanes // s.world
    rk = np.arange(s.world, dtype=np.int64)[None, :]
    wt = ep.window_tokens
    c_lo = cut_at(rk * per, (wt // s.lanes)[:, None], (wt % s.lanes)[:, None], ep.window_z[:, None], s.lanes)
    c_hi = cut_at((rk + 1) * per, (wt // s.lanes)[:, None], (wt % s.lanes)[:, None], ep.window_z[:, None], s.lanes)
    nonempty = c_lo < c_hi
    nonempty[:, -1] = True
    out = set()
    for p in range(len(order)):
        if rows[order[p]] == 0:
            continue
        a, b, w = int(ep.first_rank[p]), int(ep.last_rank[p]), int(ep.window[p])
        out |= {(w, r, p) for r in range(a, b + 1) if r in (a, b) or nonempty[w, r]}
    return out


@pytest.mark.parametrize("seed", range(60))
def test_reads_equal_the_full_rank_table(seed: int) -> None:
    rng = np.random.default_rng(seed)
    g, lanes = int(rng.integers(1, 60)), int(rng.integers(1, 65))
    world = int(rng.choice([d for d in range(1, lanes + 1) if lanes % d == 0]))
    tok = rng.integers(0, 40, g).astype(np.int64)  # windows both shorter and longer than the lanes
    rows = np.where(tok > 0, rng.integers(1, 5, g), rng.integers(0, 2, g)).astype(np.int64)
    emp = np.minimum(rows, rng.integers(0, 2, g)).astype(np.int64)
    s = PlanSettings(seed=1, lanes=lanes, window=int(rng.integers(1, 6)), world=world)
    order = rng.permutation(g).astype(np.int64)
    run_before = int(rng.integers(0, 100))
    ep = layout_epoch(order, tok, rows, emp, s, 0, run_before)
    want = _reads_with_the_full_table(order, tok, rows, emp, s, run_before)
    # What a rank's loader asks (one window, one rank: from the window's positions alone) ...
    for w in range(ep.windows):
        for r in range(world):
            got = ep.reads_of(w, r).tolist()
            assert got == sorted(p for ww, rr, p in want if (ww, rr) == (w, r))
    # ... and the plan's table of every rank's reads, built on first use.
    got_all = set(zip(ep.read_window.tolist(), ep.read_rank.tolist(), ep.read_position.tolist(), strict=True))
    assert got_all == want


# -- the cluster benchmark's real run -------------------------------------------------------


@pytest.mark.e2e  # a gloo job against a store at scale: the e2e run's
@pytest.mark.timeout(120)
@pytest.mark.skipif(sys.platform == "win32", reason="gloo process groups on loopback are tested on POSIX")
def test_the_real_run_counts_one_listing_and_a_footer_a_file(tmp_path: Path) -> None:
    """benchmarks/cluster.py --real at a tiny size: 2 gloo ranks, each its own cache folder, over
    40 files on moto's S3 server behind a 5 ms proxy; it counts at the proxy what the ranks asked
    before the job's first batch and prints the figures against raw boto3 on the same ranks."""
    pytest.importorskip("torch")
    pytest.importorskip("moto")
    out = tmp_path / "figures.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "cluster.py"), "--real", "--files", "40", "--ranks", "2"]
    cmd += ["--latency-ms", "5", "--window", "2", "--seq-len", "128", "--repeat", "1", "--json", str(out)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=110, check=False, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    got = json.loads(out.read_text())
    ours, raw = got["plitzer"], got["raw"]
    assert got["files"] == 40
    assert ours["listings"] == 1  # rank 0's, for the job
    assert ours["footer_gets"] == ours["distinct_footers"] == 40  # each footer once between the ranks
    assert 1 <= ours["first_step_gets"] <= 2 + 1  # a window of 2 row groups, one of them read by both ranks
    assert ours["other"] == 0
    assert got["data_gets_per_file"] <= 1.1
    assert raw["listings"] == 2 and raw["footer_gets"] == 40  # each rank lists; its half of the tails
    for line in (
        r"first batch \d+\.\d\d s",
        r"listing 1 \(pages of 1,000 keys\), footer GETs 40 \(40 distinct\), .* window\(s\) \d, other 0: "
        r"1\.0\d\d data GETs a file",
        r"raw boto3 on the same ranks .*: \d+\.\d\d s",
        r"listing 2, GETs 40 \(1\.000 a file\)",
        r"plitzer / raw boto3: time to first batch \d+\.\d\dx, data GETs a file 1\.0\dx, listing requests 1 / 2",
    ):
        assert re.search(line, done.stdout), (line, done.stdout)
