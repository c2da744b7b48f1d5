"""One epoch from S3 on a loopback server (moto), against the same data on disk.

Starts moto's S3 server on 127.0.0.1 (its own process), uploads synthetic data,
and reports for one epoch of one rank:

* GET requests per row group read (target 1.0: one ranged GET each, no footer,
  no HEAD, no read-ahead), counted by a proxy in front of the server;
* bytes fetched over the token column chunk bytes of those row groups (target
  <= 1.01);
* tokens/s from S3 (straight to the server, no proxy) relative to disk, with the
  index cached (construction is timed separately: one listing, no footer).

    python benchmarks/s3.py --tokens 20000000 --world 1

Loopback moto is a Python server: its per-request cost, not the network, bounds
the S3 figure here; on real S3 the reads overlap with decoding the same way.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=20_000_000)
    ap.add_argument("--docs-per-row-group", type=int, default=500)
    ap.add_argument("--row-groups-per-file", type=int, default=8)
    ap.add_argument("--lanes", type=int, default=64)
    ap.add_argument("--window", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--world", type=int, default=1)
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    os.environ.setdefault("PLITZER_CACHE", tempfile.mkdtemp(prefix="plitzer-bench-cache-"))

    import numpy as np

    import planner
    import plitzer
    import plitzer.synth
    from tests.s3_fixtures import FaultProxy, MotoServer, options, upload

    data = Path(tempfile.mkdtemp(prefix="plitzer-bench-s3-"))
    plitzer.synth.write(
        data,
        tokens=args.tokens,
        seed=0,
        docs_per_row_group=args.docs_per_row_group,
        row_groups_per_file=args.row_groups_per_file,
    )
    settings = {
        "seed": 0,
        "lanes": args.lanes,
        "window": args.window,
        "seq_len": args.seq_len,
        "world": args.world,
        "rank": args.rank,
        "threads": args.threads,
    }
    server = MotoServer()
    proxy = FaultProxy(server.port)
    try:
        client = server.client()
        client.create_bucket(Bucket="bench")
        upload(client, "bench", data, "synth")
        url = "s3://bench/synth"
        direct, counted = options(server.endpoint), options(proxy.endpoint)

        t0 = time.perf_counter()
        ix = planner.index(url, storage_options=counted)
        cold = time.perf_counter() - t0
        footer_gets = sum(r.is_object_get for r in proxy.log())
        files, row_groups = len(ix.files), ix.row_groups
        print(f"dataset: {ix.tokens:,} tokens, {row_groups} row groups in {files} files")
        print(f"index from S3, cold: {cold:.2f} s, {footer_gets} footer GETs for {files} files")

        def epoch(source: object, opts: dict[str, object] | None) -> tuple[float, float, int, int]:
            t0 = time.perf_counter()
            loader = plitzer.Loader(source, storage_options=opts, **settings)  # type: ignore[arg-type]
            built = time.perf_counter() - t0
            t1 = time.perf_counter()
            n = 0
            for batch in loader:
                n += int(np.from_dlpack(batch.tokens).size)
            wall = time.perf_counter() - t1
            loader.close()
            return built, wall, n, loader.reads

        # Counted: every request the loader makes in one epoch, through the proxy.
        proxy.reset()
        _, _, _, reads = epoch(url, counted)
        log = proxy.log()
        lists = sum(r.is_list for r in log)
        gets = [r for r in log if r.is_object_get]
        other = len(log) - lists - len(gets)
        lengths = ix.frame["byte_length"].to_numpy()
        index_of = {
            ("/" + ix.files[fi].location[len("s3://") :], f"bytes={o}-{o + n - 1}"): i
            for i, (fi, o, n) in enumerate(
                zip(ix.frame["file_index"], ix.frame["byte_offset"], ix.frame["byte_length"], strict=True)
            )
        }
        chunk_bytes = sum(int(lengths[index_of[(r.path, r.range or "")]]) for r in gets)
        fetched = sum(r.body_bytes for r in gets)
        print(
            f"requests in one epoch: {lists} listing, {len(gets)} ranged GETs, {other} other; "
            f"peak {proxy.peak_inflight} in flight"
        )
        print(f"GET requests per row group read: {len(gets) / reads:.3f}  (target 1.0; {reads} row groups read)")
        print(f"bytes fetched / token column bytes: {fetched / chunk_bytes:.4f}  (target <= 1.01)")

        # Timed: disk, then S3 straight to the server (index cached for both).
        planner.index(data)
        disk = epoch(data, None)
        s3 = epoch(url, direct)
        for name, (built, wall, n, _) in (("disk", disk), ("s3", s3)):
            print(f"{name:>4}: construct {built * 1e3:7.1f} ms, epoch {wall:6.2f} s, {n / wall / 1e6:7.2f} M tokens/s")
        print(f"S3 tokens/s relative to disk: {disk[1] / s3[1]:.2f}")

        # The server's own ceiling: the same ranged GETs, as many at once, nothing decoded.
        from concurrent.futures import ThreadPoolExecutor

        storage = planner.index(url, storage_options=direct).storage(0)
        wanted = [index_of[(r.path, r.range or "")] for r in gets]
        rows = ix.frame.row

        def fetch(i: int) -> int:
            r = rows(i, named=True)
            return len(storage.read_range(ix.files[r["file_index"]], r["byte_offset"], r["byte_length"]))

        t0 = time.perf_counter()
        with ThreadPoolExecutor(16) as pool:
            got = sum(pool.map(fetch, wanted))
        only = time.perf_counter() - t0
        print(
            f"server ceiling: the same {len(wanted)} GETs alone take {only:.2f} s "
            f"({got / only / 1e6:.0f} MB/s); the S3 epoch took {s3[1]:.2f} s"
        )
    finally:
        proxy.stop()
        server.stop()


if __name__ == "__main__":
    main()
