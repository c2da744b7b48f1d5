"""tests/prefork.py: a rank process forked from the zygote behaves as a fresh one would."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import prefork

SCRIPT = r"""
import atexit, json, os, sys, warnings
import helper  # from the script's own folder, as a fresh interpreter finds it
atexit.register(lambda: print("atexit ran", flush=True))
print(json.dumps({
    "argv": sys.argv, "cwd": os.getcwd(), "env": os.environ.get("PREFORK_PROBE"),
    "pgid_is_pid": os.getpgid(0) == os.getpid(), "helper": helper.NAME,
    "ignored": any(f[0] == "ignore" for f in warnings.filters),
}), flush=True)
what = sys.argv[1]
if what == "raise":
    raise RuntimeError("the script failed")
if what == "sleep":
    import time
    time.sleep(60)
sys.exit(int(what))
"""


@pytest.fixture
def script(tmp_path: Path) -> Path:
    d = tmp_path / "scripts"
    d.mkdir()
    (d / "helper.py").write_text("NAME = 'helper'\n")
    s = d / "probe.py"
    s.write_text(SCRIPT)
    return s


def _both(args: list[str], **kw: object) -> list[tuple[int, str, str]]:
    """(status, stdout, stderr) of the same command from prefork and from subprocess."""
    out = []
    for popen in (prefork.Popen, subprocess.Popen):
        p = popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)  # type: ignore[operator]
        o, e = p.communicate(timeout=120)
        out.append((p.returncode, o.decode(), e.decode()))
    return out


@pytest.mark.parametrize("what", ["0", "3", "raise"])
def test_status_streams_argv_env_and_folder_match_a_fresh_interpreter(script: Path, tmp_path: Path, what: str) -> None:
    env = {**os.environ, "PREFORK_PROBE": "x", "PYTHONWARNINGS": "ignore"}
    forked, fresh = _both([sys.executable, str(script), what], env=env, cwd=tmp_path, process_group=0)
    assert forked[0] == fresh[0] == {"0": 0, "3": 3, "raise": 1}[what]
    assert forked[1] == fresh[1]  # argv, cwd, env, own group, helper import, warnings; then atexit
    assert "atexit ran" in forked[1]
    last = [ln for ln in forked[2].splitlines() if ln.strip()][-1:]
    assert last == [ln for ln in fresh[2].splitlines() if ln.strip()][-1:]  # the same traceback's end, or none
    assert '"pgid_is_pid": true' in forked[1] and '"ignored": true' in forked[1]


def test_kill_wait_timeout_and_poll(script: Path) -> None:
    p = prefork.Popen([sys.executable, str(script), "sleep"], stdout=subprocess.DEVNULL, process_group=0)
    assert p._real is None  # forked, not a fallback
    assert p.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        p.wait(timeout=0.2)
    os.killpg(p.pid, signal.SIGKILL)  # its own process group, as process_group=0 gives
    assert p.wait(timeout=30) == -signal.SIGKILL
    assert p.poll() == -signal.SIGKILL


def test_output_to_a_file_and_stderr_to_stdout(script: Path, tmp_path: Path) -> None:
    log = tmp_path / "log"
    with log.open("wb") as f:
        p = prefork.Popen([sys.executable, str(script), "raise"], stdout=f, stderr=subprocess.STDOUT)
    assert p.wait(timeout=60) == 1
    text = log.read_text()
    assert '"helper": "helper"' in text and "RuntimeError: the script failed" in text


def test_what_a_fork_cannot_stand_in_for_runs_as_a_real_process(script: Path) -> None:
    real = prefork.Popen([sys.executable, "-c", "print(1)"], stdout=subprocess.PIPE)
    assert real._real is not None and real.communicate(timeout=60)[0] == b"1\n"
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONOPTIMIZE": "1"}
    started = time.monotonic()
    p = prefork.Popen([sys.executable, str(script), "0"], env=env, stdout=subprocess.DEVNULL)
    assert p._real is not None  # PYTHONOPTIMIZE is read at start: a real interpreter
    assert p.wait(timeout=60) == 0 and time.monotonic() - started < 60
