"""The loader's throughput against the fastest raw decode of the same token columns.

In one process, on the same files (page cache), with the same number of threads,
alternated ``--repeat`` times so that drift in the machine's speed hits every row:

* the decode, two ways, and the faster of the two is the reference (a ratio against
  a slower decode would flatter the loader): ``pq.read_table(file, columns=[col])``
  for every file on Arrow's thread pool, and ``ParquetFile(f, metadata=cached,
  pre_buffer=True).read_row_group(g, columns=[col], use_threads=False)`` for every
  row group on N threads (what the loader itself runs);
* the loader, one epoch from construction (``Loader(index, ...)`` then every batch of
  epoch 0: what a short run sees, first window included);
* the loader's steady state: epochs 1.. of one loader, back to back (a long run; the
  decodes are not timed in between, since the loader's threads would go on reading
  ahead meanwhile).

Each row prints tokens/s, cores used, CPU ns/token, and the ratio to the reference;
the CPU ratio (loader ns/token over the decode's) is what the hot path adds. The last
column, minor page faults per million tokens, is memory touched for the first time: a
first epoch grows the loader's memory to the windows in flight, a later one reuses it.

    python benchmarks/throughput.py --tokens 38000000 --threads 2

Two versions of plitzer compare on the same data by ``PYTHONPATH`` (the first line
printed says which one ran), alternated, on a quiet machine (a busy one moves the
ratios by more than the difference):

    for i in 1 2; do for src in /path/to/main /path/to/branch; do
      PYTHONPATH=$src python benchmarks/throughput.py --tokens 34560000 --docs-per-row-group 200 \
        --threads 2 --lanes 64 --seq-len 2048 --window 8 --epochs 2 --repeat 3; done; done

``--lanes-sweep 64,512,4096`` measures the time per step at those lane counts with
the same tokens per step (seq_len scaled down as lanes go up): the per-step work
should not grow with lanes.

``--widths`` measures instead what another integer width costs: the same tokens
written as list<uint16> (widened), list<int64> (narrowed, proved safe by the
footer's min/max) and list<int64> without statistics (narrowed, every value
checked), each read row group by row group with ``plitzer.readpath.read.read_chunk`` (one
ranged read, decode, checks, conversion to int32) on one thread, in ns/token and
against the same tokens as list<int32>:

    python benchmarks/throughput.py --widths --tokens 20000000

``--parts`` splits the loader's steady-state CPU by part instead: the CPU time of the
threads inside reading and decoding (``read_chunk``), the pack's gather, the rest of the
pack (its tables), the straddling steps' copy (``assemble``) and the consumer's thread,
each in ns per delivered token, best of ``--repeat`` epochs, beside the raw decode's (the
figures of docs/design.md, "Where the last third is"; CPU inside a part is what a busy
machine disturbs least), and the same parts in the loader's first epoch (where its memory
grows to the windows in flight: docs/benchmarks.md, "What a first epoch costs"):

    python benchmarks/throughput.py --parts --tokens 34560000 --docs-per-row-group 200 --threads 2 --repeat 5

``--packing best-fit`` measures best-fit packing (SPEC section 15) against concat on the same
data, alternated: real tokens per second and CPU per real token (padding not counted), and
the padding fraction against its floor at several sequence lengths (``benchmarks/_packing.py``):

    python benchmarks/throughput.py --packing best-fit --data data/text --column input_ids --threads 2 --repeat 3

``--columns`` measures what aligned columns cost (SPEC section 13): the same files with a
bool ``loss_mask`` and a float32 ``weight`` beside the tokens, the loader's steady state
with ``columns=["loss_mask", "weight"]`` against tokens alone, alternated ``--repeat``
times; and, as the yardstick, the raw decode of the three columns against the token
column alone (``pq.read_table``). The extra cost should follow the extra bytes (1 + 4 per
token against the tokens' 4), not a second packing:

    python benchmarks/throughput.py --columns --tokens 4000000 --docs-per-row-group 200 --lanes 16 --window 4
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from _common import Timing, timed, warm_page_cache


def fineweb_shaped(tokens: int, root: str | None = None, docs: int = 800) -> Path:
    """Synthetic FineWeb-Edu-shaped data: 12 row groups of ``docs`` documents a file, lognormal
    lengths (mean 900), Zipf ids, zstd; generated once and kept."""
    import plitzer.synth

    base = Path(root or os.environ.get("PLITZER_BENCH_DATA", "data"))
    d = base / (f"fineweb-{tokens // 1_000_000}M" + ("" if docs == 800 else f"-{docs}docs"))
    if not (d / ".done").exists():
        print(f"generating {tokens:,} tokens into {d} ...", flush=True)
        plitzer.synth.write(d, tokens=tokens, seed=0, mean_length=900, docs_per_row_group=docs, row_groups_per_file=12)
        (d / ".done").write_text("ok")
    return d


class Decoders:
    """The two raw decodes of the token column, each timed as a whole pass."""

    def __init__(self, d: Path, column: str, threads: int) -> None:
        self.files = sorted(d.glob("*.parquet"))
        self.column = column
        self.threads = threads
        self.footers = [pq.read_metadata(f) for f in self.files]
        self.groups = [(i, g) for i, md in enumerate(self.footers) for g in range(md.num_row_groups)]

    def read_table(self) -> int:
        n = 0
        for f in self.files:
            col = pq.read_table(f, columns=[self.column], use_threads=True).column(0)
            n += sum(len(c.values) for c in col.chunks)
        return n

    def row_groups(self) -> int:
        def one(ig: tuple[int, int]) -> int:
            i, g = ig
            pf = pq.ParquetFile(self.files[i], metadata=self.footers[i], pre_buffer=True)
            col = pf.read_row_group(g, columns=[self.column], use_threads=False).column(0)
            return sum(len(c.values) for c in col.chunks)

        with ThreadPoolExecutor(self.threads) as pool:
            return sum(pool.map(one, self.groups))


def row(label: str, t: Timing, n: int, ref: Timing, ref_n: int) -> str:
    ratio = t.rate(n) / ref.rate(ref_n)
    cpu = t.ns_per_token(n) / ref.ns_per_token(ref_n)
    faults = t.faults / n * 1e6
    rate, ns = t.rate(n), t.ns_per_token(n)
    return f"{label:<44} {rate:8.1f} {t.cores():6.2f} {ns:11.1f} {ratio:8.2f} {cpu:8.2f} {faults:11.0f}"


def median_timing(ts: list[Timing]) -> Timing:
    """The run of median wall time (its CPU with it)."""
    return sorted(ts, key=lambda t: t.wall)[len(ts) // 2]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=38_000_000)
    ap.add_argument("--data", help="a Parquet folder (default: FineWeb-shaped synthetic data of --tokens)")
    ap.add_argument("--column", default=None)
    ap.add_argument(
        "--docs-per-row-group",
        type=int,
        default=800,
        help="documents per row group of the synthetic data (200 with --tokens 34560000: 192 row groups of 200)",
    )
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--lanes", type=int, default=64)
    ap.add_argument("--window", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--budget", type=int, default=2 << 30)
    ap.add_argument("--epochs", type=int, default=3, help="steady-state epochs (after the first)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--lanes-sweep", default="", help="comma-separated lane counts for the per-step sweep")
    ap.add_argument("--widths", action="store_true", help="measure widening and narrowing against int32")
    ap.add_argument("--columns", action="store_true", help="measure a bool and a float32 aligned column")
    ap.add_argument("--parts", action="store_true", help="split the loader's steady-state CPU by part")
    ap.add_argument(
        "--packing", default="concat", choices=["concat", "best-fit"], help="best-fit: its real tokens against concat's"
    )
    ap.add_argument("--padding-lengths", default="2048,8192,32768", help="with --packing best-fit: seq_lens to pad at")
    args = ap.parse_args()
    if args.widths:
        widths(args.tokens)
        return
    if args.columns:
        columns_cost(args)
        return
    d = Path(args.data) if args.data else fineweb_shaped(args.tokens, docs=args.docs_per_row_group)
    warm_page_cache(d)
    pa.set_cpu_count(args.threads)
    pa.set_io_thread_count(args.threads)

    import plitzer

    ix = plitzer.index(d, column=args.column)
    tokens = ix.tokens
    dec = Decoders(d, ix.column, args.threads)
    settings = {
        "seed": 0,
        "lanes": args.lanes,
        "window": args.window,
        "seq_len": args.seq_len,
        "budget": args.budget,
        "threads": args.threads,
    }
    if args.lanes_sweep:
        sweep(ix, settings, [int(x) for x in args.lanes_sweep.split(",")])
        return
    if args.parts:
        parts(ix, dec, settings, args.repeat)
        return
    if args.packing == "best-fit":
        from _packing import packing_cost

        packing_cost(args, ix, settings)
        return

    def epoch_from_construction() -> tuple[Timing, int]:
        with timed() as t, plitzer.Loader(ix, **settings) as loader:  # type: ignore[arg-type]
            steps = sum(1 for _ in loader)
        return t, steps * args.lanes * args.seq_len

    decodes: dict[str, list[Timing]] = {"read_table": [], "row_groups": []}
    cold: list[tuple[Timing, int]] = []
    for _ in range(args.repeat):
        for name, fn in (("read_table", dec.read_table), ("row_groups", dec.row_groups)):
            with timed() as t:
                assert fn() == tokens
            decodes[name].append(t)
        cold.append(epoch_from_construction())
    # The steady state: epochs back to back, nothing else running (between epochs the
    # loader's threads go on reading ahead, so anything timed in between would flatter it).
    steady: list[tuple[Timing, int]] = []
    with plitzer.Loader(ix, **settings) as loader:  # type: ignore[arg-type]
        for _ in loader:  # epoch 0: fill the pipeline
            pass
        for _ in range(args.epochs):
            with timed() as t:
                steps = sum(1 for _ in loader)
            steady.append((t, steps * args.lanes * args.seq_len))
        stats = loader.stats
    for name, fn in (("read_table", dec.read_table), ("row_groups", dec.row_groups)):
        with timed() as t:
            fn()
        decodes[name].append(t)
    meds = {k: median_timing(v) for k, v in decodes.items()}
    best_name = min(meds, key=lambda k: meds[k].wall)
    ref = meds[best_name]
    print(f"{tokens:,} tokens in {len(dec.files)} files, {ix.row_groups} row groups; {args.threads} threads")
    print(f"plitzer from {Path(plitzer.__file__).parent.parent}")
    print(f"settings: {settings}; medians of {args.repeat} (decodes: {len(decodes['read_table'])}) alternated runs")
    head = f"{'reader':<44} {'Mtok/s':>8} {'cores':>6} {'CPU ns/tok':>11} {'vs ref':>8} {'CPU x':>8}"
    print(f"{head} {'faults/Mtok':>11}")
    print(row("decode: pq.read_table per file (threads)", meds["read_table"], tokens, ref, tokens))
    print(row("decode: read_row_group on N threads", meds["row_groups"], tokens, ref, tokens))
    c = median_timing([t for t, _ in cold])
    cn = cold[0][1]
    print(row("plitzer, one epoch from construction", c, cn, ref, tokens))
    wall = sum(t.wall for t, _ in steady)
    cpu = sum(t.cpu for t, _ in steady)
    n = sum(k for _, k in steady)
    st = Timing(wall, cpu, sum(t.faults for t, _ in steady))
    print(row(f"plitzer, steady state (epochs 1..{args.epochs})", st, n, ref, tokens))
    print(
        f"reference: {best_name}. From construction {c.rate(cn) / ref.rate(tokens):.2f}x (target 0.9x), steady "
        f"state {st.rate(n) / ref.rate(tokens):.2f}x (target 0.95x), CPU per token "
        f"{st.ns_per_token(n) / ref.ns_per_token(tokens):.2f}x the decode's (target 1.1x); peak held "
        f"{stats.peak_bytes / 2**20:.0f} MiB, consumer waited {stats.wait_seconds:.2f} s"
    )


PARTS = {
    "read and decode (read_chunk)": ("plitzer.readpath.scan", "read_chunk"),
    "pack": ("plitzer.readpath.scan", "pack_unit"),
    "pack: the gather": ("plitzer.readpath.pack", "gather_lists"),
    "straddling steps (assemble)": ("plitzer.readpath.steps", "assemble"),
}
"""The parts ``--parts`` times: each one's name, and the module and function wrapped for it (as the caller
looks it up)."""


def parts(ix: object, dec: Decoders, settings: dict[str, int], repeat: int) -> None:
    """The loader's steady-state CPU per token, part by part (thread CPU inside each), beside the decode's."""
    import importlib
    import threading
    from collections import Counter
    from typing import Any

    import plitzer

    spent: Counter[str] = Counter()
    lock = threading.Lock()

    def wrap(module: Any, name: str, part: str) -> None:
        fn: Callable[..., Any] = getattr(module, name)

        def timed_part(*a: Any, **k: Any) -> Any:
            t = time.thread_time()
            try:
                return fn(*a, **k)
            finally:
                with lock:
                    spent[part] += time.thread_time() - t

        setattr(module, name, timed_part)

    for part, (module, name) in PARTS.items():
        wrap(importlib.import_module(module), name, part)

    def epoch(loader: Any) -> dict[str, float]:
        """One epoch's CPU per delivered token, part by part."""
        spent.clear()
        with timed() as t:
            c = time.thread_time()
            n = sum(1 for _ in loader) * settings["lanes"] * settings["seq_len"]
            spent["consumer thread (all of it)"] = time.thread_time() - c
        spent["whole process"] = t.cpu
        # A part may not run inside an epoch on small data (the readers packed it ahead): absent then.
        return {k: v / n * 1e9 for k, v in spent.items()}

    best: dict[str, float] = {}
    decode = min(timed_pass(dec.row_groups) for _ in range(repeat)) / ix.tokens * 1e9  # type: ignore[attr-defined]
    with plitzer.Loader(ix, **settings) as loader:  # type: ignore[arg-type]
        first = epoch(loader)  # a new loader's first epoch: its memory grows to the windows in flight
        for _ in range(repeat):
            for k, v in epoch(loader).items():
                best[k] = min(best.get(k, float("inf")), v)
    for got in (first, best):
        got["pack: its tables"] = got.get("pack", 0.0) - got.get("pack: the gather", 0.0)
    print(f"plitzer from {Path(plitzer.__file__).parent.parent}; settings {settings}; best of {repeat}")
    print(f"{'part (ns per delivered token)':<44} {'steady':>7} {'/decode':>8} {'epoch 0':>8}")
    print(f"{'raw decode (read_row_group on N threads)':<44} {decode:7.2f} {1:8.2f}")
    for k in sorted(best, key=lambda k: -best[k]):
        print(f"{k:<44} {best[k]:7.2f} {best[k] / decode:8.2f} {first.get(k, 0.0):8.2f}")


def timed_pass(fn: Callable[[], int]) -> float:
    """CPU seconds of one call (all threads)."""
    with timed() as t:
        fn()
    return t.cpu


def sweep(ix: object, settings: dict[str, int], lane_counts: list[int]) -> None:
    """Per-step wall and CPU time at several lane counts, same tokens per step, steady state."""
    import plitzer

    per_step = settings["lanes"] * settings["seq_len"]
    print(f"{'lanes':>6} {'seq_len':>8} {'steps':>6} {'ms/step':>9} {'CPU ms/step':>12} {'vs first':>9}")
    first = None
    for lanes in lane_counts:
        seq_len = per_step // lanes
        cfg = {**settings, "lanes": lanes, "seq_len": seq_len}
        with plitzer.Loader(ix, **cfg) as loader:  # type: ignore[arg-type]
            for _ in loader:
                pass
            times = []
            for _ in range(2):
                with timed() as t:
                    steps = sum(1 for _ in loader)
                times.append((t, steps))
        wall = statistics.median(t.wall / k for t, k in times) * 1e3
        cpu = statistics.median(t.cpu / k for t, k in times) * 1e3
        first = first or wall
        print(f"{lanes:6d} {seq_len:8d} {times[0][1]:6d} {wall:9.3f} {cpu:12.3f} {wall / first:9.2f}")


def widths(tokens: int, repeats: int = 5) -> None:
    """ns/token of read_chunk over the same tokens stored at other widths, against int32."""
    import tempfile

    import planner
    from plitzer.readpath.read import read_chunk, to_tokens

    d = fineweb_shaped(tokens)
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


def with_columns(src: Path) -> Path:
    """``src``'s files with ``loss_mask`` (bool: the id is even) and ``weight`` (float32) beside the tokens; kept."""
    import numpy as np
    import pyarrow.compute as pc

    d = src.parent / (src.name + "-columns")
    if (d / ".done").exists():
        return d
    d.mkdir(parents=True, exist_ok=True)
    for f in sorted(src.glob("*.parquet")):
        pf = pq.ParquetFile(f)
        writer = None
        for g in range(pf.num_row_groups):
            t = pf.read_row_group(g)
            ids = t.column("tokens").combine_chunks()
            flat = pc.list_flatten(ids)
            v = flat.to_numpy()
            mask = pa.ListArray.from_arrays(ids.offsets, pa.array(v % 2 == 0))
            weight = pa.ListArray.from_arrays(ids.offsets, pa.array((v % 7).astype(np.float32) / 7))
            t = t.append_column("loss_mask", mask).append_column("weight", weight)
            if writer is None:
                writer = pq.ParquetWriter(d / f.name, t.schema, compression="zstd")
            writer.write_table(t, row_group_size=len(t))
        assert writer is not None
        writer.close()
    (d / ".done").write_text("ok")
    return d


def columns_cost(args: argparse.Namespace) -> None:
    """Steady-state throughput with a bool and a float32 aligned column against tokens alone."""
    import plitzer

    d = with_columns(fineweb_shaped(args.tokens, docs=args.docs_per_row_group))
    warm_page_cache(d)
    pa.set_cpu_count(args.threads)
    pa.set_io_thread_count(args.threads)
    ix = plitzer.index(d, column="tokens")
    tokens = ix.tokens
    files = sorted(d.glob("*.parquet"))
    settings = {
        "seed": 0,
        "lanes": args.lanes,
        "window": args.window,
        "seq_len": args.seq_len,
        "budget": args.budget,
        "threads": args.threads,
    }

    def decode(cols: list[str]) -> Timing:
        with timed() as t:
            for f in files:
                pq.read_table(f, columns=cols, use_threads=True)
        return t

    def steady(cols: list[str] | None) -> tuple[Timing, int]:
        with plitzer.Loader(ix, columns=cols, **settings) as loader:  # type: ignore[arg-type]
            for _ in loader:  # epoch 0 fills the pipeline
                pass
            with timed() as t:
                n = 0
                for _ in range(args.epochs):
                    n += sum(1 for _ in loader)
        return t, n * args.lanes * args.seq_len

    runs: dict[str, list[tuple[Timing, int]]] = {"tokens": [], "columns": []}
    dec: dict[str, list[Timing]] = {"tokens": [], "columns": []}
    for _ in range(args.repeat):
        dec["tokens"].append(decode(["tokens"]))
        dec["columns"].append(decode(["tokens", "loss_mask", "weight"]))
        runs["tokens"].append(steady(None))
        runs["columns"].append(steady(["loss_mask", "weight"]))
    print(f"{tokens:,} tokens in {len(files)} files, {ix.row_groups} row groups; {args.threads} threads")
    print(f"settings: {settings}; steady state epochs 1..{args.epochs}; medians of {args.repeat} alternated runs")
    print(f"{'run':<52} {'Mtok/s':>8} {'cores':>6} {'CPU ns/tok':>11}")
    med = {}
    for k, label in (("tokens", "decode: tokens alone"), ("columns", "decode: tokens + loss_mask + weight")):
        t = median_timing(dec[k])
        med["dec_" + k] = t.ns_per_token(tokens)
        print(f"{label:<52} {t.rate(tokens):8.1f} {t.cores():6.2f} {t.ns_per_token(tokens):11.1f}")
    for k, label in (("tokens", "plitzer: tokens alone"), ("columns", "plitzer: columns=['loss_mask', 'weight']")):
        t = median_timing([x for x, _ in runs[k]])
        n = runs[k][0][1]
        med["run_" + k] = t.ns_per_token(n)
        med["wall_" + k] = t.wall / n * 1e9
        print(f"{label:<52} {t.rate(n):8.1f} {t.cores():6.2f} {t.ns_per_token(n):11.1f}")
    print(
        f"bytes per token: tokens 4, with the columns 4 + 1 + 4 = 9 (x2.25). Extra CPU per token: loader "
        f"+{med['run_columns'] - med['run_tokens']:.1f} ns (x{med['run_columns'] / med['run_tokens']:.2f}), "
        f"decode +{med['dec_columns'] - med['dec_tokens']:.1f} ns (x{med['dec_columns'] / med['dec_tokens']:.2f}); "
        f"wall per token x{med['wall_columns'] / med['wall_tokens']:.2f}"
    )


if __name__ == "__main__":
    main()
