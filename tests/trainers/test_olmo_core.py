"""OLMo-core trains on plitzer's data (CPU, gloo): kill a 2-rank DDP run after its checkpoint, resume on 1 rank.

tests/trainers/olmo_worker.py builds the run from OLMo-core's config dataclasses with
``plitzer.integrations.olmo_core.PlitzerDataLoaderConfig`` (``generate_doc_lengths=True``:
the rows' ``doc_lens`` are recorded, then dropped, as OLMo-core's CPU attention has no
document masking) and its metrics callback, on a mixture of two sources whose token ids say
which source they are (``low`` below 500, ``high`` from 500). Skipped where OLMo-core is not
installed.
"""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

pytest.importorskip("olmo_core")

import plitzer
import plitzer.synth
from planner.errors import ConfigError
from plitzer.mixing import PPM, Exp3, to_ppm
from tests.trainers.harness import VOCAB, global_rows, log_of, losses, run_ranks

pytestmark = pytest.mark.trainers

STEPS, KILL = 6, 3
LOSS_RTOL = 1e-3
"""Losses after the resume against the uninterrupted run's (the first steps ran on 2 ranks there; measured: 1e-4)."""
HALF = VOCAB // 2
"""Tokens of source ``low`` are below it, of ``high`` at or above it."""


def write_mixture(out: Path, weights: dict[str, int]) -> Path:
    """Sources ``low`` (token ids below :data:`HALF`) and ``high`` (such data shifted up), and a mixture file."""
    for i, name in enumerate(("low", "high")):
        for path in plitzer.synth.write(
            out / name, 60_000, seed=7 + i, mean_length=60, vocab=HALF, docs_per_row_group=100
        ):
            if name == "high":
                t = pq.read_table(path)
                col = t.column("tokens").combine_chunks()
                shifted = pa.ListArray.from_arrays(
                    col.offsets, pc.add(col.flatten(), pa.scalar(HALF, col.type.value_type))
                )
                pq.write_table(
                    t.set_column(t.schema.get_field_index("tokens"), "tokens", shifted), path, row_group_size=100
                )
    toml = "".join(f'[sources.{n}]\npath = "{out / n}"\nweight = {w}\n' for n, w in weights.items())
    (out / "mixture.toml").write_text(toml)
    return out / "mixture.toml"


def metrics(out: Path) -> dict[int, dict[str, float]]:
    """The recorded metrics by the trainer's step (the last written for a step)."""
    return {d.pop("step"): d for d in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())}


def check_metrics(out: Path, world: dict[int, int]) -> None:
    """Each logged step's per-source tokens and targets against its global rows; its losses against the CE loss.

    ``world``: the data-parallel degree of each trainer step (its CE loss is the ranks' mean of
    their own means, so the per-source losses average to it where one rank ran the step).
    """
    rows, got = global_rows(out), metrics(out)
    assert sorted(got) == sorted(world)
    for step, m in got.items():
        tokens, labels = rows[step - 1]["tokens"], rows[step - 1]["labels"]  # the trainer's step 1 is plitzer's 0
        for name, mine in (("low", tokens < HALF), ("high", tokens >= HALF)):
            assert m[f"plitzer/tokens/{name}"] == mine.sum(), (step, name)
            assert m[f"plitzer/targets/{name}"] == (mine & (labels != -100)).sum(), (step, name)
        assert m["plitzer/padding"] == 0 and m["plitzer/wait_s"] >= 0
        assert {n for n in ("low", "high") if f"plitzer/loss/{n}" in m} == {
            n for n in ("low", "high") if m[f"plitzer/targets/{n}"]
        }  # a source without targets in the step has no loss
        if world[step] == 1:
            mean = sum(m.get(f"plitzer/loss/{n}", 0) * m[f"plitzer/targets/{n}"] for n in ("low", "high"))
            mean /= m["plitzer/targets/low"] + m["plitzer/targets/high"]
            assert mean == pytest.approx(m["train/CE loss"], rel=1e-5), step


def test_kill_on_two_ranks_resume_on_one(tmp_path: Path) -> None:
    data, val = write_mixture(tmp_path / "data", {"low": 3, "high": 1}), tmp_path / "val"
    plitzer.synth.write(val, 4_000, seed=8, mean_length=60, vocab=VOCAB, docs_per_row_group=100)
    full, cut = tmp_path / "full", tmp_path / "cut"
    worker, args = "olmo_worker.py", [str(data), str(val), str(STEPS)]
    assert run_ranks(worker, 1, ["0", *args], full) == 0, log_of(full, worker)
    assert run_ranks(worker, 2, [str(KILL), *args], cut) != 0  # SIGKILLed after step 3
    assert (cut / "save" / f"step{KILL}").is_dir(), log_of(cut, worker)
    assert sorted(global_rows(cut)) == list(range(KILL))
    assert run_ranks(worker, 1, ["0", *args], cut) == 0, log_of(cut, worker)

    want, got = global_rows(full), global_rows(cut)
    assert sorted(want) == sorted(got) == list(range(STEPS))
    for step in range(STEPS):
        for name in ("tokens", "labels", "docs"):
            np.testing.assert_array_equal(got[step][name], want[step][name], err_msg=f"{name} of step {step}")
    for rows in want.values():
        tokens, labels, docs = rows["tokens"], rows["labels"], rows["docs"]
        assert tokens.dtype == labels.dtype == np.int64 and tokens.shape == labels.shape == (4, 64)
        assert (docs.sum(axis=1) == 64).all()  # doc_lens: each row's documents, padded with 0
        ends = np.cumsum(docs, axis=1)  # where each document of a row ends
        for row in range(4):
            last = ends[row][docs[row] > 0] - 1  # a document's last token in the row: -100 unless the row cuts it
            inside = np.setdiff1d(np.arange(63), last)
            np.testing.assert_array_equal(labels[row, inside], tokens[row, inside + 1])
            assert (labels[row, last[:-1]] == -100).all()
    # the evaluator (PlitzerEvaluatorCallbackConfig) ran at steps 3 and 6, on the same batches each time
    evals = [json.loads(line) for line in (full / "eval.jsonl").read_text().splitlines()]
    assert [e["step"] for e in evals] == [3, 6] and all(np.isfinite(e["loss"]) for e in evals)
    loss_full, loss_cut = losses(full), losses(cut)
    for step in range(KILL + 1, STEPS + 1):
        assert loss_cut[step] == pytest.approx(loss_full[step], rel=LOSS_RTOL), step
    # plitzer's metrics callback: per-source tokens, targets and losses of every step, 2 ranks summed
    check_metrics(full, dict.fromkeys(range(1, STEPS + 1), 1))
    check_metrics(cut, {s: 2 if s <= KILL else 1 for s in range(1, STEPS + 1)})


def exp3_weights(logged: dict[int, dict[str, float]], names: list[str], every: int) -> list[dict[str, int]]:
    """The weights EXP3 sets from the logged per-source losses (plitzer.mixing.Online's arithmetic, restated)."""
    rule, out = Exp3(), []
    state: Any = rule.init(names, to_ppm([1.0] * len(names)), 0)
    window: list[list[float]] = []
    for step in sorted(logged):  # the trainer's step s is plitzer's s - 1
        window.append([logged[step][f"plitzer/loss/{n}"] for n in names])
        if step % every == 0:
            means = [float(np.mean([w[i] for w in window])) for i in range(len(names))]
            state, weights = rule.update(state, step, means)
            out.append(dict(zip(names, weights, strict=True)))
            window = []
    return out


@pytest.mark.filterwarnings("ignore::ImportWarning")  # OLMo-core's imports, in this process
def test_steering_from_the_trainers_loss_resumes_exactly(tmp_path: Path) -> None:
    """steer=2 on one rank, killed after step 3 and resumed: the stages are EXP3's from the logged losses
    (the change after step 4 takes steps 3 and 4, either side of the kill), and the rows are those stages'."""
    data = write_mixture(tmp_path / "data", {"low": 1, "high": 1})
    out, worker, args = tmp_path / "run", "olmo_worker.py", [str(data), "-", str(STEPS), "2"]
    assert run_ranks(worker, 1, [str(KILL), *args], out) != 0
    assert run_ranks(worker, 1, ["0", *args], out) == 0, log_of(out, worker)
    logged, stages = metrics(out), json.loads((out / "stages.json").read_text())
    assert sorted(logged) == list(range(1, STEPS + 1))
    names = ["low", "high"]
    shares = [{n: Fraction(w[n], sum(w.values())) for n in names} for _, w in stages]  # stages keep w in lowest terms
    want = [{n: Fraction(w[n], PPM) for n in names} for w in exp3_weights(logged, names, every=2)]
    assert shares == [{"low": Fraction(1, 2), "high": Fraction(1, 2)}, *want]
    assert any(w["low"] != Fraction(1, 2) for w in want) and stages[1][0] < STEPS  # a change, within the run
    rows = global_rows(out)
    sources = {n: str(data.parent / n) for n in names}
    with plitzer.Loader(
        sources, weights=[tuple(s) for s in stages], lanes=4, seq_len=64, window=2, labels=True
    ) as replay:
        for step in range(STEPS):
            batch = replay.next_batch()
            np.testing.assert_array_equal(rows[step]["tokens"], batch.tokens, err_msg=f"step {step}")
    # steer without the callback that feeds it: refused at the first batch, naming the callback
    from plitzer.integrations.olmo_core import PlitzerDataLoaderConfig

    loader = PlitzerDataLoaderConfig(global_batch_size=256, sequence_length=64, mixture=str(data), steer=2).build()
    loader.reshuffle(1)
    with pytest.raises(ConfigError, match="PlitzerMetricsCallbackConfig"):
        next(iter(loader))
