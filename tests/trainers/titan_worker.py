"""One rank of a torchtitan run fed by plitzer: ``titan_worker.py OUT KILL_AFTER TORCHTITAN_ARGS...``.

The config comes from torchtitan's own command line (``--module plitzer.integrations.torchtitan
--config ...``). Every step's rows of this data-parallel rank and rank 0's loss are recorded
in OUT (tests/trainers/harness.py), with the plitzer figures rank 0's metrics processor
logs and, at the end, the mixture's stages; with KILL_AFTER > 0 the process SIGKILLs itself right after
the checkpoint of that step is written (no clean-up, as a crashed job).
"""
# ruff: noqa: E402

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import torch

from plitzer.integrations.torchtitan_cpu import use_cpu

# torchtitan trains on accelerators: told "cpu" before any of its modules reads the device,
# as the laptop launcher does (plitzer.integrations.torchtitan_cpu.use_cpu).
use_cpu()

import torchtitan.distributed.utils
from torchtitan.components.metrics import MetricsProcessor
from torchtitan.config import ConfigManager
from torchtitan.tools.logging import init_logger

import plitzer.integrations.torchtitan as titan
from tests.trainers.harness import record_loss, record_metrics, record_rows

if not hasattr(torch.distributed, "set_timeout"):
    # torchtitan 0.3.0 shortens the process groups' timeouts after the first step with
    # torch.distributed.set_timeout, which torch 2.13 lacks (a newer torch's): keep them.
    torchtitan.distributed.utils.set_pg_timeouts = lambda timeout, parallel_dims: None


def _replica(ds: object) -> list[int]:
    """The global ranks of this process's replica (itself alone without replicas=)."""
    link = getattr(ds.loader, "link", None)  # type: ignore[attr-defined]
    if link is None:
        return [int(os.environ.get("RANK", "0"))]
    return [int(r) for r in torch.distributed.get_process_group_ranks(link.group)]


def main() -> None:
    out, kill_after, args = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
    init_logger()
    config = ConfigManager().parse_args(args)

    iterate = titan.PlitzerDataLoader.__iter__

    def recorded(self: titan.PlitzerDataLoader):  # type: ignore[no-untyped-def]
        for inputs, labels in iterate(self):
            ds = self.dataset
            if self is not trainer.dataloader:  # the validator's loader
                yield inputs, labels
                continue
            rows = {"tokens": inputs["input"], "positions": inputs["positions"], "labels": labels}
            # Each process's rows too (out/p<RANK>): the ranks of a model-parallel group train the same rows.
            mine = out / f"p{os.environ.get('RANK', '0')}"
            mine.mkdir(exist_ok=True)
            (mine / "reads.txt").write_text(type(ds.loader).__name__)
            record_rows(mine, ds.step - 1, ds.rank, **rows)
            if int(os.environ.get("RANK", "0")) == min(_replica(ds)):
                record_rows(out, ds.step - 1, ds.rank, **rows)
            yield inputs, labels

    titan.PlitzerDataLoader.__iter__ = recorded  # type: ignore[method-assign]

    log = MetricsProcessor.log

    def logged(self, step, global_avg_loss, *a, extra_metrics=None, **k):  # type: ignore[no-untyped-def]
        if int(os.environ.get("RANK", "0")) == 0:
            record_loss(out, step, global_avg_loss)
            record_metrics(out, step, extra_metrics or {})
        return log(self, step, global_avg_loss, *a, extra_metrics=extra_metrics, **k)

    MetricsProcessor.log = logged  # type: ignore[method-assign]

    trainer = config.build()
    save = trainer.checkpointer.save

    def saved(curr_step: int, last_step: bool = False) -> bool:
        done = save(curr_step, last_step)
        if curr_step == kill_after:
            os.kill(os.getpid(), signal.SIGKILL)
        return done

    trainer.checkpointer.save = saved  # type: ignore[method-assign]
    trainer.train()
    stages = getattr(trainer.dataloader.dataset.loader, "stages", None)
    if stages is not None and int(os.environ.get("RANK", "0")) == 0:  # the mixture's stages, steered ones too
        (out / "stages.json").write_text(json.dumps(stages))
    trainer.close()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
