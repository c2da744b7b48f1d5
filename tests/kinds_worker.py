"""One rank of tests/sources/test_kinds_everywhere.py's gloo test (run as a script): a new kind of source read
through ``plitzer.torch.Dataset`` by a real gloo process group.

It joins a gloo group (TCP store on 127.0.0.1), opens ``--data`` with the settings ``--opts``
(JSON: a Megatron or numpy source's ``row_group_tokens`` among them, as the test's fixtures give
it) and writes, per step, its rows' lanes and tokens to ``--out`` as JSON.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tests.net import join_gloo


def main() -> None:
    # torch inside: the suite imports this module for its doctests, also without torch.
    import torch.distributed as dist

    import plitzer.torch

    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--opts", required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    join_gloo(a.port)
    steps = []
    with plitzer.torch.Dataset(a.data, **json.loads(a.opts)) as ds:
        for _ in range(a.steps):
            b = ds.next_batch()
            steps.append({"step": b.step, "lanes": b.lanes.tolist(), "tokens": b.tokens.tolist()})
    a.out.write_text(json.dumps({"steps": steps}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
