"""A selection that keeps rows in few row groups: the loader's time over the empty windows between.

SPEC 10 keeps every row group in its place, so a predicate that keeps rows in 1 row group
of ``--every`` leaves runs of windows with no row, and a step spans them all. Writes
``--row-groups`` row groups of 5 short documents (``lang = 'en'`` in 1 of ``--every``),
then times the loader (``where="lang = 'en'"``) over two epochs, the selection pass cached
by a first loader, and prints the time per window it passed and its peak budget use:

    python benchmarks/sparse_selection.py --row-groups 10000 --every 500

Two versions compare by ``PYTHONPATH`` on the same data (``--data``: written once).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def write(root: Path, row_groups: int, every: int, files: int = 4) -> None:
    rng = np.random.default_rng(0)
    schema = pa.schema([("tokens", pa.list_(pa.int32())), ("lang", pa.string())])
    root.mkdir(parents=True, exist_ok=True)
    per = -(-row_groups // files)
    for f in range(files):
        with pq.ParquetWriter(root / f"part-{f}.parquet", schema) as w:
            for g in range(f * per, min((f + 1) * per, row_groups)):
                lengths = rng.integers(50, 200, 5)
                tokens = pa.array([np.arange(n, dtype=np.int32) for n in lengths], pa.list_(pa.int32()))
                w.write_table(pa.table({"tokens": tokens, "lang": ["en" if g % every == 0 else "fr"] * 5}, schema))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--row-groups", type=int, default=10_000)
    ap.add_argument("--every", type=int, default=500, help="1 row group in this many keeps its rows")
    ap.add_argument("--data", type=Path, default=None, help="a folder for the data (written if empty)")
    args = ap.parse_args()
    data = args.data or Path(tempfile.mkdtemp()) / "sparse"
    if not any(data.glob("*.parquet")):
        write(data, args.row_groups, args.every)
    import plitzer

    cfg = {"where": "lang = 'en'", "lanes": 4, "seq_len": 64, "window": 2, "seed": 1}
    with plitzer.Loader(str(data), **cfg) as first:  # the selection pass, cached
        first.next_batch()
    with plitzer.Loader(str(data), **cfg) as loader:
        windows = 2 * -(-loader.plan.dataset.row_groups // cfg["window"])
        t, c = time.perf_counter(), time.process_time()
        steps = 0
        while loader.epoch < 2:
            loader.next_batch()
            steps += 1
        wall, cpu = time.perf_counter() - t, time.process_time() - c
        peak = loader.peak_bytes
    print(f"plitzer from {Path(plitzer.__file__).parent.parent}")
    print(
        f"{steps} steps over {windows:,} windows: {wall:.2f} s ({wall / windows * 1e6:.0f} us a window), "
        f"CPU {cpu:.2f} s; peak held {peak:,} bytes"
    )


if __name__ == "__main__":
    main()
