"""Seeded byte flips and truncations over a real Parquet file, through the whole loader.

Run as a script in a subprocess (the test sets a memory cap and a timeout):
``python fuzz_parquet.py BASE_FILE WORKDIR N SEED``. Prints one JSON line:
counts of outcomes. ``different`` counts inputs for which the loader handed out
tokens that differ from the undamaged file's without raising: it must stay 0
for files written with page checksums.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np


def run(base: Path, work: Path, n: int, seed: int) -> dict[str, object]:
    os.environ["PLITZER_CACHE"] = str(work / "cache")
    import plitzer

    settings = {"seed": 0, "lanes": 4, "window": 2, "seq_len": 50}
    good = base.read_bytes()
    ref_dir = work / "ref"
    ref_dir.mkdir(parents=True, exist_ok=True)
    (ref_dir / "x.parquet").write_bytes(good)
    with plitzer.Loader(ref_dir, budget=1 << 30, **settings) as ld:  # type: ignore[arg-type]
        steps = len(ld)
        want = [np.from_dlpack(ld.next_batch().tokens).copy() for _ in range(steps)]
    rng = np.random.default_rng(seed)
    counts = {"error": 0, "identical": 0, "different": 0}
    errors: dict[str, int] = {}
    bad: list[int] = []
    progress = work / "progress"
    for i in range(n):
        progress.write_text(str(i))
        data = bytearray(good)
        kind = rng.integers(0, 3)
        if kind == 0:  # flip 1-8 bytes anywhere
            for _ in range(int(rng.integers(1, 9))):
                data[int(rng.integers(0, len(data)))] ^= int(rng.integers(1, 256))
        elif kind == 1:  # flip bytes in the footer region
            lo = max(0, len(data) - 4096)
            for _ in range(int(rng.integers(1, 4))):
                data[int(rng.integers(lo, len(data)))] ^= int(rng.integers(1, 256))
        else:  # truncate
            data = data[: int(rng.integers(0, len(data)))]
        d = work / f"m{i}"
        d.mkdir()
        (d / "x.parquet").write_bytes(bytes(data))
        try:
            with plitzer.Loader(d, budget=1 << 30, **settings) as ld:  # type: ignore[arg-type]
                got = [np.from_dlpack(ld.next_batch().tokens).copy() for _ in range(steps)]
            same = len(got) == len(want) and all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
            counts["identical" if same else "different"] += 1
            if not same:
                bad.append(i)
        except plitzer.PlitzerError as e:
            counts["error"] += 1
            errors[type(e).__name__] = errors.get(type(e).__name__, 0) + 1
            if "x.parquet" not in str(e):
                raise AssertionError(f"error does not name the file: {e}") from e
        for p in d.iterdir():
            p.unlink()
        d.rmdir()
    return {"counts": counts, "errors": errors, "different_inputs": bad, "n": n}


if __name__ == "__main__":
    base, work, n, seed = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    print(json.dumps(run(base, work, n, seed)))
