"""Loss-driven mixing (in the manner of DoReMi and online data mixing): reweight sources from their losses.

Every ``--every`` steps the training loop averages its per-token loss by source
(``batch.documents()`` says which source each token came from), raises the weight of
the sources it does worst on (an exponentiated-gradient step), and calls
``loader.set_weights``. The new stage starts at the first window no lane has begun,
and it is recorded like any stage: in the checkpoint, the plan tables and the audit.

The weights are rounded to integers before the call (they are shares of tokens, and
an integer share is the same number on every machine): two runs with the same seed and
the same losses make the same calls at the same steps, so they give the same batches.
This script checks that, and that a run resumed from a checkpoint taken between the
changes goes on with the same batches and weights::

    python docs/examples/loss_mixing.py            # three synthetic sources, a few seconds, no GPU

The "model" here is a stand-in whose loss on a token is a fixed function of the token
and the source, so that the example needs no framework; put your model's per-token
loss (``torch.nn.functional.cross_entropy(..., reduction="none")``) in its place.
"""

from __future__ import annotations

import argparse
import math
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import polars as pl

import plitzer

SETTINGS = {"seed": 1, "lanes": 8, "window": 2, "seq_len": 64}
SCALE = 1000  # weights are integers: shares to 1/1000


def token_sources(batch: plitzer.Batch) -> np.ndarray:
    """The source of every token of ``batch`` (rows x seq_len), from ``batch.documents()``."""
    docs = batch.documents().select("batch_row", "start", "length", "source")
    out = np.empty(np.from_dlpack(batch.tokens).shape, dtype=object)
    for row, start, length, source in docs.iter_rows():
        out[row, start : start + length] = source
    return out


def source_losses(batch: plitzer.Batch, token_loss: np.ndarray) -> dict[str, tuple[float, int]]:
    """Sum of the loss and number of tokens per source in ``batch`` (``token_loss`` is rows x seq_len)."""
    frame = pl.DataFrame({"source": token_sources(batch).ravel().tolist(), "loss": token_loss.ravel()})
    agg = frame.group_by("source").agg(pl.sum("loss"), pl.len())
    return {s: (float(total), int(n)) for s, total, n in agg.iter_rows()}


def reweight(
    weights: dict[str, int], losses: dict[str, tuple[float, int]], eta: float = 1.0, smooth: float = 0.2
) -> dict[str, int]:
    """One exponentiated-gradient step on the mean loss per source, mixed with uniform (as DoReMi
    smooths its weights), rounded to integer shares."""
    mean = {s: total / n for s, (total, n) in losses.items() if n}
    raw = {s: w * math.exp(eta * mean.get(s, 0.0)) for s, w in weights.items()}
    norm = sum(raw.values())
    mixed = {s: (1 - smooth) * v / norm + smooth / len(raw) for s, v in raw.items()}
    return {s: max(1, round(SCALE * v)) for s, v in mixed.items()}


DIFFICULTY = {"books": 0.2, "code": 0.8, "web": 0.4}  # the stand-in model finds code hardest


def stand_in_loss(batch: plitzer.Batch) -> np.ndarray:
    """The stand-in model: a per-token loss, a fixed function of the token and its source."""
    tokens = np.from_dlpack(batch.tokens).astype(np.int64)
    bias = np.vectorize(DIFFICULTY.__getitem__, otypes=[float])(token_sources(batch))
    return bias + ((tokens * 2654435761) % 1000) / 5000.0


def train(
    sources: dict[str, str],
    steps: int,
    every: int,
    *,
    resume: bytes | None = None,
    save_at: int | None = None,
    loss_fn: Callable[[plitzer.Batch], np.ndarray] = stand_in_loss,
) -> tuple[list[np.ndarray], list[tuple[int, dict[str, int]]], bytes | None]:
    """Run ``steps`` steps; returns the batches, the stages set (step, weights) and the checkpoint at ``save_at``."""
    weights = dict.fromkeys(sorted(sources), SCALE // len(sources))
    saved = None
    with plitzer.Loader(sources, weights=weights, **SETTINGS) as loader:
        if resume is not None:
            loader.resume(resume)  # the stages set before the checkpoint come back with it
            weights = loader.config["stages"][-1][1]
        batches, acc = [], {}
        while loader.step < steps:
            if loader.step == save_at:
                saved = loader.checkpoint()
            batch = loader.next_batch()
            batches.append(np.from_dlpack(batch.tokens).copy())
            for s, (total, n) in source_losses(batch, loss_fn(batch)).items():
                t0, n0 = acc.get(s, (0.0, 0))
                acc[s] = (t0 + total, n0 + n)
            if loader.step % every == 0:
                weights = reweight(weights, acc)
                loader.set_weights(weights)
                acc = {}
        stages = [(int(s), dict(w)) for s, w in loader.config["stages"][1:]]
    return batches, stages, saved


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--every", type=int, default=20)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        sources = {}
        for i, (name, tokens) in enumerate([("books", 30_000), ("code", 50_000), ("web", 90_000)]):
            plitzer.synth.write(Path(tmp) / name, tokens=tokens, seed=i, docs_per_row_group=10, mean_length=80)
            sources[name] = str(Path(tmp) / name)
        # Save where the loss accumulator is empty (right after a change); elsewhere it is
        # training state to checkpoint with the model, as the optimizer's is.
        at = (a.steps // 2) // a.every * a.every
        first, stages, saved = train(sources, a.steps, a.every, save_at=at)
        again, stages2, _ = train(sources, a.steps, a.every)
        assert stages == stages2 and all(np.array_equal(x, y) for x, y in zip(first, again, strict=True))
        assert saved is not None
        resumed, stages3, _ = train(sources, a.steps, a.every, resume=saved)
        assert stages3 == stages
        tail = first[at:]
        assert all(np.array_equal(x, y) for x, y in zip(resumed, tail, strict=True)) and len(resumed) == len(tail)
        for step, w in stages:
            print(f"stage from step {step}: {w}")
        print("ok: two runs with the same losses are identical, and the resumed run equals them")


if __name__ == "__main__":
    main()
