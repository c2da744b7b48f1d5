"""One rank of tests/state/test_job_share.py (run as a script, one per rank, each its own PLITZER_CACHE).

Joins a gloo process group (TCP store on 127.0.0.1), opens the source (the job's ranks
share one listing and the footers), takes ``--steps`` batches and saves this rank's rows
and lanes to ``rank<r>.npz``. ``--mode``: ``dataset`` (``plitzer.torch.Dataset``),
``loader`` (a plain ``plitzer.Loader`` of this rank and world: it shares by itself), or
``text`` (a plain Loader over text with a counting tokenizer: the texts this rank
tokenized before its first batch are saved too).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch.distributed as dist

import plitzer
import plitzer.torch
from tests.net import join_gloo
from tests.share_fixtures import CharTokenizer

SETTINGS = {"seed": 5, "lanes": 8, "window": 2, "seq_len": 64}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--source", required=True, help="a path or URL, or a mixture as JSON")
    p.add_argument("--options", required=True, help="storage_options as JSON")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--port", required=True, type=int)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--mode", choices=["dataset", "loader", "text"], default="dataset")
    a = p.parse_args()
    rank, world = join_gloo(a.port, 90)
    try:
        source = json.loads(a.source) if a.source.startswith("{") else a.source  # a dict: a mixture
        opts = json.loads(a.options) or None
        texts = -1
        if a.mode == "dataset":
            ds = plitzer.torch.Dataset(source, storage_options=opts, threads=2, **SETTINGS)
            it = iter(ds)
            batches = [next(it) for _ in range(a.steps)]
            lanes = batches[0].lanes
            tokens = np.stack([b.tokens.numpy() for b in batches])
        else:
            kw = {"tokenizer": CharTokenizer()} if a.mode == "text" else {}
            with plitzer.Loader(
                source, rank=rank, world=world, storage_options=opts, threads=2, **kw, **SETTINGS
            ) as ld:
                if a.mode == "text":
                    texts = kw["tokenizer"].texts  # the counting pass's share of this rank
                got = [ld.next_batch() for _ in range(a.steps)]
                lanes = got[0].lanes
                tokens = np.stack([np.from_dlpack(b.tokens).copy() for b in got])
        np.savez(a.out / f"rank{rank}.npz", tokens=tokens, lanes=np.array([lanes[0], lanes[-1] + 1]), texts=texts)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
