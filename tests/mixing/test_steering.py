"""Steering a mixture (SPEC section 20 item 2): plitzer.mixing.Online, its EXP3 rule, its state in checkpoints.

The data says its own source (source ``j``'s tokens lie in ``[1000 j, 1000 j + 1000)``,
tests/mixing/test_source_signals.py), and a step's "loss" of a source is a fixed function of its
tokens there (small integers, so that sums over ranks in any order are exact): the steered
run is a pure function of the data, and every claim is checked against runs made another way:
the same run uninterrupted, resumed (the controller built before or after the resume), at
world 2 with balanced steps over a thread group (the losses all-reduced there), and a Loader
built with ``weights=loader.stages`` from the start.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import plitzer
import plitzer.audit
import plitzer.mixing as mixing
from plitzer.errors import CheckpointError, ConfigError, UsageError
from plitzer.state import checkpoint as ckpt
from tests.mixing.test_source_signals import NAMES, SPAN, expected_ids, write_sources
from tests.share_fixtures import ThreadGroup, run_ranks

CFG: dict[str, Any] = {"seed": 3, "lanes": 4, "window": 2, "seq_len": 32, "threads": 2}
SLOW = settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
EQUAL = dict.fromkeys(NAMES, 1)


def sums_of(batch: Any, n: int) -> np.ndarray:
    """This rank's per-source loss sums and token counts, (2, n): a token's loss is ``token % 7 + 3 * source``."""
    ids = np.asarray(batch.source_ids).astype(np.int64).ravel()
    tokens = np.asarray(batch.tokens).astype(np.int64).ravel()
    real = ids >= 0
    loss = (tokens % 7 + 3 * (tokens // SPAN)).astype(np.float64)
    return np.stack([np.bincount(ids[real], weights=loss[real], minlength=n), np.bincount(ids[real], minlength=n)])


def means(total: np.ndarray) -> list[float]:
    """Each source's mean loss (NaN where it had no token)."""
    return [s / c if c else math.nan for s, c in zip(total[0].tolist(), total[1].tolist(), strict=True)]


def steered(
    sources: dict[str, str],
    steps: int,
    every: int,
    *,
    resume: bytes | None = None,
    before: bool = True,
    save_at: int | None = None,
    **kw: Any,
) -> tuple[list[np.ndarray], list[Any], bytes | None, bytes]:
    """A steered world-1 run to ``steps``: its batches' tokens, its stages, the checkpoint at ``save_at``, the last."""
    out, saved = [], None
    with plitzer.Loader(sources, weights=EQUAL, **{**CFG, **kw}) as ld:
        mixer = mixing.Online(ld, every=every) if before else None
        if resume is not None:
            ld.resume(resume)
        if mixer is None:
            mixer = mixing.Online(ld, every=every)
        while ld.step < steps:
            b = ld.next_batch()
            np.testing.assert_array_equal(b.source_ids, expected_ids(b, ld.sources))
            mixer.observe(b.step, means(sums_of(b, len(ld.sources))))
            out.append(np.asarray(b.tokens).copy())
            if ld.step == save_at:
                saved = ld.checkpoint()
        return out, ld.stages, saved, ld.checkpoint()


def plain(sources: dict[str, str], weights: Any, steps: int, **kw: Any) -> list[np.ndarray]:
    with plitzer.Loader(sources, weights=weights, **{**CFG, **kw}) as ld:
        return [np.asarray(ld.next_batch().tokens).copy() for _ in range(steps)]


def same(a: list[np.ndarray], b: list[np.ndarray]) -> None:
    assert len(a) == len(b)
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        assert np.array_equal(x, y), f"step {i}"


shapes_st = st.fixed_dictionaries(
    {n: st.lists(st.lists(st.integers(1, 40), min_size=2, max_size=6), min_size=2, max_size=4) for n in NAMES}
)


@SLOW
@given(
    shapes=shapes_st,
    packing=st.sampled_from(["concat", "best-fit"]),
    every=st.integers(1, 6),
    cut=st.integers(1, 23),
    before=st.booleans(),
)
def test_a_steered_run_is_its_stages_and_resumes_exactly(
    tmp_path_factory: pytest.TempPathFactory,
    shapes: dict[str, list[list[int]]],
    packing: str,
    every: int,
    cut: int,
    before: bool,
) -> None:
    """Uninterrupted, resumed (controller built before or after), and rebuilt from ``loader.stages``: one run."""
    sources = write_sources(tmp_path_factory.mktemp("src"), shapes)
    kw = {"packing": packing, "pad_id": 9999} if packing == "best-fit" else {}
    steps = 24
    run, stages, saved, last = steered(sources, steps, every, save_at=cut, **kw)
    assert len(stages) > 1 and stages[0] == (0, EQUAL)  # every change a live stage
    same(plain(sources, stages, steps, **kw), run)  # weights=loader.stages gives the steered run
    assert saved is not None
    doc = ckpt.decode(saved).steering
    assert doc is not None and doc["next"] == cut and doc["every"] == every
    again, stages2, _, last2 = steered(sources, steps, every, resume=saved, before=before, **kw)
    same(again, run[cut:])
    assert stages2 == stages and last2 == last  # the same stages, and the same controller state, bit for bit


@pytest.fixture(scope="module")
def three(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Three sources of different sizes (the losses differ: 3 per source number, so the weights move)."""
    rng = np.random.default_rng(0)
    shapes = {n: [rng.integers(1, 60, 8).tolist() for _ in range(6 + 3 * j)] for j, n in enumerate(NAMES)}
    return write_sources(tmp_path_factory.mktemp("three"), shapes)


def test_world_two_balanced_steers_as_world_one(three: dict[str, str]) -> None:
    """Two ranks dealing balanced steps, losses all-reduced over the group: world 1's stages and checkpoint bytes."""
    steps, every, world = 20, 4, 2
    _, stages, _, last = steered(three, steps, every)
    group, losses = ThreadGroup(world), ThreadGroup(world)  # the loader's group, and the training loop's

    def rank(r: int) -> tuple[list[Any], bytes]:
        member = group.member(r)
        opts = {**CFG, "rank": r, "world": world, "balance": True}
        with plitzer.Loader.in_group(member, three, weights=EQUAL, **opts) as ld:
            mixer = mixing.Online(ld, every=every)
            for _ in range(steps):
                b = ld.next_batch()
                total = sum(losses.gather(r, sums_of(b, 3)))  # the all-reduce: every rank's sums, added
                mixer.observe(b.step, means(total))
            return ld.stages, ld.checkpoint()

    got = run_ranks(world, rank)
    assert [s for s, _ in got] == [stages, stages]
    assert plitzer.merge([p for _, p in got]) == last
    again, stages2, _, _ = steered(three, steps + 6, every, resume=last)  # world 2's state resumed at world 1
    assert stages2[: len(stages)] == stages
    same(again, steered(three, steps + 6, every)[0][steps:])


def test_a_loader_without_a_controller_writes_the_bytes_it_wrote(three: dict[str, str]) -> None:
    """No controller, no ``steering`` key: the document is config, step and lanes, as before steering."""
    with plitzer.Loader(three, weights=EQUAL, **CFG) as ld:
        ld.next_batch()
        ld.set_weights({"web": 2, "code": 1, "math": 1})
        data = ld.checkpoint()
        st_ = ckpt.decode(data)
        doc = {
            "config": {k: v for k, v in st_.config.items() if k not in ckpt.OPTIONAL or v != ckpt.OPTIONAL[k]},
            "lanes": st_.positions.tolist(),
            "step": 1,
        }
    head = 8 + 4 + 8
    assert data[head:-32] == json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    assert st_.steering is None and b"steering" not in data


def test_the_stages_are_in_explain_the_plan_and_the_audit(three: dict[str, str]) -> None:
    steps, every = 16, 4
    with plitzer.Loader(three, weights=EQUAL, **CFG) as ld:
        mixer = mixing.Online(ld, every=every)
        batches = []
        for _ in range(steps):
            b = ld.next_batch()
            mixer.observe(b.step, means(sums_of(b, 3)))
            batches.append(b.documents())
        stages, plan = ld.stages, ld.plan
        table = plan.stages_table()
    assert len(stages) >= 4
    assert table["stage"].n_unique() == len(stages)
    assert sorted(set(table["start_step"].to_list())) == [s for s, _ in stages]
    shares = plitzer.audit.mixture_shares(plan, CFG["seq_len"], 2)
    assert shares["stage"].n_unique() > 2  # windows under several live stages (a stage may start no window)
    for stage, name, share in shares.select("stage", "source", "target_share").unique().iter_rows():
        w = stages[stage][1]  # the audit's target shares are the steered weights
        assert share == pytest.approx(w[name] / sum(w.values()))
    last = steps - 1
    pieces = plitzer.explain(three, last, weights=stages, **{k: CFG[k] for k in ("seed", "lanes", "window", "seq_len")})
    want = batches[last].select("lane", "start", "length", "source").sort("lane", "start")
    assert pieces.select("lane", "start", "length", "source").sort("lane", "start").equals(want)


# -- the rule ---------------------------------------------------------------------------


def test_exp3_by_hand() -> None:
    """Two sources, alpha 0.5, equal weights, mean losses 2 and 1 at step 4; then a step with no loss for one."""
    rule = mixing.Exp3(alpha=0.5)
    state = rule.init(["a", "b"], [500_000, 500_000], 0)
    state, weights = rule.update(state, 4, [2.0, 1.0])
    # R = 0.5 * 0 + 0.5 * L / 0.5 = [2, 1]; eps_0 = 1/2, eps_4 = sqrt(ln 2 / 8) = 0.294353;
    # softmax(0.5 * R) = [0.622459, 0.377541]; pi = 0.411294 * softmax + 0.294353 = [0.550367, 0.449633].
    assert state["rewards"] == [2.0, 1.0] and state["t"] == 4
    assert mixing.epsilon(2, 4) == pytest.approx(0.294353, abs=1e-6)
    assert weights == [550_367, 449_633] and sum(weights) == mixing.PPM
    # Next round at step 8: b had no tokens (NaN) and keeps its estimate; a's is smoothed with 3 / 0.550367.
    state, weights = rule.update(state, 8, [3.0, math.nan])
    assert state["rewards"][1] == 1.0
    assert state["rewards"][0] == pytest.approx(0.5 * 2.0 + 0.5 * 3.0 / 0.550367)
    e4, e8 = 0.294353, math.sqrt(math.log(2) / 16)
    top = math.exp(e4 * state["rewards"][0]) / (math.exp(e4 * state["rewards"][0]) + math.exp(e4))
    assert weights[0] == pytest.approx(1e6 * ((1 - 2 * e8) * top + e8), abs=1.0)


def test_exp3_explores_uniformly_while_eps_is_one_over_k() -> None:
    """eps_t = 1/K while t <= K ln K: the mixture is uniform whatever the losses (K = 3: t <= 3.29)."""
    rule = mixing.Exp3()
    state = rule.init(["a", "b", "c"], [100_000, 300_000, 600_000], 0)
    state, weights = rule.update(state, 3, [9.0, 1.0, 0.5])
    assert weights == [333_334, 333_333, 333_333]
    _, weights = rule.update(state, 4, [9.0, 1.0, 0.5])
    assert weights[0] > weights[1] > weights[2] >= 1e6 * mixing.epsilon(3, 4) - 1


def test_to_ppm() -> None:
    assert mixing.to_ppm([1.0, 1.0, 1.0]) == [333_334, 333_333, 333_333]
    assert mixing.to_ppm([0.5, 1e-12, 0.5]) == [499_999, 1, 500_000]
    assert mixing.to_ppm([0.0, 2.0]) == [0, 1_000_000]
    with pytest.raises(ValueError, match="finite"):
        mixing.to_ppm([math.nan, 1.0])


# -- a rule of one's own, and refusals -------------------------------------------------------


class Greedy:
    """A rule of one's own: the weights of the last losses, a float state (a running maximum)."""

    name = "greedy"

    def init(self, names: list[str], weights: list[int], seed: int) -> dict[str, Any]:
        return {"peak": 0.0, "seed": seed}

    def update(self, state: dict[str, Any], step: int, losses: list[float]) -> tuple[dict[str, Any], list[int]]:
        finite = [x if math.isfinite(x) else 0.0 for x in losses]
        peak = max(state["peak"], *finite) / 3.0 + 0.1 / 7.0  # not a short float: it must resume bit for bit
        return {"peak": peak, "seed": state["seed"]}, mixing.to_ppm([x + peak for x in finite])


def test_a_rule_of_ones_own_resumes_bit_for_bit(three: dict[str, str]) -> None:
    assert isinstance(Greedy(), mixing.Rule)

    def run(resume: bytes | None, steps: int) -> tuple[list[Any], bytes, dict[str, Any]]:
        with plitzer.Loader(three, weights=EQUAL, **CFG) as ld:
            if resume is not None:
                ld.resume(resume)
            mixer = mixing.Online(ld, every=3, rule=Greedy())
            while ld.step < steps:
                b = ld.next_batch()
                mixer.observe(b.step, dict(zip(ld.sources, means(sums_of(b, 3)), strict=True)))
            return ld.stages, ld.checkpoint(), mixer.state

    _, at7, _ = run(None, 7)
    whole, end, state = run(None, 15)
    resumed, end2, state2 = run(at7, 15)
    assert resumed == whole and end2 == end and state2 == state and state["seed"] == CFG["seed"]
    assert ckpt.decode(end).steering["state"]["peak"] == float(state["peak"]).hex()


def test_refusals(three: dict[str, str], tmp_path: Path) -> None:
    with plitzer.Loader(three, weights=EQUAL, **CFG) as ld:
        mixer = mixing.Online(ld, every=2)
        with pytest.raises(UsageError, match="one controller"):
            mixing.Online(ld, every=2)
        b = ld.next_batch()
        mixer.observe(b.step, [1.0, 2.0, 3.0])
        with pytest.raises(UsageError, match="in order"):
            mixer.observe(b.step, [1.0, 2.0, 3.0])
        with pytest.raises(ConfigError, match="3 sources"):
            mixer.observe(b.step + 1, [1.0, 2.0])
        with pytest.raises(ConfigError, match="no source named"):
            mixer.observe(b.step + 1, {"nope": 1.0})
        saved = ld.checkpoint()
    with plitzer.Loader(three, weights=EQUAL, **CFG) as ld:
        mixing.Online(ld, every=3)
        with pytest.raises(CheckpointError, match="every: checkpoint 2, controller 3"):
            ld.resume(saved)
    with plitzer.Loader(three, weights=EQUAL, **CFG) as ld:
        ld.resume(saved)
        with pytest.raises(CheckpointError, match="rule: checkpoint 'exp3"):
            mixing.Online(ld, every=2, rule=Greedy())
    with pytest.raises(ConfigError, match="exp3"):
        mixing.rule_of("doremi")
    lone = write_sources(tmp_path, {"web": [[5, 6]]})
    with plitzer.Loader(lone["web"], **CFG) as ld, pytest.raises(ConfigError, match="two or more"):
        mixing.Online(ld, every=2)
    with plitzer.Loader(three, weights=EQUAL, **CFG) as ld:
        bad = mixing.Online(ld, every=1, rule=type("Bad", (Greedy,), {"update": lambda self, s, t, x: (s, [1, 2])})())
        with pytest.raises(ConfigError, match="3 non-negative integers"):
            bad.observe(0, [1.0, 1.0, 1.0])
        assert ld.stages == [(0, EQUAL)]  # nothing changed


def test_a_damaged_steering_document_is_refused(three: dict[str, str]) -> None:
    with plitzer.Loader(three, weights=EQUAL, **CFG) as ld:
        mixer = mixing.Online(ld, every=2)
        b = ld.next_batch()
        mixer.observe(b.step, [1.0, 2.0, 3.0])
        st_ = ckpt.decode(ld.checkpoint())
    for change, why in (
        ({"next": 5}, "past the checkpoint's step"),
        ({"sums": ["x", "0x0p+0", "0x0p+0"]}, "hex float"),
        ({"counts": [1, -1, 0]}, "counts"),
        ({"state": {"t": True}}, "state holds True"),
        ({"every": 0}, "every"),
    ):
        data = ckpt.encode(ckpt.State(st_.config, st_.step, st_.positions, {**st_.steering, **change}))
        with pytest.raises(CheckpointError, match=why):
            ckpt.decode(data)
    other = ckpt.encode(ckpt.State(st_.config, st_.step, st_.positions, None))
    with pytest.raises(CheckpointError, match="steering: part 0"):
        plitzer.merge([ckpt.encode(st_), other])
