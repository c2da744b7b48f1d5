"""Exit stress: many short loaders in fresh processes, ending every way a run ends.

Each child process opens a Loader, takes a few steps and ends in one of these ways:

* ``end``: the script simply ends, the loader never closed;
* ``break``: breaks out of ``for batch in loader`` and ends, never closed;
* ``close``: closes the loader (a ``with`` block) and ends;
* ``raise``: an uncaught exception after k steps (exit status 1);
* ``exit``: ``sys.exit(3)`` after k steps;
* ``sigint``: SIGINT (Ctrl-C) arrives while a step waits on a decode (each step seeks
  to a random place, so it waits on fresh reads); the KeyboardInterrupt must reach
  the loop within a second, and Python then ends with status -SIGINT;
* ``sigterm``: SIGTERM with its default action while a step waits on a decode.

over datasets of tiny row groups (two documents each, thousands of reads a
run) and of large ones, with a cold index cache (a fresh folder) or a warm one, on
local disk or S3 (moto's server on 127.0.0.1), or on S3 that goes down (``s3-down``):
the child reads through a proxy of its own, takes its steps, and the proxy then refuses
every connection (``FaultProxy.refuse``); once the child's reads are retrying (the
deadline is the default 600 s), it ends its way: the script's end, ``break`` (the same,
after the loop), ``sys.exit``, an uncaught exception, each with a training thread
blocked in ``next_batch``; ``close()`` from another thread while the main thread is
blocked; SIGINT and SIGTERM while it is. The process must then end within
:data:`OUTAGE_LIMIT_S` of its ending, with the status and stderr of that ending. Every child runs with
``-X faulthandler``, so a fatal signal prints every thread's stack. A child ends
*abnormally* when its exit status is not the one its ending gives, when it runs past
its timeout (a hang), or when its stderr holds anything but the expected main-thread
traceback: ``terminate called`` (SIGABRT from a C++ thread destroyed while joinable),
``Fatal Python error``, ``Exception in thread`` (a worker thread's traceback),
``Exception ignored``, a second traceback.

    python tests/exit_stress.py --processes 2000 --jobs 2 [--s3 0.25] [--down 0.1] [--seed 0]

prints the counts per ending and every abnormal end with its stderr; exit status 1 if
there is any. The test suite runs a bounded version (tests/lifecycle/test_shutdown.py).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENDINGS = ("end", "break", "close", "raise", "exit", "sigint", "sigterm")
EXPECTED_STATUS = {
    "end": 0,
    "break": 0,
    "close": 0,
    "raise": 1,
    "exit": 3,
    "sigint": -signal.SIGINT,
    "sigterm": -signal.SIGTERM,
}
# Endings whose stderr holds one traceback of the main thread.
TRACEBACK = {"raise": "RuntimeError: the training script failed", "sigint": "KeyboardInterrupt"}
BAD_MARKS = ("terminate called", "Fatal Python error", "Exception in thread", "Exception ignored", "Segmentation")
INTERRUPT_LIMIT_S = 1.0  # a KeyboardInterrupt must reach the loop within this after SIGINT
OUTAGE_LIMIT_S = 5.0  # a run ending while its store is down must be gone within this

# The child: argv[1] is a JSON document of its case.
CHILD = r"""
import json, os, random, signal, sys, threading, time
case = json.loads(sys.argv[1])
import plitzer
import plitzer.errors

rng = random.Random(case["seed"])
kw = dict(seed=case["seed"] % 5, lanes=8, window=case["window"], seq_len=64, threads=2)
if case.get("options"):
    kw["storage_options"] = case["options"]
ending, steps = case["ending"], case["steps"]


def retrying(ld):
    # The store is down from here: wait until the loader's reads retry against it.
    t = time.monotonic()
    while ld.stats.retries == 0 and time.monotonic() - t < 30:
        time.sleep(0.02)
    time.sleep(rng.uniform(0.0, 0.3))  # somewhere in the pause between attempts


def train(ld):
    try:
        while True:
            ld.next_batch()
    except plitzer.errors.PlitzerError as e:
        print(f"stopped: {type(e).__name__}", flush=True)


if case.get("outage"):
    ld = plitzer.Loader(case["source"], **kw)
    for _ in range(steps):
        ld.next_batch()
    print("ready", flush=True)
    sys.stdin.readline()  # the store is down
    if ending in ("sigint", "sigterm", "close"):
        sig = {"sigint": signal.SIGINT, "sigterm": signal.SIGTERM}.get(ending)
        sent = []

        def fire():
            retrying(ld)
            print("ending", flush=True)
            sent.append(time.monotonic())
            if sig is None:
                ld.close()  # from another thread, the main one blocked in next_batch
            else:
                os.kill(os.getpid(), sig)

        threading.Thread(target=fire, daemon=True).start()
        try:
            train(ld)  # blocked in next_batch until the ending
        except KeyboardInterrupt:
            print(f"interrupt-latency {time.monotonic() - sent[0]:.3f}", file=sys.stderr, flush=True)
            raise
    else:
        threading.Thread(target=train, args=(ld,), name="train").start()
        retrying(ld)
        print("ending", flush=True)
        if ending == "raise":
            raise RuntimeError("the training script failed")
        if ending == "exit":
            sys.exit(3)
        # "end" and "break": the script ends, its loader open, a thread blocked in next_batch
elif ending in ("sigint", "sigterm"):
    ld = plitzer.Loader(case["source"], **kw)
    ld.next_batch()
    total = max(1, ld.tokens // (8 * 64))
    sig = signal.SIGINT if ending == "sigint" else signal.SIGTERM
    sent = []
    looping = threading.Event()

    def fire():
        looping.wait()
        time.sleep(rng.uniform(0.0, 0.05))
        sent.append(time.monotonic())
        os.kill(os.getpid(), sig)

    threading.Thread(target=fire, daemon=True).start()
    try:
        looping.set()
        for _ in range(100_000):  # each step waits on fresh reads
            ld.seek(rng.randrange(total * 3))
            ld.next_batch()
        sys.exit(5)  # never got the signal
    except KeyboardInterrupt:
        print(f"interrupt-latency {time.monotonic() - sent[0]:.3f}", file=sys.stderr, flush=True)
        raise
elif ending == "close":
    with plitzer.Loader(case["source"], **kw) as ld:
        for _ in range(steps):
            ld.next_batch()
elif ending == "break":
    ld = plitzer.Loader(case["source"], **kw)
    for i, batch in enumerate(ld):
        if i + 1 >= steps:
            break
else:
    ld = plitzer.Loader(case["source"], **kw)
    for _ in range(steps):
        ld.next_batch()
    if ending == "raise":
        raise RuntimeError("the training script failed")
    if ending == "exit":
        sys.exit(3)
"""


@dataclass(frozen=True)
class Case:
    """One child run."""

    ending: str
    data: str  # "tiny" or "large"
    cache: str  # "cold" or "warm"
    storage: str  # "local", "s3" or "s3-down" (the store goes down after the steps)
    steps: int
    seed: int


@dataclass
class Result:
    case: Case
    status: int | None  # None: timed out
    stderr: str
    seconds: float
    problem: str | None


def write_data(root: Path) -> dict[str, Path]:
    """The two datasets: tiny row groups (2 documents) and large ones (4,000)."""
    import plitzer.synth

    out = {"tiny": root / "tiny", "large": root / "large"}
    plitzer.synth.write(out["tiny"], 120_000, seed=1, mean_length=60, docs_per_row_group=2, row_groups_per_file=250)
    plitzer.synth.write(out["large"], 1_200_000, seed=2, mean_length=100, docs_per_row_group=4_000)
    return out


def _chained_interrupts(stderr: str) -> bool:
    """Two tracebacks, the second raised while handling the first, each ending in KeyboardInterrupt."""
    first, sep, second = stderr.partition("During handling of the above exception, another exception occurred:")
    ends = [part.strip().splitlines()[-1] if part.strip() else "" for part in (first, second)]
    return bool(sep) and all(e == "KeyboardInterrupt" for e in ends)


def judge(case: Case, status: int | None, stderr: str) -> str | None:
    """Why this end is abnormal, or None."""
    if status is None:
        return "hung (timed out)"
    want = EXPECTED_STATUS[case.ending]
    if status != want:
        return f"exit status {status}, expected {want}"
    for mark in BAD_MARKS:
        if mark in stderr:
            return f"stderr holds {mark!r}"
    tracebacks = stderr.count("Traceback (most recent call last)")
    expected = TRACEBACK.get(case.ending)
    if expected is None and tracebacks:
        return "a traceback"
    # A SIGINT that lands inside a Polars query (the straddling step's gather) reaches
    # Python twice: Polars raises the KeyboardInterrupt and leaves the interrupt pending,
    # so a second one interrupts the script's except clause, chained to the first. The
    # process still ends by SIGINT, at once; only the latency line may be lost.
    double = case.ending == "sigint" and tracebacks == 2 and _chained_interrupts(stderr)
    if expected is not None and (tracebacks != 1 or expected not in stderr) and not double:
        return f"{tracebacks} tracebacks, expected one ending in {expected!r}"
    if case.ending == "sigint":
        lat = [float(x.split()[1]) for x in stderr.splitlines() if x.startswith("interrupt-latency")]
        if double and not lat:
            return None
        if not lat or lat[0] > INTERRUPT_LIMIT_S:
            return f"KeyboardInterrupt reached the loop {lat} s after SIGINT (limit {INTERRUPT_LIMIT_S} s)"
    return None


def run_case(
    case: Case, source: str, env: dict[str, str], options: dict[str, Any] | None, timeout: float, upstream: int = 0
) -> Result:
    window = 16 if case.data == "tiny" else 4
    doc = {"source": source, "ending": case.ending, "steps": case.steps, "seed": case.seed, "window": window}
    if options:
        doc["options"] = options
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="plitzer-cold-") as cold:
        e = dict(env)
        if case.cache == "cold":
            e["PLITZER_CACHE"] = cold
        if case.storage == "s3-down":
            return _run_outage(case, doc, e, upstream, timeout, t0)
        try:
            p = subprocess.run(
                [sys.executable, "-X", "faulthandler", "-c", CHILD, json.dumps(doc)],
                env=e,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
            status: int | None = p.returncode
            stderr = p.stderr
        except subprocess.TimeoutExpired as ex:
            status = None
            err = ex.stderr
            stderr = err.decode(errors="replace") if isinstance(err, bytes) else (err or "")
    return Result(case, status, stderr, time.monotonic() - t0, judge(case, status, stderr))


def _run_outage(
    case: Case, doc: dict[str, Any], env: dict[str, str], upstream: int, timeout: float, t0: float
) -> Result:
    """A child reading S3 through a proxy of its own, which refuses every connection once it has taken its steps."""
    from tests.s3_fixtures import FaultProxy, options

    proxy = FaultProxy(upstream)
    doc = {**doc, "outage": True, "options": options(proxy.endpoint)}  # the default deadline: 600 s
    lines: list[tuple[float, str]] = []
    try:
        with (
            tempfile.TemporaryFile("w+") as errf,
            subprocess.Popen(
                [sys.executable, "-X", "faulthandler", "-c", CHILD, json.dumps(doc)],
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=errf,
                text=True,
            ) as p,
        ):
            killer = threading.Timer(timeout, p.kill)  # a hang ends here: readline then sees the end of the pipe
            killer.start()
            try:
                assert p.stdin is not None and p.stdout is not None
                status: int | None = None
                if p.stdout.readline().strip() == "ready":
                    proxy.refuse(600)  # the store is down
                    p.stdin.write("go\n")
                    p.stdin.flush()
                    lines.extend((time.monotonic(), line.strip()) for line in p.stdout)
                status = p.wait()
                ended = time.monotonic()
                hung = not killer.is_alive()
            finally:
                killer.cancel()
            errf.seek(0)
            stderr = errf.read()
    finally:
        proxy.stop()
    if hung:
        status = None
    result = Result(case, status, stderr, time.monotonic() - t0, judge(case, status, stderr))
    began = [t for t, line in lines if line == "ending"]
    if result.problem is None:
        if not began:
            result.problem = "never reached its ending (no retry against the store that was down?)"
        elif ended - began[0] > OUTAGE_LIMIT_S:
            result.problem = f"ended {ended - began[0]:.1f} s after its ending began (limit {OUTAGE_LIMIT_S} s)"
    if began:
        result.stderr += f"\noutage-exit {ended - began[0]:.3f}"
    return result


def cases(n: int, *, s3: float, seed: int, down: float = 0.0) -> list[Case]:
    """``n`` cases cycling through every combination (a share ``s3`` of them on S3, a share ``down``
    on S3 that goes down), steps drawn from a seeded generator."""
    rng = random.Random(seed)
    out = []
    n_s3 = round(n * s3)
    n_down = round(n * down)
    for storage, count in (("local", n - n_s3 - n_down), ("s3", n_s3), ("s3-down", n_down)):
        combos = list(itertools.product(ENDINGS, ("tiny", "large"), ("cold", "warm")))
        rng.shuffle(combos)
        for i in range(count):
            ending, data, cache = combos[i % len(combos)]
            if storage == "s3-down":  # every ending first, so that a few cases already cover them all
                ending = ENDINGS[i % len(ENDINGS)]
            steps = rng.choice([1, 2, 3, 5, 8, 13, 40] if storage != "s3-down" else [1, 2, 5])
            out.append(Case(ending, data, cache, storage, steps=steps, seed=rng.randrange(1 << 30)))
    rng.shuffle(out)
    return out


@contextmanager
def s3_copy(local: dict[str, Path]) -> Iterator[tuple[dict[str, str], dict[str, Any]]]:
    """The datasets on moto's S3 server (127.0.0.1), stopped at the end."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.s3_fixtures import MotoServer, options, upload

    server = MotoServer()
    try:
        client = server.client()
        client.create_bucket(Bucket="stress")
        urls = {}
        for name, d in local.items():
            upload(client, "stress", d, name)
            urls[name] = f"s3://stress/{name}"
        yield urls, {**options(server.endpoint, attempts=3, backoff=0.01), "upstream": server.port}
    finally:
        server.stop()


def stress(
    n: int,
    *,
    jobs: int = 2,
    s3: float = 0.0,
    down: float = 0.0,
    seed: int = 0,
    work: Path | None = None,
    timeout: float = 60.0,
    progress: Callable[[Result], None] | None = None,
) -> list[Result]:
    """Run ``n`` child processes, ``jobs`` at a time, a share ``s3`` of them on S3 and ``down`` on S3 that
    goes down; every result."""
    owned = work is None
    root = Path(tempfile.mkdtemp(prefix="plitzer-stress-")) if work is None else work
    try:
        local = write_data(root / "data")
        env = {k: v for k, v in os.environ.items() if k != "PLITZER_CACHE"}
        here = str(Path(__file__).resolve().parents[1])
        env["PYTHONPATH"] = os.pathsep.join([p for p in (env.get("PYTHONPATH"), here) if p])
        env["PLITZER_CACHE"] = str(root / "warm-cache")
        storages = ("local", "s3") if s3 or down else ("local",)
        todo = cases(n, s3=s3, seed=seed, down=down)
        with contextlib.nullcontext() if not (s3 or down) else s3_copy(local) as remote:
            urls, options = remote if remote else ({}, None)
            upstream = int(options.pop("upstream")) if options else 0
            # Warm the shared index cache once per source.
            for name, d in local.items():
                for storage in storages:
                    src = str(d) if storage == "local" else urls[name]
                    warm = Case("close", name, "warm", storage, steps=1, seed=0)
                    r = run_case(warm, src, env, options if storage == "s3" else None, timeout)
                    if r.problem:
                        msg = f"warming the cache failed: {r.problem}\n{r.stderr}"
                        raise RuntimeError(msg)

            def one(c: Case) -> Result:
                src = str(local[c.data]) if c.storage == "local" else urls[c.data]
                r = run_case(c, src, env, options if c.storage == "s3" else None, timeout, upstream)
                if progress is not None:
                    progress(r)
                return r

            with ThreadPoolExecutor(max_workers=jobs) as pool:
                return list(pool.map(one, todo))
    finally:
        if owned:
            shutil.rmtree(root, ignore_errors=True)


def report(results: Sequence[Result]) -> str:
    by = Counter((r.case.ending, r.problem is None) for r in results)
    lines = [f"{len(results)} processes, {sum(r.problem is not None for r in results)} abnormal ends"]
    for ending in ENDINGS:
        ok, bad = by[(ending, True)], by[(ending, False)]
        if ok or bad:
            lines.append(f"  {ending:8s} {ok + bad:5d} runs, {bad} abnormal")
    lat = [
        float(x.split()[1])
        for r in results
        if r.case.ending == "sigint"
        for x in r.stderr.splitlines()
        if x.startswith("interrupt-latency")
    ]
    for storage in ("local", "s3", "s3-down"):
        t = [r.seconds for r in results if r.case.storage == storage]
        if t:
            lines.append(f"  {storage}: {len(t)} runs, {sum(t) / len(t):.2f} s a process on average")
    if lat:
        lines.append(f"  SIGINT to KeyboardInterrupt: max {max(lat) * 1000:.0f} ms over {len(lat)} runs")
    gone = [float(x.split()[1]) for r in results for x in r.stderr.splitlines() if x.startswith("outage-exit")]
    if gone:
        lines.append(f"  store down, ending to exit: max {max(gone):.2f} s over {len(gone)} runs")
    lines.extend(f"ABNORMAL {r.case}: {r.problem}\n{r.stderr[-4000:]}" for r in results if r.problem)
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--processes", type=int, default=200)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--s3", type=float, default=0.0, help="share of the runs on S3 (moto's server on 127.0.0.1)")
    p.add_argument("--down", type=float, default=0.0, help="share of the runs on S3 that goes down, then ends")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    t0 = time.monotonic()
    done = [0]

    def progress(r: Result) -> None:
        done[0] += 1
        if r.problem:
            print(f"[{done[0]}] ABNORMAL {r.case}: {r.problem}", flush=True)
        elif done[0] % 50 == 0:
            print(f"[{done[0]}] ...", flush=True)

    results = stress(a.processes, jobs=a.jobs, s3=a.s3, down=a.down, seed=a.seed, progress=progress)
    print(report(results))
    print(f"wall time {time.monotonic() - t0:.0f} s, {a.jobs} at a time")
    return 1 if any(r.problem for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
