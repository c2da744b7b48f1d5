"""Loopback helpers the tests share."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for a server or a rendezvous a test starts)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def gloo_env(world: int) -> dict[str, str]:
    """The environment of a gloo rank process on this machine (add ``RANK``): loopback only, one thread each."""
    root = Path(__file__).resolve().parents[1]
    env = {
        **os.environ,
        "WORLD_SIZE": str(world),
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
        "PYTHONWARNINGS": "ignore",
    }
    if sys.platform.startswith("linux"):
        env["GLOO_SOCKET_IFNAME"] = "lo"
    return env


def join_gloo(port: int | str, timeout_s: float = 60) -> tuple[int, int]:
    """Join the gloo group at ``tcp://127.0.0.1:port`` as ``RANK`` of ``WORLD_SIZE`` (a worker's set-up); both."""
    from datetime import timedelta

    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group(
        "gloo", init_method=f"tcp://{HOST}:{port}", rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s)
    )
    return rank, world


def gloo_job(worker: str, args: list[str], out: Path, tag: str, world: int = 2, timeout: float = 120) -> list[Any]:
    """Run ``tests/<worker>`` as ``world`` gloo ranks (``args`` then ``--port P --out OUT/TAG.RANK.json``); their JSON.

    The processes start from tests/prefork.py's zygote; each must end with status 0 (else the
    assertion shows the ends of their stderr).
    """
    import json
    import subprocess

    from tests import prefork

    env, port = gloo_env(world), free_port()
    script = Path(__file__).resolve().parent / worker
    procs = []
    for rank in range(world):
        cmd = [sys.executable, str(script), *args, "--port", str(port), "--out", str(out / f"{tag}.{rank}.json")]
        procs.append(prefork.Popen(cmd, env={**env, "RANK": str(rank)}, stderr=subprocess.PIPE))
    try:
        errs = [p.communicate(timeout=timeout)[1].decode(errors="replace") for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0] * world, "\n".join(e[-3000:] for e in errs)
    return [json.loads((out / f"{tag}.{rank}.json").read_text()) for rank in range(world)]
