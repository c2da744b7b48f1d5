"""A stop is a stop: every way a run ends, while its store is down, ends at once.

Each test runs a real process that opens a loader on a store, takes a batch, and is
then left reading while the store is away: a Range server that has been stopped
(nothing listens on its port) or the S3 server behind a proxy that refuses every
connection. Its reads retry (``retry_deadline`` 600 s, the default), and the run is
ended one way: ``close()`` from another thread while a thread is blocked in
``next()``, the script's end with two loaders open and their training threads
blocked, Ctrl-C, SIGTERM under torchrun, Ctrl-C in a Grain loop. The test asserts
the time to exit (0.4 waited out the deadline: over 60 s in every case) and a clean
end (no traceback from a worker thread, no abort).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests import exit_stress
from tests.hub_server import StaticServer, WebData, web
from tests.s3_fixtures import FaultProxy, S3Data, always, options, s3

__all__ = ["s3", "web"]  # the fixtures, imported for pytest

_SCRIPT = r"""
import json, os, signal, sys, threading, time
import plitzer

src, opts, ending, go = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], sys.argv[4]
hang = os.environ.get("OUTAGE_HANG") == "1"  # the store accepts and never answers: no retries, reads in flight
cfg = dict(seed=1, lanes=8, window=1, seq_len=64, threads=2, storage_options=opts)


def reads_wait(loaders):
    if hang:
        time.sleep(1.5)  # every read ahead is in flight, its answer never coming (read timeout 30 s)
        return
    while not all(ld.stats.retries > 0 for ld in loaders):
        time.sleep(0.02)
    time.sleep(0.3)  # inside the pause between attempts


def wait_for_go():
    while not os.path.exists(go):
        time.sleep(0.02)


def watch(loaders):
    # Says "waiting" once every loader's reads retry against the store that is away.
    def run():
        reads_wait(loaders)
        print("waiting", flush=True)
    threading.Thread(target=run, daemon=True).start()


def train(ld):
    try:
        while True:
            ld.next_batch()
    except plitzer.errors.PlitzerError as e:
        print(f"stopped: {type(e).__name__}: {e}", flush=True)


if ending == "torchrun":
    import plitzer.torch
    ds = plitzer.torch.Dataset(src, **cfg)
    it = iter(ds)
    next(it)
    print("ready", flush=True)
    wait_for_go()
    watch([ds._loader])
    for _ in it:
        pass
elif ending == "grain":
    import plitzer.grain
    it = iter(plitzer.grain.Dataset(src, **cfg))
    next(it)
    print("ready", flush=True)
    wait_for_go()
    watch([it.loader])
    for _ in it:
        pass
else:
    loaders = [plitzer.Loader(src, **cfg) for _ in range(2 if ending == "end" else 1)]
    for ld in loaders:
        ld.next_batch()
    print("ready", flush=True)
    wait_for_go()
    if ending == "sigint":
        with loaders[0] as ld:
            watch([ld])
            while True:
                ld.next_batch()
    threads = [threading.Thread(target=train, args=(ld,), name=f"train-{i}") for i, ld in enumerate(loaders)]
    for t in threads:
        t.start()
    reads_wait(loaders)
    print("waiting", flush=True)
    if ending == "close":
        t0 = time.monotonic()
        loaders[0].close()
        print(f"closed in {time.monotonic() - t0:.3f} s", flush=True)
        threads[0].join(5)
        print(f"thread alive {threads[0].is_alive()}", flush=True)
    # "end": the script ends here, its loaders open, their threads blocked in next_batch()
"""


class _StoppableServer(StaticServer):
    """The static server, whose ``down()`` also resets the connections it holds open (keep-alive)."""

    def __init__(self, root: Path) -> None:
        self.open: list[socket.socket] = []
        super().__init__(root)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.lock:
            self.open.append(request)
        super().process_request(request, client_address)

    def hang(self) -> None:
        """From now, every request (on a new connection or a kept one) is read and never answered."""
        self.release = threading.Event()
        release = self.release

        def held(req: Any, attempt: int) -> None:
            release.wait()  # the handler is held until the test ends; then no fault, an answer

        self.schedule = held

    def down(self) -> None:
        self.stop()  # nothing listens on the port any more
        with self.lock:
            for conn in self.open:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)


@dataclass
class Store:
    """A source whose store can be taken away: ``down()`` makes every connection fail."""

    name: str
    url: str
    options: dict[str, Any] | None
    down: Any


@pytest.fixture(params=["http", "s3"])
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    if request.param == "http":
        w: WebData = request.getfixturevalue("web")
        server = _StoppableServer(w.root)  # its own server over the session's files: this one is stopped
        try:
            yield Store("http", f"{server.endpoint}/synth/manifest.txt", None, server.down)
        finally:
            if server.socket.fileno() != -1:
                server.stop()
    else:
        s: S3Data = request.getfixturevalue("s3")
        proxy = FaultProxy(s.server.port)
        try:
            yield Store("s3", s.url["synth"], options(proxy.endpoint), lambda: proxy.refuse(600))
        finally:
            proxy.stop()


@pytest.fixture(params=["http", "s3"])
def hanging_store(request: pytest.FixtureRequest) -> Iterator[Store]:
    """A store that, once down, accepts every request and never answers it (no error, so no retry)."""
    if request.param == "http":
        w: WebData = request.getfixturevalue("web")
        server = _StoppableServer(w.root)
        try:
            yield Store("http", f"{server.endpoint}/synth/manifest.txt", None, server.hang)
        finally:
            if hasattr(server, "release"):
                server.release.set()
            server.stop()
    else:
        s: S3Data = request.getfixturevalue("s3")
        proxy = FaultProxy(s.server.port, stall_s=600)
        try:
            yield Store("s3", s.url["synth"], options(proxy.endpoint), lambda: proxy.reset(always("stall")))
        finally:
            proxy.stop()


def _env(tmp: Path) -> dict[str, str]:
    root = str(Path(__file__).resolve().parents[2])
    path = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), root) if p)
    return {**os.environ, "PYTHONPATH": path, "PLITZER_CACHE": str(tmp / "cache"), "PYTHONWARNINGS": "ignore"}


def _run(
    store: Store, ending: str, tmp: Path, *, signal_to: signal.Signals | None = None, hang: bool = False
) -> tuple[float, str, str, int]:
    """Start the script, take the store away once it has a batch, end it; (seconds to exit, out, err, status)."""
    go = tmp / "go"
    cmd = [sys.executable, "-X", "faulthandler", "-c", _SCRIPT]
    if ending == "torchrun":
        script = tmp / "train.py"
        script.write_text(_SCRIPT)
        torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable))
        assert torchrun is not None
        cmd = [torchrun, "--nproc-per-node", "1", "--master-port", "0", str(script)]
    opts = json.dumps(store.options or {})
    # stderr to a file and stdout read through one buffered reader to the end: communicate() would
    # read the pipe past what readline() had already buffered (a line the child printed just after
    # "waiting" was lost that way, under load).
    with (
        (tmp / "stderr.txt").open("w+") as errf,
        subprocess.Popen(
            [*cmd, store.url, opts, ending, str(go)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=errf,
            text=True,
            env={**_env(tmp), "OUTAGE_HANG": "1" if hang else "0"},
            start_new_session=True,
        ) as p,
    ):

        def err() -> str:
            errf.seek(0)
            return errf.read()

        try:
            assert p.stdout is not None
            assert p.stdout.readline().strip() == "ready", err()
            store.down()
            go.touch()
            assert p.stdout.readline().strip() == "waiting", err()
            t0 = time.monotonic()
            if signal_to is not None:
                p.send_signal(signal_to)
            p.wait(timeout=60)
            took = time.monotonic() - t0
            return took, p.stdout.read(), err(), p.returncode
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def _clean(err: str) -> None:
    for mark in exit_stress.BAD_MARKS:
        assert mark not in err, err


@pytest.mark.timeout(120)
def test_close_from_another_thread_returns_at_once_and_stops_the_blocked_step(store: Store, tmp_path: Path) -> None:
    took, out, err, code = _run(store, "close", tmp_path)
    assert code == 0, err
    closed = float(out.split("closed in ")[1].split()[0])
    assert closed < 2.0, out  # 0.4: not returned after 60 s (the deadline is 600 s)
    # the thread blocked in next() got a StoppedError
    assert "stopped: StoppedError: the loader was closed" in out, (out, err)
    assert "thread alive False" in out, out
    assert took < 10, (took, out)  # the other thread ended, then the script
    assert "Traceback" not in err, err
    _clean(err)


@pytest.mark.timeout(120)
def test_a_script_that_ends_with_loaders_open_exits_at_once(store: Store, tmp_path: Path) -> None:
    took, out, err, code = _run(store, "end", tmp_path)
    assert code == 0, err
    assert took < 5, (took, out, err)  # two loaders, two training threads blocked in next()
    # Each training thread got a StoppedError: from its closed loader, or from its read, stopped as the
    # interpreter ends (whichever came first).
    assert out.count("stopped: StoppedError: ") == 2, (out, err)
    assert "Traceback" not in err, err
    _clean(err)


@pytest.mark.timeout(120)
def test_ctrl_c_during_an_outage_ends_the_process_at_once(store: Store, tmp_path: Path) -> None:
    took, _, err, code = _run(store, "sigint", tmp_path, signal_to=signal.SIGINT)
    assert took < 5, (took, err)
    assert code == -signal.SIGINT, err  # the script's KeyboardInterrupt, uncaught: Python ends by SIGINT
    assert err.count("Traceback (most recent call last)") == 1 and "KeyboardInterrupt" in err, err
    _clean(err)


@pytest.mark.timeout(120)
def test_ctrl_c_in_a_grain_loop_during_an_outage_ends_at_once(store: Store, tmp_path: Path) -> None:
    pytest.importorskip("grain")
    took, _, err, code = _run(store, "grain", tmp_path, signal_to=signal.SIGINT)
    assert took < 5, (took, err)
    assert code == -signal.SIGINT, err
    assert "KeyboardInterrupt" in err, err
    _clean(err)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_sigterm_under_torchrun_during_an_outage_ends_at_once(store: Store, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    took, _, err, code = _run(store, "torchrun", tmp_path, signal_to=signal.SIGTERM)
    assert took < 10, (took, err)  # torchrun passes SIGTERM to its worker and waits for it
    assert code != 0, err
    _clean(err)


@pytest.mark.timeout(120)
def test_close_returns_at_once_while_reads_hang_on_a_store_that_never_answers(
    hanging_store: Store, tmp_path: Path
) -> None:
    """Reads in flight, not between attempts: 0.5's first cut waited out each attempt's read timeout (30 s)."""
    took, out, err, code = _run(hanging_store, "close", tmp_path, hang=True)
    assert code == 0, err
    closed = float(out.split("closed in ")[1].split()[0])
    assert closed < 2.0, out
    assert "stopped: StoppedError: the loader was closed" in out, (out, err)
    assert "thread alive False" in out, out
    assert took < 10, (took, out)
    assert "Traceback" not in err, err
    _clean(err)


@pytest.mark.timeout(120)
def test_a_script_ends_at_once_while_reads_hang_on_a_store_that_never_answers(
    hanging_store: Store, tmp_path: Path
) -> None:
    took, out, err, code = _run(hanging_store, "end", tmp_path, hang=True)
    assert code == 0, err
    assert took < 5, (took, out, err)
    assert out.count("stopped: StoppedError: ") == 2, (out, err)
    assert "Traceback" not in err, err
    _clean(err)
