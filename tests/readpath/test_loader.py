"""The loader against the spec: a naive reference model, resume, worlds, budget."""

from __future__ import annotations

import contextlib
import itertools
import warnings
from pathlib import Path
from unittest import mock

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import plitzer
from plitzer.loader import budget_floor
from plitzer.readpath.budget import Budget, Charge
from tests.conftest import SynthDataset, docs_by_row_group, numbered_dataset, tokens_of, write_dataset
from tests.reference import lane_streams

doc_len = st.one_of(st.integers(0, 30), st.integers(0, 400)).filter(lambda n: True)
row_group = st.lists(doc_len, min_size=0, max_size=6)
dataset = st.lists(st.lists(row_group, min_size=0, max_size=4), min_size=1, max_size=3)
config = st.fixed_dictionaries(
    {
        "seed": st.integers(0, 2**64 - 1) | st.integers(0, 3),
        "lanes": st.sampled_from([1, 2, 4, 8, 16]),
        "window": st.integers(1, 5),
        "seq_len": st.integers(1, 64),
    }
)


def _run(loader: plitzer.Loader, steps: int) -> list[np.ndarray]:
    return [tokens_of(loader.next_batch()).copy() for _ in range(steps)]


def _expected(docs: list[list[list[int]]], cfg: dict[str, int], epochs: int) -> tuple[np.ndarray, int]:
    streams = lane_streams(docs, cfg["seed"], cfg["lanes"], cfg["window"], epochs)
    steps = min(len(s) for s in streams) // cfg["seq_len"]
    n = steps * cfg["seq_len"]
    toks = np.array([[t for t, *_ in s[:n]] for s in streams], dtype=np.int64).reshape(cfg["lanes"], n)
    return toks, steps


@given(lengths=dataset, cfg=config)
def test_matches_reference_model(tmp_path_factory: pytest.TempPathFactory, lengths, cfg) -> None:
    """Every batch equals the naive implementation of SPEC section 3, over 3 epochs."""
    total = sum(n for f in lengths for rg in f for n in rg)
    assume(total >= cfg["lanes"])
    root = tmp_path_factory.mktemp("ds")
    files = numbered_dataset(root, lengths)
    docs = docs_by_row_group(files)
    want, steps = _expected(docs, cfg, epochs=3)
    assume(steps > 0)
    steps = min(steps, 60)
    with plitzer.Loader(root, budget=1 << 30, **cfg) as loader:
        got = _run(loader, steps)
    for t, batch in enumerate(got):
        L = cfg["seq_len"]
        np.testing.assert_array_equal(batch, want[:, t * L : (t + 1) * L], err_msg=f"step {t}")


@given(lengths=dataset, cfg=config, data=st.data())
def test_a_packed_unit_holds_at_most_its_charge(tmp_path_factory, lengths, cfg, data) -> None:
    """The charge a unit starts with (plitzer.readpath.cost.unit_estimate) bounds what it holds once packed.

    Empty documents, windows of fewer tokens than lanes (empty lanes), row groups with no
    row and a rank's share of the lanes included: the budget's guarantee rests on it.
    """
    total = sum(n for f in lengths for rg in f for n in rg)
    assume(total >= cfg["lanes"])
    root = tmp_path_factory.mktemp("ds")
    numbered_dataset(root, lengths)
    world = data.draw(st.sampled_from([w for w in (1, 2, 4) if cfg["lanes"] % w == 0]))
    settled: list[tuple[int, int]] = []
    settle = Budget.settle

    def checked(self: Budget, c: Charge, nbytes: int) -> None:
        settled.append((c.nbytes, nbytes))
        settle(self, c, nbytes)

    with mock.patch.object(Budget, "settle", checked):
        with plitzer.Loader(root, budget=1 << 30, rank=world - 1, world=world, **cfg) as loader:
            for _ in range(min(3 * len(loader), 200)):
                loader.next_batch()
    assert settled and all(held <= charged for charged, held in settled), settled


@given(lengths=dataset, cfg=config, data=st.data())
def test_same_global_batch_at_every_world(tmp_path_factory, lengths, cfg, data) -> None:
    total = sum(n for f in lengths for rg in f for n in rg)
    assume(total >= cfg["lanes"])
    root = tmp_path_factory.mktemp("ds")
    files = numbered_dataset(root, lengths)
    _, steps = _expected(docs_by_row_group(files), cfg, epochs=2)
    assume(steps > 0)
    steps = min(steps, 20)
    with plitzer.Loader(root, **cfg) as one:
        full = _run(one, steps)
    world = data.draw(st.sampled_from([w for w in (2, 4, 8) if cfg["lanes"] % w == 0] or [1]))
    parts = []
    for rank in range(world):
        with plitzer.Loader(root, rank=rank, world=world, **cfg) as ld:
            parts.append(_run(ld, steps))
    for t in range(steps):
        np.testing.assert_array_equal(np.concatenate([p[t] for p in parts]), full[t])


@pytest.fixture(scope="module")
def synth_dir(synth_dataset: SynthDataset) -> Path:
    d = synth_dataset(tokens=300_000, seed=5, docs_per_row_group=40, row_groups_per_file=4, mean_length=150)
    return d


CFG = {"seed": 3, "lanes": 8, "window": 3, "seq_len": 96}


def test_every_sequence_full_and_each_document_once_per_epoch(synth_dir: Path) -> None:
    """Per lane, each document appears exactly once per epoch of its stream, whole."""
    ix = plitzer.index(synth_dir)
    with plitzer.Loader(synth_dir, **CFG) as loader:
        frames = []
        while loader.epoch < 2:
            for batch in loader:
                assert tokens_of(batch).shape == (8, 96)
                assert all(int(x.sum()) == 96 for x in batch.doc_lengths)
                frames.append(batch.documents())
    import polars as pl

    pieces = pl.concat(frames)
    # Per (epoch, document): its pieces, in any lanes, tile the document exactly once:
    # sorted by offset, each starts where the previous ended, from 0.
    tiled = (
        pieces.sort("token_offset")
        .group_by(["epoch", "file", "row_group", "row"])
        .agg(
            pl.col("length").sum(),
            pl.col("lane").n_unique().alias("lanes"),
            ((pl.col("token_offset") - (pl.col("token_offset") + pl.col("length")).shift(1).fill_null(0)) != 0)
            .sum()
            .alias("gaps"),
        )
    )
    # Epochs 0 and 1 of every lane's stream were consumed whole (the last step of
    # epoch 1 reaches past them); epoch 2 has only begun.
    for epoch in (0, 1):
        done = tiled.filter(pl.col("epoch") == epoch)
        assert done["gaps"].max() == 0
        assert done.height == int((ix.frame["rows"]).sum())
        assert int(done["length"].sum()) == int(ix.frame["tokens"].sum())
    assert tiled["lanes"].max() > 1  # some documents were cut between lanes


def test_resume_at_every_step_equals_uninterrupted(synth_dir: Path) -> None:
    steps = 40
    with plitzer.Loader(synth_dir, **CFG) as loader:
        states = []
        batches = []
        for _ in range(steps):
            states.append(loader.checkpoint())
            batches.append(tokens_of(loader.next_batch()).copy())
    for k in range(0, steps, 3):
        with plitzer.Loader(synth_dir, **CFG) as again:
            again.resume(states[k])
            assert again.step == k
            for t in range(k, min(steps, k + 4)):
                np.testing.assert_array_equal(tokens_of(again.next_batch()), batches[t])


@pytest.mark.parametrize(("world_a", "world_b"), [(1, 2), (2, 4), (4, 1), (8, 2), (2, 8)])
def test_resume_in_another_world(synth_dir: Path, world_a: int, world_b: int) -> None:
    k, steps = 17, 30
    with plitzer.Loader(synth_dir, **CFG) as ref:
        full = [tokens_of(ref.next_batch()).copy() for _ in range(steps)]
    with contextlib.ExitStack() as stack:
        loaders = [stack.enter_context(plitzer.Loader(synth_dir, rank=r, world=world_a, **CFG)) for r in range(world_a)]
        for _ in range(k):
            for ld in loaders:
                ld.next_batch()
        state = plitzer.merge([ld.checkpoint() for ld in loaders])
    with contextlib.ExitStack() as stack:
        resumed = [stack.enter_context(plitzer.Loader(synth_dir, rank=r, world=world_b, **CFG)) for r in range(world_b)]
        for ld in resumed:
            ld.resume(state)
        for t in range(k, steps):
            got = np.concatenate([tokens_of(ld.next_batch()) for ld in resumed])
            np.testing.assert_array_equal(got, full[t])
        # Resuming twice in a row works and changes nothing.
        resumed[0].resume(state)
        resumed[0].resume(state)
        assert resumed[0].step == k


def test_merge_refuses_bad_parts(synth_dir: Path) -> None:
    with (
        plitzer.Loader(synth_dir, rank=0, world=2, **CFG) as a,
        plitzer.Loader(synth_dir, rank=1, world=2, **CFG) as b,
        plitzer.Loader(synth_dir, rank=1, world=2, **{**CFG, "seed": 4}) as other,
    ):
        with pytest.raises(plitzer.CheckpointError, match="miss lanes"):
            plitzer.merge([a.checkpoint()])
        with pytest.raises(plitzer.CheckpointError, match="overlap"):
            plitzer.merge([a.checkpoint(), a.checkpoint(), b.checkpoint()])
        a.next_batch()
        with pytest.raises(plitzer.CheckpointError, match="step: part 0 1, part 1 0"):
            plitzer.merge([a.checkpoint(), b.checkpoint()])
        other.next_batch()
        with pytest.raises(plitzer.CheckpointError, match="seed: part 0 3, part 1 4"):
            plitzer.merge([a.checkpoint(), other.checkpoint()])


def test_resume_refuses_other_settings_naming_every_field(synth_dir: Path, tmp_path: Path) -> None:
    with plitzer.Loader(synth_dir, **CFG) as a:
        state = a.checkpoint()
    with (
        plitzer.Loader(synth_dir, **{**CFG, "seed": 9, "seq_len": 64}) as b,
        pytest.raises(plitzer.CheckpointError) as err,
    ):
        b.resume(state)
    assert "seed: checkpoint 3, loader 9" in str(err.value)
    assert "seq_len: checkpoint 96, loader 64" in str(err.value)
    other = tmp_path / "other"
    plitzer.synth.write(other, tokens=50_000, seed=1, docs_per_row_group=40)
    with plitzer.Loader(other, **CFG) as c, pytest.raises(plitzer.CheckpointError, match="fingerprint"):
        c.resume(state)


def test_resume_with_a_part_that_lacks_my_lanes(synth_dir: Path) -> None:
    with plitzer.Loader(synth_dir, rank=0, world=2, **CFG) as a:
        part = a.checkpoint()
    with plitzer.Loader(synth_dir, rank=1, world=2, **CFG) as b:
        with pytest.raises(plitzer.CheckpointError, match="lacks lanes"):
            b.resume(part)
    with plitzer.Loader(synth_dir, rank=1, world=4, **CFG) as c:
        c.resume(part)  # lanes 2, 3 are in rank 0 of 2's part
        assert c.step == 0


def test_epochs_and_len(synth_dir: Path) -> None:
    with plitzer.Loader(synth_dir, **CFG) as loader:
        T = loader.tokens
        per = 8 * 96
        n0 = len(loader)
        assert n0 == -(-T // per)
        got = list(loader)
        assert len(got) == n0 and all(b.epoch == 0 for b in got)
        assert loader.epoch == 1 and loader.step == n0
        got1 = list(loader)
        assert all(b.epoch == 1 for b in got1)
        assert got1[0].step == n0
        # Steps follow floor(t * B * L / T).
        assert all(b.epoch == b.step * per // T for b in itertools.chain(got, got1))


def test_budget_is_respected_and_too_small_is_an_error(synth_dir: Path) -> None:
    ix = plitzer.index(synth_dir)
    with pytest.raises(plitzer.ConfigError, match="budget=1,000 bytes cannot hold the windows one step can touch"):
        plitzer.Loader(ix, budget=1000, **CFG)
    frame = ix.frame
    need, units = budget_floor(
        frame["tokens"].to_numpy(), frame["rows"].to_numpy(), lanes=8, window=3, seq_len=CFG["seq_len"]
    )
    assert units >= 2
    with pytest.raises(plitzer.ConfigError, match=f"at least {need:,}"):
        plitzer.Loader(ix, budget=need - 1, **CFG)
    inflight, _ = budget_floor(
        frame["tokens"].to_numpy(), frame["rows"].to_numpy(), lanes=8, window=3, seq_len=CFG["seq_len"], ahead=1
    )
    assert inflight > need
    # At the floor it works, and says once what two windows in flight need.
    with pytest.warns(plitzer.PerformanceWarning, match=f"at least {inflight:,} bytes for two windows in flight"):
        plitzer.Loader(ix, budget=need, **CFG).close()
    # At the floor itself, and at a budget with room to prefetch: never past it.
    for budget in (need, inflight, 3 * need):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore" if budget < inflight else "error", plitzer.PerformanceWarning)
            loader = plitzer.Loader(ix, budget=budget, **CFG)
        with loader:
            for _ in range(len(loader) + 10):
                loader.next_batch()
                assert loader.held_bytes <= budget
            assert 0 < loader.peak_bytes <= budget
            assert loader.stats.overruns == 0


def test_a_selection_that_empties_most_windows_needs_the_budget_of_those_with_data(tmp_path: Path) -> None:
    """A predicate that keeps rows in 1 row group of 20: the empty windows between cost their lane tables only.

    The floor counted every window inside a step as holding the largest row groups, and
    asked for twice the whole selection; now the two windows at a step's ends (4 of the 20
    row groups with data each), and a run at that floor never passes it.
    """
    rng = np.random.default_rng(3)
    for f in range(2):
        with pq.ParquetWriter(
            tmp_path / f"f{f}.parquet", pa.schema([("tokens", pa.list_(pa.int32())), ("lang", pa.string())])
        ) as w:
            for g in range(200):
                lens = rng.integers(100, 400, 20)
                docs = pa.array([np.arange(n, dtype=np.int32) + 1000 * g for n in lens], pa.list_(pa.int32()))
                w.write_table(pa.table({"tokens": docs, "lang": ["en" if g % 20 == 0 else "fr"] * 20}))
    cfg = {"lanes": 4, "seq_len": 256, "window": 4, "seed": 2, "where": "lang = 'en'"}
    with plitzer.Loader(tmp_path, budget=1 << 30, **cfg) as big:
        frame = big.plan.dataset.frame
        want = [tokens_of(big.next_batch()).copy() for _ in range(3 * len(big))]
    tok, rows = frame["tokens_selected"].to_numpy(), frame["rows_selected"].to_numpy()
    assert (tok > 0).sum() == 20 and len(tok) == 400
    need, units = budget_floor(tok, rows, lanes=4, window=4, seq_len=256)
    assert units > 2  # a step spans the empty windows between two with data
    whole_selection = int((8 * tok + 48 * rows).sum())  # decoded and packed, every selected row group
    assert need < whole_selection / 2
    with pytest.raises(plitzer.ConfigError, match=f"at least {need:,}"):
        plitzer.Loader(tmp_path, budget=need - 1, **cfg)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", plitzer.PerformanceWarning)
        loader = plitzer.Loader(tmp_path, budget=need, **cfg)
    with loader:
        for t, expected in enumerate(want):
            np.testing.assert_array_equal(tokens_of(loader.next_batch()), expected, err_msg=f"step {t}")
            assert loader.held_bytes <= need
        assert loader.stats.overruns == 0


def test_bad_settings_name_field_value_and_fix(synth_dir: Path) -> None:
    cases = [
        ({"lanes": 6, "world": 4}, "lanes=6 is not divisible by world=4"),
        ({"seq_len": 0}, "seq_len=0 must be >= 1"),
        ({"rank": 2, "world": 2}, "rank=2 is out of range for world=2"),
        ({"window": 0}, "window=0 must be >= 1"),
        ({"lanes": 10**9}, "exceeds the dataset"),
    ]
    for kw, text in cases:
        with pytest.raises(plitzer.ConfigError, match=text):
            plitzer.Loader(synth_dir, **kw)
        with pytest.raises(ValueError):
            plitzer.Loader(synth_dir, **kw)


def test_uint32_and_large_list(tmp_path: Path) -> None:
    docs = [[[[1, 2, 3], [4_000_000_000, 5], []], [[6] * 10]]]
    write_dataset(tmp_path / "u", docs, dtype="uint32", large=True)
    with plitzer.Loader(tmp_path / "u", lanes=1, window=2, seq_len=4, seed=0) as ld:
        b = ld.next_batch()
        assert tokens_of(b).dtype == np.uint32
        assert 4_000_000_000 in set(tokens_of(b).ravel().tolist()) | set(tokens_of(ld.next_batch()).ravel().tolist())


def test_null_token_inside_a_document_names_file_row_group_row(tmp_path: Path) -> None:
    write_dataset(tmp_path / "n", [[[[1, 2], [3, 4]], [[5, None, 6]]]])  # type: ignore[list-item]
    with pytest.raises(plitzer.DataError, match=r"f000\.parquet, row group 1, row 0: a null token"):
        with plitzer.Loader(tmp_path / "n", lanes=1, window=2, seq_len=2) as ld:
            for _ in range(5):
                ld.next_batch()


def test_one_document_per_window_feeds_every_lane(tmp_path: Path) -> None:
    """Under the first lane rule only lane 0 ever got a document here; now lanes share it."""
    write_dataset(tmp_path / "s", [[[list(range(100))] for _ in range(3)]])
    with plitzer.Loader(tmp_path / "s", lanes=4, window=1, seq_len=10) as ld:
        batches = [tokens_of(ld.next_batch()).copy() for _ in range(len(ld))]
    lanes = np.concatenate(batches, axis=1)
    assert lanes.shape == (4, 80)  # 300 tokens, 40 per step: 7.5 steps per epoch, 8 taken
    # Every lane got a quarter of each 100-token document, in order within its piece.
    assert all(np.all(np.diff(lanes[k, :25]) == 1) for k in range(4))
    assert sorted(int(lanes[k, 0]) for k in range(4)) == [0, 25, 50, 75]


def test_dlpack_and_arrow_zero_copy(synth_dir: Path) -> None:
    import pyarrow as pa
    import torch

    with plitzer.Loader(synth_dir, **CFG) as ld:
        b = ld.next_batch()
    a = np.from_dlpack(b.tokens)
    t = torch.from_dlpack(b.tokens)
    arr = pa.array(b.tokens)
    assert isinstance(arr, pa.FixedSizeListArray) and arr.type.list_size == 96 and len(arr) == 8
    assert t.shape == (8, 96) and t.dtype == torch.int32
    assert a.ctypes.data == t.data_ptr() == b.tokens.numpy().ctypes.data
    assert arr.values.buffers()[1].address == a.ctypes.data
    assert arr.to_pylist()[3] == a[3].tolist()


def test_position_ids_and_cu_seqlens_agree(synth_dir: Path) -> None:
    with plitzer.Loader(synth_dir, **CFG) as ld:
        for _ in range(5):
            b = ld.next_batch()
            cu = b.cu_seqlens
            assert cu[0] == 0 and cu[-1] == 8 * 96 and np.all(np.diff(cu) > 0)
            pos = b.position_ids.ravel()
            starts = np.flatnonzero(pos == 0)
            np.testing.assert_array_equal(starts, cu[:-1])
            assert b.position_ids.dtype == np.int32 and b.position_ids.shape == b.tokens.shape
            np.testing.assert_array_equal(pos, np.concatenate([np.arange(n) for n in np.diff(cu)]))
            assert b.max_seqlen == int(np.diff(cu).max())


def test_kept_batches_and_their_exports_are_never_overwritten(synth_dir: Path) -> None:
    """A window's block is reused (by the allocator) only when no batch view of it is alive."""
    import pyarrow as pa
    import torch

    kept: list[tuple[object, np.ndarray]] = []
    with plitzer.Loader(synth_dir, **CFG) as ld:
        for i in range(24):
            b = ld.next_batch()
            snapshot = tokens_of(b).copy()
            holder: object = (
                b
                if i % 4 == 0
                else torch.from_dlpack(b.tokens)
                if i % 4 == 1
                else pa.array(b.tokens)
                if i % 4 == 2
                else None
            )
            if holder is not None:
                kept.append((holder, snapshot))
            del b
        for holder, snapshot in kept:
            if isinstance(holder, torch.Tensor):
                np.testing.assert_array_equal(holder.numpy(), snapshot)
            elif isinstance(holder, pa.Array):
                np.testing.assert_array_equal(np.stack(holder.to_numpy(zero_copy_only=False)), snapshot)
            else:
                np.testing.assert_array_equal(tokens_of(holder), snapshot)
        # The kept views hold their windows: charged to the caller, not overwritten.
        assert ld.stats.held_by_caller_bytes > 0
        assert ld.stats.held_bytes <= ld.stats.budget
