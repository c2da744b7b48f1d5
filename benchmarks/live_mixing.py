"""What a live change of a mixture's weights costs: the run with set_weights against the same stages up front.

Three sources (books, code, web, as ``benchmarks/mixture.py`` writes them) read twice
with the same settings, alternating, best of ``--repeat``:

* live: ``loader.set_weights`` every ``--every`` steps (the weights cycle through a fixed
  list, as a loss-driven loop's would move), each stage at the earliest step allowed, or
  ``--lead`` steps after it (past the windows read ahead: nothing is read again);
* up front: a loader built with the stages the live run recorded.

The batches are checked equal. Printed: tokens/s and CPU ns per token of each, their
ratios, the row groups each read (the live run reads again the windows read ahead past
a change), and the time one ``set_weights`` call takes. Then the planning cost of one
change deep into a long run: three synthetic sources of ``--row-groups`` row groups,
the plan generated through ``--epochs`` epochs, one stage appended at the end.

    python benchmarks/live_mixing.py --tokens 20000000 --lanes 64 --every 50
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
from _common import timed
from mixture import synthetic_index, write_sources

import plitzer
from planner.mixing.mixture import MixtureIndex, MixturePlan
from planner.mixing.sources import SourceSpec, Stage, parse_stages
from planner.order.epoch import PlanSettings

CYCLE = [{"books": 1, "code": 2, "web": 3}, {"books": 3, "code": 1, "web": 2}, {"books": 1, "code": 4, "web": 1}]


def live(sources: dict[str, str], steps: int, every: int, cfg: dict[str, int], lead: int = 0):
    calls, digest = [], 0
    with plitzer.Loader(sources, weights=CYCLE[0], **cfg) as ld, timed() as t:
        n = 0
        for step in range(steps):
            b = ld.next_batch()
            n += b.tokens.size
            digest = hash((digest, np.from_dlpack(b.tokens)[:, :8].tobytes()))
            if (step + 1) % every == 0:
                c0 = time.perf_counter()
                at = None if lead == 0 else live_earliest(ld) + lead
                ld.set_weights(CYCLE[(step + 1) // every % len(CYCLE)], at_step=at)
                calls.append(time.perf_counter() - c0)
        stages = [(s, w) for s, w in ld.config["stages"]]
        reads = ld.reads
    return t, n, digest, stages, reads, calls


def live_earliest(ld: plitzer.Loader) -> int:
    from plitzer.state.live import earliest_step

    return earliest_step(ld.plan, ld.step, ld.settings.seq_len)


def up_front(sources: dict[str, str], steps: int, stages, cfg: dict[str, int]):
    digest = 0
    with plitzer.Loader(sources, weights=stages, **cfg) as ld, timed() as t:
        n = 0
        for _ in range(steps):
            b = ld.next_batch()
            n += b.tokens.size
            digest = hash((digest, np.from_dlpack(b.tokens)[:, :8].tobytes()))
        reads = ld.reads
    return t, n, digest, reads


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=20_000_000)
    ap.add_argument("--steps", type=int, default=0, help="steps per run (default: one epoch)")
    ap.add_argument("--every", type=int, default=50)
    ap.add_argument("--lead", type=int, default=0, help="set each stage this many steps after the earliest allowed")
    ap.add_argument("--lanes", type=int, default=256)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--row-groups", type=int, default=30_000)
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--data", default="data")
    args = ap.parse_args()

    sources = write_sources(Path(args.data), args.tokens)
    cfg = {"seed": 0, "lanes": args.lanes, "window": 8, "seq_len": args.seq_len}
    total = sum(plitzer.index(p).tokens for p in sources.values())
    steps = args.steps or total // (cfg["lanes"] * cfg["seq_len"])
    shape = f"{cfg['lanes']} x {cfg['seq_len']}"
    print(f"{total:,} tokens in 3 sources; {steps} steps of {shape}, a change every {args.every}")
    best_live = best_front = None
    for _ in range(args.repeat):
        tl, n, dl, stages, reads_l, calls = live(sources, steps, args.every, cfg, args.lead)
        tf, _, df, reads_f = up_front(sources, steps, stages, cfg)
        assert dl == df, "the live run's batches differ from the same stages up front"
        if best_live is None or tl.rate(n) > best_live[0]:
            best_live = (tl.rate(n), tl.ns_per_token(n), reads_l, calls)
        if best_front is None or tf.rate(n) > best_front[0]:
            best_front = (tf.rate(n), tf.ns_per_token(n), reads_f)
    assert best_live is not None and best_front is not None
    print(f"{'run':<34} {'Mtok/s':>8} {'CPU ns/tok':>11} {'row groups read':>16}")
    print(f"{'live set_weights':<34} {best_live[0]:>8.1f} {best_live[1]:>11.1f} {best_live[2]:>16,}")
    print(f"{'the same stages up front':<34} {best_front[0]:>8.1f} {best_front[1]:>11.1f} {best_front[2]:>16,}")
    calls = best_live[3] or [0.0]
    print(
        f"live / up front: {best_live[0] / best_front[0]:.3f}x tokens/s, {best_live[1] / best_front[1]:.3f}x CPU "
        f"per token, {best_live[2] / best_front[2]:.3f}x row groups read; {len(calls)} changes, set_weights "
        f"{np.mean(calls) * 1000:.2f} ms mean, {np.max(calls) * 1000:.2f} ms max (batches equal)"
    )

    parts = [synthetic_index(n, args.row_groups, i) for i, n in enumerate(("books", "code", "web"))]
    ix = MixtureIndex([SourceSpec(name=p.source, path=p.source) for p in parts], parts)
    stages0 = parse_stages(CYCLE[0], ix.names, [p.tokens for p in parts])
    plan = MixturePlan(ix, PlanSettings(lanes=512, window=64, world=8), stages0, seq_len=2048)
    plan.epoch(args.epochs)
    unit = plan.unit(args.epochs, 0)
    step = int(plan.window_starts(unit)[-1]) // (512 * 2048) + 1
    t0 = time.perf_counter()
    plan.add_stage(Stage(step, (1, 1, 1)))
    dt = time.perf_counter() - t0
    print(
        f"one change after {args.epochs} epochs of 3 x {args.row_groups:,} row groups ({unit:,} windows, lanes 512, "
        f"window 64): {dt * 1000:.1f} ms"
    )


if __name__ == "__main__":
    main()
