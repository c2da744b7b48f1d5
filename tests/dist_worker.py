"""One training process for tests/state/test_distributed.py (run as a script, one per rank).

It joins a gloo process group (TCP store on 127.0.0.1), reads its rank and world
from torch.distributed through plitzer.torch.Dataset, and "trains": each step,
every rank hashes its rows (tokens and position ids), the ranks all-gather the
hashes (the collective a real step's gradient all-reduce would be), and the
running hash of the global sample stream is folded forward. That hash is the
"model": it is checkpointed with the data state and restored on resume.

Checkpoint, every ``--every`` steps, on rank 0 after the collective state_dict():
``model-<step>.json`` (atomic) first, then ``data.ckpt`` via
plitzer.save_checkpoint (atomic). data.ckpt is the commit point: its step names
the model file that goes with it. Rank 0 appends ``step <t> <hash>`` and
``ckpt <t>`` lines to ``progress.<run>.log`` so the launcher can pick its moment.

Modes: ``--resume`` (load data.ckpt and its model file), ``--prefetch`` (fetch
the next batch before training this one; checkpoint with state_dict(after=...)),
``--hang-in-save K`` (rank 0 writes half of data.ckpt's temp file at step K and
stops there, for the launcher to kill), ``--dcp-save K`` / ``--dcp-load``
(torch.distributed.checkpoint of model and data together instead), and
``--wait-at-end`` (stay alive after the last step, for the launcher to kill),
``--data-world N`` (N data ranks, each shared by world/N consecutive processes, as
under tensor parallelism).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

import planner.stores.cache
import plitzer
import plitzer.state.checkpoint
import plitzer.torch
from tests.net import join_gloo

SETTINGS: dict[str, Any] = {"seed": 7, "lanes": 12, "window": 2, "seq_len": 128}
ZERO = bytes(32)


def row_digests(tokens: np.ndarray, position_ids: np.ndarray) -> np.ndarray:
    """One 64-bit digest per row of (tokens, position ids), as int64."""
    out = np.empty(len(tokens), dtype=np.int64)
    for i, (t, p) in enumerate(zip(tokens, position_ids, strict=True)):
        h = hashlib.blake2b(np.ascontiguousarray(t).tobytes(), digest_size=8)
        h.update(np.ascontiguousarray(p).tobytes())
        out[i] = np.frombuffer(h.digest(), dtype="<i8")[0]
    return out


def fold(h: bytes, step: int, digests: np.ndarray) -> bytes:
    """The running hash after global step ``step`` whose rows (all lanes, in order) hash to ``digests``."""
    return hashlib.sha256(h + step.to_bytes(8, "little") + digests.astype("<i8").tobytes()).digest()


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class _HangingOs:
    """``os`` for planner.stores.cache (the atomic write of save_checkpoint): write() stores half, then stops."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def write(self, fd: int, data: Any) -> int:
        half = bytes(data[: len(data) // 2])
        os.write(fd, half)
        os.fsync(fd)
        self.marker.write_text("in save_checkpoint\n")
        time.sleep(3600)  # the launcher kills the group here
        raise SystemExit(3)


def trace(what: str) -> None:
    """A timestamped line in this rank's log (the launcher shows it on a failure)."""
    now = time.time()
    stamp = time.strftime("%H:%M:%S", time.localtime(now)) + f".{int(now % 1 * 1000):03d}"
    print(f"[{stamp}] {what}", file=sys.stderr, flush=True)


def main() -> int:
    trace("imported")
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--port", required=True, type=int)
    p.add_argument("--run", required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--every", type=int, default=4)
    p.add_argument("--pace", type=float, default=0.0)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--prefetch", action="store_true")
    p.add_argument("--hang-in-save", type=int, default=-1)
    p.add_argument("--dcp-save", type=int, default=-1)
    p.add_argument("--dcp-load", action="store_true")
    p.add_argument("--wait-at-end", action="store_true")
    p.add_argument("--data-world", type=int, default=0, help="data-parallel ranks (default: every process)")
    a = p.parse_args()

    rank, world = join_gloo(a.port)
    trace("process group ready")
    out: Path = a.out
    if a.data_world:
        # Tensor-parallel style: consecutive processes share a data rank and read the same rows.
        replicas = world // a.data_world
        ds = plitzer.torch.Dataset(a.data, threads=1, rank=rank // replicas, world=a.data_world, **SETTINGS)
    else:
        replicas = 1
        ds = plitzer.torch.Dataset(a.data, threads=1, **SETTINGS)  # rank and world from torch.distributed
        assert (ds.rank, ds.world) == (rank, world), (ds.rank, ds.world)
    model = {"hash": torch.zeros(32, dtype=torch.uint8)}  # the "model": the running hash

    if a.dcp_load:
        import torch.distributed.checkpoint as dcp

        dcp.load({"model": model, "data": ds}, checkpoint_id=str(out / "dcp"))
        h = bytes(model["hash"].numpy())
    elif a.resume:
        ds.load_state_dict(plitzer.load_checkpoint(out / "data.ckpt"))
        h = bytes.fromhex(json.loads((out / f"model-{ds.step}.json").read_text())["hash"])
    else:
        h = ZERO
    progress = open(out / f"progress.{a.run}.log", "a") if rank == 0 else None  # noqa: SIM115
    trace(f"dataset ready at step {ds.step}")
    if progress:
        progress.write(f"start {ds.step} {h.hex()}\n")
        progress.flush()

    loader = DataLoader(ds, batch_size=None, num_workers=0)

    def stream() -> Iterator[plitzer.torch.Batch]:
        while True:  # the seed README's loop, without an epoch limit: `for batch in loader` per epoch
            yield from loader

    batches = stream()
    nxt = next(batches)
    while nxt.step < a.steps:
        batch = nxt
        if a.prefetch:
            nxt = next(batches)  # the dataset is now one batch past the one being trained
        mine = torch.from_numpy(row_digests(batch.tokens.numpy(), batch.position_ids.numpy()))
        gathered = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(gathered, mine)
        h = fold(h, batch.step, torch.cat(gathered[::replicas]).numpy())
        step = batch.step + 1  # the next step to train
        if progress:
            progress.write(f"step {batch.step} {h.hex()}\n")
            progress.flush()
        if step == a.dcp_save:
            import torch.distributed.checkpoint as dcp

            model["hash"] = torch.from_numpy(np.frombuffer(h, dtype=np.uint8).copy())
            if a.prefetch:
                msg = "--dcp-save saves the dataset object: use it without --prefetch"
                raise SystemExit(msg)
            dcp.save({"model": model, "data": ds}, checkpoint_id=str(out / "dcp"))
            trace(f"saved with torch.distributed.checkpoint at step {step}")
            break
        if step % a.every == 0:
            state = ds.state_dict(after=batch) if a.prefetch else ds.state_dict()  # collective
            assert state["step"] == step, (state["step"], step)
            if progress:
                _write_atomic(out / f"model-{step}.json", json.dumps({"step": step, "hash": h.hex()}))
                if step == a.hang_in_save:
                    planner.stores.cache.os = _HangingOs(out / "hanging")  # type: ignore[attr-defined]
                plitzer.save_checkpoint(out / "data.ckpt", state["checkpoint"])
                progress.write(f"ckpt {step}\n")
                progress.flush()
        if a.pace:
            time.sleep(a.pace)
        if not a.prefetch:
            nxt = next(batches)
    trace(f"stopped before step {nxt.step if a.prefetch else step}")
    if progress:
        progress.write(f"done {h.hex()}\n")
        progress.flush()
    if a.wait_at_end:
        time.sleep(3600)
    dist.barrier()
    dist.destroy_process_group()
    ds.close()
    if progress:
        progress.close()
    trace("exit")
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip the interpreter's teardown of torch, gloo and polars: it takes seconds
    # on a loaded machine, and everything the launcher reads is closed by now.
    os._exit(code)
