"""Peak memory against ``budget``: does the loader stay within budget + 300 MiB?

Each budget runs the loader (one epoch, or ``--limit`` seconds) in its own
process through ``plitzer.bench._run_one``, whose tree this script samples
(RSS every 50 ms, PSS every 250 ms). The smallest budget is the floor the loader
accepts (its ``window`` largest row groups, decoded and packed). Prints a table
and writes ``docs/figures/memory.png``.

    python benchmarks/memory.py --tokens 60000000
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from _common import dataset, save_figure, warm_page_cache

FIGURES = Path(__file__).resolve().parents[1] / "docs" / "figures"
MIB = 2**20


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=60_000_000)
    ap.add_argument("--data", default=None, help="an existing folder instead of generated data")
    ap.add_argument("--lanes", type=int, default=32)
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--budgets", default="floor,256,512,1024,2048", help="MiB, or 'floor'")
    ap.add_argument("--limit", type=float, default=30.0, help="seconds of steady state per budget")
    ap.add_argument("--out", default=str(FIGURES / "memory.png"))
    args = ap.parse_args()
    d = Path(args.data) if args.data else dataset(args.tokens)
    warm_page_cache(d)
    import plitzer
    from plitzer.bench.baseline import run_one
    from plitzer.loader import budget_floor

    ix = plitzer.index(d)
    f = ix.frame
    floor, _ = budget_floor(
        f["tokens"].to_numpy(), f["rows"].to_numpy(), lanes=args.lanes, window=args.window, seq_len=args.seq_len
    )
    budgets = sorted({floor if b == "floor" else int(b) * MIB for b in args.budgets.split(",")} | {floor})
    budgets = [b for b in budgets if b >= floor]
    work = Path(tempfile.mkdtemp(prefix="plitzer-memory-"))
    rows = []
    print(
        f"{ix.tokens:,} tokens; lanes {args.lanes}, window {args.window}, seq_len {args.seq_len}, "
        f"{args.threads} threads; budget floor {floor / MIB:,.0f} MiB"
    )
    print(
        f"{'budget MiB':>10} {'held peak MiB':>14} {'RSS peak MiB':>13} {'PSS peak MiB':>13} "
        f"{'RSS - budget':>13} {'Mtok/s':>8}"
    )
    for b in budgets:
        opts = [
            "--data",
            str(d.resolve()),
            "--work",
            str(work),
            "--lanes",
            str(args.lanes),
            "--window",
            str(args.window),
            "--seq-len",
            str(args.seq_len),
            "--workers",
            str(args.threads),
            "--budget",
            str(b),
            "--time-limit",
            str(args.limit),
        ]
        m = run_one(sys.executable, "plitzer", "throughput", opts, work / f"b{b}", timeout=1800)
        if m.error:
            print(f"{b / MIB:10.0f} failed: {m.error}")
            continue
        o = m.out
        rate = o["tokens"] / o["wall_s"] / 1e6
        rows.append((b / MIB, o["peak_held_bytes"] / MIB, m.peak_rss / MIB, m.peak_pss / MIB, rate))
        print(
            f"{b / MIB:10.0f} {o['peak_held_bytes'] / MIB:14.0f} {m.peak_rss / MIB:13.0f} "
            f"{m.peak_pss / MIB:13.0f} {(m.peak_rss - b) / MIB:13.0f} {rate:8.1f}"
        )
    plot(rows, Path(args.out))


def plot(rows: list[tuple[float, float, float, float, float]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    xs = [r[0] for r in rows]
    ax.plot(xs, [r[2] for r in rows], "o-", label="peak RSS")
    ax.plot(xs, [r[1] for r in rows], "o-", label="decoded bytes held (peak)")
    ax.plot(xs, [x + 300 for x in xs], "--", color="gray", label="budget + 300 MiB (target)")
    ax.plot(xs, xs, ":", color="gray", label="budget")
    ax.set_xlabel("budget (MiB)")
    ax.set_ylabel("MiB")
    ax.grid(alpha=0.3)
    ax2 = ax.twinx()
    ax2.plot(xs, [r[4] for r in rows], "x-.", color="tab:red", label="Mtokens/s")
    ax2.set_ylabel("Mtokens/s", color="tab:red")
    ax2.set_ylim(bottom=0)
    ax.legend(fontsize=8, loc="upper left")
    ax.set_title("Memory against budget")
    save_figure(fig, out)


if __name__ == "__main__":
    main()
