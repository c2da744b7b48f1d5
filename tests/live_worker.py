"""One rank of tests/mixing/test_live_torch.py (run as a script): set_weights under gloo.

It joins a gloo group (TCP store on 127.0.0.1), takes five steps of a two-source
mixture through plitzer.torch.Dataset, then calls ``set_weights``: the same call on
every rank (``--mode same``, then ten more steps and a state_dict), or a different
one per rank (``--mode differ``, which every rank must refuse). It writes what it saw
to ``--out`` as JSON.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from tests.net import join_gloo

SETTINGS = {"seed": 5, "lanes": 4, "window": 2, "seq_len": 32}
W0 = {"a": 1, "b": 1}


def main() -> None:
    # torch inside: the suite imports this module for its doctests, also without torch.
    import torch.distributed as dist

    import plitzer.torch

    p = argparse.ArgumentParser()
    p.add_argument("--sources", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--mode", choices=["same", "differ"], required=True)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    rank, _ = join_gloo(a.port)
    out: dict[str, object] = {}
    with plitzer.torch.Dataset(json.loads(a.sources), weights=W0, threads=1, **SETTINGS) as ds:
        for _ in range(5):
            ds.next_batch()
        weights = {"a": 1, "b": 3} if a.mode == "same" or rank == 0 else {"a": 3, "b": 1}
        try:
            out["at"] = ds.set_weights(weights)
        except plitzer.ConfigError as e:
            out["error"] = str(e)
        out["stages"] = ds.loader.config["stages"]
        if a.mode == "same":
            out["rows"] = [np.asarray(ds.next_batch().tokens).tolist() for _ in range(10)]
            out["state"] = ds.state_dict()["checkpoint"].hex()
    a.out.write_text(json.dumps(out))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
