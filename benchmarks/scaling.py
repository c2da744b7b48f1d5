"""Does the time per token stay flat as the data grows? 50, 150 and 300 M tokens.

For each size (synth data, generated once under ``data/``), one epoch of the
loader (the comparison table's settings: lanes 32, window 16, seq_len 2048,
threads = cores) next to the raw decode of the same files. Prints a table and
writes ``docs/figures/scaling.png`` (CPU and wall ns per token against size).

    python benchmarks/scaling.py --sizes 50,150,300
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from _common import dataset, save_figure, timed, warm_page_cache

FIGURES = Path(__file__).resolve().parents[1] / "docs" / "figures"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="50,150,300", help="millions of tokens")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--lanes", type=int, default=32)
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--budget", type=int, default=1 << 30)
    ap.add_argument("--out", default=str(FIGURES / "scaling.png"))
    args = ap.parse_args()
    import plitzer

    pa.set_cpu_count(args.threads)
    pa.set_io_thread_count(args.threads)
    rows = []
    print(
        f"{'Mtokens':>8} {'files':>6} {'raw ns/tok':>11} {'Mtok/s':>8} {'wall ns/tok':>12} {'CPU ns/tok':>11} "
        f"{'first batch':>12} {'peak held MiB':>14}"
    )
    for size in [int(s) for s in args.sizes.split(",")]:
        d = dataset(size * 1_000_000)
        warm_page_cache(d)
        files = sorted(d.glob("*.parquet"))
        ix = plitzer.index(d)
        with timed() as raw:
            for f in files:
                pq.read_table(f, columns=["tokens"], use_threads=True)
        t0 = time.perf_counter()
        with (
            plitzer.Loader(
                ix, lanes=args.lanes, window=args.window, seq_len=args.seq_len, budget=args.budget, threads=args.threads
            ) as loader,
            timed() as t,
        ):
            steps = 0
            first = 0.0
            for batch in loader:
                np.from_dlpack(batch.tokens)
                if steps == 0:
                    first = time.perf_counter() - t0
                steps += 1
            peak = loader.peak_bytes
        n = steps * args.lanes * args.seq_len
        rows.append((ix.tokens / 1e6, t.wall / n * 1e9, t.ns_per_token(n), raw.wall / ix.tokens * 1e9))
        print(
            f"{ix.tokens / 1e6:8.0f} {len(files):6d} {raw.wall / ix.tokens * 1e9:11.2f} {t.rate(n):8.1f} "
            f"{t.wall / n * 1e9:12.2f} {t.ns_per_token(n):11.1f} {first:11.3f}s {peak / 2**20:14.0f}"
        )
    plot(rows, Path(args.out), args.threads)


def plot(rows: list[tuple[float, float, float, float]], out: Path, threads: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    xs = [r[0] for r in rows]
    ax.plot(xs, [r[1] for r in rows], "o-", label="plitzer, wall ns/token")
    ax.plot(xs, [r[2] for r in rows], "o-", label="plitzer, CPU ns/token")
    ax.plot(xs, [r[3] for r in rows], "s--", color="gray", label="raw decode, wall ns/token")
    ax.set_xlabel("dataset size (M tokens)")
    ax.set_ylabel("ns per token")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"Time per token against data size ({threads} threads, page cache)")
    save_figure(fig, out)


if __name__ == "__main__":
    main()
