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

Latency mode (``--latency-ms``): a far-away object store, simulated by the test
proxy (tests/s3_fixtures.py's FaultProxy, in a process of its own) adding a delay
to every request and pacing every connection to ``--pace-mbps`` MB/s. Reported
against the same moto server without the proxy:

* tokens/s of one epoch (index cached), and the ratio (target >= 0.8);
* time to the first batch with a cold cache at ``--cold-files`` files (2,000), and
  raw boto3 listing and fetching the same footers on 32 threads through the same
  proxy (target: plitzer within 1.5x of it);
* requests per row group read, and client CPU per request.

    python benchmarks/s3.py --latency-ms 30 --pace-mbps 100    # 60M tokens, 2,000 cold files

Hub mode (``--store hf``): the same epoch from ``hf://`` on tests/hub_server.py's Hub
(in a process of its own: the API, the redirect of every read to its CDN, ranged
GETs there), straight and through the same proxy, with requests per row group:

    python benchmarks/s3.py --store hf --latency-ms 30 --pace-mbps 100
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _s3_common import ProxyProcess, put_all, raw_footers


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=None, help="default 20M, 60M in latency mode")
    ap.add_argument("--docs-per-row-group", type=int, default=500)
    ap.add_argument("--row-groups-per-file", type=int, default=8)
    ap.add_argument("--lanes", type=int, default=64)
    ap.add_argument("--window", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--world", type=int, default=1)
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--latency-ms", type=float, default=0.0, help="latency mode: delay per request (ms)")
    ap.add_argument("--pace-mbps", type=float, default=100.0, help="latency mode: MB/s per connection")
    ap.add_argument("--cold-files", type=int, default=2000, help="latency mode: files of the cold first batch")
    ap.add_argument("--store", choices=("s3", "hf"), default="s3", help="hf: the Hub's API (tests/hub_server.py)")
    args = ap.parse_args()
    os.environ.setdefault("PLITZER_CACHE", tempfile.mkdtemp(prefix="plitzer-bench-cache-"))
    if args.store == "hf":
        args.tokens = args.tokens or (60_000_000 if args.latency_ms > 0 else 20_000_000)
        hub_mode(args)
        return
    if args.latency_ms > 0:
        # Enough windows that the first one's wait (the one latency cannot hide) is small.
        args.tokens = args.tokens or 60_000_000
        latency_mode(args)
        return
    args.tokens = args.tokens or 20_000_000

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


# -- latency mode --------------------------------------------------------------------


def _cpu() -> float:
    import resource

    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def latency_mode(args: argparse.Namespace) -> None:
    import numpy as np

    import planner
    import plitzer
    import plitzer.synth
    from tests.s3_fixtures import MotoServer, options

    delay, pace = args.latency_ms / 1e3, args.pace_mbps * 1e6
    settings = {"seed": 0, "lanes": args.lanes, "window": args.window, "seq_len": args.seq_len}
    data = Path(tempfile.mkdtemp(prefix="plitzer-bench-s3-"))
    plitzer.synth.write(
        data,
        tokens=args.tokens,
        seed=0,
        docs_per_row_group=args.docs_per_row_group,
        row_groups_per_file=args.row_groups_per_file,
    )
    cold = Path(tempfile.mkdtemp(prefix="plitzer-bench-cold-"))
    # One row group of 20 documents a file: the footers, not the data, are the work.
    plitzer.synth.write(
        cold, tokens=args.cold_files * 20 * 200, seed=1, mean_length=200, docs_per_row_group=20, row_groups_per_file=1
    )
    server = MotoServer()
    proxy = ProxyProcess(server.port, delay, pace)
    print(f"latency mode: {args.latency_ms:g} ms per request, {args.pace_mbps:g} MB/s per connection")
    try:
        client = server.client()
        client.create_bucket(Bucket="bench")

        put_all(client, "bench", data, "synth")
        n_cold = put_all(client, "bench", cold, "cold")
        url = "s3://bench/synth"
        direct, far = options(server.endpoint), options(proxy.endpoint)
        ix = planner.index(url, storage_options=direct)
        print(f"epoch dataset: {ix.tokens:,} tokens, {ix.row_groups} row groups in {len(ix.files)} files")

        def epoch(opts: dict[str, Any]) -> tuple[float, int, float, int]:
            planner.index(url, storage_options=opts)  # cached: one listing
            loader = plitzer.Loader(url, storage_options=opts, **settings)  # type: ignore[arg-type]
            c0, t0, n = _cpu(), time.perf_counter(), 0
            for batch in loader:
                n += int(np.from_dlpack(batch.tokens).size)
            wall, cpu = time.perf_counter() - t0, _cpu() - c0
            loader.close()
            return wall, n, cpu, loader.reads

        # Alternated, twice each, the faster of each kept (the first epoch also warms moto).
        near = epoch(direct)
        proxy.call("reset")
        away = epoch(far)
        log = proxy.call("log")
        near = min(near, epoch(direct))
        again = epoch(far)
        away = min(away, again)
        gets = sum(1 for _, is_get, _ in log if is_get)
        for name, (wall, n, cpu, _) in (("direct", near), ("far", away)):
            print(f"epoch {name:>6}: {wall:6.2f} s, {n / wall / 1e6:7.2f} M tokens/s, client CPU {cpu:.2f} s")
        print(f"epoch tokens/s, far / direct: {near[0] / away[0]:.2f}  (target >= 0.8)")
        print(
            f"requests per row group read: {len(log) / away[3]:.3f} "
            f"({gets} GETs, {len(log) - gets} other, {away[3]} row groups)"
        )
        print(
            f"client CPU per request: {away[2] / max(1, len(log)) * 1e3:.2f} ms (all of the epoch's CPU), "
            f"{(away[2] - near[2]) / max(1, len(log)) * 1e3:+.2f} ms over the direct epoch's"
        )

        # Cold first batch at n_cold files: a fresh cache each time.
        def first_batch(opts: dict[str, Any]) -> float:
            os.environ["PLITZER_CACHE"] = tempfile.mkdtemp(prefix="plitzer-bench-cache-")
            t0 = time.perf_counter()
            with plitzer.Loader("s3://bench/cold", storage_options=opts, **settings) as loader:  # type: ignore[arg-type]
                loader.next_batch()
            return time.perf_counter() - t0

        def raw(endpoint: str) -> float:
            t0 = time.perf_counter()
            raw_footers(options(endpoint), "bench", "cold/", threads=32)
            return time.perf_counter() - t0

        proxy.call("reset")
        cold_far = first_batch(far)
        footer_gets = sum(1 for _, is_get, _ in proxy.call("log") if is_get)
        cold_near = first_batch(direct)
        raw_far = raw(proxy.endpoint)
        print(
            f"cold first batch, {n_cold} files: far {cold_far:.2f} s ({footer_gets} GETs), direct {cold_near:.2f} s; "
            f"raw boto3 listing + {n_cold} footer GETs on 32 threads, far: {raw_far:.2f} s"
        )
        print(f"cold first batch far / raw boto3 far: {cold_far / raw_far:.2f}  (target <= 1.5)")
    finally:
        proxy.stop()
        server.stop()


# -- Hub mode --------------------------------------------------------------------------


def _hub_main(conn: Any, folder: str) -> None:
    """The Hub server in its own process, holding ``folder`` as repository ``bench/synth``."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.hub_server import HubServer, files_of

    server = HubServer()
    server.commit("bench/synth", files_of(Path(folder), "synth"))
    conn.send(server.port)
    conn.recv()
    server.stop()
    conn.send(None)


def hub_mode(args: argparse.Namespace) -> None:
    import multiprocessing as mp

    import numpy as np

    import planner
    import plitzer
    import plitzer.synth

    delay, pace = args.latency_ms / 1e3, args.pace_mbps * 1e6
    settings = {"seed": 0, "lanes": args.lanes, "window": args.window, "seq_len": args.seq_len}
    data = Path(tempfile.mkdtemp(prefix="plitzer-bench-hf-"))
    plitzer.synth.write(
        data,
        tokens=args.tokens,
        seed=0,
        docs_per_row_group=args.docs_per_row_group,
        row_groups_per_file=args.row_groups_per_file,
    )
    ctx = mp.get_context("spawn")
    conn, child = ctx.Pipe()
    hub = ctx.Process(target=_hub_main, args=(child, str(data)), daemon=True)
    hub.start()
    port = conn.recv()
    proxy = ProxyProcess(port, delay, pace)
    url = "hf://datasets/bench/synth/synth"
    direct, far = {"endpoint": f"http://127.0.0.1:{port}"}, {"endpoint": proxy.endpoint}
    print(f"hub mode: {args.latency_ms:g} ms per request, {args.pace_mbps:g} MB/s per connection (proxy)")
    try:
        ix = planner.index(url, storage_options=direct)
        print(f"epoch dataset: {ix.tokens:,} tokens, {ix.row_groups} row groups in {len(ix.files)} files")

        def epoch(opts: dict[str, Any]) -> tuple[float, int, float, int]:
            planner.index(url, storage_options=opts)  # footers cached: the revision and one listing
            loader = plitzer.Loader(url, storage_options=opts, **settings)  # type: ignore[arg-type]
            c0, t0, n = _cpu(), time.perf_counter(), 0
            for batch in loader:
                n += int(np.from_dlpack(batch.tokens).size)
            wall, cpu = time.perf_counter() - t0, _cpu() - c0
            loader.close()
            return wall, n, cpu, loader.reads

        near = epoch(direct)
        epoch(far)  # warms the far footers' cache (their locations name the proxy's endpoint)
        proxy.call("reset")
        away = epoch(far)
        paths = proxy.call("paths")
        near = min(near, epoch(direct))
        away = min(away, epoch(far))
        kinds = {k: sum(1 for p in paths if p.startswith(f"/{k}/")) for k in ("api", "datasets", "cdn")}
        for name, (wall, n, cpu, _) in (("direct", near), ("far", away)):
            print(f"epoch {name:>6}: {wall:6.2f} s, {n / wall / 1e6:7.2f} M tokens/s, client CPU {cpu:.2f} s")
        print(f"epoch tokens/s, far / direct: {near[0] / away[0]:.2f}  (target >= 0.8)")
        print(
            f"requests per row group read: {len(paths) / away[3]:.3f} ({len(paths)} requests: {kinds['api']} to the "
            f"API (revision, listing), {kinds['datasets']} resolves (a redirect each), {kinds['cdn']} ranged GETs "
            f"from the CDN; {away[3]} row groups read)"
        )
    finally:
        proxy.stop()
        conn.send("stop")
        conn.recv()
        hub.join(10)


if __name__ == "__main__":
    main()
