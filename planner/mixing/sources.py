"""A mixture's configuration: named sources, and weights in stages, each checked.

Sources are a dict of name to a path (or list of paths, or ``s3://`` URL), or to a
dict with ``path`` and optionally ``column``, ``storage_options``, ``where`` and
``length_column`` (SPEC section 10), or a text source's ``tokenizer``, ``text_column``,
``add_eos`` and ``add_bos`` (section 9); they are ordered by name. Weights are a dict
(one stage from step 0), a list of ``(step, dict)`` stages, or None (each source weighs
its tokens). Every mistake is a ConfigError naming the field and the fix.
:mod:`planner.mixing.mixture` interleaves what this describes. :class:`Opening` is what the
runtime gives planner to open a source (its passes that read data; planner reads footers only).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any

import numpy as np

from planner.catalog.datasetindex import Index
from planner.catalog.footer import ChunkCounter
from planner.errors import ConfigError
from planner.parameters import FileFormat, Selection, TextSettings, names_of

__all__ = [
    "FORMAT_KEYS",
    "Opening",
    "SourceSpec",
    "Stage",
    "Weights",
    "joined",
    "parse_stages",
    "source_specs",
    "with_format",
]

Weights = Mapping[str, Any] | Sequence[tuple[int, Mapping[str, Any]]] | None
_TEXT_KEYS = names_of(TextSettings)
_SELECTION_KEYS = ("where", "length_column")
"""The fields of :class:`~planner.parameters.Selection` a source has (deduplication is the mixture's)."""
FORMAT_KEYS = names_of(FileFormat)
"""A source's format settings (SPEC section 21): a mixture source's keys, and the loader's for every source."""
_MAX_TOTAL_WEIGHT = 1 << 24


@dataclass(frozen=True, slots=True)
class SourceSpec:
    """One named source: a path (or list of paths), its token column and storage options.

    ``selection`` holds its ``where`` and ``length_column`` (SPEC section 10), the
    selection pass's (only those two: ``dedupe`` and ``exclude`` are the whole mixture's).
    ``text`` holds a text source's ``tokenizer`` and optionally ``text_column``,
    ``add_eos`` and ``add_bos`` (SPEC section 9), as given: planner reads footers only,
    so plitzer indexes such a source (``plitzer.text.source``); None for token data.
    """

    name: str
    path: str | list[str]
    column: str | None = None
    storage_options: Mapping[str, Any] | None = None
    selection: Selection = field(default_factory=Selection)
    text: Mapping[str, Any] | None = None
    index: str | None = None
    """The source's job index (``plitzer index PATH --out URL``), read instead of its footers."""
    file_format: FileFormat = field(default_factory=FileFormat)
    """Its files' format where they cannot say it (``format="numpy"``, ``eos_id``, ``dtype``: SPEC section 21)."""


@dataclass(frozen=True, slots=True)
class Opening:
    """What the runtime gives planner to open a source: the passes that read data, each None where not given.

    planner reads footers only (:func:`planner.api.open_index`, :func:`planner.mixing.mixindex.mixture_index`);
    plitzer builds this value in one place (``plitzer.sources.opening``). A source that needs a
    pass not given is a ConfigError naming what to pass.
    """

    select: Callable[[Index, SourceSpec], Index] | None = None
    """The selection pass (``where=``): an index and its source's spec in, the selected index out."""
    count: ChunkCounter | None = None
    """Counts a row group whose footer has no statistics (``plitzer.readpath.read.count_chunk``)."""
    text: Callable[[Any], Index] | None = None
    """Indexes a text source given as paths (``tokenizer=``: its counting pass tokenizes)."""
    text_source: Callable[[SourceSpec], Index] | None = None
    """Indexes a mixture's text source (one whose dict has a ``tokenizer``)."""
    files: Callable[[SourceSpec], Index | None] | None = None
    """The index of a path source of a kind planner does not read (Arrow IPC, Megatron, numpy token files:
    ``plitzer.sources.open_files``, the runtime's one dispatcher), or None where it is Parquet."""


_SPEC_KEYS = tuple(k for k in names_of(SourceSpec) if k not in ("name", "path", "selection", "text", "file_format"))
"""The keys of a source's dict that set its spec's field of the same name (the loader's keywords otherwise)."""
_SOURCE_KEYS = {"path", *_SPEC_KEYS, *_SELECTION_KEYS, *_TEXT_KEYS, *FORMAT_KEYS}
"""The keys of a source's dict: its path, its spec's fields, its selection's, a text source's settings for ``text``."""


def source_specs(
    sources: Mapping[str, Any],
    *,
    column: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    selection: Selection | None = None,
) -> list[SourceSpec]:
    """Check a dict of named sources; sources are ordered by name (bytewise).

    Each value is a path, a list of paths, or a dict with ``path`` and optionally
    ``column``, ``storage_options``, ``where`` and ``length_column``; those given to
    the loader (``selection``'s ``where`` and ``length_column``) are the defaults.
    """
    if not sources:
        msg = "sources={} names no source; give at least one, e.g. {'web': 'data/web'}"
        raise ConfigError(msg)
    sel = Selection() if selection is None else selection
    of_source = Selection(where=sel.where, length_column=sel.length_column)  # a source's part of the selection
    given = SourceSpec("", "", column=column, storage_options=storage_options, selection=of_source)
    specs = []
    for name in sorted(sources):
        if not isinstance(name, str) or not name:
            msg = f"source name {name!r} must be a non-empty string"
            raise ConfigError(msg)
        value = sources[name]
        if isinstance(value, Mapping):
            extra = set(value) - _SOURCE_KEYS
            if extra or "path" not in value:
                msg = (
                    f"source {name!r}: {sorted(extra) if extra else 'no path'}; a source is a path or a dict with "
                    f"'path' and optionally 'column', 'storage_options', 'where', 'length_column', 'index', "
                    "'format', 'eos_id', 'dtype' and 'row_group_tokens' "
                    "(a text source: 'tokenizer' and optionally 'text_column', 'add_eos', 'add_bos')"
                )
                raise ConfigError(msg)
            text = {k: value[k] for k in _TEXT_KEYS if k in value} or None
            own: dict[str, Any] = {k: value[k] for k in _SPEC_KEYS if k in value}
            if any(k in value for k in _SELECTION_KEYS):
                own["selection"] = replace(given.selection, **{k: value[k] for k in _SELECTION_KEYS if k in value})
            if any(k in value for k in FORMAT_KEYS):
                own["file_format"] = FileFormat(**{k: value[k] for k in FORMAT_KEYS if k in value})
            spec = replace(given, name=name, path=value["path"], text=text, **own)
            job = spec.index
            if job is not None and not isinstance(job, (str, os.PathLike)):
                msg = f"source {name!r}: index={job!r} must be the path or URL of its job index (plitzer index --out)"
                raise ConfigError(msg)
            if text is not None and text.get("tokenizer") is None:
                msg = (
                    f"source {name!r}: {sorted(text)} without a tokenizer; a text source needs 'tokenizer' "
                    "(SPEC section 9), a token source none of these keys"
                )
                raise ConfigError(msg)
        else:
            spec = replace(given, name=name, path=value)
        specs.append(_checked(spec))
    return specs


def _checked(spec: SourceSpec) -> SourceSpec:
    """``spec`` with its path (and job index) as strings, refused where its keys do not go together."""
    name, path = spec.name, spec.path
    if isinstance(path, (str, os.PathLike)):
        path = os.fspath(path)
    elif isinstance(path, Sequence) and all(isinstance(p, (str, os.PathLike)) for p in path):
        path = [os.fspath(p) for p in path]
    else:
        msg = f"source {name!r}: path {path!r} must be a path, an s3:// URL or a list of them"
        raise ConfigError(msg)
    where, length_column = spec.selection.where, spec.selection.length_column
    if length_column is not None and where is None:
        msg = f"source {name!r}: length_column={length_column!r} without where=; the length column serves a selection"
        raise ConfigError(msg)
    if spec.text is not None and where is not None:
        msg = (
            f"source {name!r}: where= with a text source (tokenizer=) is not supported; tokenize it "
            "first with `plitzer tokenize` and select on the token dataset"
        )
        raise ConfigError(msg)
    if spec.text is not None and spec.file_format.row_group_tokens is not None:
        msg = (
            f"source {name!r}: row_group_tokens= with a text source; a text source's row groups are its Parquet "
            "files' own (row_group_tokens cuts Megatron and numpy sources): leave it out"
        )
        raise ConfigError(msg)
    return replace(spec, path=path, index=None if spec.index is None else os.fspath(spec.index))


def with_format(
    files: Callable[[SourceSpec], Index | None] | None, given: FileFormat
) -> Callable[[SourceSpec], Index | None] | None:
    """``files`` (an :class:`Opening`'s) given ``given``'s settings (the loader's) where a source's own are None."""
    if files is None or given == FileFormat():
        return files
    of = files

    def opened(spec: SourceSpec) -> Index | None:
        return of(replace(spec, file_format=joined(spec.file_format, given)))

    return opened


def joined(own: FileFormat, given: FileFormat) -> FileFormat:
    """A source's ``own`` format settings, ``given``'s (the loader's) where it has none."""
    return FileFormat(**{k: getattr(own, k) if getattr(own, k) is not None else getattr(given, k) for k in FORMAT_KEYS})


@dataclass(frozen=True, slots=True)
class Stage:
    """Weights (integers, in source order) from global step ``start`` on."""

    start: int
    weights: tuple[int, ...]

    def as_dict(self, names: Sequence[str]) -> dict[str, int]:
        return dict(zip(names, self.weights, strict=True))


def _weight(name: str, value: object, where: str) -> Fraction:
    if isinstance(value, bool) or not isinstance(value, (int, float, Fraction, np.integer, np.floating)):
        msg = f"{where}: weight of {name!r} is {value!r}; a weight is a number >= 0 (a share of tokens)"
        raise ConfigError(msg)
    try:
        w = Fraction(str(value)) if isinstance(value, (float, np.floating)) else Fraction(value)  # type: ignore[arg-type]
    except (ValueError, OverflowError) as e:
        msg = f"{where}: weight of {name!r} is {value!r}; a weight is a finite number >= 0"
        raise ConfigError(msg) from e
    if w < 0:
        msg = f"{where}: weight of {name!r} is {value!r}; weights must be >= 0 (0 leaves the source out)"
        raise ConfigError(msg)
    return w


def _stage_weights(mapping: object, names: Sequence[str], where: str) -> tuple[int, ...]:
    if not isinstance(mapping, Mapping):
        msg = f"{where} must be a dict of source name to weight, got {mapping!r}"
        raise ConfigError(msg)
    unknown = sorted(set(map(str, mapping)) - set(names))
    if unknown:
        msg = f"{where}: unknown source {unknown[0]!r}; the sources are {list(names)}"
        raise ConfigError(msg)
    missing = [n for n in names if n not in mapping]
    if missing:
        msg = f"{where}: no weight for source {missing[0]!r}; give every source a weight (0 to leave it out)"
        raise ConfigError(msg)
    fr = [_weight(n, mapping[n], where) for n in names]
    if not any(fr):
        msg = f"{where}: every weight is 0; give at least one source a weight above 0"
        raise ConfigError(msg)
    den = math.lcm(*(f.denominator for f in fr))
    ints = [int(f * den) for f in fr]
    g = math.gcd(*ints)
    ints = [i // g for i in ints]
    total = sum(ints)
    if total > _MAX_TOTAL_WEIGHT:
        # Keep keys within int64 over any run: shares rounded down to 1 / 2**24
        # (a source with a weight keeps at least 1).
        ints = [max(1, i * _MAX_TOTAL_WEIGHT // total) if i else 0 for i in ints]
    return tuple(ints)


def parse_stages(weights: Weights, names: Sequence[str], tokens: Sequence[int]) -> tuple[Stage, ...]:
    """The stages of ``weights``: a dict (one stage from step 0), a list of
    ``(step, dict)``, or None (each source weighted by its tokens: natural mixing).

    Weights become integers per stage, exactly (0.7 is 7/10) and reduced by their
    gcd; where they still sum past 2**24 (natural mixing of large sources) they are
    rounded down to that resolution, a source with a weight keeping at least 1.

    >>> [st.weights for st in parse_stages({"a": 0.7, "b": 0.3}, ["a", "b"], [10, 10])]
    [(7, 3)]
    >>> parse_stages([(0, {"a": 1, "b": 1}), (100, {"a": 0, "b": 2})], ["a", "b"], [5, 5])[1]
    Stage(start=100, weights=(0, 1))
    """
    if weights is None:
        return (Stage(0, _stage_weights(dict(zip(names, tokens, strict=True)), names, "weights")),)
    if isinstance(weights, Mapping):
        return (Stage(0, _stage_weights(weights, names, "weights")),)
    if isinstance(weights, (str, bytes)) or not isinstance(weights, Sequence) or not weights:
        msg = f"weights={weights!r}: give a dict of weights, or a list of (step, dict) stages starting at step 0"
        raise ConfigError(msg)
    stages: list[Stage] = []
    for i, item in enumerate(weights):
        if not (isinstance(item, Sequence) and len(item) == 2):
            msg = f"weights[{i}] = {item!r}: a stage is (step, {{source: weight}})"
            raise ConfigError(msg)
        step, mapping = item
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
            msg = f"weights[{i}]: stage step {step!r} must be an integer >= 0 (a global step)"
            raise ConfigError(msg)
        if i == 0 and step != 0:
            msg = f"weights[0]: the first stage starts at step {step}; it must start at step 0"
            raise ConfigError(msg)
        if i and step <= stages[-1].start:
            msg = (
                f"weights[{i}]: stage step {step} is not after the previous stage's {stages[-1].start}; "
                "list stages in increasing step order"
            )
            raise ConfigError(msg)
        stages.append(Stage(int(step), _stage_weights(mapping, names, f"weights[{i}] (step {step})")))
    return tuple(stages)
