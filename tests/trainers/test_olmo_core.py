"""OLMo-core trains on plitzer's data (CPU, gloo): kill a 2-rank DDP run after its checkpoint, resume on 1 rank.

tests/trainers/olmo_worker.py builds the run from OLMo-core's config dataclasses with
``plitzer.integrations.olmo_core.PlitzerDataLoaderConfig`` (``generate_doc_lengths=True``:
the rows' ``doc_lens`` are recorded, then dropped, as OLMo-core's CPU attention has no
document masking). Skipped where OLMo-core is not installed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("olmo_core")

from tests.trainers.harness import global_rows, log_of, losses, run_ranks, write_data

pytestmark = pytest.mark.trainers

STEPS, KILL = 6, 3
LOSS_RTOL = 1e-3
"""Losses after the resume against the uninterrupted run's (the first steps ran on 2 ranks there; measured: 1e-4)."""


def test_kill_on_two_ranks_resume_on_one(tmp_path: Path) -> None:
    data = write_data(tmp_path / "data")
    full, cut = tmp_path / "full", tmp_path / "cut"
    worker = "olmo_worker.py"
    assert run_ranks(worker, 1, ["0", str(data), str(STEPS)], full) == 0, log_of(full, worker)
    assert run_ranks(worker, 2, [str(KILL), str(data), str(STEPS)], cut) != 0  # SIGKILLed after step 3
    assert (cut / "save" / f"step{KILL}").is_dir(), log_of(cut, worker)
    assert sorted(global_rows(cut)) == list(range(KILL))
    assert run_ranks(worker, 1, ["0", str(data), str(STEPS)], cut) == 0, log_of(cut, worker)

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
    loss_full, loss_cut = losses(full), losses(cut)
    for step in range(KILL + 1, STEPS + 1):
        assert loss_cut[step] == pytest.approx(loss_full[step], rel=LOSS_RTOL), step
