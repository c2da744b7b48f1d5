"""What the trainers' adapters share (plitzer.integrations.shared), without any trainer installed.

Every parameter of planner.parameters.PARAMETERS reaches a trainer's config with a type its
parser reads; a config of those fields opens the same batches as plitzer.torch.Dataset with
the same settings; the source and mixture are checked.
"""

from __future__ import annotations

import typing
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("torch")

import plitzer.torch
from planner.errors import CheckpointError, ConfigError
from planner.parameters import PARAMETERS
from plitzer.integrations import shared
from plitzer.integrations.settings import Settings

NAMES = [p.name for p in PARAMETERS]


def test_every_parameter_but_the_trainers_is_a_typed_field() -> None:
    hints = typing.get_type_hints(Settings)
    got = [f.name for f in fields(Settings)]
    own = [name for name, _, _ in shared.SOURCE_FIELDS]  # the data, replicas, steering: first
    assert own[:3] == ["source", "mixture", "replicas"] and got[: len(own)] == own
    params = got[len(own) :]
    assert sorted(params) == sorted(n for n in NAMES if n not in shared.TRAINER_DECIDES and n not in shared.ALWAYS)
    assert params[-1] == "tokenizer"  # BaseSettings has all but a text source's tokenizer (torchtitan's config)
    for name in got:
        assert hints[name] is not typing.Any, f"{name}: give its kind a type in plitzer.integrations.shared.KIND_TYPES"
    assert set(shared.TRAINER_DECIDES) | set(shared.ALWAYS) | set(params) == set(NAMES)
    defaults = {f.name: f.default for f in fields(Settings)}
    assert all(defaults[p.name] == p.default for p in PARAMETERS if p.name in defaults)


def test_the_settings_module_is_what_the_parameters_generate() -> None:
    """plitzer/integrations/settings.py is written out from PARAMETERS: regenerate it after changing one."""
    written = (Path(shared.__file__).with_name("settings.py")).read_text()
    assert written == shared.settings_source(), "run: python -m plitzer.integrations.shared"


def _config(**values: object) -> object:
    return Settings(**values)  # type: ignore[arg-type]


def test_a_config_opens_the_datasets_batches(synth_dataset, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    data = synth_dataset(40_000, seed=3, mean_length=50, docs_per_row_group=40)
    config = _config(source=str(data), seed=5, window=2)
    assert {f.name for f in fields(config)} >= {"source", "mixture", "seed", "window", "packing"}
    with (
        shared.open_dataset(config, lanes=4, seq_len=32, rank=1, world=2) as got,
        plitzer.torch.Dataset(data, seed=5, window=2, lanes=4, seq_len=32, rank=1, world=2, **shared.ALWAYS) as want,
    ):
        for _ in range(5):
            a, b = got.next_batch(), want.next_batch()
            np.testing.assert_array_equal(a.tokens.numpy(), b.tokens.numpy())
            np.testing.assert_array_equal(a.labels.numpy(), b.labels.numpy())
            assert a.labels.dtype == b.labels.dtype and str(a.labels.dtype) == "torch.int64"
        assert got.loader.checkpoint() == want.loader.checkpoint()


def test_the_source_is_checked(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no data: set source"):
        shared.source_of(_config())
    with pytest.raises(ConfigError, match="not both"):
        shared.source_of(_config(source="a", mixture="m.toml"))
    assert shared.source_of(_config(source="a, b"))[0] == ["a", "b"]
    assert shared.source_of(_config(source="a"), "v")[0] == "v"
    with pytest.raises(ConfigError, match="micro_batch_size=0 must be >= 1"):
        shared.lanes_of(0, 2, "micro_batch_size")


def test_the_feed_counts_real_tokens_from_the_run(synth_dataset) -> None:  # type: ignore[no-untyped-def]
    """Concat: a step's slots, X(t+1) - X(t), through a layout stage; best-fit: the rows' real tokens."""
    from plitzer.integrations.feed import Feed

    data = synth_dataset(40_000, seed=3, mean_length=50, docs_per_row_group=40)
    with plitzer.torch.Dataset(data, lanes=4, seq_len=32, window=2, **shared.ALWAYS) as ds:
        feed = Feed(ds)
        first = ds.next_batch()
        assert feed.step_tokens(first) == 4 * 32 == feed.slots(0, 1)
        ds.set_layout(lanes=2, seq_len=128)
        later = ds.next_batch()
        assert feed.step_tokens(later) == 2 * 128 == later.tokens.numel()
        assert feed.slots(0, 2) == 4 * 32 + 2 * 128
    with plitzer.torch.Dataset(data, lanes=4, seq_len=64, window=2, packing="best-fit", **shared.ALWAYS) as ds:
        feed = Feed(ds)
        padded = 0
        for _ in range(6):
            batch = ds.next_batch()
            real = int(batch.mask.sum()) if batch.mask.dim() else batch.tokens.numel()
            assert feed.step_tokens(batch) == real <= feed.slots(batch.step, batch.step + 1) == 4 * 64
            padded += real < 4 * 64
        assert padded  # best-fit pads some row of some step here


def test_a_checkpoint_of_another_batch_is_refused_in_the_trainers_terms(synth_dataset) -> None:  # type: ignore[no-untyped-def]
    data = synth_dataset(40_000, seed=3, mean_length=50, docs_per_row_group=40)
    with plitzer.torch.Dataset(data, lanes=4, seq_len=32, window=2, **shared.ALWAYS) as ds:
        ds.next_batch()
        state = ds.state_dict()
    with plitzer.torch.Dataset(data, lanes=2, seq_len=32, window=2, **shared.ALWAYS) as ds:
        with pytest.raises(CheckpointError) as e:
            shared.resume(ds, state, batch="micro_batch_size", seq_len="max_seq_length")
    text = str(e.value)
    assert "lanes" not in text and "the checkpoint's run took 4 sequences a step, this one takes 2" in text
    assert "set micro_batch_size to 4" in text


def test_the_feed_gives_each_sources_figures_and_steers(tmp_path: Path) -> None:
    """Metrics against the batches' source ids; per-source losses against the tokens'; steer= sets a stage."""
    import plitzer.synth
    from plitzer.integrations.feed import Feed

    dirs = {}
    for i, name in enumerate(("a", "b")):
        dirs[name] = tmp_path / name
        plitzer.synth.write(dirs[name], tokens=40_000, seed=i, vocab=500, mean_length=40)
    with plitzer.torch.Dataset(
        {n: str(d) for n, d in dirs.items()}, weights={"a": 1, "b": 1}, lanes=4, window=2, seq_len=64, **shared.ALWAYS
    ) as ds:
        feed = Feed(ds, steer=3)
        feed.metrics()
        want = np.zeros(2, np.int64)
        for _ in range(4):
            batch = ds.next_batch()
            ids = batch.source_ids.numpy()
            want += np.bincount(ids[ids >= 0], minlength=2)
            losses = torch.arange(batch.tokens.numel(), dtype=torch.float32).reshape(batch.tokens.shape)
            sums, counts = feed.source_losses(batch, losses)
            keep = batch.labels.numpy() != -100
            for s in (0, 1):
                sel = keep & (ids == s)
                assert counts[s] == sel.sum() and sums[s] == pytest.approx(losses.numpy()[sel].sum())
            feed.observe(batch.step, sums, counts)
        got = feed.metrics()
        assert [got["plitzer/tokens/a"], got["plitzer/tokens/b"]] == want.tolist()
        assert got["plitzer/padding"] == 0 and got["plitzer/wait_s"] >= 0
        assert len(ds.loader.stages) == 2  # the first stage and the one steering set after step 2
    with plitzer.torch.Dataset(dirs["a"], lanes=4, seq_len=64, **shared.ALWAYS) as lone:
        with pytest.raises(ConfigError, match="two or more named sources"):
            Feed(lone, steer=3)
