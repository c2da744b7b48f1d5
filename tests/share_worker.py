"""One rank of tests/test_job_share.py (run as a script, one per rank, each its own PLITZER_CACHE).

Joins a gloo process group (TCP store on 127.0.0.1), opens ``plitzer.torch.Dataset``
over the S3 source (the job's ranks share one listing and the footers), takes
``--steps`` batches and saves this rank's rows and lanes to ``rank<r>.npz``.
"""

from __future__ import annotations

import argparse
import json
import os
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch.distributed as dist

import plitzer.torch

SETTINGS = {"seed": 5, "lanes": 8, "window": 2, "seq_len": 64}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--source", required=True, help="a path or URL, or a mixture as JSON")
    p.add_argument("--options", required=True, help="storage_options as JSON")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--port", required=True, type=int)
    p.add_argument("--steps", type=int, default=3)
    a = p.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{a.port}", rank=rank, world_size=world, timeout=timedelta(seconds=90)
    )
    try:
        source = json.loads(a.source) if a.source.startswith("{") else a.source  # a dict: a mixture
        ds = plitzer.torch.Dataset(source, storage_options=json.loads(a.options), threads=2, **SETTINGS)
        it = iter(ds)
        batches = [next(it) for _ in range(a.steps)]
        lanes = batches[0].lanes
        tokens = np.stack([b.tokens.numpy() for b in batches])
        np.savez(a.out / f"rank{rank}.npz", tokens=tokens, lanes=np.array([lanes.start, lanes.stop]))
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
