"""Resume anywhere at the cost of resuming near the start (a mixture's interleave is never replayed).

:class:`planner.mixing.mixture.Interleave` finds any window from its stage's entry by binary
search over the merge's keys; ``tests/interleave_reference.py`` keeps 0.3's interleave,
which replays the stream from step 0, and these tests hold the two equal window for window
(so the batch order cannot have changed), at step 10^7 too, and the plan's memory bounded.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import plitzer
import plitzer.synth
from planner.mixing.mixture import Interleave, MixturePlan
from planner.mixing.sources import Stage
from planner.order.epoch import PlanSettings
from planner.order.layout import Layout
from tests.conftest import tokens_of
from tests.interleave_reference import ReplayInterleave


class _Sizes:
    """What the interleave takes from a mixture index: the row-group bases and names."""

    def __init__(self, sizes: np.ndarray) -> None:
        self.rg_base = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.names = [f"s{i}" for i in range(len(sizes))]


def _pair(seed: int) -> tuple[Interleave, ReplayInterleave, list[Stage], int]:
    rng = np.random.default_rng(seed)
    ns = int(rng.integers(2, 5))
    sizes = rng.integers(1, 12, ns)
    tok = rng.integers(0 if seed % 3 == 0 else 1, 200, int(sizes.sum())).astype(np.int64)
    tok[np.concatenate([[0], np.cumsum(sizes)[:-1]])] += 1  # every source holds tokens
    counts = (tok, np.ones_like(tok), np.zeros_like(tok))
    settings = PlanSettings(
        seed=int(rng.integers(0, 100)), lanes=int(rng.integers(1, 5)), window=int(rng.integers(1, 5))
    )
    seq_len = int(rng.integers(4, 40))
    starts = [0, *sorted(rng.choice(np.arange(1, 60), int(rng.integers(0, 3)), replace=False).tolist())]
    stages = []
    for s in starts:
        w = [int(x) for x in rng.integers(0, 5, ns)]
        w[0] = w[0] or int(sum(w) == 0)
        stages.append(Stage(int(s), tuple(w)))
    idx = _Sizes(sizes)
    new = Interleave(idx, counts, settings, stages, seq_len)  # type: ignore[arg-type]
    old = ReplayInterleave(idx, counts, settings, stages, seq_len)  # type: ignore[arg-type]
    return new, old, stages, ns


@pytest.mark.parametrize("seed", range(40))
def test_interleave_equals_the_replay(seed: int) -> None:
    """Every epoch's order, source epochs, window starts and unit numbering, before and after a restage."""
    new, old, stages, ns = _pair(seed)
    rng = np.random.default_rng(1000 + seed)
    for e in range(4):
        assert new.windows_in(e) == old.windows_in(e)
        assert new.run_before(e) == old.run_before(e)
        np.testing.assert_array_equal(new.layout(e).order, old.layout(e).order)
        np.testing.assert_array_equal(new.source_epochs(e), old.source_epochs(e))
    windows = sum(old.windows_in(e) for e in range(4))
    starts = old.window_starts(windows)
    np.testing.assert_array_equal(new.window_starts(windows), starts)
    for u in rng.integers(0, windows, 8).tolist():
        assert new.unit_epoch_window(u) == old.unit_epoch_window(u)
        assert new.window_start(u) == int(starts[u])
    for run in rng.integers(0, int(starts[-1]) + 1, 8).tolist():
        assert new.epoch_of_run(run) == old.epoch_of_run(run)
        assert new.first_window_at(run) == old.first_window_at(run)
    later = Stage(stages[-1].start + int(rng.integers(1, 30)), tuple(int(x) + 1 for x in rng.integers(0, 3, ns)))
    # The first unit a change can touch: exact here, at most the replay's (which caps it at what it generated).
    assert new.add_stage(later) >= old.add_stage(later)
    for e in range(4):
        np.testing.assert_array_equal(new.layout(e).order, old.layout(e).order)


@pytest.fixture(scope="module")
def three(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("far")
    for i, name in enumerate(("books", "code", "web")):
        plitzer.synth.write(root / name, tokens=20_000 * (i + 1), seed=i, docs_per_row_group=40, row_groups_per_file=4)
    return {n: str(root / n) for n in ("books", "code", "web")}


STAGES = [(0, {"books": 1, "code": 1, "web": 2}), (500, {"books": 0, "code": 3, "web": 1})]
CFG = {"seed": 1, "lanes": 8, "window": 2, "seq_len": 32}
FAR = 10**7


class _Replay(ReplayInterleave, Interleave):  # type: ignore[misc]
    """0.3's interleave where the loader takes an Interleave (live stages check the type)."""

    @property
    def layout_stages(self) -> Layout:  # one layout stage: what Interleave.run_at asks, as 0.3's steps were
        return Layout.one(self.settings.lanes, self.seq_len)

    def window_start(self, unit: int) -> int:
        return int(self.window_starts(unit + 1)[-1])


def _loader(three: dict[str, str], *, replay: bool = False, **kw: int) -> plitzer.Loader:
    ld = plitzer.Loader(three, weights=STAGES, **CFG, **kw)
    if replay:  # the same loader over 0.3's interleave
        plan = ld.plan
        assert isinstance(plan, MixturePlan) and isinstance(plan.order, Interleave)
        o = plan.order
        plan.order = _Replay(plan.mixture, (o._tokens, o._rows, o._empty), o.settings, o.stages, o.seq_len)  # type: ignore[assignment]
    ld.set_weights({"books": 2, "code": 1, "web": 1}, at_step=900)  # a live stage
    return ld


@pytest.mark.slow
def test_seek_and_resume_at_step_1e7_equal_the_replay(three: dict[str, str]) -> None:
    """seek(10^7), a checkpoint there and its resume in another world: the replayed interleave's batches."""
    with _loader(three, replay=True) as ref:
        ref.seek(FAR)
        want = [tokens_of(ref.next_batch()).copy() for _ in range(3)]
    with _loader(three) as ld:
        ld.seek(FAR)
        got = [tokens_of(ld.next_batch()).copy() for _ in range(3)]
        state = ld.checkpoint()
        ld.seek(FAR + 3)
        after = tokens_of(ld.next_batch()).copy()
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)
    parts = []
    for rank in range(2):
        with plitzer.Loader(three, weights=STAGES, **CFG, world=2, rank=rank) as r:
            r.resume(state)
            parts.append(tokens_of(r.next_batch()).copy())
    np.testing.assert_array_equal(np.concatenate(parts), after)


def test_the_plan_keeps_no_more_items_far_into_the_run(three: dict[str, str]) -> None:
    """What the interleave holds after a seek is a few epochs' items, at step 10^3 as at 10^7."""
    kept = {}
    for step in (10**3, FAR):
        with _loader(three) as ld:
            ld.seek(step)
            for _ in range(3):
                ld.next_batch()
            order = ld.plan.order
            assert isinstance(order, Interleave)
            kept[step] = order.items_kept
            # Two cached epochs (a source weighted above its size repeats in one) and up to
            # nine permutations a source: a bound of the sources' sizes, not of the step.
            bound = 20 * ld.plan.dataset.row_groups
            assert 0 < order.items_kept <= bound
    assert kept[FAR] <= 2 * kept[10**3]


def test_a_far_step_takes_its_window_from_the_stage_entry(three: dict[str, str], tmp_path: Path) -> None:
    """Seeking to 10^7 computes no window of the run before the epoch it lands in."""
    with _loader(three) as ld:
        ld.seek(FAR)
        ld.next_batch()
        order = ld.plan.order
        assert isinstance(order, Interleave)
        first = order.first_window_at(FAR * CFG["lanes"] * CFG["seq_len"])
        assert len(order._entries) == 3  # one per stage entered: nothing per window
        assert all(e <= order.unit_epoch_window(first)[0] + 1 for e in order._segments)
        assert min(order._segments) >= order.unit_epoch_window(first)[0] - 1


@pytest.mark.slow
def test_a_selected_source_seeks_far_as_the_replay(three: dict[str, str]) -> None:
    """A mixture with a where= source: its stream counts the selected tokens, the same at step 10^7."""
    sources = {**three, "code": {"path": three["code"], "where": "int_score >= 2"}}

    def run(replay: bool) -> list[np.ndarray]:
        with plitzer.Loader(sources, weights=STAGES, **CFG) as ld:
            if replay:
                plan = ld.plan
                assert isinstance(plan, MixturePlan) and isinstance(plan.order, Interleave)
                o = plan.order
                plan.order = _Replay(plan.mixture, (o._tokens, o._rows, o._empty), o.settings, o.stages, o.seq_len)  # type: ignore[assignment]
            ld.seek(FAR)
            return [tokens_of(ld.next_batch()).copy() for _ in range(2)]

    for a, b in zip(run(False), run(True), strict=True):
        np.testing.assert_array_equal(a, b)
