"""What the trainers' adapters share (plitzer.integrations.shared), without any trainer installed.

Every parameter of planner.parameters.PARAMETERS reaches a trainer's config with a type its
parser reads; a config of those fields opens the same batches as plitzer.torch.Dataset with
the same settings; the source and mixture are checked.
"""

from __future__ import annotations

import typing
from dataclasses import fields, make_dataclass
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

import plitzer.torch
from planner.errors import ConfigError
from planner.parameters import PARAMETERS
from plitzer.integrations import shared

NAMES = [p.name for p in PARAMETERS]


def test_every_parameter_but_the_trainers_is_a_typed_field() -> None:
    got = {name: typ for name, typ, _ in shared.setting_fields()}
    assert list(got) == [n for n in NAMES if n not in shared.TRAINER_DECIDES and n not in shared.ALWAYS]
    for name, typ in got.items():
        assert typ is not typing.Any, f"{name}: give its kind a type in plitzer.integrations.shared.KIND_TYPES"
    assert set(shared.TRAINER_DECIDES) | set(shared.ALWAYS) | set(got) == set(NAMES)
    renamed = [n for n, _, _ in shared.setting_fields({"tokenizer": "text_tokenizer"})]
    assert "text_tokenizer" in renamed and "tokenizer" not in renamed


def _config(**values: object) -> object:
    cls = make_dataclass("Config", [*shared.SOURCE_FIELDS, *shared.setting_fields()], kw_only=True)
    return cls(**values)


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
