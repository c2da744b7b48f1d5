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
"""

from __future__ import annotations

import argparse
import time
import tracemalloc
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import polars as pl

import plitzer
from planner.catalog.dataset import INDEX_SCHEMA, FileEntry, Index
from planner.mixing.mixture import MixtureIndex, MixturePlan
from planner.mixing.sources import SourceSpec, parse_stages
from planner.order.plan import Plan, PlanSettings
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
    size = np.repeat(4 + length.sum(axis=1) + 10_000, per)  # and a footer
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
            "file_size": size,
            "needs_check": np.zeros(n, bool),
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
    ap.add_argument("--files", type=int, default=100_000)
    ap.add_argument("--world", type=int, default=1024)
    ap.add_argument("--from-world", type=int, default=128)
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--sample", type=int, default=3, help="ranks timed (first, middle, last, ...)")
    ap.add_argument("--small", action="store_true", help="a tenth of the row groups and files, 256 ranks")
    a = ap.parse_args()
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


if __name__ == "__main__":
    main()
