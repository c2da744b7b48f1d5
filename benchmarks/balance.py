"""Balanced steps (SPEC section 18): how far the slowest rank's attention work is above the mean rank's.

Under document masking a row's attention work is the sum of ``n * n`` over its documents
(``doc_lengths``). Each step's imbalance is its slowest rank's work over the mean rank's,
*as assigned* (section 4: rank ``r`` its block of ``B / world`` lanes) and *balanced* (the
step's rows dealt by cost, ``balance=True``). Printed: its median and p95 over the run's first
``--steps`` steps, and the *floor* no deal of whole rows can go below (the rank holding the
step's heaviest row holds ``B / world - 1`` others, at least the lightest ones), at each
``L:B:world`` of ``--configs`` (``L`` = 2048, 8192, 32768 at ``B = 512`` over ``world = 64``;
``B = 64`` over ``world = 8`` at ``L = 32768``). Everything comes from ``plan.costs``
(document lengths only: no batch is packed), on:

* real text: ``plitzer synth --text`` (the installed packages' sources and documentation,
  tokenized with the SentencePiece model ``mistral-common`` ships), ``--text-tokens``;
* FineWeb-like lengths: ``plitzer.synth.write`` (lognormal, mean ``--mean-length`` 900,
  sigma 1, the ``throughput.py`` data's model), ``--fineweb-tokens``.

The run never ends, so a step may take more tokens than the data holds: the epochs repeat,
each in its own order. Data is written once under ``--data`` (``PLITZER_BENCH_DATA``, default
``data/``) and kept; the time of each ``plan.costs`` call is printed beside its row.

    python benchmarks/balance.py
    python benchmarks/balance.py --steps 512 --text-tokens 200000000 --fineweb-tokens 400000000
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

import plitzer
import plitzer.synth
from plitzer.tools.explain import document_lengths


def text_data(root: Path, tokens: int, row_group_tokens: int) -> Path:
    """Real text, tokenized (``plitzer synth --text``), written once and kept."""
    from plitzer.tools.synth_text import write_text

    d = root / f"balance-text-{tokens}-{row_group_tokens}"
    if not (d / ".done").exists():
        print(f"tokenizing {tokens:,} tokens of text into {d} ...", flush=True)
        write_text(d, tokens, row_group_tokens=row_group_tokens, progress=False)
        (d / ".done").write_text("ok")
    return d


def fineweb_data(root: Path, tokens: int, mean_length: float) -> Path:
    """FineWeb-like lengths (lognormal, sigma 1), 1000 documents a row group, written once and kept."""
    d = root / f"balance-fineweb-{tokens}-{mean_length:g}"
    if not (d / ".done").exists():
        print(f"generating {tokens:,} tokens into {d} ...", flush=True)
        plitzer.synth.write(d, tokens=tokens, seed=0, mean_length=mean_length, docs_per_row_group=1000)
        (d / ".done").write_text("ok")
    return d


def imbalance(data: Path, seq_len: int, lanes: int, world: int, steps: int, window: int) -> dict[str, Any]:
    """Each of the first ``steps`` steps' slowest rank over the mean rank, as assigned and balanced."""
    plan = plitzer.plan(data, lanes=lanes, world=world, seq_len=seq_len, window=window)
    t0 = time.perf_counter()
    costs = plan.costs(0, steps - 1)
    took = time.perf_counter() - t0
    per_step = costs.group_by("step").agg(
        (pl.col(c).max() / pl.col(c).mean()).alias(c) for c in ("assigned", "balanced")
    )
    out: dict[str, Any] = {"seconds": took, "floor": floor(plan, steps, lanes // world)}
    for c in ("assigned", "balanced"):
        x = per_step[c].to_numpy()
        out[c] = (float(np.median(x)), float(np.percentile(x, 95)))
    return out


def floor(plan: Any, steps: int, per_rank: int) -> tuple[float, float]:
    """The least imbalance any deal of whole rows, ``per_rank`` a rank, can reach: median and p95 over steps.

    The rank holding a step's heaviest row holds ``per_rank - 1`` others, at least the lightest
    ones. Each row's cost is ``assigned`` with one row a microbatch (``microbatches=per_rank``).
    """
    rows = plan.costs(0, steps - 1, microbatches=per_rank).sort("step", "rank", "microbatch")["assigned"]
    c = np.sort(rows.to_numpy().reshape(steps, -1), axis=1)
    world = c.shape[1] // per_rank
    x = np.maximum(1.0, (c[:, -1] + c[:, : per_rank - 1].sum(axis=1)) / (c.sum(axis=1) / world))
    return float(np.median(x)), float(np.percentile(x, 95))


def describe(name: str, data: Path) -> str:
    n = document_lengths(data)
    return (
        f"{name}: {data} - {int(n.sum()):,} tokens, {len(n):,} documents, median {int(np.median(n)):,}, "
        f"mean {n.mean():,.0f}, p99 {int(np.percentile(n, 99)):,} tokens"
    )


def configs(text: str) -> list[tuple[int, int, int]]:
    """``L:B:world,...`` as (seq_len, lanes, world) triples."""
    out = []
    for part in text.split(","):
        seq_len, lanes, world = (int(x) for x in part.split(":"))
        out.append((seq_len, lanes, world))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--configs", default="2048:512:64,8192:512:64,32768:512:64,32768:64:8", help="L:B:world,...")
    ap.add_argument("--steps", type=int, default=128, help="the run's first steps, over which medians and p95")
    ap.add_argument("--window", type=int, default=64, help="row groups a window")
    ap.add_argument("--text-tokens", type=int, default=64_000_000)
    ap.add_argument("--row-group-tokens", type=int, default=1_000_000, help="text: tokens a row group")
    ap.add_argument("--fineweb-tokens", type=int, default=128_000_000)
    ap.add_argument("--mean-length", type=float, default=900.0, help="FineWeb-like: mean document length")
    ap.add_argument("--only", choices=["text", "fineweb"], help="one of the two data sets")
    ap.add_argument("--data", default=os.environ.get("PLITZER_BENCH_DATA", "data"))
    args = ap.parse_args()
    root = Path(args.data)
    sets = []
    if args.only in (None, "text"):
        sets.append(("real text", text_data(root, args.text_tokens, args.row_group_tokens)))
    if args.only in (None, "fineweb"):
        sets.append(("FineWeb-like", fineweb_data(root, args.fineweb_tokens, args.mean_length)))
    print("$ python " + shlex.join(sys.argv))
    for name, d in sets:
        print(describe(name, d))
    print(
        f"{args.steps} steps from step 0, window {args.window}, {os.cpu_count()} cores; "
        "imbalance = a step's max over ranks / mean over ranks of the attention cost"
    )
    print()
    print(
        "| data | L | B | world | assigned median | assigned p95 | balanced median | balanced p95 "
        "| floor median | floor p95 | plan.costs (s) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, d in sets:
        for seq_len, lanes, world in configs(args.configs):
            got = imbalance(d, seq_len, lanes, world, args.steps, args.window)
            (am, ap95), (bm, bp95), (fm, fp95) = got["assigned"], got["balanced"], got["floor"]
            print(
                f"| {name} | {seq_len:,} | {lanes} | {world} | {am:.2f}x | {ap95:.2f}x | {bm:.3f}x | {bp95:.3f}x "
                f"| {fm:.3f}x | {fp95:.3f}x | {got['seconds']:.1f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
