"""A mixture's cost: throughput against one source of the same bytes, and plan time.

Two measurements, in one run:

* throughput: three sources (books, code, web, different sizes and document lengths)
  read as a mixture with weights, against the same three folders read as *one* source
  (a list of paths: exactly the same bytes), same settings, alternating runs, best of
  ``--repeat``; tokens/s and CPU ns/token, and the ratio (target: within 5 %);
* plan time: three synthetic sources of ``--row-groups`` row groups each (footer counts
  only, no files), the mixture's plan for ``--epochs`` epochs (the interleave, windows,
  lane cuts and reads of every epoch).

    python benchmarks/mixture.py --tokens 30000000 --row-groups 30000 --epochs 100
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import polars as pl
from _common import timed, warm_page_cache

import plitzer
import plitzer.synth
from planner.catalog.datasetindex import Index
from planner.catalog.rowlists import INDEX_SCHEMA
from planner.mixing.mixture import MixtureIndex, MixturePlan
from planner.mixing.sources import SourceSpec, parse_stages
from planner.order.epoch import PlanSettings


def write_sources(root: Path, tokens: int) -> dict[str, str]:
    shapes = {"books": (0.2, 40, 3000.0), "code": (0.3, 300, 600.0), "web": (0.5, 1000, 900.0)}
    out = {}
    for i, (name, (share, docs, mean)) in enumerate(shapes.items()):
        d = root / f"mix-{tokens // 1_000_000}M" / name
        if not (d / ".done").exists():
            print(f"generating {name} ({int(tokens * share):,} tokens) into {d} ...", flush=True)
            plitzer.synth.write(d, tokens=int(tokens * share), seed=10 + i, docs_per_row_group=docs, mean_length=mean)
            (d / ".done").write_text("ok")
        warm_page_cache(d)
        out[name] = str(d)
    return out


def run(source: object, steps: int, **kw: object) -> tuple[float, float, int]:
    with plitzer.Loader(source, **kw) as ld, timed() as t:  # type: ignore[arg-type]
        n = 0
        for _ in range(steps):
            n += ld.next_batch().tokens.size
    return t.rate(n), t.ns_per_token(n), n


def synthetic_index(name: str, row_groups: int, seed: int) -> Index:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(500_000, 1_500_000, row_groups)
    rows = tokens // 1000
    frame = pl.DataFrame(
        {
            "file": [f"{name}/part-{g // 16:05d}.parquet" for g in range(row_groups)],
            "file_index": np.arange(row_groups) // 16,
            "row_group": np.arange(row_groups) % 16,
            "rows": rows,
            "tokens": tokens,
            "empty_docs": np.zeros(row_groups, np.int64),
            "byte_offset": np.zeros(row_groups, np.int64),
            "byte_length": tokens,
            "needs_check": np.zeros(row_groups, bool),
            "codec": np.full(row_groups, 6, np.uint8),  # ZSTD
            "chunk_values": tokens,
        },
        schema=INDEX_SCHEMA,
    )
    return Index(frame=frame, column="tokens", dtype="int32", fingerprint=name, source=name, _files=[])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=30_000_000)
    ap.add_argument("--steps", type=int, default=0, help="steps per run (default: one epoch)")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--row-groups", type=int, default=30_000)
    ap.add_argument("--epochs", type=int, default=100)
    ap.add_argument("--data", default="data")
    args = ap.parse_args()

    sources = write_sources(Path(args.data), args.tokens)
    cfg = {"seed": 0, "lanes": 256, "window": 8, "seq_len": 2048}
    weights = {"books": 1, "code": 2, "web": 3}
    total = sum(plitzer.index(p).tokens for p in sources.values())
    steps = args.steps or total // (cfg["lanes"] * cfg["seq_len"])
    print(f"{total:,} tokens in 3 sources; {steps} steps of {cfg['lanes']} x {cfg['seq_len']} per run")
    best: dict[str, tuple[float, float]] = {}
    for _ in range(args.repeat):
        for label, src, kw in (
            ("one source (list of the same folders)", list(sources.values()), {}),
            ("mixture of 3, weights 1:2:3", sources, {"weights": weights}),
        ):
            rate, ns, _ = run(src, steps, **cfg, **kw)
            if label not in best or rate > best[label][0]:
                best[label] = (rate, ns)
    print(f"{'reader':<42} {'Mtok/s':>8} {'CPU ns/tok':>11}")
    for label, (rate, ns) in best.items():
        print(f"{label:<42} {rate:>8.1f} {ns:>11.1f}")
    (r1, n1), (r2, n2) = best.values()
    print(f"mixture / one source: {r2 / r1:.3f}x tokens/s, {n2 / n1:.3f}x CPU per token (target: within 5 %)")

    parts = [synthetic_index(n, args.row_groups, i) for i, n in enumerate(("books", "code", "web"))]
    ix = MixtureIndex([SourceSpec(name=p.source, path=p.source) for p in parts], parts)
    stages = parse_stages({"books": 1, "code": 2, "web": 3}, ix.names, [p.tokens for p in parts])
    t0 = time.perf_counter()
    plan = MixturePlan(ix, PlanSettings(lanes=512, window=64, world=8), stages, seq_len=2048)
    reads = 0
    for e in range(args.epochs):
        reads += len(plan.epoch(e).read_position)
    dt = time.perf_counter() - t0
    print(
        f"plan of 3 sources x {args.row_groups:,} row groups, {args.epochs} epochs (lanes 512, window 64, "
        f"world 8): {dt:.2f} s ({dt / args.epochs * 1000:.1f} ms per epoch, {reads:,} reads planned)"
    )


if __name__ == "__main__":
    main()
