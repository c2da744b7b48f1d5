"""One definition of the run's parameters: every entry point documents and accepts each of them.

A parameter added to :data:`planner.parameters.PARAMETERS` and missing from an entry
point's docs, signature, keywords or CLI options fails here. Also: the selection pass
is passed explicitly (a fresh interpreter without plitzer gets a ConfigError saying
what to pass), and each kind of index describes its own checkpoint fields.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, get_type_hints

import numpy as np
import pytest

import planner
import plitzer
import plitzer.synth
from planner.api import NO_SELECTOR, check_layout, check_source, source_kind
from planner.errors import ConfigError
from planner.order.layout import Layout
from planner.parameters import (
    MARKER,
    PARAMETERS,
    PLAN_PARAMETERS,
    POSITIONAL,
    Parameter,
    Selection,
    by_name,
    document,
)
from plitzer.cli import build_parser
from plitzer.state.settings import Keywords, KeywordsLessWhere, KeywordsOfLocate, LoaderSettings, checkpoint_config
from plitzer.tools.explain import explain
from plitzer.tools.locate import locate
from tests.parameter_places import places

NAMES = [p.name for p in PARAMETERS]
ROOT = Path(__file__).resolve().parents[2]


def documented(doc: str | None) -> dict[str, str]:
    """The NumPy-style parameter entries of a docstring: name -> its header line."""
    out: dict[str, str] = {}
    for line in (doc or "").splitlines():
        m = re.match(r"^\s*(\*{0,2}[\w]+(?:, \w+)*) : (.+)$", line)
        if m:
            for name in m.group(1).split(", "):
                out[name.lstrip("*")] = m.group(2)
    return out


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> str:
    d = tmp_path_factory.mktemp("params")
    plitzer.synth.write(d, tokens=30_000, seed=3, docs_per_row_group=40)
    return str(d)


# -- one list of names ------------------------------------------------------------------


def test_keywords_list_exactly_the_parameters() -> None:
    assert list(get_type_hints(Keywords)) == [*[n for n in NAMES if n not in ("where", "epochs")], "epochs", "where"]
    assert set(get_type_hints(KeywordsLessWhere)) == set(NAMES) - {"where"}
    assert set(get_type_hints(KeywordsOfLocate)) == set(NAMES) - {"where", "epochs"}
    assert len(set(NAMES)) == len(NAMES)
    assert set(POSITIONAL) <= set(NAMES) and set(PLAN_PARAMETERS) <= set(NAMES)


LISTED_BY_HAND = {
    # Public signatures, which keep their explicit keywords (IDEs, help(), SPEC sections 5, 6, 9).
    "planner/api.py::def plan",
    "plitzer/text/source.py::def text_index",
    "plitzer/text/tokenize.py::def tokenize",
    # The keywords for type checkers (``**settings: Unpack[Keywords]``), checked against the table above.
    "plitzer/state/settings.py::class KeywordsOfLocate",
    # The loader's own settings beside the groups (PlanSettings, Layout, TextSettings, Selection).
    "plitzer/state/settings.py::class LoaderSettings",
    # The checkpoint's fields in the order their bytes are written.
    "plitzer/state/checkpoint.py::dict",
    # The trainers' settings dataclass, written out from PARAMETERS (tests/integrations/test_integrations.py checks it).
    "plitzer/integrations/settings.py::class BaseSettings",
    # plitzer tokenize's own settings: its row_group_tokens is the Parquet it writes (0 keeps the input's row
    # groups), not the run setting that cuts a Megatron or numpy source; the text settings are its own keywords.
    "plitzer/cli/commands.py:cmd_tokenize:call tokenize",
    "plitzer/text/tokenize.py::class _Job",
    "plitzer/text/tokenize.py:_record:dict",
}
"""The places that list five or more parameter names (tests/parameter_places.py): a new one fails here."""


def test_few_places_list_the_parameters_by_hand() -> None:
    got = places()
    new = [str(p) for p in got if p.key not in LISTED_BY_HAND]
    assert not new, f"these list the parameters again; take a group of planner.parameters instead: {new}"
    gone = LISTED_BY_HAND - {p.key for p in got}
    assert not gone, f"no longer listing the parameters: take them off LISTED_BY_HAND: {sorted(gone)}"


def test_every_parameter_has_docs_and_a_default_loader_settings_accepts() -> None:
    for p in PARAMETERS:
        assert len(p.doc.split()) >= 5, p.name
        assert p.render().startswith(f"{p.name} : ")
    s = LoaderSettings.of(**{p.name: p.default for p in PARAMETERS})  # type: ignore[misc]
    assert s == LoaderSettings.of()
    with pytest.raises(TypeError, match="unexpected keyword argument 'lane'"):
        LoaderSettings.of(lane=8)  # type: ignore[call-arg]


# -- every entry point documents every parameter it takes ---------------------------------


def _entry_points() -> list[tuple[str, Any, set[str]]]:
    out: list[tuple[str, Any, set[str]]] = [
        ("plitzer.Loader", plitzer.Loader, set(NAMES)),
        ("plitzer.explain", explain, set(NAMES)),
        ("plitzer.locate", locate, set(NAMES) - {"where", "epochs"}),  # locate's where and epochs: its own entries
        ("planner.plan", planner.plan, set(PLAN_PARAMETERS)),
    ]
    for adapter in ("plitzer.torch", "plitzer.grain"):
        try:
            module = importlib.import_module(adapter)
        except ImportError:  # pragma: no cover - torch and grain are test dependencies
            continue
        out.append((f"{adapter}.Dataset", module.Dataset, set(NAMES)))
    return out


@pytest.mark.parametrize(("name", "obj", "names"), _entry_points(), ids=[e[0] for e in _entry_points()])
def test_every_entry_point_documents_every_parameter(name: str, obj: Any, names: set[str]) -> None:
    doc = obj.__doc__ or ""
    entries = documented(doc)
    missing = sorted(names - set(entries))
    assert not missing, f"{name}'s docstring lacks {missing}"
    assert MARKER not in doc
    for n in names - {"rank", "world"}:  # torch and grain document rank and world their own way
        want = by_name(n).render().splitlines()[1].strip()
        assert want in " ".join(doc.split()) or want.split()[0] in doc, (name, n)


def test_a_parameter_added_once_reaches_an_entry_points_docs() -> None:
    def f(**settings: Any) -> None:
        """Do it.

        Parameters
        ----------
        <settings>
        """

    document(["seed", "where"])(f)
    assert set(documented(f.__doc__)) == {"seed", "where"}
    assert "DuckDB SQL boolean expression" in (f.__doc__ or "")
    with pytest.raises(RuntimeError, match="needs one"):
        document()(lambda: None)


def test_signatures_take_every_parameter_with_its_default() -> None:
    sig = inspect.signature(plitzer.Loader)
    assert list(sig.parameters)[1:] == NAMES
    for n in NAMES:
        assert sig.parameters[n].default == by_name(n).default
        positional = sig.parameters[n].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
        assert positional == (n in POSITIONAL)
    plan_sig = inspect.signature(planner.plan)
    assert set(PLAN_PARAMETERS) <= set(plan_sig.parameters)
    assert plitzer.plan is planner.plan  # SPEC section 6: the same function
    for fn in (explain, locate):
        kw = [p for p in inspect.signature(fn).parameters.values() if p.kind is inspect.Parameter.VAR_KEYWORD]
        assert len(kw) == 1 and "Keywords" in str(kw[0].annotation)


def test_loader_takes_its_settings_by_position_and_keyword(data: str) -> None:
    with plitzer.Loader(data, 0, 8, 2, 64) as a, plitzer.Loader(data, seed=0, lanes=8, window=2, seq_len=64) as b:
        assert a.config == b.config
        assert np.array_equal(a.next_batch().tokens[:], b.next_batch().tokens[:])
    with pytest.raises(TypeError, match="multiple values for argument 'lanes'"):
        plitzer.Loader(data, 0, 8, lanes=8)
    with pytest.raises(TypeError, match="at most 10 positional"):
        plitzer.Loader(data, *range(10))
    with pytest.raises(TypeError, match="unexpected keyword argument 'lane'"):
        plitzer.Loader(data, lane=8)  # type: ignore[call-arg]


def _options(sub: str) -> dict[str, argparse.Action]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {o: a for a in action.choices[sub]._actions for o in a.option_strings}


@pytest.mark.parametrize("sub", ["plan", "explain", "locate", "audit"])
def test_cli_options_are_the_parameters(sub: str) -> None:
    opts = _options(sub)
    want = {"plan": PLAN_PARAMETERS, "audit": PLAN_PARAMETERS, "explain": (*PLAN_PARAMETERS, "rank", "budget")}
    names = want.get(sub, (*PLAN_PARAMETERS, "rank"))
    for n in names:
        p = by_name(n)
        if n in ("storage_options", "weights"):  # --endpoint/--region and --mixture FILE
            continue
        if sub == "locate" and n in ("where", "epochs"):  # locate's own: the documents, the epochs searched
            continue
        assert p.flag in opts, (sub, n)
        if sub == "plan" and n == "seq_len":  # no default under best-fit, as planner.plan has none: its own help
            assert opts[p.flag].default is None and "best-fit required" in opts[p.flag].help
            continue
        if p.help is not None and not (sub == "locate" and n == "length_column"):
            assert opts[p.flag].help == p.help, (sub, n)
        if not (sub == "locate" and n == "rank"):
            assert opts[p.flag].default == p.default, (sub, n)


# -- the selection pass, passed explicitly ---------------------------------------------


def _fresh(code: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-W", "error", "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )


def test_planner_alone_plans_with_the_installed_passes_whatever_was_imported(data: str) -> None:
    """A process that imports planner and never plitzer plans where= selections (one source and a mixture's)
    and pieces with lengths: the passes are the installed ones (pyproject.toml's ``planner.passes``,
    planner.runtime), so what a call does never depends on what was imported before it."""
    got = _fresh(
        f"""
        import sys
        import planner
        assert "plitzer" not in sys.modules
        for source in ({data!r}, {{"a": {{"path": {data!r}, "where": "score >= 3"}}}}):
            where = "score >= 3" if isinstance(source, str) else None
            p = planner.plan(source, where=where, lanes=4, window=2, seq_len=16)
            print(p.tokens)
        print(p.pieces(0).head(3).collect().height)
        """
    )
    assert got.returncode == 0, got.stderr
    want = plitzer.plan(data, where="score >= 3", lanes=4, window=2, seq_len=16).tokens
    assert got.stdout.split() == [str(want), str(want), "3"]


def test_planner_plan_takes_the_selector_explicitly(data: str) -> None:
    got = _fresh(
        f"""
        import planner
        p = planner.plan({data!r}, where="score >= 3", lanes=4, window=2, selector=None if False else __import__(
            "plitzer.selection.select", fromlist=["select_spec"]).select_spec)
        print(p.tokens, p.dataset.fingerprint)
        """
    )
    assert got.returncode == 0, got.stderr
    want = plitzer.plan(data, where="score >= 3", lanes=4, window=2)
    assert got.stdout.split() == [str(want.tokens), want.dataset.fingerprint]
    assert plitzer.selector is plitzer.selection.select.select_spec
    assert not hasattr(planner.api, "set_selector")
    calls: list[str | None] = []

    def spy(ix: Any, spec: Any) -> Any:
        calls.append(spec.selection.where)
        return plitzer.selector(ix, spec)

    assert planner.plan(data, where="score >= 3", lanes=4, window=2, selector=spy).tokens == want.tokens
    assert calls == ["score >= 3"]


def test_only_planner_plan_finds_the_runtime_passes_everything_else_is_given_them(data: str) -> None:
    """plitzer.plan is planner.plan (SPEC section 6), so its defaults are plitzer's passes as installed
    (planner.runtime); open_index, which plitzer's entry points call, uses what it is given, or refuses."""
    from planner.api import open_index
    from planner.runtime import COUNT, DEDUPE, LENGTHS, SELECT, runtime_pass

    assert plitzer.plan is planner.plan
    assert runtime_pass(None, SELECT) is plitzer.selection.select.select_spec
    assert runtime_pass(None, DEDUPE) is plitzer.selection.dedupe.dedupe_index
    assert runtime_pass(None, COUNT) is plitzer.readpath.read.count_chunk
    assert runtime_pass(None, LENGTHS) is plitzer.tools.locate.plan_lengths
    assert runtime_pass(None, "nosuch") is None
    with pytest.raises(ConfigError) as e:
        open_index(data, selection=Selection(where="score >= 3"))
    assert str(e.value) == NO_SELECTOR
    assert planner.plan(data, where="score >= 3", lanes=4, window=2).tokens > 0
    assert planner.plan(data, dedupe="tokens", lanes=4, window=2).tokens > 0
    assert plitzer.deduper is plitzer.selection.dedupe.dedupe_index


# -- checks in one place a layer -------------------------------------------------------


def test_the_planners_checks_of_a_source_are_in_api() -> None:
    assert source_kind({"a": "x"}) == "dict" and source_kind("x") == "paths"
    with pytest.raises(ConfigError, match="length_column='n' without where="):
        check_source("paths", length_column="n")
    with pytest.raises(ConfigError, match="weights= needs named sources"):
        check_source("paths", weights={"a": 1})
    with pytest.raises(ConfigError, match="tokenize first"):
        check_source("paths", text=True, where="x > 1")
    check_source("dict", length_column="n")  # a dict's sources carry their own where
    with pytest.raises(ConfigError, match=r"lanes=3 \(the layout stage from step 5\) is not divisible by world=2"):
        check_layout(Layout.of(lanes=[(0, 4), (5, 3)], seq_len=8).stages, 2)
    for make in (
        lambda: LoaderSettings.of(lanes=[(0, 4), (5, 3)], seq_len=8, world=2),
        lambda: planner.plan("unused", lanes=[(0, 4), (5, 3)], seq_len=8, world=2),
    ):
        with pytest.raises(ConfigError, match=r"lanes=3 \(the layout stage from step 5\)"):
            make()


# -- each kind of index describes itself -----------------------------------------------


def test_each_index_says_its_own_checkpoint_fields(data: str, tmp_path: Path) -> None:
    ix = plitzer.index(data)
    assert ix.config_fields() == {} and ix.selected_rows(0) is None and ix.length_source("n") == "n"
    sel = plitzer.selector(
        ix, planner.mixing.sources.SourceSpec(name="", path=data, selection=Selection(where="score >= 3"))
    )
    assert sel.config_fields() == {"where": "(score >= 3)", "length_column": ""}  # normalized
    assert sel.length_source("n") is None and sel.selected_rows(0) is not None
    other = tmp_path / "b"
    plitzer.synth.write(other, tokens=20_000, seed=4)
    sources = {"a": {"path": data, "where": "score >= 3"}, "b": str(other)}
    with plitzer.Loader(sources, lanes=4, window=2, seq_len=32) as ld:
        fields = ld.index.config_fields()
        assert fields["where"] == [["a", "(score >= 3)"]] and "length_column" not in fields
        assert [n for n, _ in fields["sources"]] == ["a", "b"]
        assert ld.config == checkpoint_config(ld.plan, ld.settings)
        assert ld.config["length_column"] == "" and ld.config["tokenizer"] == ""
        assert ld.config["stages"] == [[0, ld.config["stages"][0][1]]]


def test_parameter_flags_follow_their_names() -> None:
    assert Parameter("seq_len", 1, "int", "tokens per sequence of the run").flag == "--seq-len"
    assert by_name("budget").render().splitlines()[0] == "budget : int, default 8 << 30"
    assert by_name("column").render().splitlines()[0] == "column : str, optional"
