"""A new user's first hour with real clients: JAX and torch on every step, DataLoader's
defaults, Grain's own tools (RepeatIterDataset, mp_prefetch, Orbax).

Every step a loader hands out is writable memory that the step owns, straddling steps
(assembled from two windows) included, so ``jax.dlpack.from_dlpack`` and
``torch.from_numpy`` take every one of them without a copy or a warning (warnings are
errors in this suite).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import plitzer
from plitzer.errors import ConfigError
from tests.conftest import SynthDataset

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = {"lanes": 4, "window": 2, "seq_len": 512}


def _straddles(batch: plitzer.Batch) -> bool:
    """Whether the step's rows come from more than one window."""
    docs = batch.documents()
    return docs.select(["epoch", "window_index"]).n_unique() > 1


def test_every_step_of_two_epochs_is_writable_and_owned(synth_dataset: SynthDataset) -> None:
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
            t = torch.from_dlpack(batch.tokens)
            assert t.data_ptr() == a.ctypes.data  # shared, not copied
            f = torch.from_numpy(a)  # warns (an error here) on a read-only array
            assert f.data_ptr() == a.ctypes.data
    assert steps > 100
    assert straddling >= 2  # the case that was read-only in 0.3


# JAX runs in its own process: once its backends are up, every later os.fork() in this
# process (DataLoader workers, Ray) warns that JAX is multithreaded.
_JAX_EVERY_STEP = """
import sys, warnings
import numpy as np, jax, plitzer, plitzer.grain
warnings.simplefilter("error")
data, lanes, window, seq_len = sys.argv[1], *map(int, sys.argv[2:5])
loader = plitzer.Loader(data, lanes=lanes, window=window, seq_len=seq_len)
n = 0
while loader.epoch < 2:
    for batch in loader:
        j = jax.dlpack.from_dlpack(batch.tokens)  # BufferError on read-only memory (0.3's straddling steps)
        assert np.array_equal(np.asarray(j), batch.tokens), batch.step
        n += 1
it = iter(plitzer.grain.Dataset(data, lanes=lanes, window=window, seq_len=seq_len, num_epochs=2))
m = 0
for element in it:
    for key in ("tokens", "segment_ids", "position_ids"):
        assert element[key].flags.writeable, (key, int(element["step"]))
    assert np.array_equal(np.asarray(jax.dlpack.from_dlpack(element["tokens"])), element["tokens"])
    m += 1
print(n, m)
"""


def _python(code: str, *args: str) -> str:
    r = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300, check=False, cwd=ROOT
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_every_step_and_grain_element_of_two_epochs_goes_to_jax_without_a_copy(synth_dataset: SynthDataset) -> None:
    pytest.importorskip("jax")
    pytest.importorskip("grain")
    data = synth_dataset(200_000)
    out = _python(_JAX_EVERY_STEP, str(data), *(str(SETTINGS[k]) for k in ("lanes", "window", "seq_len")))
    steps, elements = map(int, out.split())
    assert steps > 100 and elements == steps


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


@pytest.mark.parametrize("kwargs", [{}, {"batch_size": 4}, {"batch_size": 1, "shuffle": False}])
def test_dataloader_with_a_batch_size_is_refused_and_no_step_is_lost(
    synth_dataset: SynthDataset, kwargs: dict[str, object]
) -> None:
    pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    import plitzer.torch

    ds = plitzer.torch.Dataset(synth_dataset(20_000), lanes=4, window=2, seq_len=64)
    with pytest.raises(ConfigError, match=r"batch_size=None"):
        next(iter(DataLoader(ds, **kwargs)))  # type: ignore[arg-type]
    assert ds.step == 0  # the steps the DataLoader took were given back
    batch = next(iter(DataLoader(ds, batch_size=None)))
    assert batch.step == 0


@pytest.mark.parametrize("batch_size", [1, 3])
def test_a_refused_dataloader_leaves_the_checkpoint_as_it_was(synth_dataset: SynthDataset, batch_size: int) -> None:
    pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    import plitzer.torch

    data = synth_dataset(20_000)
    ds = plitzer.torch.Dataset(data, lanes=4, window=2, seq_len=64)
    for _ in range(5):
        ds.next_batch()
    state = ds.state_dict()
    resumed = plitzer.torch.Dataset(data, lanes=4, window=2, seq_len=64, rank=1, world=2)
    resumed.load_state_dict(state)
    part = resumed.loader.checkpoint()
    for d, before in ((ds, state["checkpoint"]), (resumed, part)):
        with pytest.raises(ConfigError, match=r"batch_size=None"):
            next(iter(DataLoader(d, batch_size=batch_size)))
        assert d.step == 5
        assert d.loader.checkpoint() == before  # the same bytes: the position before the DataLoader
    want = ds.next_batch().tokens[2:]
    assert bool((resumed.next_batch().tokens == want).all())


def test_a_batch_size_past_the_epoch_end_gives_back_the_steps_it_took(synth_dataset: SynthDataset) -> None:
    pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    import plitzer.torch

    ds = plitzer.torch.Dataset(synth_dataset(20_000), lanes=4, window=2, seq_len=64)
    left = len(ds.loader)
    for _ in range(left - 2):
        ds.next_batch()
    with pytest.raises(ConfigError, match=r"batch_size=None"):
        next(iter(DataLoader(ds, batch_size=8)))  # the fetcher stops at the epoch's end: 2 steps
    assert (ds.step, ds.epoch) == (left - 2, 0)


def test_stateful_dataloader_with_a_batch_size_is_refused_and_no_step_is_lost(synth_dataset: SynthDataset) -> None:
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
    first, second = next(iter(ds)), ds.next_batch()
    with pytest.raises(ConfigError, match=r"batch_size=None"):
        default_collate([first])
    assert ds.step == 2  # not the last step given: nothing is given back
    with pytest.raises(ConfigError, match=r"batch_size=None"):
        default_collate([second])
    assert ds.step == 1  # the last step given: the dataset gives it again
    assert ds.next_batch().step == 1


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


def test_grain_guide_examples_run(tmp_path: Path) -> None:
    """docs/grain.md's Python blocks run (those marked 'not run in tests' aside): the Orbax example.

    In a process of their own, as a user runs them (Orbax starts JAX's backends).
    """
    pytest.importorskip("grain")
    pytest.importorskip("orbax.checkpoint")
    text = (ROOT / "docs" / "grain.md").read_text()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", text, re.DOTALL) if not b.startswith("# not run")]
    assert any("CheckpointManager" in b for b in blocks)
    script = tmp_path / "grain_guide.py"
    script.write_text("\n\n".join(blocks))
    r = subprocess.run(
        [sys.executable, "-W", "error::DeprecationWarning", str(script)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert r.returncode == 0, r.stdout + r.stderr
