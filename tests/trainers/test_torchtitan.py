"""torchtitan trains on plitzer's data (CPU, gloo): kill a 2-rank run after its checkpoint, resume on 1 rank.

The runs use torchtitan's own command line (``--module tests.trainers.titan_configs --config
tiny``: its llama3 debug model, 2 layers, fed by ``plitzer.integrations.torchtitan``), data
parallel by replication (DDP: torch 2.13's FSDP2 reduces gradients with PREMUL_SUM, which
gloo lacks). Skipped where torchtitan is not installed (.ci/run installs it in a venv of its own).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torchtitan")

import plitzer.synth
from tests.trainers.harness import VOCAB, global_rows, log_of, losses, run_ranks, write_data

pytestmark = pytest.mark.trainers

STEPS, KILL = 6, 3
LOSS_RTOL = 1e-3
"""Losses after the resume against the uninterrupted run's: the first steps ran on 2 ranks there
(gradients all-reduced in another order), so the weights differ in their last bits (measured: 1e-5)."""


def _args(data: Path, out: Path, world: int) -> list[str]:
    val = data.parent / "val"
    return [
        "--module", "tests.trainers.titan_configs", "--config", "tiny",
        "--dataloader.source", str(data), "--dataloader.window", "2",
        "--training.local_batch_size", str(4 // world), "--training.seq_len", "64",
        "--training.steps", str(STEPS), "--dump_folder", str(out), "--debug.seed", "0",
        "--metrics.log_freq", "1", "--parallelism.spmd_backend", "partial_dtensor",
        "--parallelism.data_parallel_replicate_degree", str(world), "--parallelism.data_parallel_shard_degree", "1",
        "--checkpoint.enable", "--checkpoint.interval", str(KILL), "--checkpoint.folder", "ckpt",
        "--validator.enable", "--validator.freq", "3", "--validator.steps", "2",
        "--validator.dataloader.source", str(val),
    ]  # fmt: skip


def test_kill_on_two_ranks_resume_on_one(tmp_path: Path) -> None:
    data = write_data(tmp_path / "data")
    plitzer.synth.write(tmp_path / "val", 20_000, seed=8, mean_length=60, vocab=VOCAB, docs_per_row_group=100)
    full, cut = tmp_path / "full", tmp_path / "cut"
    assert run_ranks("titan_worker.py", 1, ["0", *_args(data, full, 1)], full) == 0, log_of(full, "titan_worker.py")
    # killed (SIGKILL) right after its step-3 checkpoint: torchrun reports the failure
    assert run_ranks("titan_worker.py", 2, [str(KILL), *_args(data, cut, 2)], cut) != 0
    assert (cut / "ckpt" / f"step-{KILL}").is_dir(), log_of(cut, "titan_worker.py")
    assert sorted(global_rows(cut)) == list(range(KILL))
    assert run_ranks("titan_worker.py", 1, ["0", *_args(data, cut, 1)], cut) == 0, log_of(cut, "titan_worker.py")

    want, got = global_rows(full), global_rows(cut)
    assert sorted(want) == sorted(got) == list(range(STEPS))
    for step in range(STEPS):
        for name in ("tokens", "positions", "labels"):
            assert got[step][name].dtype == np.int64
            np.testing.assert_array_equal(got[step][name], want[step][name], err_msg=f"{name} of step {step}")
    # plitzer's labels: each token's next one in its document, -100 at a document's end; rows stay 64 tokens
    for rows in want.values():
        tokens, positions, labels = rows["tokens"], rows["positions"], rows["labels"]
        assert tokens.shape == labels.shape == (4, 64)
        inside = np.where(positions[:, 1:] == 0, -100, tokens[:, 1:])
        np.testing.assert_array_equal(labels[:, :-1], inside)
    assert "validate step:  3" in log_of(full, "titan_worker.py")  # the validator read the plitzer validation loader
    loss_full, loss_cut = losses(full), losses(cut)
    assert sorted(loss_cut) == sorted(loss_full) == list(range(1, STEPS + 1))
    for step in range(1, STEPS + 1):
        assert loss_cut[step] == pytest.approx(loss_full[step], rel=LOSS_RTOL), step


def test_tensor_parallel_2_reads_once_a_replica_and_resumes(tmp_path: Path) -> None:
    """TP 2 (one data-parallel rank) with ``--dataloader.replicas --dataloader.balance``: rank 0 reads, rank 1 receives.

    Both train the same rows (those of a one-process run); killed after the step-3 checkpoint
    and resumed at TP 2, the run continues the same global batches.
    """
    data = write_data(tmp_path / "data")
    plitzer.synth.write(tmp_path / "val", 20_000, seed=8, mean_length=60, vocab=VOCAB, docs_per_row_group=100)
    cut = tmp_path / "cut"
    # A one-process run's rows are plitzer's own (the first test checks the adapter gives them): the loader's.
    with plitzer.Loader(data, lanes=4, seq_len=64, window=2, labels=True) as ld:
        batches = [ld.next_batch() for _ in range(STEPS)]
        want = {
            b.step: {"tokens": b.tokens.astype(np.int64), "positions": b.position_ids.astype(np.int64)} for b in batches
        }
        for b in batches:
            want[b.step]["labels"] = np.asarray(b.labels)
    tp = [
        *_args(data, cut, 1), "--parallelism.tensor_parallel_degree", "2",
        "--dataloader.replicas", "--dataloader.balance",
    ]  # fmt: skip
    assert run_ranks("titan_worker.py", 2, [str(KILL), *tp], cut) != 0  # killed after its step-3 checkpoint
    assert (cut / "ckpt" / f"step-{KILL}").is_dir(), log_of(cut, "titan_worker.py")
    assert run_ranks("titan_worker.py", 2, ["0", *tp], cut) == 0, log_of(cut, "titan_worker.py")
    assert (cut / "p0" / "reads.txt").read_text() == "Reader" and (cut / "p1" / "reads.txt").read_text() == "Follower"
    got = global_rows(cut)
    assert sorted(got) == list(range(STEPS))
    each = [global_rows(cut / f"p{r}") for r in range(2)]
    for step in range(STEPS):
        for name in ("tokens", "positions", "labels"):
            np.testing.assert_array_equal(got[step][name], want[step][name], err_msg=f"{name} of step {step}")
            for rows in each:
                np.testing.assert_array_equal(rows[step][name], want[step][name], err_msg=f"{name} of step {step}")
