"""What the trainer adapters share, without importing a trainer: their settings, source and dataset.

A trainer decides four of plitzer's settings itself (:data:`TRAINER_DECIDES`): ``lanes``
and ``seq_len`` from its batch size and sequence length, ``rank`` and ``world`` from its
data-parallel rank and degree; and the adapters always ask for ``labels``. Every other
parameter of :data:`planner.parameters.PARAMETERS` is a field of one dataclass,
:class:`plitzer.integrations.settings.Settings` (written out by :func:`settings_source`),
with a type that the trainers' config parsers read (tyro for torchtitan's command line,
OmegaConf for OLMo-core's overrides, jsonargparse for litgpt's YAML); each adapter's config
is an ordinary class that inherits it beside its trainer's own config class, so a parameter
added there reaches the three trainers at once.

The data is ``source`` (a folder, file or URL; several separated by commas) or
``mixture`` (a mixture file, TOML, as ``plitzer plan --mixture`` reads: its sources,
weights and settings).

>>> setting_names()[:3]
('seed', 'window', 'budget')
>>> setting_type(by_name("window")), setting_type(by_name("column"))
(<class 'int'>, str | None)
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import field
from typing import Any

import torch

from planner.errors import CheckpointError, ConfigError
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
    "in_trainer_terms",
    "labels_of",
    "lanes_of",
    "open_dataset",
    "resume",
    "setting_names",
    "setting_type",
    "settings_of",
    "settings_source",
    "source_of",
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
    ("steer", int, field(default=0)),
    ("steer_rule", str, field(default="exp3")),
]
"""The data of a config: ``source`` (folders, files or URLs, comma-separated) or ``mixture`` (a TOML file);
``replicas`` (SPEC section 19): a model-parallel group reads once, its lowest rank sending each step; and
``steer`` (SPEC section 20): the mixture steered from the trainer's per-source loss every this many steps."""


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


def _annotation(t: Any) -> str:
    """A type as source text: ``int``, ``str | None``, ``dict[str, float] | None``."""
    return t.__name__ if isinstance(t, type) and not getattr(t, "__args__", None) else str(t)


_DATA_DOCS = {
    "source": "The data: a folder, file or URL; several separated by commas.",
    "mixture": "A mixture file (TOML: sources, weights, settings), in place of source.",
    "replicas": "One read a model-parallel group: its lowest rank reads and sends each step (SPEC section 19).",
    "steer": (
        "Steer the mixture every this many global steps from the trainer's per-source loss (plitzer.mixing.Online, "
        "SPEC section 20; docs/steering.md); 0: off. A mixture, where the trainer gives per-token losses."
    ),
    "steer_rule": "The steering rule: exp3 (Online Data Mixing, Albalak et al. 2023).",
}

_SETTINGS_HEAD = '''"""plitzer's settings as one dataclass, which each trainer adapter's config class inherits.

Generated from planner.parameters.PARAMETERS by ``python -m plitzer.integrations.shared``
(tests/integrations/test_integrations.py checks it is current): the data (``source`` or ``mixture``),
``replicas``, and every parameter but those a trainer decides (lanes, seq_len, rank, world)
and labels, which the adapters always ask for. Do not edit by hand.
"""

from dataclasses import dataclass

__all__ = ["BaseSettings", "Settings"]


@dataclass(kw_only=True)
class BaseSettings:
    """plitzer's settings in a trainer's config but a text source's ``tokenizer``: the data, then one field a
    parameter (docs/api.md). torchtitan's config inherits this one: it passes its own ``tokenizer`` to every data
    loader's ``build`` and refuses a config field of that name, so plitzer's is ``text_tokenizer`` there."""
'''

_SETTINGS_TAIL = '''

@dataclass(kw_only=True)
class Settings(BaseSettings):
    """plitzer's settings in a trainer's config: :class:`BaseSettings` and a text source's ``tokenizer``."""
'''


def settings_source() -> str:
    """The text of :mod:`plitzer.integrations.settings`: ``Settings``, one field a setting (and the data's).

    Written out rather than made at import (``make_dataclass``), so that an editor, mypy and
    the trainers' parsers (tyro reads a field's docstring from the source) see an ordinary
    class; tests/integrations/test_integrations.py checks the file equals this text, and
    ``python -m plitzer.integrations.shared`` writes it.
    """
    rows = [(n, t, f.default, _DATA_DOCS[n]) for n, t, f in SOURCE_FIELDS]
    for name in setting_names():
        p = by_name(name)
        rows.append((name, setting_type(p), p.default, " ".join(p.doc.split()).split(". ")[0].rstrip(".") + "."))
    body = []
    for name, typ, default, doc in rows:
        value = f'"{default}"' if isinstance(default, str) else repr(default)
        text = textwrap.fill(doc.replace("\\", "\\\\"), width=110, initial_indent="    ", subsequent_indent="    ")
        close = "\n    " if "\n" in text else ""
        body.append((name, f'\n    {name}: {_annotation(typ)} = {value}\n    """{text[4:]}{close}"""\n'))
    tokenizer = "".join(b for n, b in body if n == "tokenizer")
    return _SETTINGS_HEAD + "".join(b for n, b in body if n != "tokenizer") + _SETTINGS_TAIL + tokenizer


def _plain(value: Any) -> Any:
    """A config's value as plain Python: OmegaConf's and jsonargparse's containers become dicts and lists."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return [_plain(v) for v in value]
    return value


def settings_of(config: Any) -> dict[str, Any]:
    """The plitzer settings a config holds (a :class:`~plitzer.integrations.settings.Settings`), as keywords.

    A config of :class:`~plitzer.integrations.settings.BaseSettings` (torchtitan's) gives its
    ``text_tokenizer`` as ``tokenizer``.
    """
    got = {n: _plain(getattr(config, n)) for n in setting_names() if hasattr(config, n)}
    if "tokenizer" not in got:
        got["tokenizer"] = getattr(config, "text_tokenizer", None)
    return got


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
    source: str | None = None,
    **given: Any,
) -> Dataset:
    """The plitzer.torch.Dataset of ``config`` for this data-parallel rank, with labels.

    ``given``: settings that win over the config's (a validation loader's ``shuffle``);
    ``source``: data in place of the config's (:func:`source_of`).
    A mixture file's settings apply where the config leaves the default.
    """
    data, from_file = source_of(config, source)
    kw = settings_of(config)
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


def resume(dataset: Dataset, state: Any, *, batch: str, seq_len: str, unit: int = 1) -> None:
    """``dataset.load_state_dict(state)``, a checkpoint of another batch size or length refused in the trainer's terms.

    plitzer names ``lanes`` and ``seq_len``; a trainer's user set ``batch`` (sequences a rank,
    or ``unit`` = tokens a sequence where the trainer counts tokens) and ``seq_len``.
    """
    try:
        dataset.load_state_dict(state)
    except CheckpointError as e:
        raise CheckpointError(in_trainer_terms(str(e), dataset.world, batch=batch, seq_len=seq_len, unit=unit)) from e


def in_trainer_terms(msg: str, world: int, *, batch: str, seq_len: str, unit: int = 1) -> str:
    """plitzer's ``lanes: checkpoint A, loader B`` (and ``seq_len``) as the trainer's settings a user changes.

    >>> print(in_trainer_terms("checkpoint does not match this loader: lanes: checkpoint 4, loader 2", 2,
    ...                        batch="micro_batch_size", seq_len="max_seq_length"))  # doctest: +NORMALIZE_WHITESPACE
    checkpoint does not match this loader: micro_batch_size x data-parallel degree: the checkpoint's run took
    4 sequences a step, this one takes 2 (micro_batch_size 1 x 2): set micro_batch_size to 2 at this degree
    """

    def lanes(m: re.Match[str]) -> str:
        was, now = int(m[1]), int(m[2])
        head, size = (
            (batch, "")
            if world == 1
            else (f"{batch} x data-parallel degree", f" ({batch} {now * unit // world} x {world})")
        )
        fix = f"set {batch} to {was * unit // world}" if was % world == 0 else f"use a degree dividing {was}"
        return f"{head}: the checkpoint's run took {was} sequences a step, this one takes {now}{size}: {fix}" + (
            "" if world == 1 else " at this degree"
        )

    msg = re.sub(r"lanes: checkpoint (\d+), loader (\d+)", lanes, msg)
    return re.sub(r"seq_len: checkpoint (\d+), loader (\d+)", rf"{seq_len}: checkpoint \1, this run \2", msg)


def labels_of(batch: Batch) -> torch.Tensor:
    """The batch's labels (int64), which every adapter's dataset gives (:data:`ALWAYS`)."""
    if batch.labels is None:
        msg = "this plitzer.torch.Batch has no labels: the trainers' adapters open their dataset with labels=True"
        raise ConfigError(msg)
    return batch.labels


if __name__ == "__main__":  # python -m plitzer.integrations.shared: write plitzer/integrations/settings.py
    from pathlib import Path

    Path(__file__).with_name("settings.py").write_text(settings_source())
