"""Source -> index -> plan in one place (planner.api): every entry point gets the same index,
plan and errors; a plan's epoch order is composed, not subclassed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest

import planner
import plitzer
from planner.api import NO_SELECTOR, Opening, make_plan, open_index
from planner.mixing.mixture import Interleave, MixtureIndex, MixturePlan
from planner.order.epoch import PlanSettings
from planner.order.epoch_order import Permutation
from plitzer.readpath.read import read_chunk
from plitzer.sources import index_of, opening
from plitzer.state.settings import LoaderSettings
from plitzer.state.settings import make_plan as loader_plan
from tests.conftest import numbered_dataset

CFG: dict[str, Any] = {"seed": 3, "lanes": 4, "window": 2, "world": 2}


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("api")
    rng = np.random.default_rng(0)
    out = {}
    for name in ("a", "b"):
        lengths = [[rng.integers(0, 30, 8).tolist() for _ in range(5)] for _ in range(2)]
        numbered_dataset(root / name, lengths)
        out[name] = str(root / name)
    return out


def _tables(p: planner.Plan, epochs: int = 3) -> list[pl.DataFrame]:
    return [p.row_groups(e) for e in range(epochs)] + [p.reads(e) for e in range(epochs)]


@pytest.mark.parametrize("kind", ["path", "index", "mixture"])
def test_planner_and_the_loader_settings_make_the_same_plan(two: dict[str, str], kind: str) -> None:
    source: object = {"path": two["a"], "index": planner.index(two["a"]), "mixture": two}[kind]
    weights = {"a": 1, "b": 2} if kind == "mixture" else None
    direct = planner.plan(source, **CFG, weights=weights, seq_len=16)  # type: ignore[arg-type]
    s = LoaderSettings.of(**CFG, weights=weights, seq_len=16)
    via_loader = loader_plan(index_of(source, s), s)  # type: ignore[arg-type]
    assert type(direct) is type(via_loader)
    for x, y in zip(_tables(direct), _tables(via_loader), strict=True):
        assert x.equals(y)


def test_every_entry_point_raises_the_same_messages(two: dict[str, str]) -> None:
    with pytest.raises(plitzer.ConfigError, match="weights= needs named sources") as a:
        planner.plan(two["a"], weights={"a": 1})
    with pytest.raises(plitzer.ConfigError, match="weights= needs named sources") as b:
        plitzer.Loader(two["a"], weights={"a": 1}, seq_len=16, **CFG)
    assert str(a.value) == str(b.value)
    with pytest.raises(plitzer.ConfigError, match="tokenizer= with a mixture"):
        open_index(two, opening=Opening(text=planner.index))
    with pytest.raises(plitzer.ConfigError, match="tokenizer= needs the text source, not an Index"):
        open_index(planner.index(two["a"]), opening=Opening(text=planner.index))
    with pytest.raises(TypeError, match="is not a path"):
        open_index(42)  # type: ignore[arg-type]


def test_open_index_runs_the_passes_its_opening_gives_and_refuses_those_it_lacks(two: dict[str, str]) -> None:
    # What the runtime gives planner to open a source is one value: each pass in it is run, a pass
    # not in it is refused with the message that says what to give.
    seen: list[str] = []

    def select(ix: Any, spec: Any) -> Any:
        seen.append(spec.selection.where)
        return plitzer.selector(ix, spec)

    where = planner.parameters.Selection(where="n % 2 = 0")
    with pytest.raises(plitzer.ConfigError) as e:
        open_index(two["a"], selection=where, opening=Opening())
    assert str(e.value) == NO_SELECTOR
    with pytest.raises(plitzer.ConfigError) as e:
        open_index({"a": two["a"]}, selection=where)
    assert str(e.value) == f"source 'a': {NO_SELECTOR}"
    picked = open_index(two["a"], selection=where, opening=Opening(select=select))
    assert seen == [where.where]
    assert 0 < picked.tokens < planner.index(two["a"]).tokens
    mixed = open_index(two, selection=where, opening=Opening(select=select))
    assert seen == [where.where] * 3 and isinstance(mixed, MixtureIndex)
    assert mixed.parts[0].tokens == picked.tokens
    texts: list[Any] = []
    opened = open_index(two["b"], opening=Opening(text=lambda paths: texts.append(paths) or planner.index(paths)))
    assert texts == [two["b"]] and opened.tokens == planner.index(two["b"]).tokens


def test_plitzer_builds_its_opening_in_one_place() -> None:
    # plitzer.sources.opening is what every plitzer caller of open_index gives: the whole selection
    # pass without settings, a rank's share of it with them; the count and a mixture's text sources.
    alone = opening()
    assert alone.select is plitzer.selection.select.select_spec
    assert alone.count is plitzer.readpath.read.count_chunk
    assert alone.text_source is plitzer.sources.text.mixture_source and alone.text is None
    ranked = opening(LoaderSettings.of(**CFG))
    assert ranked.select is not None and ranked.select is not alone.select
    assert ranked.count is alone.count and ranked.text_source is alone.text_source


def test_a_plan_composes_its_epoch_order(two: dict[str, str]) -> None:
    settings = PlanSettings(**CFG)
    one = make_plan(planner.index(two["a"]), settings)
    assert isinstance(one.order, Permutation) and type(one) is planner.Plan
    mixed = make_plan(open_index(two), settings, weights={"a": 1, "b": 1})
    assert isinstance(mixed, MixturePlan) and isinstance(mixed.order, Interleave)
    # A mixture of one source is that source's own plan: the same order, the same tables.
    alone = make_plan(open_index({"a": two["a"]}), settings)
    assert isinstance(alone, MixturePlan) and isinstance(alone.order, Permutation)
    for x, y in zip(_tables(one), _tables(alone), strict=True):
        assert x.equals(y.select(x.columns))


def test_window_starts_are_the_run_tokens_before_each_unit(two: dict[str, str]) -> None:
    for p in (planner.plan(two["a"], **CFG), planner.plan(two, **CFG, weights={"a": 1, "b": 3})):
        want = []
        for e in range(4):
            wt = p.epoch(e).window_tokens
            want.extend((p.run_before(e) + np.cumsum(wt) - wt).tolist())
        n = sum(p.windows_in(e) for e in range(4))
        assert p.window_starts(n).tolist() == want
        assert [p.unit(*p.unit_epoch_window(u)) for u in range(n)] == list(range(n))


def test_read_chunk_asks_the_source_holding_the_row_group(two: dict[str, str]) -> None:
    mix = open_index(two)
    assert isinstance(mix, MixtureIndex)
    b = planner.index(two["b"])
    got = read_chunk(mix, mix.row_groups - 1)  # the last row group of source b
    assert got.equals(read_chunk(b, b.row_groups - 1))
    with pytest.raises(TypeError, match="read_chunk: no reader for a"):
        read_chunk(Path(two["a"]), 0)  # type: ignore[arg-type]
