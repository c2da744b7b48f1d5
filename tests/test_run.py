"""The run value (planner.run.Run): immutable, replaced by a live stage, swapped into the loader and
its scanner together; and a batch that keeps alive only what its views need."""

from __future__ import annotations

import dataclasses
import gc
import weakref
from pathlib import Path

import numpy as np
import pytest

import plitzer
import plitzer.synth
from planner.mixing.sources import Stage
from planner.run import Run

CFG = {"seed": 3, "lanes": 8, "window": 2, "seq_len": 32}
W0 = {"books": 1, "code": 1, "web": 2}
W1 = {"books": 5, "code": 0, "web": 1}


@pytest.fixture(scope="module")
def three(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("run")
    for i, (name, tokens) in enumerate([("books", 20_000), ("code", 40_000), ("web", 80_000)]):
        plitzer.synth.write(
            root / name, tokens=tokens, seed=i, docs_per_row_group=8, row_groups_per_file=8, mean_length=60
        )
    return {n: str(root / n) for n in ("books", "code", "web")}


def _tokens(b: plitzer.Batch) -> np.ndarray:
    return np.from_dlpack(b.tokens).copy()


def test_a_run_is_immutable_and_a_stage_makes_a_new_one(three: dict[str, str]) -> None:
    with plitzer.Loader(three, weights=W0, **CFG) as ld:
        run: Run = ld._run
        with pytest.raises(dataclasses.FrozenInstanceError):
            run.rank = 1  # type: ignore[misc]
        first, _ = run.units_of_step(0)
        assert first == 0 and run.epoch_of(0) == 0 and run.epoch_end(0) == len(ld)
        assert run.stages is not None and len(run.stages) == 1
        start = ld.set_weights(W1)
        new: Run = ld._run
        assert new is not run and new is ld._scanner.run  # the loader and its scanner hold the same value
        assert run.stages is not None and len(run.stages) == 1  # the old value still says what it was
        assert new.stages is not None and new.stages[-1] == Stage(start, (5, 0, 1))
        _, unit = new.with_stages(new.stages)  # the same stages again: nothing changes before the end
        assert unit >= new.units_of_step(start)[0]


def test_take_stages_alone_tells_the_scanner(three: dict[str, str]) -> None:
    """A checkpoint's live stage taken without a seek: windows read ahead under the old stages are
    dropped, so the batches that follow are the run's with the stage."""
    with plitzer.Loader(three, weights=W0, **CFG) as a:
        a.next_batch()
        a.next_batch()
        a.set_weights(W1)
        state = plitzer.state.checkpoint.decode(a.checkpoint())
        want = [_tokens(a.next_batch()) for _ in range(30)]
    with plitzer.Loader(three, weights=W0, **CFG) as b:
        b._scanner.ahead = 6  # read well past the change, under the old stages
        b.next_batch()
        b.next_batch()
        b.take_stages(b.fit(state))
        assert (
            b.config["stages"]
            == plitzer.state.checkpoint.decode(b.checkpoint()).config["stages"]
            == state.config["stages"]
        )
        got = [_tokens(b.next_batch()) for _ in range(30)]
    for x, y in zip(got, want, strict=True):
        np.testing.assert_array_equal(x, y)


def test_a_batch_does_not_keep_the_loader_alive(tmp_path: Path) -> None:
    plitzer.synth.write(tmp_path, tokens=50_000, seed=4)
    ld = plitzer.Loader(tmp_path, lanes=4, window=2, seq_len=64)
    batch = ld.next_batch()
    state = ld.checkpoint()
    ref = weakref.ref(ld)
    ld.close()
    del ld
    gc.collect()
    assert ref() is None
    assert batch.state_after() == state  # what the views need is still there
    assert batch.documents()["length"].sum() == 4 * 64


def test_epochs_shorter_than_a_step_s_lanes(tmp_path: Path) -> None:
    """A mixture whose epoch holds fewer tokens than a step has lanes: the lanes' next tokens
    span several epochs, and the positions before any step are those stepping reaches."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for name, docs in (("a", [[1, 2, 3], [4], [], [7, 8], [9], []]), ("b", [[], [5], [], [], [], []])):
        (tmp_path / name).mkdir()
        table = pa.table({"tokens": pa.array(docs, pa.list_(pa.int32()))})
        pq.write_table(table, tmp_path / name / "p.parquet", row_group_size=2)  # three row groups
    sources = {n: str(tmp_path / n) for n in "ab"}
    cfg = {"weights": {"a": 0, "b": 1}, "lanes": 4, "window": 1, "seq_len": 4, "seed": 57}
    with plitzer.Loader(sources, **cfg) as ld:
        stepped = [np.array(ld.next_batch().tokens).copy() for _ in range(8)]
    assert {int(t) for b in stepped for t in b.ravel()} == {5}  # b's one token, again and again
    for step in (1, 3, 7):
        with plitzer.Loader(sources, **cfg) as ld:
            ld.seek(step)
            assert np.array_equal(np.array(ld.next_batch().tokens), stepped[step])
