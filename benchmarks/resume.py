"""Resume time against the position in the epoch.

For each fraction of the epoch, run the loader to that step, checkpoint, then
time a new Loader (index cached) from construction through ``resume`` to its
first batch, and check that batch against the uninterrupted run. Prints a table
and writes ``docs/figures/resume.png``.

    python benchmarks/resume.py --tokens 60000000
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
from _common import dataset, save_figure, warm_page_cache

FIGURES = Path(__file__).resolve().parents[1] / "docs" / "figures"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=60_000_000)
    ap.add_argument("--data", default=None, help="an existing folder instead of generated data")
    ap.add_argument("--lanes", type=int, default=32)
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--fractions", default="0,0.1,0.25,0.5,0.75,0.9,0.99")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default=str(FIGURES / "resume.png"))
    args = ap.parse_args()
    d = Path(args.data) if args.data else dataset(args.tokens)
    warm_page_cache(d)
    import plitzer

    ix = plitzer.index(d)
    settings = {"lanes": args.lanes, "window": args.window, "seq_len": args.seq_len, "threads": args.threads}
    fractions = [float(x) for x in args.fractions.split(",")]
    with plitzer.Loader(ix, **settings) as loader:
        n = len(loader)
        stops = sorted({min(n - 1, int(f * n)) for f in fractions})
        states: dict[int, bytes] = {}
        nxt: dict[int, np.ndarray] = {}
        for step in range(n):
            if step in stops:
                states[step] = loader.checkpoint()
            batch = loader.next_batch()
            if step in stops:
                nxt[step] = np.from_dlpack(batch.tokens).copy()
    print(f"{ix.tokens:,} tokens, {n} steps per epoch, {ix.row_groups} row groups; {settings}; best of {args.repeat}")
    print(f"{'step':>6} {'epoch %':>8} {'construct s':>12} {'resume+first s':>15} {'total s':>8} {'exact':>6}")
    rows = []
    for step in stops:
        best = None
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            with plitzer.Loader(d, **settings) as again:
                t1 = time.perf_counter()
                again.resume(states[step])
                got = np.from_dlpack(again.next_batch().tokens)
                t2 = time.perf_counter()
                exact = bool(np.array_equal(got, nxt[step]))
            if best is None or t2 - t0 < best[2]:
                best = (t1 - t0, t2 - t1, t2 - t0, exact)
        assert best is not None
        rows.append((100 * step / n, *best))
        print(
            f"{step:6d} {100 * step / n:7.1f}% {best[0]:12.3f} {best[1]:15.3f} {best[2]:8.3f} "
            f"{'yes' if best[3] else 'NO':>6}"
        )
    plot(rows, Path(args.out), args.threads)


def plot(rows: list[tuple[float, float, float, float, bool]], out: Path, threads: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    xs = [r[0] for r in rows]
    ax.plot(xs, [r[3] for r in rows], "o-", label="construct + resume + first batch")
    ax.plot(xs, [r[2] for r in rows], "o-", label="resume + first batch")
    ax.set_xlabel("position in the epoch (%)")
    ax.set_ylabel("seconds")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"Resume time against position ({threads} threads, page cache)")
    save_figure(fig, out)


if __name__ == "__main__":
    main()
