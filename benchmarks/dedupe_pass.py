"""Deduplication (``dedupe=``): the pass's time and memory at 10**6 documents, and 10**8 estimated.

Writes ``--docs`` documents (token lists of mean length ``--mean-length``, a ``url``
column; ``--dup`` of them copies of earlier ones), row groups of ``--rows`` documents,
then measures, each in a fresh process (its peak RSS is its own):

1. ``dedupe="tokens"``, cold cache: wall time and peak RSS (phase 1 reads the token column);
2. ``dedupe="url"``, cold cache (phase 1 reads the url column only);
3. ``dedupe="tokens"`` again, warm (the whole result cached: no data read);
4. the first-occurrence resolution alone on ``--sim`` random keys (10**7 by default), its
   time and the memory it allocates (tracemalloc), from which 10**8 documents are
   estimated: phase 1 is per row group (so linear), the resolution runs bucket by bucket
   of 2**22 keys (so linear too), and phase 1's state is 24 bytes a document (20 for a column key);
5. with ``--spill-keys K``, ``dedupe="tokens"`` cold with the keys spilled into bucket files past
   K keys (one process past ``SPILL_KEYS``, 2**24, does so): its time and peak RSS beside 1.;
6. with ``--spilled K`` (e.g. 10**8), phase 2 of one process over K simulated keys through the
   pass's own spill and bucket-by-bucket resolution: times, disk, peak RSS growth;
7. with ``--ranks N``, ``dedupe="tokens"`` cold as a job of N gloo
   processes (``torch.distributed``, each its own cache folder): each rank's time and peak
   RSS growth, beside one process's (1.): each rank keys 1/N of the row groups and
   resolves only the keys it owns.

    python benchmarks/dedupe_pass.py                  # 10**6 documents, about two minutes
    python benchmarks/dedupe_pass.py --docs 100000 --sim 1000000
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np


def write(out: Path, docs: int, mean: int, dup: float, rows: int, seed: int = 0) -> tuple[int, int]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 2 * mean, docs).astype(np.int64)
    src = np.arange(docs)
    copies = np.flatnonzero(rng.random(docs) < dup)
    copies = copies[copies > 0]
    src[copies] = (rng.random(len(copies)) * copies).astype(np.int64)  # an earlier document
    while True:  # a copy of a copy points at the original
        nxt = src[src]
        if np.array_equal(nxt, src):
            break
        src = nxt
    base_values = rng.integers(0, 50_000, int(lengths.sum()), dtype=np.int32)  # each original's tokens
    base_off = np.concatenate([[0], np.cumsum(lengths)])
    lengths = lengths[src]
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    out.mkdir(parents=True, exist_ok=True)
    per_file = rows * 20
    for f, a in enumerate(range(0, docs, per_file)):
        b = min(docs, a + per_file)
        n = int(offsets[b] - offsets[a])
        gather = np.repeat(base_off[src[a:b]] - (offsets[a:b] - offsets[a]), lengths[a:b]) + np.arange(n)
        off = (offsets[a : b + 1] - offsets[a]).astype(np.int32)
        tokens = pa.ListArray.from_arrays(pa.array(off), pa.array(base_values[gather]))
        urls = pa.array([f"https://site.example/{int(s)}" for s in src[a:b]])
        pq.write_table(pa.table({"tokens": tokens, "url": urls}), out / f"part-{f:04d}.parquet", row_group_size=rows)
    return docs, int(lengths.sum())


def _status(field: str) -> float:
    """A /proc/self/status figure in KiB (Linux); ru_maxrss where there is none."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return float(line.split()[1])
    except OSError:
        pass
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def _reset_peak() -> None:
    """Start VmHWM again from the current RSS (Linux 4.0+; elsewhere the peak is the process's)."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def measure(data: str, key: str, cache: str, spill_keys: int = 0) -> dict[str, float]:
    os.environ["PLITZER_CACHE"] = cache
    if spill_keys:
        import plitzer.selection.firsts

        plitzer.selection.firsts.SPILL_KEYS = spill_keys
    # One-time costs of a fresh process (imports, thread pools) are not the pass's: one tiny pass first.
    import pyarrow as pa
    import pyarrow.parquet as pq

    import plitzer
    from plitzer.selection.dedupe import dedupe_index

    tiny = Path(cache) / "warmup"
    tiny.mkdir(parents=True, exist_ok=True)
    two = pa.table({"tokens": pa.array([[1], [1]], pa.list_(pa.int32())), "url": ["a", "a"]})
    pq.write_table(two, tiny / "w.parquet")
    dedupe_index(plitzer.index(tiny), key, progress=False)
    ix = plitzer.index(data)  # footers (not the pass)
    before = _status("VmRSS")
    _reset_peak()
    t = time.perf_counter()
    dd = dedupe_index(ix, key, progress=False)
    wall = time.perf_counter() - t
    peak = _status("VmHWM")  # this process's own peak (ru_maxrss would carry the parent's across exec)
    return {
        "seconds": wall,
        "peak_rss_mib": peak / 1024,
        "rss_growth_mib": (peak - before) / 1024,
        "row_groups": float(ix.row_groups),
        "dropped": float(dd.frame["rows_duplicate"].sum()),
    }


def rank_measure(data: str, cache: str, rank: int, world: int, port: int) -> dict[str, float]:
    """One rank of a gloo job: ``dedupe="tokens"`` with the ranks' exchange (all_gather_object)."""
    os.environ["PLITZER_CACHE"] = cache
    import torch.distributed as dist

    import plitzer
    from plitzer.selection.dedupe import dedupe_index

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)

    def exchange(value: object) -> list[object]:
        out: list[object] = [None] * world
        dist.all_gather_object(out, value)
        return out

    ix = plitzer.index(data)
    dist.barrier()
    before = _status("VmRSS")
    _reset_peak()
    t = time.perf_counter()
    dd = dedupe_index(ix, "tokens", rank=rank, world=world, exchange=exchange, progress=False)
    wall = time.perf_counter() - t
    peak = _status("VmHWM")
    dist.destroy_process_group()
    return {
        "seconds": wall,
        "rss_growth_mib": (peak - before) / 1024,
        "dropped": float(dd.frame["rows_duplicate"].sum()),
    }


def ranks(data: Path, tmp: Path, world: int) -> list[dict[str, float]]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = [sys.executable, __file__, "--rank-of", str(data), str(tmp), str(world), str(port)]
    procs = [subprocess.Popen([*args, str(r)], stdout=subprocess.PIPE, text=True) for r in range(world)]
    outs = [p.communicate()[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "a rank failed"
    return [json.loads(o.strip().splitlines()[-1]) for o in outs]


def simulate(n: int, dup: float) -> dict[str, float]:
    import tracemalloc

    from plitzer.selection.firsts import first_occurrences

    rng = np.random.default_rng(1)
    keys = rng.integers(0, 2**63, (n, 2), dtype=np.int64).astype(np.uint64)
    copies = np.flatnonzero(rng.random(n) < dup)
    copies = copies[copies > 0]
    keys[copies] = keys[(rng.random(len(copies)) * copies).astype(np.int64)]
    tracemalloc.start()
    t = time.perf_counter()
    drop, _ = first_occurrences(keys)
    wall = time.perf_counter() - t
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {"seconds": wall, "alloc_peak_mib": peak / 2**20, "keys_mib": keys.nbytes / 2**20, "dropped": len(drop)}


def simulate_spilled(n: int, dup: float, block: int = 1_000_000) -> dict[str, float]:
    """Phase 2 of one process over ``n`` keys past ``SPILL_KEYS``: spilled by bucket, resolved one at a time.

    The keys (blocks of ``block`` rows, ``dup`` of each block copies of earlier rows of it) go
    through the pass's own spill (``Spill.keep``, as phase 1's chunks would) into bucket files in
    a temporary folder, then ``resolve_spilled``: its time and this process's peak RSS.
    """
    from types import SimpleNamespace

    from plitzer.selection import firsts as dd

    rng = np.random.default_rng(1)
    blocks = -(-n // block)
    parts: list[Any] = [SimpleNamespace(row_groups=blocks)]  # one row group a block
    chunks = [(0, i, i + 1) for i in range(blocks)]
    before = _status("VmRSS")
    _reset_peak()
    dropped = 0
    with tempfile.TemporaryDirectory(prefix="plitzer-spill-bench-") as tmp:
        spill = dd.Spill(Path(tmp), -(-n // dd.SPILL_KEYS) * 4)
        meta = {}
        t = time.perf_counter()
        for i in range(blocks):
            m = min(block, n - i * block)
            keys = rng.integers(0, 2**63, (m, 2), dtype=np.int64).astype(np.uint64)
            copies = np.flatnonzero(rng.random(m) < dup)
            copies = copies[copies > 0]
            keys[copies] = keys[(rng.random(len(copies)) * copies).astype(np.int64)]
            one = np.array([m], np.int64)
            h = {"n": one, "m": one, "x": np.zeros(1, np.int64), "excl": np.zeros(0, np.int64)}
            meta[i] = spill.keep(i, {**h, "pos": np.arange(m, dtype=np.int32), "keys": keys})
        spilled = time.perf_counter() - t
        disk = sum(p.stat().st_size for p in Path(tmp).iterdir())
        t = time.perf_counter()
        res = dd.resolve_spilled(parts, chunks, meta, spill)
        wall = time.perf_counter() - t
        dropped = int(res.dup[0].counts.sum())
    peak = _status("VmHWM")
    return {
        "spill_s": spilled,
        "seconds": wall,
        "buckets": float(spill.buckets),
        "disk_mib": disk / 2**20,
        "rss_growth_mib": (peak - before) / 1024,
        "dropped": float(dropped),
    }


def _child(*args: str) -> dict[str, float]:
    out = subprocess.run([sys.executable, __file__, *args], check=True, capture_output=True, text=True)
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=1_000_000)
    ap.add_argument("--mean-length", type=int, default=40)
    ap.add_argument("--dup", type=float, default=0.05)
    ap.add_argument("--rows", type=int, default=10_000, help="documents a row group")
    ap.add_argument("--sim", type=int, default=10_000_000, help="keys of the simulated resolution")
    ap.add_argument("--spill-keys", type=int, default=0, help="also a cold tokens pass spilling past this many keys")
    ap.add_argument("--measure", nargs=4, metavar=("DATA", "KEY", "CACHE", "SPILL"), help=argparse.SUPPRESS)
    ap.add_argument("--ranks", type=int, default=0, help="gloo processes of a job run (0: none)")
    ap.add_argument("--simulate", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--spilled", type=int, default=0, help="also phase 2 of one process over this many keys, spilled")
    ap.add_argument("--simulate-spilled", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--rank-of", nargs=5, metavar=("DATA", "TMP", "WORLD", "PORT", "RANK"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank_of:
        d, tmp, world, port, rank = args.rank_of
        print(json.dumps(rank_measure(d, f"{tmp}/rank{rank}", int(rank), int(world), int(port))))
        return
    if args.measure:
        d, k, c, spill = args.measure
        print(json.dumps(measure(d, k, c, int(spill))))
        return
    if args.simulate is not None:
        print(json.dumps(simulate(args.simulate, args.dup)))
        return
    if args.simulate_spilled is not None:
        print(json.dumps(simulate_spilled(args.simulate_spilled, args.dup)))
        return
    with tempfile.TemporaryDirectory(prefix="plitzer-dedupe-bench-") as tmp:
        data = Path(tmp) / "data"
        t = time.perf_counter()
        docs, tokens = write(data, args.docs, args.mean_length, args.dup, args.rows)
        size = sum(p.stat().st_size for p in data.glob("*.parquet"))
        print(f"data: {docs:,} documents, {tokens:,} tokens, {size / 2**20:.0f} MiB ({time.perf_counter() - t:.1f} s)")
        tok = _child("--measure", str(data), "tokens", str(Path(tmp) / "c1"), "0")
        url = _child("--measure", str(data), "url", str(Path(tmp) / "c2"), "0")
        warm = _child("--measure", str(data), "tokens", str(Path(tmp) / "c1"), "0")
        sim = _child("--simulate", str(args.sim), "--dup", str(args.dup))
        rg = tok["row_groups"]
        print(f"dedupe='tokens' cold: {tok['seconds']:.2f} s ({docs / tok['seconds']:,.0f} docs/s), peak RSS "
              f"{tok['peak_rss_mib']:.0f} MiB (+{tok['rss_growth_mib']:.0f}), {tok['seconds'] / rg * 1e3:.1f} ms "
              f"a row group of {args.rows:,}, {tok['dropped']:,.0f} dropped")  # fmt: skip
        print(f"dedupe='url'    cold: {url['seconds']:.2f} s ({docs / url['seconds']:,.0f} docs/s), peak RSS "
              f"{url['peak_rss_mib']:.0f} MiB (+{url['rss_growth_mib']:.0f}), "
              f"{url['dropped']:,.0f} dropped")  # fmt: skip
        print(f"dedupe='tokens' warm: {warm['seconds']:.3f} s (cached), peak RSS {warm['peak_rss_mib']:.0f} MiB")
        if args.spill_keys:
            sp = _child("--measure", str(data), "tokens", str(Path(tmp) / "c3"), str(args.spill_keys))
            assert sp["dropped"] == tok["dropped"], "the spilled pass differs from the in-memory one"
            print(f"dedupe='tokens' cold, keys spilled by bucket past {args.spill_keys:,}: {sp['seconds']:.2f} s, "
                  f"peak RSS {sp['peak_rss_mib']:.0f} MiB (+{sp['rss_growth_mib']:.0f}; in memory: "
                  f"+{tok['rss_growth_mib']:.0f})")  # fmt: skip
        print(f"resolution of {args.sim:,} keys: {sim['seconds']:.2f} s, allocations peak {sim['alloc_peak_mib']:.0f} "
              f"MiB beside {sim['keys_mib']:.0f} MiB of keys")  # fmt: skip
        if args.ranks > 1:
            got = ranks(data, Path(tmp), args.ranks)
            assert all(g["dropped"] == tok["dropped"] for g in got), "the ranks' pass differs from one process's"
            secs = [g["seconds"] for g in got]
            grow = [g["rss_growth_mib"] for g in got]
            print(f"dedupe='tokens' cold, {args.ranks} gloo ranks: {min(secs):.2f}-{max(secs):.2f} s a rank, peak RSS "
                  f"growth {min(grow):.0f}-{max(grow):.0f} MiB a rank (one process: +{tok['rss_growth_mib']:.0f} "
                  "MiB); each rank keys 1/N of the row groups and resolves the keys it owns")  # fmt: skip
        if args.spilled:
            sp = _child("--simulate-spilled", str(args.spilled), "--dup", str(args.dup))
            print(f"phase 2 of one process over {args.spilled:,} keys, spilled: {sp['spill_s']:.1f} s to spill "
                  f"{sp['disk_mib']:,.0f} MiB into {sp['buckets']:.0f} buckets, {sp['seconds']:.1f} s to resolve "
                  f"them one at a time, peak RSS growth +{sp['rss_growth_mib']:.0f} MiB, "
                  f"{sp['dropped']:,.0f} dropped")  # fmt: skip
        scale = 1e8 / docs
        p1 = (tok["seconds"] - sim["seconds"] * docs / args.sim) * scale
        res = sim["seconds"] * 1e8 / args.sim
        print(f"10**8 documents (estimated from the above, one machine of these cores): phase 1 about "
              f"{p1 / 60:.0f} min (split between a job's ranks), resolution about {res:.0f} s, keys held "
              f"{24e8 / 2**30:.1f} GiB (24 bytes a document: key, position, length; 20 for a column key) "
              "plus a bucket's state "
              f"({sim['alloc_peak_mib'] * 1e8 / args.sim / max(1.0, 1e8 / 2**22):.0f} MiB)")  # fmt: skip


if __name__ == "__main__":
    main()
