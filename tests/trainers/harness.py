"""What the trainer tests share: the data, a job of N ranks under torchrun, and the rows and losses it records.

A worker (``*_worker.py`` here) runs a real trainer with plitzer as its data source under
``torch.distributed.run`` (gloo on 127.0.0.1), and records, through :func:`record_rows` and
:func:`record_loss`, every step's rows of its data-parallel rank and the trainer's loss. The
test joins the ranks' rows into each step's global batch (:func:`global_rows`), so runs on
different data-parallel degrees compare row for row.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
VOCAB = 1000
"""The data's vocabulary: smaller than every tiny model's (torchtitan's debugmodel: 2048)."""


def write_data(out: Path, tokens: int = 120_000) -> Path:
    """A small dataset of documents of about 60 tokens (several a row), tokens below :data:`VOCAB`."""
    import plitzer.synth

    plitzer.synth.write(out, tokens, seed=7, mean_length=60, vocab=VOCAB, docs_per_row_group=100)
    return out


def write_mixture(out: Path, tokens: int = 60_000) -> Path:
    """Two sources, ``a`` (tokens below ``VOCAB // 2``) and ``b`` (from ``VOCAB // 2`` on), and their mixture file.

    A token's id says its source (:func:`source_of_tokens`). Returns the mixture file (TOML,
    weights 1 and 1).
    """
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    import plitzer.synth

    half = VOCAB // 2
    for seed, name in enumerate("ab"):
        plitzer.synth.write(out / name, tokens, seed=seed, mean_length=60, vocab=half, docs_per_row_group=100)
    for path in sorted((out / "b").glob("*.parquet")):  # b's ids moved up by half the vocabulary
        table = pq.read_table(path)
        lists = table.column("tokens").combine_chunks()
        moved = pa.ListArray.from_arrays(lists.offsets, pc.add(lists.values, pa.scalar(half, lists.values.type)))
        pq.write_table(table.set_column(table.schema.get_field_index("tokens"), "tokens", moved), path,
                       row_group_size=100)  # fmt: skip
    mixture = out / "mixture.toml"
    mixture.write_text("".join(f'[sources.{n}]\npath = "{out / n}"\nweight = 1\n\n' for n in "ab"))
    return mixture


def source_of_tokens(tokens: np.ndarray) -> np.ndarray:
    """The source number (0: ``a``, 1: ``b``) of each token of :func:`write_mixture`'s data."""
    return (tokens >= VOCAB // 2).astype(np.int64)


def run_ranks(worker: str, world: int, args: list[str], out: Path, *, timeout: float = 300) -> int:
    """Run ``tests/trainers/<worker>`` on ``world`` gloo ranks (torchrun, standalone); its exit status.

    The workers' output goes to ``out/<worker>.log`` (shown by :func:`log_of`).
    """
    out.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
        "GLOO_SOCKET_IFNAME": "lo",
        "PYTHONWARNINGS": "ignore",
        "TORCHELASTIC_ERROR_FILE": str(out / "error.json"),
    }
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}",
        "--max-restarts=0", str(ROOT / "tests" / "trainers" / worker), str(out), *args,
    ]  # fmt: skip
    with open(out / f"{worker}.log", "ab") as log:
        return subprocess.run(
            cmd, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout, check=False
        ).returncode


def log_of(out: Path, worker: str) -> str:
    """The end of a job's output (for an assertion's message)."""
    path = out / f"{worker}.log"
    return path.read_text(errors="replace")[-6000:] if path.exists() else "(no log)"


def record_rows(out: Path, step: int, rank: int, **rows: Any) -> None:
    """Write this data-parallel rank's rows of global step ``step`` (tensors or arrays by name)."""
    arrays = {k: np.asarray(v.detach().cpu() if hasattr(v, "detach") else v) for k, v in rows.items()}
    np.savez(out / f"rows-{step:05d}-{rank:03d}.npz", **arrays)


def record_loss(out: Path, step: int, loss: float) -> None:
    """Append the trainer's loss at its step ``step`` (rank 0 only records)."""
    with open(out / "loss.jsonl", "a") as f:
        f.write(json.dumps({"step": step, "loss": float(loss)}) + "\n")


def record_metrics(out: Path, step: int, metrics: dict[str, Any]) -> None:
    """Append plitzer's figures the trainer logged at its step ``step`` (``plitzer/...``; rank 0 only records)."""
    mine = {k: float(v) for k, v in metrics.items() if k.startswith("plitzer/")}
    with open(out / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": step, **mine}) + "\n")


def logged(out: Path) -> dict[int, dict[str, float]]:
    """The recorded figures by the trainer's step (the last ones written for a step)."""
    path = out / "metrics.jsonl"
    if not path.exists():
        return {}
    return {d.pop("step"): d for d in map(json.loads, path.read_text().splitlines())}


def global_rows(out: Path) -> dict[int, dict[str, np.ndarray]]:
    """Every recorded step's global batch: the ranks' rows stacked in rank order, by name."""
    parts: dict[int, list[tuple[int, dict[str, np.ndarray]]]] = {}
    for path in sorted(out.glob("rows-*.npz")):
        _, step, rank = path.stem.split("-")
        with np.load(path) as z:
            parts.setdefault(int(step), []).append((int(rank), {k: z[k] for k in z.files}))
    return {
        step: {k: np.concatenate([p[k] for _, p in sorted(ranks, key=lambda x: x[0])]) for k in ranks[0][1]}
        for step, ranks in parts.items()
    }


def losses(out: Path) -> dict[int, float]:
    """The recorded losses by the trainer's step (the last one written for a step)."""
    path = out / "loss.jsonl"
    if not path.exists():
        return {}
    return {d["step"]: d["loss"] for d in map(json.loads, path.read_text().splitlines())}
