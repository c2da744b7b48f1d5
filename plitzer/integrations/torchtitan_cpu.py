"""torchtitan on a machine without an accelerator: try plitzer's torchtitan loader on a laptop.

``python -m plitzer.integrations.torchtitan_cpu TORCHTITAN_ARGS...`` (or under ``torchrun``
for several processes, gloo) runs torchtitan's own trainer, with its own command line, on CPU:

    python -m plitzer.integrations.torchtitan_cpu --module plitzer.integrations.torchtitan \\
        --config llama3_debugmodel --dataloader.source data/sample --training.steps 10

torchtitan trains on accelerators, and three things stand between it and a CPU, which this
module does and nothing else (docs/trainers/torchtitan.md, "Try it on a laptop"):

- **The device.** torchtitan takes ``"cuda"`` where torch finds no accelerator, when its
  modules are imported. Before any is, torch is told ``"cpu"``, and the few memory queries
  that ``torch.cpu`` lacks (torchtitan's memory monitor's) answer with nothing.
- **Attention.** FlexAttention's backward does not run on CPU, so every FlexAttention of the
  model becomes SDPA's causal attention: plitzer's positions then drive RoPE only (the
  block-causal masks need an accelerator).
- **Parallelism.** Where the command line names none, data parallel is plain replication
  over the processes (``--parallelism.data_parallel_replicate_degree`` = the world size,
  shard degree 1) with ``--parallelism.spmd_backend partial_dtensor`` (gloo has no
  reduce-scatter for FSDP).

It is for trying things out, not for training: on a machine with an accelerator, run
``torchtitan.train`` itself.
"""

from __future__ import annotations

import os
import socket
import sys
import types
from collections.abc import Sequence

import torch
import torch._utils

__all__ = ["cpu_args", "main", "use_cpu"]


def use_cpu() -> None:
    """Make torch report ``cpu`` as the device torchtitan runs on (call before importing torchtitan)."""
    cpu = types.SimpleNamespace(**{k: getattr(torch.cpu, k) for k in dir(torch.cpu) if not k.startswith("_")})
    cpu.get_device_name = lambda device=None: "cpu"
    cpu.get_device_properties = lambda device=None: types.SimpleNamespace(total_memory=1 << 30, name="cpu")
    cpu.memory_stats = lambda device=None: {}
    cpu.current_device = lambda: 0
    cpu.reset_peak_memory_stats = cpu.empty_cache = lambda device=None: None
    torch._utils._get_available_device_type = lambda: "cpu"
    torch._utils._get_device_module = lambda device_type=None: cpu  # type: ignore[assignment]


def cpu_args(args: Sequence[str], world: int) -> list[str]:
    """``args`` with the parallelism a CPU run takes, where they name none (module docstring).

    >>> cpu_args(["--training.steps", "10", "--parallelism.spmd-backend=spmd_types"], 2)[3:]
    ['--parallelism.data_parallel_replicate_degree', '2', '--parallelism.data_parallel_shard_degree', '1']
    """
    out = list(args)
    given = {"--" + a[2:].split("=")[0].replace("-", "_") for a in out if a.startswith("--")}
    defaults = {
        "--parallelism.spmd_backend": "partial_dtensor",
        "--parallelism.data_parallel_replicate_degree": str(world),
        "--parallelism.data_parallel_shard_degree": "1",
    }
    for flag, value in defaults.items():
        if flag not in given:
            out += [flag, value]
    return out


def main(argv: Sequence[str] | None = None) -> None:
    """torchtitan's trainer on CPU with ``argv`` (default: the command line), as ``torchtitan.train`` runs it."""
    use_cpu()
    import torchtitan.distributed.utils
    from torchtitan.config import ConfigManager
    from torchtitan.models.common.attention import FlexAttention, ScaledDotProductAttention
    from torchtitan.tools.logging import init_logger

    if not hasattr(torch.distributed, "set_timeout"):
        # torchtitan 0.3 shortens the process groups' timeouts after the first step with
        # torch.distributed.set_timeout, which older torch lacks: keep them.
        torchtitan.distributed.utils.set_pg_timeouts = lambda timeout, parallel_dims: None

    init_logger()
    if "LOCAL_RANK" not in os.environ:  # one process without torchrun: torchtitan asks for its variables
        port = socket.socket()
        port.bind(("127.0.0.1", 0))
        free = str(port.getsockname()[1])
        port.close()
        for k, v in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}.items():
            os.environ.setdefault(k, v)
        os.environ.setdefault("MASTER_PORT", free)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    config = ConfigManager().parse_args(cpu_args(sys.argv[1:] if argv is None else argv, world))
    for _, _, parent, attr in config.model_spec.model.traverse(FlexAttention.Config):
        setattr(parent, attr, ScaledDotProductAttention.Config())
    trainer = config.build()
    try:
        trainer.train()
    finally:
        trainer.close()
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
