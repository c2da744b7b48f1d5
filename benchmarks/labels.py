"""What ``labels=True`` costs (SPEC section 16), and that ``labels=False`` costs nothing.

On FineWeb-shaped synthetic data (``benchmarks/throughput.py``'s), in one process, the
loader's steady state (epochs 1.. of one loader; epoch 0 fills the pipeline) with and without
labels, alternated ``--repeat`` times: CPU ns and wall ns per delivered token, medians, and the
ratio of each with labels to without. Each step's labels are touched (summed) as a trainer's
copy to the device would, and so are its tokens, in both runs.

    python benchmarks/labels.py --tokens 8000000 --threads 2 --repeat 5

``--parts`` splits the labelled run's CPU instead: the thread CPU inside the shifted copy of
each row group (``label_values``), the labels' gather and the tokens' (``gather_layout``), and
the consumer's sums, in ns per delivered token, with labels and without:

    python benchmarks/labels.py --parts --tokens 8000000 --threads 2

``--packing best-fit`` measures the same under best-fit. ``--without`` times ``labels=False``
alone, so that two versions of plitzer compare by ``PYTHONPATH`` (a version before labels
has no such setting), alternated:

    for i in 1 2 3; do for src in /path/to/main /path/to/branch; do
      PYTHONPATH=$src python benchmarks/labels.py --without --tokens 8000000 --threads 2 --repeat 1; done; done
"""

from __future__ import annotations

import argparse
import os
import statistics
from typing import Any

from _common import Timing, timed, warm_page_cache
from throughput import fineweb_shaped


def steady(ix: Any, settings: dict[str, Any], epochs: int, labels: bool) -> tuple[Timing, int]:
    """Epochs 1..``epochs`` of one loader (epoch 0 fills the pipeline): the timing and the tokens delivered."""
    import numpy as np

    import plitzer

    extra = {"labels": True} if labels else {}
    with plitzer.Loader(ix, **settings, **extra) as loader:
        for _ in loader:
            pass
        n = 0
        with timed() as t:
            for _ in range(epochs):
                for b in loader:
                    int(np.asarray(b.tokens).sum())
                    if labels:
                        int(np.asarray(b.labels).sum())
                    n += b.tokens.size
    return t, n


def parts(ix: Any, settings: dict[str, Any], epochs: int) -> None:
    """Thread CPU inside each part of the labels' cost, in ns per delivered token (concat's direct gather)."""
    import time

    import numpy as np

    import plitzer
    import plitzer.readpath.labels as lab
    from plitzer.readpath import pack

    acc = {"label_values": 0.0, "labels' gather": 0.0, "tokens' gather": 0.0, "consumer's sums": 0.0}
    label_values, gather_layout = lab.label_values, pack.gather_layout

    def timed_values(arr: Any) -> Any:
        t = time.thread_time()
        out = label_values(arr)
        acc["label_values"] += time.thread_time() - t
        return out

    def timed_gather(lists: Any, list_of: Any, length: Any, dtype: Any, block_at: Any) -> Any:
        t = time.thread_time()
        out = gather_layout(lists, list_of, length, dtype, block_at)
        acc["labels' gather" if dtype == lab.LABEL_STORAGE else "tokens' gather"] += time.thread_time() - t
        return out

    lab.label_values, pack.gather_layout = timed_values, timed_gather
    for labels in (False, True):
        with plitzer.Loader(ix, **settings, labels=labels) as loader:
            for _ in loader:
                pass
            acc.update(dict.fromkeys(acc, 0.0))
            n, c0 = 0, time.process_time()
            for _ in range(epochs):
                for b in loader:
                    t = time.thread_time()
                    int(np.asarray(b.tokens).sum())
                    if labels:
                        int(np.asarray(b.labels).sum())
                    acc["consumer's sums"] += time.thread_time() - t
                    n += b.tokens.size
            cpu = (time.process_time() - c0) / n * 1e9
        shown = ", ".join(f"{k} {v / n * 1e9:.2f}" for k, v in acc.items())
        print(f"labels={labels!s:<6} CPU {cpu:.2f} ns/token; of it {shown}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=8_000_000)
    ap.add_argument("--docs-per-row-group", type=int, default=800)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--lanes", type=int, default=16)
    ap.add_argument("--window", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--budget", type=int, default=2 << 30)
    ap.add_argument("--epochs", type=int, default=2, help="steady-state epochs (after the first)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--packing", default="concat", choices=["concat", "best-fit"])
    ap.add_argument("--without", action="store_true", help="labels=False alone (to compare versions)")
    ap.add_argument("--parts", action="store_true", help="split the labels' CPU by part")
    args = ap.parse_args()
    import pyarrow as pa

    import plitzer

    d = fineweb_shaped(args.tokens, docs=args.docs_per_row_group)
    warm_page_cache(d)
    pa.set_cpu_count(args.threads)
    pa.set_io_thread_count(args.threads)
    ix = plitzer.index(d, column="tokens")
    settings = {
        "seed": 0,
        "lanes": args.lanes,
        "window": args.window,
        "seq_len": args.seq_len,
        "budget": args.budget,
        "threads": args.threads,
        **({"packing": args.packing} if args.packing != "concat" else {}),
    }
    print(f"plitzer: {os.path.dirname(os.path.dirname(plitzer.__file__))}")
    print(f"{ix.tokens:,} tokens, {ix.row_groups} row groups; {settings}; medians of {args.repeat} alternated runs")
    if args.parts:
        parts(ix, settings, args.epochs)
        return
    kinds = [False] if args.without else [False, True]
    runs: dict[bool, list[tuple[Timing, int]]] = {k: [] for k in kinds}
    for _ in range(args.repeat):
        for k in kinds:
            runs[k].append(steady(ix, settings, args.epochs, k))
    med: dict[bool, tuple[float, float]] = {}
    for k in kinds:
        cpu = statistics.median(t.cpu / n * 1e9 for t, n in runs[k])
        wall = statistics.median(t.wall / n * 1e9 for t, n in runs[k])
        med[k] = cpu, wall
        print(f"labels={k!s:<6} CPU {cpu:7.2f} ns/token   wall {wall:7.2f} ns/token")
    if not args.without:
        (c0, w0), (c1, w1) = med[False], med[True]
        print(f"labels=True against labels=False: CPU x{c1 / c0:.2f} (+{c1 - c0:.2f} ns/token), wall x{w1 / w0:.2f}")


if __name__ == "__main__":
    main()
