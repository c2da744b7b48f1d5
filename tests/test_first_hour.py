"""A new user's first hour with real clients: JAX and torch on every step, DataLoader's
defaults, Grain's own tools (RepeatIterDataset, mp_prefetch, Orbax).

Every step a loader hands out is writable memory that the step owns, straddling steps
(assembled from two windows) included, so ``jax.dlpack.from_dlpack`` and
``torch.from_numpy`` take every one of them without a copy or a warning (warnings are
errors in this suite).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import plitzer
from plitzer.errors import ConfigError
from tests.conftest import SynthDataset

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = {"lanes": 4, "window": 2, "seq_len": 512}


def _straddles(batch: plitzer.Batch) -> bool:
    """Whether the step's rows come from more than one window."""
    docs = batch.documents()
    return docs.select(["epoch", "window_index"]).n_unique() > 1


def test_every_step_of_two_epochs_is_writable_and_owned(synth_dataset: SynthDataset) -> None:
    jax = pytest.importorskip("jax")
    torch = pytest.importorskip("torch")
    loader = plitzer.Loader(synth_dataset(200_000), **SETTINGS)  # type: ignore[arg-type]
    straddling = 0
    steps = 0
    while loader.epoch < 2:
        for batch in loader:
            steps += 1
            straddling += _straddles(batch)
            a = batch.tokens.numpy()
            assert a.flags.writeable, f"step {batch.step}"
            assert a.flags.c_contiguous
            expect = a.copy()
            j = jax.dlpack.from_dlpack(batch.tokens)  # raises BufferError on read-only memory
            assert np.array_equal(np.asarray(j), expect)
            t = torch.from_dlpack(batch.tokens)
            assert t.data_ptr() == a.ctypes.data  # shared, not copied
            f = torch.from_numpy(a)  # warns (an error here) on a read-only array
            assert torch.equal(f, torch.from_numpy(expect))
    assert steps > 100
    assert straddling >= 2  # the case that was read-only in 0.3


def test_a_step_the_caller_writes_into_changes_no_other_step(synth_dataset: SynthDataset) -> None:
    data = synth_dataset(200_000)
    loader = plitzer.Loader(data, **SETTINGS)  # type: ignore[arg-type]
    ref = plitzer.Loader(data, **SETTINGS)  # type: ignore[arg-type]
    held = []
    for _ in range(60):
        b, r = loader.next_batch(), ref.next_batch()
        assert np.array_equal(b.tokens, r.tokens)  # the writes into earlier steps changed nothing later
        b.tokens[...] = -1  # the caller's own memory
        held.append(b)
    assert all((b.tokens == -1).all() for b in held)


def test_grain_elements_of_two_epochs_go_to_jax_without_a_copy(synth_dataset: SynthDataset) -> None:
    pytest.importorskip("grain")
    jax = pytest.importorskip("jax")
    import plitzer.grain

    it = iter(plitzer.grain.Dataset(synth_dataset(200_000), num_epochs=2, **SETTINGS))
    n = 0
    for element in it:
        n += 1
        for key in ("tokens", "segment_ids", "position_ids"):
            assert element[key].flags.writeable, (key, int(element["step"]))
        j = jax.dlpack.from_dlpack(element["tokens"])
        assert np.array_equal(np.asarray(j), element["tokens"])
    assert n > 100


@pytest.mark.parametrize("kwargs", [{}, {"batch_size": 4}, {"batch_size": 1, "shuffle": False}])
def test_dataloader_with_a_batch_size_is_refused_before_any_step(
    synth_dataset: SynthDataset, kwargs: dict[str, object]
) -> None:
    pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    import plitzer.torch

    ds = plitzer.torch.Dataset(synth_dataset(20_000), lanes=4, window=2, seq_len=64)
    with pytest.raises(ConfigError, match=r"batch_size=None"):
        next(iter(DataLoader(ds, **kwargs)))  # type: ignore[arg-type]
    assert ds.step == 0  # nothing consumed: the refusal came before the first step
    batch = next(iter(DataLoader(ds, batch_size=None)))
    assert batch.step == 0


def test_stateful_dataloader_with_a_batch_size_is_refused_before_any_step(synth_dataset: SynthDataset) -> None:
    pytest.importorskip("torch")
    sdl = pytest.importorskip("torchdata.stateful_dataloader")
    import plitzer.torch

    ds = plitzer.torch.Dataset(synth_dataset(20_000), lanes=4, window=2, seq_len=64)
    with pytest.warns(UserWarning, match="set_vital"), pytest.raises(ConfigError, match=r"batch_size=None"):
        next(iter(sdl.StatefulDataLoader(ds)))
    assert ds.step == 0


def test_default_collate_refuses_a_plitzer_batch(synth_dataset: SynthDataset) -> None:
    pytest.importorskip("torch")
    from torch.utils.data import default_collate

    import plitzer.torch

    ds = plitzer.torch.Dataset(synth_dataset(20_000), lanes=4, window=2, seq_len=64)
    batch = next(iter(ds))
    with pytest.raises(ConfigError, match=r"batch_size=None"):
        default_collate([batch])


def test_grain_mp_prefetch_is_refused_with_plitzers_message(synth_dataset: SynthDataset) -> None:
    grain = pytest.importorskip("grain")
    import plitzer.grain

    ds = plitzer.grain.Dataset(synth_dataset(20_000), lanes=4, window=2, seq_len=64)
    with pytest.raises(ConfigError, match="mp_prefetch"):
        ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=2))


def test_grain_repeat_replays_epoch_zero_as_the_docs_say(synth_dataset: SynthDataset) -> None:
    """docs/grain.md: RepeatIterDataset starts a new iterator at step 0 each repeat; num_epochs= runs on."""
    grain = pytest.importorskip("grain")
    import plitzer.grain

    data = synth_dataset(20_000)
    ds = plitzer.grain.Dataset(data, lanes=4, window=2, seq_len=64)
    one = [int(e["step"]) for e in ds]
    repeated = [int(e["step"]) for e in grain.experimental.RepeatIterDataset(ds, num_epochs=2)]
    assert repeated == one + one
    two = [int(e["step"]) for e in plitzer.grain.Dataset(data, lanes=4, window=2, seq_len=64, num_epochs=2)]
    assert two == list(range(len(two))) and len(two) > len(one)
    assert "RepeatIterDataset" in (ROOT / "docs" / "grain.md").read_text()


def test_grain_guide_examples_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/grain.md's Python blocks run (those marked 'not run in tests' aside): the Orbax example."""
    pytest.importorskip("grain")
    pytest.importorskip("orbax.checkpoint")
    text = (ROOT / "docs" / "grain.md").read_text()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", text, re.DOTALL) if not b.startswith("# not run")]
    assert any("CheckpointManager" in b for b in blocks)
    monkeypatch.chdir(tmp_path)
    for block in blocks:
        exec(compile(block, "docs/grain.md", "exec"), {})
