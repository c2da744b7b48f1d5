"""The passes that read other columns over an Arrow IPC source (plitzer/sources/arrow.py's BatchFile).

``where=``, ``length_column=``, ``dedupe=``, ``exclude=`` and aligned ``columns=`` read a record
batch's other columns through each file's own reader. The reference is the same data written
as Parquet with one row group a record batch (the Parquet kind's passes, tested on their own):
the index each pass gives and the batches must be equal.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import plitzer
from planner.parameters import Selection
from plitzer.errors import ConfigError, DataError
from plitzer.readpath.read import read_chunk
from plitzer.readpath.runs import read_other
from plitzer.selection.dedupe import dedupe_index
from plitzer.selection.select import select_index, select_on_ray
from plitzer.sources import arrow
from tests.sources.test_sources_arrow import docs_of, parquet_copy

datasets = pytest.importorskip("datasets")


Saved = tuple[Path, Path, Path]


@pytest.fixture(scope="module", params=[(0, 2), (1, 3)], ids=["2-shards", "3-shards"])
def saved(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Saved:
    """A save_to_disk folder with a score, a url, a token count and an aligned mask; its Parquet copy; an
    exclusion table. Documents 5 and 17 are equal (dedupe='tokens'), so are urls 11 and 2900."""
    seed, shards = request.param
    root = tmp_path_factory.mktemp(f"ipc{seed}")
    n = 4000
    docs = docs_of(n, seed, 70)
    docs[5] = list(docs[17]) or [1, 2, 3]
    docs[17] = list(docs[5])
    d = datasets.Dataset.from_dict(
        {
            "input_ids": docs,
            "score": [(i * 7 + seed) % 5 for i in range(n)],
            "url": [f"u{i % 2900}" for i in range(n)],
            "n": [len(x) for x in docs],
            "mask": [[(i + j) % 2 for j in range(len(x))] for i, x in enumerate(docs)],
        }
    )
    d.save_to_disk(str(root / "saved"), num_shards=shards)
    files = arrow.arrow_files(root / "saved")
    assert files is not None
    pq.write_table(pa.table({"url": ["u3", "u44", "u2000"]}), root / "exclude.parquet")
    return root / "saved", parquet_copy(files, root / "pq"), root / "exclude.parquet"


def _run(src: Path, n: int, **kw: Any) -> tuple[list[np.ndarray], list[dict[str, np.ndarray]], Any]:
    with plitzer.Loader(src, column="input_ids", seed=3, lanes=4, window=2, seq_len=48, **kw) as ld:
        got = list(itertools.islice(ld, n))
        return (
            [np.array(b.tokens) for b in got],
            [{k: np.array(v) for k, v in b.columns.items()} for b in got],
            ld.index,
        )


CASES: list[dict[str, Any]] = [
    {"where": "score >= 2"},
    {"where": "score >= 2 and url like 'u1%'", "length_column": "n"},
    {"dedupe": "tokens"},
    {"dedupe": "url"},
    {"exclude": "EXCLUDE"},
    {"where": "score <> 3", "dedupe": "url", "exclude": "EXCLUDE", "length_column": "n"},
    {"where": "score >= 1", "columns": ["mask"]},
    {"dedupe": "url", "columns": ["mask"]},
]


@pytest.mark.parametrize("case", CASES, ids=",".join)
def test_each_pass_equals_the_parquet_copys(saved: Saved, case: dict[str, Any]) -> None:
    ipc, ref, excl = saved
    kw = {k: str(excl) if v == "EXCLUDE" else v for k, v in case.items()}
    got, got_cols, gix = _run(ipc, 30, **kw)
    want, want_cols, wix = _run(ref, 30, **kw)
    whole = plitzer.index(ref).tokens
    if set(case) != {"columns"}:
        assert gix.tokens < whole  # the pass dropped a document
    assert gix.tokens == wix.tokens
    for k in ("rows_selected", "tokens_selected", "empty_docs_selected"):
        assert gix.frame[k].to_list() == wix.frame[k].to_list()
    assert len(got) == len(want) == 30
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
    for g, w in zip(got_cols, want_cols, strict=True):
        assert sorted(g) == sorted(w) == sorted(case.get("columns", []))
        for k in g:
            np.testing.assert_array_equal(g[k], w[k])


def test_other_columns_are_the_record_batches_read_from_a_memory_map(
    saved: Saved, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each batch's columns as pyarrow reads the file; no ranged read of the storage (the pages used, mapped)."""
    ipc, _, _ = saved
    ix = arrow.arrow_index(ipc)
    files = arrow.arrow_files(ipc)
    assert files is not None
    want = []
    for p in files:
        with pa.memory_map(str(p)) as f:
            want += list(pa.ipc.open_stream(f))
    assert len(want) == ix.row_groups

    def no_range(*a: Any) -> Any:
        raise AssertionError("a ranged read of the storage")

    monkeypatch.setattr(ix.storage(0), "read_range", no_range)
    for rg in range(ix.row_groups):
        for c in ("mask", "url", "score"):
            assert read_other(ix, rg, c) == want[rg].column(c)
        assert read_other(ix, rg, "nope") is None
    sel = select_index(ix, "score = 1")
    assert sel.frame["rows_selected"].to_list() == [int((b.column("score").to_numpy() == 1).sum()) for b in want]


def test_a_file_changed_since_indexing_is_a_data_error(tmp_path: Path) -> None:
    d = datasets.Dataset.from_dict({"input_ids": docs_of(3000, 4, 70), "score": list(range(3000))})
    d.save_to_disk(str(tmp_path / "s"))
    ix = arrow.arrow_index(tmp_path / "s")
    files = arrow.arrow_files(tmp_path / "s")
    assert files is not None
    last = ix.frame.row(ix.row_groups - 1, named=True)
    with open(files[0], "r+b") as f:
        f.truncate(int(last["byte_offset"]) + 16)
    with pytest.raises(DataError, match=r"record batch \d+: cannot decode the record batch.*clear"):
        select_index(ix, "score > 10")


def test_the_ray_engine_names_the_local_pass(saved: Saved) -> None:
    ipc, _, _ = saved
    with pytest.raises(ConfigError, match=r"Ray engine selects a Parquet dataset.*not a arrow-ipc source.*local"):
        select_on_ray(arrow.arrow_index(ipc), "score > 1", source=str(ipc))


@st.composite
def _tables(draw: st.DrawFn) -> tuple[list[list[int]], list[int], list[int]]:
    """Documents (a few repeated), their scores, and record batch sizes that cover them."""
    n = draw(st.integers(1, 60))
    pool = draw(st.lists(st.lists(st.integers(0, 9), max_size=6), min_size=1, max_size=8))
    docs = [pool[draw(st.integers(0, len(pool) - 1))] for _ in range(n)]
    scores = draw(st.lists(st.integers(0, 4), min_size=n, max_size=n))
    sizes: list[int] = []
    while sum(sizes) < n:
        sizes.append(min(draw(st.integers(1, 20)), n - sum(sizes)))
    return docs, scores, sizes


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(table=_tables(), where=st.sampled_from(["score >= 2", "score = 0 or score = 4", "score < 3"]))
def test_selection_and_dedupe_equal_the_parquet_copys(
    tmp_path_factory: pytest.TempPathFactory, table: tuple[list[list[int]], list[int], list[int]], where: str
) -> None:
    docs, scores, sizes = table
    root = tmp_path_factory.mktemp("h")
    t = pa.table({"input_ids": pa.array(docs, pa.list_(pa.int32())), "score": pa.array(scores, pa.int64())})
    (root / "ipc").mkdir()
    with pa.OSFile(str(root / "ipc" / "a.arrow"), "wb") as f, pa.ipc.new_stream(f, t.schema) as w:
        at = 0
        for k in sizes:
            w.write_batch(t.slice(at, k).to_batches()[0] if k else t.slice(0, 0).to_batches()[0])
            at += k
    files = arrow.arrow_files(root / "ipc")
    assert files is not None
    a, b = arrow.arrow_index(root / "ipc"), plitzer.index(parquet_copy(files, root / "pq"))
    for sel in (Selection(where=where), Selection(dedupe="tokens"), Selection(where=where, dedupe="tokens")):
        got, want = _passes(a, sel), _passes(b, sel)
        if isinstance(want, str):  # nothing left (every document empty, or none selected): the same refusal
            assert got == want
            continue
        assert not isinstance(got, str)
        assert got.frame["tokens_selected"].to_list() == want.frame["tokens_selected"].to_list()
        for rg in range(got.row_groups):
            assert read_chunk(got, rg).to_pylist() == read_chunk(want, rg).to_pylist()


def _passes(ix: Any, sel: Selection) -> Any:
    """``ix`` selected and deduplicated as ``sel`` says, or the type of error that refused it."""
    try:
        out = select_index(ix, sel) if sel.where else ix
        return dedupe_index(out, sel) if sel.dedupe else out
    except (ConfigError, plitzer.errors.SelectionError) as e:
        return type(e).__name__


_GLOO_WORKER = """
import json, sys
import numpy as np
import torch.distributed as dist
import plitzer
import plitzer.selection.evaluate as ev
from plitzer.sources import arrow

rank, world, port, data, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
walked, evaluated = [], []
walk, evaluate = arrow._walk, ev.SelectionPass.evaluate_many
arrow._walk = lambda path, column: (walked.append(path.name), walk(path, column))[1]
ev.SelectionPass.evaluate_many = lambda self, rgs: (evaluated.extend(rgs), evaluate(self, rgs))[1]
kw = {"seed": 7, "lanes": 4, "window": 2, "seq_len": 48, "threads": 1}
with plitzer.Loader(data, rank=rank, world=world, where="score >= 1", dedupe="url", **kw) as ld:
    tokens = [np.from_dlpack(ld.next_batch().tokens).tolist() for _ in range(3)]
json.dump({"walked": walked, "evaluated": evaluated, "tokens": tokens}, open(out, "w"))
dist.destroy_process_group()
"""


@pytest.mark.timeout(180)
def test_two_gloo_ranks_share_the_framing_and_the_passes(tmp_path: Path) -> None:
    """Each rank (its own cache folder) walks the framing of half the files and runs its share of the selection
    pass; their rows make world 1's batches."""
    pytest.importorskip("torch")
    from plitzer.selection.evaluate import chunks_of
    from tests.share_fixtures import gloo_ranks

    n = 6000
    docs = docs_of(n, 9, 70)
    d = datasets.Dataset.from_dict(
        {"input_ids": docs, "score": [i % 4 for i in range(n)], "url": [f"u{i % 5000}" for i in range(n)]}
    )
    d.save_to_disk(str(tmp_path / "saved"), num_shards=4)
    files = arrow.arrow_files(tmp_path / "saved")
    assert files is not None and len(files) == 4
    got = gloo_ranks(_GLOO_WORKER, tmp_path / "saved", tmp_path)
    assert sorted(got[0]["walked"] + got[1]["walked"]) == sorted(p.name for p in files)  # each file once
    assert got[0]["walked"] and got[1]["walked"]
    chunks = chunks_of(arrow.arrow_index(tmp_path / "saved"))
    for r in range(2):
        share = [rg for c, (a, b) in enumerate(chunks) if c * 2 // len(chunks) == r for rg in range(a, b)]
        assert sorted(got[r]["evaluated"]) == share
    kw = {"seed": 7, "lanes": 4, "window": 2, "seq_len": 48}
    with plitzer.Loader(tmp_path / "saved", where="score >= 1", dedupe="url", **kw) as ref:
        for t in range(3):
            want = np.from_dlpack(ref.next_batch().tokens)
            np.testing.assert_array_equal(np.concatenate([np.array(g["tokens"][t]) for g in got]), want)
