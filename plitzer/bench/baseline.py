"""plitzer against litdata, Grain, MosaicML Streaming and Hugging Face ``datasets``, on the same Parquet.

    python -m plitzer.bench.baseline DATA --loaders plitzer,litdata,grain,mosaic,hf,hf-stream --batch 64 --workers 2

Every loader reads the same files (warmed into the page cache first) and runs in
its own subprocess (``python -m plitzer.bench._run_one``), so that its cores
and memory are measured alone: CPU from ``getrusage`` of the process and its
worker processes, peak memory as the largest sum of RSS over the process tree,
sampled every 50 ms by this harness. The table:

loader
    ``pyarrow`` and ``pyarrow-rg`` are the ceiling, always measured: ``pq.read_table``
    of the token column of every file with the same number of threads, and every row
    group's column chunk on that many threads from cached footers
    (``read_row_group(use_threads=False)``); no shuffle, no batches. The ratios under
    the table take the faster of the two (a slower reference would flatter).
convert (s), converted (MiB)
    The loader's own copy (Mosaic: MDS shards, zstd; litdata: ``litdata.optimize``
    chunks of ``TokensLoader``; hf: the Arrow cache of ``load_dataset("parquet")``);
    plitzer, Grain and hf-stream read the Parquet as it is.
docs/s, Mtokens/s, cores used, CPU ns/token
    Steady state, from the first batch to the end of one epoch (or
    ``--time-limit`` seconds, then per token: ``capped`` in the JSON).
    ``--batch`` is in documents; plitzer gets the same tokens per step as
    ``lanes * seq_len``, with ``lanes`` the power of two nearest to
    ``batch * mean document length / seq_len``; the packing peers (litdata: blocks
    of ``seq_len + 1`` tokens, Grain: rows of ``seq_len``) batch ``lanes`` rows.
first batch (s)
    From building the loader (imports done) to its first batch.
resume (s), exact resume, tokens lost
    A run is stopped at mid-epoch and its state saved with the loader's own
    mechanism (plitzer: ``checkpoint()``; litdata and Mosaic: their
    ``StreamingDataLoader.state_dict``; Grain: the iterator's ``get_state()``;
    hf and hf-stream: torchdata's ``StatefulDataLoader``), then continues to the
    end of the epoch uninterrupted: the reference. A new process resumes from
    the state (resume (s): to its first batch) and runs to the end of the epoch.
    Exact: the resumed stream equals the reference, batch for batch. Tokens
    lost (or repeated): documents (packing peers: rows) of the reference missing
    from (or added to) the resumed stream, as multisets.

Peers whose pins conflict with plitzer's (Mosaic pins numpy<2.2 and imports
torchvision), or that are not installed here, run in their own virtual environment under
``~/.cache/plitzer/bench-venvs/NAME`` (``PLITZER_BENCH_VENVS``), created by
``--setup``; plitzer itself is put on their ``PYTHONPATH``. A peer that cannot
be installed or run is a row with the reason, never dropped.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from plitzer.bench import DECODES, LOADERS

__all__ = [
    "Measured",
    "Peer",
    "Row",
    "bench_loader",
    "compare",
    "epoch_notes",
    "first_batch_ratios",
    "interpreter",
    "main",
    "match_lanes",
    "run_one",
    "table",
    "venv_root",
]

_HERE = Path(__file__).resolve()
_ROOT = _HERE.parents[2]  # the folder that holds the plitzer package


# -- peer environments -----------------------------------------------------------------


def _torch_pair() -> list[str]:
    """A torch and torchvision that import together (Mosaic imports torchvision)."""
    env = os.environ.get("PLITZER_BENCH_TORCH")
    if env:
        return env.split()
    if platform.machine() in {"aarch64", "arm64"}:
        return ["torch==2.9.1", "torchvision==0.24.1"]
    return ["torch==2.14.1", "torchvision==0.29.1"]


def _plitzer_requirements() -> list[str]:
    """plitzer's own runtime requirements (the peer venv gets plitzer on PYTHONPATH)."""
    from importlib import metadata

    try:
        reqs = metadata.requires("plitzer") or []
    except metadata.PackageNotFoundError:
        reqs = []
    plain = [r.split(";")[0].strip() for r in reqs if "extra ==" not in r]
    return plain or ["numpy>=1.26", "pyarrow>=16", "polars>=1.0", "duckdb>=1.0", "tqdm>=4.60", "rich>=13"]


@dataclass(frozen=True)
class Peer:
    name: str
    modules: tuple[str, ...]
    why: str

    def requirements(self) -> list[str]:
        base = ["psutil>=5.9", *_plitzer_requirements()]
        if self.name == "mosaic":
            return [*_torch_pair(), "mosaicml-streaming>=0.13", *base]
        if self.name == "litdata":
            return ["torch>=2.5,<=2.14.1", "litdata>=0.2.70", *base]
        if self.name == "grain":
            return ["torch>=2.5,<=2.14.1", "grain>=0.2.12", *base]
        return ["torch>=2.5", "datasets>=3", "torchdata>=0.8", *base]


PEERS = {
    "mosaic": Peer(
        "mosaic",
        ("streaming", "torch", "psutil", "plitzer.bench._run_one"),
        "mosaicml-streaming pins numpy<2.2 and transformers<5 and imports torchvision",
    ),
    "hf": Peer("hf", ("datasets", "torch", "psutil", "plitzer.bench._run_one"), "datasets is not installed here"),
    # Both install beside plitzer (the `baseline` extra); a venv only where they are missing.
    "litdata": Peer(
        "litdata", ("litdata", "torch", "psutil", "plitzer.bench._run_one"), "litdata is not installed here"
    ),
    "grain": Peer("grain", ("grain", "torch", "psutil", "plitzer.bench._run_one"), "grain is not installed here"),
}
_PEER_OF = {"mosaic": "mosaic", "litdata": "litdata", "grain": "grain", "hf": "hf", "hf-stream": "hf"}


def venv_root() -> Path:
    env = os.environ.get("PLITZER_BENCH_VENVS")
    return Path(env) if env else Path.home() / ".cache" / "plitzer" / "bench-venvs"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env.update(HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1", PYTHONWARNINGS="ignore")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def _imports(python: str, modules: Sequence[str]) -> str | None:
    """None if ``python`` imports every module, else the error's last line."""
    code = "import " + ", ".join(modules)
    try:
        p = subprocess.run([python, "-c", code], env=_env(), capture_output=True, text=True, timeout=300, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return str(e)
    if p.returncode == 0:
        return None
    lines = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else f"exit code {p.returncode}"


def interpreter(loader: str, setup: bool) -> tuple[str | None, str]:  # noqa: PLR0911
    """The Python that runs ``loader``, or None and the reason it cannot run."""
    peer = PEERS.get(_PEER_OF.get(loader, ""))
    if peer is None:
        return sys.executable, ""
    err = _imports(sys.executable, peer.modules)
    if err is None:
        return sys.executable, ""
    venv = venv_root() / peer.name
    python = venv / "bin" / "python"
    if python.exists() and _imports(str(python), peer.modules) is None:
        return str(python), ""
    if not setup:
        return None, f"not importable here ({err}); {peer.why}: rerun with --setup to build {venv}"
    print(f"[setup] creating {venv} for {loader} ({peer.why}) ...", flush=True)
    try:
        shutil.rmtree(venv, ignore_errors=True)
        base = getattr(sys, "_base_executable", sys.executable)
        subprocess.run([base, "-m", "venv", str(venv)], check=True)
        cmd = [str(python), "-m", "pip", "install", "--quiet", *peer.requirements()]
        print("[setup] " + " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)
    except (OSError, subprocess.CalledProcessError) as e:
        return None, f"--setup failed: {e}"
    err = _imports(str(python), peer.modules)
    if err is not None:
        return None, f"installed in {venv} but does not import: {err}"
    return str(python), ""


# -- running one measurement -------------------------------------------------------------


@dataclass
class Measured:
    out: dict[str, Any] = field(default_factory=dict)
    peak_rss: int = 0
    peak_pss: int = 0
    error: str = ""


def _tree_memory(pid: int, pss: bool) -> int:
    """Summed RSS (or PSS: shared pages split among the processes sharing them) of a process tree."""
    import psutil

    try:
        p = psutil.Process(pid)
        procs = [p, *p.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for q in procs:
        try:
            total += q.memory_full_info().pss if pss else q.memory_info().rss
        except (psutil.Error, AttributeError):
            continue
    return total


def run_one(python: str, loader: str, mode: str, opts: list[str], folder: Path, timeout: float) -> Measured:
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / f"{mode}.json"
    out.unlink(missing_ok=True)
    cmd = [python, "-m", "plitzer.bench._run_one", loader, "--mode", mode, "--out", str(out), *opts]
    m = Measured()
    with (folder / f"{mode}.log").open("w") as log:
        proc = subprocess.Popen(cmd, env=_env(), stdout=log, stderr=subprocess.STDOUT)
        done = threading.Event()

        def sample() -> None:
            # RSS every 50 ms (cheap); PSS, which reads smaps, every 250 ms.
            n = 0
            while not done.is_set():
                m.peak_rss = max(m.peak_rss, _tree_memory(proc.pid, pss=False))
                if n % 5 == 0:
                    m.peak_pss = max(m.peak_pss, _tree_memory(proc.pid, pss=True))
                n += 1
                done.wait(0.05)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            rc = -9
        done.set()
        sampler.join()
    if rc != 0 or not out.exists():
        tail = (folder / f"{mode}.log").read_text(errors="replace").strip().splitlines()
        last = [ln for ln in tail if ln.strip()][-1:] or [f"exit code {rc}"]
        m.error = f"{mode} failed ({'timed out' if rc == -9 else f'exit {rc}'}): {last[0][:300]}"
        return m
    m.out = json.loads(out.read_text())
    return m


# -- comparing streams -----------------------------------------------------------------------


def compare(folder: Path, split: int, docs: bool) -> tuple[bool, int, int]:
    """(exact, tokens lost, tokens repeated) of the resumed stream against the reference."""
    ref_d = np.load(folder / "save-digests.npy")[split:]
    ref_n = np.load(folder / "save-lengths.npy")[split:]
    res_d = np.load(folder / "resume-digests.npy")
    res_n = np.load(folder / "resume-lengths.npy")
    exact = len(ref_d) == len(res_d) and bool(np.array_equal(ref_d, res_d)) and bool(np.array_equal(ref_n, res_n))
    if exact:
        return True, 0, 0
    length = dict(zip(ref_d.tolist(), ref_n.tolist(), strict=True))
    length.update(zip(res_d.tolist(), res_n.tolist(), strict=True))
    want, got = Counter(ref_d.tolist()), Counter(res_d.tolist())
    lost = sum(length[d] * n for d, n in (want - got).items())
    repeated = sum(length[d] * n for d, n in (got - want).items())
    if not docs and lost == 0 and repeated == 0:
        return False, 0, 0  # same batches in another order
    return False, lost, repeated


# -- the harness ---------------------------------------------------------------------------------


def match_lanes(batch: int, mean_doc: float, seq_len: int) -> int:
    """Lanes for the same tokens per step as ``batch`` documents: a power of two.

    >>> match_lanes(64, 1000.0, 2048)
    32
    """
    want = max(1.0, batch * mean_doc / seq_len)
    return int(2 ** round(math.log2(want)))


@dataclass
class Row:
    loader: str
    reason: str = ""
    convert_s: float | None = None
    converted_mib: float | None = None
    docs_s: float | None = None
    mtok_s: float | None = None
    cores: float | None = None
    ns_token: float | None = None
    resume_s: float | None = None
    exact: str = "—"
    lost: int | None = None
    repeated: int | None = None
    peak_rss_mib: float | None = None
    peak_pss_mib: float | None = None
    first_batch_s: float | None = None
    window_s: float | None = None  # pyarrow: one window's decode, median (the first batch's reference)
    resume_window_s: float | None = None  # and of the window the lanes stand in at resume
    capped: bool = False
    notes: list[str] = field(default_factory=list)


def _fmt(v: float | None, spec: str) -> str:
    return "—" if v is None else format(v, spec)


def table(rows: Sequence[Row]) -> str:
    head = (
        "| loader | convert (s) | converted (MiB) | docs/s | Mtokens/s | cores used | CPU ns/token "
        "| resume (s) | exact resume | tokens lost | peak RSS (MiB) | peak PSS (MiB) | first batch (s) |"
    )
    lines = [head, "|" + "---|" * 13]
    for r in rows:
        if r.reason and r.mtok_s is None:
            lines.append(f"| {r.loader} | not run: {r.reason} |" + " |" * 11)
            continue
        lost = "—" if r.lost is None else f"{r.lost:,}" + (f" (+{r.repeated:,} repeated)" if r.repeated else "")
        mtok = _fmt(r.mtok_s, ".1f") + ("*" if r.capped else "")
        lines.append(
            f"| {r.loader} | {_fmt(r.convert_s, '.1f')} | {_fmt(r.converted_mib, '.1f')} "
            f"| {_fmt(r.docs_s, ',.0f')} | {mtok} | {_fmt(r.cores, '.2f')} | {_fmt(r.ns_token, '.1f')} "
            f"| {_fmt(r.resume_s, '.2f')} | {r.exact} | {lost} | {_fmt(r.peak_rss_mib, ',.0f')} "
            f"| {_fmt(r.peak_pss_mib, ',.0f')} "
            f"| {_fmt(r.first_batch_s, '.2f')} |"
        )
    return "\n".join(lines)


def first_batch_ratios(ref: Row, python: str, base: list[str], work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """plitzer's first batch and resume against decoding the windows they need, each in a
    fresh process, alternated ``--repeat`` times (fresh processes vary by a third here):
    medians and their ratios, printed and returned; the decodes' medians go in the
    pyarrow row ``ref``."""
    folder = work / "runs" / "first"
    shutil.rmtree(folder, ignore_errors=True)
    state = work / "runs" / "plitzer" / "state.bin"
    got: dict[str, list[float]] = {"first": [], "resume": [], "window": [], "resume_window": []}
    for _ in range(args.repeat):
        w = run_one(python, "pyarrow", "window", base, folder, args.timeout)
        f = run_one(python, "plitzer", "first", base, folder, args.timeout)
        for m in (w, f):
            if m.error:
                print(f"[first batch] {m.error}", flush=True)
                return {}
        wo = w.out
        got["window"].append(wo["window_s"])
        got["resume_window"].append(wo["resume_window_s"])
        got["first"].append(f.out["first_s"])
        if state.exists():
            r = run_one(python, "plitzer", "first", [*base, "--state", str(state)], folder, args.timeout)
            if r.error:
                print(f"[first batch] resume: {r.error}", flush=True)
            else:
                got["resume"].append(r.out["first_s"])
    med = {k: float(np.median(v)) for k, v in got.items() if v}
    ref.window_s, ref.resume_window_s = med["window"], med["resume_window"]
    print(
        f"\n[first batch] references: decoding window 0 (rank 0's share, {wo['window_tokens']:,} tokens) and "
        f"window {wo['resume_window_index']} (where a resume at mid-epoch stands, {wo['resume_window_tokens']:,} "
        f"tokens) with pyarrow on {args.workers} threads, each in a fresh process",
        flush=True,
    )
    line = (
        f"plitzer's first batch: median {med['first']:.2f} s over {args.repeat} fresh processes, "
        f"{med['first'] / med['window']:.2f}x decoding its first window on all cores ({med['window']:.2f} s)"
    )
    if "resume" in med:
        line += (
            f"; resume: {med['resume']:.2f} s, {med['resume'] / med['resume_window']:.2f}x decoding the window "
            f"it resumes in ({med['resume_window']:.2f} s)"
        )
    print(line + " (target: at most 1.2x)", flush=True)
    return {"runs": got, "median": med}


def epoch_notes(o: dict[str, Any], dataset_tokens: int) -> list[str]:
    """What one epoch delivered against the dataset's tokens: what a peer pads or drops."""
    notes = []
    if not o["capped"]:  # ran to the end of the epoch
        delivered = int(o["tokens"]) + int(o["first_tokens"])
        notes.append(
            f"one epoch delivered {delivered:,} tokens for the dataset's {dataset_tokens:,} "
            f"({(delivered - dataset_tokens) / max(1, dataset_tokens):+.2%})"
        )
    if "padded_tokens" in o:
        notes.append(f"padding in the measured batches (after the first): {o['padded_tokens']:,} tokens")
    if "chunk_tokens" in o:
        lost = o["chunk_tokens"] - o["block_tokens"]
        notes.append(
            f"litdata chunks hold {o['chunk_tokens']:,} tokens; whole blocks {o['block_tokens']:,} "
            f"(each chunk's tail shorter than a block, {lost:,} tokens, is never read)"
        )
    return notes


def bench_loader(loader: str, python: str, base: list[str], work: Path, args: argparse.Namespace) -> Row:
    row = Row(loader)
    folder = work / "runs" / loader
    shutil.rmtree(folder, ignore_errors=True)
    timeout = args.timeout
    if loader in {"mosaic", "litdata", "hf"}:
        m = run_one(python, loader, "convert", base, folder, timeout)
        if m.error:
            row.reason = m.error
            return row
        row.convert_s = m.out["convert_s"]
        row.converted_mib = m.out["converted_bytes"] / 2**20
    else:
        row.convert_s, row.converted_mib = 0.0, 0.0
    m = run_one(python, loader, "throughput", base, folder, timeout)
    if m.error:
        row.reason = m.error
        return row
    o = m.out
    row.mtok_s = o["tokens"] / o["wall_s"] / 1e6
    row.docs_s = o["docs"] / o["wall_s"] if o["docs"] else None
    row.cores = o["cpu_s"] / o["wall_s"]
    row.ns_token = o["cpu_s"] / o["tokens"] * 1e9
    row.first_batch_s = o["first_batch_s"]
    row.peak_rss_mib = m.peak_rss / 2**20
    row.peak_pss_mib = m.peak_pss / 2**20
    row.capped = bool(o["capped"])
    if "peak_held_bytes" in o:
        row.notes.append(f"decoded bytes held at peak: {o['peak_held_bytes'] / 2**20:,.0f} MiB")
    row.notes += epoch_notes(o, args.dataset_tokens)
    if loader in DECODES or args.no_resume:
        return row
    state = folder / "state.bin"
    opts = [*base, "--state", str(state)]
    saved = run_one(python, loader, "save", opts, folder, timeout)
    if saved.error:
        row.exact = "no"
        row.notes.append(saved.error)
        return row
    resumed = run_one(python, loader, "resume", opts, folder, timeout)
    if resumed.error:
        row.exact = "no"
        row.notes.append(resumed.error)
        return row
    row.resume_s = resumed.out.get("resume_s")
    exact, lost, repeated = compare(folder, int(saved.out["split"]), loader != "plitzer")
    row.exact = "yes" if exact else "no"
    row.lost, row.repeated = lost, repeated
    row.notes.append(f"state {saved.out['state_bytes']:,} bytes saved at batch {saved.out['stop_batch']:,}")
    if loader == "grain":
        row.notes.append("resume from the iterator's get_state(), JSON (what Orbax's Grain handler writes)")
    if loader == "hf-stream":
        row.notes.append(
            "resume run with num_workers=0: datasets' IterableDataset.load_state_dict fails (IndexError) "
            "on the states of several StatefulDataLoader workers with uneven shards"
        )
    return row


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m plitzer.bench.baseline",
        description="plitzer against litdata, Grain, Mosaic Streaming and HF datasets on the same Parquet "
        "(see module docs).",
    )
    ap.add_argument("data", help="folder of pre-tokenized Parquet files")
    ap.add_argument(
        "--loaders",
        default="plitzer,litdata,grain,mosaic,hf,hf-stream",
        help="comma-separated; pyarrow is always added",
    )
    ap.add_argument("--batch", type=int, default=64, help="documents per batch (default 64)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 2, help="DataLoader workers / threads")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--column", default=None)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--lanes", type=int, default=None, help="default: the same tokens per step as --batch")
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument(
        "--budget",
        type=int,
        default=None,
        help="plitzer's budget in bytes (default: what two windows in flight need, so reads overlap training)",
    )
    ap.add_argument("--time-limit", type=float, default=60.0, help="seconds of steady state measured at most")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds before a subprocess is killed")
    ap.add_argument("--no-resume", action="store_true", help="skip the resume test")
    ap.add_argument(
        "--repeat",
        type=int,
        default=5,
        help="fresh-process runs of plitzer's first batch, its resume and the window decodes, alternated (default 5)",
    )
    ap.add_argument("--setup", action="store_true", help="create peer virtual environments where needed")
    ap.add_argument("--work", default=None, help="folder for converted copies and records")
    ap.add_argument("--json", default=None, help="write the rows here as JSON")
    args = ap.parse_args(argv)

    import pyarrow.parquet as pq

    from plitzer.bench.runners import parquet_files

    loaders = [x.strip() for x in args.loaders.split(",") if x.strip()]
    unknown = sorted(set(loaders) - set(LOADERS))
    if unknown:
        ap.error(f"unknown loaders {unknown}; known: {', '.join(LOADERS)}")
    loaders = [x for x in LOADERS if x in loaders or x in DECODES]
    files = parquet_files(args.data)
    if not files:
        ap.error(f"no .parquet files under {args.data}")
    rows_total = sum(pq.read_metadata(f).num_rows for f in files)
    import plitzer

    ix = plitzer.index(args.data, column=args.column)
    tokens = ix.tokens
    mean_doc = tokens / max(1, rows_total)
    lanes = args.lanes or match_lanes(args.batch, mean_doc, args.seq_len)
    if args.budget is None:
        from plitzer.loader import budget_floor

        frame = ix.frame
        args.budget, _ = budget_floor(
            frame["tokens"].to_numpy(),
            frame["rows"].to_numpy(),
            lanes=lanes,
            window=args.window,
            seq_len=args.seq_len,
            ahead=1,
        )
    args.dataset_tokens = tokens
    work = Path(args.work or Path.home() / ".cache" / "plitzer" / "bench-work")
    work.mkdir(parents=True, exist_ok=True)
    size = sum(len(Path(f).read_bytes()) for f in files)  # warms the page cache
    print(
        f"{tokens:,} tokens, {rows_total:,} documents (mean {mean_doc:,.0f} tokens) in {len(files)} files "
        f"({size / 2**20:,.0f} MiB); {os.cpu_count()} cores; --batch {args.batch} documents, "
        f"--workers {args.workers}; plitzer lanes={lanes} x seq_len={args.seq_len} "
        f"({lanes * args.seq_len:,} tokens per step vs {args.batch * mean_doc:,.0f}), window={args.window}, "
        f"budget={args.budget / 2**20:,.0f} MiB",
        flush=True,
    )
    base = [
        "--data",
        str(Path(args.data).resolve()),
        "--work",
        str(work),
        "--batch",
        str(args.batch),
        "--workers",
        str(args.workers),
        "--seed",
        str(args.seed),
        "--lanes",
        str(lanes),
        "--seq-len",
        str(args.seq_len),
        "--window",
        str(args.window),
        "--budget",
        str(args.budget),
        "--time-limit",
        str(args.time_limit),
    ]
    if args.column:
        base += ["--column", args.column]
    rows: list[Row] = []
    for loader in loaders:
        t0 = time.perf_counter()
        python, reason = interpreter(loader, args.setup)
        row = Row(loader, reason=reason) if python is None else bench_loader(loader, python, base, work, args)
        rows.append(row)
        print(
            f"[{loader}] done in {time.perf_counter() - t0:.0f} s{': ' + row.reason if row.reason else ''}", flush=True
        )
        for note in row.notes:
            print(f"[{loader}]   {note}", flush=True)
    print()
    print(table(rows))
    ref = next((r for r in rows if r.loader == "pyarrow"), None)
    mine = next((r for r in rows if r.loader == "plitzer"), None)
    starts: dict[str, Any] = {}
    if ref and mine and mine.first_batch_s is not None and args.repeat > 0:
        starts = first_batch_ratios(ref, sys.executable, base, work, args)
    decodes = [r for r in rows if r.loader in DECODES and r.mtok_s]
    fastest = max(decodes, key=lambda r: r.mtok_s or 0.0, default=None)
    if fastest and mine and mine.mtok_s and fastest.mtok_s:
        print(
            f"decode reference: {fastest.loader} (the faster of {', '.join(DECODES)}), "
            f"{fastest.mtok_s:.1f} Mtokens/s; plitzer / reference: {mine.mtok_s / fastest.mtok_s:.2f}x the tokens/s"
            + (
                f", {mine.ns_token / fastest.ns_token:.2f}x the CPU per token"
                if mine.ns_token and fastest.ns_token
                else ""
            )
        )
    hf = next((r for r in rows if r.loader == "hf"), None)
    if hf and mine and hf.mtok_s and mine.mtok_s:
        print(
            f"plitzer / hf: {mine.mtok_s / hf.mtok_s:.2f}x the tokens/s"
            + (f", {mine.ns_token / hf.ns_token:.2f}x the CPU per token" if mine.ns_token and hf.ns_token else "")
        )
    if any(r.capped for r in rows):
        print(f"\n* measured for {args.time_limit:.0f} s of steady state, not a whole epoch")
    record = {
        "data": str(args.data),
        "tokens": tokens,
        "documents": rows_total,
        "files": len(files),
        "cores": os.cpu_count(),
        "batch": args.batch,
        "workers": args.workers,
        "lanes": lanes,
        "seq_len": args.seq_len,
        "window": args.window,
        "budget": args.budget,
        "rows": [r.__dict__ for r in rows],
        "first_batch": starts,
    }
    Path(args.json or work / "baseline.json").write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
