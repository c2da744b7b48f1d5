"""One rank of tests/readpath/test_balance_gloo.py (run as a script): balanced steps over a real gloo group.

It joins a gloo group (TCP store on 127.0.0.1) and reads through
``plitzer.torch.Dataset(group=None, balance=True, ...)``: the loader makes a gloo group of
its own over the world and deals each step's rows over it. With ``--resume HEX`` it first
loads that global checkpoint. It writes, per step, its rows' lanes, cost, tokens and labels,
and the collective ``state_dict()`` taken after ``--state-at`` steps, to ``--out`` as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from tests.net import join_gloo

SETTINGS = {"seed": 5, "lanes": 8, "window": 2, "seq_len": 256, "threads": 1, "labels": True}


def main() -> None:
    # torch inside: the suite imports this module for its doctests, also without torch.
    import torch.distributed as dist

    import plitzer.torch

    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--state-at", type=int, default=-1)
    p.add_argument("--microbatches", type=int, default=1)
    p.add_argument("--balance", type=int, default=1)
    p.add_argument("--resume", default="")
    p.add_argument("--die-at", type=int, default=-1)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    join_gloo(a.port)
    out: dict[str, object] = {"steps": []}
    opts = {**SETTINGS, "balance": bool(a.balance), "microbatches": a.microbatches}
    with plitzer.torch.Dataset(a.data, **opts) as ds:
        if a.resume:
            ds.load_state_dict(bytes.fromhex(a.resume))
        for i in range(a.steps):
            if i == a.die_at:
                if dist.get_rank() == 1:  # a rank that dies mid-run: its peer must not hang
                    os._exit(3)
                try:
                    ds.next_batch()
                    ds.next_batch()
                except plitzer.PlitzerError as e:
                    out["error"] = f"{type(e).__name__}: {e}"
                a.out.write_text(json.dumps(out))
                os._exit(0)
            if i == a.state_at:
                out["state"] = ds.state_dict()["checkpoint"].hex()
            b = ds.next_batch()
            out["steps"].append(  # type: ignore[attr-defined]
                {
                    "step": b.step,
                    "lanes": b.lanes.tolist(),
                    "cost": None if b.cost is None else b.cost.tolist(),
                    "tokens": b.tokens.tolist(),
                    "labels": b.labels.tolist() if b.labels is not None else None,
                    "doc_lengths": [x.tolist() for x in b.doc_lengths],
                }
            )
        out["stats"] = {"rows_moved": ds.loader.stats.rows_moved, "bytes": ds.loader.stats.exchange_bytes}
    a.out.write_text(json.dumps(out))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
