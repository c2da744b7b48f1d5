"""The loader's throughput against the raw decode of the same token columns.

In one run, on the same files (page cache), with the same number of threads:

* raw decode: ``pq.read_table(file, columns=[tokens])`` for every file (Arrow's
  own thread pool set to the same thread count): the ceiling, since no loader
  can deliver tokens faster than they decode;
* the loader: one epoch of full (lanes x seq_len) batches, shuffled and packed.

Also the time to the first batch after resuming at mid-epoch, next to the time
to read and pack one window's share for the rank (the target).

    python benchmarks/throughput.py --tokens 60000000 --threads 2
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from _common import dataset, timed, warm_page_cache


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=60_000_000)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--lanes", type=int, default=512)
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    d = dataset(args.tokens)
    warm_page_cache(d)
    pa.set_cpu_count(args.threads)
    pa.set_io_thread_count(args.threads)
    files = sorted(d.glob("*.parquet"))

    import plitzer

    settings = {"seed": 0, "lanes": args.lanes, "window": args.window, "seq_len": args.seq_len}
    ix = plitzer.index(d)
    tokens = ix.tokens
    raw_best = None
    loader_best = None
    for _ in range(args.repeat):
        with timed() as raw:
            n = 0
            for f in files:
                col = pq.read_table(f, columns=["tokens"], use_threads=True).column(0)
                n += sum(len(c.values) for c in col.chunks)
        assert n == tokens
        raw_best = raw if raw_best is None or raw.wall < raw_best.wall else raw_best
        with plitzer.Loader(ix, threads=args.threads, **settings) as loader, timed() as t:
            steps = 0
            for batch in loader:
                np.from_dlpack(batch.tokens)
                steps += 1
        delivered = steps * args.lanes * args.seq_len
        loader_best = t if loader_best is None or t.wall < loader_best.wall else loader_best
    assert raw_best is not None and loader_best is not None
    print(f"{tokens:,} tokens in {len(files)} files, {ix.row_groups} row groups; {args.threads} threads")
    print(f"settings: {settings}; best of {args.repeat}")
    print(f"{'reader':<44} {'Mtok/s':>8} {'cores':>6} {'CPU ns/tok':>11}")
    print(
        f"{'raw decode (pq.read_table per file)':<44} {raw_best.rate(tokens):8.1f} "
        f"{raw_best.cores():6.2f} {raw_best.ns_per_token(tokens):11.1f}"
    )
    print(
        f"{'plitzer Loader, one epoch (shuffled, packed)':<44} {loader_best.rate(delivered):8.1f} "
        f"{loader_best.cores():6.2f} {loader_best.ns_per_token(delivered):11.1f}"
    )
    ratio = loader_best.rate(delivered) / raw_best.rate(tokens)
    print(f"loader / raw decode: {ratio:.2f}x (target >= 0.9x)")

    # Resume at mid-epoch: time to the first batch, against one window's share.
    with plitzer.Loader(ix, threads=args.threads, **settings) as loader:
        half = len(loader) // 2
        for _ in range(half):
            loader.next_batch()
        state = loader.checkpoint()
    t0 = time.perf_counter()
    with plitzer.Loader(ix, threads=args.threads, **settings) as again:
        construct = time.perf_counter() - t0
        again.resume(state)
        again.next_batch()
        first = time.perf_counter() - t0
        units = len(set(again._unit))
    window_share = args.window * (tokens / ix.row_groups) / (raw_best.rate(tokens) * 1e6)
    print(
        f"resume at step {half}: first batch after {first:.3f} s (construct {construct:.3f} s); "
        f"lanes span {units} windows; one window decodes in about {window_share:.3f} s at the raw rate"
    )


if __name__ == "__main__":
    main()
