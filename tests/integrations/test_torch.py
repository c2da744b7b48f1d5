"""plitzer.torch.Dataset in one process: equal to the Loader, state round trips, refusals."""

from __future__ import annotations

import io
import pickle
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader  # noqa: E402

import plitzer  # noqa: E402
import plitzer.torch  # noqa: E402
from tests.conftest import SynthDataset, tokens_of  # noqa: E402

CFG = {"seed": 3, "lanes": 8, "window": 3, "seq_len": 96, "threads": 2}


@pytest.fixture(scope="module")
def data(synth_dataset: SynthDataset) -> Path:
    d = synth_dataset(tokens=60_000, seed=5, docs_per_row_group=40, row_groups_per_file=4, mean_length=150)
    return d


def _same(item: plitzer.torch.Batch, ref: plitzer.Batch) -> None:
    assert item.step == ref.step and item.epoch == ref.epoch and item.lanes.tolist() == ref.lanes.tolist()
    np.testing.assert_array_equal(item.tokens.numpy(), tokens_of(ref))
    np.testing.assert_array_equal(item.position_ids.numpy(), ref.position_ids)
    np.testing.assert_array_equal(item.cu_seqlens.numpy(), ref.cu_seqlens)
    assert item.max_seqlen == ref.max_seqlen
    assert len(item.doc_lengths) == len(ref.doc_lengths)
    for a, b in zip(item.doc_lengths, ref.doc_lengths, strict=True):
        np.testing.assert_array_equal(a.numpy(), b)


@pytest.mark.timeout(60)
def test_dataloader_equals_loader_over_epochs(data: Path) -> None:
    ds = plitzer.torch.Dataset(data, **CFG)
    loader = DataLoader(ds, batch_size=None, num_workers=0)
    got: list[plitzer.torch.Batch] = []
    while ds.epoch < 2:  # the seed README's loop
        n = len(ds.loader)  # batches left in this epoch
        before = len(got)
        for batch in loader:
            assert isinstance(batch, plitzer.torch.Batch)
            got.append(batch)
        assert len(got) - before == n
    assert {b.epoch for b in got} == {0, 1}
    assert [b.step for b in got] == list(range(len(got)))
    with plitzer.Loader(data, **CFG) as ref:
        for item in got:
            _same(item, ref.next_batch())
    item = got[-1]
    assert item.tokens.dtype == torch.int32 and item.tokens.shape == (8, 96)
    assert item.position_ids.dtype == torch.int32 and item.cu_seqlens.dtype == torch.int32
    assert int(item.cu_seqlens[-1]) == 8 * 96
    assert all(int(x.sum()) == 96 for x in item.doc_lengths)
    # Position ids restart at every piece start given by cu_seqlens.
    starts = item.cu_seqlens[:-1].long()
    assert (item.position_ids.reshape(-1)[starts] == 0).all()
    assert item.documents().height == len(item.cu_seqlens) - 1
    # Zero-copy: the tensor is the loader's array.
    assert item.tokens.data_ptr() == item.source.tokens.numpy().ctypes.data
    assert "step=" in repr(item) and "Dataset(" in repr(ds)
    ds.close()


@pytest.mark.timeout(60)
def test_uint32_tokens_and_rank_slices(tmp_path: Path) -> None:
    plitzer.synth.write(tmp_path, tokens=20_000, seed=1, docs_per_row_group=30, dtype="uint32")
    cfg = {**CFG, "lanes": 4}
    with (
        plitzer.torch.Dataset(tmp_path, **cfg) as full,
        plitzer.torch.Dataset(tmp_path, rank=1, world=2, **cfg) as half,
    ):
        a, b = full.next_batch(), half.next_batch()
        assert a.tokens.dtype == torch.uint32 and b.tokens.shape == (2, 96)
        assert half.rank == 1 and half.world == 2 and b.lanes.tolist() == [2, 3]
        np.testing.assert_array_equal(a.tokens.numpy()[2:], b.tokens.numpy())


@pytest.mark.timeout(60)
def test_state_dict_round_trip(data: Path) -> None:
    with plitzer.torch.Dataset(data, **CFG) as ds:
        it = iter(DataLoader(ds, batch_size=None, num_workers=0))
        for _ in range(7):
            last = next(it)
        state = ds.state_dict()
        assert set(state) == {"checkpoint", "step", "epoch"}
        assert state["step"] == 7 == ds.step and state["epoch"] == 0
        assert isinstance(state["checkpoint"], bytes)
        assert ds.state_dict(after=last) == state  # no prefetch: the same position
        want = [ds.next_batch() for _ in range(5)]
    # The dict, the bytes or a uint8 tensor; on another world size.
    raw = state["checkpoint"]
    as_tensor = torch.from_numpy(np.frombuffer(raw, np.uint8).copy())
    for form in (state, raw, as_tensor):
        with plitzer.torch.Dataset(data, **CFG) as again:
            again.load_state_dict(form)
            assert again.step == 7
            for w in want:
                _same(again.next_batch(), w.source)
    parts = [plitzer.torch.Dataset(data, rank=r, world=4, **CFG) for r in range(4)]
    for p in parts:
        p.load_state_dict(state)
    for w in want:
        got = torch.cat([p.next_batch().tokens for p in parts])
        assert torch.equal(got, w.tokens)
    for p in parts:
        p.close()


@pytest.mark.timeout(60)
def test_prefetching_loop_resumes_with_state_after(data: Path) -> None:
    """The seed's known limit, and its fix: the state right after the batch that was trained."""
    with plitzer.torch.Dataset(data, **CFG) as ds:
        it = iter(DataLoader(ds, batch_size=None, num_workers=0))
        nxt = next(it)
        trained = []
        for _ in range(6):
            batch, nxt = nxt, next(it)  # prefetch one ahead
            trained.append(batch)
        fixed = ds.state_dict(after=trained[-1])
        naive = ds.state_dict()
        assert fixed["step"] == 6 and naive["step"] == 7  # naive skips the prefetched batch
        with plitzer.torch.Dataset(data, **CFG) as again:
            again.load_state_dict(fixed)
            first = again.next_batch()
            assert first.step == nxt.step and torch.equal(first.tokens, nxt.tokens)
        with pytest.raises(plitzer.ConfigError, match=r"plitzer\.torch\.Batch"):
            ds.state_dict(after=nxt.source)  # type: ignore[arg-type]


@pytest.mark.timeout(60)
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
def test_torch_save_and_distributed_checkpoint_with_a_model(data: Path, tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    model = torch.nn.Linear(4, 4)
    with plitzer.torch.Dataset(data, **CFG) as ds:
        for _ in range(3):
            ds.next_batch()
        # torch.save / torch.load(weights_only=True): bytes and ints are allowed.
        buf = io.BytesIO()
        torch.save({"model": model.state_dict(), "data": ds.state_dict()}, buf)
        buf.seek(0)
        saved = torch.load(buf, weights_only=True)
        # torch.distributed.checkpoint: the Dataset is Stateful; put it in the state dict.
        dcp.save({"model": model.state_dict(), "data": ds}, checkpoint_id=tmp_path / "ckpt", no_dist=True)
        want = ds.next_batch()
    with plitzer.torch.Dataset(data, **CFG) as again:
        again.load_state_dict(saved["data"])
        assert torch.equal(again.next_batch().tokens, want.tokens)
    fresh = torch.nn.Linear(4, 4)
    with plitzer.torch.Dataset(data, **CFG) as again:
        dcp.load({"model": fresh.state_dict(), "data": again}, checkpoint_id=tmp_path / "ckpt", no_dist=True)
        assert again.step == 3
        assert torch.equal(again.next_batch().tokens, want.tokens)
    assert torch.equal(fresh.weight, model.weight)


@pytest.mark.timeout(60)
@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")  # torchdata 0.11 on newer torch
def test_stateful_dataloader(data: Path) -> None:
    sdl = pytest.importorskip("torchdata.stateful_dataloader")
    with plitzer.torch.Dataset(data, **CFG) as ds:
        loader = sdl.StatefulDataLoader(ds, batch_size=None, num_workers=0)
        it = iter(loader)
        for _ in range(4):
            next(it)
        state = loader.state_dict()
        want = next(it)
    with plitzer.torch.Dataset(data, **CFG) as again:
        loader = sdl.StatefulDataLoader(again, batch_size=None, num_workers=0)
        loader.load_state_dict(state)
        got = list(loader) + list(loader)  # the rest of epoch 0, then epoch 1
        with pytest.raises(TypeError, match="no len"):  # a run without end: no DataLoader warns about a length
            len(again)
    assert got[0].step == want.step and torch.equal(got[0].tokens, want.tokens)
    assert [b.epoch for b in got][-1] == 1 and [b.step for b in got] == list(range(4, 4 + len(got)))
    with plitzer.Loader(data, **CFG) as ref:
        for _ in range(4):
            ref.next_batch()
        for item in got:
            _same(item, ref.next_batch())


@pytest.mark.timeout(120)
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")  # fork, Python 3.12+
def test_refuses_dataloader_workers(data: Path) -> None:
    with plitzer.torch.Dataset(data, **CFG) as ds:
        loader = DataLoader(ds, batch_size=None, num_workers=1, multiprocessing_context="fork")
        it = iter(loader)
        with pytest.raises(plitzer.ConfigError, match=r"num_workers > 0 is not supported.*num_workers=0") as err:
            next(it)
        # Drop the traceback's frames so that the worker shuts down now, not at a later gc.
        err.value.__traceback__ = None
        del err, it
        # Spawned workers would pickle the dataset: refused with the same advice.
        with pytest.raises(plitzer.ConfigError, match="num_workers=0"):
            pickle.dumps(ds)
        # The dataset still works in this process.
        assert ds.next_batch().step == 0


@pytest.mark.timeout(60)
def test_pin_memory(data: Path) -> None:
    if plitzer.torch._can_pin():
        with plitzer.torch.Dataset(data, pin_memory=True, **CFG) as ds:
            item = ds.next_batch()
            assert item.tokens.is_pinned() and item.cu_seqlens.is_pinned()
            assert all(x.is_pinned() for x in item.doc_lengths)
    else:
        with pytest.warns(UserWarning, match="no accelerator"):
            ds = plitzer.torch.Dataset(data, pin_memory=True, **CFG)
        with ds:
            item = ds.next_batch()
            assert not item.tokens.is_pinned()
            with plitzer.Loader(data, **CFG) as ref:
                _same(item, ref.next_batch())
    moved = item.to("cpu")
    assert torch.equal(moved.tokens, item.tokens) and moved.step == item.step


@pytest.mark.timeout(60)
def test_clear_errors(data: Path) -> None:
    with plitzer.torch.Dataset(data, rank=1, world=2, **CFG) as ds:
        with pytest.raises(plitzer.ConfigError, match=r"torch\.distributed.*not initialised.*plitzer\.merge"):
            ds.state_dict()
        with pytest.raises(plitzer.CheckpointError, match="got int"):
            ds.load_state_dict(3)  # type: ignore[arg-type]
        with pytest.raises(plitzer.CheckpointError, match="'checkpoint' entry"):
            ds.load_state_dict({"step": 3})
        with pytest.raises(plitzer.CheckpointError, match="1-D uint8"):
            ds.load_state_dict(torch.zeros(3, dtype=torch.int32))
        with pytest.raises(plitzer.CheckpointError, match="magic"):
            ds.load_state_dict(b"garbage")
    with pytest.raises(plitzer.ConfigError, match="lanes=8 is not divisible by world=3"):
        plitzer.torch.Dataset(data, rank=0, world=3, **CFG)
    with pytest.raises(plitzer.ConfigError, match="init_process_group"):
        plitzer.torch.Dataset(data, group=object(), **CFG)  # type: ignore[arg-type]


def test_steering_guide_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/steering.md's blocks run as pasted: EXP3 steers through the Dataset, its state in state_dict."""
    import re

    from plitzer.state import checkpoint as ckpt

    text = (Path(__file__).resolve().parents[2] / "docs" / "steering.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.DOTALL)
    assert len(blocks) == 2
    monkeypatch.chdir(tmp_path)
    ns: dict[str, object] = {}
    exec(compile(blocks[0], "docs/steering.md", "exec"), ns)
    stages = ns["dataset"].loader.stages  # type: ignore[attr-defined]
    assert len(stages) > 3 and ns["mixer"].rule.name == "exp3(alpha=0.9)"  # type: ignore[attr-defined]
    doc = ckpt.decode(ns["state"]["checkpoint"])  # type: ignore[index]
    assert doc.step == 100 and doc.steering is not None and doc.steering["next"] == 100
    # The stages then, a prefix of the run's (a later change may start below step 100: at a window not begun).
    assert [list(s) for s in stages][: len(doc.config["stages"])] == doc.config["stages"]
    exec(compile(blocks[1], "docs/steering.md", "exec"), ns)  # a rule of one's own, on a new dataset
    assert ns["mixer"].rule.name.startswith("follow-the-loss")  # type: ignore[attr-defined]


def test_steering_through_the_dataset_resumes_exactly(tmp_path: Path) -> None:
    """Online(dataset): resumed from state_dict(after=batch), controller built after, the same run; and its stages."""
    import plitzer.mixing

    srcs = {}
    for i, name in enumerate(("web", "code", "books")):
        plitzer.synth.write(tmp_path / name, tokens=8_000 * (i + 1), seed=i, vocab=1_000, docs_per_row_group=10)
        srcs[name] = str(tmp_path / name)
    kw = {"weights": {"web": 1, "code": 1, "books": 1}, "labels": True, "seed": 0, "lanes": 4, "window": 2}

    def run(resume: object, steps: int, save_at: int = -1) -> tuple[list[np.ndarray], list[object], object, bytes]:
        out, saved = [], None
        with plitzer.torch.Dataset(srcs, seq_len=32, **kw) as ds:
            if resume is not None:
                ds.load_state_dict(resume)  # type: ignore[arg-type]
            mixer = plitzer.mixing.Online(ds, every=5)
            while ds.step < steps:
                b = ds.next_batch()
                ids = b.source_ids.long().flatten()
                loss = (b.tokens.long().flatten() % 11).double()  # a stand-in model's loss: exact sums
                per = torch.stack([torch.bincount(ids[ids >= 0], weights=loss[ids >= 0], minlength=3), b.source_tokens])
                mixer.observe(b.step, per[0] / per[1])
                out.append(b.tokens.numpy().copy())
                if b.step == save_at:
                    saved = ds.state_dict(after=b)
            return out, ds.loader.stages, saved, ds.state_dict()["checkpoint"]

    whole, stages, saved, last = run(None, 30, save_at=11)
    again, stages2, _, last2 = run(saved, 30)
    assert len(stages) > 3 and stages2 == stages and last2 == last
    for a, b in zip(whole[12:], again, strict=True):
        np.testing.assert_array_equal(a, b)
    with plitzer.Loader(srcs, seq_len=32, **{**kw, "weights": stages}) as replay:
        for a in whole:
            np.testing.assert_array_equal(np.asarray(replay.next_batch().tokens), a)
