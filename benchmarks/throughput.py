"""The loader's throughput against the raw decode of the same token columns.

In one run, on the same files (page cache), with the same number of threads:

* raw decode: ``pq.read_table(file, columns=[tokens])`` for every file, Arrow's
  thread pool set to the same thread count: the ceiling, since no loader can
  deliver tokens faster than they decode;
* the loader: full (lanes x seq_len) batches, shuffled and packed. Epoch 0 of a
  fresh process pays for growing the process's memory (page faults, slow in this
  VM) and for filling the pipeline (the first window must be decoded before the
  first batch); later epochs show the steady state of a long run.

Also the time to the first batch after resuming at mid-epoch, next to the time to
decode one window at the raw rate (the target).

    python benchmarks/throughput.py --tokens 60000000 --threads 2

``--widths`` measures instead what another integer width costs: the same tokens
written as list<uint16> (widened), list<int64> (narrowed, proved safe by the
footer's min/max) and list<int64> without statistics (narrowed, every value
checked), each read row group by row group with ``plitzer.read.read_chunk`` (one
ranged read, decode, checks, conversion to int32) on one thread, in ns/token and
against the same tokens as list<int32>:

    python benchmarks/throughput.py --widths --tokens 20000000
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from _common import Timing, dataset, timed, warm_page_cache


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=60_000_000)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--lanes", type=int, default=512)
    ap.add_argument("--window", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--widths", action="store_true", help="measure widening and narrowing against int32")
    args = ap.parse_args()
    if args.widths:
        widths(args.tokens)
        return
    d = dataset(args.tokens)
    warm_page_cache(d)
    pa.set_cpu_count(args.threads)
    pa.set_io_thread_count(args.threads)
    files = sorted(d.glob("*.parquet"))

    import plitzer

    settings = {"seed": 0, "lanes": args.lanes, "window": args.window, "seq_len": args.seq_len}
    ix = plitzer.index(d)
    tokens = ix.tokens

    def raw() -> Timing:
        with timed() as t:
            n = 0
            for f in files:
                col = pq.read_table(f, columns=["tokens"], use_threads=True).column(0)
                n += sum(len(c.values) for c in col.chunks)
        assert n == tokens
        return t

    alone = min((raw() for _ in range(3)), key=lambda t: t.wall)  # before any loader exists
    raws = []
    epochs: list[tuple[Timing, int]] = []
    with plitzer.Loader(ix, threads=args.threads, **settings) as loader:  # type: ignore[arg-type]
        for _ in range(args.epochs):
            raws.append(raw())
            with timed() as t:
                steps = 0
                for batch in loader:
                    np.from_dlpack(batch.tokens)
                    steps += 1
            epochs.append((t, steps * args.lanes * args.seq_len))
        peak = loader.peak_bytes
    best_raw = min(raws, key=lambda t: t.wall)
    print(f"{tokens:,} tokens in {len(files)} files, {ix.row_groups} row groups; {args.threads} threads")
    print(f"settings: {settings}")
    print(f"{'reader':<46} {'Mtok/s':>8} {'cores':>6} {'CPU ns/tok':>11} {'vs raw':>7}")
    rate = best_raw.rate(tokens)
    print(
        f"{'raw decode alone (pq.read_table per file)':<46} {alone.rate(tokens):8.1f} {alone.cores():6.2f} "
        f"{alone.ns_per_token(tokens):11.1f} {alone.rate(tokens) / rate:7.2f}"
    )
    print(
        f"{'raw decode between loader epochs, best':<46} {rate:8.1f} {best_raw.cores():6.2f} "
        f"{best_raw.ns_per_token(tokens):11.1f} {1:7.2f}"
    )
    for e, (t, n) in enumerate(epochs):
        label = f"plitzer Loader, epoch {e}" + (" (cold process)" if e == 0 else "")
        print(f"{label:<46} {t.rate(n):8.1f} {t.cores():6.2f} {t.ns_per_token(n):11.1f} {t.rate(n) / rate:7.2f}")
    steady = epochs[1:] or epochs
    wall = sum(t.wall for t, _ in steady)
    cpu = sum(t.cpu for t, _ in steady)
    n = sum(k for _, k in steady)
    print(
        f"steady state (epochs 1..{len(epochs) - 1}): {n / wall / 1e6:.1f} Mtok/s, {cpu / n * 1e9:.1f} CPU ns/token, "
        f"loader / raw decode = {n / wall / 1e6 / rate:.2f}x between epochs, "
        f"{n / wall / 1e6 / alone.rate(tokens):.2f}x against the decode alone (target >= 0.9x); "
        f"peak held {peak / 2**20:.0f} MiB"
    )

    # Resume at mid-epoch: time to the first batch, against one window's decode.
    with plitzer.Loader(ix, threads=args.threads, **settings) as loader:  # type: ignore[arg-type]
        half = len(loader) // 2
        for _ in range(half):
            loader.next_batch()
        state = loader.checkpoint()
    t0 = time.perf_counter()
    with plitzer.Loader(ix, threads=args.threads, **settings) as again:  # type: ignore[arg-type]
        construct = time.perf_counter() - t0
        again.resume(state)
        again.next_batch()
        first = time.perf_counter() - t0
        # The windows the lanes stand in: (epoch, window) of every lane's position.
        units = len({(int(e), int(w)) for _, e, w, _, _ in plitzer.state.decode(again.checkpoint()).positions})
    # The reference: decoding, at the raw rate, the windows that step's tokens lie in
    # (run tokens [half * B * L, (half + 1) * B * L) of epoch 0: the window the lanes
    # stand in, and the next one when the step crosses into it).
    ep = again.plan.epoch(0)
    starts = np.cumsum(ep.window_tokens) - ep.window_tokens
    per_step = args.lanes * args.seq_len
    w0 = int(np.searchsorted(starts, half * per_step, side="right")) - 1
    w1 = int(np.searchsorted(starts, (half + 1) * per_step - 1, side="right")) - 1
    need = int(ep.window_tokens[w0 : w1 + 1].sum())
    window_decode = need / (rate * 1e6)
    print(
        f"resume at step {half}: first batch after {first:.3f} s (construct {construct:.3f} s); lanes span "
        f"{units} windows and the step reaches {w1 - w0 + 1} ({need:,} tokens), which decode in "
        f"{window_decode:.3f} s at the raw rate: {first / window_decode:.2f}x (target 1.2x)"
    )


def widths(tokens: int, repeats: int = 5) -> None:
    """ns/token of read_chunk over the same tokens stored at other widths, against int32."""
    import tempfile

    import planner
    from plitzer.read import read_chunk, to_tokens

    d = dataset(tokens)
    src = pq.read_table(sorted(d.glob("*.parquet"))[0].parent, columns=["tokens"]).column(0).combine_chunks()
    rows_per_group = 200  # about 200k tokens: decoded memory is reused, not page-faulted
    cases = {
        "int32": (pa.int32(), True),
        "uint16 (widened)": (pa.uint16(), True),
        "int64, min/max fit (narrowed, unchecked)": (pa.int64(), True),
        "int64, no statistics (narrowed, checked)": (pa.int64(), False),
    }
    with tempfile.TemporaryDirectory() as tmp:
        results = {}
        for name, (typ, stats) in cases.items():
            folder = os.path.join(tmp, name.split()[0] + ("" if stats else "-nostats"))
            os.makedirs(folder)
            pq.write_table(
                pa.table({"tokens": src.cast(pa.list_(typ))}),
                os.path.join(folder, "data.parquet"),
                row_group_size=rows_per_group,
                write_statistics=stats,
                compression="zstd",
            )
            warm_page_cache(__import__("pathlib").Path(folder))
            ix = planner.index(folder)
            n = ix.tokens
            best = None
            for _ in range(repeats):
                with timed() as t:
                    got = sum(len(read_chunk(ix, rg).values) for rg in range(ix.row_groups))
                assert got == n
                best = t if best is None or t.wall < best.wall else best
            assert best is not None
            results[name] = best.wall / n * 1e9
            # The conversion alone (cast, plus the range check where needs_check): on
            # chunks decoded as the file holds them.
            f = ix.frame
            raw = [
                pq.ParquetFile(os.path.join(folder, "data.parquet")).read_row_group(g).column(0).chunk(0)
                for g in range(ix.row_groups)
            ]
            conv = float("inf")
            for _ in range(repeats):
                t0 = time.perf_counter()
                for a, c in zip(raw, f["needs_check"], strict=True):
                    to_tokens(a, ix.dtype, check=bool(c), where="")
                conv = min(conv, time.perf_counter() - t0)
            checked = int(f["needs_check"].sum())
            print(
                f"{name:<44} {results[name]:6.2f} ns/token read_chunk, {conv / n * 1e9:5.2f} ns/token "
                f"conversion alone ({checked}/{ix.row_groups} row groups checked)"
            )
        base = results["int32"]
        for name, ns in results.items():
            print(f"{name:<44} {ns / base:5.2f}x int32, {ns - base:+.2f} ns/token")


if __name__ == "__main__":
    main()
