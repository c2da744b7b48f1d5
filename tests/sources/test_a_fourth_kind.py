"""A fourth kind is one file and one line (SPEC section 21 item 3, issue 70): nothing else names it.

tests/sources/jsonl_kind.py is a kind written as a user adds one. Installed as
``plitzer.sources.jsonl_tokens`` with its name added to ``plitzer.sources.KINDS`` (the one line),
it gives the Parquet copy's batches through the Loader at worlds 1 and 2 (ranks sharing the
index), a resume at another world, ``plitzer.plan``'s tables, the CLI and a mixture beside
Parquet, as every built-in kind does in tests/sources/test_source_kinds.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import plitzer
import plitzer.sources
from planner.mixing.sources import SourceSpec
from planner.parameters import FileFormat
from plitzer.cli import main
from tests.sources import jsonl_kind
from tests.sources.test_source_kinds import CFG, GROUPS, documents, write_parquet

NAME = "jsonl_tokens"


@pytest.fixture
def sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """The kind installed (one module, one line in KINDS); its source and the Parquet copy of the same row groups."""
    monkeypatch.setitem(sys.modules, f"plitzer.sources.{NAME}", jsonl_kind)
    kinds = plitzer.sources.KINDS
    monkeypatch.setattr(
        plitzer.sources, "KINDS", (*kinds[:-1], NAME, kinds[-1])
    )  # before Parquet, which claims the rest
    monkeypatch.setenv("PLITZER_CACHE", str(tmp_path / "cache"))
    docs = documents()
    src = tmp_path / "jsonl"
    src.mkdir()
    assert all(len(g) == jsonl_kind.ROWS for g in GROUPS)
    (src / "part.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    return src, write_parquet(docs, tmp_path, GROUPS)


def _steps(loader: plitzer.Loader, n: int) -> list[np.ndarray]:
    it = iter(loader)
    return [np.from_dlpack(next(it).tokens).copy() for _ in range(n)]


def _in_group(source: Any, world: int, steps: int) -> list[np.ndarray]:
    from tests.share_fixtures import ThreadGroup, run_ranks

    group = ThreadGroup(world)

    def rank(r: int) -> list[np.ndarray]:
        with plitzer.Loader.in_group(group.member(r), source, rank=r, world=world, **CFG) as ld:
            return _steps(ld, steps)

    per = run_ranks(world, rank)
    return [np.concatenate([p[s] for p in per]) for s in range(steps)]


def test_the_kind_is_claimed_and_reads_as_its_parquet_copy(sources: tuple[Path, Path]) -> None:
    src, ref = sources
    spec = SourceSpec(name="", path=str(src), column="tokens", storage_options=None, file_format=FileFormat())
    fmt = plitzer.sources.format_of(spec)
    assert fmt is not None and fmt.capabilities.kind == "jsonl"
    with plitzer.Loader(ref, **CFG) as whole:
        want = _steps(whole, 6)
    for world in (1, 2):
        got = _in_group(src, world, 6)
        assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True)), world
    with plitzer.Loader(src, **CFG) as ld:
        _steps(ld, 3)
        state = ld.checkpoint()
    halves = []
    for r in range(2):
        with plitzer.Loader(src, **CFG, world=2, rank=r) as other:
            other.resume(state)
            halves.append(_steps(other, 2))
    assert all(np.array_equal(np.concatenate([halves[0][s], halves[1][s]]), want[3 + s]) for s in range(2))


def test_plan_the_cli_and_a_mixture(sources: tuple[Path, Path]) -> None:
    src, ref = sources
    a, b = (plitzer.plan(s, seed=3, lanes=4, window=2, world=2) for s in (src, ref))
    keep = ["epoch", "window_index", "rank", "row_group"]
    assert a.reads(0).select(keep).equals(b.reads(0).select(keep))
    assert a.row_groups(0).drop("file").equals(b.row_groups(0).drop("file"))
    assert main(["plan", str(src), "--lanes", "4", "--window", "2"]) == 0
    assert main(["index", str(src)]) == 0
    mix = {"j": str(src), "p": str(ref)}
    tokens = plitzer.plan(mix, seed=3, lanes=4, window=2, seq_len=64).sources().sort("name")["tokens"].to_list()
    assert tokens[0] == tokens[1] > 0
    assert len(_in_group(mix, 2, 2)) == 2
