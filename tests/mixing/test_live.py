"""Live stages (SPEC section 8): set_weights during the run equals the same stages up front.

A run that calls ``set_weights`` at some steps must give the same global batches, at any
world size, as one constructed with those stages from the start; it must resume exactly
from any later checkpoint, at another world size, built with the first weights only; and
the change must show in checkpoints, plan tables, explain and the audit.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import given
from hypothesis import strategies as st

import plitzer
import plitzer.audit
from plitzer.state import live
from tests.conftest import tokens_of
from tests.mixing.test_mixture import _share_bounds

SETTINGS = {"seed": 5, "lanes": 4, "window": 2, "seq_len": 32}  # tests/live_worker.py
TWO_W0 = {"a": 1, "b": 1}
CFG = {"seed": 3, "lanes": 8, "window": 2, "seq_len": 32}
W0 = {"books": 1, "code": 1, "web": 2}


@pytest.fixture(scope="module")
def three(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("live")
    for i, (name, tokens) in enumerate([("books", 20_000), ("code", 40_000), ("web", 80_000)]):
        plitzer.synth.write(
            root / name, tokens=tokens, seed=i, docs_per_row_group=8, row_groups_per_file=8, mean_length=60
        )
    return {n: str(root / n) for n in ("books", "code", "web")}


def _steps(loaders: list[plitzer.Loader], n: int) -> list[np.ndarray]:
    """``n`` global batches of the ranks' loaders (rows of the ranks stacked)."""
    return [np.concatenate([tokens_of(ld.next_batch()) for ld in loaders]) for _ in range(n)]


def _live_run(sources: dict[str, str], world: int, calls: list[tuple[int, dict[str, int], int | None]], steps: int):
    """Every rank runs ``steps`` steps, making ``calls`` (step, weights, at_step offset) on the way."""
    loaders = [plitzer.Loader(sources, weights=W0, world=world, rank=r, **CFG) for r in range(world)]
    out: list[np.ndarray] = []
    stages: list[tuple[int, dict[str, int]]] = [(0, W0)]
    try:
        for step, weights, offset in sorted(calls, key=lambda c: c[0]):
            out += _steps(loaders, step - len(out))
            at = None if offset is None else live.earliest_step(loaders[0].plan, len(out), CFG["seq_len"]) + offset
            got = {ld.set_weights(weights, at_step=at) for ld in loaders}
            assert len(got) == 1  # every rank places the stage at the same step
            stages.append((got.pop(), weights))
        out += _steps(loaders, steps - len(out))
        state = plitzer.merge([ld.checkpoint() for ld in loaders])
    finally:
        for ld in loaders:
            ld.close()
    return out, stages, state


weights_st = st.fixed_dictionaries({n: st.integers(0, 3) for n in ("books", "code", "web")}).filter(
    lambda w: any(w.values())
)
calls_st = st.lists(
    st.tuples(st.integers(0, 50), weights_st, st.one_of(st.none(), st.integers(0, 6))), min_size=1, max_size=3
)


@given(calls=calls_st, world=st.sampled_from([1, 2, 4]))
def test_live_calls_equal_the_stages_given_up_front(three: dict[str, str], calls, world: int) -> None:
    steps = 45
    got, stages, _ = _live_run(three, world, calls, steps)
    with plitzer.Loader(three, weights=stages, **CFG) as ref:
        want = _steps([ref], steps)
        assert ref.config["stages"] == [[s, w] for s, w in _reduced(ref, stages)]
    for t in range(steps):
        np.testing.assert_array_equal(got[t], want[t], err_msg=f"step {t}, world {world}, stages {stages}")


@given(calls=calls_st, k=st.integers(0, 40), world=st.sampled_from([1, 2, 4]))
def test_resume_after_live_changes_at_another_world(three: dict[str, str], calls, k: int, world: int) -> None:
    """A checkpoint taken at any step after live changes resumes, at another world size in loaders
    built with the first weights only, into the batches of the stages given up front."""
    made = [c for c in calls if c[0] <= k]
    _, stages, state = _live_run(three, 1, made, k)
    loaders = [plitzer.Loader(three, weights=W0, world=world, rank=r, **CFG) for r in range(world)]
    try:
        for ld in loaders:
            ld.resume(state)
        got = _steps(loaders, 8)
    finally:
        for ld in loaders:
            ld.close()
    with plitzer.Loader(three, weights=stages, **CFG) as ref:
        ref.seek(k)
        for t in range(8):
            np.testing.assert_array_equal(got[t], tokens_of(ref.next_batch()), err_msg=f"resume at {k}, +{t}")


def _reduced(loader: plitzer.Loader, stages):
    return [[st.start, st.as_dict(loader.plan.names)] for st in loader.plan.stages][: len(stages)]


def test_every_world_and_resume_at_another_world(three: dict[str, str]) -> None:
    calls = [(9, {"books": 0, "code": 3, "web": 1}, None), (30, {"books": 4, "code": 1, "web": 1}, 3)]
    runs = {w: _live_run(three, w, calls, 70) for w in (1, 2, 4)}
    for w in (2, 4):
        for t in range(70):
            np.testing.assert_array_equal(runs[w][0][t], runs[1][0][t], err_msg=f"step {t}, world {w}")
    full, stages, _ = runs[1]
    # Checkpoints taken after a change, resumed at another world by loaders built with the
    # first weights only: the stages come from the checkpoint, the batches are the run's.
    rng = np.random.default_rng(5)
    for k in sorted(rng.choice(np.arange(12, 60), 4, replace=False).tolist()):
        head, _, state = _live_run(three, 1, [c for c in calls if c[0] <= k], k)
        for t in range(k):
            np.testing.assert_array_equal(head[t], full[t])
        resumed = []
        for world in (2, 4):
            loaders = [plitzer.Loader(three, weights=W0, world=world, rank=r, **CFG) for r in range(world)]
            for ld in loaders:
                ld.resume(state)
                assert ld.config["stages"][: len(stages)] == plitzer.state.checkpoint.decode(state).config["stages"]
            rest = _steps(loaders, 10)
            resumed.append(rest)
            for ld in loaders:
                ld.close()
        for rest in resumed:
            for t in range(10):
                if k >= 30:  # the second change was made before the checkpoint
                    np.testing.assert_array_equal(rest[t], full[k + t], err_msg=f"resume at {k}, step {k + t}")
                else:
                    with plitzer.Loader(three, weights=stages[:2], **CFG) as ref:
                        ref.seek(k + t)
                        np.testing.assert_array_equal(rest[t], tokens_of(ref.next_batch()))


def test_resume_keeps_the_loaders_own_later_stages(three: dict[str, str]) -> None:
    """A loader built with a schedule that goes on past the checkpoint (a stage at step 90) resumes a run
    that changed its weights live at step 20: the live stage comes from the checkpoint, the later one
    from the loader, and a stage at or before the step that neither has is refused."""
    w1, w2 = {"books": 0, "code": 3, "web": 1}, {"books": 3, "code": 1, "web": 1}
    _, stages, state = _live_run(three, 1, [(20, w1, None)], 45)
    with plitzer.Loader(three, weights=[(0, W0), (90, w2)], world=2, rank=1, **CFG) as b:
        b.resume(state)
        assert [s for s, _ in b.config["stages"]] == [0, stages[1][0], 90]
        got = [tokens_of(b.next_batch()) for _ in range(60)]
    with plitzer.Loader(three, weights=[*stages, (90, w2)], world=2, rank=1, **CFG) as ref:
        ref.seek(45)
        for t in range(60):
            np.testing.assert_array_equal(got[t], tokens_of(ref.next_batch()), err_msg=f"step {45 + t}")
    with plitzer.Loader(three, weights=[(0, W0), (10, w2)], **CFG) as c:
        with pytest.raises(plitzer.CheckpointError, match="stages up to step 45"):
            c.resume(state)


def test_earliest_step_and_refusals(three: dict[str, str]) -> None:
    with plitzer.Loader(three, weights=W0, **CFG) as ld:
        _steps([ld], 13)
        earliest = live.earliest_step(ld.plan, ld.step, CFG["seq_len"])
        # SPEC 8: the first step whose window (the first at or after its first token) is unbegun.
        per_step = CFG["lanes"] * CFG["seq_len"]
        starts = ld.plan.window_starts(400)
        first_unbegun = int(np.searchsorted(starts, 13 * per_step, side="left"))
        window_of = lambda s: int(np.searchsorted(starts, s * per_step, side="left"))  # noqa: E731
        assert window_of(earliest) >= first_unbegun > window_of(earliest - 1)
        with pytest.raises(plitzer.ConfigError, match=f"earliest allowed at_step is {earliest}"):
            ld.set_weights({"books": 1, "code": 1, "web": 1}, at_step=earliest - 1)
        with pytest.raises(plitzer.ConfigError, match="unknown source 'wiki'"):
            ld.set_weights({"books": 1, "code": 1, "wiki": 1})
        with pytest.raises(plitzer.ConfigError, match="give one dict"):
            ld.set_weights([(0, W0)])  # type: ignore[arg-type]
        assert ld.set_weights({"books": 1, "code": 1, "web": 1}) == earliest
        assert ld.config["stages"][-1] == [earliest, {"books": 1, "code": 1, "web": 1}]
        with pytest.raises(plitzer.ConfigError, match=f"the last stage starts at step {earliest}"):
            ld.set_weights(W0, at_step=earliest)
    with plitzer.Loader(three["web"], **CFG) as one, pytest.raises(plitzer.ConfigError, match="needs a mixture"):
        one.set_weights({"web": 1})


def test_prefetched_windows_are_read_again(three: dict[str, str]) -> None:
    """Windows read ahead past the change (a budget that prefetches far) are dropped, not delivered."""
    change = {"books": 5, "code": 0, "web": 1}
    with plitzer.Loader(three, weights=W0, **CFG) as ld:
        ld._schedule.ahead = 6  # read well past the change
        _steps([ld], 6)
        read = ld.reads
        at = ld.set_weights(change)
        rest = [ld.next_batch() for _ in range(40)]
        assert ld.reads > read
    with plitzer.Loader(three, weights=[(0, W0), (at, change)], **CFG) as ref:
        ref.seek(6)
        for b in rest:
            want = ref.next_batch()
            np.testing.assert_array_equal(tokens_of(b), tokens_of(want))
            assert b.documents().equals(want.documents())


def test_recorded_in_checkpoint_plan_tables_explain_and_audit(three: dict[str, str]) -> None:
    with plitzer.Loader(three, weights=W0, **CFG) as ld:
        _steps([ld], 5)
        a = ld.set_weights({"books": 0, "code": 1, "web": 1})
        _steps([ld], 30)
        b = ld.set_weights({"books": 2, "code": 1, "web": 0}, at_step=ld.step + 4)
        batches = [ld.next_batch() for _ in range(60)]
        state = plitzer.state.checkpoint.decode(ld.checkpoint())
        plan = ld.plan
        stages = plan.sql("select start_step, source, weight from stages order by start_step, source").rows()
        shares = plitzer.audit.mixture_shares(plan, seq_len=CFG["seq_len"], epochs=1)
    assert [s for s, _ in state.config["stages"]] == [0, a, b]
    assert {s for s, *_ in stages} == {0, a, b} and ("books", 0) in [(n, w) for s, n, w in stages if s == a]
    assert shares["stage"].max() == 2
    # books weigh 0 in stage 1: none of its tokens in the windows of stage 1
    s1 = shares.filter((pl.col("stage") == 1) & (pl.col("source") == "books"))
    assert s1.height > 0 and s1["delivered_share"].max() == 0
    # explain with the recorded stages gives what the live run delivered
    t = batches[-1].step
    got = plitzer.explain(three, t, weights=state.config["stages"], **CFG)
    assert got.drop("step").equals(batches[-1].documents().drop("batch_row"))


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("live-two")
    for i, name in enumerate(("a", "b")):
        plitzer.synth.write(
            root / name, tokens=20_000, seed=20 + i, docs_per_row_group=8, row_groups_per_file=8, mean_length=60
        )
        plitzer.index(root / name)  # the index cache, filled before the processes start
    return {n: str(root / n) for n in ("a", "b")}


def test_grain_set_weights_and_state_across_worlds(two: dict[str, str]) -> None:
    """Grain: the iterator's and the dataset's set_weights equal the loader's; a state after the
    change resumes at another world in iterators built with the first weights only."""
    pytest.importorskip("grain")
    import plitzer.grain

    change = {"a": 3, "b": 1}
    ds = plitzer.grain.Dataset(two, weights=TWO_W0, num_epochs=None, **SETTINGS)
    it = iter(ds)
    with plitzer.Loader(two, weights=TWO_W0, **SETTINGS) as ld:
        for _ in range(5):
            next(it), ld.next_batch()
        at = ds.set_weights(change)
        assert at == ld.set_weights(change)
        for _ in range(8):
            np.testing.assert_array_equal(next(it)["tokens"], tokens_of(ld.next_batch()))
        state = it.get_state()
        later = iter(ds)  # a new iterator of the dataset has the stage too, from step 0
        assert later.loader.config["stages"] == ld.config["stages"]
        later.close()
        rest = [tokens_of(ld.next_batch()) for _ in range(6)]
    parts = []
    for r in range(2):
        other = iter(plitzer.grain.Dataset(two, weights=TWO_W0, num_epochs=None, rank=r, world=2, **SETTINGS))
        other.set_state(state)
        parts.append([next(other)["tokens"] for _ in range(6)])
        other.close()
    for t in range(6):
        np.testing.assert_array_equal(np.concatenate([parts[0][t], parts[1][t]]), rest[t])
    it.close()


def test_a_source_added_at_a_zero_weight_past(three: dict[str, str]) -> None:
    """A checkpoint of books+code resumes with web added (weight 0 up to the checkpoint's step):
    books and code go on where they stopped, web starts its first epoch at its stage, and the run
    is the one made with web (at weight 0) from the start."""
    old = {n: three[n] for n in ("books", "code")}
    w_old = {"books": 1, "code": 1}
    stages = [(0, {**w_old, "web": 0}), (60, {"books": 1, "code": 1, "web": 2})]
    with plitzer.Loader(three, weights=stages, **CFG) as fresh:
        want = [fresh.next_batch() for _ in range(140)]
        shares = plitzer.audit.mixture_shares(fresh.plan, seq_len=CFG["seq_len"], epochs=1)
    for c in (0, 17, 41):
        with plitzer.Loader(old, weights=w_old, **CFG) as a:
            head = _steps([a], c)
            state = a.checkpoint()
        for t in range(c):
            np.testing.assert_array_equal(head[t], tokens_of(want[t]))
        for world in (1, 2):
            loaders = [plitzer.Loader(three, weights=stages, world=world, rank=r, **CFG) for r in range(world)]
            for ld in loaders:
                ld.resume(state)
            got = _steps(loaders, 140 - c)
            for ld in loaders:
                ld.close()
            for t in range(140 - c):
                np.testing.assert_array_equal(got[t], tokens_of(want[c + t]), err_msg=f"added at {c}, step {c + t}")
    # web's share follows its stage, within the bounds of SPEC 8 (docs/design.md), window after window.
    web = shares.filter((pl.col("stage") == 1) & (pl.col("source") == "web"))
    assert web.height > 3 and web["target_share"][0] == pytest.approx(0.5)
    assert shares.filter((pl.col("stage") == 0) & (pl.col("source") == "web"))["delivered_share"].max() == 0
    with plitzer.Loader(three, weights={**w_old, "web": 0}, **CFG) as b:
        b.resume(state)
        b.set_weights({"books": 1, "code": 1, "web": 2}, at_step=60)
        _share_bounds(b.plan, 2)


def test_a_source_added_then_weighted_live_and_refusals(three: dict[str, str]) -> None:
    old = {n: three[n] for n in ("books", "code")}
    w_old = {"books": 1, "code": 1}
    with plitzer.Loader(old, weights=w_old, **CFG) as a:
        _steps([a], 20)
        state = a.checkpoint()
    # The new source joins at weight 0, then weighs in from the earliest step allowed.
    with plitzer.Loader(three, weights={**w_old, "web": 0}, **CFG) as b:
        b.resume(state)
        at = b.set_weights({"books": 1, "code": 1, "web": 2})
        docs = pl.concat([b.next_batch().documents() for _ in range(60)])
        config = b.config
    assert [n for n, _ in config["sources"]] == ["books", "code", "web"]
    assert docs.filter(pl.col("source") == "web").height > 0
    with plitzer.Loader(three, weights=[(0, {**w_old, "web": 0}), (at, {"books": 1, "code": 1, "web": 2})], **CFG) as c:
        c.seek(20)
        want = pl.concat([c.next_batch().documents() for _ in range(60)])
    assert docs.equals(want)
    # A source that weighs something before the checkpoint's step is refused, naming it.
    with plitzer.Loader(three, weights={"books": 1, "code": 1, "web": 1}, **CFG) as d:
        with pytest.raises(plitzer.CheckpointError, match="source 'web' is not in the checkpoint"):
            d.resume(state)
    # Removing a source is a stage of weight 0; leaving it out of the sources is refused.
    with plitzer.Loader({"books": three["books"]}, **CFG) as e:
        with pytest.raises(plitzer.CheckpointError, match="sources: checkpoint"):
            e.resume(state)


def test_a_source_added_epochs_into_the_run_changes_nothing_until_it_weighs(three: dict[str, str]) -> None:
    """Added at a checkpoint mid-window, mixture epochs into the run: the batches and epochs are
    those of the run without the source until its stage, and those of the run that had it (at
    weight 0) from the start throughout (the mixture's epoch counts the sources the first stage
    weighs, so no window is relabelled)."""
    old = {n: three[n] for n in ("books", "code")}
    w_old = {"books": 1, "code": 1}
    per_step = CFG["lanes"] * CFG["seq_len"]
    with plitzer.Loader(old, weights=w_old, **CFG) as a:
        c = 5 * a.tokens // (2 * per_step) + 3  # inside mixture epoch 2
        a.seek(c)
        assert (plitzer.state.checkpoint.decode(a.checkpoint()).positions[:, 3:] > 0).any()  # mid-slice lanes
        state = a.checkpoint()
        without = [a.next_batch() for _ in range(80)]
    at = c + 40
    stages = [(0, {**w_old, "web": 0}), (at, {"books": 1, "code": 1, "web": 2})]
    with plitzer.Loader(three, weights=stages, **CFG) as fresh:
        fresh.seek(c)
        want = [fresh.next_batch() for _ in range(80)]
    for world in (1, 2):
        loaders = [plitzer.Loader(three, weights=stages, world=world, rank=r, **CFG) for r in range(world)]
        try:
            for ld in loaders:
                ld.resume(state)
            assert loaders[0].epoch == 2
            got = _steps(loaders, 80)
        finally:
            for ld in loaders:
                ld.close()
        for t in range(80):
            np.testing.assert_array_equal(got[t], tokens_of(want[t]), err_msg=f"world {world}, step {c + t}")
    first = next(t for t in range(80) if "web" in want[t].documents()["source"].to_list())
    assert first >= at - c - 4  # web appears only from its stage's window (a window is a few steps here)
    for t in range(first):
        np.testing.assert_array_equal(tokens_of(want[t]), tokens_of(without[t]), err_msg=f"step {c + t}")
        assert want[t].epoch == without[t].epoch


def test_loss_mixing_example(three: dict[str, str]) -> None:
    """docs/examples/loss_mixing.py: the same losses make the same calls and batches; a resume between
    changes goes on with them; its per-source losses count every token of the batch once."""
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "docs" / "examples" / "loss_mixing.py"
    spec = importlib.util.spec_from_file_location("loss_mixing", path)
    assert spec is not None and spec.loader is not None
    ex = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ex)
    first, stages, saved = ex.train(three, 40, 10, save_at=20)
    again, stages2, _ = ex.train(three, 40, 10)
    assert len(stages) == 4 and stages == stages2 and len({str(w) for _, w in stages}) > 1
    assert all(np.array_equal(x, y) for x, y in zip(first, again, strict=True))
    resumed, stages3, _ = ex.train(three, 40, 10, resume=saved)
    assert stages3 == stages and all(np.array_equal(x, y) for x, y in zip(resumed, first[20:], strict=True))
    with plitzer.Loader(three, weights=[(0, dict.fromkeys(three, 1)), *stages[:-1]], **ex.SETTINGS) as ld:
        batch = ld.next_batch()
        got = ex.source_losses(batch, np.ones((ex.SETTINGS["lanes"], ex.SETTINGS["seq_len"])))
        assert sum(n for _, n in got.values()) == ex.SETTINGS["lanes"] * ex.SETTINGS["seq_len"]
        counts = batch.documents().group_by("source").agg(pl.sum("length")).rows()
        assert {s: n for s, (_, n) in got.items()} == dict(counts)


def test_a_refused_resume_leaves_the_loaders_stages_as_they_were(three: dict[str, str]) -> None:
    """A resume that adopts a checkpoint's live stage and is then refused (here: positions that
    are not where its step puts the lanes) gives the loader back its own stages and batches."""
    with plitzer.Loader(three, weights=W0, **CFG) as a:
        a.set_weights({"books": 2, "code": 1, "web": 1}, at_step=5)
        a.seek(30)
        good = plitzer.state.checkpoint.decode(a.checkpoint())
    assert len(good.config["stages"]) == 2
    moved = good.positions.copy()
    moved[:, 2] += 1  # every lane a window further than step 30 puts it
    state = plitzer.state.checkpoint.encode(plitzer.state.checkpoint.State(good.config, good.step, moved))
    with plitzer.Loader(three, weights=W0, **CFG) as b, plitzer.Loader(three, weights=W0, **CFG) as ref:
        before = b.config
        with pytest.raises(plitzer.CheckpointError, match="is not where step 30 puts it"):
            b.resume(state)
        assert b.config == before
        for t in range(30):
            np.testing.assert_array_equal(tokens_of(b.next_batch()), tokens_of(ref.next_batch()), err_msg=f"{t}")


def test_live_stages_over_a_selected_source(three: dict[str, str]) -> None:
    """A mixture with a where= source takes live stages like any other: the run equals the same
    stages up front, and resumes exactly at another world size."""
    sources = {"books": {"path": three["books"], "where": "language = 'en'"}, "code": three["code"]}
    w0, w1 = {"books": 1, "code": 1}, {"books": 3, "code": 1}
    with plitzer.Loader(sources, weights=w0, **CFG) as live_ld:
        idx = live_ld.plan.index
        assert 0 < idx["tokens_selected"].sum() < idx["tokens"].sum()  # the selection is in the stream
        got = [tokens_of(live_ld.next_batch()) for _ in range(12)]
        start = live_ld.set_weights(w1)
        got += [tokens_of(live_ld.next_batch()) for _ in range(28)]
        state = live_ld.checkpoint()
    with plitzer.Loader(sources, weights=[(0, w0), (start, w1)], **CFG) as ref:
        for t in range(40):
            np.testing.assert_array_equal(got[t], tokens_of(ref.next_batch()), err_msg=f"step {t}")
        after = [tokens_of(ref.next_batch()) for _ in range(10)]
    parts = [plitzer.Loader(sources, weights=w0, world=2, rank=r, **CFG) for r in range(2)]
    try:
        for ld in parts:
            ld.resume(state)
        for t in range(10):
            both = np.concatenate([tokens_of(ld.next_batch()) for ld in parts])
            np.testing.assert_array_equal(both, after[t], err_msg=f"step {40 + t}")
    finally:
        for ld in parts:
            ld.close()


def test_where_on_a_text_source_is_refused(three: dict[str, str]) -> None:
    sources = {"books": {"path": three["books"], "where": "score > 1", "tokenizer": "tok.json"}, "code": three["code"]}
    with pytest.raises(plitzer.ConfigError, match="where= with a text source"):
        plitzer.Loader(sources, **CFG)


@pytest.mark.parametrize("at", [1, 2, 3])
def test_a_change_that_begins_in_windows_already_passed_is_read_again(tmp_path: Path, at: int) -> None:
    """A source whose epoch holds one token, weighted alone, then off: step 0 runs through 16 of
    its epochs and passes the empty windows at step 1's place; ``set_weights`` fills them with the
    other source's row groups, which are read again (0.4 raised KeyError): the up-front stages' batches."""
    from tests.audit.test_locate import write_docs

    write_docs(tmp_path / "a", [[[0, 1, 1], [0, 1, 1], [1, 0, 0]]])
    write_docs(tmp_path / "b", [[[0, 1], [0, 0], [0, 0]]], first_id=9)
    sources = {"a": str(tmp_path / "a"), "b": str(tmp_path / "b")}
    cfg = {"seed": 57, "lanes": 4, "window": 1, "seq_len": 4}
    first, later = {"a": 0, "b": 1}, {"a": 1, "b": 0}
    with plitzer.Loader(sources, weights=[(0, first), (at, later)], **cfg) as up:
        want = [tokens_of(up.next_batch()).copy() for _ in range(8)]
    with plitzer.Loader(sources, weights=first, **cfg) as ld:
        got = []
        for t in range(8):
            if t == at:
                ld.set_weights(later)
            got.append(tokens_of(ld.next_batch()).copy())
    for t, (w, g) in enumerate(zip(want, got, strict=True)):
        np.testing.assert_array_equal(g, w, err_msg=f"step {t}")
