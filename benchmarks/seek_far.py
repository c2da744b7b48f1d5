"""Seek far into a run: ``seek(step)`` plus the first batch at step 10^3 and at 10^7.

One source, and a 3-source mixture with two stages and a live stage (8 lanes of 32 tokens),
on synthetic data in a temporary folder. Prints the time, the Python memory traced during
the seek and the items the interleave holds (docs/design.md, "Seeking a mixture").

    python benchmarks/seek_far.py
"""

from __future__ import annotations

import tempfile
import time
import tracemalloc

import plitzer
import plitzer.synth
from planner.mixing.mixture import Interleave

STAGES = [(0, {"books": 1, "code": 1, "web": 2}), (500, {"books": 0, "code": 3, "web": 1})]
CFG = {"seed": 1, "lanes": 8, "window": 2, "seq_len": 32}


def main() -> None:
    root = tempfile.mkdtemp()
    srcs = {}
    for i, n in enumerate(["books", "code", "web"]):
        plitzer.synth.write(
            f"{root}/{n}", tokens=20_000 * (i + 1), seed=i, docs_per_row_group=10, row_groups_per_file=4
        )
        srcs[n] = f"{root}/{n}"
    for what in ("one source", "mixture"):
        for step in (10**3, 10**7):
            src = srcs["web"] if what == "one source" else srcs
            weights = None if what == "one source" else STAGES
            with plitzer.Loader(src, weights=weights, **CFG) as ld:
                ld.next_batch()
                if what == "mixture":
                    ld.set_weights({"books": 2, "code": 1, "web": 1}, at_step=900)
                tracemalloc.start()
                t = time.perf_counter()
                ld.seek(step)
                ld.next_batch()
                dt = time.perf_counter() - t
                cur, peak = tracemalloc.get_traced_memory()
                tracemalloc.stop()
                order = ld.plan.order
                kept = order.items_kept if isinstance(order, Interleave) else 0
                print(
                    f"{what:10s} step {step:>10,}: {dt * 1000:7.1f} ms, traced {cur / 2**20:5.2f} MiB "
                    f"(peak {peak / 2**20:5.2f}), items kept {kept}"
                )


if __name__ == "__main__":
    main()
