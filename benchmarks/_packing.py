"""``throughput.py --packing best-fit``: best-fit's real tokens against concat's, and its padding.

In one process, on the same index (page cache warm), alternated ``--repeat`` times: one
loader of each rule, each timed over ``--epochs`` steady-state epochs (after a first that
fills its pipeline), concat then best-fit then concat ... . A rule's *real* tokens are
what its rows hold less the padding: an epoch label delivers every real token once, so
real tokens are the steps times the lanes over the epoch's units (tokens under concat,
bins under best-fit) times the dataset's tokens. Printed: real Mtok/s, cores, CPU ns
per real token, and best-fit's ratios to concat (targets: 0.9x the rate, within 1.15x
the CPU). Then, from the plan tables alone (the bins pass, cached), the padding
fraction at each of ``--padding-lengths`` against its floor (``ceil(T_g / L)`` bins a
row group), and the bins pass's time and its bytes a row group.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

from _common import Timing, timed

from planner.rules import rule_named


def _steady(ix: Any, settings: dict[str, Any], epochs: int) -> tuple[Timing, float]:
    """``epochs`` steady-state epochs of one loader: their timing and the real tokens they delivered."""
    import plitzer

    with plitzer.Loader(ix, **settings) as loader:
        units = loader.plan.epoch_tokens  # tokens (concat) or bins (best-fit) an epoch
        for _ in loader:  # epoch 0 fills the pipeline
            pass
        steps = 0
        with timed() as t:
            for _ in range(epochs):
                steps += sum(1 for _ in loader)
        per_row = rule_named(settings.get("packing", "concat")).units_per_row(settings["seq_len"])
        real = steps * settings["lanes"] * per_row / units * ix.tokens
    return t, real


def packing_cost(args: argparse.Namespace, ix: Any, settings: dict[str, Any]) -> None:
    import planner
    import plitzer

    rules = {"concat": {**settings}, "best-fit": {**settings, "packing": "best-fit", "pad_id": 0}}
    from plitzer.bestfit.counts import BinSpec, count_chunk

    t0 = time.perf_counter()
    count_chunk(ix, BinSpec(settings["seq_len"]), 0, ix.row_groups)  # the bins pass's work, uncached, on one thread
    first_pass = time.perf_counter() - t0
    got: dict[str, list[tuple[Timing, float]]] = {k: [] for k in rules}
    for _ in range(args.repeat):
        for name, cfg in rules.items():
            got[name].append(_steady(ix, cfg, args.epochs))
    print(f"{ix.tokens:,} tokens, {ix.row_groups} row groups; plitzer from {Path(plitzer.__file__).parent.parent}")
    print(f"settings: {settings}; {args.repeat} alternated runs of {args.epochs} steady-state epochs each, medians")
    print(f"{'rule':<10} {'real Mtok/s':>12} {'cores':>6} {'CPU ns/real tok':>16}")
    med: dict[str, tuple[float, float]] = {}
    for name, runs in got.items():
        rate = statistics.median(real / t.wall / 1e6 for t, real in runs)
        ns = statistics.median(t.cpu / real * 1e9 for t, real in runs)
        cores = statistics.median(t.cores() for t, _ in runs)
        med[name] = (rate, ns)
        print(f"{name:<10} {rate:12.1f} {cores:6.2f} {ns:16.2f}")
    (rc, nc), (rb, nb) = med["concat"], med["best-fit"]
    print(
        f"best-fit against concat: {rb / rc:.2f}x the real tokens/s (target 0.9x), {nb / nc:.2f}x the CPU "
        f"per real token (target within 1.15x); the bins pass, uncached on one thread, {first_pass:.2f} s "
        f"({first_pass / ix.row_groups * 1e3:.1f} ms a row group: its read, decode and binning; 8 B a row group kept)"
    )
    print(f"{'seq_len':>8} {'bins':>10} {'padding':>9} {'floor':>9}")
    for length in (int(x) for x in args.padding_lengths.split(",")):
        p = planner.plan(ix, lanes=1, window=settings["window"], seq_len=length, packing="best-fit")
        rg = p.row_groups(0)
        bins, pad, tok = int(rg["bins"].sum()), int(rg["padding"].sum()), rg["tokens"].to_numpy()
        floor = int(((tok + length - 1) // length * length - tok).sum())
        print(f"{length:8d} {bins:10,d} {pad / (bins * length):9.4%} {floor / (bins * length):9.4%}")
