"""litgpt pretrains on plitzer's data (CPU, gloo): kill a 2-device run after its checkpoint, resume on 1 device.

The 2-device leg has ``balance: true`` (SPEC section 18): its rows are dealt by cost over the two.

``litgpt pretrain`` runs from its own command line with a YAML config whose data is
``class_path: plitzer.integrations.litgpt.Plitzer`` (tests/trainers/litgpt_worker.py), a
2-layer model of 64 channels, 4 sequences of 64 tokens a step. Several devices train with DDP
(litgpt's FSDP needs GPUs). Skipped where litgpt is not installed.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("litgpt")

import plitzer.synth
from tests.trainers.harness import VOCAB, global_rows, log_of, run_ranks, write_data

pytestmark = pytest.mark.trainers

STEPS, KILL, SEQ = 6, 3, 64
LOSS_RTOL = 1e-3
"""Losses after the resume against the uninterrupted run's (the first steps ran on 2 devices there; measured: 1e-5)."""

CONFIG = """
model_name: pythia-14m
model_config: {name: tiny, block_size: 64, vocab_size: 1000, padded_vocab_size: 1024, n_layer: 2, n_head: 4,
  n_embd: 64, rotary_percentage: 1.0, parallel_residual: false, bias: false, norm_class_name: RMSNorm,
  mlp_class_name: LLaMAMLP, intermediate_size: 128}
precision: 32-true
data:
  class_path: plitzer.integrations.litgpt.Plitzer
  init_args: {source: DATA, val_source: VAL, window: 2}
train: {save_interval: 3, log_interval: 1, global_batch_size: 4, micro_batch_size: 4, max_tokens: 1536,
  max_seq_length: 64, lr_warmup_steps: 0, max_norm: 1.0, min_lr: 0.0001}
eval: {interval: 2, max_iters: 2, initial_validation: true, final_validation: false}
optimizer: {class_path: torch.optim.AdamW, init_args: {lr: 0.001}}
logger_name: csv
seed: 0
"""


def _losses(run: Path) -> dict[int, float]:
    out: dict[int, float] = {}
    for path in sorted(run.glob("logs/csv/version_*/metrics.csv")):
        with open(path) as f:
            for row in csv.DictReader(f):
                if row.get("loss"):
                    out[int(row["iter"])] = float(row["loss"])
    return out


def _run(config: Path, out: Path, world: int, kill: int, *more: str) -> int:
    args = ["pretrain", "--config", str(config), "--out_dir", str(out / "run"), "--devices", str(world)]
    return run_ranks(
        "litgpt_worker.py", world, [str(kill), *args, "--train.micro_batch_size", str(4 // world), *more], out
    )


def _by_row(rows: np.ndarray) -> np.ndarray:
    """A step's rows in one order whatever rank trained which (balance deals them by cost)."""
    return rows[np.lexsort(rows.T[::-1])]


def test_kill_on_two_devices_resume_on_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The 2-device leg deals its steps by cost (``balance: true``): the same global batch, other ranks' rows."""
    monkeypatch.setenv("TORCH_COMPILE_DISABLE", "1")  # litgpt compiles the model: minutes of C++ on a CPU
    data, val = write_data(tmp_path / "data"), tmp_path / "val"
    plitzer.synth.write(val, 20_000, seed=8, mean_length=60, vocab=VOCAB, docs_per_row_group=100)
    config, balanced = tmp_path / "pretrain.yaml", tmp_path / "balanced.yaml"
    config.write_text(CONFIG.replace("DATA", str(data)).replace("VAL", str(val)))
    balanced.write_text(config.read_text().replace("window: 2}", "window: 2, balance: true}"))
    full, cut, worker = tmp_path / "full", tmp_path / "cut", "litgpt_worker.py"
    assert _run(config, full, 1, 0) == 0, log_of(full, worker)
    assert _run(balanced, cut, 2, KILL) != 0  # SIGKILLed after its step-3 checkpoint
    assert (cut / "run" / f"step-{KILL:08d}" / "lit_model.pth").is_file(), log_of(cut, worker)
    assert _run(config, cut, 1, 0, "--resume", "true") == 0, log_of(cut, worker)

    want, got = global_rows(full), global_rows(cut)
    # litgpt's loop takes one batch past its last step before it stops: the steps trained are all there
    assert set(range(STEPS)) <= set(want) and set(range(STEPS)) <= set(got)
    # the deal moved rows: some step's ranks held other rows than section 4's blocks
    assert any(not np.array_equal(got[s]["rows"], want[s]["rows"]) for s in range(KILL))
    for step in range(STEPS):
        mine, theirs = got[step]["rows"], want[step]["rows"]
        if step < KILL:  # dealt over 2 devices: the same rows, another order
            mine, theirs = _by_row(mine), _by_row(theirs)
        np.testing.assert_array_equal(mine, theirs, err_msg=f"step {step}")
    for rows in want.values():
        batch, labels = rows["rows"], rows["labels"]
        assert batch.dtype == np.int64 and batch.shape == (4, SEQ + 1) and labels.shape == (4, SEQ)
        np.testing.assert_array_equal(batch[:, SEQ], labels[:, -1])  # the extra column: each row's last label
    loss_full, loss_cut = _losses(full / "run"), _losses(cut / "run")
    assert sorted(loss_full) == list(range(1, STEPS + 1))
    for step in range(KILL + 1, STEPS + 1):
        assert loss_cut[step] == pytest.approx(loss_full[step], rel=LOSS_RTOL), step
    assert "val loss" in log_of(full, worker)  # the validation loader ran (initial and every 2 steps)


def test_padding_never_becomes_a_target(tmp_path: Path) -> None:
    """litgpt cannot mask a target: best-fit is refused, naming the fix; a validation pass's padded rows left out."""
    from planner.errors import ConfigError
    from plitzer.integrations.litgpt import Plitzer

    data = tmp_path / "data"
    plitzer.synth.write(data, 3_000, seed=8, mean_length=60, vocab=VOCAB, docs_per_row_group=20)
    module = Plitzer(source=str(data), val_source=str(data), window=2, packing="best-fit")
    module.connect(batch_size=4, max_seq_length=SEQ)
    with pytest.raises(ConfigError, match="packing: concat"):
        module.train_dataloader()
    module = Plitzer(source=str(data), val_source=str(data), window=2, steer=10)
    module.connect(batch_size=4, max_seq_length=SEQ)
    with pytest.raises(ConfigError, match="loop of your own"):
        module.train_dataloader()
    module = Plitzer(source=str(data), val_source=str(data), window=2)
    module.connect(batch_size=4, max_seq_length=SEQ)
    train = module.train_dataloader()
    rows = next(iter(train))
    got = train.metrics()  # this rank's figures since the loader began: the rows handed out
    assert got["plitzer/tokens/data"] == rows[:, :SEQ].numel() and got["plitzer/padding"] == 0
    val = module.val_dataloader()
    steps = list(val)
    assert steps and all(rows.shape[1] == SEQ + 1 for rows in steps)
    assert sum(len(rows) for rows in steps) < 4 * len(val)  # the last, padded step's partial rows are left out
    assert [len(rows) for rows in steps][:-1] == [4] * (len(steps) - 1)
    assert next(iter(val)).equal(steps[0])  # every pass from the first step
