"""The cluster benchmark on real shapes (``benchmarks/cluster.py --shapes``).

Files shaped like FineWeb-Edu's (``plitzer.synth.write_fineweb_shaped``: its eleven
columns, 400 row groups a file, real footers of about 1.4 KB a row group, tiny rows),
hard links of one written file, so that 10^6 row groups cost no disk. For each size of
``--shapes-row-groups`` (default 120,000 and 10^6), each figure is a fresh process
(its wall, its CPU from ``wait4``, its peak RSS as its ``VmHWM``):

* pyarrow: ``pq.read_metadata`` of every file on as many threads as plitzer uses on
  local disk (the cores): what reading and parsing the footers costs;
* ``plitzer index DATA --no-lengths --out JOB``: the index and its job index, and the
  job index's size (a row group), also on distinct files (copies compress better);
* a rank (``tests/rss_probe.py``) to its first batch: cold (empty cache), warm (the
  cache ``plitzer index`` left) and with ``index=JOB``; its peak RSS against the same
  process on a one-file dataset, a row group;
* ``--ranks`` gloo processes (each its own cache folder, as on separate machines) on
  ``--rank-files`` files, cold and with ``index=``: a rank's peak RSS, CPU and first batch.

* ``--index-only``: just pyarrow's read+parse against ``plitzer index``, ``--rounds``
  times each, alternating (and against another checkout's ``plitzer index`` with
  ``--index-against PATH``, e.g. the previous release's), each a fresh process on an
  empty cache: what indexing costs against what the footers cost.

    python benchmarks/cluster.py --shapes
    python benchmarks/cluster.py --shapes --shapes-row-groups 120000 --rank-files 300
    python benchmarks/cluster.py --shapes --index-only --shapes-row-groups 120000 --rounds 3

``--packing best-fit``: each rank (cold, warm, ``index=``) runs under best-fit, its bins pass (a read
of every row group's token column, cached by the first) and the bins column it keeps counted in.

    python benchmarks/cluster.py --shapes --packing best-fit --shapes-row-groups 120000 --ranks 1
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import plitzer

ROOT = Path(__file__).resolve().parents[1]
PROBE = ROOT / "tests" / "rss_probe.py"
_PYARROW = """
import os, sys, time
from concurrent.futures import ThreadPoolExecutor
import pyarrow.parquet as pq
files = sorted(os.path.join(r, f) for r, _, fs in os.walk(sys.argv[1]) for f in fs if f.endswith(".parquet"))
with ThreadPoolExecutor(os.cpu_count() or 2) as pool:
    for _ in pool.map(pq.read_metadata, files):
        pass  # parsed, then dropped, as plitzer does
"""


class _Peak:
    """A child's own peak RSS: its ``VmHWM``, read every 20 ms while it runs (the last read kept).

    Not ``wait4``'s ``ru_maxrss``: Linux carries into it the RSS of the process before
    ``exec``, this benchmark's (plitzer and its libraries imported), so a child smaller
    than this process read as this process (tests/rss_probe.py says the same).
    """

    def __init__(self, pid: int) -> None:
        self.bytes = 0
        self._path = f"/proc/{pid}/status"
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._done.wait(0.02):
            try:
                with open(self._path) as f:
                    for line in f:
                        if line.startswith("VmHWM:"):
                            self.bytes = max(self.bytes, int(line.split()[1]) * 1024)
            except OSError:
                return  # exited

    def stop(self) -> int:
        self._done.set()
        self._thread.join()
        return self.bytes


def _run(cmd: list[str], cache: Path, root: Path = ROOT) -> dict[str, Any]:
    """One fresh process: wall, CPU (``wait4``), peak RSS (:class:`_Peak`), its last stdout line as JSON if any."""
    env = {**os.environ, "PLITZER_CACHE": str(cache), "PYTHONPATH": str(root)}
    t0 = time.perf_counter()
    # In the checkout: `python -m` puts the working folder ahead of PYTHONPATH.
    p = subprocess.Popen(cmd, env=env, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert p.stdout is not None
    peak = _Peak(p.pid)
    out = p.stdout.read()
    _, status, ru = os.wait4(p.pid, 0)
    peak_bytes = peak.stop()
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        msg = f"{cmd} failed ({p.returncode})"
        raise RuntimeError(msg)
    got: dict[str, Any] = {"wall_s": time.perf_counter() - t0, "cpu_s": ru.ru_utime + ru.ru_stime}
    got["peak_bytes"] = peak_bytes
    lines = out.strip().splitlines()
    if lines and lines[-1].startswith("{"):
        got["out"] = json.loads(lines[-1])
        # A probe's own reading, exact, where it gives one (tests/rss_probe.py)
        got["peak_bytes"] = got["out"].get("peak_bytes", peak_bytes)
    return got


def _dataset(root: Path, one: Path, files: int) -> Path:
    d = root / f"d{files}" / "CC-MAIN-2024-10"
    d.mkdir(parents=True)
    for i in range(files):
        os.link(one, d / f"{i // 1000:03d}_{i:05d}.parquet")
    return d.parent


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _ranks(data: Path, n: int, caches: Path, index: Path | None) -> list[dict[str, Any]]:
    port = str(_port())
    procs = []
    for r in range(n):
        env = {**os.environ, "PLITZER_CACHE": str(caches / f"rank{r}"), "PYTHONPATH": str(ROOT)}
        cmd = [sys.executable, str(PROBE), str(data), "--rank", str(r), "--world", str(n), "--port", port]
        cmd += ["--index", str(index)] if index is not None else []
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True))
    outs = []
    for p in procs:
        assert p.stdout is not None
        text = p.stdout.read()
        _, status, _ = os.wait4(p.pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            msg = f"a rank failed on {data}"
            raise RuntimeError(msg)
        got = json.loads(text.strip().splitlines()[-1])
        got["process_peak_bytes"] = got["peak_bytes"]  # the rank's own VmHWM (tests/rss_probe.py)
        outs.append(got)
    return outs


def _mib(b: float) -> str:
    return f"{b / 2**20:,.0f} MiB"


def main(sizes: list[int], ranks: int, rank_files: int, per_file: int = 400, packing: str | None = None) -> None:
    work = Path(tempfile.mkdtemp(prefix="plitzer-shapes-"))
    try:
        one = plitzer.synth.write_fineweb_shaped(work / "one", 1, row_groups_per_file=per_file)[0]
        distinct = work / "distinct"
        plitzer.synth.write_fineweb_shaped(distinct, 8, row_groups_per_file=per_file, distinct=8)
        py = sys.executable
        probe = ["--packing", packing] if packing else []  # best-fit: the bins pass and its column counted in
        base = _run([py, str(PROBE), str(work / "one"), *probe], work / "c-one")
        print(f"footer: {one.stat().st_size:,} B file, {_footer_bytes(one) / per_file:,.0f} B a row group")
        info = plitzer_index(distinct, work / "distinct.index", work / "c-distinct")
        print(f"job index on 8 distinct files: {info['bytes'] / (8 * per_file):.1f} B a row group")
        raw1 = _run([py, "-c", _PYARROW, str(work / "one")], work / "c-raw1")
        ix1 = plitzer_index(work / "one", work / "one.index", work / "c-ix1")
        for n in sizes:
            files = max(1, n // per_file)
            rgs = files * per_file
            data = _dataset(work, one, files)
            print(f"\n== {rgs:,} row groups ({files:,} files of {per_file})")
            raw = _run([py, "-c", _PYARROW, str(data)], work / "c-raw")
            cache = work / f"c-index{n}"
            job = work / f"job{n}.index"
            t0 = time.perf_counter()
            ix = _run([py, "-m", "plitzer", "index", str(data), "--no-lengths", "--out", str(job)], cache)
            ix["wall_s"] = time.perf_counter() - t0
            print(
                f"pyarrow read+parse: {raw['wall_s']:.1f} s, {raw['cpu_s']:.1f} CPU s, peak {_mib(raw['peak_bytes'])}"
            )
            print(
                f"plitzer index: {ix['wall_s']:.1f} s ({ix['wall_s'] / raw['wall_s']:.2f}x), "
                f"{ix['cpu_s']:.1f} CPU s ({ix['cpu_s'] / raw['cpu_s']:.2f}x), peak {_mib(ix['peak_bytes'])}; "
                f"job index {job.stat().st_size:,} B ({job.stat().st_size / rgs:.2f} B a row group, copies)"
            )
            # Less each process's start (imports, the CLI): the same command on one file.
            d_raw = (raw["wall_s"] - raw1["wall_s"], raw["cpu_s"] - raw1["cpu_s"])
            d_ix = (ix["wall_s"] - ix1["wall_s"], ix["cpu_s"] - ix1["cpu_s"])
            print(
                f"  beyond the start (less one file's run): pyarrow {d_raw[0]:.1f} s / {d_raw[1]:.1f} CPU s, "
                f"plitzer index {d_ix[0]:.1f} s / {d_ix[1]:.1f} CPU s: {d_ix[0] / d_raw[0]:.2f}x wall, "
                f"{d_ix[1] / d_raw[1]:.2f}x CPU; peak beyond one file's {_mib(ix['peak_bytes'] - ix1['peak_bytes'])}"
            )
            for name, args, c in (
                ("cold", [], work / f"c-cold{n}"),
                ("warm (plitzer index's cache)", [], cache),
                ("index=", ["--index", str(job)], work / f"c-job{n}"),
            ):
                r = _run([py, str(PROBE), str(data), *args, *probe], c)
                grow = (r["peak_bytes"] - base["peak_bytes"]) / (rgs - per_file)
                print(
                    f"a rank, {name}: first batch {r['out']['first_batch_s']:.2f} s, {r['cpu_s']:.1f} CPU s, "
                    f"peak {_mib(r['peak_bytes'])}, {grow:,.0f} B a row group over a one-file dataset"
                )
            shutil.rmtree(data)
        if ranks > 1:
            data = _dataset(work, one, rank_files)
            rgs = rank_files * per_file
            small = _ranks(work / "one", ranks, work / "r-small", None)
            job = work / "ranks.index"
            plitzer_index(data, job, work / "c-ranks")
            print(f"\n== {ranks} gloo ranks, {rank_files:,} files ({rgs:,} row groups), each its own cache")
            for name, index in (("cold", None), ("index=", job)):
                got = _ranks(data, ranks, work / f"r-{name}", index)
                grow = max(
                    (g["process_peak_bytes"] - s["process_peak_bytes"]) / (rgs - per_file)
                    for g, s in zip(got, small, strict=True)
                )
                print(
                    f"{name}: first batch (slowest rank) {max(g['first_batch_s'] for g in got):.2f} s, "
                    f"CPU a rank {max(g['cpu_s'] for g in got):.1f} s, peak a rank "
                    f"{_mib(max(g['process_peak_bytes'] for g in got))}, {grow:,.0f} B a row group over one file"
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)


def index_only(sizes: list[int], per_file: int, rounds: int, against: Path | None) -> None:
    """pyarrow's read+parse against ``plitzer index`` (and ``against``'s), alternating, ``rounds`` times."""
    work = Path(tempfile.mkdtemp(prefix="plitzer-shapes-"))
    try:
        one = plitzer.synth.write_fineweb_shaped(work / "one", 1, row_groups_per_file=per_file)[0]
        py = sys.executable
        roots = {"plitzer index": ROOT} | ({f"plitzer index ({against})": against} if against else {})
        # Each process's start (imports, the CLI): the same commands on the one file, best of 2.
        start = {
            "pyarrow read+parse": min(_run([py, "-c", _PYARROW, str(one)], work / f"c-s{r}")["cpu_s"] for r in range(2))
        }
        for k, (name, root) in enumerate(roots.items()):
            cmd = [py, "-m", "plitzer", "index", str(one), "--no-lengths", "--out", str(work / "s.index")]
            start[name] = min(_run(cmd, work / f"c-s{k}-{r}", root)["cpu_s"] for r in range(2))
        for n in sizes:
            files = max(1, n // per_file)
            data = _dataset(work, one, files)
            print(f"== {files * per_file:,} row groups ({files:,} files of {per_file}), {os.cpu_count()} threads")
            got: dict[str, list[dict[str, Any]]] = {"pyarrow read+parse": []} | {k: [] for k in roots}
            for r in range(rounds):
                got["pyarrow read+parse"].append(_run([py, "-c", _PYARROW, str(data)], work / f"c-raw{r}"))
                for k, (name, root) in enumerate(roots.items()):
                    job = work / "job.index"
                    cmd = [py, "-m", "plitzer", "index", str(data), "--no-lengths", "--out", str(job)]
                    got[name].append(_run(cmd, work / f"c-ix{k}-{r}-{n}", root))
                    job.unlink()
                print(
                    f"  round {r + 1}: "
                    + "; ".join(f"{k} {v[-1]['wall_s']:.2f} s, {v[-1]['cpu_s']:.2f} CPU s" for k, v in got.items())
                )
            base = got["pyarrow read+parse"]
            wall0 = min(x["wall_s"] for x in base)
            cpu0 = min(x["cpu_s"] for x in base)
            for name, runs in got.items():
                wall, cpu = min(x["wall_s"] for x in runs), min(x["cpu_s"] for x in runs)
                d0 = cpu0 - start["pyarrow read+parse"]
                beyond = f"{(cpu - start[name]) / d0:.2f}x" if d0 > 0.1 else "too small to say"
                print(
                    f"  {name} (best of {rounds}): {wall:.2f} s ({wall / wall0:.2f}x), {cpu:.2f} CPU s "
                    f"({cpu / cpu0:.2f}x; beyond a one-file run's {start[name]:.2f} CPU s: {beyond}), "
                    f"peak {_mib(max(x['peak_bytes'] for x in runs))}"
                )
            shutil.rmtree(data)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _footer_bytes(path: Path) -> int:  # the file's footer, serialized
    import pyarrow.parquet as pq

    return int(pq.read_metadata(path).serialized_size)


def plitzer_index(data: Path, out: Path, cache: Path) -> dict[str, Any]:
    got = _run([sys.executable, "-m", "plitzer", "index", str(data), "--no-lengths", "--out", str(out)], cache)
    got["bytes"] = out.stat().st_size
    return got
