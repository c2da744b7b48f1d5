"""End to end, real processes: kill a torch.distributed job, resume it on another world size.

Each test launches ``tests/dist_worker.py`` once per rank (gloo, a TCP store on
127.0.0.1 at a free port), all in one process group. The launcher SIGKILLs the
whole group at a random step after a checkpoint is on disk, restarts with a
different world size from that checkpoint, and checks that the running hash of
the global sample stream equals that of an uninterrupted run. Set
``PLITZER_TEST_SEED`` to replay a failure's kill step.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
if sys.platform == "win32":  # pragma: no cover
    pytest.skip("process groups and SIGKILL are POSIX", allow_module_level=True)

import plitzer
import plitzer.state.checkpoint
from tests import prefork
from tests.conftest import SynthDataset
from tests.dist_worker import SETTINGS, ZERO, fold, row_digests
from tests.net import free_port, gloo_env

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "dist_worker.py"
STEPS = 90  # one epoch is about 65 steps: the runs cross an epoch edge
EVERY = 4


# Real processes and gloo: the slowest tests; the checkout run of .ci/run runs them.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def data(synth_dataset: SynthDataset) -> Path:
    d = synth_dataset(tokens=100_000, seed=11, docs_per_row_group=50, row_groups_per_file=4, mean_length=150)
    plitzer.index(d)  # fill the index cache once, before the processes start
    return d


@pytest.fixture(scope="module")
def reference(data: Path) -> list[bytes]:
    """The running hash after each step of an uninterrupted run (plain Loader, one rank)."""
    hashes = []
    h = ZERO
    with plitzer.Loader(data, threads=2, **SETTINGS) as loader:
        assert loader.tokens // (SETTINGS["lanes"] * SETTINGS["seq_len"]) < STEPS  # crosses an epoch
        for t in range(STEPS):
            b = loader.next_batch()
            h = fold(h, t, row_digests(np.from_dlpack(b.tokens), b.position_ids))
            hashes.append(h)
    return hashes


def _seed() -> int:
    return int(os.environ.get("PLITZER_TEST_SEED", random.randrange(1 << 30)))


class Job:
    """``world`` worker processes in one new process group."""

    def __init__(self, world: int, data: Path, out: Path, run: str, *args: str) -> None:
        self.out, self.run = out, run
        port = free_port()
        env = gloo_env(world)
        self.procs: list[prefork.Popen] = []
        cmd = [sys.executable, str(WORKER), "--data", str(data), "--out", str(out), "--port", str(port)]
        cmd += ["--run", run, "--steps", str(STEPS), "--every", str(EVERY), *args]
        for rank in range(world):
            log = open(out / f"{run}.rank{rank}.log", "wb")  # noqa: SIM115
            group = 0 if rank == 0 else self.procs[0].pid
            p = prefork.Popen(  # forked from an interpreter that imported torch and plitzer (tests/prefork.py)
                cmd, env={**env, "RANK": str(rank)}, stdout=log, stderr=subprocess.STDOUT, process_group=group
            )
            log.close()
            self.procs.append(p)
        self.pgid = self.procs[0].pid

    def logs(self) -> str:
        paths = sorted(self.out.glob(f"{self.run}.rank*.log"))
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in paths)

    def progress(self) -> list[list[str]]:
        path = self.out / f"progress.{self.run}.log"
        if not path.exists():
            return []
        lines = path.read_text().split("\n")
        return [ln.split() for ln in lines[:-1]]  # the last piece may be a partial line

    def wait_for(self, what: str, ready: Callable[[], bool], timeout: float = 60) -> None:
        end = time.monotonic() + timeout
        while not ready():
            if any(p.poll() not in (None, 0) for p in self.procs):
                self.kill()
                pytest.fail(f"{self.run}: a worker failed while waiting for {what}\n{self.logs()}")
            if time.monotonic() > end:
                self.kill()
                pytest.fail(f"{self.run}: timed out waiting for {what}\n{self.logs()}")
            time.sleep(0.01)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pgid, signal.SIGKILL)
        for p in self.procs:
            p.wait(timeout=30)

    def finish(self, timeout: float = 60) -> None:
        try:
            for p in self.procs:
                p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"{self.run}: timed out\n{self.logs()}")
        codes = [p.returncode for p in self.procs]
        if any(codes):
            pytest.fail(f"{self.run}: exit codes {codes}\n{self.logs()}")

    def last_step(self) -> int:
        steps = [int(x[1]) for x in self.progress() if x[0] == "step"]
        return steps[-1] if steps else -1

    def done_hash(self) -> bytes:
        done = [x[1] for x in self.progress() if x[0] == "done"]
        assert done, self.logs()
        return bytes.fromhex(done[-1])

    def step_hashes(self) -> dict[int, bytes]:
        return {int(x[1]): bytes.fromhex(x[2]) for x in self.progress() if x[0] == "step"}


def _check_prefix(job: Job, reference: list[bytes], upto: int) -> None:
    """The killed run's stream matched the uninterrupted one up to the checkpoint."""
    got = job.step_hashes()
    for t in range(upto):
        assert got[t] == reference[t], f"step {t} of the killed run differs"


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("world_a", "world_b", "mode"), [(4, 2, "state"), (2, 3, "prefetch")])
def test_kill_and_resume_on_another_world(
    data: Path, reference: list[bytes], tmp_path: Path, world_a: int, world_b: int, mode: str
) -> None:
    seed = _seed()
    rng = random.Random(seed)
    kill_at = rng.randrange(EVERY + 1, STEPS - 10)
    extra = ["--prefetch"] if mode == "prefetch" else []
    a = Job(world_a, data, tmp_path, "a", "--pace", "0.02", "--wait-at-end", *extra)
    a.wait_for(f"step {kill_at}", lambda: a.last_step() >= kill_at)
    a.kill()
    killed_after = a.last_step()
    ckpt = plitzer.load_checkpoint(tmp_path / "data.ckpt")
    k = plitzer.state.checkpoint.decode(ckpt).step
    why = f"seed={seed} kill_at={kill_at} killed after step {killed_after}, checkpoint at step {k}"
    assert k > 0 and k % EVERY == 0 and k <= killed_after + 1, why
    _check_prefix(a, reference, k)

    b = Job(world_b, data, tmp_path, "b", "--resume", *extra)
    b.finish()
    start = next(x for x in b.progress() if x[0] == "start")
    assert int(start[1]) == k, why
    assert bytes.fromhex(start[2]) == reference[k - 1], why
    assert b.step_hashes()[k] == reference[k], why
    assert b.done_hash() == reference[-1], why


@pytest.mark.timeout(120)
def test_kill_during_checkpoint_write_keeps_the_previous_one(
    data: Path, reference: list[bytes], tmp_path: Path
) -> None:
    seed = _seed()
    rng = random.Random(seed)
    hang = EVERY * rng.randrange(2, (STEPS - 10) // EVERY)
    a = Job(2, data, tmp_path, "a", "--hang-in-save", str(hang), "--wait-at-end")
    a.wait_for("rank 0 to stop inside save_checkpoint", (tmp_path / "hanging").exists)
    a.kill()
    why = f"seed={seed}, killed inside the write of step {hang}'s checkpoint"
    temps = list(tmp_path.glob(".data.ckpt.*.tmp"))
    assert len(temps) == 1, why  # the half-written new checkpoint
    with pytest.raises(plitzer.CheckpointError):
        plitzer.state.checkpoint.decode(temps[0].read_bytes())
    prev = plitzer.load_checkpoint(tmp_path / "data.ckpt")  # still whole
    assert plitzer.state.checkpoint.decode(prev).step == hang - EVERY, why
    _check_prefix(a, reference, hang)

    b = Job(1, data, tmp_path, "b", "--resume")
    b.finish()
    assert b.step_hashes()[hang - EVERY] == reference[hang - EVERY], why
    assert b.done_hash() == reference[-1], why


@pytest.mark.timeout(120)
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_distributed_checkpoint_of_model_and_data(data: Path, reference: list[bytes], tmp_path: Path) -> None:
    """torch.distributed.checkpoint saves the Dataset (Stateful) with the model; another layout loads it.

    Saved by 2 processes that both hold every lane (one data rank), loaded by 4
    processes in 2 data ranks of 2 replicas each (as under tensor parallelism):
    state_dict() keeps one part per data rank.
    """
    k = 37
    a = Job(2, data, tmp_path, "a", "--dcp-save", str(k), "--data-world", "1")
    a.finish()
    assert (tmp_path / "dcp" / ".metadata").exists()
    b = Job(4, data, tmp_path, "b", "--dcp-load", "--data-world", "2")
    b.finish()
    start = next(x for x in b.progress() if x[0] == "start")
    assert int(start[1]) == k
    assert bytes.fromhex(start[2]) == reference[k - 1]
    assert b.done_hash() == reference[-1]
