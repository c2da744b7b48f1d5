"""Layout stages under best-fit that change ``seq_len`` (SPEC section 15 rule 9, ``L' != L``).

Against the independent reference (tests/bestfit_reference.py, :func:`layout_rows`): random
documents (empty, null, longer than either ``L``), one or two changes of ``seq_len`` and
``lanes`` anywhere (inside a window or at its edge), given up front or live, a resume at
another world inside the stage, and every token of each epoch delivered exactly once.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

import plitzer
from planner.errors import ConfigError
from tests.bestfit_reference import bins_of, layout_rows, row
from tests.conftest import docs_by_row_group, write_dataset
from tests.planning.test_bestfit import dataset_st

SLOW = settings(
    max_examples=int(os.environ.get("PLITZER_EXAMPLES", "40")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
KW = {"window": 2, "packing": "best-fit", "budget": 1 << 24}


def _staged(stages: list[tuple[int, int, int]]) -> dict[str, list[tuple[int, int]]]:
    return {"lanes": [(s, b) for s, b, _ in stages], "seq_len": [(s, n) for s, _, n in stages]}


def _check(batch: plitzer.Batch, rg_docs, bins, label: int, rows: range, pad_id: int = 0) -> None:
    seq_len = batch.tokens.shape[1]
    made = [row(rg_docs, bins[k], seq_len, pad_id) for k in rows]
    np.testing.assert_array_equal(np.from_dlpack(batch.tokens), np.array([m[0] for m in made]))
    np.testing.assert_array_equal(batch.mask, np.array([m[1] for m in made]))
    assert [d.tolist() for d in batch.doc_lengths] == [m[2] for m in made]
    assert batch.epoch == label


stages_st = st.tuples(
    st.integers(2, 16),  # L at step 0
    st.sampled_from([1, 2, 4]),
    st.lists(st.tuples(st.integers(1, 5), st.sampled_from([1, 2, 4]), st.integers(2, 24)), min_size=1, max_size=2),
)


def _layout(first: tuple[int, int, list[tuple[int, int, int]]]) -> list[tuple[int, int, int]]:
    seq_len, lanes, changes = first
    out, step = [(0, lanes, seq_len)], 0
    for gap, b, n in changes:
        step += gap
        out.append((step, b, n))
    return out


@given(files=dataset_st, seed=st.integers(0, 1000), layout=stages_st, live=st.booleans())
@SLOW
def test_seq_len_stages_are_the_reference_rows(
    tmp_path_factory: pytest.TempPathFactory, files, seed: int, layout, live: bool
) -> None:
    rg_docs = docs_by_row_group(files)
    stages = _layout(layout)
    assume(sum(len(d) for g in rg_docs for d in g) > 0)
    assume(all(sum(len(bins_of(d, g, n)) for g, d in enumerate(rg_docs)) >= b for _, b, n in stages))
    steps = stages[-1][0] + 6
    want, labels = layout_rows(rg_docs, seed, 2, stages, steps)
    event(f"{len(stages) - 1} change(s), L changes {len({n for *_, n in stages}) > 1}, live {live}")
    root = tmp_path_factory.mktemp("bfl")
    write_dataset(root, files)
    first = {"lanes": stages[0][1], "seq_len": stages[0][2]}
    with plitzer.Loader(root, seed=seed, **(first if live else _staged(stages)), **KW) as loader:
        for t in range(steps):
            for s, b, n in stages[1:]:
                if live and s == t:
                    assert loader.set_layout(lanes=b, seq_len=n) == t
            _check(loader.next_batch(), rg_docs, want[t], labels[t], range(len(want[t])))


@given(
    files=dataset_st,
    seed=st.integers(0, 1000),
    layout=stages_st,
    at=st.integers(0, 8),
    worlds=st.sampled_from([(1, 2), (2, 1), (4, 2)]),
)
@SLOW
def test_a_resume_at_another_world_inside_a_seq_len_stage(
    tmp_path_factory: pytest.TempPathFactory, files, seed: int, layout, at: int, worlds: tuple[int, int]
) -> None:
    rg_docs = docs_by_row_group(files)
    seq_len, _, changes = layout
    stages = _layout((seq_len, 4, [(g, 4, n) for g, _, n in changes]))
    assume(sum(len(d) for g in rg_docs for d in g) > 0)
    assume(all(sum(len(bins_of(d, g, n)) for g, d in enumerate(rg_docs)) >= 4 for *_, n in stages))
    steps = max(at, stages[-1][0]) + 4
    want, labels = layout_rows(rg_docs, seed, 2, stages, steps)
    root = tmp_path_factory.mktemp("bfw")
    write_dataset(root, files)
    a, b = worlds
    parts = []
    for rank in range(a):
        with plitzer.Loader(root, seed=seed, world=a, rank=rank, **_staged(stages), **KW) as loader:
            for _ in range(at):
                loader.next_batch()
            parts.append(loader.checkpoint())
    state = plitzer.merge(parts)
    per = 4 // b
    for rank in range(b):
        with plitzer.Loader(root, seed=seed, world=b, rank=rank, **_staged(stages), **KW) as loader:
            loader.resume(state)
            for t in range(at, steps):
                _check(loader.next_batch(), rg_docs, want[t], labels[t], range(rank * per, (rank + 1) * per))


def test_a_seq_len_change_delivers_each_token_of_each_epoch_once(tmp_path: Path) -> None:
    rng = np.random.default_rng(11)
    files = [[[list(rng.integers(0, 1 << 20, int(n))) for n in rng.integers(0, 70, 12)] for _ in range(5)]]
    write_dataset(tmp_path, files)
    stages = [(0, 4, 32), (5, 2, 64), (9, 4, 16)]  # inside windows: longer rows, then shorter than documents
    pieces = []
    with plitzer.Loader(tmp_path, seed=3, **_staged(stages), **KW) as loader:
        while loader.step < 10 or loader.epoch < 3:
            batch = loader.next_batch()
            pieces.append(batch.documents().select("epoch", "row_group", "row", "token_offset", "length"))
    got = pl.concat(pieces).filter(pl.col("epoch") < 2).sort("epoch", "row_group", "row", "token_offset")
    for e in (0, 1):
        for g, docs in enumerate(files[0]):
            for r, doc in enumerate(docs):
                mine = got.filter((pl.col("epoch") == e) & (pl.col("row_group") == g) & (pl.col("row") == r))
                starts, lens = mine["token_offset"].to_list(), mine["length"].to_list()
                # every token once: pieces tile [0, len) in order, none twice
                assert [0, *np.cumsum(lens).tolist()][:-1] == starts and sum(lens) == len(doc), (e, g, r)


def test_a_repeated_seq_len_stage_changes_nothing_and_mixtures_are_refused(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    write_dataset(tmp_path, [[[list(rng.integers(0, 99, int(n))) for n in rng.integers(0, 40, 15)] for _ in range(6)]])
    kw = {"seed": 5, "lanes": 4, **KW}
    with plitzer.Loader(tmp_path, seq_len=24, **kw) as plain:
        want = [np.from_dlpack(plain.next_batch().tokens).copy() for _ in range(20)]
    with plitzer.Loader(tmp_path, seq_len=[(0, 24), (7, 24)], **kw) as staged:
        assert all(np.array_equal(np.from_dlpack(staged.next_batch().tokens), w) for w in want)
    with pytest.raises(ConfigError, match="one dataset"):
        plitzer.Loader({"a": tmp_path, "b": tmp_path}, weights={"a": 1, "b": 1}, seq_len=[(0, 24), (3, 48)], **kw)


def test_a_finite_run_with_a_seq_len_stage_ends_after_its_epochs(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    files = [[[list(rng.integers(1, 1 << 20, int(n))) for n in rng.integers(1, 50, 10)] for _ in range(4)]]
    write_dataset(tmp_path, files)
    stages = [(0, 2, 32), (3, 2, 16)]
    with plitzer.Loader(tmp_path, seed=1, epochs=2, **_staged(stages), **KW) as loader:
        n = len(loader)
        assert n == loader.steps_in_epoch(0) + loader.steps_in_epoch(1)
        batches = [b for _ in range(2) for b in loader]  # each loop one epoch
        assert len(batches) == n and loader.ended
    got = pl.concat([b.documents().select("epoch", "row_group", "row", "length") for b in batches])
    per = got.group_by("epoch", "row_group", "row").agg(pl.col("length").sum())
    want = {(e, g, r): len(d) for e in (0, 1) for g, docs in enumerate(files[0]) for r, d in enumerate(docs)}
    assert {(e, g, r): n for e, g, r, n in per.iter_rows()} == want
    assert [b.epoch for b in batches] == sorted(b.epoch for b in batches)


def test_plan_tables_refuse_a_seq_len_stage_under_best_fit(tmp_path: Path) -> None:
    write_dataset(tmp_path, [[[[1] * 7, [2] * 3, [3] * 12], [[4] * 5, [5] * 9]]])
    staged = {"lanes": 2, "window": 2, "seq_len": [(0, 8), (3, 16)], "packing": "best-fit"}
    with pytest.raises(ConfigError, match="plan tables of seq_len stages"):
        plitzer.plan(tmp_path, **staged)


@pytest.mark.parametrize(
    "stages",
    [
        [(0, 4, 32), (5, 2, 64)],  # longer rows inside a window
        [(0, 4, 32), (5, 4, 16), (7, 2, 16), (12, 4, 48)],  # shorter, lanes alone in the same window, longer
    ],
)
def test_locate_answers_across_seq_len_stages(tmp_path: Path, stages) -> None:
    rng = np.random.default_rng(6)
    files = [[[list(rng.integers(0, 99, int(n))) for n in rng.integers(0, 50, 20)] for _ in range(6)]]
    write_dataset(tmp_path, files)
    cfg = {"seed": 1, **_staged(stages), **KW}
    with plitzer.Loader(tmp_path, **cfg) as loader:
        run = [loader.next_batch().documents().with_columns(step=pl.lit(t, pl.Int64)) for t in range(40)]
    seen = pl.concat(run)
    found = plitzer.locate(tmp_path, "n in (3, 11, 16)", steps=40, **cfg)
    want = seen.filter(pl.col("row").is_in([3, 11, 16]))
    cols = ["step", "lane", "start", "length", "row_group", "row", "token_offset", "epoch", "window_index"]
    assert found.height == want.height > 0
    assert found.select(cols).sort(cols).equals(want.select(cols).sort(cols))
    mine = plitzer.locate(tmp_path, "n in (3, 11, 16)", steps=40, world=2, rank=1, **cfg)
    assert mine.height and set(mine["rank"].to_list()) == {1}


def test_where_and_labels_through_seq_len_changes(tmp_path: Path) -> None:
    rng = np.random.default_rng(8)
    files = [[[list(rng.integers(0, 99, int(n))) for n in rng.integers(0, 40, 12)] for _ in range(6)]]
    write_dataset(tmp_path, files)
    kept = [[[d for r, d in enumerate(rg) if r % 3 != 1] for rg in f] for f in files]
    rg_docs = docs_by_row_group(kept)
    stages = [(0, 4, 24), (4, 2, 48), (8, 4, 16)]
    want, labels = layout_rows(rg_docs, 7, 2, stages, 16)
    with plitzer.Loader(tmp_path, seed=7, where="n % 3 != 1", labels=True, **_staged(stages), **KW) as loader:
        for t in range(16):
            batch = loader.next_batch()
            _check(batch, rg_docs, want[t], labels[t], range(len(want[t])))
            got = np.asarray(batch.labels)
            for k, bn in enumerate(want[t]):  # each real token's next token in its document, -100 at its end
                d = [(rg_docs[g][r], o + i) for g, r, o, n in bn for i in range(n)]
                exp = [doc[j + 1] if j + 1 < len(doc) else -100 for doc, j in d]
                assert got[k].tolist() == exp + [-100] * (got.shape[1] - len(exp)), (t, k)


@given(files=dataset_st, seed=st.integers(0, 1000), layout=stages_st)
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_locate_finds_what_the_loader_delivers(tmp_path_factory: pytest.TempPathFactory, files, seed, layout) -> None:
    rg_docs = docs_by_row_group(files)
    stages = _layout(layout)
    assume(sum(len(d) for g in rg_docs for d in g) > 0)
    assume(all(sum(len(bins_of(d, g, n)) for g, d in enumerate(rg_docs)) >= b for _, b, n in stages))
    root = tmp_path_factory.mktemp("bfloc")
    write_dataset(root, files)
    steps = stages[-1][0] + 5
    cfg = {"seed": seed, **_staged(stages), **KW}
    with plitzer.Loader(root, **cfg) as loader:
        seen = pl.concat([loader.next_batch().documents().with_columns(step=pl.lit(t, pl.Int64)) for t in range(steps)])
    cols = ["step", "lane", "start", "length", "row_group", "row", "token_offset", "epoch", "window_index"]
    found = plitzer.locate(root, "n % 2 = 0", steps=steps, **cfg).select(cols).sort(cols)
    assert found.equals(seen.filter(pl.col("row") % 2 == 0).select(cols).sort(cols))


def test_aligned_columns_and_storage_order_through_a_seq_len_change(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(9)
    docs = [list(range(1, int(n) + 1)) for n in rng.integers(1, 30, 60)]
    mask = [[i % 2 == 0 for i in range(len(d))] for d in docs]
    table = pa.table(
        {"tokens": pa.array(docs, pa.list_(pa.int32())), "loss_mask": pa.array(mask, pa.list_(pa.bool_()))}
    )
    pq.write_table(table, tmp_path / "a.parquet", row_group_size=10)
    stages = {"lanes": [(0, 2), (3, 4)], "seq_len": [(0, 32), (3, 16)]}
    for shuffle in (True, False):
        with plitzer.Loader(
            tmp_path, shuffle=shuffle, pad_id=0, columns={"loss_mask": False}, **stages, **KW
        ) as loader:
            for _ in range(14):
                b = loader.next_batch()
                tokens, m, col = np.from_dlpack(b.tokens), b.mask, b.columns["loss_mask"]
                # every document's token t is t (1-based), its mask t odd: the column follows the tokens
                np.testing.assert_array_equal(col, m & (tokens % 2 == 1))
                assert (tokens[~m] == 0).all() and (tokens[m] > 0).all()


def test_grain_takes_a_seq_len_stage_live_under_best_fit(tmp_path: Path) -> None:
    grain = pytest.importorskip("grain")  # noqa: F841
    import plitzer.grain as pg

    rng = np.random.default_rng(3)
    write_dataset(tmp_path, [[[list(rng.integers(1, 99, int(n))) for n in rng.integers(1, 40, 12)] for _ in range(6)]])
    kw = {"seed": 2, **KW}
    with plitzer.Loader(tmp_path, lanes=[(0, 2), (4, 2)], seq_len=[(0, 24), (4, 48)], **kw) as loader:
        want = [np.from_dlpack(loader.next_batch().tokens).copy() for _ in range(10)]
    ds = pg.Dataset(tmp_path, lanes=2, seq_len=24, **kw)
    it = iter(ds)
    got = [np.asarray(next(it)["tokens"]) for _ in range(4)]
    assert ds.set_layout(seq_len=48) == 4
    got += [np.asarray(next(it)["tokens"]) for _ in range(6)]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
