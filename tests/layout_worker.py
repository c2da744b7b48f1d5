"""One rank of tests/planning/test_layout.py's gloo test (run as a script): set_layout under gloo.

It joins a gloo group (TCP store on 127.0.0.1), takes three steps through
plitzer.torch.Dataset, then calls ``set_layout``: the same call on every rank
(``--mode same``: from step 5, 2 lanes of 32 tokens; then seven more steps and a
state_dict), or a different one per rank (``--mode differ``, which every rank must
refuse). It writes what it saw to ``--out`` as JSON.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from tests.net import join_gloo

SETTINGS = {"seed": 1, "lanes": 4, "window": 2, "seq_len": 8}


def main() -> None:
    # torch inside: the suite imports this module for its doctests, also without torch.
    import torch.distributed as dist

    import plitzer.torch

    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--mode", choices=["same", "differ"], required=True)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    rank, _ = join_gloo(a.port)
    out: dict[str, object] = {}
    with plitzer.torch.Dataset(a.data, threads=1, **SETTINGS) as ds:
        rows = [np.asarray(ds.next_batch().tokens).tolist() for _ in range(3)]
        seq_len = 32 if a.mode == "same" or rank == 0 else 16
        try:
            out["at"] = ds.set_layout(lanes=2, seq_len=seq_len, at_step=5)
        except plitzer.ConfigError as e:
            out["error"] = str(e)
        out["layout"] = ds.loader.config.get("layout")
        if a.mode == "same":
            rows += [np.asarray(ds.next_batch().tokens).tolist() for _ in range(7)]
            out["state"] = ds.state_dict()["checkpoint"].hex()
        out["rows"] = rows
    a.out.write_text(json.dumps(out))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
