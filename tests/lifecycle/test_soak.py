"""Process memory stays flat over a long run: the bounded form of benchmarks/soak.py.

20,000 steps of a three-source mixture with stages (about 20 epochs, 4,000 windows
read), locally and from S3 (moto's server on 127.0.0.1), each in a fresh process:
after the first epoch boundary, the process's RSS must stay within 5 % or 4 MiB of
its level there, whichever is larger. That is the full size, which CI runs as a run of
its own (``PLITZER_STRESS=full``); otherwise ``python -m pytest -m e2e`` takes 8,000 steps
(about 8 epochs) sampled as often. It is an end-to-end suite (marked ``e2e``), which the
README's test command leaves out so that it stays within ten minutes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BOUND_MIB = 4.0
FULL = os.environ.get("PLITZER_STRESS") == "full"
STEPS, EVERY, EPOCHS = (20_000, 250, 10) if FULL else (8_000, 100, 4)


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_rss_stays_flat_over_twenty_thousand_steps(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    r = subprocess.run(
        [
            *(
                sys.executable,
                str(ROOT / "benchmarks" / "soak.py"),
                "--steps",
                str(STEPS),
                "--every",
                str(EVERY),
                "--s3",
            ),
            *("--slack-mib", str(BOUND_MIB), "--json", str(out), "--data", str(tmp_path / "data")),
        ],
        capture_output=True,
        text=True,
        timeout=580,
        check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    results = json.loads(out.read_text())
    assert set(results) == {"local", "s3"}
    for name, res in results.items():
        step, base, _ = res["boundary"]
        assert res["epochs"] >= EPOCHS, (name, res["epochs"])  # epochs wrapped many times
        after = [s for s in res["samples"] if s[0] >= step]
        assert len(after) > 50
        growth = max(s[2] for s in after) - base
        assert growth <= max(0.05 * base, BOUND_MIB * (1 << 20)), (name, growth / (1 << 20))
