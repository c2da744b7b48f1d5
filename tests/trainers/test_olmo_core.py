"""OLMo-core trains on plitzer's data (CPU, gloo): kill a 2-rank DDP run after its checkpoint, resume on 1 rank.

tests/trainers/olmo_worker.py builds the run from OLMo-core's config dataclasses with
``plitzer.integrations.olmo_core.PlitzerDataLoaderConfig`` (``generate_doc_lengths=True``:
the rows' ``doc_lens`` are recorded, then dropped, as OLMo-core's CPU attention has no
document masking). Skipped where OLMo-core is not installed.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("olmo_core")

import plitzer.synth
from tests.trainers.harness import VOCAB, global_rows, log_of, losses, run_ranks, write_data

pytestmark = pytest.mark.trainers

STEPS, KILL = 6, 3
LOSS_RTOL = 1e-3
"""Losses after the resume against the uninterrupted run's (the first steps ran on 2 ranks there; measured: 1e-4)."""


def test_kill_on_two_ranks_resume_on_one(tmp_path: Path) -> None:
    data, val = write_data(tmp_path / "data"), tmp_path / "val"
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
