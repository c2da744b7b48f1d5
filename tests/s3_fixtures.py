"""A real S3 server on loopback, and a proxy in front of it that counts and breaks requests.

* :class:`MotoServer` runs moto's S3 server in a separate process on a free port of
  127.0.0.1 (never another address) and stops it at the end.
* :class:`FaultProxy` is a small HTTP/1.1 proxy (asyncio, in a thread, 127.0.0.1
  only) between the loader and the server. It records every request (method,
  path, query, Range, status, body bytes sent, fault) and the peak number in
  flight, and injects faults chosen by a schedule: ``503`` (SlowDown), ``429``
  (TooManyRequests), ``500``
  (InternalError), ``reset`` (RST in the middle of the body), ``truncate``
  (FIN in the middle of the body), ``short`` (a well-formed response that is
  shorter than the range asked for), ``stall`` (no response at all) and
  ``stall_body`` (half the body, then nothing).
  It can also add latency: ``delay_s`` before each response and ``pace_bps``, the
  most bytes per second it sends on one connection (benchmarks/s3.py's latency mode),
  and go away: :meth:`FaultProxy.refuse` drops every open connection and refuses new
  ones (nothing listens on its port) for a given number of seconds, as a store's
  endpoint in an incident or a restart.
* :class:`SeededFaults` is such a schedule: each attempt at a (path, range) fails
  with a probability and a kind drawn from a hash of (seed, path, range, attempt),
  so the same requests fail in every run whatever the thread timing, and at most
  ``max_in_a_row`` attempts in a row fail (the faults are transient).

The pytest fixtures (``s3``: the server and a bucket with generated data) are at
the end; benchmarks/s3.py uses the same classes.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import SynthDataset
from tests.net import free_port

HOST = "127.0.0.1"
KEY, SECRET, REGION = "plitzer-test", "plitzer-test-secret", "us-east-1"
FAULTS = ("503", "429", "500", "reset", "truncate", "short", "stall", "stall_body")


class MotoServer:
    """moto's S3 server in its own process on 127.0.0.1."""

    def __init__(self) -> None:
        self.port = free_port()
        self.endpoint = f"http://{HOST}:{self.port}"
        env = {**os.environ, "MOTO_ALLOW_NONEXISTENT_REGION": "true"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", HOST, "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=1):
                    break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    msg = f"moto server did not start on {self.endpoint}"
                    raise RuntimeError(msg) from None
                time.sleep(0.1)

    def client(self) -> Any:
        import boto3

        return boto3.client(
            "s3", endpoint_url=self.endpoint, aws_access_key_id=KEY, aws_secret_access_key=SECRET, region_name=REGION
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def options(endpoint: str, **extra: Any) -> dict[str, Any]:
    """storage_options for a loopback endpoint, with test-friendly retry settings."""
    return {"endpoint": endpoint, "region": REGION, "key": KEY, "secret": SECRET, **extra}


def upload(client: Any, bucket: str, local: Path, prefix: str) -> list[str]:
    keys = []
    for p in sorted(local.rglob("*.parquet")):
        key = f"{prefix}/{p.relative_to(local).as_posix()}"
        client.upload_file(str(p), bucket, key)
        keys.append(key)
    return keys


# -- the proxy ------------------------------------------------------------------------


@dataclass
class Request:
    method: str
    path: str
    query: str
    range: str | None
    status: int = 0
    body_bytes: int = 0
    fault: str | None = None

    @property
    def is_object_get(self) -> bool:
        """A GET of an object (not a listing)."""
        return self.method == "GET" and self.path.count("/") >= 2 and "list-type" not in self.query

    @property
    def is_list(self) -> bool:
        return self.method == "GET" and "list-type" in self.query


Schedule = Callable[[Request, int], "str | None"]


_VOLATILE = ("ifgenerationmatch=", "generation=")  # GCS: the object's generation, new every upload


@dataclass
class SeededFaults:
    """Faults on object GETs, drawn from a hash of (seed, path, range, attempt)."""

    seed: int
    rate: float = 0.3
    kinds: tuple[str, ...] = FAULTS
    max_in_a_row: int = 2
    lists: bool = False
    rotate: bool = False  # kinds in turn (each one surely used) instead of drawn
    _used: int = 0

    def __call__(self, req: Request, attempt: int) -> str | None:
        if not (req.is_object_get or (self.lists and req.is_list)) or attempt >= self.max_in_a_row:
            return None
        # The query without what changes from run to run (GCS's ifGenerationMatch carries the
        # object's generation, a timestamp), so the same requests draw the same faults every run.
        query = "&".join(p for p in (req.query or "").split("&") if not p.lower().startswith(_VOLATILE))
        h = hashlib.sha256(f"{self.seed}|{req.path}|{query}|{req.range}|{attempt}".encode()).digest()
        u = int.from_bytes(h[:8], "little") / 2**64
        if u >= self.rate:
            return None
        self._used += 1
        if self.rotate:
            return self.kinds[(self._used - 1) % len(self.kinds)]
        return self.kinds[int.from_bytes(h[8:16], "little") % len(self.kinds)]


def always(kind: str) -> Schedule:
    """Every ranged object GET fails with ``kind`` (a persistent fault)."""
    return lambda req, attempt: kind if req.is_object_get and req.range else None


class FaultProxy:
    """An HTTP/1.1 proxy on 127.0.0.1 that records requests and injects faults."""

    def __init__(
        self, upstream_port: int, *, stall_s: float = 5.0, delay_s: float = 0.0, pace_bps: float | None = None
    ) -> None:
        self.upstream_port = upstream_port
        self.stall_s = stall_s
        self.delay_s = delay_s
        self.pace_bps = pace_bps
        self.schedule: Schedule | None = None
        self.requests: list[Request] = []
        self.inflight = 0
        self.peak_inflight = 0
        self.refusals = 0  # connections dropped by refuse()
        self._writers: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None
        self._stopping = False
        self._attempts: dict[tuple[str, str, str | None], int] = {}
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name="fault-proxy", daemon=True)
        self._thread.start()
        self._ready.wait(10)
        self.endpoint = f"http://{HOST}:{self.port}"

    # -- control (any thread) --

    def reset(self, schedule: Schedule | None = None) -> None:
        with self._lock:
            self.schedule = schedule
            self.requests = []
            self._attempts = {}
            self.peak_inflight = self.inflight

    def stop_faults(self) -> None:
        """From now, every request is passed on as it is (the log is kept)."""
        with self._lock:
            self.schedule = None

    def log(self) -> list[Request]:
        with self._lock:
            return list(self.requests)

    def refuse(self, seconds: float) -> None:
        """From now, for ``seconds``: every open connection reset, every new one refused."""
        asyncio.run_coroutine_threadsafe(self._refuse(seconds), self._loop).result(10)

    def stop(self) -> None:
        self._stopping = True
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._stop_event.set)
        self._thread.join(10)

    # -- the server (proxy thread) --

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._serve_forever())
        self._loop.close()

    async def _refuse(self, seconds: float) -> None:
        if self._server is not None:
            self._server.close()  # nothing listens: connecting is refused (ECONNREFUSED)
            self._server = None
        for w in list(self._writers):
            self.refusals += 1
            _reset(w)
        await asyncio.sleep(0)
        self._relisten = self._loop.create_task(self._listen(seconds))

    async def _listen(self, after: float) -> None:
        await asyncio.sleep(after)
        if self._stopping or self._server is not None:
            return
        self._server = await asyncio.start_server(self._client, HOST, self.port, reuse_address=True)

    async def _serve_forever(self) -> None:
        self._stop_event = asyncio.Event()
        self._server = await asyncio.start_server(self._client, HOST, 0)
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        try:
            await self._stop_event.wait()
        finally:
            if self._server is not None:
                self._server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await asyncio.sleep(0.05)  # let the closed transports finish closing

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, target, _ = lines[0].split(" ", 2)
                headers = _headers(lines[1:])
                body = b""
                if "chunked" in headers.get("transfer-encoding", ""):
                    msg = "the test proxy does not take chunked request bodies"
                    raise RuntimeError(msg)
                n = int(headers.get("content-length", "0") or 0)
                if n:
                    body = await reader.readexactly(n)
                path, _, query = target.partition("?")
                req = Request(method, path, query, headers.get("range"))
                with self._lock:
                    ident = (req.path, req.query, req.range)
                    attempt = self._attempts.get(ident, 0)
                    self._attempts[ident] = attempt + 1
                    req.fault = self.schedule(req, attempt) if self.schedule else None
                    self.requests.append(req)
                    self.inflight += 1
                    self.peak_inflight = max(self.peak_inflight, self.inflight)
                try:
                    keep = await self._serve(req, lines, body, writer)
                finally:
                    with self._lock:
                        self.inflight -= 1
                if not keep:
                    return
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._writers.discard(writer)
            with contextlib.suppress(Exception):
                writer.close()

    async def _serve(self, req: Request, lines: list[str], body: bytes, writer: asyncio.StreamWriter) -> bool:
        fault = req.fault
        if fault in ("503", "429", "500"):
            code, reason, text = {
                "503": ("SlowDown", "Slow Down", "Please reduce your request rate."),
                "429": ("TooManyRequests", "Too Many Requests", "Please reduce your request rate."),
                "500": ("InternalError", "Internal Server Error", "We encountered an internal error."),
            }[fault]
            xml = f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{text}</Message></Error>'
            payload = xml.encode()
            writer.write(
                f"HTTP/1.1 {fault} {reason}\r\nContent-Type: application/xml\r\n"
                f"Content-Length: {len(payload)}\r\n\r\n".encode()
                + payload
            )
            await writer.drain()
            req.status = int(fault)
            return True
        if fault == "stall":
            await asyncio.sleep(self.stall_s)
            _reset(writer)
            return False
        if self.delay_s:
            await asyncio.sleep(self.delay_s)  # the round trip to a far server
        # Forward on a fresh upstream connection that the server closes after one response.
        fwd = [lines[0]] + [ln for ln in lines[1:] if ln and not ln.lower().startswith("connection:")]
        ur, uw = await asyncio.open_connection(HOST, self.upstream_port)
        try:
            uw.write(("\r\n".join([*fwd, "Connection: close", "", ""])).encode("latin-1") + body)
            await uw.drain()
            rhead = await ur.readuntil(b"\r\n\r\n")
            rbody = await ur.read()
        finally:
            uw.close()
        rlines = rhead.decode("latin-1").split("\r\n")
        req.status = int(rlines[0].split(" ", 2)[1])
        rheaders = _headers(rlines[1:])
        kept = [ln for ln in rlines[1:] if ln and not ln.lower().startswith(("connection:", "keep-alive:"))]
        framed = "content-length" in rheaders or "chunked" in rheaders.get("transfer-encoding", "")
        half = len(rbody) // 2
        if fault == "short" and "content-length" in rheaders and len(rbody) > 1:
            rbody = rbody[: max(1, len(rbody) - 1 - len(rbody) // 10)]
            kept = [f"Content-Length: {len(rbody)}" if ln.lower().startswith("content-length:") else ln for ln in kept]
        writer.write(("\r\n".join([rlines[0], *kept, "", ""])).encode("latin-1"))
        if fault in ("reset", "truncate", "stall_body"):
            writer.write(rbody[:half])
            req.body_bytes = half
            await writer.drain()
            if fault == "stall_body":
                await asyncio.sleep(self.stall_s)
            if fault == "truncate":
                writer.close()
            else:
                _reset(writer)
            return False
        if self.pace_bps:
            await self._paced(writer, rbody)
        else:
            writer.write(rbody)
        req.body_bytes = 0 if req.method == "HEAD" else len(rbody)
        await writer.drain()
        return framed or req.method == "HEAD"

    async def _paced(self, writer: asyncio.StreamWriter, body: bytes) -> None:
        """Send ``body`` at no more than ``pace_bps`` on this connection."""
        assert self.pace_bps
        loop = asyncio.get_running_loop()
        t0, step = loop.time(), 64 << 10
        for i in range(0, len(body), step):
            writer.write(body[i : i + step])
            await writer.drain()
            ahead = t0 + min(i + step, len(body)) / self.pace_bps - loop.time()
            if ahead > 0:
                await asyncio.sleep(ahead)


def _headers(lines: list[str]) -> dict[str, str]:
    out = {}
    for ln in lines:
        if ":" in ln:
            k, _, v = ln.partition(":")
            out[k.strip().lower()] = v.strip()
    return out


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP RST (SO_LINGER 0), as a dropped connection looks to the client."""
    sock = writer.get_extra_info("socket")
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


# -- pytest fixtures -----------------------------------------------------------------


@dataclass
class S3Data:
    """The server, its bucket, and the generated datasets (local folder and S3 URL)."""

    server: MotoServer
    bucket: str
    local: dict[str, Path] = field(default_factory=dict)
    url: dict[str, str] = field(default_factory=dict)

    def client(self) -> Any:
        return self.server.client()

    def options(self, **extra: Any) -> dict[str, Any]:
        return options(self.server.endpoint, **extra)


@pytest.fixture(scope="session")
def s3(synth_dataset: SynthDataset) -> Iterator[S3Data]:
    """moto's S3 server with bucket ``plitzer`` holding ``synth/`` (five files)."""
    server = MotoServer()
    try:
        client = server.client()
        bucket = "plitzer"
        client.create_bucket(Bucket=bucket)
        data = S3Data(server=server, bucket=bucket)
        d = synth_dataset(tokens=200_000, seed=11, docs_per_row_group=50, row_groups_per_file=4, mean_length=200)
        upload(client, bucket, d, "synth")
        data.local["synth"], data.url["synth"] = d, f"s3://{bucket}/synth"
        yield data
    finally:
        server.stop()


@pytest.fixture
def proxy(s3: S3Data) -> Iterator[FaultProxy]:
    """A fresh counting, fault-injecting proxy in front of the session's server."""
    p = FaultProxy(s3.server.port, stall_s=3.0)
    try:
        yield p
    finally:
        p.stop()
