"""The run value (planner.run.Run): immutable, replaced by a live stage, held by the loader alone (its
schedule is given it with each call); and a batch that keeps alive only what its views need."""

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
        assert new is not run and ld.plan is new.plan  # the plan is the run's, derived, never a copy
        assert not hasattr(ld._schedule, "run")  # the schedule holds no run: each call is given it
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
        b._schedule.ahead = 6  # read well past the change, under the old stages
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


def test_what_follows_from_the_run_is_derived_from_it(three: dict[str, str]) -> None:
    """The plan, the settings' layout stages and the config follow each swap of the run (no copy to renew)."""
    with plitzer.Loader(three, weights=W0, **CFG) as ld:
        before = ld.settings
        for _ in range(3):
            ld.next_batch()
        at = ld.set_layout(lanes=4, seq_len=64)
        assert ld.settings.stages.as_config() == ld.config["layout"] == [[0, 8, 32], [at, 4, 64]]
        assert ld.settings.stages.in_units(ld.settings.rule.units_per_row) == ld.run.layout
        assert before.stages.as_config() == [[0, 8, 32]]  # the settings built with are a value: untouched
        start = ld.set_weights(W1)
        assert ld.plan is ld.run.plan and ld.index is ld.run.plan.dataset
        assert ld.config["stages"][-1] == [start, W1] and ld.config["layout"] == [[0, 8, 32], [at, 4, 64]]
        state = ld.checkpoint()
    with plitzer.Loader(three, weights=W0, **CFG) as other:
        other.resume(state)  # the checkpoint's stages taken: the same derived values
        decode = plitzer.state.checkpoint.decode
        assert decode(other.checkpoint()).config == decode(state).config
        assert other.settings.stages.as_config() == [[0, 8, 32], [at, 4, 64]]


def test_grain_takes_the_runs_stages_and_keeps_no_log(three: dict[str, str]) -> None:
    """A Grain dataset's live changes, with no iterator open and with one, reach the iterators made
    later as the run's stages: they equal a loader built with those stages from the start."""
    pytest.importorskip("grain")
    import plitzer.grain

    ds = plitzer.grain.Dataset(three, weights=W0, num_epochs=None, **CFG)
    with pytest.raises(plitzer.ConfigError, match="earliest allowed at_step is 1"):
        ds.set_weights(W1, at_step=0)  # refused at the call, and nothing kept of it
    first = ds.set_weights(W1)  # none open: a loader of the dataset's run says the earliest step
    it = iter(ds)
    for _ in range(7):
        next(it)
    at = ds.set_layout(seq_len=64)  # the open iterator's next step; lanes stay those in force
    last = ds.set_weights(W0)
    assert (first, at) == (1, 7) and last >= at
    it.close()
    stages = [(0, W0), (first, W1), (last, W0)]
    with plitzer.Loader(three, **{**CFG, "weights": stages, "seq_len": [(0, 32), (at, 64)]}) as ref:
        want = [ref.next_batch() for _ in range(30)]
        later = iter(ds)
        assert later.loader.config == ref.config
        for t in range(30):
            np.testing.assert_array_equal(next(later)["tokens"], _tokens(want[t]), err_msg=f"step {t}")
        later.close()
