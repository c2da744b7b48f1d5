"""A fresh process's peak RSS to its first batch, as JSON on stdout.

    python tests/rss_probe.py DATA [--index JOB] [--text] [--where SQL] [--dedupe KEY] [--exclude TABLE]
                              [--columns a,b] [--budget B] [--packing best-fit] [--rank R --world N --port P]

The peak resident set (``VmHWM``) of a process that imports plitzer, opens a Loader
over DATA (``index=JOB`` where given) and takes one batch; compared with the same
process on a one-file dataset, it is what a rank pays for the dataset's index
(tests/sources/test_real_shapes.py, benchmarks/cluster.py). With ``--world``, the process is
rank R of a gloo group on 127.0.0.1:P, and the Loader shares the index's work with the
other ranks (each rank reads 1/N of the footers). With ``--text``, DATA's ``text`` column
is the source, tokenized by characters (its counting pass split across the ranks). With
``--where``, ``--dedupe`` or ``--exclude``, the selection's pass over the data is counted in;
``--columns`` names aligned columns read beside the tokens; ``--packing best-fit`` counts
best-fit's bins pass in (and the bins column it keeps). CPU seconds are the process's own.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time

import numpy as np

import plitzer


def _own_peak() -> int:
    """This process's own peak RSS in bytes: ``VmHWM`` (Linux), else ``ru_maxrss``.

    Not ``ru_maxrss`` where ``/proc`` has it: Linux carries into ``ru_maxrss`` the high-water
    mark of the process before ``exec``, which a child forked from a large parent (pytest, a
    benchmark) shares, so every probe under such a parent read the parent's peak and the
    difference between two probes was 0.
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("--index", default=None)
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--world", type=int, default=1)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--text", action="store_true", help="read the text column, tokenized by characters")
    ap.add_argument("--where", default=None, help="a selection (where=), its pass over the data included")
    ap.add_argument("--dedupe", default=None, help="dedupe= ('tokens' or a column), its pass included")
    ap.add_argument("--exclude", default=None, help="exclude= (a Parquet or CSV table), its pass included")
    ap.add_argument("--columns", default=None, help="aligned columns (columns=), comma-separated")
    ap.add_argument("--budget", type=int, default=1 << 24, help="budget= (a selection that drops most rows needs more)")
    ap.add_argument("--packing", default=None, help="packing= (best-fit: its bins pass included)")
    a = ap.parse_args()
    if a.world > 1:
        import torch.distributed as dist

        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(a.port))
        dist.init_process_group("gloo", rank=a.rank, world_size=a.world)
    t0, c0 = time.perf_counter(), time.process_time()
    lanes = 4 * a.world
    text: dict[str, object] = {}
    if a.text:
        from tests.share_fixtures import CharTokenizer

        text = {"tokenizer": CharTokenizer()}
    for name in ("where", "dedupe", "exclude", "columns", "packing"):
        if getattr(a, name) is not None:
            text[name] = getattr(a, name)
    with plitzer.Loader(
        a.data, index=a.index, lanes=lanes, seq_len=64, window=4, budget=a.budget, rank=a.rank, world=a.world, **text
    ) as ld:
        batch = next(iter(ld))
        first, cpu = time.perf_counter() - t0, time.process_time() - c0
        rows = ld.index.row_groups
        assert np.asarray(batch.tokens).shape == (4, 64)
    peak = _own_peak()
    print(json.dumps({"peak_bytes": peak, "row_groups": rows, "first_batch_s": first, "cpu_s": cpu}))
    if a.world > 1:
        import torch.distributed as dist

        dist.destroy_process_group()


if __name__ == "__main__":
    main()
