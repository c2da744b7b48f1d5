"""Time to index and plan a dataset of many row groups (default 100,000).

Writes N files of tiny row groups (real footers, little data), then measures:
index cold (every footer read and parsed), index warm (from the cache), and
planning one epoch (the row_groups, lanes and reads tables) with 512 lanes.

    python benchmarks/plan_scale.py --row-groups 100000
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def write(root: Path, row_groups: int, files: int) -> None:
    per = row_groups // files
    rng = np.random.default_rng(0)
    for f in range(files):
        lengths = rng.integers(1, 6, per)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        values = pa.array(rng.integers(0, 50257, int(offsets[-1])).astype(np.int32))
        table = pa.table({"tokens": pa.ListArray.from_arrays(pa.array(offsets), values)})
        pq.write_table(table, root / f"part-{f:05d}.parquet", row_group_size=1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--row-groups", type=int, default=100_000)
    ap.add_argument("--files", type=int, default=100)
    ap.add_argument("--lanes", type=int, default=512)
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--world", type=int, default=8)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["PLITZER_CACHE"] = str(Path(tmp) / "cache")
        root = Path(tmp) / "data"
        root.mkdir()
        t = time.perf_counter()
        write(root, args.row_groups, args.files)
        print(f"wrote {args.row_groups:,} row groups in {args.files} files: {time.perf_counter() - t:.1f} s")
        import planner

        t = time.perf_counter()
        ix = planner.index(root, progress=False)
        cold = time.perf_counter() - t
        t = time.perf_counter()
        ix = planner.index(root, progress=False)
        warm = time.perf_counter() - t
        p = planner.plan(ix, seed=0, lanes=args.lanes, window=args.window, world=args.world)
        timings = []
        for epoch in range(3):
            t = time.perf_counter()
            p.epoch(epoch)
            arrays = time.perf_counter() - t
            rg, lanes, reads = p.row_groups(epoch), p.lanes(epoch), p.reads(epoch)
            timings.append((arrays, time.perf_counter() - t))
        t = time.perf_counter()
        n = p.sql("select rank, count(*) from reads group by rank", epochs=[0])
        sql = time.perf_counter() - t
        print(f"row groups: {ix.row_groups:,}, windows per epoch: {p.windows:,}")
        print(f"index, cold (read and parse every footer): {cold:.2f} s")
        print(f"index, warm (cached):                      {warm:.2f} s")
        for e, (a, tables) in enumerate(timings):
            print(
                f"plan epoch {e} (lanes={args.lanes}, window={args.window}, world={args.world}): "
                f"arrays {a * 1000:.0f} ms, with all three tables {tables * 1000:.0f} ms "
                f"({rg.height:,} / {lanes.height:,} / {reads.height:,} rows)"
            )
        print(f"SQL over one epoch's tables: {sql * 1000:.0f} ms ({n.height} rows)")


if __name__ == "__main__":
    main()
