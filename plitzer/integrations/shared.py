"""What the trainer adapters share, without importing a trainer: their settings, source and dataset.

A trainer decides four of plitzer's settings itself (:data:`TRAINER_DECIDES`): ``lanes``
and ``seq_len`` from its batch size and sequence length, ``rank`` and ``world`` from its
data-parallel rank and degree; and the adapters always ask for ``labels``. Every other
parameter of :data:`planner.parameters.PARAMETERS` is a field of the adapter's config
dataclass (:func:`setting_fields`), with a type that the trainers' config parsers read
(tyro for torchtitan's command line, OmegaConf for OLMo-core's overrides, jsonargparse
for litgpt's YAML), so a parameter added there reaches the three trainers at once.

The data is ``source`` (a folder, file or URL; several separated by commas) or
``mixture`` (a mixture file, TOML, as ``plitzer plan --mixture`` reads: its sources,
weights and settings).

>>> [name for name, _, _ in setting_fields()][:3]
['seed', 'window', 'budget']
>>> setting_type(by_name("window")), setting_type(by_name("column"))
(<class 'int'>, str | None)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import Field, field
from typing import Any

import torch

from planner.errors import ConfigError
from planner.parameters import PARAMETERS, Parameter, by_name
from plitzer.state.groups import groups_of_ranks
from plitzer.tools.mixfile import mixture_columns, mixture_settings, read_mixture
from plitzer.torch import Batch, Dataset

__all__ = [
    "ALWAYS",
    "KIND_TYPES",
    "SOURCE_FIELDS",
    "TRAINER_DECIDES",
    "VALIDATION",
    "data_groups",
    "epoch_start",
    "labels_of",
    "lanes_of",
    "open_dataset",
    "setting_fields",
    "setting_names",
    "setting_type",
    "settings_of",
    "source_of",
    "steps_in_epoch",
]

TRAINER_DECIDES = ("lanes", "seq_len", "rank", "world")
"""The settings a trainer decides: from its batch size, sequence length and data-parallel rank and degree."""

ALWAYS: Mapping[str, Any] = {"labels": True}
"""What every adapter asks of plitzer: the labels (SPEC section 16), which every trainer's loss takes."""

VALIDATION: Mapping[str, Any] = {"shuffle": False, "epochs": 1}
"""A validation loader's settings (SPEC section 17): storage order, one pass, the same batches every evaluation."""

KIND_TYPES: Mapping[str, Any] = {
    "int": int,
    "bool": bool,
    "str": str,
    "float": float,
    "int, optional": int | None,
    "str, optional": str | None,
    "str or PathLike, optional": str | None,
    "dict, optional": dict[str, str | int | float | bool] | None,
    "dict or stages, optional": dict[str, float] | None,
    "list or dict, optional": list[str] | dict[str, bool | int | float] | None,
    "str, PathLike, tokenizers.Tokenizer or callable, optional": str | None,
}
"""A parameter's type in a trainer's config, by its ``kind``: types that tyro, OmegaConf and jsonargparse parse.

The Python values the config cannot spell (a mixture's weight stages, a tokenizer object) are
given as files instead: ``mixture`` (weights and stages) and a tokenizer's path.
"""

SOURCE_FIELDS: list[tuple[str, Any, Any]] = [
    ("source", str, field(default="")),
    ("mixture", str | None, field(default=None)),
    ("replicas", bool, field(default=False)),
]
"""The data of a config: ``source`` (folders, files or URLs, comma-separated) or ``mixture`` (a TOML file);
and ``replicas`` (SPEC section 19): a model-parallel group reads once, its lowest rank sending each step."""


def setting_type(p: Parameter) -> Any:
    """The type of parameter ``p`` in a trainer's config (:data:`KIND_TYPES`; else its default's type)."""
    known = KIND_TYPES.get(p.kind)
    if known is not None:
        return known
    if isinstance(p.default, (bool, int, float, str)):
        return type(p.default)
    return Any  # tests/trainers/test_shared.py fails on it: give the kind a type above


def setting_names() -> tuple[str, ...]:
    """The parameters a trainer's config holds: all but :data:`TRAINER_DECIDES` and :data:`ALWAYS`."""
    return tuple(p.name for p in PARAMETERS if p.name not in TRAINER_DECIDES and p.name not in ALWAYS)


def setting_fields(renamed: Mapping[str, str] | None = None) -> list[tuple[str, Any, Field[Any]]]:
    """``(name, type, field)`` of each of :func:`setting_names`, its default that of PARAMETERS (``make_dataclass``).

    ``renamed``: a field's name where a trainer's own use of a parameter's name clashes
    (torchtitan passes ``tokenizer`` to every data loader it builds).
    """
    names = renamed or {}
    return [(names.get(n, n), setting_type(by_name(n)), field(default=by_name(n).default)) for n in setting_names()]


def _plain(value: Any) -> Any:
    """A config's value as plain Python: OmegaConf's and jsonargparse's containers become dicts and lists."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return [_plain(v) for v in value]
    return value


def settings_of(config: Any, renamed: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The plitzer settings a config holds, as keywords (its fields named after the parameters, or ``renamed``)."""
    names = renamed or {}
    return {n: _plain(getattr(config, names.get(n, n))) for n in setting_names()}


def source_of(config: Any, source: str | None = None) -> tuple[Any, dict[str, Any]]:
    """The source of a config and what its mixture file sets (weights, columns, selection, packing).

    Both ``source`` and ``mixture`` is refused, as the command line refuses both. ``source``
    given here wins over the config's data (a validation set's).
    """
    if source is None:
        source, mixture = str(getattr(config, "source", "") or ""), getattr(config, "mixture", None)
    else:
        mixture = None
    if mixture and source:
        msg = f"source={source!r} and mixture={mixture!r}: give the data paths or a mixture file, not both"
        raise ConfigError(msg)
    if mixture:
        sources, weights = read_mixture(mixture)
        given: dict[str, Any] = {"weights": weights, "columns": mixture_columns(mixture)}
        given.update(mixture_settings(mixture))
        return sources, {k: v for k, v in given.items() if v is not None}
    paths = [p.strip() for p in source.split(",") if p.strip()]
    if not paths:
        msg = (
            "no data: set source (a folder, .parquet file or URL; several separated by commas) "
            "or mixture (a mixture file, TOML) in the data loader's config"
        )
        raise ConfigError(msg)
    return (paths[0] if len(paths) == 1 else paths), {}


def lanes_of(batch_size: int, world: int, what: str) -> int:
    """plitzer's lanes (sequences per global batch) for ``batch_size`` sequences per data-parallel rank."""
    if batch_size < 1:
        msg = f"{what}={batch_size} must be >= 1: it is the sequences each data-parallel rank takes per step"
        raise ConfigError(msg)
    return batch_size * world


def open_dataset(
    config: Any,
    *,
    lanes: int,
    seq_len: int,
    rank: int,
    world: int,
    group: Any = None,
    renamed: Mapping[str, str] | None = None,
    source: str | None = None,
    **given: Any,
) -> Dataset:
    """The plitzer.torch.Dataset of ``config`` for this data-parallel rank, with labels.

    ``given``: settings that win over the config's (a validation loader's ``shuffle``);
    ``renamed``: as for :func:`setting_fields`; ``source``: data in place of the config's (:func:`source_of`).
    A mixture file's settings apply where the config leaves the default.
    """
    data, from_file = source_of(config, source)
    kw = settings_of(config, renamed)
    for k, v in from_file.items():
        if kw.get(k) == by_name(k).default:
            kw[k] = v
    kw.update(given)
    group, replicas = data_groups(rank, world, group, bool(getattr(config, "replicas", False)), bool(kw["balance"]))
    return Dataset(
        data, lanes=lanes, seq_len=seq_len, rank=rank, world=world, group=group, replicas=replicas, **ALWAYS, **kw
    )


def data_groups(rank: int, world: int, group: Any, replicas: bool, balance: bool) -> tuple[Any, Any]:
    """The data-parallel group (``group`` where the trainer gave one) and the replica group (with ``replicas``).

    Where the trainer's processes outnumber its data-parallel degree (tensor, context or pipeline
    parallel), they are derived from each process's data-parallel rank
    (:func:`plitzer.state.groups.groups_of_ranks`), which the trainer's mesh gives; so is the
    group of a balanced loader. Elsewhere nothing changes: ``group``, and no replicas.
    """
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() == 1:
        return group, None
    if dist.get_world_size() == world and group is None and not balance:
        return None, None  # plain data parallel: the whole world, as before
    if dist.get_world_size() == world and not replicas:
        return group, None
    dp_group, rep_group = groups_of_ranks(rank, world)
    return (dp_group if group is None else group), (rep_group if replicas else None)


def labels_of(batch: Batch) -> torch.Tensor:
    """The batch's labels (int64), which every adapter's dataset gives (:data:`ALWAYS`)."""
    if batch.labels is None:
        msg = "this plitzer.torch.Batch has no labels: the trainers' adapters open their dataset with labels=True"
        raise ConfigError(msg)
    return batch.labels


def epoch_start(dataset: Dataset, epoch: int) -> int:
    """The first step of epoch label ``epoch`` (0-based, plitzer's)."""
    return 0 if epoch <= 0 else dataset.loader.run.epoch_end(epoch - 1)


def steps_in_epoch(dataset: Dataset, epoch: int) -> int:
    """The steps whose epoch label is ``epoch`` (0-based): plitzer's epochs differ by a step or so."""
    return dataset.steps_in_epoch(epoch)
