"""``plitzer demo``: the whole job on a generated sample, in under a minute.

1. Generate FineWeb-Edu-shaped Parquet (``plitzer.synth``) unless it is there.
2. Run one epoch on one rank with a progress bar (tokens/s), taking a
   checkpoint at mid-epoch.
3. Resume that checkpoint on two ranks and check that their batches, stacked,
   equal the rest of the uninterrupted epoch, byte for byte.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["run"]


def run(folder: Path, *, tokens: int, seq_len: int, lanes: int, window: int) -> int:
    from tqdm import tqdm

    import plitzer
    from planner.order.layout import Layout
    from planner.progress import progress_enabled

    if not any(folder.glob("*.parquet")):
        t0 = time.perf_counter()
        paths = plitzer.synth.write(folder, tokens=tokens, seed=0)
        print(f"generated {len(paths)} Parquet files in {folder} ({time.perf_counter() - t0:.1f} s)")
    settings: dict[str, Any] = {"seed": 0, "lanes": lanes, "window": window, "seq_len": seq_len}
    loader = plitzer.Loader(folder, **settings)
    n = len(loader)
    mid = n // 2
    layout = Layout.one(lanes, seq_len)
    print(
        f"dataset: {loader.index.row_groups} row groups, {loader.tokens:,} tokens; "
        f"{n} steps of {lanes} x {seq_len} tokens per epoch"
    )
    tail: list[str] = []
    state = b""
    t0 = time.perf_counter()
    with tqdm(
        total=layout.run_at(n), unit="tok", unit_scale=True, desc="epoch 0", disable=not progress_enabled(None, n)
    ) as bar:
        for batch in loader:
            if batch.step == mid:
                state = loader.checkpoint()
                state = plitzer.merge([state])
            if batch.step >= mid:
                tail.append(hashlib.sha256(np.from_dlpack(batch.tokens).tobytes()).hexdigest())
            bar.update(layout.first.per_step)
    elapsed = time.perf_counter() - t0
    loader.close()
    # The checkpoint was taken after batch `mid` was handed out: it resumes at mid + 1.
    tail = tail[1:]
    ranks = [plitzer.Loader(folder, rank=r, world=2, **settings) for r in range(2)]
    t1 = time.perf_counter()
    for r in ranks:
        r.resume(state)
    first = None
    same = 0
    for want in tail:
        rows = [np.from_dlpack(r.next_batch().tokens) for r in ranks]
        if first is None:
            first = time.perf_counter() - t1
        same += hashlib.sha256(np.concatenate(rows).tobytes()).hexdigest() == want
    for r in ranks:
        r.close()
    ok = same == len(tail)
    print(
        f"epoch 0: {n} steps, {layout.run_at(n):,} tokens in {elapsed:.1f} s "
        f"({layout.run_at(n) / elapsed / 1e6:.1f} M tokens/s); every sequence full, 0 padded, 0 dropped\n"
        f"checkpoint at step {mid + 1}: {len(state)} bytes; resumed on 2 ranks "
        f"(first batch after {first or 0:.3f} s): {same}/{len(tail)} later batches identical -> "
        f"{'OK' if ok else 'MISMATCH'}"
    )
    return 0 if ok else 1
