"""Shared pieces of the S3 benchmarks (s3.py's latency mode, cluster.py's real run).

* :class:`ProxyProcess`: tests/s3_fixtures.py's FaultProxy (delay and pacing) in a
  process of its own, so that its CPU is not the client's; its log stamps each
  request with its arrival time (``time.time()``, the same clock in every process of
  the machine), so a benchmark can count what arrived between two moments;
* :func:`put_all`: a folder's Parquet files uploaded on threads;
* :func:`raw_footers`: the raw boto3 baseline, listing a prefix and fetching the last
  64 KiB (what a footer read fetches) of a share of its files on threads.
"""

from __future__ import annotations

import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parent.parent
TAIL = 64 << 10  # the bytes a footer read fetches from the end of a file (planner.catalog.footer)


class Seen(NamedTuple):
    """One request as the proxy saw it."""

    method: str
    path: str
    query: str
    range: str | None
    status: int
    body_bytes: int
    at: float  # arrival, time.time()

    @property
    def is_list(self) -> bool:
        return self.method == "GET" and "list-type" in self.query

    @property
    def is_object_get(self) -> bool:
        return self.method == "GET" and self.path.count("/") >= 2 and "list-type" not in self.query


class _Stamped(list[Any]):
    """The proxy's request log, with each request's arrival time beside it."""

    def __init__(self) -> None:
        super().__init__()
        self.times: list[float] = []

    def append(self, item: Any) -> None:
        self.times.append(time.time())
        super().append(item)


def _proxy_main(conn: Any, upstream: int, delay_s: float, pace_bps: float) -> None:
    """The proxy in its own process, answering commands on ``conn``."""
    sys.path.insert(0, str(ROOT))
    from tests.s3_fixtures import FaultProxy

    proxy = FaultProxy(upstream, delay_s=delay_s, pace_bps=pace_bps)

    def fresh() -> None:
        proxy.reset()
        with proxy._lock:
            proxy.requests = _Stamped()

    fresh()
    conn.send(proxy.port)
    while True:
        cmd = conn.recv()
        if cmd == "reset":
            fresh()
            conn.send(None)
        elif cmd == "log":
            conn.send([(r.is_list, r.is_object_get, r.body_bytes) for r in proxy.log()])
        elif cmd == "paths":
            conn.send([r.path for r in proxy.log()])
        elif cmd == "requests":
            with proxy._lock:
                reqs, times = list(proxy.requests), list(proxy.requests.times)  # type: ignore[attr-defined]
            rows = zip(reqs, times, strict=True)
            conn.send([(r.method, r.path, r.query, r.range, r.status, r.body_bytes, t) for r, t in rows])
        else:
            proxy.stop()
            conn.send(None)
            return


class ProxyProcess:
    """FaultProxy in front of ``upstream`` (a port of 127.0.0.1), in a process of its own."""

    def __init__(self, upstream: int, delay_s: float, pace_bps: float) -> None:
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_proxy_main, args=(child, upstream, delay_s, pace_bps), daemon=True)
        self._proc.start()
        self.endpoint = f"http://127.0.0.1:{self._conn.recv()}"

    def call(self, cmd: str) -> Any:
        self._conn.send(cmd)
        return self._conn.recv()

    def requests(self) -> list[Seen]:
        """Every request since the last reset, in arrival order, with its arrival time."""
        return [Seen(*r) for r in self.call("requests")]

    def stop(self) -> None:
        self.call("stop")
        self._proc.join(10)


def put_all(client: Any, bucket: str, local: Path, prefix: str, threads: int = 16) -> int:
    """Upload every Parquet file under ``local`` to ``bucket/prefix/...``; the number of files."""
    paths = sorted(local.rglob("*.parquet"))
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda p: client.upload_file(str(p), bucket, f"{prefix}/{p.relative_to(local)}"), paths))
    return len(paths)


def s3_client(opts: dict[str, Any], connections: int = 64) -> Any:
    """A boto3 client for storage options as tests/s3_fixtures.py's ``options`` gives them."""
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=opts["endpoint"],
        aws_access_key_id=opts["key"],
        aws_secret_access_key=opts["secret"],
        region_name=opts["region"],
        config=Config(max_pool_connections=connections),
    )


def raw_footers(
    opts: dict[str, Any], bucket: str, prefix: str, rank: int = 0, world: int = 1, threads: int = 32
) -> tuple[int, int]:
    """List ``prefix`` and GET the last 64 KiB of files ``rank, rank + world, ...`` on ``threads``.

    What a hand-written start-up does: one listing (its pages), one ranged GET a file
    of its share. Returns (files listed, footers fetched).
    """
    s3 = s3_client(opts, max(10, threads * 2))
    objs = [
        o
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        for o in page.get("Contents", [])
    ]

    def tail(o: dict[str, Any]) -> int:
        size = int(o["Size"])
        body = s3.get_object(Bucket=bucket, Key=o["Key"], Range=f"bytes={max(0, size - TAIL)}-{size - 1}")["Body"]
        return len(body.read())

    mine = objs[rank::world]
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(tail, mine))
    return len(objs), len(mine)
