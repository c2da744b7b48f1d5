"""One rank of ``litgpt pretrain`` fed by plitzer: ``litgpt_worker.py OUT KILL_AFTER LITGPT_ARGS...``.

The run is litgpt's own command line (its YAML config names ``plitzer.integrations.litgpt.Plitzer``
by ``class_path``). Every training step's rows of this rank are recorded in OUT
(tests/trainers/harness.py); the losses are litgpt's CSV log. With KILL_AFTER > 0 the process
SIGKILLs itself right after the checkpoint of that optimizer step is written. Several devices
train with DDP here (litgpt's FSDP strategy needs GPUs).
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import litgpt.pretrain
from lightning.fabric.strategies import DDPStrategy
from litgpt.__main__ import main as litgpt_main

import plitzer.integrations.litgpt as lit
from tests.trainers.harness import record_rows


class CpuDDP:
    """DDP over gloo where litgpt asks for FSDP (which Lightning runs on GPUs only).

    A class whose instances are DDPStrategy's, so that litgpt's ``isinstance(strategy,
    FSDPStrategy)`` stays False and it initialises the weights itself, as on one device.
    """

    def __new__(cls, **kwargs: Any) -> DDPStrategy:  # type: ignore[misc]
        return DDPStrategy(process_group_backend="gloo")


def main() -> None:
    out, kill_after, args = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]

    def recorded(self: lit.PlitzerDataLoader, batch: Any) -> Any:
        rows = lit.rows_of(batch)
        if not self.restart:  # the training loader's
            record_rows(out, batch.step, self.plitzer.rank, rows=rows, labels=batch.labels)
        return rows

    lit.PlitzerDataLoader.rows = recorded  # type: ignore[method-assign]

    save = litgpt.pretrain.save_checkpoint

    def saved(fabric: Any, state: dict[str, Any], tokenizer_dir: Any, checkpoint_file: Path) -> None:
        save(fabric, state, tokenizer_dir, checkpoint_file)
        if state["step_count"] == kill_after:
            fabric.barrier()
            os.kill(os.getpid(), signal.SIGKILL)

    litgpt.pretrain.save_checkpoint = saved
    # litgpt pretrains on several devices with FSDP, which Lightning runs on GPUs only: DDP on this CPU test
    litgpt.pretrain.FSDPStrategy = CpuDDP
    sys.argv = ["litgpt", *args]
    litgpt_main()


if __name__ == "__main__":
    main()
