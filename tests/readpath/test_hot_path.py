"""The hot path: a step's batch is a view of its window's block, never overwritten, always counted."""

from __future__ import annotations

import gc
import random
from pathlib import Path

import numpy as np
import pytest

import plitzer
import plitzer.state.checkpoint
from tests.conftest import SynthDataset, docs_by_row_group, numbered_dataset, tokens_of
from tests.reference import lane_streams

CFG = {"seed": 7, "lanes": 8, "window": 2, "seq_len": 32}


@pytest.fixture(scope="module")
def numbered(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[list[list[int]]]]:
    """Documents whose tokens number them: a batch shows exactly which tokens it holds."""
    rng = random.Random(11)
    lengths = [[[rng.choice([0, 3, 40, 90, 200, 700]) for _ in range(12)] for _ in range(5)] for _ in range(3)]
    root = tmp_path_factory.mktemp("numbered")
    files = numbered_dataset(root, lengths)
    return root, docs_by_row_group(files)


def _reference(docs: list[list[list[int]]], steps: int, epochs: int) -> np.ndarray:
    streams = lane_streams(docs, CFG["seed"], CFG["lanes"], CFG["window"], epochs)
    L = CFG["seq_len"]
    return np.array([[t for t, *_ in s[: steps * L]] for s in streams]).reshape(CFG["lanes"], steps, L)


def test_every_batch_of_two_epochs_kept_without_a_copy_is_never_overwritten(numbered) -> None:
    """Keep every batch (NumPy views and torch tensors through DLPack), then compare with the
    naive reference after the run: no block was reused while a view of it was alive."""
    torch = pytest.importorskip("torch")
    root, docs = numbered
    kept: list[object] = []
    with plitzer.Loader(root, budget=1 << 30, **CFG) as loader:
        while loader.epoch < 2:
            kept.extend(torch.from_dlpack(b.tokens) if b.step % 2 else np.from_dlpack(b.tokens) for b in loader)
        held = loader.stats
        assert held.held_by_caller_bytes > 0  # the kept views hold released windows
        assert held.overruns == 0
    want = _reference(docs, len(kept), epochs=3)
    for t, got in enumerate(kept):
        arr = got.numpy() if isinstance(got, torch.Tensor) else got
        np.testing.assert_array_equal(arr, want[:, t], err_msg=f"step {t}")


def test_steps_inside_a_window_are_views_of_one_block(synth_dataset: SynthDataset) -> None:
    """Consecutive steps of one window share one buffer: the step makes no copy."""
    d = synth_dataset(tokens=200_000, seed=3, docs_per_row_group=50, row_groups_per_file=4, mean_length=120)
    with plitzer.Loader(d, seed=1, lanes=4, window=4, seq_len=64) as loader:
        a, b = loader.next_batch(), loader.next_batch()
        x, y = tokens_of(a), tokens_of(b)
        assert y.ctypes.data - x.ctypes.data == x.nbytes  # the next step's rows follow this one's


def test_released_windows_are_uncharged_when_their_last_view_goes(synth_dataset: SynthDataset) -> None:
    d = synth_dataset(tokens=200_000, seed=3, docs_per_row_group=50, row_groups_per_file=4, mean_length=120)
    with plitzer.Loader(d, seed=1, lanes=4, window=2, seq_len=64) as loader:
        first = loader.next_batch()
        view = tokens_of(first)
        snapshot = view.copy()
        del first
        for _ in range(len(loader) - 1):
            loader.next_batch()
        assert loader.stats.held_by_caller_bytes > 0  # the first window: released, but viewed
        np.testing.assert_array_equal(view, snapshot)
        del view
        gc.collect()
        assert loader.stats.held_by_caller_bytes == 0
        assert loader.stats.held_bytes <= loader.stats.budget


def test_holding_batches_past_the_budget_slows_reads_but_never_corrupts(numbered) -> None:
    """At the budget floor, kept batches hold windows past the budget: the loader still
    starts the windows a step needs (counted as caller overruns), and every batch is right."""
    root, docs = numbered
    ix = plitzer.index(root)
    shape = {k: CFG[k] for k in ("lanes", "window", "seq_len")}
    floor, _ = plitzer.loader.budget_floor(ix.frame["tokens"].to_numpy(), ix.frame["rows"].to_numpy(), **shape)
    with pytest.warns(plitzer.PerformanceWarning):
        loader = plitzer.Loader(root, budget=floor, **CFG)
    with loader:
        kept = [tokens_of(batch) for batch in loader]
        stats = loader.stats
    assert stats.overruns == 0 and stats.caller_overruns > 0
    want = _reference(docs, len(kept), epochs=2)
    for t, got in enumerate(kept):
        np.testing.assert_array_equal(got, want[:, t], err_msg=f"step {t}")


def test_no_checkpoint_is_encoded_per_step(numbered, monkeypatch: pytest.MonkeyPatch) -> None:
    """The torch Dataset encodes a checkpoint when one is asked for, not on every step."""
    pytest.importorskip("torch")
    import plitzer.torch

    root, _ = numbered
    calls = {"n": 0}
    real = plitzer.state.checkpoint.encode

    def counting(state: plitzer.state.checkpoint.State) -> bytes:
        calls["n"] += 1
        return real(state)

    monkeypatch.setattr(plitzer.state.checkpoint, "encode", counting)
    ds = plitzer.torch.Dataset(root, **CFG)
    batches = [ds.next_batch() for _ in range(30)]
    assert calls["n"] == 0
    after = batches[10].state_after  # encoded now, for step 11
    assert calls["n"] == 1 and plitzer.state.checkpoint.decode(after).step == 11
    with plitzer.Loader(root, **CFG) as fresh:
        fresh.resume(after)
        np.testing.assert_array_equal(tokens_of(fresh.next_batch()), batches[11].tokens.numpy())
    ds.close()


def test_state_after_every_step_resumes_exactly(numbered) -> None:
    """``Batch.state_after()`` of any earlier batch is the checkpoint of the step after it."""
    root, _ = numbered
    with plitzer.Loader(root, **CFG) as loader:
        batches = [loader.next_batch() for _ in range(40)]
        want = [tokens_of(b).copy() for b in batches]
    for t in range(0, 39, 3):
        with plitzer.Loader(root, world=2, rank=1, **CFG) as other:
            other.resume(batches[t].state_after())
            np.testing.assert_array_equal(tokens_of(other.next_batch()), want[t + 1][4:])


def test_a_forged_position_inside_a_slice_is_refused(numbered) -> None:
    root, _ = numbered
    with plitzer.Loader(root, **CFG) as loader:
        for _ in range(5):
            loader.next_batch()
        st = plitzer.state.checkpoint.decode(loader.checkpoint())
    pos = st.positions.copy()
    inside = np.flatnonzero(pos[:, 4] > 0)
    assert len(inside)
    pos[inside[0], 4] += 1  # one token off
    forged = plitzer.state.checkpoint.encode(plitzer.state.checkpoint.State(st.config, st.step, pos))
    with plitzer.Loader(root, **CFG) as other:
        other.resume(forged)
        with pytest.raises(plitzer.CheckpointError, match=r"not where step 5 puts it|past its slice"):
            other.next_batch()


@pytest.mark.parametrize("seq_len", [8, 32, 200])
def test_both_layouts_give_the_same_batches(numbered, monkeypatch: pytest.MonkeyPatch, seq_len: int) -> None:
    """Short rows are laid out lane by lane and transposed; long rows gathered step-major at
    once: the same tokens, pieces and documents either way."""
    import plitzer.readpath.pack

    root, _ = numbered
    cfg = {**CFG, "seq_len": seq_len}
    runs = []
    for threshold in (0, 10**9):  # always direct, always transposed (where a block exists)
        monkeypatch.setattr(plitzer.readpath.pack, "SHORT_ROWS", threshold)
        with plitzer.Loader(root, **cfg) as loader:
            batches = [loader.next_batch() for _ in range(3 * len(loader) // 2)]
            runs.append(([tokens_of(b).copy() for b in batches], [b.documents() for b in batches]))
    (tok_a, doc_a), (tok_b, doc_b) = runs
    for t, (a, b) in enumerate(zip(tok_a, tok_b, strict=True)):
        np.testing.assert_array_equal(a, b, err_msg=f"step {t}")
        assert doc_a[t].equals(doc_b[t]), f"step {t}"


def test_a_window_with_nothing_read_packs_as_the_general_path_would(tmp_path: Path, monkeypatch) -> None:
    """A window a selection left empty takes a short path (no cut, documents, slice keys or gather): the same unit.

    Aligned columns included: their empty blocks and edges have the general path's types.
    """
    import dataclasses

    import pyarrow as pa
    import pyarrow.parquet as pq

    import plitzer.readpath.scan as scan
    from planner.lanes import cut_at
    from planner.packing import slice_keys
    from plitzer.readpath.pack import finish_unit, pack_unit
    from plitzer.readpath.pieces import cut_pieces, shuffle_pieces, unit_documents

    schema = pa.schema([("tokens", pa.list_(pa.int32())), ("keep", pa.bool_()), ("mask", pa.list_(pa.bool_()))])
    with pq.ParquetWriter(tmp_path / "a.parquet", schema) as w:
        for g in range(40):
            docs = pa.array([np.arange(n, dtype=np.int32) for n in (30, 70, 5)], pa.list_(pa.int32()))
            mask = pa.array([np.arange(n) % 3 == 0 for n in (30, 70, 5)], pa.list_(pa.bool_()))
            w.write_table(pa.table({"tokens": docs, "keep": [g % 10 == 0] * 3, "mask": mask}, schema=schema))
    empty = []
    real = scan.pack_unit

    def seen(chunks, reads, columns=None):
        if not chunks:
            empty.append((reads, columns))
        return real(chunks, reads, columns)

    monkeypatch.setattr(scan, "pack_unit", seen)
    cfg = {"where": "keep", "lanes": 4, "seq_len": 16, "window": 2, "seed": 3, "rank": 1, "world": 2}
    with plitzer.Loader(tmp_path, columns=["mask"], **cfg) as loader:
        for _ in range(2 * len(loader)):
            assert loader.next_batch().columns["mask"].dtype == np.bool_
    assert len(empty) > 10
    for reads, columns in empty:
        assert columns is not None and set(columns) == {"mask"}
        p = reads.place
        lanes = p.rank_lanes
        q, r = divmod(p.window_tokens, p.lanes)
        cuts = cut_at(np.arange(lanes.start, lanes.stop + 1), q, r, p.window_z, p.lanes)
        docs = unit_documents([], p.token_start, reads.doc_base)
        pieces = cut_pieces(docs, cuts, at_end=lanes.stop == p.lanes)
        keys = slice_keys(p.seed, p.epoch, p.window, np.arange(lanes.start, lanes.stop))
        order, lane_piece = shuffle_pieces(pieces, p.keep, len(lanes), keys)
        general = finish_unit([], pieces, order, lane_piece, reads, tiled=True, columns=columns)
        short = pack_unit([], reads, columns)
        for f in dataclasses.fields(general):
            a, b = getattr(general, f.name), getattr(short, f.name)
            if f.name == "columns":
                assert a.keys() == b.keys()
                for name in a:
                    assert a[name].memory is None and b[name].memory is None and a[name].dtype == b[name].dtype
                    assert a[name].block.shape == b[name].block.shape and a[name].block.dtype == b[name].block.dtype
                    assert a[name].edges.equals(b[name].edges), name
            elif dataclasses.is_dataclass(a):
                for g in dataclasses.fields(a):
                    np.testing.assert_array_equal(getattr(a, g.name), getattr(b, g.name), err_msg=f"{f.name}.{g.name}")
            elif isinstance(a, (np.ndarray, pa.Array)):
                assert len(a) == len(b) and np.asarray(a).dtype == np.asarray(b).dtype, f.name
                np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=f.name)
            else:
                assert a == b, f.name
