"""How far apart lanes drift, in windows, as a run goes on (simulated from lengths).

Lanes receive slightly different numbers of tokens per window, so at a given step
they sit in different windows, and the loader holds every window between the
slowest and the fastest lane. This simulates the lane cut rule of SPEC section 3
on FineWeb-like lognormal document lengths (no data is read) and prints the spread
after a number of windows, for a few window sizes.

    python benchmarks/drift.py --lanes 512 --docs-per-row-group 1000
"""

from __future__ import annotations

import argparse

import numpy as np

from planner.plan import lane_of


def simulate(rng: np.random.Generator, lanes: int, docs: int, windows: int, mean: float, sigma: float) -> np.ndarray:
    """Cumulative tokens per lane after each window: shape (windows, lanes)."""
    mu = np.log(mean) - sigma**2 / 2
    out = np.zeros((windows, lanes), dtype=np.int64)
    total = np.zeros(lanes, dtype=np.int64)
    for w in range(windows):
        lengths = np.maximum(1, rng.lognormal(mu, sigma, docs).astype(np.int64))
        starts = np.cumsum(lengths) - lengths
        lane = lane_of(starts, np.int64(lengths.sum()), lanes)  # type: ignore[arg-type]
        total += np.bincount(lane, weights=lengths, minlength=lanes).astype(np.int64)
        out[w] = total
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lanes", type=int, default=512)
    ap.add_argument("--docs-per-row-group", type=int, default=1000)
    ap.add_argument("--mean", type=float, default=1000.0)
    ap.add_argument("--sigma", type=float, default=1.0)
    ap.add_argument("--windows", type=int, default=1200)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    print(
        f"lanes={args.lanes}, {args.docs_per_row_group} docs per row group, "
        f"lognormal mean {args.mean}, sigma {args.sigma}"
    )
    marks = [n for n in (10, 100, 1000) if n < args.windows]
    print(f"{'W':>5} {'docs/lane/window':>17} " + " ".join(f"{'after ' + str(n):>11}" for n in marks))
    for w in (8, 64, 512):
        docs = w * args.docs_per_row_group
        cum = simulate(rng, args.lanes, docs, args.windows, args.mean, args.sigma)
        spreads = []
        for n in marks:
            # At the step where the mean lane has used n windows, each lane's window index
            # (the simulation runs past n so that the fastest lane's index is not cut off):
            t = cum[n - 1].mean()
            idx = np.array([np.searchsorted(cum[:, k], t, side="right") for k in range(args.lanes)])
            spreads.append(int(idx.max() - idx.min()) + 1)
        print(f"{w:>5} {docs / args.lanes:>17.0f} " + " ".join(f"{s:>11}" for s in spreads))
    print("(windows held at once = spread; add the prefetch depth)")


if __name__ == "__main__":
    main()
