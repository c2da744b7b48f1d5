"""One rank of tests/state/test_replicas.py (run as a script): a data-parallel x model-parallel mesh over gloo.

It joins a gloo group (TCP store on 127.0.0.1), makes a ``DeviceMesh`` of ``--dp`` x ``--tp``
(dimensions ``dp`` and ``tp``) and reads through ``plitzer.torch.Dataset(mesh=mesh, dp="dp")``:
each tensor-parallel group's rank 0 reads and sends its steps to the others (SPEC section 19).
Its own cache folder (so footers are its own requests), and, with ``--endpoints``, its own S3
endpoint (a counting proxy a rank, so the test sees each process's requests). It writes, per
step, what its batch holds, and the collective ``state_dict()`` after ``--state-at`` steps.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from pathlib import Path

from tests.net import join_gloo

SETTINGS = {"seed": 5, "lanes": 8, "window": 2, "seq_len": 256, "threads": 1, "labels": True}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--dp", type=int, required=True)
    p.add_argument("--tp", type=int, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--state-at", type=int, default=-1)
    p.add_argument("--balance", type=int, default=1)
    p.add_argument("--resume", default="")
    p.add_argument("--endpoints", default="")
    p.add_argument("--epochs", type=int, default=0)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    rank = int(os.environ["RANK"])
    os.environ["PLITZER_CACHE"] = str(a.out.parent / f"cache-{a.out.stem}")
    # torch inside: the suite imports this module for its doctests, also without torch.
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    import plitzer.state.replica
    import plitzer.torch

    join_gloo(a.port)
    mesh = init_device_mesh("cpu", (a.dp, a.tp), mesh_dim_names=("dp", "tp"))
    opts: dict[str, object] = {**SETTINGS, "balance": bool(a.balance)}
    if a.epochs:  # a finite run, read to its end (--steps -1: every step)
        opts["epochs"] = a.epochs
    if a.endpoints:
        from tests.s3_fixtures import options

        opts["storage_options"] = options(json.loads(a.endpoints)[rank])
    out: dict[str, object] = {"steps": [], "reader": None}
    with plitzer.torch.Dataset(a.data, mesh=mesh, dp="dp", **opts) as ds:
        out["reader"] = not isinstance(ds.loader, plitzer.state.replica.Follower)
        out["rank"], out["world"] = ds.rank, ds.world
        if a.resume:
            ds.load_state_dict(bytes.fromhex(a.resume))
        for i in range(len(ds) if a.steps < 0 else a.steps):
            if i == a.state_at:
                out["state"] = ds.state_dict()["checkpoint"].hex()
            b = ds.next_batch()
            if a.endpoints:  # the request count's run: each step's rows as a digest, not as lists
                digest = hashlib.sha256(b.tokens.numpy().tobytes()).hexdigest()
                out["steps"].append({"step": b.step, "lanes": b.lanes.tolist(), "tokens": digest})  # type: ignore[attr-defined]
                continue
            docs = b.documents()
            out["steps"].append(  # type: ignore[attr-defined]
                {
                    "step": b.step,
                    "epoch": b.epoch,
                    "lanes": b.lanes.tolist(),
                    "cost": None if b.cost is None else b.cost.tolist(),
                    "tokens": b.tokens.tolist(),
                    "labels": b.labels.tolist() if b.labels is not None else None,
                    "mask": b.mask.tolist(),
                    "source_ids": b.source_ids.tolist(),
                    "source_tokens": b.source_tokens.tolist(),
                    "cu_seqlens": b.cu_seqlens.tolist(),
                    "doc_lengths": [x.tolist() for x in b.doc_lengths],
                    "documents": docs.select("lane", "file", "row_group", "row", "token_offset").rows(),
                }
            )
        out["next"] = {"step": ds.step, "epoch": ds.epoch}
    a.out.write_text(json.dumps(out))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
