"""Digests of what a run delivers, to compare two versions of plitzer byte for byte.

Batches (tokens), their documents, checkpoints taken along the way, a resume from the
last one and a seek, for each rank of a few settings (world 1, 2 and 4, layout stages, a
selection). Run it under each version by ``PYTHONPATH`` on the same data and compare the
two lines it prints; equal digests mean the same batches, documents and checkpoint bytes:

    PYTHONPATH=/path/to/0.4 python benchmarks/same_bytes.py /tmp/same-data
    PYTHONPATH=. python benchmarks/same_bytes.py /tmp/same-data

The data (written on the first run if the folder is empty or missing) is made here with
NumPy and pyarrow alone, so both versions read the same files.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

CASES: list[tuple[str, dict[str, Any], int]] = [
    ("world1", {"seed": 3, "lanes": 8, "window": 3, "seq_len": 128}, 1),
    ("world2", {"seed": 3, "lanes": 8, "window": 3, "seq_len": 128}, 2),
    ("world4", {"seed": 7, "lanes": 16, "window": 2, "seq_len": 64}, 4),
    ("stages", {"seed": 1, "lanes": [(0, 8), (40, 4)], "window": 3, "seq_len": [(0, 128), (40, 256)]}, 2),
    ("where", {"seed": 2, "lanes": 8, "window": 3, "seq_len": 128, "where": "score >= 3"}, 2),
]


def write_data(root: Path, files: int = 3, row_groups: int = 8, docs: int = 60) -> None:
    """Files of ``row_groups`` row groups of ``docs`` documents (lognormal lengths) and a score."""
    rng = np.random.default_rng(20261205)
    root.mkdir(parents=True, exist_ok=True)
    schema = pa.schema([("tokens", pa.list_(pa.int32())), ("score", pa.int64())])
    for f in range(files):
        with pq.ParquetWriter(root / f"part-{f}.parquet", schema) as w:
            for _ in range(row_groups):
                lengths = np.minimum(rng.lognormal(5.5, 0.9, docs).astype(np.int64), 4000)
                values = rng.integers(0, 32_000, int(lengths.sum()), dtype=np.int32)
                offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
                tokens = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
                w.write_table(pa.table({"tokens": tokens, "score": rng.integers(0, 6, docs)}, schema=schema))


def digests(data: Path, steps: int = 70) -> dict[str, str]:
    import plitzer

    out = {}
    for name, cfg, world in CASES:
        h = hashlib.sha256()
        for rank in range(world):
            with plitzer.Loader(str(data), rank=rank, world=world, **cfg) as loader:
                for t in range(steps):
                    batch = loader.next_batch()
                    h.update(np.ascontiguousarray(batch.tokens).tobytes())
                    h.update(batch.documents().write_csv().encode())
                    if t % 10 == 5:
                        h.update(loader.checkpoint())
                state = loader.checkpoint()
            with plitzer.Loader(str(data), rank=rank, world=world, **cfg) as again:
                again.resume(state)
                for _ in range(5):
                    h.update(np.ascontiguousarray(again.next_batch().tokens).tobytes())
                again.seek(23)
                for _ in range(5):
                    h.update(np.ascontiguousarray(again.next_batch().tokens).tobytes())
                h.update(again.checkpoint())
        out[name] = h.hexdigest()[:16]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data", type=Path, help="a folder for the data (written if empty or missing)")
    args = ap.parse_args()
    if not any(args.data.glob("*.parquet")):
        write_data(args.data)
    import plitzer

    print(json.dumps({"plitzer": str(Path(plitzer.__file__).parent.parent), **digests(args.data)}))


if __name__ == "__main__":
    main()
