"""Best-fit packing (SPEC section 15) against an independent implementation (tests/bestfit_reference.py).

Random documents (empty, null, longer than L), row groups and files; worlds 1, 2 and 4;
a resume at another world; ``where=``; aligned columns; the checkpoint's configuration.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

import plitzer
from planner.errors import CheckpointError, ConfigError
from planner.rules.bestfit import best_fit
from planner.rules.binned import item_lengths
from tests.bestfit_reference import bins_of, lane_rows, mixture_rows, row, staged_rows
from tests.conftest import docs_by_row_group, write_dataset

SLOW = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@given(
    lengths=st.lists(st.integers(0, 40), min_size=0, max_size=30),
    seq_len=st.integers(1, 16),
)
@settings(max_examples=200, deadline=None)
def test_bins_are_the_reference_bins(lengths: list[int], seq_len: int) -> None:
    docs = [[1] * n for n in lengths]
    want = [[(r, o, n) for _, r, o, n in b] for b in bins_of(docs, 0, seq_len)]
    items = item_lengths(np.array(lengths, np.int64), seq_len)
    got_bin = best_fit(items.length, seq_len)
    got: list[list[tuple[int, int, int]]] = [[] for _ in range(int(got_bin.max()) + 1 if len(got_bin) else 0)]
    for i, b in enumerate(got_bin.tolist()):
        got[b].append((int(items.doc[i]), int(items.offset[i]), int(items.length[i])))
    assert got == want
    assert all(sum(n for _, _, n in b) <= seq_len for b in got)


docs_st = st.lists(
    st.one_of(
        st.none(), st.lists(st.integers(0, 999), min_size=0, max_size=3), st.lists(st.integers(0, 999), max_size=40)
    ),
    min_size=2,
    max_size=9,
)
dataset_st = st.lists(st.lists(docs_st, min_size=1, max_size=4), min_size=1, max_size=3)


def _tokens(files: list[list[list[list[int] | None]]]) -> int:
    return sum(len(d or []) for f in files for rg in f for d in rg)


def _expected(
    rg_docs: list[list[list[int]]], seed: int, lanes: int, window: int, seq_len: int, pad_id: int, steps: int
):
    n_bins = sum(len(bins_of(d, g, seq_len)) for g, d in enumerate(rg_docs))
    epochs = (steps * lanes) // max(n_bins, 1) + 2
    rows = lane_rows(rg_docs, seed, lanes, window, seq_len, epochs)
    out = []
    for t in range(steps):
        made = [row(rg_docs, rows[k][t][1], seq_len, pad_id) for k in range(lanes)]
        out.append(
            (
                np.array([m[0] for m in made]),
                np.array([m[1] for m in made]),
                [m[2] for m in made],
                (t * lanes) // n_bins,
            )
        )
    return out, n_bins


def _check(batch: plitzer.Batch, want, rank_rows: range) -> None:
    tokens, mask, segs, epoch = want
    np.testing.assert_array_equal(np.from_dlpack(batch.tokens), tokens[rank_rows.start : rank_rows.stop])
    np.testing.assert_array_equal(batch.mask, mask[rank_rows.start : rank_rows.stop])
    assert [d.tolist() for d in batch.doc_lengths] == segs[rank_rows.start : rank_rows.stop]
    assert batch.epoch == epoch


@given(
    files=dataset_st,
    seed=st.integers(0, 2**64 - 1),
    lanes=st.sampled_from([1, 2, 4]),
    window=st.integers(1, 3),
    seq_len=st.integers(1, 24),
    pad_id=st.integers(0, 5),
    world=st.sampled_from([1, 2, 4]),
)
@SLOW
def test_batches_are_the_reference_rows(
    tmp_path_factory: pytest.TempPathFactory, files, seed, lanes, window, seq_len, pad_id, world
) -> None:
    assume(_tokens(files) > 0 and lanes % world == 0)
    root = tmp_path_factory.mktemp("bf")
    write_dataset(root, files)
    rg_docs = docs_by_row_group(files)
    steps = 12
    want, n_bins = _expected(rg_docs, seed, lanes, window, seq_len, pad_id, steps)
    if n_bins < lanes:
        with pytest.raises(ConfigError):
            plitzer.Loader(root, seed=seed, lanes=lanes, window=window, seq_len=seq_len, packing="best-fit")
        return
    event(f"bins {min(n_bins // 10 * 10, 50)}+, world {world}")
    per = lanes // world
    for rank in range(world):
        kw = {
            "seed": seed,
            "lanes": lanes,
            "window": window,
            "seq_len": seq_len,
            "world": world,
            "rank": rank,
            "budget": 1 << 24,
        }
        with plitzer.Loader(root, packing="best-fit", pad_id=pad_id, **kw) as loader:
            for t in range(steps):
                _check(loader.next_batch(), want[t], range(rank * per, (rank + 1) * per))


@given(
    files=dataset_st,
    seed=st.integers(0, 1000),
    seq_len=st.integers(2, 24),
    at=st.integers(0, 9),
    worlds=st.sampled_from([(1, 2), (2, 4), (4, 1), (2, 1)]),
)
@SLOW
def test_resume_at_another_world(tmp_path_factory: pytest.TempPathFactory, files, seed, seq_len, at, worlds) -> None:
    lanes, window = 4, 2
    assume(_tokens(files) > 0)
    rg_docs = docs_by_row_group(files)
    steps = at + 5
    want, n_bins = _expected(rg_docs, seed, lanes, window, seq_len, 3, steps)
    assume(n_bins >= lanes)
    root = tmp_path_factory.mktemp("bfr")
    write_dataset(root, files)
    a, b = worlds
    kw = {
        "seed": seed,
        "lanes": lanes,
        "window": window,
        "seq_len": seq_len,
        "packing": "best-fit",
        "pad_id": 3,
        "budget": 1 << 24,
    }
    parts = []
    for rank in range(a):
        with plitzer.Loader(root, world=a, rank=rank, **kw) as loader:
            for _ in range(at):
                loader.next_batch()
            parts.append(loader.checkpoint())
    state = plitzer.merge(parts)
    per = lanes // b
    for rank in range(b):
        with plitzer.Loader(root, world=b, rank=rank, **kw) as loader:
            loader.resume(state)
            for t in range(at, steps):
                _check(loader.next_batch(), want[t], range(rank * per, (rank + 1) * per))


def test_where_bins_only_the_selected_rows(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    files = [[[list(rng.integers(0, 99, int(n))) for n in rng.integers(0, 30, 12)] for _ in range(5)] for _ in range(2)]
    write_dataset(tmp_path, files)
    kept = [[[d for r, d in enumerate(rg) if r % 3 != 1] for rg in f] for f in files]
    want, _ = _expected(docs_by_row_group(kept), 7, 4, 3, 16, 0, 10)
    with plitzer.Loader(tmp_path, seed=7, lanes=4, window=3, seq_len=16, packing="best-fit", where="n % 3 != 1") as ld:
        for t in range(10):
            _check(ld.next_batch(), want[t], range(4))


def test_aligned_columns_take_their_fill_on_padding(tmp_path: Path) -> None:
    docs = [[int(i) for i in range(n)] for n in (5, 3, 9, 2, 7, 1, 4)]
    table = pa.table(
        {
            "tokens": pa.array(docs, pa.list_(pa.int32())),
            "loss_mask": pa.array([[True] * len(d) for d in docs], pa.list_(pa.bool_())),
            "weight": pa.array([[0.5] * len(d) for d in docs], pa.list_(pa.float32())),
        }
    )
    pq.write_table(table, tmp_path / "a.parquet", row_group_size=4)
    with plitzer.Loader(
        tmp_path,
        lanes=2,
        window=2,
        seq_len=10,
        packing="best-fit",
        pad_id=9,
        columns={"loss_mask": False, "weight": -1.0},
    ) as loader:
        for _ in range(4):
            b = loader.next_batch()
            m = b.mask
            np.testing.assert_array_equal(b.columns["loss_mask"], m)  # True on every real token, the fill elsewhere
            np.testing.assert_array_equal(b.columns["weight"], np.where(m, 0.5, -1.0).astype(np.float32))
            assert (np.from_dlpack(b.tokens)[~m] == 9).all()
            docs_seen = b.documents()
            assert int(docs_seen["length"].sum()) == int(m.sum())
            assert int(docs_seen["loss_mask_sum"].sum()) == int(m.sum())


def test_packing_is_in_the_checkpoint(tmp_path: Path) -> None:
    write_dataset(tmp_path, [[[[1] * 7, [2] * 3, [3] * 12], [[4] * 5, [5] * 9]]])
    kw = {"lanes": 2, "window": 2, "seq_len": 8}
    with plitzer.Loader(tmp_path, packing="best-fit", pad_id=1, **kw) as a:
        a.next_batch()
        state = a.checkpoint()
        assert a.config["packing"] == "best-fit" and a.config["pad_id"] == 1
    with plitzer.Loader(tmp_path, **kw) as concat:
        assert "packing" not in concat.config  # concat's checkpoints are those of 0.5, byte for byte
        with pytest.raises(CheckpointError, match=r"packing: checkpoint .best-fit., loader .concat."):
            concat.resume(state)
    with plitzer.Loader(tmp_path, packing="best-fit", pad_id=2, **kw) as other:
        with pytest.raises(CheckpointError, match="pad_id: checkpoint 1, loader 2"):
            other.resume(state)


def test_bad_settings_are_refused_naming_the_fix(tmp_path: Path) -> None:
    write_dataset(tmp_path, [[[[1] * 7, [2] * 3, [3] * 12], [[4] * 5, [5] * 9]]])
    with pytest.raises(ConfigError, match="packing='first-fit' is not a packing rule"):
        plitzer.Loader(tmp_path, lanes=2, packing="first-fit")
    with pytest.raises(ConfigError, match="pad_id"):
        plitzer.Loader(tmp_path, lanes=2, packing="best-fit", pad_id=-1)
    with pytest.raises(ConfigError, match="plan tables of seq_len stages"):
        plitzer.plan(tmp_path, lanes=2, seq_len=[(0, 8), (3, 16)], packing="best-fit")


def test_torch_and_grain_carry_the_mask(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("grain")
    import plitzer.grain
    import plitzer.torch

    write_dataset(tmp_path, [[[[1] * 7, [2] * 3, [3] * 12, []], [[4] * 5, [5] * 9, None]]])
    kw = {"lanes": 2, "window": 2, "seq_len": 8, "packing": "best-fit", "pad_id": 6}
    with plitzer.Loader(tmp_path, **kw) as loader:
        want = [loader.next_batch() for _ in range(3)]
    ds = plitzer.torch.Dataset(tmp_path, **kw)
    for w, got in zip(want, ds, strict=False):
        assert got.mask.dtype == torch.bool
        np.testing.assert_array_equal(got.mask.numpy(), w.mask)
        np.testing.assert_array_equal(got.to("cpu").mask.numpy(), w.mask)
        assert not w.mask.all() or w.step > 0
    elements = list(plitzer.grain.Dataset(tmp_path, **kw))[:3]
    for w, el in zip(want, elements, strict=True):
        np.testing.assert_array_equal(el["mask"], w.mask)
        assert (el["segment_ids"][~w.mask] == 0).all() and (el["segment_ids"][w.mask] > 0).all()
        np.testing.assert_array_equal(el["tokens"][~w.mask], 6)
    with plitzer.Loader(tmp_path, lanes=2, window=2, seq_len=8) as concat:  # concat: all True, no key of its own
        b = concat.next_batch()
        assert b.mask.all() and b.mask.shape == b.tokens.shape
    concat_ds = plitzer.torch.Dataset(tmp_path, lanes=2, window=2, seq_len=8)
    tb = next(iter(concat_ds))
    assert bool(tb.mask.all()) and tuple(tb.mask.shape) == tuple(tb.tokens.shape)
    assert "mask" not in next(iter(plitzer.grain.Dataset(tmp_path, lanes=2, window=2, seq_len=8)))


@given(
    files=dataset_st,
    seed=st.integers(0, 1000),
    seq_len=st.integers(2, 24),
    at=st.integers(1, 7),
    lanes=st.sampled_from([(4, 2), (2, 4), (4, 4), (4, 6)]),
    live=st.booleans(),
)
@SLOW
def test_a_lanes_stage_cuts_the_rest_of_the_bins(
    tmp_path_factory: pytest.TempPathFactory, files, seed, seq_len, at, lanes, live
) -> None:
    assume(_tokens(files) > 0)
    rg_docs = docs_by_row_group(files)
    n_bins = sum(len(bins_of(d, g, seq_len)) for g, d in enumerate(rg_docs))
    assume(n_bins >= max(lanes))
    window, b0, b1 = 2, *lanes
    epochs = (at * b0) // n_bins + 12 // max(1, n_bins // b1) + 3
    want = staged_rows(rg_docs, seed, window, seq_len, lanes, at, epochs)[: at + 8]
    root = tmp_path_factory.mktemp("bfs")
    write_dataset(root, files)
    kw = {"seed": seed, "window": window, "seq_len": seq_len, "packing": "best-fit", "budget": 1 << 24}
    staged = {"lanes": b0} if live else {"lanes": [(0, b0), (at, b1)]}
    with plitzer.Loader(root, **staged, **kw) as loader:
        for t, rows in enumerate(want):
            if live and t == at:
                assert loader.set_layout(lanes=b1) == at
            b = loader.next_batch()
            made = [row(rg_docs, bn, seq_len, 0) for _, bn in rows]
            np.testing.assert_array_equal(np.from_dlpack(b.tokens), np.array([m[0] for m in made]))
            np.testing.assert_array_equal(b.mask, np.array([m[1] for m in made]))
            units = at * b0 + (t - at) * b1 if t >= at else t * b0
            assert b.epoch == units // n_bins


@given(
    a=dataset_st,
    b=dataset_st,
    seed=st.integers(0, 1000),
    seq_len=st.integers(2, 24),
    weights=st.sampled_from([(1, 1), (3, 1), (1, 2)]),
)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_a_mixture_interleaves_bins(tmp_path_factory: pytest.TempPathFactory, a, b, seed, seq_len, weights) -> None:
    assume(_tokens(a) > 0 and _tokens(b) > 0)
    root = tmp_path_factory.mktemp("bfm")
    write_dataset(root / "a", a)
    write_dataset(root / "b", b)
    docs = [docs_by_row_group(a), docs_by_row_group(b)]
    lanes, window, steps = 2, 2, 10
    n_bins = sum(len(bins_of(d, g, seq_len)) for src in docs for g, d in enumerate(src))
    assume(n_bins >= lanes)
    want = mixture_rows(docs, ["a", "b"], list(weights), seed, lanes, window, seq_len, steps)
    src = {"a": str(root / "a"), "b": str(root / "b")}
    kw = {"seed": seed, "lanes": lanes, "window": window, "seq_len": seq_len, "packing": "best-fit", "pad_id": 1}
    with plitzer.Loader(src, weights=dict(zip("ab", weights, strict=True)), budget=1 << 24, **kw) as loader:
        for t in range(steps):
            got = loader.next_batch()
            made = [row(docs[s], bn, seq_len, 1) for s, bn in (want[k][t] for k in range(lanes))]
            np.testing.assert_array_equal(np.from_dlpack(got.tokens), np.array([m[0] for m in made]))
            np.testing.assert_array_equal(got.mask, np.array([m[1] for m in made]))


def _chars(texts: list[str]) -> list[list[int]]:
    return [[ord(c) % 1000 for c in t] for t in texts]


_chars.tokenizer_id = "chars-mod-1000"  # type: ignore[attr-defined]


def test_text_sources_and_dedupe_bin_what_the_stream_holds(tmp_path: Path) -> None:
    rng = np.random.default_rng(11)
    words = ["alpha", "beta", "gamma", "delta", "pack", "bin", "row"]
    texts = [" ".join(rng.choice(words, int(n))) for n in rng.integers(0, 12, 90)]
    texts[40:50] = texts[:10]  # duplicates, dropped by dedupe="tokens"
    (tmp_path / "text").mkdir()
    pq.write_table(pa.table({"text": texts}), tmp_path / "text" / "a.parquet", row_group_size=15)
    tokens = _chars(texts)
    files = [[tokens[i : i + 15] for i in range(0, 90, 15)]]
    write_dataset(tmp_path / "tok", files)
    kw = {"seed": 3, "lanes": 4, "window": 2, "seq_len": 24, "packing": "best-fit", "pad_id": 0}
    want, _ = _expected(docs_by_row_group(files), 3, 4, 2, 24, 0, 12)
    with plitzer.Loader(tmp_path / "text", tokenizer=_chars, add_eos=False, **kw) as text:
        for t in range(12):
            _check(text.next_batch(), want[t], range(4))
    seen: set[tuple[int, ...]] = set()
    kept = [[[d for d in rg if not (tuple(d) in seen or seen.add(tuple(d)))] for rg in f] for f in files]
    want, _ = _expected(docs_by_row_group(kept), 3, 4, 2, 24, 0, 12)
    with plitzer.Loader(tmp_path / "tok", dedupe="tokens", **kw) as deduped:
        for t in range(12):
            _check(deduped.next_batch(), want[t], range(4))


def test_locate_and_explain_answer_under_best_fit(tmp_path: Path) -> None:
    import polars as pl

    rng = np.random.default_rng(2)
    files = [[[list(rng.integers(0, 99, int(n))) for n in rng.integers(0, 50, 20)] for _ in range(6)]]
    write_dataset(tmp_path, files)
    cfg = {"seed": 1, "lanes": 4, "window": 2, "seq_len": 32, "packing": "best-fit"}
    with plitzer.Loader(tmp_path, **cfg) as ld:
        run = [ld.next_batch().documents().with_columns(step=pl.lit(t, pl.Int64)) for t in range(40)]
    seen = pl.concat(run)
    for t in (0, 17, 39):
        got = plitzer.explain(tmp_path, t, **cfg)
        assert got.drop("step").equals(run[t].drop("batch_row", "step"))
    found = plitzer.locate(tmp_path, "n in (3, 11)", steps=40, **cfg)
    want = seen.filter(pl.col("row").is_in([3, 11]))
    cols = ["step", "lane", "start", "length", "row_group", "row", "token_offset", "epoch", "window_index"]
    assert found.height == want.height > 0
    assert found.select(cols).sort(cols).equals(want.select(cols).sort(cols))


def test_plan_tables_and_audit_show_bins_and_padding(tmp_path: Path) -> None:
    import planner
    from plitzer.audit import audit

    rng = np.random.default_rng(3)
    lens = rng.integers(1, 60, (8, 25))
    files = [[[[1] * int(n) for n in rg] for rg in lens]]
    write_dataset(tmp_path, files)
    p = planner.plan(tmp_path, lanes=4, window=2, seq_len=64, packing="best-fit")
    rg = p.row_groups(0)
    want_bins = [len(bins_of([[1] * int(n) for n in row], 0, 64)) for row in lens]
    got = rg.sort("row_group")
    assert got["bins"].to_list() == want_bins
    assert (got["padding"] == got["bins"] * 64 - got["tokens"]).all()
    lanes = p.lanes(0)
    assert lanes.columns[-3:] == ["bin_start", "bin_end", "padding"]
    assert int(lanes.select((pl_col("bin_end") - pl_col("bin_start")).sum()).item()) == sum(want_bins)
    # Each lane's padding: L less each bin's tokens over its cut of the window's bin stream (the reference's bins).
    fills = [[sum(n for *_, n in b) for b in bins_of([[1] * int(n) for n in row], 0, 64)] for row in lens]
    stream = {w: [] for w in range(p.windows)}
    for w, g in rg.sort("position").select("window_index", "row_group").iter_rows():
        stream[w] += fills[g]
    want_pad = [
        sum(64 - f for f in stream[w][a:b])
        for w, a, b in lanes.select("window_index", "bin_start", "bin_end").iter_rows()
    ]
    assert lanes["padding"].to_list() == want_pad and sum(want_pad) == int(got["padding"].sum())
    total = p.sql("select sum(padding) as p, sum(bins) as b from row_groups").row(0)
    assert total == (int(got["padding"].sum()), sum(want_bins))
    assert p.sql("select sum(padding) as p from lanes").row(0) == (int(got["padding"].sum()),)
    report = audit(tmp_path, lanes=4, window=2, seq_len=64, packing="best-fit")
    pad = report.tables["padding"].row(0, named=True)
    assert pad["bins"] == sum(want_bins) and pad["padding"] == int(got["padding"].sum())
    assert pad["floor_fraction"] <= pad["padding_fraction"] < 0.5
    assert "padding" in report.figures


def pl_col(name: str):
    import polars as pl

    return pl.col(name)


def test_the_command_line_takes_packing_and_pad_id(tmp_path: Path) -> None:
    import subprocess
    import sys

    write_dataset(tmp_path, [[[[1] * 7, [2] * 3, [3] * 12], [[4] * 5, [5] * 9]]])
    args = [sys.executable, "-m", "plitzer", "plan", str(tmp_path), "--lanes", "2", "--window", "2", "--seq-len", "8"]
    sql = ["--sql", "select sum(bins) b, sum(padding) p from row_groups"]
    out = subprocess.run(
        [*args, "--packing", "best-fit", "--pad-id", "3", *sql], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr
    assert "│ 5   ┆ 4   │" in out.stdout  # 3 + 2 bins of 8 tokens: 36 tokens, 4 of padding
    bad = subprocess.run([*args, "--packing", "first-fit"], capture_output=True, text=True, check=False)
    assert bad.returncode != 0 and "not a packing rule" in bad.stderr


def _many_row_groups(root: Path) -> None:
    rng = np.random.default_rng(8)
    write_dataset(root, [[[[1] * int(n) for n in rng.integers(0, 40, 9)] for _ in range(7)] for _ in range(2)])


def test_the_bins_pass_is_split_between_ranks_and_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import planner
    from plitzer.bestfit import counts as bins_pass

    _many_row_groups(tmp_path / "d")
    monkeypatch.setenv("PLITZER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(bins_pass, "CHUNK", 3)  # 14 row groups: chunks 0-2, 3-5, ..., 12-13
    ix = planner.index(tmp_path / "d")
    counted: list[int] = []
    real = bins_pass.count_chunk

    def spy(index: object, spec: object, first: int, end: int) -> np.ndarray:
        counted.append(first)
        return real(index, spec, first, end)

    monkeypatch.setattr(bins_pass, "count_chunk", spy)
    got = bins_pass.bin_counts(ix, bins_pass.BinSpec(16), threads=1, split=(1, 2))
    assert counted[0] == 6  # rank 1 of 2 starts at its half of the 5 chunks, then goes round
    assert sorted(counted) == [0, 3, 6, 9, 12]
    lengths = [[len(d) for d in rg] for rg in docs_by_row_group_of(tmp_path / "d")]
    assert got.tolist() == [len(bins_of([[1] * n for n in rg], 0, 16)) for rg in lengths]
    counted.clear()
    again = bins_pass.bin_counts(ix, bins_pass.BinSpec(16), threads=1, split=(0, 2))  # another rank: all cached
    assert counted == [] and again.tolist() == got.tolist()
    bins_pass.bin_counts(ix, bins_pass.BinSpec(17), threads=1)  # another seq_len: counted again
    assert sorted(counted) == [0, 3, 6, 9, 12]


def docs_by_row_group_of(root: Path) -> list[list[list[int]]]:
    out = []
    for f in sorted(root.glob("*.parquet")):
        pf = pq.ParquetFile(f)
        out += [[d or [] for d in pf.read_row_group(g).column("tokens").to_pylist()] for g in range(pf.num_row_groups)]
    return out


@pytest.mark.ray
@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_bins_pass_runs_on_ray_ahead_of_the_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import planner
    from plitzer.bestfit import counts as bins_pass
    from tests.share_fixtures import ray_with_caches

    _many_row_groups(tmp_path / "d")
    monkeypatch.setattr(bins_pass, "CHUNK", 4)
    with ray_with_caches(tmp_path, monkeypatch):
        ix = planner.index(tmp_path / "d")
        assert bins_pass.bins_on_ray(ix, bins_pass.BinSpec(16), source=str(tmp_path / "d")) == 4
    monkeypatch.setattr(bins_pass, "count_chunk", lambda *a: pytest.fail("counted again: not cached"))
    got = bins_pass.bin_counts(ix, bins_pass.BinSpec(16))
    monkeypatch.undo()
    monkeypatch.setenv("PLITZER_CACHE", str(tmp_path / "fresh"))
    assert bins_pass.bin_counts(planner.index(tmp_path / "d"), bins_pass.BinSpec(16)).tolist() == got.tolist()


def test_a_mixture_file_takes_packing_and_pad_id(tmp_path: Path) -> None:
    import subprocess
    import sys

    write_dataset(tmp_path / "a", [[[[1] * 7, [2] * 3, [3] * 12], [[4] * 5, [5] * 9]]])
    write_dataset(tmp_path / "b", [[[[6] * 30, [7] * 2]]])
    mix = tmp_path / "mix.toml"
    mix.write_text(
        f'packing = "best-fit"\npad_id = 3\n[sources.a]\npath = "{tmp_path / "a"}"\nweight = 1\n'
        f'[sources.b]\npath = "{tmp_path / "b"}"\nweight = 1\n'
    )
    args = [sys.executable, "-m", "plitzer", "plan", "--mixture", str(mix), "--lanes", "2", "--window", "2"]
    sql = ["--sql", "select sum(bins) b from index"]
    out = subprocess.run([*args, "--seq-len", "8", *sql], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert "│ 9   │" in out.stdout  # a: 3 + 2 bins; b: items 8, 8, 8, 6 and 2 (with the 6): 4 bins
    mix.write_text(mix.read_text().replace("pad_id = 3", 'pad_id = "three"'))
    bad = subprocess.run([*args, "--seq-len", "8", *sql], capture_output=True, text=True, check=False)
    assert bad.returncode != 0 and "pad_id" in bad.stderr and "integer" in bad.stderr


def test_a_stage_that_repeats_the_layout_changes_nothing(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    write_dataset(tmp_path, [[[list(rng.integers(0, 99, int(n))) for n in rng.integers(0, 40, 15)] for _ in range(6)]])
    kw = {"seed": 5, "window": 2, "seq_len": 24, "packing": "best-fit", "budget": 1 << 24}
    with plitzer.Loader(tmp_path, lanes=4, **kw) as plain:
        want = [np.from_dlpack(plain.next_batch().tokens).copy() for _ in range(30)]
    with plitzer.Loader(tmp_path, lanes=[(0, 4), (7, 4)], **kw) as staged:
        assert all(np.array_equal(np.from_dlpack(staged.next_batch().tokens), w) for w in want)
    with plitzer.Loader(tmp_path, lanes=4, **kw) as live:
        for t, w in enumerate(want):
            if t == 11:
                live.set_layout(lanes=4)
            assert np.array_equal(np.from_dlpack(live.next_batch().tokens), w), t


def test_live_weights_under_best_fit_equal_the_stages_given_up_front(tmp_path: Path) -> None:
    rng = np.random.default_rng(6)
    for name in ("a", "b"):
        write_dataset(tmp_path / name, [[[list(rng.integers(0, 99, int(n))) for n in rng.integers(1, 30, 12)]] * 6])
    src = {"a": str(tmp_path / "a"), "b": str(tmp_path / "b")}
    kw = {"seed": 2, "lanes": 4, "window": 2, "seq_len": 32, "packing": "best-fit", "budget": 1 << 24}
    with plitzer.Loader(src, weights={"a": 1, "b": 1}, **kw) as live:
        got = [np.from_dlpack(live.next_batch().tokens).copy() for _ in range(6)]
        start = live.set_weights({"a": 3, "b": 1})
        got += [np.from_dlpack(live.next_batch().tokens).copy() for _ in range(start + 10 - 6)]
    with plitzer.Loader(src, weights=[(0, {"a": 1, "b": 1}), (start, {"a": 3, "b": 1})], **kw) as given:
        want = [np.from_dlpack(given.next_batch().tokens).copy() for _ in range(len(got))]
    assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
    assert len(got) >= 10  # steps after the stage's first


def test_the_bins_pass_reads_a_length_column_instead_of_the_tokens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from plitzer.bestfit import counts as bins_pass

    rng = np.random.default_rng(9)
    docs = [list(rng.integers(0, 99, int(n))) for n in rng.integers(0, 50, 60)]
    table = pa.table({"tokens": pa.array(docs, pa.list_(pa.int32())), "n": pa.array([len(d) for d in docs])})
    pq.write_table(table, tmp_path / "a.parquet", row_group_size=20)
    kw = {"lanes": 2, "window": 2, "seq_len": 32, "packing": "best-fit"}
    with plitzer.Loader(tmp_path, **kw) as ld:
        want = [np.from_dlpack(ld.next_batch().tokens).copy() for _ in range(8)]
    monkeypatch.setenv("PLITZER_CACHE", str(tmp_path / "fresh"))
    read: list[int] = []
    real = bins_pass.read_chunk
    monkeypatch.setattr(bins_pass, "read_chunk", lambda ix, g: read.append(g) or real(ix, g))
    with plitzer.Loader(tmp_path, length_column="n", **kw) as ld:
        got = [np.from_dlpack(ld.next_batch().tokens).copy() for _ in range(8)]
    assert read == []  # the pass read the length column, not the token lists
    assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))


def test_the_audit_draws_a_mixtures_padding_per_source(tmp_path: Path) -> None:
    from plitzer.audit import audit

    rng = np.random.default_rng(12)
    for name, high in (("short", 20), ("long", 60)):
        write_dataset(tmp_path / name, [[[[1] * int(n) for n in rng.integers(1, high, 30)] for _ in range(4)]])
    src = {"short": str(tmp_path / "short"), "long": str(tmp_path / "long")}
    report = audit(src, lanes=2, window=2, seq_len=64, packing="best-fit")
    per_source = report.tables["padding_per_source"].sort("source")
    assert per_source["source"].to_list() == ["long", "short"]
    assert (per_source["floor_fraction"] <= per_source["padding_fraction"]).all()
    assert "padding_per_source" in report.figures and report.png("padding_per_source")[:4] == b"\x89PNG"
    page = report.html()  # the page shows the section, its note and both pictures
    assert "<h2>Padding (best-fit)</h2>" in page and "alt='padding_per_source'" in page and "alt='padding'" in page
