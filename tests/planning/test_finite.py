"""Finite runs and storage order (SPEC section 17): ``shuffle=False``, ``epochs=N``, ``len()``, ``steps_in_epoch``.

Storage order is checked against a tiny independent model of SPEC section 3 with the identity
for its permutations (and tests/bestfit_reference.py's bins for best-fit); a finite run
against what it must deliver: every token (concat) or item (best-fit) once, then padding.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import planner
import plitzer
from planner.errors import CheckpointError, ConfigError, UsageError
from tests.bestfit_reference import bins_of, row
from tests.conftest import numbered_dataset

SLOW = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

lengths_st = st.lists(
    st.lists(st.lists(st.integers(0, 40), min_size=1, max_size=6), min_size=1, max_size=4), min_size=1, max_size=3
)


# -- a tiny independent model: section 3 with every permutation the identity ----------------------


def _cuts(total: int, lanes: int, z: int) -> list[int]:
    q, r = divmod(total, lanes)
    out = [0]
    for k in range(lanes):
        out.append(out[-1] + q + (1 if (k - z) % lanes < r else 0))
    return out


def storage_rows(rg_docs: list[list[list[int]]], lanes: int, window: int, seq_len: int, pad: int) -> list[Any]:
    """Steps of one epoch in storage order, each ``(tokens, mask)`` as lists of lanes' rows, padded at the end."""
    streams: list[list[int]] = [[] for _ in range(lanes)]
    run = 0
    for w in range(0, len(rg_docs), window):
        stream = [t for g in range(w, min(w + window, len(rg_docs))) for d in rg_docs[g] for t in d]
        c = _cuts(len(stream), lanes, run % lanes)
        for k in range(lanes):
            streams[k] += stream[c[k] : c[k + 1]]
        run += len(stream)
    steps = -(-run // (lanes * seq_len))
    out = []
    for t in range(steps):
        rows = [s[t * seq_len : (t + 1) * seq_len] for s in streams]
        out.append(
            (
                [r + [pad] * (seq_len - len(r)) for r in rows],
                [[True] * len(r) + [False] * (seq_len - len(r)) for r in rows],
            )
        )
    return out


def storage_bins(rg_docs: list[list[list[int]]], lanes: int, window: int, seq_len: int, pad: int) -> list[Any]:
    """Best-fit's steps of one epoch in storage order: each lane's bins in stream order, padding rows past its end."""
    binned = [bins_of(d, g, seq_len) for g, d in enumerate(rg_docs)]
    streams: list[list[Any]] = [[] for _ in range(lanes)]
    run = 0
    for w in range(0, len(rg_docs), window):
        stream = [b for g in range(w, min(w + window, len(rg_docs))) for b in binned[g]]
        c = _cuts(len(stream), lanes, run % lanes)
        for k in range(lanes):
            streams[k] += stream[c[k] : c[k + 1]]
        run += len(stream)
    steps = -(-run // lanes)
    empty = ([pad] * seq_len, [False] * seq_len, [seq_len])
    return [[row(rg_docs, s[t], seq_len, pad) if t < len(s) else empty for s in streams] for t in range(steps)]


def _run(loader: plitzer.Loader) -> list[Any]:
    return [(b.step, b.epoch, np.array(b.tokens).copy(), b.mask.copy(), b.doc_lengths) for b in loader]


# -- storage order ----------------------------------------------------------------------------------


@SLOW
@given(lengths=lengths_st, lanes=st.sampled_from([1, 2, 3, 4]), window=st.integers(1, 3), seq_len=st.integers(1, 9))
def test_storage_order_one_epoch_is_the_model_then_padding(
    tmp_path_factory: pytest.TempPathFactory, lengths: list[Any], lanes: int, window: int, seq_len: int
) -> None:
    root = tmp_path_factory.mktemp("d")
    files = numbered_dataset(root, lengths)
    rg_docs = [rg for f in files for rg in f]
    total = sum(len(d) for rg in rg_docs for d in rg)
    if total == 0:
        return
    want = storage_rows(rg_docs, lanes, window, seq_len, pad=7)
    with plitzer.Loader(
        str(root), seed=5, lanes=lanes, window=window, seq_len=seq_len, shuffle=False, epochs=1, pad_id=7
    ) as loader:
        assert len(loader) == len(want)
        got = _run(loader)
        assert loader.ended
    assert [g[0] for g in got] == list(range(len(want)))
    assert {g[1] for g in got} == {0}
    for (_, _, tokens, mask, docs), (wt, wm) in zip(got, want, strict=True):
        assert tokens.tolist() == wt
        assert mask.tolist() == wm
        for r, m in zip(docs, wm, strict=True):  # padding is a segment of its own
            assert int(np.sum(r)) == seq_len
            if not all(m):
                assert int(r[-1]) == seq_len - sum(m)
    real = np.concatenate([t[m] for _, _, t, m, _ in got])
    assert sorted(real.tolist()) == list(range(total))  # every token exactly once


@SLOW
@given(lengths=lengths_st, lanes=st.sampled_from([1, 2, 4]), window=st.integers(1, 3), seq_len=st.integers(1, 12))
def test_best_fit_storage_order_one_epoch_is_every_item_once(
    tmp_path_factory: pytest.TempPathFactory, lengths: list[Any], lanes: int, window: int, seq_len: int
) -> None:
    root = tmp_path_factory.mktemp("d")
    files = numbered_dataset(root, lengths)
    rg_docs = [rg for f in files for rg in f]
    if sum(len(bins_of(d, g, seq_len)) for g, d in enumerate(rg_docs)) < lanes:
        return  # fewer bins than lanes: refused (test_bestfit)
    want = storage_bins(rg_docs, lanes, window, seq_len, pad=3)
    kw = {"lanes": lanes, "window": window, "seq_len": seq_len, "packing": "best-fit", "pad_id": 3}
    with plitzer.Loader(str(root), shuffle=False, epochs=1, **kw) as loader:
        assert len(loader) == len(want)
        got = _run(loader)
    for (_, _, tokens, mask, docs), rows in zip(got, want, strict=True):
        assert tokens.tolist() == [r[0] for r in rows]
        assert mask.tolist() == [r[1] for r in rows]
        assert [d.tolist() for d in docs] == [r[2] for r in rows]
    total = sum(len(d) for rg in rg_docs for d in rg)
    real = np.concatenate([t[m] for _, _, t, m, _ in got])
    assert sorted(real.tolist()) == list(range(total))


def test_storage_order_plan_is_the_index_order(tmp_path: Path) -> None:
    numbered_dataset(tmp_path, [[[3, 4]] * 5, [[2]] * 4])
    p = planner.plan(str(tmp_path), seed=9, lanes=2, window=3, shuffle=False)
    rg = p.row_groups(1).sort("position")
    assert rg["file"].to_list() == [p.index["file"][i] for i in range(9)]
    assert rg["row_group"].to_list() == [*range(5), *range(4)]
    shuffled = planner.plan(str(tmp_path), seed=9, lanes=2, window=3).row_groups(1).sort("position")
    assert shuffled["row_group"].to_list() != rg["row_group"].to_list()  # the seed's order is another


# -- a finite run: len, iteration, repetition, the end ------------------------------------------------


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("finite")
    rng = np.random.default_rng(4)
    numbered_dataset(root, [[rng.integers(0, 90, 12).tolist() for _ in range(5)] for _ in range(3)])
    return str(root)


SETTINGS: dict[str, Any] = {"seed": 3, "lanes": 8, "window": 2, "seq_len": 32}


@pytest.mark.parametrize("packing", ["concat", "best-fit"])
@pytest.mark.parametrize("shuffle", [True, False])
def test_a_second_iter_repeats_the_same_batches(data: str, packing: str, shuffle: bool) -> None:
    with plitzer.Loader(data, **SETTINGS, epochs=2, shuffle=shuffle, packing=packing) as loader:
        n = len(loader)
        first = [*_run(loader), *_run(loader)]  # epoch by epoch: two loops for two epochs
        assert len(first) == n == loader.steps_in_epoch(0) + loader.steps_in_epoch(1)
        assert loader.ended and loader.step == n and len(_run(loader)) == loader.steps_in_epoch(0)
        with pytest.raises(UsageError, match="ended"):
            loader.seek(n)
            loader.next_batch()
        with pytest.raises(ConfigError, match="past this run's end"):
            loader.seek(n + 1)
        loader.seek(n)
        again = [*_run(loader), *_run(loader)]  # the iter() after the end starts the run again
    for a, b in zip(first, again, strict=True):
        assert a[:2] == b[:2] and np.array_equal(a[2], b[2]) and np.array_equal(a[3], b[3])
    if packing == "concat":  # concat pads only the run's last step
        assert all(f[3].all() for f in first[:-1]) and not first[-1][3].all()


def test_the_last_step_holds_a_real_token_and_pads_after_it(data: str) -> None:
    with plitzer.Loader(data, **SETTINGS, epochs=1, pad_id=65535) as loader:
        got = _run(loader)
        total = loader.tokens
    _, _, tokens, mask, _ = got[-1]
    assert mask.any() and mask.sum() == total - (len(got) - 1) * 8 * 32
    assert (tokens[~mask] == 65535).all()
    assert np.diff(mask.astype(int), axis=1).max(initial=0) <= 0  # padding only after the real tokens
    real = np.concatenate([g[2][g[3]] for g in got])
    assert sorted(real.tolist()) == list(range(total))


@pytest.mark.parametrize("packing", ["concat", "best-fit"])
def test_labels_are_minus_100_after_the_end_and_every_target_once(tmp_path: Path, packing: str) -> None:
    """SPEC sections 16 and 17: labels on an evaluation pass, its padding (ended lanes too) -100."""
    rng = np.random.default_rng(9)
    docs = numbered_dataset(tmp_path, [[rng.integers(0, 40, 9).tolist() for _ in range(4)] for _ in range(2)])
    nexts = {d[i]: d[i + 1] for f in docs for rg in f for d in rg for i in range(len(d) - 1)}
    with plitzer.Loader(tmp_path, **SETTINGS, epochs=1, labels=True, packing=packing, world=2, rank=1) as a:
        steps = [(a.next_batch(), a.step) for _ in range(len(a))]
    with plitzer.Loader(tmp_path, **SETTINGS, epochs=1, labels=True, packing=packing) as whole:
        batches = [whole.next_batch() for _ in range(len(whole))]
    assert [np.array_equal(b.labels[4:], r.labels) for b, (r, _) in zip(batches, steps, strict=True)] == [True] * len(
        batches
    )
    last = batches[-1]
    assert (~last.mask).any() and (np.asarray(last.labels)[~np.asarray(last.mask)] == -100).all()
    tokens = np.concatenate([np.asarray(b.tokens)[np.asarray(b.mask)] for b in batches])
    labels = np.concatenate([np.asarray(b.labels)[np.asarray(b.mask)] for b in batches])
    assert {int(t): int(v) for t, v in zip(tokens, labels, strict=True) if v != -100} == nexts


@pytest.mark.parametrize("packing", ["concat", "best-fit"])
@pytest.mark.parametrize("shuffle", [True, False])
def test_the_same_global_batch_at_world_1_2_4(data: str, packing: str, shuffle: bool) -> None:
    kw = {**SETTINGS, "epochs": 1, "shuffle": shuffle, "packing": packing}
    with plitzer.Loader(data, **kw) as one:
        want = _run(one)
    for world in (2, 4):
        parts = []
        for rank in range(world):
            with plitzer.Loader(data, **kw, world=world, rank=rank) as loader:
                assert len(loader) == len(want)
                parts.append(_run(loader))
        for t, w in enumerate(want):
            assert np.array_equal(np.concatenate([p[t][2] for p in parts]), w[2])
            assert np.array_equal(np.concatenate([p[t][3] for p in parts]), w[3])


@pytest.mark.parametrize("packing", ["concat", "best-fit"])
def test_resume_inside_the_run_at_another_world(data: str, packing: str) -> None:
    kw = {**SETTINGS, "epochs": 2, "shuffle": False, "packing": packing}
    with plitzer.Loader(data, **kw) as one:
        n = len(one)
        want = [b for e in range(2) for b in _run(one)]
    for at in (1, n // 2, n - 2, n - 1, n):
        parts = []
        for rank in range(2):
            with plitzer.Loader(data, **kw, world=2, rank=rank) as a:
                a.seek(max(0, at - 1))
                if at:
                    a.next_batch()
                parts.append(a.checkpoint())
        state = plitzer.merge(parts)
        for rank in range(4):
            with plitzer.Loader(data, **kw, world=4, rank=rank) as b:
                b.resume(state)
                assert b.step == at
                rest = [b.next_batch() for _ in range(n - at)]
                assert b.ended
                for t, batch in enumerate(rest):
                    assert np.array_equal(np.array(batch.tokens), want[at + t][2][rank * 2 : rank * 2 + 2])
                    assert np.array_equal(batch.mask, want[at + t][3][rank * 2 : rank * 2 + 2])


def test_the_end_reads_nothing_past_the_run(data: str) -> None:
    with plitzer.Loader(data, **SETTINGS, epochs=1, shuffle=False) as finite:
        _run(finite)
        assert finite.reads == planner.plan(data, lanes=8, window=2).index.height  # each row group once, none past


# -- epochs: labels, steps_in_epoch, plan tables -----------------------------------------------------


@pytest.mark.parametrize(
    "layout",
    [{"lanes": 8, "seq_len": 32}, {"lanes": [(0, 8), (5, 4)], "seq_len": [(0, 32), (5, 48)]}],
)
@pytest.mark.parametrize("epochs", [None, 3])
def test_steps_in_epoch_counts_the_iterated_labels(data: str, layout: dict[str, Any], epochs: int | None) -> None:
    kw = {"seed": 3, "window": 2, **layout, "epochs": epochs}
    plan = planner.plan(data, **kw)
    with plitzer.Loader(data, **kw) as loader:
        counted = []
        for e in range(3):
            assert len(loader) == (
                loader.steps_in_epoch(e) if epochs is None else sum(map(loader.steps_in_epoch, range(3)))
            )
            labels = [b.epoch for b in loader]
            assert set(labels) == {e}
            counted.append(len(labels))
        assert counted == [loader.steps_in_epoch(e) for e in range(3)] == [plan.steps_in_epoch(e) for e in range(3)]
        if epochs is not None:
            assert loader.ended and loader.steps_in_epoch(3) == 0 and sum(counted) == len(loader)
            steps = plan.sql("select max(step) as last, sum(tokens) as tokens from steps", epochs=[0, 1, 2])
            assert steps["last"][0] == len(loader) - 1 and steps["tokens"][0] == 3 * plan.tokens


def test_a_mixture_runs_one_epoch_of_every_source_once(tmp_path: Path) -> None:
    a = numbered_dataset(tmp_path / "a", [[[5, 9, 0, 3], [12, 1]], [[7, 7]]])
    b = numbered_dataset(tmp_path / "b", [[[4, 4, 4], [20]], [[6, 1, 1]]])
    every = sorted(t for f in (*a, *b) for rg in f for d in rg for t in d)
    sources = {"a": str(tmp_path / "a"), "b": str(tmp_path / "b")}
    kw = {"lanes": 4, "window": 2, "seq_len": 8, "epochs": 1, "shuffle": False}
    with plitzer.Loader(sources, **kw) as one:
        got = _run(one)
        assert len(got) == len(one) == one.steps_in_epoch(0) and one.ended
    assert sorted(t for _, _, tok, m, _ in got for t in tok[m].tolist()) == every
    for world in (2, 4):
        parts = []
        for rank in range(world):
            with plitzer.Loader(sources, **kw, world=world, rank=rank) as loader:
                parts.append(_run(loader))
        assert [np.concatenate([p[t][2] for p in parts]).tolist() for t in range(len(got))] == [
            g[2].tolist() for g in got
        ]


def test_where_delivers_every_selected_token_once(tmp_path: Path) -> None:
    files = numbered_dataset(tmp_path, [[[3, 5, 2, 8], [4, 4]], [[9, 1, 6]]])
    keep = [t for f in files for rg in f for i, d in enumerate(rg) if i % 2 == 0 for t in d]
    with plitzer.Loader(str(tmp_path), lanes=2, window=2, seq_len=4, epochs=1, where="n % 2 = 0") as loader:
        got = _run(loader)
    assert sorted(t for _, _, tok, m, _ in got for t in tok[m].tolist()) == sorted(keep)


# -- configuration and checkpoints --------------------------------------------------------------------


def test_the_checkpoint_records_them_only_when_set(data: str) -> None:
    with plitzer.Loader(data, **SETTINGS) as default:
        assert not {"shuffle", "epochs", "pad_id"} & set(default.config)
    with plitzer.Loader(data, **SETTINGS, shuffle=False, epochs=2, pad_id=9) as loader:
        assert {k: loader.config[k] for k in ("shuffle", "epochs", "pad_id")} == {
            "shuffle": False,
            "epochs": 2,
            "pad_id": 9,
        }
        state = loader.checkpoint()
    for other, field in (({"epochs": 1}, "epochs"), ({"epochs": None}, "epochs"), ({"shuffle": True}, "shuffle")):
        with (
            plitzer.Loader(data, **{**SETTINGS, "shuffle": False, "epochs": 2, "pad_id": 9, **other}) as b,
            pytest.raises(CheckpointError, match=field),
        ):
            b.resume(state)


@pytest.mark.parametrize("bad", [{"epochs": 0}, {"epochs": 1.5}, {"shuffle": "no"}])
def test_bad_values_are_refused_naming_the_field(data: str, bad: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match=next(iter(bad))):
        plitzer.Loader(data, **SETTINGS, **bad)


def test_torch_dataset_has_len_when_finite(data: str) -> None:
    torch_ = pytest.importorskip("plitzer.torch")
    ds = torch_.Dataset(data, **SETTINGS, epochs=1, shuffle=False)
    assert len(ds) == ds.steps_in_epoch(0) == len(list(ds)) == len(list(ds))
    endless = torch_.Dataset(data, **SETTINGS)
    with pytest.raises(TypeError, match="no len"):
        len(endless)
    assert endless.steps_in_epoch(1) == planner.plan(data, **SETTINGS).steps_in_epoch(1)


def test_grain_stops_at_the_end_of_a_finite_run(data: str) -> None:
    grain_ = pytest.importorskip("plitzer.grain")
    with plitzer.Loader(data, **SETTINGS, epochs=1) as loader:
        n = len(loader)
    it = iter(grain_.Dataset(data, **SETTINGS, epochs=1, num_epochs=None))
    assert len(list(it)) == n


@pytest.mark.parametrize("packing", ["concat", "best-fit"])
def test_locate_places_documents_in_storage_order(tmp_path: Path, packing: str) -> None:
    files = numbered_dataset(tmp_path, [[[5, 9, 0, 3], [12, 1, 4]], [[7, 7, 2], [30]]])
    kw = {"lanes": 2, "window": 2, "seq_len": 8, "shuffle": False, "packing": packing, "seed": 11}
    with plitzer.Loader(str(tmp_path), **kw, epochs=1) as loader:
        batches = {b.step: np.array(b.tokens) for b in loader}
    found = plitzer.locate(str(tmp_path), "n >= 0", **kw)
    assert found.filter(found["length"] > 0).height >= 10  # every non-empty document, at least once
    for step, lane, start, length, doc_offset, f, g, r in found.select(
        "step", "lane", "start", "length", "token_offset", "file", "row_group", "row"
    ).iter_rows():
        doc = files[int(f[1:4])][g][r]
        assert batches[step][lane, start : start + length].tolist() == doc[doc_offset : doc_offset + length]


@pytest.mark.parametrize(("columns", "fill"), [({"w": 99}, 99), (["w"], 0)])
def test_aligned_columns_take_their_fill_after_the_end(tmp_path: Path, columns: Any, fill: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    docs = [list(range(s, s + n)) for s, n in ((1, 3), (10, 5), (20, 2), (30, 7), (40, 1))]
    table = pa.table({"tokens": docs, "w": [[t + 1000 for t in d] for d in docs]})
    pq.write_table(table, tmp_path / "part.parquet", row_group_size=2)
    for world in (1, 2):
        with plitzer.Loader(str(tmp_path), lanes=2, window=1, seq_len=4, epochs=1, columns=columns, world=world) as ld:
            batches = list(ld)
        last = batches[-1]
        tokens, w, mask = np.array(last.tokens), last.columns["w"], last.mask
        assert not mask.all() and (w[mask] == tokens[mask] + 1000).all() and (w[~mask] == fill).all()


def test_layout_stages_end_the_same_at_any_world(data: str) -> None:
    kw = {"seed": 2, "window": 2, "lanes": [(0, 8), (9, 4)], "seq_len": [(0, 32), (9, 64)], "epochs": 2}
    with plitzer.Loader(data, **kw) as one:
        want = [*_run(one), *_run(one)]
        assert len(want) == len(one) and one.ended
    real = np.concatenate([w[2][w[3]] for w in want])
    assert sorted(real.tolist()) == sorted(2 * list(range(one.tokens)))  # each token once an epoch
    parts = []
    for rank in range(4):
        with plitzer.Loader(data, **kw, world=4, rank=rank) as loader:
            parts.append([*_run(loader), *_run(loader)])
    for t, w in enumerate(want):
        assert np.array_equal(np.concatenate([p[t][2] for p in parts]), w[2])
