"""One loader, one measurement, in its own process: ``python -m plitzer.bench._run_one LOADER ...``.

The harness (``plitzer.bench.baseline``) starts this module once per loader and
mode, in the loader's own virtual environment where needed, and reads back one
JSON file. Modes:

``convert``
    Make the loader's own copy of the Parquet (Mosaic: MDS shards with
    ``streaming.MDSWriter``; litdata: ``litdata.optimize`` chunks; hf:
    ``load_dataset("parquet")``'s Arrow cache) and report its seconds and bytes.
``throughput``
    Build the loader, time the first batch, then measure the steady state (wall
    and CPU of this process and its worker processes) until the end of the epoch
    or ``--time-limit`` seconds.
``save``
    Run to mid-epoch, save the state with the loader's own mechanism, then go on,
    uninterrupted, to the end of the epoch: the reference stream.
``resume``
    A new process resumes from that state (time to its first batch) and runs to
    the end of the epoch.
``first``
    Only the time to the first batch: from building the loader (from the state in
    ``--state``, when given) to its first batch, then exit. The harness repeats it,
    alternating with ``window``, for the first batch's and resume's ratios.
``window``
    The reference for plitzer's first batch and resume: in a fresh process, the
    time to decode one window's row groups (rank 0 of ``--world``, from the plan)
    with pyarrow on ``--workers`` threads: the window the first batch needs, and the
    one the lanes stand in at the step ``save`` stops at.

``save`` and ``resume`` record a digest of every delivered document (plitzer: of
every batch) so that the harness can compare the two streams.

Every batch leaves the loader as torch tensors: ``(lanes, seq_len)`` for plitzer;
for the document loaders, the batch's tokens concatenated plus document offsets
(what a varlen-attention step takes).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import resource
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from plitzer.bench.runners import RUNNERS, Item, LitdataRunner, PlitzerRunner, Runner

# -- measurement -------------------------------------------------------------------


def cpu_seconds() -> float:
    """CPU seconds of this process and its children: reaped ones and live ones (workers)."""
    import psutil

    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime
    for child in psutil.Process().children(recursive=False):
        try:
            t = child.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return float(total)


# -- modes ---------------------------------------------------------------------------


def count(item: Item) -> tuple[int, int]:
    """(tokens, documents) in a batch; documents is 0 for packed rows."""
    tokens, offsets = item
    if isinstance(tokens, int):  # pyarrow: counts of a decoded file
        return tokens, int(offsets)
    return int(tokens.numel()), 0 if offsets is None else int(offsets.numel()) - 1


def digests(item: Item, docs: bool, rows: bool = False) -> tuple[list[int], list[int]]:
    """A 64-bit digest and the token count of every document (or row, or of the whole batch)."""
    tokens, offsets = item
    if rows and tokens.dim() == 2:  # packed rows of a peer: a resume may reorder or lose rows
        arr = np.ascontiguousarray(tokens.numpy())
        return [_digest(r) for r in arr], [arr.shape[1]] * arr.shape[0]
    flat = np.ascontiguousarray(tokens.numpy()).reshape(-1)
    if not docs or offsets is None:
        return [_digest(flat)], [len(flat)]
    off = offsets.numpy()
    return [_digest(flat[off[i] : off[i + 1]]) for i in range(len(off) - 1)], np.diff(off).tolist()


def _digest(a: NDArray[Any]) -> int:
    # Documents compare by value: widen to int64 so int32 and int64 copies agree.
    return int.from_bytes(hashlib.blake2b(a.astype(np.int64).tobytes(), digest_size=8).digest(), "little")


def run_throughput(r: Runner, out: dict[str, Any]) -> None:
    a = r.args
    t0 = time.perf_counter()
    c0 = cpu_seconds()
    it = r.open(None)
    first = next(it)
    t1 = time.perf_counter()
    c1 = cpu_seconds()
    out["first_batch_s"] = t1 - t0
    padded0 = r.padded or 0
    tokens = docs = batches = 0
    capped = False
    t2, c2 = t1, c1
    for batches, item in enumerate(it, 1):
        n, d = count(item)
        tokens += n
        docs += d
        if batches % 8 == 0 and time.perf_counter() - t1 > a.time_limit:
            capped = True
            break
    t2 = time.perf_counter()
    c2 = cpu_seconds()
    n0, d0 = count(first)
    if tokens == 0:  # one batch in all: measure it from the start instead
        t1, c1, tokens, docs, batches = t0, c0, n0, d0, 1
    out.update(
        wall_s=t2 - t1,
        cpu_s=c2 - c1,
        tokens=tokens,
        docs=docs,
        batches=batches,
        first_tokens=n0,
        first_docs=d0,
        capped=capped,
        epoch_batches=r.batches_per_epoch(),
    )
    if isinstance(r, PlitzerRunner):
        out["peak_held_bytes"] = r.peak_bytes()
    if r.padded is not None:
        out["padded_tokens"] = r.padded - padded0
    if isinstance(r, LitdataRunner):
        out["chunk_tokens"], out["block_tokens"] = r.kept_tokens()
    del it


def run_save(r: Runner, out: dict[str, Any], state_path: Path, records: Path) -> None:
    it = r.open(None)
    stop = max(1, r.batches_per_epoch() // 2)
    dig: list[int] = []
    lens: list[int] = []
    split = -1
    for i, item in enumerate(it):
        d, n = digests(item, r.docs, r.row_digests)
        dig += d
        lens += n
        if i + 1 == stop:
            t = time.perf_counter()
            state = r.save()
            out["save_s"] = time.perf_counter() - t
            out["state_bytes"] = len(state)
            state_path.write_bytes(state)
            split = len(dig)
    out.update(stop_batch=stop, split=split)
    np.save(records / "save-digests.npy", np.array(dig, dtype=np.uint64))
    np.save(records / "save-lengths.npy", np.array(lens, dtype=np.int64))
    del it


def run_resume(r: Runner, out: dict[str, Any], state_path: Path, records: Path) -> None:
    state = state_path.read_bytes()
    t0 = time.perf_counter()
    it = r.open(state)
    dig: list[int] = []
    lens: list[int] = []
    first = True
    for item in it:
        if first:
            out["resume_s"] = time.perf_counter() - t0
            first = False
        d, n = digests(item, r.docs, r.row_digests)
        dig += d
        lens += n
    np.save(records / "resume-digests.npy", np.array(dig, dtype=np.uint64))
    np.save(records / "resume-lengths.npy", np.array(lens, dtype=np.int64))
    del it


def run_first(r: Runner, out: dict[str, Any], state_path: Path | None) -> None:
    state = state_path.read_bytes() if state_path is not None else None
    t0 = time.perf_counter()
    it = r.open(state)
    next(it)
    out["first_s"] = time.perf_counter() - t0
    del it


def run_window(args: argparse.Namespace, out: dict[str, Any]) -> None:
    """Seconds to decode (pyarrow, ``workers`` threads) the rank's share of a window, fresh process."""
    from concurrent.futures import ThreadPoolExecutor

    import pyarrow.parquet as pq

    import planner
    from planner.order.layout import Layout

    plan = planner.plan(args.data, seed=args.seed, lanes=args.lanes, window=args.window, world=args.world)
    ix = plan.dataset
    files, groups = ix.frame["file"].to_list(), ix.frame["row_group"].to_list()
    ep = plan.epoch(0)
    layout = Layout.one(args.lanes, args.seq_len)
    stop = max(1, layout.step_at_run(ix.tokens) // 2)  # the step run_save stops at
    starts = np.cumsum(ep.window_tokens) - ep.window_tokens
    mid = int(np.searchsorted(starts, layout.run_at(stop), side="right")) - 1
    root = Path(args.data)
    for name, window in (("window", 0), ("resume_window", mid)):
        rgs = ep.order[ep.reads_of(window, 0)].tolist()

        def decode(g: int) -> int:
            f = root / files[g] if root.is_dir() else root
            col = pq.ParquetFile(f).read_row_group(groups[g], columns=[ix.column], use_threads=False).column(0)
            return sum(len(c.values) for c in col.chunks)

        t = time.perf_counter()
        with ThreadPoolExecutor(args.workers) as pool:
            tokens = sum(pool.map(decode, rgs))
        out[f"{name}_s"] = time.perf_counter() - t
        out[f"{name}_tokens"] = tokens
        out[f"{name}_index"] = window


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m plitzer.bench._run_one")
    ap.add_argument("loader", choices=sorted(RUNNERS))
    ap.add_argument("--data", required=True)
    ap.add_argument("--mode", choices=["convert", "throughput", "save", "resume", "window", "first"], required=True)
    ap.add_argument("--out", required=True, help="JSON file to write (records go beside it)")
    ap.add_argument("--work", required=True, help="folder for converted copies")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--column", default=None)
    ap.add_argument("--lanes", type=int, default=32)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--budget", type=int, default=1 << 30)
    ap.add_argument("--world", type=int, default=1, help="window mode: the rank's share of world")
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--state", default=None, help="state file (save, resume)")
    args = ap.parse_args(argv)
    out_path = Path(args.out)
    out: dict[str, Any] = {"loader": args.loader, "mode": args.mode, "python": sys.executable}
    t = time.perf_counter()
    runner = RUNNERS[args.loader](args)
    out["setup_s"] = time.perf_counter() - t
    if args.mode == "convert":
        t = time.perf_counter()
        out["converted_bytes"] = runner.convert()
        out["convert_s"] = time.perf_counter() - t
    elif args.mode == "throughput":
        run_throughput(runner, out)
    elif args.mode == "window":
        run_window(args, out)
    elif args.mode == "first":
        run_first(runner, out, Path(args.state) if args.state else None)
    elif args.mode == "save":
        run_save(runner, out, Path(args.state), out_path.parent)
    else:
        run_resume(runner, out, Path(args.state), out_path.parent)
    out["ru_maxrss_kib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out_path.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    sys.stderr.flush()
