"""One read a replica (SPEC section 19): requests and bytes a process, and a non-reader's wait.

Four gloo processes on 127.0.0.1 as DP 2 x TP 2 (a ``DeviceMesh`` with dimensions ``dp`` and
``tp``) read one epoch of synthetic data from moto's S3 server (its own process on loopback),
each through a counting proxy of its own (tests/s3_fixtures.py's FaultProxy), so every
process's requests and bytes are its own; each process has its own cache folder:

* ``replicas``: ``plitzer.torch.Dataset(src, mesh=mesh, dp="dp")``: each tensor-parallel
  group's rank 0 reads and sends each step to its other rank;
* ``each reads``: the same mesh, every process its own loader of its data rank
  (``group=`` the data-parallel group, no ``replicas``): what a job did before 0.7.

It reports, per process, GET requests, listings and bytes received from the store, and for the
non-readers the bytes received from their reader and the time their consumer waited for a
step (each process times its own ``next()``: median and p95 over the steps after the first
``--skip``), with a consumer that spends ``--consumer-ms`` a step (a sleep: a GPU step, to the
host) and flat out (0). Medians over ``--repeat`` runs of each, alternated.

    python benchmarks/replicas.py --tokens 4000000 --repeat 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def worker(a: argparse.Namespace) -> None:
    """One rank: the epoch read, its figures written to ``--out``."""
    rank = int(os.environ["RANK"])
    os.environ["PLITZER_CACHE"] = str(Path(a.out).parent / f"cache-{Path(a.out).stem}")
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    import plitzer.state.replica
    import plitzer.torch
    from tests.net import join_gloo
    from tests.s3_fixtures import options

    join_gloo(a.port)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    settings: dict[str, Any] = {
        "seed": 0,
        "lanes": a.lanes,
        "window": a.window,
        "seq_len": a.seq_len,
        "epochs": 1,
        "storage_options": options(json.loads(a.endpoints)[rank]),
    }
    if a.mode == "replicas":
        ds = plitzer.torch.Dataset(a.data, mesh=mesh, dp="dp", **settings)
    else:
        dp_group = mesh["dp"].get_group()
        ds = plitzer.torch.Dataset(a.data, group=dp_group, **settings)
    steps, t0, waits = 0, time.perf_counter(), []
    with ds:
        it = iter(ds)
        while True:
            t = time.perf_counter()
            if next(it, None) is None:
                break
            waits.append(time.perf_counter() - t)  # what this step kept the consumer waiting
            steps += 1
            if a.consumer_ms:
                time.sleep(a.consumer_ms / 1000)
        steady = sorted(waits[a.skip :]) or [0.0]
        out: dict[str, Any] = {
            "steps": steps,
            "seconds": time.perf_counter() - t0,
            "wait_median": steady[len(steady) // 2],
            "wait_p95": steady[min(len(steady) - 1, int(0.95 * len(steady)))],
        }
        loader = ds.loader
        if isinstance(loader, plitzer.state.replica.Follower):
            st = loader.stats
            out |= {"role": "follower", "received": st.bytes_received}
        else:
            out |= {"role": "reader" if a.mode == "replicas" else "reads"}
            if a.mode == "replicas":
                out["sent"] = loader.link.bytes_sent
    Path(a.out).write_text(json.dumps(out))
    dist.destroy_process_group()


def job(
    mode: str, data: str, server: Any, a: argparse.Namespace, consumer_ms: float, tmp: Path
) -> list[dict[str, Any]]:
    """Four processes of ``mode``; each one's figures and its requests as its proxy saw them."""
    from tests import prefork
    from tests.net import free_port, gloo_env
    from tests.s3_fixtures import FaultProxy

    proxies = [FaultProxy(server.port) for _ in range(4)]
    port, env = free_port(), gloo_env(4)
    run = tmp / f"{mode}-{consumer_ms}-{time.monotonic_ns()}"
    run.mkdir()
    procs = []
    try:
        for rank in range(4):
            cmd = [
                sys.executable, __file__, "--worker", "--mode", mode, "--data", data, "--port", str(port),
                "--out", str(run / f"{rank}.json"), "--endpoints", json.dumps([p.endpoint for p in proxies]),
                "--lanes", str(a.lanes), "--window", str(a.window), "--seq-len", str(a.seq_len),
                "--consumer-ms", str(consumer_ms), "--skip", str(a.skip),
            ]  # fmt: skip
            procs.append(prefork.Popen(cmd, env={**env, "RANK": str(rank)}, stderr=subprocess.PIPE))
        errs = [p.communicate(timeout=900)[1].decode(errors="replace") for p in procs]
        assert [p.returncode for p in procs] == [0] * 4, "\n".join(e[-2000:] for e in errs)
        got = [json.loads((run / f"{r}.json").read_text()) for r in range(4)]
        for g, p in zip(got, proxies, strict=True):
            log = p.log()
            g["gets"] = sum(r.is_object_get for r in log)
            g["lists"] = sum(r.is_list for r in log)
            g["store_bytes"] = sum(r.body_bytes for r in log)
        return got
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for p in proxies:
            p.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="replicas", help=argparse.SUPPRESS)
    ap.add_argument("--data", default="", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--out", default="", help=argparse.SUPPRESS)
    ap.add_argument("--endpoints", default="", help=argparse.SUPPRESS)
    ap.add_argument("--tokens", type=int, default=4_000_000)
    ap.add_argument("--lanes", type=int, default=16)
    ap.add_argument("--window", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--consumer-ms", type=float, default=10.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--skip", type=int, default=20, help="steps left out of the wait figures (the first reads)")
    a = ap.parse_args()
    if a.worker:
        worker(a)
        return
    import plitzer.synth
    from tests.s3_fixtures import MotoServer, upload

    print("python benchmarks/replicas.py " + " ".join(sys.argv[1:]))
    print(f"{os.cpu_count()} cores; 4 gloo processes as DP 2 x TP 2; moto S3 on 127.0.0.1; load {os.getloadavg()}")
    server = MotoServer()
    try:
        with tempfile.TemporaryDirectory() as d:
            tmp = Path(d)
            plitzer.synth.write(tmp / "data", tokens=a.tokens, seed=3, docs_per_row_group=500, row_groups_per_file=8)
            server.client().create_bucket(Bucket="bench")
            upload(server.client(), "bench", tmp / "data", "synth")
            url = "s3://bench/synth"
            rows: dict[tuple[str, float], list[list[dict[str, Any]]]] = {}
            for _ in range(a.repeat):  # alternated: each mode once a round
                for consumer in dict.fromkeys((a.consumer_ms, 0.0)):  # --consumer-ms 0: flat out only
                    for mode in ("each", "replicas"):
                        rows.setdefault((mode, consumer), []).append(job(mode, url, server, a, consumer, tmp))
            _report(rows, a)
    finally:
        server.stop()
    print(f"load after {os.getloadavg()}")


def _report(rows: dict[tuple[str, float], list[list[dict[str, Any]]]], a: argparse.Namespace) -> None:
    print()
    head = "| mode | consumer ms/step | process | role | steps | GETs | listings | MB from the store |"
    print(head + " MB from its reader | wait ms/step, median | p95 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for (mode, consumer), runs in rows.items():
        for p in range(4):
            med = {
                k: statistics.median(r[p].get(k, 0) or 0 for r in runs)
                for k in ("steps", "gets", "lists", "store_bytes", "received", "wait_median", "wait_p95")
            }
            role = runs[0][p]["role"]
            print(
                f"| {'replicas=' if mode == 'replicas' else 'each reads'} | {consumer:g} | "
                f"{p} (dp {p // 2}, tp {p % 2}) | {role} | "
                f"{med['steps']:.0f} | {med['gets']:.0f} | {med['lists']:.0f} | {med['store_bytes'] / 1e6:.2f} | "
                f"{med['received'] / 1e6:.2f} | {1000 * med['wait_median']:.3f} | {1000 * med['wait_p95']:.3f} |"
            )


if __name__ == "__main__":
    main()
