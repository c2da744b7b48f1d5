"""A misspelt keyword: a TypeError naming the entry point and the closest parameter, on every entry point.

Python's own message would name an internal function (``LoaderSettings.of()``) and
suggest nothing; each call below fails before any I/O (the source does not exist).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import planner
import plitzer

NOWHERE = "/nonexistent/plitzer-keywords"


def _torch() -> Any:
    return pytest.importorskip("plitzer.torch").Dataset


def _grain() -> Any:
    pytest.importorskip("grain")
    import plitzer.grain

    return plitzer.grain.Dataset


CASES: list[tuple[str, Callable[..., Any], str, str]] = [
    # (what the message names, the call, the misspelt keyword, the suggestion)
    ("Loader()", lambda **kw: plitzer.Loader(NOWHERE, **kw), "seqlen", "seq_len"),
    ("Loader()", lambda **kw: plitzer.Loader(NOWHERE, **kw), "lane", "lanes"),
    ("Loader()", lambda **kw: plitzer.Loader(NOWHERE, **kw), "storage_option", "storage_options"),
    ("Loader.in_group()", lambda **kw: plitzer.Loader.in_group(None, NOWHERE, **kw), "windw", "window"),
    ("plitzer.torch.Dataset()", lambda **kw: _torch()(NOWHERE, **kw), "seqlen", "seq_len"),
    ("plitzer.torch.Dataset()", lambda **kw: _torch()(NOWHERE, **kw), "pin_mem", "pin_memory"),
    ("plitzer.grain.Dataset()", lambda **kw: _grain()(NOWHERE, **kw), "seqlen", "seq_len"),
    ("plitzer.grain.Dataset()", lambda **kw: _grain()(NOWHERE, **kw), "num_epoch", "num_epochs"),
    ("plan()", lambda **kw: planner.plan(NOWHERE, **kw), "worlds", "world"),
    ("plan()", lambda **kw: plitzer.plan(NOWHERE, **kw), "seqlen", "seq_len"),
    ("planner.index()", lambda **kw: planner.index(NOWHERE, **kw), "colum", "column"),
    ("plitzer.explain()", lambda **kw: plitzer.explain(NOWHERE, 0, **kw), "seqlen", "seq_len"),
    ("plitzer.locate()", lambda **kw: plitzer.locate(NOWHERE, "true", **kw), "epoch", "epochs"),
    ("plitzer.audit()", lambda **kw: __import__("plitzer.audit").audit.audit(NOWHERE, **kw), "step", "steps"),
]


@pytest.mark.parametrize(("caller", "call", "wrong", "right"), CASES, ids=[f"{c[0]}-{c[2]}" for c in CASES])
def test_a_misspelt_keyword_names_the_entry_point_and_the_closest_parameter(
    caller: str, call: Callable[..., Any], wrong: str, right: str
) -> None:
    with pytest.raises(TypeError) as got:
        call(**{wrong: 1})
    msg = str(got.value)
    assert msg == f"{caller} got an unexpected keyword argument {wrong!r}; did you mean {right}?", msg
    assert "LoaderSettings" not in msg


def test_a_keyword_like_nothing_lists_what_the_entry_point_takes() -> None:
    with pytest.raises(TypeError, match=r"^Loader\(\) got an unexpected keyword argument 'zzz'; it takes seed, lanes"):
        plitzer.Loader(NOWHERE, zzz=1)  # type: ignore[call-arg]


def test_right_keywords_still_reach_the_checks() -> None:
    with pytest.raises(plitzer.ConfigError, match="does not exist"):
        plitzer.Loader(NOWHERE, seq_len=64)
    with pytest.raises(plitzer.ConfigError, match="does not exist"):
        planner.plan(NOWHERE, lanes=8)
