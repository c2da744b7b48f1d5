"""The trainers' pages' "Try it on a laptop" commands, as written there, on CPU.

torchtitan: ``python -m plitzer.integrations.torchtitan_cpu`` (the device, SDPA and
data-parallel replication a CPU run needs) with torchtitan's own command line, one process
without torchrun. OLMo-core: docs/examples/olmo_core_laptop.py. Skipped where the trainer is
not installed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import plitzer.synth

pytestmark = pytest.mark.trainers

ROOT = Path(__file__).resolve().parents[2]


def test_torchtitan_on_a_laptop(tmp_path: Path) -> None:
    pytest.importorskip("torchtitan")
    plitzer.synth.write(tmp_path / "data" / "small", 100_000, seed=1, vocab=2000)  # plitzer synth ... --vocab 2000
    page = (ROOT / "docs" / "trainers" / "torchtitan.md").read_text()
    command = page.split("python -m plitzer.integrations.torchtitan_cpu", 1)[1].split("```", 1)[0]
    args = command.replace("\\\n", " ").split()
    steps = args.index("--training.steps")
    args[steps + 1] = "2"  # the page's 10 steps: 2 here
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("LOCAL_RANK", None)
    run = subprocess.run(
        [sys.executable, "-m", "plitzer.integrations.torchtitan_cpu", *args],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-4000:]
    assert "step:  2" in log and "loss:" in log, log[-4000:]


def test_olmo_core_on_a_laptop(tmp_path: Path) -> None:
    """docs/examples/olmo_core_laptop.py, as its docstring runs it, in a folder of its own."""
    pytest.importorskip("olmo_core")
    plitzer.synth.write(tmp_path / "data" / "small", 100_000, seed=1, vocab=2000)  # plitzer synth ... --vocab 2000
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "examples" / "olmo_core_laptop.py")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-4000:]
    assert "[step=10/10" in log, log[-4000:]
