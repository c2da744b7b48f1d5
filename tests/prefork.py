"""Rank processes forked from an interpreter that has already imported torch and plitzer.

The gloo tests start about fifty rank processes (``python tests/dist_worker.py ...``),
and a fresh interpreter that imports torch and plitzer costs 2.5-3 CPU seconds here
before it does anything: a tenth of the suite's CPU time. :class:`Popen` takes the same
arguments as :class:`subprocess.Popen` for a script (``[sys.executable, script, *args]``)
and runs it in a child forked from a *zygote*: an interpreter of this worker's that
imported the heavy modules once and then only forks. The child then is what a fresh
interpreter would be after those imports: its own ``argv``, environment, working folder,
standard streams and process group; the script runs as ``__main__`` with its folder
first on ``sys.path`` and ``PYTHONPATH`` before the rest; it ends as a script ends
(normal interpreter shutdown: atexit, threading's exit hooks, the exit status of an
uncaught exception or ``sys.exit``), and the zygote reports its exit status, so
``poll``, ``wait``, ``communicate``, ``kill`` and ``os.killpg`` behave as they do on a
child of ours.

What does not carry over from the environment, because an interpreter reads it only at
start: ``PYTHON*`` settings other than ``PYTHONPATH`` and ``PYTHONWARNINGS`` (which are
applied) fall back to a real process, and so do interpreter flags (``-c``, ``-X``, ``-W``).
The exit stress (tests/exit_stress.py) tests how a fresh interpreter ends, and keeps
real processes. ``PLITZER_TESTS_PREFORK=0`` makes every :class:`Popen` a real one.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

PRELOAD = ("torch", "torch.distributed", "numpy", "pyarrow.parquet", "polars", "planner", "plitzer", "plitzer.torch")
_PASSED = {"PYTHONPATH", "PYTHONWARNINGS", "PYTHONHASHSEED"}  # PYTHONHASHSEED: see _can_fork


class _Zygote:
    """One per process that uses it: started on first use, ended at exit."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock = ours
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")]),
        }
        self.proc = subprocess.Popen(
            [sys.executable, __file__, str(theirs.fileno()), ",".join(PRELOAD)],
            pass_fds=[theirs.fileno()],
            env=env,
            stdin=subprocess.DEVNULL,
        )
        theirs.close()
        self.lock = threading.Lock()  # one spawn at a time
        self.changed = threading.Condition()
        self.spawned: dict[int, int] = {}  # request id -> pid
        self.codes: dict[int, int] = {}  # pid -> exit status (subprocess's convention)
        self.failed: str | None = None
        self.next_id = 0
        threading.Thread(target=self._read, name="prefork-zygote", daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                msg = self.sock.recv(65536)
            except OSError:
                msg = b""
            with self.changed:
                if not msg:
                    self.failed = f"the zygote ended (status {self.proc.poll()})"
                    self.changed.notify_all()
                    return
                m = json.loads(msg)
                if "spawned" in m:
                    self.spawned[m["spawned"]] = m["pid"]
                else:
                    self.codes[m["pid"]] = m["code"]
                self.changed.notify_all()

    def spawn(self, request: dict[str, Any], fds: list[int]) -> int:
        with self.lock:
            self.next_id += 1
            rid = request["id"] = self.next_id
            socket.send_fds(self.sock, [json.dumps(request).encode()], fds)
            with self.changed:
                while rid not in self.spawned:
                    if self.failed:
                        raise RuntimeError(self.failed)
                    self.changed.wait(1.0)
                return self.spawned.pop(rid)

    def wait(self, pid: int, timeout: float | None) -> int | None:
        end = None if timeout is None else time.monotonic() + timeout
        with self.changed:
            while pid not in self.codes:
                if self.failed:
                    raise RuntimeError(self.failed)
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    return None
                self.changed.wait(left if left is not None else 1.0)
            return self.codes[pid]

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)  # the zygote sees its end now, whatever still holds the socket
            self.sock.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


_zygote: _Zygote | None = None
_zygote_lock = threading.Lock()


def _the_zygote() -> _Zygote:
    global _zygote  # noqa: PLW0603 - one per process, started on first use
    with _zygote_lock:
        if _zygote is None or _zygote.failed or _zygote.proc.poll() is not None:
            _zygote = _Zygote()
            atexit.register(_zygote.close)
        return _zygote


def _can_fork(args: Sequence[str], env: Mapping[str, str] | None) -> bool:
    if os.environ.get("PLITZER_TESTS_PREFORK", "1") == "0" or not hasattr(os, "fork"):
        return False
    if len(args) < 2 or args[0] != sys.executable or args[1].startswith("-") or not args[1].endswith(".py"):
        return False
    e = os.environ if env is None else env
    # What an interpreter reads only at its start must be what the zygote started with.
    return all(
        e.get(k) == os.environ.get(k)
        for k in e.keys() | os.environ.keys()
        if k.startswith("PYTHON") and k not in _PASSED
    )


class Popen:
    """``subprocess.Popen`` for ``[sys.executable, script.py, *args]``, forked from the zygote
    (or a real ``subprocess.Popen`` where that cannot stand in for a fresh interpreter)."""

    def __init__(
        self,
        args: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        stdout: int | IO[Any] | None = None,
        stderr: int | IO[Any] | None = None,
        process_group: int | None = None,
    ) -> None:
        self.args = list(args)
        self.returncode: int | None = None
        self.stdout: IO[bytes] | None = None
        self.stderr: IO[bytes] | None = None
        self._real: subprocess.Popen[bytes] | None = None
        if not _can_fork(self.args, env):
            self._real = subprocess.Popen(
                self.args, env=env, cwd=cwd, stdout=stdout, stderr=stderr, process_group=process_group
            )
            self.pid = self._real.pid
            self.stdout, self.stderr = self._real.stdout, self._real.stderr
            return
        close: list[int] = []

        def target(spec: int | IO[Any] | None, inherited: int) -> int:
            if spec is None:
                return inherited
            if spec == subprocess.PIPE:
                r, w = os.pipe()
                close.append(w)
                return -r - 1  # the parent's read end, marked
            if spec == subprocess.DEVNULL:
                fd = os.open(os.devnull, os.O_RDWR)
                close.append(fd)
                return fd
            return spec if isinstance(spec, int) else spec.fileno()

        devnull = os.open(os.devnull, os.O_RDONLY)
        close.append(devnull)
        out = target(stdout, 1)
        if out < 0:
            self.stdout = os.fdopen(-out - 1, "rb")
            out = close[-1]
        if stderr == subprocess.STDOUT:
            err = out
        else:
            err = target(stderr, 2)
            if err < 0:
                self.stderr = os.fdopen(-err - 1, "rb")
                err = close[-1]
        run_env = dict(os.environ if env is None else env)
        request = {
            "argv": self.args[1:],
            "env": run_env,
            "cwd": os.fspath(cwd) if cwd is not None else os.getcwd(),
            "process_group": process_group,
        }
        try:
            self.pid = _the_zygote().spawn(request, [devnull, out, err])
        finally:
            for fd in close:
                os.close(fd)

    def poll(self) -> int | None:
        if self._real is not None:
            self.returncode = self._real.poll()
        elif self.returncode is None:
            self.returncode = _the_zygote().wait(self.pid, 0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self._real is not None:
            self.returncode = self._real.wait(timeout)
            return self.returncode
        if self.returncode is None:
            code = _the_zygote().wait(self.pid, timeout)
            if code is None:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            self.returncode = code
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[bytes | None, bytes | None]:
        if self._real is not None:
            out, err = self._real.communicate(timeout=timeout)
            self.returncode = self._real.returncode
            return out, err
        got: dict[str, bytes] = {}

        def drain(name: str, f: IO[bytes]) -> None:
            got[name] = f.read()
            f.close()

        readers = [
            threading.Thread(target=drain, args=(name, f), daemon=True)
            for name, f in (("out", self.stdout), ("err", self.stderr))
            if f is not None
        ]
        for t in readers:
            t.start()
        end = None if timeout is None else time.monotonic() + timeout
        for t in readers:
            t.join(None if end is None else max(0.0, end - time.monotonic()))
            if t.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
        self.wait(None if end is None else max(0.0, end - time.monotonic()))
        return got.get("out"), got.get("err")

    def send_signal(self, sig: int) -> None:
        if self._real is not None:
            self._real.send_signal(sig)
        elif self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


# -- the zygote ---------------------------------------------------------------------------


def _serve(sock: socket.socket) -> tuple[dict[str, Any], list[int]] | None:
    """Fork a child for each request; report each child's exit. Returns in the child only
    (its request and standard streams); None in the zygote when its parent is gone."""
    import select

    def send(m: dict[str, Any]) -> None:
        with contextlib.suppress(OSError):
            sock.send(json.dumps(m).encode())

    while True:
        while True:  # reap
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            send({"pid": pid, "code": os.waitstatus_to_exitcode(status)})
        ready, _, _ = select.select([sock], [], [], 0.02)
        if not ready:
            continue
        msg, fds, _, _ = socket.recv_fds(sock, 1 << 20, 3)
        if not msg:
            return None
        request = json.loads(msg)
        pid = os.fork()
        if pid == 0:
            return request, fds
        group = request["process_group"]
        if group is not None:
            # The parent sets the child's group too (the child does in _become): whichever runs first,
            # the group exists when this answers, so the next rank can join it. Without it, a rank
            # forked right after rank 0 could ask to join rank 0's group before rank 0 had made it
            # (setpgid: EPERM, seen once in CI).
            with contextlib.suppress(OSError):
                os.setpgid(pid, pid if group == 0 else group)
        for fd in fds:
            os.close(fd)
        send({"spawned": request["id"], "pid": pid})


def _become(request: dict[str, Any], fds: list[int]) -> str:
    """In the child: take on the request's process group, streams, folder, environment and argv."""
    import warnings

    group = request["process_group"]
    if group is not None:
        os.setpgid(0, group)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in set(fds):
        if fd > 2:
            os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    script, *rest = request["argv"]
    sys.argv = [script, *rest]
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [str(Path(script).resolve().parent), *extra, *sys.path[1:]]
    warnings.resetwarnings()
    for option in filter(None, os.environ.get("PYTHONWARNINGS", "").split(",")):
        warnings._setoption(option)  # type: ignore[attr-defined]  # as the interpreter does at start
    return script


if __name__ == "__main__":
    import importlib

    for name in sys.argv[2].split(","):
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    zsock = socket.socket(fileno=int(sys.argv[1]))
    got = _serve(zsock)
    if got is None:
        sys.exit(0)
    zsock.close()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    import runpy

    runpy.run_path(_become(*got), run_name="__main__")
