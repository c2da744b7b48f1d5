"""Balanced steps (SPEC section 18): how far the slowest rank's attention work is above the mean rank's.

Under document masking a row's attention work is the sum of ``n * n`` over its documents
(``doc_lengths``). Each step's imbalance is its slowest rank's work over the mean rank's,
*as assigned* (section 4: rank ``r`` its block of ``B / world`` lanes) and *balanced* (the
step's rows dealt by cost, ``balance=True``). Printed: its median and p95 over the run's first
``--steps`` steps, and the *floor* no deal of whole rows can go below (the rank holding the
step's heaviest row holds ``B / world - 1`` others, at least the lightest ones), at each
``L:B:world`` of ``--configs`` (``L`` = 2048, 8192, 32768 at ``B = 512`` over ``world = 64``;
``B = 64`` over ``world = 8`` at ``L = 32768``). Everything comes from ``plan.costs``
(document lengths only: no batch is packed), on:

* real text: ``plitzer synth --text`` (the installed packages' sources and documentation,
  tokenized with the SentencePiece model ``mistral-common`` ships), ``--text-tokens``;
* FineWeb-like lengths: ``plitzer.synth.write`` (lognormal, mean ``--mean-length`` 900,
  sigma 1, the ``throughput.py`` data's model), ``--fineweb-tokens``.

The run never ends, so a step may take more tokens than the data holds: the epochs repeat,
each in its own order. Data is written once under ``--data`` (``PLITZER_BENCH_DATA``, default
``data/``) and kept; the time of each ``plan.costs`` call is printed beside its row.

    python benchmarks/balance.py
    python benchmarks/balance.py --steps 512 --text-tokens 200000000 --fineweb-tokens 400000000

``--exchange`` measures the deal at work instead, on the real text: the script starts ``world``
gloo processes of itself on 127.0.0.1 (tests/net.py's environment; each
``plitzer.Loader.in_group(torch.distributed.group.WORLD, data, rank=r, world=world, ...)``) and
prints three tables:

* speed at world 2 (``--lanes`` 64, ``--seq-len`` 2048, ``--speed-window`` 8 row groups, so the
  timed steps read several windows; ``--threads`` 1 a rank): ``--pairs`` alternated runs,
  balance off, on, off, on, ..., each ``--warmup`` steps then ``--timed-steps`` timed, first
  with a consumer that sleeps ``--work-ms`` 10 ms a step (``time.sleep``: the GIL released, what
  a GPU step looks like to the host), then flat out. Tokens/s (the global batch over the slower
  rank's wall time), medians over the runs, the ratio on / off, the process's CPU a step;
* the exchange a dealt step: ``loader.stats``' ``exchange_bytes``, ``rows_moved`` and
  ``exchange_seconds`` over its ``balanced_steps``, and the wall and thread CPU of
  ``Balancer.balance`` and its parts (the worker wraps them to time them; nothing else changes);
* the imbalance measured from the batches at each ``L:world`` of ``--exchange-configs``: a rank's
  cost a step is ``batch.cost.sum()`` with balance and the sum of ``n * n`` over
  ``batch.doc_lengths`` without, over the first ``--steps`` steps (window ``--window``), beside
  ``plan.costs``' figures for the same settings (and whether they are equal, step by step).
  World 4 is 4 processes on this machine's cores: right for costs, not for speed.

    python benchmarks/balance.py --exchange
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
from numpy.typing import NDArray

import plitzer
import plitzer.synth
from plitzer.tools.explain import document_lengths


def text_data(root: Path, tokens: int, row_group_tokens: int) -> Path:
    """Real text, tokenized (``plitzer synth --text``), written once and kept."""
    from plitzer.tools.synth_text import write_text

    d = root / f"balance-text-{tokens}-{row_group_tokens}"
    if not (d / ".done").exists():
        print(f"tokenizing {tokens:,} tokens of text into {d} ...", flush=True)
        write_text(d, tokens, row_group_tokens=row_group_tokens, progress=False)
        (d / ".done").write_text("ok")
    return d


def fineweb_data(root: Path, tokens: int, mean_length: float) -> Path:
    """FineWeb-like lengths (lognormal, sigma 1), 1000 documents a row group, written once and kept."""
    d = root / f"balance-fineweb-{tokens}-{mean_length:g}"
    if not (d / ".done").exists():
        print(f"generating {tokens:,} tokens into {d} ...", flush=True)
        plitzer.synth.write(d, tokens=tokens, seed=0, mean_length=mean_length, docs_per_row_group=1000)
        (d / ".done").write_text("ok")
    return d


def imbalance(data: Path, seq_len: int, lanes: int, world: int, steps: int, window: int) -> dict[str, Any]:
    """Each of the first ``steps`` steps' slowest rank over the mean rank, as assigned and balanced."""
    plan = plitzer.plan(data, lanes=lanes, world=world, seq_len=seq_len, window=window)
    t0 = time.perf_counter()
    costs = plan.costs(0, steps - 1)
    took = time.perf_counter() - t0
    per_step = costs.group_by("step").agg(
        (pl.col(c).max() / pl.col(c).mean()).alias(c) for c in ("assigned", "balanced")
    )
    out: dict[str, Any] = {"seconds": took, "floor": floor(plan, steps, lanes // world)}
    for c in ("assigned", "balanced"):
        x = per_step[c].to_numpy()
        out[c] = (float(np.median(x)), float(np.percentile(x, 95)))
    return out


def floor(plan: Any, steps: int, per_rank: int) -> tuple[float, float]:
    """The least imbalance any deal of whole rows, ``per_rank`` a rank, can reach: median and p95 over steps.

    The rank holding a step's heaviest row holds ``per_rank - 1`` others, at least the lightest
    ones. Each row's cost is ``assigned`` with one row a microbatch (``microbatches=per_rank``).
    """
    rows = plan.costs(0, steps - 1, microbatches=per_rank).sort("step", "rank", "microbatch")["assigned"]
    c = np.sort(rows.to_numpy().reshape(steps, -1), axis=1)
    world = c.shape[1] // per_rank
    x = np.maximum(1.0, (c[:, -1] + c[:, : per_rank - 1].sum(axis=1)) / (c.sum(axis=1) / world))
    return float(np.median(x)), float(np.percentile(x, 95))


def describe(name: str, data: Path) -> str:
    n = document_lengths(data)
    return (
        f"{name}: {data} - {int(n.sum()):,} tokens, {len(n):,} documents, median {int(np.median(n)):,}, "
        f"mean {n.mean():,.0f}, p99 {int(np.percentile(n, 99)):,} tokens"
    )


def configs(text: str) -> list[tuple[int, int, int]]:
    """``L:B:world,...`` as (seq_len, lanes, world) triples."""
    out = []
    for part in text.split(","):
        seq_len, lanes, world = (int(x) for x in part.split(":"))
        out.append((seq_len, lanes, world))
    return out


# -- --exchange: the deal at work, over real gloo processes ------------------------------------

ROOT = Path(__file__).resolve().parents[1]
_PHASES: dict[str, list[float]] = {}  # a worker's time in each part of Balancer.balance: [wall, thread CPU, calls]
_DEALT: list[float] = []  # the wall time of each Balancer.balance call (a dealt step), in order


def _count_phases() -> None:
    """Wrap ``Balancer.balance`` and its parts to add up their wall and thread CPU time (a worker's own copy).

    Nothing in plitzer changes: the wrappers only time. ``balance`` runs on the read-ahead's
    thread; gloo runs the collectives on threads of its own, whose CPU only the process's shows.
    """
    import plitzer.readpath.balance as rb

    def timed_call(name: str, fn: Any) -> Any:
        def call(*a: Any, **k: Any) -> Any:
            w0, c0 = time.perf_counter(), time.thread_time()
            try:
                return fn(*a, **k)
            finally:
                got, wall = _PHASES.setdefault(name, [0.0, 0.0, 0]), time.perf_counter() - w0
                got[0] += wall
                got[1] += time.thread_time() - c0
                got[2] += 1
                if name == "balance":
                    _DEALT.append(wall)

        return call

    rb.Balancer.balance = timed_call("balance", rb.Balancer.balance)  # type: ignore[method-assign]
    for name in ("_gather", "_parts", "_all_to_all", "_decode", "_assemble"):
        setattr(rb.Balancer, name, staticmethod(timed_call(name, getattr(rb.Balancer, name))))
    rb.deal = timed_call("deal", rb.deal)  # type: ignore[attr-defined]
    import plitzer.loader
    from plitzer.readpath.batch import Batch

    plitzer.loader.Loader._dealt = timed_call("_dealt", plitzer.loader.Loader._dealt)  # type: ignore[method-assign]
    Batch._segs = timed_call("_segs", Batch._segs)  # type: ignore[method-assign]


def _rank_cost(batch: Any) -> int:
    """This rank's attention cost in ``batch``: the sum of ``n * n`` over each row's ``doc_lengths``."""
    return sum(int((n * n).sum()) for n in batch.doc_lengths)


def _one_run(run: dict[str, Any], rank: int, world: int) -> dict[str, Any]:
    """One loader over the world group: ``warmup`` steps, then ``steps`` timed (speed) or costed (costs)."""
    import torch.distributed as dist

    data, speed = run["data"], run["kind"] == "speed"
    settings = {"seed": 0, "lanes": run["lanes"], "seq_len": run["seq_len"], "window": run["window"]}
    loader = plitzer.Loader.in_group(
        dist.group.WORLD, data, rank=rank, world=world, threads=run["threads"], balance=run["balance"], **settings
    )
    pause = run["work_ms"] / 1000
    try:
        for _ in range(run["warmup"]):  # the first windows read, the read-ahead started
            loader.next_batch()
            if pause:
                time.sleep(pause)
        dist.barrier()  # on the trainer's group, as a trainer's step would: the loader deals on its own
        s0, phases0 = loader.stats, {k: list(v) for k, v in _PHASES.items()}
        c0, w0, first = time.process_time(), time.perf_counter(), len(_DEALT)
        cost, dealt, waits = [], [], []
        for _ in range(run["steps"]):
            t = time.perf_counter()
            b = loader.next_batch()
            waits.append(time.perf_counter() - t)
            if pause:
                time.sleep(pause)  # the consumer's step: what a GPU step looks like to the host (the GIL released)
            if not speed:
                cost.append(_rank_cost(b))
                dealt.append(int(b.cost.sum()) if b.cost is not None else None)
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0  # the process's CPU: every thread's
        dealt_walls = _DEALT[first:]
        s1 = loader.stats
    finally:
        loader.close()
    phases = {k: [a - b for a, b in zip(v, phases0.get(k, [0.0, 0.0, 0]), strict=True)] for k, v in _PHASES.items()}
    return {
        **run,
        "rank": rank,
        "wall": wall,
        "cpu": cpu,
        "wait": sum(waits),  # in next_batch (stats.wait_seconds leaves out the wait for a dealt step)
        "waits": waits,
        "dealt_walls": dealt_walls,
        "stats_wait": s1.wait_seconds - s0.wait_seconds,
        "dealt_steps": s1.balanced_steps - s0.balanced_steps,
        "rows_moved": s1.rows_moved - s0.rows_moved,
        "exchange_bytes": s1.exchange_bytes - s0.exchange_bytes,
        "exchange_seconds": s1.exchange_seconds - s0.exchange_seconds,
        "phases": phases,
        "cost": cost,
        "dealt": dealt,
    }


def worker(spec: Path, port: int, out: Path) -> None:
    """One gloo rank (RANK, WORLD_SIZE from the environment): every run of ``spec`` in order, to ``out``."""
    sys.path.insert(0, str(ROOT))
    import torch.distributed as dist

    from tests.net import join_gloo

    rank, world = join_gloo(port, timeout_s=300)
    _count_phases()
    runs = json.loads(spec.read_text())
    got = []
    for run in runs:
        dist.barrier()
        got.append(_one_run(run, rank, world))
    out.write_text(json.dumps(got))
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)  # the results are written: skip torch's teardown (seconds on 2 busy cores)


def gloo_job(world: int, runs: list[dict[str, Any]], work: Path) -> list[list[dict[str, Any]]]:
    """``world`` processes of this script on 127.0.0.1 (tests/net.py's environment), each doing ``runs``.

    Returns, per run, every rank's result in rank order.
    """
    sys.path.insert(0, str(ROOT))
    from tests.net import free_port, gloo_env

    spec = work / f"runs-{world}.json"
    spec.write_text(json.dumps(runs))
    env, port = gloo_env(world), free_port()
    procs = []
    for rank in range(world):
        out, log = work / f"w{world}.rank{rank}.json", (work / f"w{world}.rank{rank}.log").open("wb")
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", str(spec), "--port", str(port)]
        procs.append(
            subprocess.Popen(
                [*cmd, "--out", str(out)], env={**env, "RANK": str(rank)}, stdout=log, stderr=subprocess.STDOUT
            )
        )
        log.close()
    try:
        codes = [p.wait(timeout=3600) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    if codes != [0] * world:
        for rank in range(world):
            print(f"--- rank {rank} (exit {codes[rank]})", file=sys.stderr)
            print((work / f"w{world}.rank{rank}.log").read_text()[-3000:], file=sys.stderr)
        msg = f"a rank of the world-{world} job failed (exit codes {codes}); its log is above"
        raise SystemExit(msg)
    per_rank = [json.loads((work / f"w{world}.rank{r}.json").read_text()) for r in range(world)]
    return [list(rs) for rs in zip(*per_rank, strict=True)]


def speed_runs(args: argparse.Namespace, data: Path) -> list[dict[str, Any]]:
    """Balance off, on, off, on, ... (``--pairs`` of each), with the consumer's ``--work-ms`` and flat out."""
    base = {
        "kind": "speed",
        "data": str(data),
        "lanes": args.lanes,
        "seq_len": args.seq_len,
        "window": args.speed_window,
        "threads": args.threads,
        "warmup": args.warmup,
        "steps": args.timed_steps,
    }
    out = []
    for work_ms in (args.work_ms, 0.0):
        for _ in range(args.pairs):
            out += [{**base, "work_ms": work_ms, "balance": b} for b in (False, True)]
    return out


def cost_runs(args: argparse.Namespace, data: Path, world: int) -> list[dict[str, Any]]:
    """Each ``L`` of ``--exchange-configs`` at ``world``: ``--steps`` batches from step 0, balance off and on."""
    base = {"kind": "costs", "data": str(data), "lanes": args.lanes, "window": args.window, "threads": args.threads}
    return [
        {**base, "seq_len": seq_len, "world": world, "warmup": 0, "steps": args.steps, "work_ms": 0.0, "balance": b}
        for seq_len, w in exchange_configs(args.exchange_configs)
        if w == world
        for b in (False, True)
    ]


def exchange_configs(text: str) -> list[tuple[int, int]]:
    """``L:world,...`` as (seq_len, world) pairs."""
    return [(int(a), int(b)) for a, b in (part.split(":") for part in text.split(","))]


def _med(xs: list[float]) -> float:
    return float(np.median(xs))


def _ratio(x: NDArray[np.float64]) -> tuple[float, float]:
    """Per step (rows) the max over ranks (columns) over the mean: its median and p95 over steps."""
    r = x.max(axis=1) / x.mean(axis=1)
    return float(np.median(r)), float(np.percentile(r, 95))


def print_speed(args: argparse.Namespace, results: list[list[dict[str, Any]]]) -> None:
    tokens = args.lanes * args.seq_len * args.timed_steps  # the global batch's tokens over the timed steps
    print(
        f"speed: world 2, B = {args.lanes}, L = {args.seq_len:,}, window {args.speed_window}, "
        f"threads {args.threads} a rank; "
        f"{args.warmup} warm-up steps, then {args.timed_steps} timed (after a barrier); balance off and on alternated, "
        f"{args.pairs} pairs; tokens/s = the global batch's tokens over the slower rank's wall time"
    )
    print()
    print(
        "| consumer | balance | tokens/s (M), median | each run | ms/step | next_batch ms/step | "
        "stats.wait_seconds ms/step | CPU ms/step a rank | on / off |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for work_ms in (args.work_ms, 0.0):
        rates = {}
        for b in (False, True):
            rs = [r for r in results if r[0]["work_ms"] == work_ms and r[0]["balance"] == b]
            rate = [tokens / max(x["wall"] for x in r) / 1e6 for r in rs]
            rates[b] = _med(rate)
            ms = _med([max(x["wall"] for x in r) / args.timed_steps * 1e3 for r in rs])
            wait = _med([float(np.mean([x["wait"] for x in r])) / args.timed_steps * 1e3 for r in rs])
            stats_wait = _med([float(np.mean([x["stats_wait"] for x in r])) / args.timed_steps * 1e3 for r in rs])
            cpu = _med([float(np.mean([x["cpu"] for x in r])) / args.timed_steps * 1e3 for r in rs])
            name = f"sleep {work_ms:g} ms a step" if work_ms else "none (flat out)"
            ratio = f"{rates[True] / rates[False]:.3f}x" if b else ""
            each = ", ".join(f"{x:.1f}" for x in rate)
            print(
                f"| {name} | {'on' if b else 'off'} | {rates[b]:.2f} | {each} | {ms:.2f} | {wait:.2f} | "
                f"{stats_wait:.2f} | {cpu:.2f} | {ratio} |",
                flush=True,
            )
    print()
    on = [x for r in results if r[0]["balance"] for x in r]
    print("the exchange (balance on, per dealt step and rank; medians over the runs above, both ranks):")
    print()
    print(
        "| consumer | bytes sent | rows moved (of B / world) | exchange_seconds (ms) | balance() wall median / p95 / "
        "max (ms) | balance() thread CPU (ms) | process CPU on - off (ms) | next_batch > 1 ms (steps) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for work_ms in (args.work_ms, 0.0):
        xs = [x for x in on if x["work_ms"] == work_ms]
        n = [max(x["dealt_steps"], 1) for x in xs]
        sent = _med([x["exchange_bytes"] / k for x, k in zip(xs, n, strict=True)])
        moved = _med([x["rows_moved"] / k for x, k in zip(xs, n, strict=True)])
        secs = _med([x["exchange_seconds"] / k * 1e3 for x, k in zip(xs, n, strict=True)])
        cpu = _med([x["phases"].get("balance", [0, 0, 0])[1] / k * 1e3 for x, k in zip(xs, n, strict=True)])
        walls = np.array([w for x in xs for w in x["dealt_walls"]]) * 1e3
        spread = f"{np.median(walls):.2f} / {np.percentile(walls, 95):.2f} / {walls.max():.2f}" if len(walls) else "-"
        off = [x for r in results if not r[0]["balance"] and r[0]["work_ms"] == work_ms for x in r]
        extra = _med([x["cpu"] for x in xs]) - _med([x["cpu"] for x in off])
        slow = [sum(w > 1e-3 for w in x["waits"]) for x in xs]
        name = f"sleep {work_ms:g} ms" if work_ms else "flat out"
        print(
            f"| {name} | {sent:,.0f} | {moved:.1f} of {args.lanes // 2} | {secs:.3f} | {spread} | {cpu:.3f} | "
            f"{extra / args.timed_steps * 1e3:.2f} | {_med(slow):.0f} of {args.timed_steps} |"
        )
    print()
    print("where a dealt step's time goes (balance on, ms per step, medians over runs and ranks: wall / thread CPU):")
    print()
    parts = ["_dealt", "_segs", "balance", "_gather", "deal", "_parts", "_all_to_all", "_decode", "_assemble"]
    print("| consumer | " + " | ".join(parts) + " |")
    print("|---|" + "---|" * len(parts))
    for work_ms in (args.work_ms, 0.0):
        xs = [x for x in on if x["work_ms"] == work_ms]
        cells = []
        for p in parts:
            got = [(x["phases"][p], max(x["dealt_steps"], 1)) for x in xs if x["phases"].get(p, [0, 0, 0])[2]]
            wall = _med([g[0] / n * 1e3 for g, n in got]) if got else 0.0
            cpu = _med([g[1] / n * 1e3 for g, n in got]) if got else 0.0
            cells.append(f"{wall:.3f} / {cpu:.3f}" if got else "-")
        print(f"| {'sleep' if work_ms else 'flat out'} | " + " | ".join(cells) + " |")
    print(flush=True)


def print_costs(args: argparse.Namespace, data: Path, results: list[list[dict[str, Any]]]) -> None:
    print(
        f"imbalance from the batches: B = {args.lanes}, steps 0..{args.steps - 1}, window {args.window}; each rank's "
        "cost a step: balance off, the sum of n * n over batch.doc_lengths; on, batch.cost.sum(); "
        "plan.costs: the same settings' table (world 4 is 4 processes on 2 cores: right for costs, not for speed)"
    )
    print()
    print(
        "| L | world | assigned median | assigned p95 | balanced median | balanced p95 | "
        "plan.costs assigned | plan.costs balanced | equal to plan.costs |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for seq_len, world in exchange_configs(args.exchange_configs):
        off = next(r for r in results if r[0]["world"] == world and r[0]["seq_len"] == seq_len and not r[0]["balance"])
        on = next(r for r in results if r[0]["world"] == world and r[0]["seq_len"] == seq_len and r[0]["balance"])
        assigned = np.array([x["cost"] for x in off], dtype=np.float64).T  # (steps, world)
        balanced = np.array([x["dealt"] for x in on], dtype=np.float64).T
        same_rows = all(x["cost"] == x["dealt"] for x in on)  # batch.cost against the rows' doc_lengths
        plan = plitzer.plan(data, lanes=args.lanes, world=world, seq_len=seq_len, window=args.window)
        pc = plan.costs(0, args.steps - 1).group_by("step", "rank").agg(pl.col("assigned", "balanced").sum())
        pc = pc.sort("step", "rank")
        p_a = pc["assigned"].to_numpy().reshape(args.steps, world).astype(np.float64)
        p_b = pc["balanced"].to_numpy().reshape(args.steps, world).astype(np.float64)
        equal = np.array_equal(p_a, assigned) and np.array_equal(p_b, balanced)
        (am, a95), (bm, b95) = _ratio(assigned), _ratio(balanced)
        (pam, pa95), (pbm, pb95) = _ratio(p_a), _ratio(p_b)
        check = ("yes" if equal else "NO") + ("" if same_rows else "; batch.cost != doc_lengths' cost")
        print(
            f"| {seq_len:,} | {world} | {am:.3f}x | {a95:.3f}x | {bm:.3f}x | {b95:.3f}x | "
            f"{pam:.3f}x / {pa95:.3f}x | {pbm:.3f}x / {pb95:.3f}x | {check} |",
            flush=True,
        )
    print()


def cpu_seconds() -> tuple[float, float]:
    """(the machine's busy CPU seconds, /proc/stat; this process's and its finished children's), or zeros."""
    import resource

    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:9]]
    except OSError:
        return 0.0, 0.0
    busy = (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")  # less idle and iowait
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return busy, me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def exchange_main(args: argparse.Namespace) -> None:
    from _common import warm_page_cache

    root = Path(args.data)
    data = text_data(root, args.text_tokens, args.row_group_tokens)
    warm_page_cache(data)
    print("$ python " + shlex.join(sys.argv))
    print(describe("real text", data))
    load0 = os.getloadavg()
    print(f"{os.cpu_count()} cores; load average before: {load0[0]:.2f}, {load0[1]:.2f}, {load0[2]:.2f}")
    print(flush=True)
    t0 = time.perf_counter()
    worlds = sorted({w for _, w in exchange_configs(args.exchange_configs)} | {2})
    costs: list[list[dict[str, Any]]] = []
    with tempfile.TemporaryDirectory(prefix="plitzer-bench-balance-") as tmp:
        for world in worlds:
            runs = (speed_runs(args, data) if world == 2 else []) + cost_runs(args, data, world)
            (b0, o0), w0 = cpu_seconds(), time.perf_counter()
            got = gloo_job(world, runs, Path(tmp))
            (b1, o1), took = cpu_seconds(), time.perf_counter() - w0
            print(
                f"world {world}: {len(runs)} runs in {took:.0f} s; this job used {(o1 - o0) / took:.2f} cores, "
                f"other processes {max(0.0, (b1 - b0) - (o1 - o0)) / took:.2f} cores on average (/proc/stat)",
                flush=True,
            )
            print()
            if world == 2:
                print_speed(args, [r for r in got if r[0]["kind"] == "speed"])
            costs += [r for r in got if r[0]["kind"] == "costs"]
    print_costs(args, data, costs)
    load1 = os.getloadavg()
    print(f"took {time.perf_counter() - t0:.0f} s; load average after: {load1[0]:.2f}, {load1[1]:.2f}, {load1[2]:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--configs", default="2048:512:64,8192:512:64,32768:512:64,32768:64:8", help="L:B:world,...")
    ap.add_argument("--steps", type=int, default=128, help="the run's first steps, over which medians and p95")
    ap.add_argument("--window", type=int, default=64, help="row groups a window")
    ap.add_argument("--text-tokens", type=int, default=64_000_000)
    ap.add_argument("--row-group-tokens", type=int, default=1_000_000, help="text: tokens a row group")
    ap.add_argument("--fineweb-tokens", type=int, default=128_000_000)
    ap.add_argument("--mean-length", type=float, default=900.0, help="FineWeb-like: mean document length")
    ap.add_argument("--only", choices=["text", "fineweb"], help="one of the two data sets")
    ap.add_argument("--data", default=os.environ.get("PLITZER_BENCH_DATA", "data"))
    ex = ap.add_argument_group("--exchange: balanced steps over real gloo processes on 127.0.0.1 (real text only)")
    ex.add_argument("--exchange", action="store_true", help="measure the exchange, speed and imbalance from batches")
    ex.add_argument("--lanes", type=int, default=64, help="B, the global batch's rows")
    ex.add_argument("--seq-len", type=int, default=2048, help="L of the speed runs (world 2)")
    ex.add_argument(
        "--speed-window", type=int, default=8, help="speed runs: row groups a window (the timed steps span several)"
    )
    ex.add_argument("--pairs", type=int, default=5, help="speed runs: balance off, on, ... this many pairs")
    ex.add_argument("--warmup", type=int, default=20, help="speed runs: steps before the timed ones")
    ex.add_argument("--timed-steps", type=int, default=200, help="speed runs: steps timed")
    ex.add_argument("--work-ms", type=float, default=10.0, help="the consumer's time.sleep a step (GIL released)")
    ex.add_argument("--threads", type=int, default=1, help="each rank's reader threads")
    ex.add_argument(
        "--exchange-configs", default="2048:2,8192:2,2048:4,8192:4", help="imbalance from batches: L:world,..."
    )
    ex.add_argument("--worker", type=Path, help=argparse.SUPPRESS)  # a rank process, started by --exchange
    ex.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ex.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker is not None:
        worker(args.worker, args.port, args.out)
        return
    if args.exchange:
        exchange_main(args)
        return
    root = Path(args.data)
    sets = []
    if args.only in (None, "text"):
        sets.append(("real text", text_data(root, args.text_tokens, args.row_group_tokens)))
    if args.only in (None, "fineweb"):
        sets.append(("FineWeb-like", fineweb_data(root, args.fineweb_tokens, args.mean_length)))
    print("$ python " + shlex.join(sys.argv))
    for name, d in sets:
        print(describe(name, d))
    print(
        f"{args.steps} steps from step 0, window {args.window}, {os.cpu_count()} cores; "
        "imbalance = a step's max over ranks / mean over ranks of the attention cost"
    )
    print()
    print(
        "| data | L | B | world | assigned median | assigned p95 | balanced median | balanced p95 "
        "| floor median | floor p95 | plan.costs (s) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, d in sets:
        for seq_len, lanes, world in configs(args.configs):
            got = imbalance(d, seq_len, lanes, world, args.steps, args.window)
            (am, ap95), (bm, bp95), (fm, fp95) = got["assigned"], got["balanced"], got["floor"]
            print(
                f"| {name} | {seq_len:,} | {lanes} | {world} | {am:.2f}x | {ap95:.2f}x | {bm:.3f}x | {bp95:.3f}x "
                f"| {fm:.3f}x | {fp95:.3f}x | {got['seconds']:.1f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
