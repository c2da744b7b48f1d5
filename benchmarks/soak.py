"""Soak: process memory over a long run of small steps (does anything grow?).

One loader per source kind (a three-source mixture with stages, on local disk and on
S3, moto's server on 127.0.0.1), small sequences over small row groups, so that a run
of ``--steps`` steps passes through tens of thousands of windows and wraps the
epoch many times. Every ``--every`` steps it samples the process's resident set
(``/proc/self/statm``) and Python's allocated blocks (``sys.getallocatedblocks``).
Each source kind runs in its own fresh process, so one cannot inherit the other's
memory.

The figure of merit is the growth after warm-up: the highest RSS sampled after the
first epoch boundary, against the RSS at that boundary. The run passes when it is
within 5 % or ``--slack-mib`` MiB (4 by default), whichever is larger, for every kind.

    python benchmarks/soak.py --steps 100000 --every 1000 --s3 --plot docs/figures/soak.png

prints one line per kind (steps, windows, epochs, RSS at the first epoch boundary,
peak and last after it, growth; the same for allocated blocks), writes ``--json``
and ``--plot`` when asked, and exits with status 1 when a kind grew past the bound.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PAGE = os.sysconf("SC_PAGE_SIZE")

# The mixture: three sources of different sizes and document lengths, small row groups.
SHAPES = {"web": (160_000, 40, 60.0), "code": (60_000, 20, 40.0), "books": (30_000, 5, 150.0)}
# Token shares by stage (steps); the last stage starts well inside the run.
STAGES = [
    (0, {"web": 2, "code": 1, "books": 1}),
    (3_000, {"web": 1, "code": 2, "books": 1}),
    (9_000, {"web": 4, "code": 1, "books": 2}),
]
SETTINGS = {"seed": 3, "lanes": 8, "window": 4, "seq_len": 32, "threads": 2}


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def write_sources(root: Path) -> dict[str, str]:
    import plitzer.synth

    out = {}
    for i, (name, (tokens, docs, mean)) in enumerate(SHAPES.items()):
        d = root / name
        if not (d / ".done").exists():
            plitzer.synth.write(d, tokens=tokens, seed=20 + i, docs_per_row_group=docs, mean_length=mean)
            (d / ".done").write_text("ok")
        out[name] = str(d)
    return out


def child(sources: dict[str, str], steps: int, every: int, options: dict[str, Any] | None) -> dict[str, Any]:
    """The soak itself, in this process: samples of (step, epoch, rss, blocks)."""
    import gc

    import plitzer

    kw: dict[str, Any] = dict(SETTINGS)
    if options:
        kw["storage_options"] = options
    samples: list[tuple[int, int, int, int]] = []
    boundary: tuple[int, int, int] | None = None
    t0 = time.perf_counter()
    if len(sources) > 1:
        kw["weights"] = STAGES
    with plitzer.Loader(sources if len(sources) > 1 else next(iter(sources.values())), **kw) as ld:
        for step in range(steps):
            batch = ld.next_batch()
            if boundary is None and batch.epoch >= 1:
                gc.collect()
                boundary = (step, rss(), sys.getallocatedblocks())
            if step % every == 0 or step == steps - 1:
                samples.append((step, batch.epoch, rss(), sys.getallocatedblocks()))
        epochs = ld.epoch
        reads = ld.reads
    return {
        "samples": samples,
        "boundary": boundary,
        "epochs": epochs,
        "reads": reads,
        "seconds": time.perf_counter() - t0,
        "steps": steps,
    }


def summarize(name: str, r: dict[str, Any], slack_mib: float) -> tuple[str, bool]:
    b = r["boundary"]
    if b is None:
        return f"{name}: the run never reached the first epoch boundary; raise --steps", False
    after = [s for s in r["samples"] if s[0] >= b[0]]
    peak = max(s[2] for s in after)
    last = after[-1][2]
    growth = peak - b[1]
    bound = max(0.05 * b[1], slack_mib * (1 << 20))
    blocks_peak = max(s[3] for s in after)
    ok = growth <= bound
    mib = 1 << 20
    line = (
        f"{name:6s} {r['steps']:,} steps, {r['reads']:,} row groups read, {r['epochs']} epochs, "
        f"{r['seconds']:.0f} s: RSS {b[1] / mib:.1f} MiB at the first epoch boundary (step {b[0]:,}), "
        f"peak after it {peak / mib:.1f} MiB, last {last / mib:.1f} MiB, growth {growth / mib:+.2f} MiB "
        f"({100 * growth / b[1]:+.1f} %, bound {bound / mib:.1f} MiB): {'ok' if ok else 'GREW'}; "
        f"Python blocks {b[2]:,} at the boundary, peak {blocks_peak:,}, last {after[-1][3]:,}"
    )
    return line, ok


def plot(results: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    for name, r in results.items():
        s = r["samples"]
        steps = [x[0] for x in s]
        (line,) = a.plot(steps, [x[2] / (1 << 20) for x in s], label=name)
        b.plot(steps, [x[3] / 1000 for x in s], label=name, color=line.get_color())
        if r["boundary"] is not None:
            for ax in (a, b):
                ax.axvline(r["boundary"][0], color=line.get_color(), linestyle=":", linewidth=1)
    a.set_ylabel("RSS (MiB)")
    b.set_ylabel("Python allocated blocks (thousands)")
    b.set_xlabel("step (dotted: first epoch boundary)")
    a.legend()
    a.set_title("plitzer soak: mixture of 3 sources with stages, lanes 8, seq_len 32, window 4")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


def run_child(sources: dict[str, str], steps: int, every: int, options: dict[str, Any] | None) -> dict[str, Any]:
    doc = json.dumps({"sources": sources, "steps": steps, "every": every, "options": options})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(REPO)) if p)}
    p = subprocess.run([sys.executable, __file__, "--child", doc], capture_output=True, text=True, env=env, check=False)
    if p.returncode != 0:
        msg = f"the soak process failed ({p.returncode}):\n{p.stderr}"
        raise RuntimeError(msg)
    result: dict[str, Any] = json.loads(p.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=100_000)
    p.add_argument("--every", type=int, default=1_000)
    p.add_argument("--s3", action="store_true", help="also from S3 (moto's server on 127.0.0.1)")
    p.add_argument("--slack-mib", type=float, default=4.0)
    p.add_argument(
        "--data", type=Path, default=None, help="folder for the generated sources (default: a temporary one)"
    )
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--plot", type=Path, default=None)
    p.add_argument("--child", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        doc = json.loads(a.child)
        print(json.dumps(child(doc["sources"], doc["steps"], doc["every"], doc["options"])))
        return 0

    with tempfile.TemporaryDirectory(prefix="plitzer-soak-") as tmp:
        root = a.data or Path(tmp) / "data"
        local = write_sources(root)
        os.environ.setdefault("PLITZER_CACHE", str(Path(tmp) / "cache"))
        results = {"local": run_child(local, a.steps, a.every, None)}
        if a.s3:
            sys.path.insert(0, str(REPO))
            from tests.s3_fixtures import MotoServer, options, upload

            server = MotoServer()
            try:
                client = server.client()
                client.create_bucket(Bucket="soak")
                remote = {}
                for name, d in local.items():
                    upload(client, "soak", Path(d), name)
                    remote[name] = f"s3://soak/{name}"
                results["s3"] = run_child(remote, a.steps, a.every, options(server.endpoint))
            finally:
                server.stop()
    ok = True
    for name, r in results.items():
        line, good = summarize(name, r, a.slack_mib)
        print(line)
        ok = ok and good
    if a.json:
        a.json.write_text(json.dumps(results))
    if a.plot:
        plot(results, a.plot)
        print(f"plot: {a.plot}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
