"""torchtitan trains on plitzer's data (CPU, gloo): kill a 2-rank run after its checkpoint, resume on 1 rank.

The first test's data is a mixture of two sources whose token ids say their source, steered
every 2 steps (``--dataloader.steer 2``); plitzer's figures logged through torchtitan's
metrics processor are checked against each step's rows, and the steering against a loader
steered in this process by the per-source losses the run logged.

The runs use torchtitan's own command line (``--module tests.trainers.titan_configs --config
tiny``: its llama3 debug model, 2 layers, fed by ``plitzer.integrations.torchtitan``), data
parallel by replication (DDP: torch 2.13's FSDP2 reduces gradients with PREMUL_SUM, which
gloo lacks). Skipped where torchtitan is not installed (.ci/run installs it in a venv of its own).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torchtitan")

import plitzer.mixing
import plitzer.synth
from plitzer.tools.mixfile import read_mixture
from tests.trainers.harness import (
    VOCAB,
    global_rows,
    log_of,
    logged,
    losses,
    run_ranks,
    source_of_tokens,
    write_data,
    write_mixture,
)

pytestmark = pytest.mark.trainers

STEPS, KILL = 6, 3
LOSS_RTOL = 1e-3
"""Losses after the resume against the uninterrupted run's: the first steps ran on 2 ranks there
(gradients all-reduced in another order), so the weights differ in their last bits (measured: 1e-5)."""


def _args(data: list[str], out: Path, world: int) -> list[str]:
    val = out.parent / "val"
    return [
        "--module", "tests.trainers.titan_configs", "--config", "tiny", *data, "--dataloader.window", "2",
        "--training.local_batch_size", str(4 // world), "--training.seq_len", "64",
        "--training.steps", str(STEPS), "--dump_folder", str(out), "--debug.seed", "0",
        "--metrics.log_freq", "1", "--parallelism.spmd_backend", "partial_dtensor",
        "--parallelism.data_parallel_replicate_degree", str(world), "--parallelism.data_parallel_shard_degree", "1",
        "--checkpoint.enable", "--checkpoint.interval", str(KILL), "--checkpoint.folder", "ckpt",
        "--validator.enable", "--validator.freq", "3", "--validator.steps", "2",
        "--validator.dataloader.source", str(val),
    ]  # fmt: skip


def _check_figures(figures: dict[str, float], rows: dict[str, np.ndarray], loss: float) -> None:
    """A step's logged figures against its global rows (concat: every token real) and torchtitan's loss."""
    source, targets = source_of_tokens(rows["tokens"]), rows["labels"] != -100
    for s, name in enumerate("ab"):
        assert figures[f"plitzer/tokens/{name}"] == (source == s).sum()
        assert figures[f"plitzer/targets/{name}"] == (targets & (source == s)).sum()
    assert figures["plitzer/padding"] == 0 and figures["plitzer/wait_s"] >= 0
    # the per-source losses' mean, weighted by their targets, is torchtitan's loss of the step
    mean = sum(figures[f"plitzer/loss/{n}"] * figures[f"plitzer/targets/{n}"] for n in "ab") / targets.sum()
    assert mean == pytest.approx(loss, rel=1e-5)


def _check_steering(mixture: Path, out: Path, rows: dict[int, dict[str, np.ndarray]]) -> None:
    """The run's rows and stages are those of a loader steered here by the per-source losses the run logged.

    Each step's losses are observed after its batch and before the next, as the adapter does;
    the run was killed after step 3 and resumed from its checkpoint (on another data-parallel
    degree), so this holds only if the steering controller's state resumed exactly.
    """
    stages = json.loads((out / "stages.json").read_text())
    assert len(stages) > 1, stages  # steering set stages
    figures = logged(out)
    sources, weights = read_mixture(str(mixture))
    with plitzer.Loader(sources, weights=weights, lanes=4, seq_len=64, window=2, labels=True) as ld:
        mixer = plitzer.mixing.Online(ld, every=2)
        for step in range(STEPS):
            batch = ld.next_batch()
            np.testing.assert_array_equal(batch.tokens.astype(np.int64), rows[step]["tokens"], err_msg=str(step))
            np.testing.assert_array_equal(batch.labels, rows[step]["labels"], err_msg=str(step))
            mixer.observe(step, {n: figures[step + 1].get(f"plitzer/loss/{n}", math.nan) for n in "ab"})
        assert [[start, w] for start, w in ld.stages] == stages


def test_kill_on_two_ranks_resume_on_one(tmp_path: Path) -> None:
    mixture = write_mixture(tmp_path / "data")
    data = ["--dataloader.mixture", str(mixture), "--dataloader.steer", "2"]
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
    # plitzer's labels: each token's next one in its document; rows stay 64 tokens. At a piece's
    # end (the next position a document's start) the label is -100, or the document's next token
    # where a lane cut left it in another row (SPEC section 16: a piece cut from a long document's
    # middle, shuffled within its lane's slice): those are compared with plitzer's own loader's
    # (_check_steering), not here.
    for rows in want.values():
        tokens, positions, labels = rows["tokens"], rows["positions"], rows["labels"]
        assert tokens.shape == labels.shape == (4, 64)
        inner = positions[:, 1:] != 0
        np.testing.assert_array_equal(labels[:, :-1][inner], tokens[:, 1:][inner])
    assert "validate step:  3" in log_of(full, "titan_worker.py")  # the validator read the plitzer validation loader
    loss_full, loss_cut = losses(full), losses(cut)
    assert sorted(loss_cut) == sorted(loss_full) == list(range(1, STEPS + 1))
    for step in range(1, STEPS + 1):
        assert loss_cut[step] == pytest.approx(loss_full[step], rel=LOSS_RTOL), step
    for out, rows, loss in ((full, want, loss_full), (cut, got, loss_cut)):
        figures = logged(out)
        assert sorted(figures) == list(range(1, STEPS + 1))
        for step in range(STEPS):  # torchtitan's step s trains plitzer's step s - 1
            _check_figures(figures[step + 1], rows[step], loss[step + 1])
    _check_steering(mixture, cut, got)


def test_tensor_parallel_2_reads_once_a_replica_and_resumes(tmp_path: Path) -> None:
    """TP 2 (one data-parallel rank) with ``--dataloader.replicas --dataloader.balance``: rank 0 reads, rank 1 receives.

    Both train the same rows (those of a one-process run); killed after the step-3 checkpoint
    and resumed at TP 2, the run continues the same global batches.
    """
    data = write_data(tmp_path / "data")
    plitzer.synth.write(tmp_path / "val", 20_000, seed=8, mean_length=60, vocab=VOCAB, docs_per_row_group=100)
    cut = tmp_path / "cut"
    # A one-process run's rows are plitzer's own (the first test checks the adapter gives them): the loader's.
    with plitzer.Loader(data, lanes=4, seq_len=64, window=2, labels=True, packing="best-fit") as ld:
        batches = [ld.next_batch() for _ in range(STEPS)]
        want: dict[int, dict[str, Any]] = {
            b.step: {"tokens": b.tokens.astype(np.int64), "positions": b.position_ids.astype(np.int64)} for b in batches
        }
        for b in batches:
            want[b.step] |= {"labels": np.asarray(b.labels), "padding": int((np.asarray(b.source_ids) < 0).sum())}
    tp = [
        *_args(["--dataloader.source", str(data)], cut, 1), "--parallelism.tensor_parallel_degree", "2",
        "--dataloader.replicas", "--dataloader.balance", "--dataloader.packing", "best-fit",
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
    # rank 0 (the replica's reader) logs the figures of its rows: no per-source loss under tensor parallel
    figures = logged(cut)
    for step in range(STEPS):
        labels, padding = want[step]["labels"], want[step]["padding"]
        assert figures[step + 1]["plitzer/padding"] == padding
        assert figures[step + 1]["plitzer/tokens/data"] == labels.size - padding
        assert figures[step + 1]["plitzer/targets/data"] == (labels != -100).sum()
        assert not any(k.startswith("plitzer/loss/") for k in figures[step + 1])
    assert sum(want[step]["padding"] for step in range(STEPS)) > 0  # best-fit padded some rows
