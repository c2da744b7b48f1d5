"""One index per job, in one process: a plain Loader in a group of ranks (threads here) shares the work.

``Loader.in_group(group, ...)`` with a :class:`plitzer.state.share.Collective`: one listing
for the group, each footer read once, a text source's counting pass split across the
ranks, the selection pass too; the ranks' rows are world 1's batch. The same with real
processes (gloo, each its own cache) is tests/state/test_job_share.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import plitzer
import plitzer.synth
from planner.catalog import footer
from planner.stores.storage import LocalStorage
from plitzer.errors import ConfigError
from plitzer.selection.evaluate import SelectionPass
from plitzer.state.settings import LoaderSettings
from plitzer.state.share import AUTO, job_group
from tests.conftest import tokens_of
from tests.share_fixtures import CharTokenizer, ThreadGroup, nonempty_texts, run_ranks, write_text

WORLD = 4
CFG = {"seed": 3, "lanes": 8, "window": 2, "seq_len": 32, "threads": 2}


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "cache"
    monkeypatch.setenv("PLITZER_CACHE", str(d))
    return d


def _counters(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    seen = {"listings": 0, "footers": 0}
    real_list, real_fetch = LocalStorage.list_files, footer.fetch

    def listing(self: LocalStorage) -> Any:
        seen["listings"] += 1
        return real_list(self)

    def fetch(*args: Any, **kw: Any) -> bytes:
        seen["footers"] += 1
        return real_fetch(*args, **kw)

    monkeypatch.setattr(LocalStorage, "list_files", listing)
    monkeypatch.setattr(footer, "fetch", fetch)
    return seen


def _rows(loaders: list[plitzer.Loader], steps: int) -> list[np.ndarray]:
    got = [[tokens_of(ld.next_batch()).copy() for _ in range(steps)] for ld in loaders]
    return [np.concatenate([got[r][t] for r in range(len(loaders))]) for t in range(steps)]


def _alone(source: Any, steps: int, **kw: Any) -> list[np.ndarray]:
    with plitzer.Loader(source, **CFG, **kw) as ld:
        return [tokens_of(ld.next_batch()).copy() for _ in range(steps)]


def test_a_loader_in_a_group_lists_once_and_reads_each_footer_once(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "data"
    plitzer.synth.write(data, tokens=60_000, seed=4, docs_per_row_group=10, row_groups_per_file=2)
    files = len(list(data.rglob("*.parquet")))
    seen = _counters(monkeypatch)
    group = ThreadGroup(WORLD)
    loaders = run_ranks(WORLD, lambda r: plitzer.Loader.in_group(group.member(r), data, rank=r, world=WORLD, **CFG))
    assert seen == {"listings": 1, "footers": files}  # world 1 per rank would be 4 and 4 x files
    try:
        got = _rows(loaders, 3)
    finally:
        for ld in loaders:
            ld.close()
    for a, b in zip(got, _alone(data, 3), strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_text_source_splits_its_counting_pass(tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = write_text(tmp_path / "text", files=6, row_groups=3, docs=12)
    texts = nonempty_texts(data)
    seen = _counters(monkeypatch)
    tok = CharTokenizer()
    group = ThreadGroup(WORLD)
    members = [group.member(r) for r in range(WORLD)]
    loaders = run_ranks(
        WORLD, lambda r: plitzer.Loader.in_group(members[r], data, rank=r, world=WORLD, tokenizer=tok, **CFG)
    )
    try:
        assert seen == {"listings": 1, "footers": 6}
        assert tok.texts == texts  # each row group tokenized once for the job (world 1 per rank: 4 times)
        assert len(list((cache / "text").glob("*.npy"))) == 6  # every file's counts in the cache
        got = _rows(loaders, 2)
    finally:
        for ld in loaders:
            ld.close()
    tok.texts = 0
    for a, b in zip(got, _alone(data, 2, tokenizer=tok), strict=True):
        np.testing.assert_array_equal(a, b)
    assert [ld.config for ld in loaders[1:]] == [loaders[0].config] * (WORLD - 1)
    # A restart on the same machine: everything is in the cache, one all-gather says so, nothing is counted.
    before = tok.texts
    group = ThreadGroup(WORLD)
    again = run_ranks(
        WORLD, lambda r: plitzer.Loader.in_group(group.member(r), data, rank=r, world=WORLD, tokenizer=tok, **CFG)
    )
    for ld in again:
        ld.close()
    assert tok.texts == before
    assert again[0].index.fingerprint == loaders[0].index.fingerprint


def test_a_mixture_with_a_selection_shares_each_source(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    web, code = tmp_path / "web", tmp_path / "code"
    plitzer.synth.write(web, tokens=40_000, seed=5, docs_per_row_group=10, row_groups_per_file=2)
    plitzer.synth.write(code, tokens=30_000, seed=6, docs_per_row_group=10, row_groups_per_file=2)
    tok = CharTokenizer()
    text = write_text(tmp_path / "text", files=3)
    sources = {"web": {"path": str(web), "where": "int_score >= 2"}, "code": str(code)}
    sources["notes"] = {"path": str(text), "tokenizer": tok}  # type: ignore[assignment]
    files = sum(len(list(d.rglob("*.parquet"))) for d in (web, code, text))
    seen = _counters(monkeypatch)
    group = ThreadGroup(WORLD)
    loaders = run_ranks(WORLD, lambda r: plitzer.Loader.in_group(group.member(r), sources, rank=r, world=WORLD, **CFG))
    try:
        # Each source's in turn, each footer once for the job's index; the selection pass of
        # "web" (where=) reads web's footers once more (split between the ranks) for its
        # predicate's columns: the index keeps the token column's part of a footer only.
        assert seen["footers"] == files + len(list(web.rglob("*.parquet")))
        assert tok.texts == nonempty_texts(text)  # once for the job
        got = _rows(loaders, 3)
    finally:
        for ld in loaders:
            ld.close()
    for a, b in zip(got, _alone(sources, 3), strict=True):
        np.testing.assert_array_equal(a, b)


def test_which_group_a_loader_shares_over(tmp_path: Path) -> None:
    cfg = LoaderSettings.of(rank=1, world=2)
    assert job_group(None, cfg) is None
    assert job_group(ThreadGroup(1).member(0), cfg) is None  # a group of one shares nothing
    two = ThreadGroup(2).member(1)
    assert job_group(two, cfg) is two
    with pytest.raises(ConfigError, match=r"give a torch\.distributed ProcessGroup"):
        job_group(object(), cfg)
    with pytest.raises(ConfigError, match=r"give a torch\.distributed ProcessGroup"):
        plitzer.Loader.in_group("world", tmp_path, **CFG)
    # No torch.distributed initialised here: the constructor shares nothing.
    assert job_group(AUTO, cfg) is None


def test_a_group_with_a_job_index_and_a_selection(tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """index= and where= in a group: the index comes from the job index, the selection pass is split.

    The job index carries the predicate's column (``--columns int_score``): no rank reads a footer.
    """
    from planner.catalog import jobindex

    data = tmp_path / "data"
    plitzer.synth.write(data, tokens=40_000, seed=7, docs_per_row_group=10, row_groups_per_file=2)
    jobindex.write(data, tmp_path / "job.index", columns=["int_score"])
    kw = {"index": str(tmp_path / "job.index"), "where": "int_score >= 2"}
    want = _alone(data, 3, **kw)
    monkeypatch.setenv("PLITZER_CACHE", str(tmp_path / "fresh"))
    seen = _counters(monkeypatch)
    evaluated: list[int] = []
    real = SelectionPass.evaluate_many
    monkeypatch.setattr(SelectionPass, "evaluate_many", lambda self, rgs: evaluated.extend(rgs) or real(self, rgs))
    group = ThreadGroup(WORLD)
    loaders = run_ranks(
        WORLD, lambda r: plitzer.Loader.in_group(group.member(r), data, rank=r, world=WORLD, **kw, **CFG)
    )
    try:
        # Planning, decoding and the split selection pass read no footer: the job index carries
        # the predicate's column (a token-only one: each footer once, tests/sources/test_jobindex.py).
        assert seen["footers"] == 0
        assert sorted(evaluated) == list(range(loaders[0].index.row_groups))  # each row group once for the job
        got = _rows(loaders, 3)
    finally:
        for ld in loaders:
            ld.close()
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)
