"""plitzer.grain.Dataset in Grain pipelines: the loader's batches, exact resume at any world size, refusals."""

from __future__ import annotations

import json
import random
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

grain = pytest.importorskip("grain", reason="grain is not installed (pip install 'plitzer[grain]')")

import plitzer  # noqa: E402
import plitzer.grain  # noqa: E402
from plitzer.errors import CheckpointError, ConfigError  # noqa: E402
from tests.conftest import SynthDataset, tokens_of  # noqa: E402

CFG: dict[str, Any] = {"seed": 3, "lanes": 8, "window": 3, "seq_len": 96, "threads": 2}


@pytest.fixture(scope="module")
def data(synth_dataset: SynthDataset) -> Path:
    return synth_dataset(tokens=60_000, seed=5, docs_per_row_group=40, row_groups_per_file=4, mean_length=150)


def pipeline(data: Path, **kw: Any) -> Any:
    """What a Grain user writes: the source, a per-element map, prefetch on a thread."""
    ds = plitzer.grain.Dataset(data, **{**CFG, "num_epochs": None, **kw}).map(lambda e: {**e, "tokens": e["tokens"]})
    return grain.experimental.ThreadPrefetchIterDataset(ds, prefetch_buffer_size=2)


def reference(data: Path, steps: int, **kw: Any) -> list[plitzer.Batch]:
    with plitzer.Loader(data, **{**CFG, **kw}) as ref:
        out = []
        for _ in range(steps):
            b = ref.next_batch()
            b.tokens = b.tokens.copy()  # the loader reuses its buffers once a batch is dropped
            out.append(b)
        return out


def _same(element: dict[str, Any], ref: plitzer.Batch) -> None:
    assert int(element["step"]) == ref.step and int(element["epoch"]) == ref.epoch
    np.testing.assert_array_equal(element["tokens"], tokens_of(ref))
    np.testing.assert_array_equal(element["position_ids"], ref.position_ids)
    np.testing.assert_array_equal(element["cu_seqlens"], ref.cu_seqlens)
    seg = element["segment_ids"]
    for row, lengths in zip(seg, ref.doc_lengths, strict=True):
        kept = lengths[lengths > 0]
        # ids count the pieces from 1; a new id exactly where a piece starts
        np.testing.assert_array_equal(np.unique(row, return_counts=True)[1], kept)
        assert row[0] == 1 and (np.diff(row) >= 0).all()


@pytest.mark.timeout(60)
def test_pipeline_gives_the_loaders_batches_over_epochs(data: Path) -> None:
    it = iter(pipeline(data, num_epochs=2))
    got = [{k: np.array(v, copy=True) for k, v in e.items()} for e in it]
    ref = reference(data, len(got))
    with plitzer.Loader(data, **CFG) as lo:
        per_epoch = len(lo)  # batches of epoch 0
        lo.seek(per_epoch)
        assert lo.epoch == 1
        assert len(got) == per_epoch + len(lo)  # exactly two epochs, then the iterator ends
    for e, r in zip(got, ref, strict=True):
        _same(e, r)
    assert {int(e["epoch"]) for e in got} == {0, 1}
    assert got[0]["tokens"].dtype == np.int32 and got[0]["tokens"].shape == (8, 96)
    assert got[0]["segment_ids"].dtype == np.int32 and got[0]["position_ids"].dtype == np.int32
    # Positions restart at 0 where the segment id changes.
    seg, pos = got[-1]["segment_ids"], got[-1]["position_ids"]
    starts = np.ones_like(seg, dtype=bool)
    starts[:, 1:] = seg[:, 1:] != seg[:, :-1]
    assert (pos[starts] == 0).all() and (pos[~starts] > 0).all()


def test_element_is_the_loaders_array(data: Path) -> None:
    it = iter(plitzer.grain.Dataset(data, **CFG))
    e = next(it)
    loader = it.loader
    assert loader.step == 1
    # No copy: the element's tokens are a view of the window's packed block.
    from plitzer.readpath.packed import Memory

    base = e["tokens"]
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    assert isinstance(base, Memory)
    it.close()


def test_elements_kept_are_never_overwritten(data: Path) -> None:
    """The loader reuses a step's buffer only when nothing refers to it: elements a user keeps stay intact."""
    it = iter(plitzer.grain.Dataset(data, **CFG))
    kept = [next(it) for _ in range(10)]  # more than the loader's pool of buffers
    for e, r in zip(kept, reference(data, 10), strict=True):
        _same(e, r)
    it.close()


def test_without_boundaries_the_element_is_the_tokens(data: Path) -> None:
    it = iter(plitzer.grain.Dataset(data, boundaries=False, **CFG))
    e = next(it)
    assert sorted(e) == ["epoch", "step", "tokens"]  # no boundaries
    np.testing.assert_array_equal(e["tokens"], tokens_of(reference(data, 1)[0]))
    it.close()


def _run(it: Iterator[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    return [{k: np.array(v, copy=True) for k, v in next(it).items()} for _ in range(n)]


@pytest.mark.timeout(120)
def test_get_state_at_random_steps_resumes_exactly_at_any_world(data: Path) -> None:
    rng = random.Random(7)
    with plitzer.Loader(data, **CFG) as lo:
        epoch = len(lo)
    total = 2 * epoch + 3
    ref = reference(data, total)
    for _ in range(4):
        k = rng.randrange(0, total - 3)
        src = iter(pipeline(data))
        for e, r in zip(_run(src, k), ref[:k], strict=True):
            _same(e, r)
        state = json.loads(json.dumps(src.get_state()))  # what Orbax writes: JSON
        tail = ref[k : k + 3]
        # A new pipeline, same world: the uninterrupted run's next steps.
        again = iter(pipeline(data))
        again.set_state(state)
        for e, r in zip(_run(again, 3), tail, strict=True):
            _same(e, r)
        # Another world size: each rank's rows of the same global steps.
        world = rng.choice([2, 4])
        for rank in range(world):
            part = iter(pipeline(data, rank=rank, world=world))
            part.set_state(state)
            rows = slice(rank * 8 // world, (rank + 1) * 8 // world)
            for e, r in zip(_run(part, 3), tail, strict=True):
                assert int(e["step"]) == r.step
                np.testing.assert_array_equal(e["tokens"], tokens_of(r)[rows])
                np.testing.assert_array_equal(e["position_ids"], r.position_ids[rows])
        src.close()
        again.close()


@pytest.mark.timeout(120)
def test_one_process_state_or_merged_states_resume_every_world(data: Path) -> None:
    """The state of rank 1 of 2 alone (lockstep: the step places every lane) and the merged states."""
    k = 5
    ref = reference(data, k + 2)
    states = []
    for rank in range(2):
        it = iter(pipeline(data, rank=rank, world=2))
        _run(it, k)
        states.append(it.get_state())
        assert states[-1]["rank"] == rank and states[-1]["world"] == 2 and states[-1]["step"] == k
        it.close()
    merged = plitzer.grain.merge_states(states)
    assert merged["step"] == k and merged["epoch"] == ref[k].epoch
    for state in (states[1], merged):
        for world in (1, 4):
            for rank in range(world):
                it = iter(pipeline(data, rank=rank, world=world))
                it.set_state(state)
                rows = slice(rank * 8 // world, (rank + 1) * 8 // world)
                for e, r in zip(_run(it, 2), ref[k:], strict=True):
                    np.testing.assert_array_equal(e["tokens"], tokens_of(r)[rows])
                it.close()
    with pytest.raises(CheckpointError, match="miss lanes"):
        plitzer.grain.merge_states(states[:1])


def test_grains_checkpoint_handler_saves_and_restores(data: Path, tmp_path: Path) -> None:
    """Grain's own (Orbax) handler writes the state as JSON per process and restores it.

    In a fresh interpreter: the handler starts JAX's backends, and JAX then warns at every
    fork, which fails the later tests that fork (Ray, DataLoader workers) in this process.
    """
    import os
    import subprocess

    if os.environ.get("PLITZER_GRAIN_CHILD") != "1":
        here = f"{Path(__file__).resolve()}::test_grains_checkpoint_handler_saves_and_restores"
        out = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp", str(tmp_path / "t"), here],
            env={**os.environ, "PLITZER_GRAIN_CHILD": "1"},
            cwd=Path(__file__).resolve().parents[2],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert out.returncode == 0 and "1 passed" in out.stdout, out.stdout[-3000:] + out.stderr[-2000:]
        return
    from etils import epath

    handler = grain.checkpoint.CheckpointHandler()
    it = iter(pipeline(data))
    _run(it, 4)
    handler.save(epath.Path(tmp_path), it)
    assert json.loads((tmp_path / "process_0-of-1.json").read_text())["step"] == 4
    again = handler.restore(epath.Path(tmp_path), iter(pipeline(data)))
    for e, r in zip(_run(again, 2), reference(data, 6)[4:], strict=True):
        _same(e, r)
    it.close()
    again.close()


def test_state_of_other_settings_is_refused_field_by_field(data: Path) -> None:
    it = iter(plitzer.grain.Dataset(data, **CFG))
    next(it)
    state = it.get_state()
    other = iter(plitzer.grain.Dataset(data, **{**CFG, "seed": 4, "seq_len": 64}))
    with pytest.raises(CheckpointError, match="seed") as e:
        other.set_state(state)
    assert "seq_len" in str(e.value)
    with pytest.raises(CheckpointError, match="base64"):
        other.set_state({"checkpoint": "not base64 !"})
    with pytest.raises(CheckpointError, match="'checkpoint' entry"):
        other.set_state({"step": 3})
    it.close()
    other.close()


def test_worker_processes_and_thread_shards_are_refused(data: Path) -> None:
    from absl import flags

    if not flags.FLAGS.is_parsed():  # Grain's workers read absl flags, which absl.app would have parsed
        flags.FLAGS.mark_as_parsed()
    ds = plitzer.grain.Dataset(data, **CFG)
    piped = ds.map(lambda e: e).mp_prefetch(grain.MultiprocessingOptions(num_workers=2))
    with pytest.raises(ConfigError, match="worker processes"):
        next(iter(piped))
    with pytest.raises(ConfigError, match="worker processes"):
        grain.experimental.multithread_prefetch(ds, num_threads=2, buffer_size=1)
    with pytest.raises(ConfigError, match="worker processes"):
        ds.set_slice(slice(0, None, 2))


def test_an_iterator_gives_the_rest_of_its_epoch_by_default(data: Path) -> None:
    """As ``for batch in loader``: one epoch from step 0, the rest of the epoch after set_state."""
    with plitzer.Loader(data, **CFG) as lo:
        first = len(lo)
        lo.seek(first)
        second = len(lo)
    assert len(list(plitzer.grain.Dataset(data, **CFG))) == first
    it = iter(plitzer.grain.Dataset(data, **CFG))
    for _ in range(3):
        next(it)
    state = it.get_state()
    again = iter(plitzer.grain.Dataset(data, **CFG))
    again.set_state(state)
    assert len(list(again)) == first - 3
    # num_epochs=n is absolute: from a state in epoch 0, to the end of epoch 1.
    two = iter(plitzer.grain.Dataset(data, num_epochs=2, **CFG))
    two.set_state(state)
    got = list(two)
    assert len(got) == first + second - 3 and int(got[-1]["epoch"]) == 1
    # None: no end.
    endless = iter(plitzer.grain.Dataset(data, num_epochs=None, **CFG))
    assert int([next(endless) for _ in range(first + second + 2)][-1]["epoch"]) == 2
    for i in (it, again, two, endless):
        i.close()


def test_settings_are_checked_at_construction(data: Path) -> None:
    with pytest.raises(ConfigError, match="world"):
        plitzer.grain.Dataset(data, **{**CFG, "world": 3})
    for bad in (0, -1, 1.5, True, "all"):
        with pytest.raises(ConfigError, match="num_epochs"):
            plitzer.grain.Dataset(data, num_epochs=bad, **CFG)


def test_rank_and_world_from_jax_when_initialised(data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = types.ModuleType("jax")
    fake.distributed = types.SimpleNamespace(is_initialized=lambda: True)  # type: ignore[attr-defined]
    fake.process_index = lambda: 1  # type: ignore[attr-defined]
    fake.process_count = lambda: 4  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "jax", fake)
    ds = plitzer.grain.Dataset(data, **CFG)
    assert (ds.rank, ds.world) == (1, 4)
    assert plitzer.grain.Dataset(data, rank=0, world=2, **CFG).world == 2  # explicit wins
    fake.distributed = types.SimpleNamespace(is_initialized=lambda: False)  # type: ignore[attr-defined]
    monkeypatch.delitem(sys.modules, "jax._src.xla_bridge", raising=False)
    assert plitzer.grain.Dataset(data, **CFG).world == 1  # JAX not initialised: not asked


# JAX runs in a fresh interpreter: once loaded it starts threads, and every later test
# that forks (Ray, DataLoader workers) would get JAX's fork warning, an error here.
_JAX_CHECK = """
import sys, numpy as np, jax, plitzer, plitzer.grain
cfg = {"seed": 3, "lanes": 8, "window": 3, "seq_len": 96, "threads": 2}
it = iter(plitzer.grain.Dataset(sys.argv[1], **cfg))
kept = [next(it) for _ in range(10)]
want = [e["tokens"].copy() for e in kept]
arrays = [jax.dlpack.from_dlpack(e["tokens"]) for e in kept]
assert arrays[0].shape == (8, 96) and arrays[0].dtype == np.int32
assert all(a.unsafe_buffer_pointer() == e["tokens"].ctypes.data for a, e in zip(arrays, kept)), "copied"
del kept
more = [next(it) for _ in range(6)]  # the loader goes on: JAX's arrays are never overwritten
assert all(np.array_equal(np.asarray(a), w) for a, w in zip(arrays, want)), "overwritten"
it.close()
print("ok")
"""


def test_jax_arrays_from_elements_without_a_copy_stay_intact(data: Path) -> None:
    pytest.importorskip("jax", reason="JAX is not installed (pip install jax for the CPU build)")
    import subprocess

    out = subprocess.run(
        [sys.executable, "-c", _JAX_CHECK, str(data)], capture_output=True, text=True, timeout=300, check=False
    )
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]
