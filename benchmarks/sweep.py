"""Throughput against lanes, window, seq_len and threads, one setting at a time.

Around a base configuration (the comparison table's: lanes 32, window 16,
seq_len 2048, threads = cores), each setting is varied alone; each point is one
epoch of the loader on the same files (page cache), next to the raw decode of
the token columns with the same threads (the ceiling). Prints a table and writes
``docs/figures/sweep.png``.

    python benchmarks/sweep.py --tokens 300000000
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from _common import Timing, dataset, save_figure, timed, warm_page_cache

FIGURES = Path(__file__).resolve().parents[1] / "docs" / "figures"


def raw_decode(files: list[Path], threads: int) -> Timing:
    pa.set_cpu_count(threads)
    pa.set_io_thread_count(threads)
    with timed() as t:
        for f in files:
            pq.read_table(f, columns=["tokens"], use_threads=True)
    return t


def epoch(d: Path, settings: dict[str, Any], limit: float) -> tuple[Timing, int, float]:
    """One epoch (or ``limit`` seconds) of the loader, in steady state (after its first batch).

    Returns the timing, the tokens delivered after the first batch, and the time to the first batch.
    """
    import time

    import plitzer

    s = dict(settings)
    threads = s.pop("threads")
    t0 = time.perf_counter()
    with plitzer.Loader(d, seed=0, threads=threads, **s) as loader:
        it = iter(loader)
        np.from_dlpack(next(it).tokens)
        first = time.perf_counter() - t0
        with timed() as t:
            steps = 0
            for batch in it:
                np.from_dlpack(batch.tokens)
                steps += 1
                if t0 + first + limit < time.perf_counter():
                    break
    return t, steps * s["lanes"] * s["seq_len"], first


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=300_000_000)
    ap.add_argument("--data", default=None, help="an existing folder instead of generated data")
    ap.add_argument("--limit", type=float, default=30.0, help="seconds per point at most")
    ap.add_argument("--out", default=str(FIGURES / "sweep.png"))
    args = ap.parse_args()
    d = Path(args.data) if args.data else dataset(args.tokens)
    warm_page_cache(d)
    files = sorted(d.glob("*.parquet"))
    cores = os.cpu_count() or 2
    base = {"lanes": 32, "window": 16, "seq_len": 2048, "threads": cores, "budget": 2 << 30}
    axes = {
        "lanes": [8, 32, 128, 512],
        "window": [2, 4, 8, 16, 32],
        "seq_len": [512, 1024, 2048, 4096, 8192],
        "threads": sorted({1, 2, cores, 2 * cores}),
    }
    ceiling = {th: raw_decode(files, th) for th in axes["threads"]}
    import plitzer

    tokens = plitzer.index(d).tokens
    results: dict[str, list[tuple[int, float, float, float]]] = {}
    print(f"{tokens:,} tokens in {len(files)} files; {cores} cores; base {base}")
    print(f"{'setting':<8} {'value':>6} {'Mtok/s':>8} {'cores':>6} {'CPU ns/tok':>11} {'/ ceiling':>10} {'first s':>8}")
    for name, values in axes.items():
        results[name] = []
        for v in values:
            s = {**base, name: v}
            t, delivered, first = epoch(d, s, args.limit)
            ceil = ceiling.get(s["threads"]) or raw_decode(files, s["threads"])
            ratio = t.rate(delivered) / ceil.rate(tokens)
            results[name].append((v, t.rate(delivered), t.cores(), t.ns_per_token(delivered)))
            print(
                f"{name:<8} {v:>6} {t.rate(delivered):8.1f} {t.cores():6.2f} "
                f"{t.ns_per_token(delivered):11.1f} {ratio:9.2f}x {first:8.2f}"
            )
    for th, c in ceiling.items():
        print(f"raw decode, {th} threads: {c.rate(tokens):.1f} Mtok/s, {c.ns_per_token(tokens):.1f} CPU ns/token")
    plot(results, {th: c.rate(tokens) for th, c in ceiling.items()}, base, Path(args.out), cores)


def plot(
    results: dict[str, list[tuple[int, float, float, float]]],
    ceiling: dict[int, float],
    base: dict[str, int],
    out: Path,
    cores: int,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axs = plt.subplots(1, 4, figsize=(16, 3.8), sharey=True)
    for ax, (name, pts) in zip(axs, results.items(), strict=True):
        xs = [p[0] for p in pts]
        ax.plot(xs, [p[1] for p in pts], "o-", label="plitzer Loader")
        if name == "threads":
            ax.plot(list(ceiling), list(ceiling.values()), "s--", color="gray", label="raw decode (pyarrow)")
        else:
            ax.axhline(ceiling[base["threads"]], color="gray", ls="--", label="raw decode (pyarrow)")
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.set_xlabel(name + (f" (base {base[name]})" if name in base else ""))
        ax.grid(alpha=0.3)
    axs[0].set_ylabel("Mtokens/s")
    axs[0].legend(fontsize=8)
    fig.suptitle(f"plitzer throughput, one setting at a time ({cores} cores, page cache)")
    save_figure(fig, out)


if __name__ == "__main__":
    main()
