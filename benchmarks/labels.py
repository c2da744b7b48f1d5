"""What ``labels=True`` costs (SPEC section 16), and that ``labels=False`` costs nothing.

On FineWeb-shaped synthetic data (``benchmarks/throughput.py``'s), in one process, the
loader's steady state (epochs 1.. of one loader; epoch 0 fills the pipeline) with and without
labels, alternated ``--repeat`` times: CPU ns and wall ns per delivered token, medians, and the
ratio of each with labels to without. Each step's labels are touched (summed) as a trainer's
copy to the device would, and so are its tokens, in both runs.

    python benchmarks/labels.py --tokens 8000000 --threads 2 --repeat 5

``--data DIR`` reads a folder of Parquet files instead (real text: its ``input_ids`` column,
or ``--column``), e.g. at a trainer's shape:

    python benchmarks/labels.py --data data/balance-text-64000000-1000000 --threads 2 \
        --lanes 128 --seq-len 2048 --window 16 --epochs 3 --repeat 5

``--parts`` splits the labelled run's CPU instead: the thread CPU inside the packer's labels of
each sub-piece's last token (``end_labels``), each step's labels made from its tokens as it is
handed out (``step_labels``), the tokens' gather (``gather_layout``), and the consumer's sums, in
ns per delivered token, with labels and without:

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
from pathlib import Path
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
    """Thread CPU inside each part of the labels' cost, in ns per delivered token."""
    import time

    import numpy as np

    import plitzer
    import plitzer.readpath.labels as lab
    from plitzer.bestfit import rows as bins
    from plitzer.readpath import pack

    acc = {"end_labels": 0.0, "step_labels": 0.0, "tokens' gather": 0.0, "consumer's sums": 0.0}
    end_labels, step_labels, gather_layout = lab.end_labels, lab.step_labels, pack.gather_layout

    def timing(name: str, f: Any) -> Any:
        def run(*a: Any, **kw: Any) -> Any:
            t = time.thread_time()
            out = f(*a, **kw)
            acc[name] += time.thread_time() - t
            return out

        return run

    pack.end_labels = bins.end_labels = timing("end_labels", end_labels)  # the packer's: each sub-piece's last
    lab.step_labels = timing("step_labels", step_labels)  # each step's, as it is handed out
    pack.gather_layout = bins.gather_layout = timing("tokens' gather", gather_layout)  # type: ignore[attr-defined]
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


def _token_column(d: Any) -> str:
    """The token column of real data: ``input_ids`` where the files have one, else ``tokens``."""
    import pyarrow.parquet as pq

    names = pq.read_schema(sorted(d.glob("*.parquet"))[0]).names
    return "input_ids" if "input_ids" in names else "tokens"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=None, help="a folder of Parquet files to read instead of the synthetic data")
    ap.add_argument("--column", default=None, help="the token column of --data (default: tokens, or input_ids)")
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

    d = Path(args.data) if args.data else fineweb_shaped(args.tokens, docs=args.docs_per_row_group)
    warm_page_cache(d)
    pa.set_cpu_count(args.threads)
    pa.set_io_thread_count(args.threads)
    column = args.column or ("tokens" if args.data is None else _token_column(d))
    ix = plitzer.index(d, column=column)
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
        print(f"labels={k!s:<6} CPU {cpu:7.2f} ns/token   wall {wall:7.2f} ns/token   {1e3 / wall:6.1f} Mtok/s")
    if not args.without:
        (c0, w0), (c1, w1) = med[False], med[True]
        print(
            f"labels=True against labels=False: tokens/s x{w0 / w1:.2f}, CPU a token x{c1 / c0:.2f} "
            f"(+{c1 - c0:.2f} ns/token), wall a token x{w1 / w0:.2f}"
        )


if __name__ == "__main__":
    main()
