"""The concat path's steady state, per step: what two versions of plitzer cost side by side.

One loader (``lanes=64, window=8, seq_len=2048, threads=2``), 200 steps, then ``--steps``
timed; prints wall and CPU a step and tokens/s. Run it as a whole process for each version,
alternated pair by pair, and compare the processes' CPU and wall time (``/usr/bin/time``):

    PYTHONPATH=/path/to/old python benchmarks/steady_step.py DATA    # then the new, and again
"""

from __future__ import annotations

import argparse
import time

import plitzer


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("--column", default="input_ids")
    ap.add_argument("--steps", type=int, default=1200)
    a = ap.parse_args()
    with plitzer.Loader(a.data, lanes=64, window=8, seq_len=2048, threads=2, budget=2 << 30, column=a.column) as ld:
        for _ in range(200):
            ld.next_batch()
        t, c = time.perf_counter(), time.process_time()
        for _ in range(a.steps):
            ld.next_batch()
        wall, cpu = time.perf_counter() - t, time.process_time() - c
    n = a.steps
    print(
        f"{plitzer.__file__.split('/plitzer/')[0]}: {n} steps, wall {wall / n * 1e3:.3f} ms a step, "
        f"CPU {cpu / n * 1e3:.3f} ms a step, {n * 64 * 2048 / wall / 1e6:.1f} M tokens/s"
    )


if __name__ == "__main__":
    main()
