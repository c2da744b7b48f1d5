"""How long locate takes: 1, 100 and 10,000 documents over 10 epochs, and one document deep in a run.

Two parts:

* **plan** (the arithmetic, ``plitzer.tools.locate.locate_in_plan``): a synthetic index of
  ``--row-groups`` row groups (default 100,000) of ``--docs`` documents each, with
  document lengths computed instead of read, so it times exactly what locate adds to
  the reads: permutations, windows, lanes, slice shuffles, row cuts. Also one document
  at step 10^3 and at step 10^7 of the run (same source: the epoch is arithmetic).
* **data** (``plitzer.locate`` end to end on Parquet written here, documents given by
  ``rows=``): the same counts on a small dataset, reads of token lengths included.
* **mixture** (``plitzer.explain`` and ``plitzer.locate`` end to end): a 3-source mixture
  with weight stages, plain and with layout stages, at step 10^3 and at step 10^7: the
  step explained, then one of its documents located in a stretch of steps around it and
  over its whole epoch. Each figure is the best of ``--repeats`` calls, alternating steps.

    python benchmarks/locate.py                       # every part, default sizes
    python benchmarks/locate.py --row-groups 20000    # a smaller synthetic index
    python benchmarks/locate.py --part mixture        # the mixture's deep steps only (seconds)
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
from numpy.typing import NDArray

I64 = NDArray[np.int64]


class SyntheticIndex:
    """Just what a plan needs of an index: the frame of counts (and the names locate prints)."""

    def __init__(self, row_groups: int, docs: int, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.docs = docs
        self.tokens_per = rng.integers(docs * 200, docs * 1800, row_groups).astype(np.int64)
        self.frame = pl.DataFrame(
            {
                "file": [f"part-{i // 1000:05d}.parquet" for i in range(row_groups)],
                "file_index": np.arange(row_groups, dtype=np.int64) // 1000,
                "row_group": np.arange(row_groups, dtype=np.int64) % 1000,
                "rows": np.full(row_groups, docs, np.int64),
                "tokens": self.tokens_per,
                "empty_docs": np.zeros(row_groups, np.int64),
            }
        )
        self.reads = 0
        self._memo: dict[int, I64] = {}

    def lengths(self, rgs: I64) -> list[I64]:
        """Each row group's documents: equal shares of its tokens (a read, kept, as plitzer's are)."""
        out = []
        for g in np.asarray(rgs).tolist():
            got = self._memo.get(g)
            if got is None:
                self.reads += 1
                q, r = divmod(int(self.tokens_per[g]), self.docs)
                got = np.full(self.docs, q, np.int64)
                got[:r] += 1
                self._memo[g] = got
            out.append(got)
        return out


def timed(f: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    got = f()
    return time.perf_counter() - t0, got


def plan_part(row_groups: int, docs: int, lanes: int, window: int, seq_len: int, counts: list[int]) -> None:
    from planner.order.epoch import PlanSettings
    from planner.order.plan import Plan
    from plitzer.tools.locate import locate_in_plan

    ix = SyntheticIndex(row_groups, docs)
    settings = PlanSettings(seed=0, lanes=lanes, window=window, world=8)
    rng = np.random.default_rng(1)
    print(f"plan: {row_groups:,} row groups x {docs} documents, lanes {lanes}, window {window}, seq_len {seq_len}")
    for n in counts:
        plan = Plan(ix, settings)  # type: ignore[arg-type]  # a synthetic index: the frame is all a plan reads
        rgs = rng.integers(0, row_groups, n)
        ords = rng.integers(0, docs, n)
        ix.reads, ix._memo = 0, {}
        took, got = timed(lambda: locate_in_plan(plan, rgs, ords, ix.lengths, seq_len, epochs=list(range(10))))  # noqa: B023
        print(
            f"  {n:>6,} documents over 10 epochs: {took:8.3f} s  ({got.height:,} pieces, "
            f"{ix.reads:,} row groups' lengths)"
        )
    from planner.order.layout import Layout

    # Layout stages inside epochs 2 and 5: a quarter of the lanes at 4x the rows, then half of them.
    per_step = lanes * seq_len
    at = [int(f * ix.tokens_per.sum() / per_step) for f in (2.5, 5.5)]
    layout = Layout.of(
        lanes=[(0, lanes), (at[0], lanes // 4), (at[1], lanes // 2)], seq_len=[(0, seq_len), (at[0], 4 * seq_len)]
    )
    for n in [c for c in counts if c <= 100]:
        plan = Plan(ix, settings)  # type: ignore[arg-type]
        rgs, ords = rng.integers(0, row_groups, n), rng.integers(0, docs, n)
        ix.reads, ix._memo = 0, {}
        took, got = timed(
            lambda: locate_in_plan(plan, rgs, ords, ix.lengths, seq_len, epochs=list(range(10)), layout=layout)  # noqa: B023
        )
        print(
            f"  {n:>6,} documents over 10 epochs, 2 layout changes: {took:8.3f} s  ({got.height:,} pieces, "
            f"{ix.reads:,} row groups' lengths)"
        )
    for step in (10**3, 10**7):
        plan = Plan(ix, settings)  # type: ignore[arg-type]
        epoch = plan.epoch_of_run(step * per_step)
        one = np.array([rng.integers(0, row_groups)]), np.array([0])
        took, got = timed(
            lambda: locate_in_plan(plan, *one, ix.lengths, seq_len, epochs=[epoch], steps=(step, step + 10**6))  # noqa: B023
        )
        print(f"  1 document in the epoch of step {step:>10,} (epoch {epoch}): {took:8.3f} s  ({got.height} pieces)")


def data_part(row_groups: int, lanes: int, window: int, seq_len: int, counts: list[int]) -> None:
    import plitzer
    import plitzer.synth

    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        plitzer.synth.write(d, tokens=row_groups * 50 * 120, seed=0, docs_per_row_group=50, mean_length=120)
        ix = plitzer.index(d)
        frame = ix.frame
        print(f"data: {frame.height:,} row groups, {ix.tokens:,} tokens, lanes {lanes}, window {window}")
        rng = np.random.default_rng(2)
        cfg = {"lanes": lanes, "window": window, "seq_len": seq_len}
        plitzer.locate(d, rows=[(frame["file"][0], 0)], **cfg)  # the index and the plan's footers, cached
        for n in counts:
            rg = rng.integers(0, frame.height, n).tolist()
            files, groups, counts = frame["file"].to_list(), frame["row_group"].to_list(), frame["rows"].to_list()
            rows = [(files[g], groups[g], int(rng.integers(0, counts[g]))) for g in rg]
            took, got = timed(lambda: plitzer.locate(d, rows=rows, epochs=range(10), **cfg))  # noqa: B023
            print(f"  {n:>6,} documents over 10 epochs: {took:8.3f} s  ({got.height:,} pieces)")


def mixture_part(steps: list[int], repeats: int) -> None:
    import plitzer
    import plitzer.synth

    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        sources = {}
        for i, (tokens, mean) in enumerate([(400_000, 120), (200_000, 300), (100_000, 60)]):
            plitzer.synth.write(d / f"s{i}", tokens=tokens, seed=i, docs_per_row_group=20, mean_length=mean)
            sources[f"s{i}"] = str(d / f"s{i}")
        weights = [
            (0, {"s0": 3, "s1": 1, "s2": 1}),
            (500, {"s0": 1, "s1": 2, "s2": 1}),
            (5000, {"s0": 1, "s1": 1, "s2": 2}),
        ]
        plain: dict[str, Any] = {"seed": 0, "lanes": 8, "window": 4, "seq_len": 32, "weights": weights}
        staged = {
            **plain,
            "lanes": [(0, 8), (2000, 4), (7_000_000, 8)],
            "seq_len": [(0, 32), (2000, 64), (7_000_000, 16)],
        }
        groups = sum(plitzer.index(p).row_groups for p in sources.values())  # indexed once, cached
        print(f"mixture: 3 sources (700 k tokens, {groups} row groups), weight stages at steps 500 and 5000")
        for name, cfg in (("one layout (8 x 32)", plain), ("layout stages at 2000 and 7e6", staged)):
            plitzer.explain(sources, 0, **cfg)  # the first call's imports and caches, timed in no row
            best: dict[tuple[int, str], float] = {}
            for _ in range(repeats):
                for step in steps:
                    took, e = timed(lambda: plitzer.explain(sources, step, **cfg))  # noqa: B023
                    doc = e.select("source", "file", "row_group", "row").head(1)
                    near, got = timed(lambda: plitzer.locate(sources, rows=doc, steps=(step, step + 1000), **cfg))  # noqa: B023
                    assert step in got["step"].to_list()
                    epoch = int(e["epoch"][0])
                    whole, _ = timed(lambda: plitzer.locate(sources, rows=doc, epochs=[epoch], **cfg))  # noqa: B023
                    for what, t in (("explain", took), ("locate", near), ("epoch", whole)):
                        best[(step, what)] = min(best.get((step, what), t), t)
            print(f"  {name}:")
            for step in steps:
                print(
                    f"    step {step:>10,}: explain {best[(step, 'explain')]:6.3f} s, locate one of its documents "
                    f"(1,000 steps) {best[(step, 'locate')]:6.3f} s, over its epoch {best[(step, 'epoch')]:6.3f} s"
                )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--row-groups", type=int, default=100_000)
    ap.add_argument("--docs", type=int, default=100, help="documents per synthetic row group")
    ap.add_argument("--data-row-groups", type=int, default=2_000)
    ap.add_argument("--lanes", type=int, default=512)
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--counts", default="1,100,10000")
    ap.add_argument("--part", choices=["plan", "data", "mixture", "all"], default="all")
    ap.add_argument("--steps", default="1000,10000000", help="the mixture's steps")
    ap.add_argument("--repeats", type=int, default=2, help="the mixture's calls per figure (the best is printed)")
    a = ap.parse_args()
    counts = [int(x) for x in a.counts.split(",")]
    if a.part in ("plan", "all"):
        plan_part(a.row_groups, a.docs, a.lanes, a.window, a.seq_len, counts)
    if a.part in ("data", "all"):
        data_part(a.data_row_groups, min(a.lanes, 64), min(a.window, 8), a.seq_len, counts)
    if a.part in ("mixture", "all"):
        mixture_part([int(x) for x in a.steps.split(",")], a.repeats)


if __name__ == "__main__":
    main()
