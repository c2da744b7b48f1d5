"""One rank of an OLMo-core run fed by plitzer: ``olmo_worker.py OUT KILL_AFTER DATA VAL STEPS [STEER]``.

A llama-like transformer of 2 layers (d_model 64), DDP over gloo where there are 2 ranks, a
global batch of 4 sequences of 64 tokens from ``PlitzerDataLoaderConfig`` (DATA: a source, or
a mixture file ``*.toml``; STEER: its ``steer``), plitzer's metrics callback, an evaluator on
VAL (``-``: none), a checkpoint every 3 steps into OUT/save (OLMo-core resumes from the latest
there). Every step's rows of this data-parallel rank, rank 0's loss, its ``plitzer/`` metrics
(OUT/metrics.jsonl) and, at the end, the loader's stages (OUT/stages.json) are recorded in OUT
(tests/trainers/harness.py); with KILL_AFTER > 0 the process SIGKILLs itself right after that
step (its checkpoint written and its metrics logged: the bookkeeping is synchronous here).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any, ClassVar

import torch
from olmo_core.distributed.parallel import DataParallelType
from olmo_core.nn.transformer import TransformerConfig
from olmo_core.optim import AdamWConfig
from olmo_core.train import Duration, TrainerConfig, prepare_training_environment, teardown_training_environment
from olmo_core.train.callbacks import Callback, CheckpointerCallback
from olmo_core.train.train_module import TransformerDataParallelConfig, TransformerTrainModuleConfig

import plitzer.integrations.olmo_core as olmo
from tests.trainers.harness import VOCAB, record_loss, record_rows

SEQ, LANES = 64, 4


class Record(Callback):
    """rank 0's loss and plitzer metrics of every step and stages at the end; a SIGKILL after step KILL_AFTER."""

    priority: ClassVar[int] = -100  # after the checkpointer

    def __init__(self, out: Path, kill_after: int) -> None:
        self.out, self.kill_after = out, kill_after

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        if int(os.environ.get("RANK", "0")) == 0 and "train/CE loss" in metrics:
            record_loss(self.out, step, metrics["train/CE loss"])
            mine = {k: v for k, v in metrics.items() if k.startswith("plitzer/") or k == "train/CE loss"}
            with open(self.out / "metrics.jsonl", "a") as f:
                f.write(json.dumps({"step": step, **mine}) + "\n")
        name = "eval/plitzer/plitzer/CE loss"  # eval/EVALUATOR/LABEL/CE loss: the evaluator and its label
        if int(os.environ.get("RANK", "0")) == 0 and name in metrics:
            with open(self.out / "eval.jsonl", "a") as f:
                f.write(f'{{"step": {step}, "loss": {metrics[name]}}}\n')

    def pre_load_batch(self) -> None:  # after step KILL_AFTER's checkpoint and metrics, before the next batch
        if self.kill_after and self.step == self.kill_after:
            os.kill(os.getpid(), signal.SIGKILL)

    def post_train(self) -> None:
        if int(os.environ.get("RANK", "0")) == 0:
            stages = self.trainer.data_loader.dataset.loader.stages  # type: ignore[attr-defined]
            (self.out / "stages.json").write_text(json.dumps(stages))


def main() -> None:
    out, kill_after, data, val, steps = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
    steer = int(sys.argv[6]) if len(sys.argv) > 6 else 0
    world = int(os.environ.get("WORLD_SIZE", "1"))
    prepare_training_environment(seed=0, backend="gloo" if world > 1 else None)

    iterate = olmo.PlitzerDataLoader._iter_batches

    def recorded(self: olmo.PlitzerDataLoader) -> Any:
        for batch in iterate(self):
            if "doc_lens" not in batch:  # the evaluator's loader
                yield batch
                continue
            ds = self.dataset
            docs = batch["doc_lens"]  # padded with 0 to the rank's most documents in a row: to SEQ here
            docs = torch.nn.functional.pad(docs, (0, SEQ - docs.shape[1]))
            record_rows(out, ds.step - 1, ds.rank, tokens=batch["input_ids"], labels=batch["labels"], docs=docs)
            # recorded, then dropped: OLMo-core's CPU attention (torch's SDPA) has no document masking
            del batch["doc_lens"], batch["max_doc_lens"]
            yield batch

    olmo.PlitzerDataLoader._iter_batches = recorded  # type: ignore[method-assign]
    mock = olmo.PlitzerDataLoader.get_mock_batch

    def mock_without_docs(self: olmo.PlitzerDataLoader) -> Any:
        batch = mock(self)
        assert batch["doc_lens"].sum() == batch["input_ids"].numel()
        del batch["doc_lens"], batch["max_doc_lens"]
        return batch

    olmo.PlitzerDataLoader.get_mock_batch = mock_without_docs  # type: ignore[method-assign]

    model = TransformerConfig.llama_like(d_model=64, vocab_size=VOCAB, n_layers=2, n_heads=4).build(init_device="cpu")
    train_module = TransformerTrainModuleConfig(
        rank_microbatch_size=LANES // world * SEQ,
        max_sequence_length=SEQ,
        optim=AdamWConfig(lr=1e-3),
        dp_config=TransformerDataParallelConfig(name=DataParallelType.ddp) if world > 1 else None,
    ).build(model)
    given = {"mixture": data} if data.endswith(".toml") else {"source": data}
    loader = olmo.PlitzerDataLoaderConfig(
        global_batch_size=LANES * SEQ, sequence_length=SEQ, window=2, generate_doc_lengths=True, steer=steer, **given
    )
    config = TrainerConfig(
        save_folder=str(out / "save"),
        max_duration=Duration.steps(steps),
        metrics_collect_interval=1,
        async_bookkeeping=False,  # each step's metrics logged before the next: the kill keeps them
    )
    config = (
        config.with_callback("checkpointer", CheckpointerCallback(save_interval=3, save_async=False))
        .with_callback("record", Record(out, kill_after))
        .with_callback("plitzer", olmo.PlitzerMetricsCallbackConfig())
    )
    if val != "-":
        evaluator = olmo.PlitzerEvaluatorCallbackConfig(source=val, eval_interval=3, log_interval=1)
        config = config.with_callback("lm_evaluator", evaluator)
    trainer = config.build(train_module, loader.build(dp_process_group=train_module.dp_process_group))
    trainer.fit()
    teardown_training_environment()


if __name__ == "__main__":
    main()
