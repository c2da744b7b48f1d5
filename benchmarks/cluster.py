"""A job as big as real ones, simulated where it must be: a synthetic index, a thousand ranks.

No data is read: the index is a synthetic table (``--row-groups`` row groups of about
10^6 tokens in ``--files`` files, default 10^6 in 10^5: a corpus of 10^12 tokens), and
what a rank does before its first read is timed on this one process, for a few sampled
ranks of ``--world`` (default 1,024):

* plan: the plan of the world and one rank's ``Loader`` over it (no thread, no I/O);
* seek: ``Loader.seek(10^7)`` and the positions of its lanes there (the step's epoch laid
  out); also for a 3-source mixture with two stages (its interleave from the stage entry);
* merge: ``plitzer.merge`` of one part per rank at ``--world`` and at fewer ranks (so
  that a quadratic cost would show), and the merged checkpoint's size;
* resume: ``Loader.resume`` on sampled ranks of ``--world`` from a checkpoint of
  ``--from-world`` ranks (default 128), merged.

Each figure is a wall time on this machine and the peak of Python allocations (numpy
included) during the step (``tracemalloc``). ``--small`` runs a tenth of the sizes and
256 ranks (for a shared machine).

    python benchmarks/cluster.py            # 10^6 row groups, 10^5 files, 1,024 ranks
    python benchmarks/cluster.py --small

Real shapes (``--shapes``): files shaped like FineWeb-Edu's (eleven columns, 400 row
groups a file, footers of real size) at 120,000 and 10^6 row groups: pyarrow's parse of
the footers against ``plitzer index``, the job index's size, a rank's peak RSS and first
batch (cold, warm, ``index=``), and an 8-rank gloo job on 2,000 such files (benchmarks/_shapes.py):

    python benchmarks/cluster.py --shapes

Real run (``--real``): ``--ranks`` gloo processes (torch.distributed on CPU, real
processes on this machine, each its own cache folder as on separate machines) open
``plitzer.torch.Dataset`` over ``--files`` files (one row group of 20 documents each:
the footers, not the data, are the work) on moto's S3 server (its own process) behind
tests/s3_fixtures.py's FaultProxy (its own process) adding ``--latency-ms`` to every
request. Counted at the proxy, from the ranks' start to the job's first batch (the
last rank's): the listing requests (pages), the footer GETs, the row-group GETs of the
windows the first step spans, and apart from them the later windows' reads the budget
let start (read-ahead); per file. Timed: each rank's construction and first batch (the
slowest rank's). The baseline, on the same ranks at the same time: raw boto3, each rank
listing the prefix and fetching the last 64 KiB of its ``files / ranks`` files on 32
threads through the same proxy. The two run in turn ``--repeat`` times (2), the faster
of each kept, plitzer from fresh cache folders every time. The issue's size, and a
quick check:

    python benchmarks/cluster.py --real --files 2000 --ranks 8 --latency-ms 30
    python benchmarks/cluster.py --real     # 200 files, 8 ranks, 30 ms
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import polars as pl

import plitzer
from planner.catalog.datasetindex import Index
from planner.catalog.files import FileEntry
from planner.catalog.rowlists import INDEX_SCHEMA
from planner.mixing.mixture import MixtureIndex, MixturePlan
from planner.mixing.sources import SourceSpec, parse_stages
from planner.order.epoch import PlanSettings
from planner.order.plan import Plan
from planner.run import lane_positions
from planner.stores.storage import FileStat
from plitzer.loader import Loader
from plitzer.state import checkpoint as ckpt
from plitzer.state.settings import LoaderSettings

T = TypeVar("T")
SEQ_LEN = 2048
LANES_PER_RANK = 8
STEP = 10**7


class NoStorage:
    """Storage of a synthetic index: listing and reads are never needed (and refused)."""

    url = "synthetic://"
    concurrency = 1
    retries = 0

    def list_files(self) -> list[FileStat]:
        raise NotImplementedError

    def read_range(self, file: FileStat, offset: int, length: int) -> bytes:
        msg = "the cluster benchmark reads no data"
        raise RuntimeError(msg)

    def polars_options(self) -> dict[str, str]:
        return {}

    def duckdb_filesystem(self) -> Any:
        return None

    def checkpoint_revision(self) -> tuple[str, str] | None:
        return None  # a synthetic index has no revisions (planner.stores.storage.revisions asks every storage)


def synthetic_index(row_groups: int, files: int, seed: int = 0, name: str = "") -> Index:
    """An index of ``row_groups`` row groups (about 10^6 tokens, 1,000 documents each) in ``files`` files."""
    rng = np.random.default_rng(seed)
    per = row_groups // files
    file_index = np.repeat(np.arange(files, dtype=np.int64), per)
    n = len(file_index)
    tokens = rng.integers(500_000, 1_500_000, n, dtype=np.int64)
    rows = rng.integers(500, 1_500, n, dtype=np.int64)
    length = (tokens * 2).reshape(files, per)  # about 2 bytes a token, compressed
    offset = (4 + np.cumsum(length, axis=1) - length).reshape(-1)
    length = length.reshape(-1)
    names = [f"{name}part-{f:06d}.parquet" for f in range(files)]
    frame = pl.DataFrame(
        {
            "file": pl.Series(np.array(names, dtype=object)[file_index], dtype=pl.String),
            "file_index": file_index,
            "row_group": np.tile(np.arange(per, dtype=np.int64), files),
            "rows": rows,
            "tokens": tokens,
            "empty_docs": np.zeros(n, np.int64),
            "byte_offset": offset,
            "byte_length": length,
            "needs_check": np.zeros(n, bool),
            "codec": np.full(n, 6, np.uint8),  # ZSTD
            "chunk_values": tokens,
        },
        schema=INDEX_SCHEMA,
    )
    storage = NoStorage()
    entries = [FileEntry(FileStat(nm, f"synthetic://{nm}", 0, "0"), storage) for nm in names]  # type: ignore[arg-type]
    return Index(
        frame=frame, column="tokens", dtype="int32", fingerprint=f"synthetic-{seed}", source="synthetic", _files=entries
    )


def measure(what: str, fn: Callable[[], T]) -> tuple[T, float, float]:
    """``fn()``, its wall time (s) and the peak of Python allocations during it (MiB)."""
    tracemalloc.start()
    t = time.perf_counter()
    out = fn()
    dt = time.perf_counter() - t
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(f"  {what:58s} {dt * 1000:10.1f} ms  {peak / 2**20:8.1f} MiB", flush=True)
    return out, dt, peak / 2**20


def settings(world: int, rank: int, window: int) -> LoaderSettings:
    return LoaderSettings(
        plan=PlanSettings(seed=0, lanes=LANES_PER_RANK * world, window=window, world=world),
        seq_len=SEQ_LEN,
        rank=rank,
        budget=1 << 40,
        threads=1,
    )


def parts_at(plan: Plan, world: int, step: int) -> list[bytes]:
    """One checkpoint part per rank of ``world`` at ``step`` (positions from the step, no data read)."""
    lanes = LANES_PER_RANK * world
    config = Loader.from_plan(plan, settings(world, 0, plan.settings.window)).config
    rows = lane_positions(plan, step, SEQ_LEN, lanes, range(lanes))
    rows[:, 3] = 0  # piece 0: a lane inside a slice is checked when its window is packed, not here
    per = LANES_PER_RANK
    return [ckpt.encode(ckpt.State(config, step, rows[r * per : (r + 1) * per])) for r in range(world)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--row-groups", type=int, default=1_000_000)
    ap.add_argument("--files", type=int, default=None, help="default 10^5; 200 with --real")
    ap.add_argument("--world", type=int, default=1024)
    ap.add_argument("--from-world", type=int, default=128)
    ap.add_argument("--window", type=int, default=None, help="row groups a window: default 64; 8 with --real")
    ap.add_argument("--sample", type=int, default=3, help="ranks timed (first, middle, last, ...)")
    ap.add_argument("--small", action="store_true", help="a tenth of the row groups and files, 256 ranks")
    shapes = ap.add_argument_group("real shapes (--shapes: benchmarks/_shapes.py)")
    shapes.add_argument("--shapes", action="store_true", help="FineWeb-Edu-shaped files: index, job index, a rank")
    shapes.add_argument("--shapes-row-groups", default="120000,1000000", help="sizes, comma-separated")
    shapes.add_argument("--rank-files", type=int, default=2000, help="files of the gloo job (--ranks processes)")
    shapes.add_argument("--per-file", type=int, default=400, help="row groups a file")
    shapes.add_argument("--index-only", action="store_true", help="only plitzer index against pyarrow's parse")
    shapes.add_argument("--packing", default=None, help="a rank's packing= (best-fit: its bins pass counted in)")
    shapes.add_argument("--rounds", type=int, default=3, help="--index-only: runs of each, alternating")
    shapes.add_argument("--index-against", type=Path, default=None, help="--index-only: another checkout too")
    real = ap.add_argument_group("real run (--real)")
    real.add_argument("--real", action="store_true", help="gloo ranks against moto's S3 server behind a latency proxy")
    real.add_argument("--ranks", type=int, default=8, help="gloo processes")
    real.add_argument("--latency-ms", type=float, default=30.0, help="delay the proxy adds to every request")
    real.add_argument("--pace-mbps", type=float, default=100.0, help="MB/s the proxy sends on one connection")
    real.add_argument("--lanes-per-rank", type=int, default=LANES_PER_RANK)
    real.add_argument("--seq-len", type=int, default=512)
    real.add_argument("--repeat", type=int, default=2, help="runs of each, in turn (the faster kept)")
    real.add_argument("--json", type=Path, default=None, help="also write the figures here")
    real.add_argument("--worker", type=Path, default=None, help=argparse.SUPPRESS)  # one rank: its output folder
    real.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    real.add_argument("--options", default="{}", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker is not None:
        rank_main(a)
        return
    if a.real:
        real_main(a)
        return
    if a.shapes:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import _shapes

        if a.index_only:
            sizes = [int(x) for x in a.shapes_row_groups.split(",")]
            _shapes.index_only(sizes, a.per_file, a.rounds, a.index_against)
            return
        _shapes.main([int(x) for x in a.shapes_row_groups.split(",")], a.ranks, a.rank_files, a.per_file, a.packing)
        return
    a.files = a.files or 100_000
    a.window = a.window or 64
    if a.small:
        a.row_groups, a.files, a.world = a.row_groups // 10, a.files // 10, 256
    world, window = a.world, a.window
    ranks = sorted({0, world // 2, world - 1, *range(1, world, max(1, world // max(1, a.sample)))})[: a.sample]
    print(f"synthetic index: {a.row_groups:,} row groups in {a.files:,} files; {world} ranks x {LANES_PER_RANK} lanes")
    ix, _, _ = measure("build the synthetic index (not a rank's cost)", lambda: synthetic_index(a.row_groups, a.files))
    print(f"  corpus {ix.tokens:,} tokens; step {STEP:,} is run token {STEP * LANES_PER_RANK * world * SEQ_LEN:,}")

    print("plan (per rank)")
    plan, _, _ = measure("Plan of the world (index arithmetic)", lambda: Plan(ix, settings(world, 0, window).plan))
    measure("epoch 0 laid out (permutation, windows, lanes)", lambda: plan.epoch(0))
    loaders = {}
    for r in ranks:
        loaders[r], _, _ = measure(
            f"Loader of rank {r} over the plan", lambda r=r: Loader.from_plan(plan, settings(world, r, window))
        )

    print(f"seek to step {STEP:,} (per rank)")
    for r in ranks:
        ld = loaders[r]
        measure(
            f"rank {r}: seek({STEP:,}) and its lanes' positions",
            lambda ld=ld: (ld.seek(STEP), lane_positions(plan, STEP, SEQ_LEN, ld.settings.lanes, ld.rank_lanes)),
        )

    print(f"merge (once, on one process): parts of {world} ranks and fewer, at step {STEP:,}")
    for w in sorted({max(1, world // 8), world // 4, world // 2, world}):
        wplan = plan if w == world else Plan(ix, settings(w, 0, window).plan)
        parts = parts_at(wplan, w, STEP)
        merged, dt, _ = measure(
            f"merge {w} parts ({len(parts[0]):,} bytes each)", lambda parts=parts: ckpt.merge(parts)
        )
        print(f"    -> {len(merged):,} bytes merged; {dt / w * 1e6:.1f} us a part")

    print(f"resume on {world} ranks from a {a.from_world}-rank checkpoint (per rank)")
    small = Plan(ix, settings(a.from_world, 0, window).plan)
    from_parts = parts_at(small, a.from_world, STEP)
    state, _, _ = measure(f"merge the {a.from_world} parts", lambda: ckpt.merge(from_parts))
    # The same lanes over more ranks: a checkpoint of B lanes resumes on any world dividing them.
    wide = LANES_PER_RANK * a.from_world
    for w in (a.from_world, world):
        per = wide // w
        if per < 1:
            continue
        s = LoaderSettings(
            plan=PlanSettings(seed=0, lanes=wide, window=window, world=w), seq_len=SEQ_LEN, budget=1 << 40, threads=1
        )
        wp = Plan(ix, s.plan)
        for r in sorted({0, w // 2, w - 1})[: a.sample]:
            ld = Loader.from_plan(wp, LoaderSettings(plan=s.plan, seq_len=SEQ_LEN, rank=r, budget=1 << 40, threads=1))
            measure(f"world {w}: rank {r} resumes ({per} lanes)", lambda ld=ld: ld.resume(state))

    print("mixture: 3 sources, two stages, seek (per rank)")
    third = a.row_groups // 3
    parts_ix = [synthetic_index(third, max(1, a.files // 3), seed=s, name=f"s{s}/") for s in range(3)]
    specs = [SourceSpec(name=n, path=n) for n in ("books", "code", "web")]
    mix = MixtureIndex(specs, parts_ix)
    stages = parse_stages(
        [(0, {"books": 1, "code": 1, "web": 2}), (STEP // 2, {"books": 0, "code": 3, "web": 1})],
        mix.names,
        [p.tokens for p in parts_ix],
    )
    for step in (1_000, STEP):
        mp, _, _ = measure(
            "MixturePlan (stages) of the world",
            lambda: MixturePlan(mix, settings(world, 0, window).plan, stages, seq_len=SEQ_LEN),
        )
        measure(
            f"step {step:,}: its epoch laid out and rank 0's lanes' positions",
            lambda mp=mp, step=step: lane_positions(mp, step, SEQ_LEN, LANES_PER_RANK * world, range(LANES_PER_RANK)),
        )
    for ld in loaders.values():
        ld.close()
    _ = plitzer  # the package's import side effects (the chunk counter) as in a real job


# -- the real run ---------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent
BUCKET, PREFIX = "bench", "cold"


def phases(repeat: int) -> list[str]:
    """The baseline and plitzer in turn, ``repeat`` times each (the faster of each kept)."""
    return [f"{what}-{i + 1}" for i in range(repeat) for what in ("raw", "plitzer")]


def real_settings(a: argparse.Namespace) -> dict[str, int]:
    return {"seed": 0, "lanes": a.lanes_per_rank * a.ranks, "window": a.window, "seq_len": a.seq_len}


def rank_main(a: argparse.Namespace) -> None:
    """One rank of the real run (its own process, started by :func:`real_main`): times of each phase."""
    from datetime import timedelta

    import torch.distributed as dist
    from _s3_common import raw_footers

    import plitzer.torch

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    opts = json.loads(a.options)
    print(f"{time.time():.3f} rank {rank}: imported", flush=True)  # the log, shown if a rank fails
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{a.port}", rank=rank, world_size=world, timeout=timedelta(seconds=600)
    )
    times: dict[str, list[float]] = {}
    try:
        for phase in phases(a.repeat):
            dist.barrier()
            print(f"{time.time():.3f} rank {rank}: {phase}", flush=True)
            os.environ["PLITZER_CACHE"] = str(a.worker / f"cache{rank}" / phase)  # a cold cache every time
            t0 = time.time()
            if phase.startswith("plitzer"):
                ds = plitzer.torch.Dataset(f"s3://{BUCKET}/{PREFIX}", storage_options=opts, **real_settings(a))
                built = time.time()
                ds.next_batch()
                times[phase] = [t0, built, time.time()]
                ds.close()
            else:
                raw_footers(opts, BUCKET, f"{PREFIX}/", rank, world, threads=32)
                times[phase] = [t0, time.time(), time.time()]
        dist.barrier()
        (a.worker / f"rank{rank}.json").write_text(json.dumps(times))
    finally:
        dist.destroy_process_group()
    print(f"{time.time():.3f} rank {rank}: done", flush=True)
    os._exit(0)  # the results are written: skip the interpreter's teardown of torch (seconds on a busy machine)


def run_ranks(a: argparse.Namespace, work: Path, opts: dict[str, Any]) -> list[dict[str, list[float]]]:
    """Start the ranks (each its own PLITZER_CACHE), wait for them, and return each one's times."""
    from tests.s3_fixtures import free_port

    env = {
        **os.environ,
        "WORLD_SIZE": str(a.ranks),
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
        "OMP_NUM_THREADS": "1",
    }
    if sys.platform.startswith("linux"):
        env["GLOO_SOCKET_IFNAME"] = "lo"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", str(work), "--port", str(free_port())]
    cmd += ["--options", json.dumps(opts), "--ranks", str(a.ranks), "--window", str(a.window)]
    cmd += ["--seq-len", str(a.seq_len), "--lanes-per-rank", str(a.lanes_per_rank), "--repeat", str(a.repeat)]
    procs = []
    for r in range(a.ranks):
        with open(work / f"rank{r}.log", "wb") as log:
            rank_env = {**env, "RANK": str(r), "PLITZER_CACHE": str(work / f"cache{r}")}
            procs.append(subprocess.Popen(cmd, env=rank_env, stdout=log, stderr=subprocess.STDOUT))
    deadline = time.monotonic() + 900
    codes: list[int | None] = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=max(1.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            codes.append(None)
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    if any(c != 0 for c in codes):
        for r in range(a.ranks):
            print(f"--- rank {r} (exit {codes[r]})\n{(work / f'rank{r}.log').read_text()[-3000:]}", file=sys.stderr)
        msg = f"a rank of the real run failed (exit codes {codes}); its log is above"
        raise SystemExit(msg)
    return [json.loads((work / f"rank{r}.json").read_text()) for r in range(a.ranks)]


def first_step_windows(ix: Index, a: argparse.Namespace) -> tuple[dict[int, int], int]:
    """Each row group's window in epoch 0 (by row), and the windows the first step spans."""
    plan = Plan(ix, PlanSettings(seed=0, lanes=a.lanes_per_rank * a.ranks, window=a.window, world=a.ranks))
    ep = plan.epoch(0)
    step = a.lanes_per_rank * a.ranks * a.seq_len
    before = np.cumsum(ep.window_tokens) - ep.window_tokens  # the epoch's tokens before each window
    spans = int(np.searchsorted(before, step, side="left"))  # windows that start before the step ends
    return {int(g): int(w) for g, w in zip(ep.order, ep.window, strict=True)}, spans


def real_main(a: argparse.Namespace) -> None:
    """The real run, in a temporary folder (the data, each rank's cache folders and log) removed after."""
    work = Path(tempfile.mkdtemp(prefix="plitzer-bench-cluster-"))
    try:
        real_run(a, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def real_run(a: argparse.Namespace, work: Path) -> None:
    sys.path.insert(0, str(ROOT))
    from _s3_common import ProxyProcess, put_all

    import planner
    import plitzer.synth
    from tests.s3_fixtures import MotoServer, options

    a.files = a.files or 200
    a.window = a.window or 8
    os.environ["PLITZER_CACHE"] = str(work / "cache-local")  # this process's index of the local copy
    data = work / "data"
    # One row group of 20 documents a file (as s3.py's cold set); a few more written, the first --files kept.
    written = plitzer.synth.write(
        data, tokens=a.files * 4400 + 8000, seed=1, mean_length=200, docs_per_row_group=20, row_groups_per_file=1
    )
    if len(written) < a.files:
        msg = f"wrote {len(written)} files, fewer than --files {a.files}"
        raise SystemExit(msg)
    for p in written[a.files :]:
        p.unlink()
    local = planner.index(data)
    window_of, spans = first_step_windows(local, a)
    fr = local.frame
    row_group_of = {
        (f"/{BUCKET}/{PREFIX}/{local.files[fi].name}", f"bytes={o}-{o + n - 1}"): g
        for g, (fi, o, n) in enumerate(zip(fr["file_index"], fr["byte_offset"], fr["byte_length"], strict=True))
    }
    server = MotoServer()
    proxy = None
    try:
        client = server.client()
        client.create_bucket(Bucket=BUCKET)
        files = put_all(client, BUCKET, data, PREFIX)
        client.list_objects_v2(Bucket=BUCKET, Prefix=f"{PREFIX}/")  # moto warmed, straight to it
        proxy = ProxyProcess(server.port, a.latency_ms / 1e3, a.pace_mbps * 1e6)
        print(
            f"real run: {a.ranks} gloo ranks (each its own cache folder) over {files:,} files of one row group on "
            f"moto's S3 server behind a {a.latency_ms:g} ms proxy ({a.pace_mbps:g} MB/s a connection); "
            f"{a.lanes_per_rank * a.ranks} lanes x {a.seq_len} tokens, window {a.window}",
            flush=True,
        )
        t0 = time.perf_counter()
        times = run_ranks(a, work, options(proxy.endpoint))
        wall = time.perf_counter() - t0
        seen = proxy.requests()
    finally:
        if proxy is not None:
            proxy.stop()
        server.stop()

    def between(phase: str, end: int) -> dict[str, Any]:
        """What arrived at the proxy from the phase's first start to its last end; the ranks' times."""
        lo, hi = min(t[phase][0] for t in times), max(t[phase][end] for t in times)
        got = [r for r in seen if lo <= r.at <= hi]
        gets = [(r.path, r.range) for r in got if r.is_object_get]
        footers = [k for k in gets if k not in row_group_of]
        first = sum(1 for k in gets if k in row_group_of and window_of[row_group_of[k]] < spans)
        lists = sum(r.is_list for r in got)
        return {
            "seconds": max(t[phase][end] - t[phase][0] for t in times),
            "built": max(t[phase][1] - t[phase][0] for t in times),
            "listings": lists,
            "footer_gets": len(footers),
            "distinct_footers": len(set(footers)),
            "first_step_gets": first,
            "read_ahead_gets": len(gets) - len(footers) - first,
            "other": len(got) - lists - len(gets),
        }

    runs = {p: between(p, 2 if p.startswith("plitzer") else 1) for p in phases(a.repeat)}
    ours = min((v for k, v in runs.items() if k.startswith("plitzer")), key=lambda r: r["seconds"])
    raw = min((v for k, v in runs.items() if k.startswith("raw")), key=lambda r: r["seconds"])
    start_up = ours["footer_gets"] + ours["first_step_gets"]
    every = start_up + ours["read_ahead_gets"]
    raw_gets = raw["footer_gets"]  # its tails (a row group's range there would be plitzer's, late)
    out = {
        "files": files,
        "ranks": a.ranks,
        "latency_ms": a.latency_ms,
        "first_step_windows": spans,
        "plitzer": ours,
        "raw": raw,
        "seconds_of_each_run": {k: v["seconds"] for k, v in runs.items()},
        "data_gets_per_file": start_up / files,
        "data_gets_per_file_with_read_ahead": every / files,
        "raw_gets_per_file": raw_gets / files,
        "time_ratio": ours["seconds"] / raw["seconds"],
        "wall_s": wall,
    }
    each = out["seconds_of_each_run"]
    print(
        f"plitzer.torch.Dataset: first batch {ours['seconds']:.2f} s (the slowest rank; of it, construction with the "
        f"shared listing and footers {ours['built']:.2f} s; the faster of "
        f"{', '.join(f'{v:.2f}' for k, v in each.items() if k.startswith('plitzer'))} s, a cold cache each)"
    )
    print(
        f"  requests before the first batch: listing {ours['listings']} (pages of 1,000 keys), footer GETs "
        f"{ours['footer_gets']} ({ours['distinct_footers']} distinct), row-group GETs of the first step's "
        f"{spans} window(s) {ours['first_step_gets']}, other {ours['other']}: {start_up / files:.3f} data GETs a "
        f"file; read ahead from later windows {ours['read_ahead_gets']} ({every / files:.3f} a file with them)"
    )
    print(
        f"raw boto3 on the same ranks (each lists, then GETs the last 64 KiB of its {files / a.ranks:g} files on "
        f"32 threads): {raw['seconds']:.2f} s (the slowest rank; the faster of "
        f"{', '.join(f'{v:.2f}' for k, v in each.items() if k.startswith('raw'))} s)"
    )
    print(
        f"  requests: listing {raw['listings']}, GETs {raw_gets} ({raw_gets / files:.3f} a file), other {raw['other']}"
    )
    print(
        f"plitzer / raw boto3: time to first batch {out['time_ratio']:.2f}x, "
        f"data GETs a file {start_up / max(1, raw_gets):.2f}x, listing requests {ours['listings']} / {raw['listings']}"
    )
    print(f"(the whole run, the ranks' process starts included: {wall:.1f} s)")
    if a.json is not None:
        a.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
