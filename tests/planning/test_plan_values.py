"""A stage change is a new plan value: the old plan stays as it was, the new one is the up-front plan.

``MixturePlan.with_stages`` / ``with_layout`` (over ``Interleave.with_stages`` / ``with_layout``)
return a new plan and the first unit the change can touch; the in-place ``add_stage`` and
``restage`` make a plan that value whole. These tests hold the new value equal to a plan made
with every stage from the start, the old one equal to itself before the change, and a plan cut
into other lanes (``LanesPlan``) following its base through an in-place change.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

import plitzer.synth
from planner.errors import ConfigError
from planner.mixing.interleave import UNCHANGED, Interleave
from planner.mixing.mixture import MixturePlan, mixture_index
from planner.mixing.sources import Stage
from planner.order.epoch import PlanSettings
from planner.order.layout import Layout
from planner.order.plan import LanesPlan

SETTINGS = PlanSettings(seed=3, lanes=4, window=2)
SEQ_LEN = 32
FIRST = Stage(0, (1, 2))
LATER = Stage(40, (3, 1))


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("values")
    for i, name in enumerate(("code", "web")):
        plitzer.synth.write(
            root / name, tokens=12_000 * (i + 1), seed=i, mean_length=50, docs_per_row_group=20, row_groups_per_file=4
        )
    return {n: str(root / n) for n in ("code", "web")}


def _plan(sources: dict[str, str], stages: list[Stage]) -> MixturePlan:
    return MixturePlan(mixture_index(sources), SETTINGS, stages, seq_len=SEQ_LEN)


def _tables(plan: MixturePlan, epochs: int = 3) -> list[pl.DataFrame]:
    return [plan.row_groups(e) for e in range(epochs)] + [plan.reads(e) for e in range(epochs)]


def _assert_same(a: list[pl.DataFrame], b: list[pl.DataFrame]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.equals(y)


def test_with_stages_is_the_up_front_plan_and_leaves_the_old_one(two: dict[str, str]) -> None:
    old = _plan(two, [FIRST])
    before = _tables(old)
    order = old.order
    new, unit = old.with_stages((FIRST, LATER))
    assert new is not old and new.order is not order
    assert old.order is order and old.stages == (FIRST,)
    assert new.stages == (FIRST, LATER)
    _assert_same(_tables(old), before)  # the old value answers as before, its caches its own
    _assert_same(_tables(new), _tables(_plan(two, [FIRST, LATER])))
    # The first unit the change can touch: the windows before it are the old plan's.
    starts_old, starts_new = old.window_starts(unit + 1), new.window_starts(unit + 1)
    np.testing.assert_array_equal(starts_old[: unit + 1], starts_new[: unit + 1])
    e, w = new.unit_epoch_window(unit)
    assert 0 < unit < 1 << 62
    np.testing.assert_array_equal(old.epoch(e).order[: w * SETTINGS.window], new.epoch(e).order[: w * SETTINGS.window])
    assert old.with_stages((FIRST,)) == (old, UNCHANGED)


def test_add_stage_in_place_takes_the_new_value_whole(two: dict[str, str]) -> None:
    plan = _plan(two, [FIRST])
    value, unit = plan.with_stages((FIRST, LATER))
    lanes = LanesPlan(plan, 2)  # a layout stage's plan over the same base, made before the change
    lanes_before = lanes.epoch(1).order.copy()
    assert plan.add_stage(LATER) == unit
    assert plan.stages == (FIRST, LATER) and isinstance(plan.order, Interleave)
    _assert_same(_tables(plan), _tables(value))
    # The lanes plan reads its base's order as it is now: the same windows as the new plan's.
    assert lanes.order is plan.order
    want = LanesPlan(value, 2).epoch(1)
    np.testing.assert_array_equal(lanes.epoch(1).order, want.order)
    np.testing.assert_array_equal(lanes.epoch(1).window_z, want.window_z)
    assert not np.array_equal(lanes_before, want.order)  # epoch 1 is all under the new stage
    with pytest.raises(ConfigError, match="after the last one"):
        plan.add_stage(Stage(LATER.start, (1, 1)))


def test_restage_back_equals_the_first_plan(two: dict[str, str]) -> None:
    plan = _plan(two, [FIRST])
    first = _tables(plan)
    plan.add_stage(LATER)
    assert plan.restage((FIRST,)) < 1 << 62
    _assert_same(_tables(plan), first)


def test_with_layout_moves_the_weight_stages_and_keeps_the_old_plan(two: dict[str, str]) -> None:
    old = _plan(two, [FIRST, LATER])
    before = _tables(old)
    layout = Layout.of(lanes=[(0, 4), (20, 2)], seq_len=SEQ_LEN)
    new, unit = old.with_layout(layout)
    assert new.layout is layout and old.layout is None
    _assert_same(_tables(old), before)
    up_front = MixturePlan(mixture_index(two), SETTINGS, [FIRST, LATER], seq_len=SEQ_LEN, layout=layout)
    _assert_same(_tables(new), _tables(up_front))
    assert unit < 1 << 62  # the stage at step 40 moves: steps 20.. are 2 lanes, not 4
    assert new.with_layout(layout) == (new, UNCHANGED)


def test_one_source_has_no_stages_to_change(two: dict[str, str]) -> None:
    plan = MixturePlan(mixture_index({"code": two["code"]}), SETTINGS, [Stage(0, (1,))], seq_len=SEQ_LEN)
    with pytest.raises(ConfigError, match="nothing to mix"):
        plan.with_stages((Stage(0, (1,)), Stage(10, (2,))))
    assert plan.restage((Stage(0, (1,)),)) == 0
    layout = Layout.of(lanes=[(0, 4), (20, 2)], seq_len=SEQ_LEN)
    new, unit = plan.with_layout(layout)
    assert unit == UNCHANGED and new is not plan and new.layout is layout and plan.layout is None
    _assert_same(_tables(new), _tables(plan))
