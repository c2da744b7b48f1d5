"""Sources: one file a kind of source, and :func:`kind_of`, the one dispatcher every source is opened through.

A kind is a module of this package. A kind of token files (Arrow IPC, Megatron indexed
datasets, OLMo numpy files) has one function, ``format_of(spec)``: the
:class:`~plitzer.sources.files.Format` it states for a source (its files, row groups, reads and
columns), or None where the source is not of this kind; :mod:`plitzer.sources.files` gives it
its index, its shared pass and its reads. The others (a job index, text, Parquet) have three:
``claims(source, settings)`` (whether the source is of this kind), ``prepare(source, settings)``
(the index it opens to, or the source itself for planner's own dispatch of paths, indexes and
mixtures, and the passes it adds to :func:`opening`'s, by field of :class:`planner.api.Opening`:
a text source's ``text``) and ``share(source, settings, group)`` (its index for a job's ranks).
:data:`KINDS` lists them, the first that claims a source opens it: a job index (``index=``),
text (``tokenizer=``), then the formats of token files, then Parquet token columns, which
claims the rest. planner opens a mixture's sources and a path through :func:`open_files` (the
opening's ``files``; ``planner.plan``'s and ``planner.index``'s installed pass), which asks
the same kinds. A selection over another source (``where=``, ``dedupe=``, ``exclude=``) is
:mod:`plitzer.sources.selection`, applied to whatever the kind opened. :func:`opening` is the
one place plitzer builds what it gives planner's :func:`~planner.api.open_index` to open a
source (its passes that read data: every caller asks for it).

What the rest of the code needs of an opened source is :class:`Opened`: the index (the
planner's format-neutral :class:`~planner.catalog.rowgroups.RowGroupIndex`), a reader of a row
group's tokens (:func:`plitzer.readpath.read.read_chunk`, which asks the index: nothing is
registered at import) and what the source can do (its
:class:`~planner.catalog.rowgroups.Capabilities`). Only this package tests an index's type
(``tests/docs/test_structure.py``); everything else asks the index.
"""

from __future__ import annotations

import functools
import importlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol, cast

import pyarrow as pa

from planner.api import Opening, Source, open_index
from planner.catalog.datasetindex import Index
from planner.catalog.rowgroups import Capabilities, RowGroupIndex
from planner.errors import ConfigError
from planner.mixing.sources import SourceSpec, with_format
from planner.parameters import FileFormat
from plitzer.readpath.read import count_chunk, read_chunk
from plitzer.sources import files, selection, text

__all__ = [
    "KINDS",
    "FileKind",
    "Kind",
    "Opened",
    "format_of",
    "index_of",
    "kind_of",
    "open",
    "open_files",
    "opening",
    "spec_of",
]

KINDS = ("jobindex", "text", "arrow", "megatron", "olmo_numpy", "parquet")
"""The kinds of source, each a module of this package, in the order they are asked (the last claims the rest)."""


class Kind(Protocol):
    """What a kind's module holds (``plitzer.sources.<name>``)."""

    def claims(self, source: Source, settings: Any) -> bool: ...

    def prepare(self, source: Source, settings: Any) -> tuple[Source, dict[str, Any]]:
        """The source planner opens, and the passes the kind adds to :func:`opening`'s (fields of its ``Opening``)."""
        ...

    def share(self, source: Source, settings: Any, group: Any) -> Source:
        """The source a loader of a job's ``group`` (a ``plitzer.state.groups.Collective``) opens: its index, each
        pass that reads data split between the ranks (collective: every rank calls it)."""
        ...


@dataclass(frozen=True)
class FileKind:
    """A kind of token files as a :class:`Kind`: the :class:`~plitzer.sources.files.Format` it stated for a source."""

    format: files.Format

    def claims(self, source: Source, settings: Any) -> bool:
        return True

    def prepare(self, source: Source, settings: Any) -> tuple[Source, dict[str, Any]]:
        return files.files_index(self.format), {}

    def share(self, source: Source, settings: Any, group: Any) -> Source:
        return files.share(self.format, group)


@dataclass(frozen=True)
class Opened:
    """An opened source: its index, the reader of a row group's tokens, and what it can do."""

    index: RowGroupIndex
    read: Callable[[int], pa.Array]
    capabilities: Capabilities


def kind_of(source: Source, settings: Any) -> Kind:
    """The first kind of :data:`KINDS` that claims ``source`` under ``settings``: the one dispatcher."""
    for name in KINDS:
        kind = importlib.import_module(f"plitzer.sources.{name}")
        if hasattr(kind, "format_of"):
            fmt = _format(kind, source, settings)
            if fmt is not None:
                _cuts(kind, name, getattr(settings, "file_format", FileFormat()), "")
                return FileKind(fmt)
        elif cast("Kind", kind).claims(source, settings):
            if name != "jobindex" and isinstance(source, (str, os.PathLike, list, tuple)):  # a job index's: its kind's
                _cuts(kind, name, getattr(settings, "file_format", FileFormat()), "")
            return cast("Kind", kind)
    msg = f"no source kind claims {source!r}"  # parquet claims every source: never reached
    raise AssertionError(msg)


def _format(kind: Any, source: Source, settings: Any) -> files.Format | None:
    """The format ``kind`` states for a path source (None for another source, or one not of the kind)."""
    if not isinstance(source, (str, os.PathLike, list, tuple)) or isinstance(source, Mapping):
        return None
    return cast("files.Format | None", kind.format_of(spec_of(source, settings)))


def spec_of(source: Source, settings: Any) -> SourceSpec:
    """A path source under ``settings`` as a mixture's source is described (what a kind of files is given)."""
    path = [os.fspath(p) for p in source] if isinstance(source, (list, tuple)) else os.fspath(cast("str", source))
    return SourceSpec(
        name="",
        path=path,
        column=settings.column,
        storage_options=settings.storage_options,
        file_format=getattr(settings, "file_format", FileFormat()),
    )


def format_of(spec: SourceSpec) -> files.Format | None:
    """The format of the first kind of token files in :data:`KINDS` that claims ``spec``'s path, else None."""
    where = f"source {spec.name!r}: " if spec.name else ""
    for name in KINDS:
        kind = importlib.import_module(f"plitzer.sources.{name}")
        if hasattr(kind, "format_of"):
            fmt = cast("files.Format | None", kind.format_of(spec))
            if fmt is not None:
                _cuts(kind, name, spec.file_format, where)
                return fmt
    _cuts(None, "parquet", spec.file_format, where)
    return None


_NAMES = {"arrow": "an Arrow IPC", "parquet": "a Parquet", "text": "a text"}


def _cuts(kind: Any, name: str, given: FileFormat, where: str) -> None:
    """Refuse ``row_group_tokens`` for a kind whose row groups are its files' own (one without ``ROW_GROUP_TOKENS``:
    Parquet, Arrow IPC, text), naming the kind and the fix."""
    if given.row_group_tokens is None or hasattr(kind, "ROW_GROUP_TOKENS"):
        return
    msg = (
        f"{where}row_group_tokens={given.row_group_tokens!r} is for Megatron and numpy sources, whose row groups "
        f"plitzer cuts; {_NAMES.get(name, 'this')} source's row groups are its files' own: leave row_group_tokens "
        "out (in a mixture, give it as a key of the Megatron and numpy sources only)"
    )
    raise ConfigError(msg)


def open_files(spec: SourceSpec) -> Index | None:
    """The index of ``spec``'s path where a kind of token files claims it, else None (Parquet: planner reads it).

    What planner opens a path and a mixture's sources through (:class:`planner.api.Opening`'s
    ``files``; installed as ``planner.passes``' ``files`` for ``planner.plan`` and ``planner.index``).
    """
    fmt = format_of(spec)
    return None if fmt is None else files.files_index(fmt)


def opening(settings: Any = None) -> Opening:
    """What plitzer gives planner to open a source (:func:`planner.api.open_index`): its passes that read data.

    The selection pass (``where=``; ``settings``, a ``plitzer.state.settings.LoaderSettings``,
    splits it over its rank's world; None: this process runs the whole pass), the count of a row
    group whose footer has no statistics, and the index of a mixture's text source. A text
    source given as paths is its kind's (:func:`plitzer.sources.text.prepare` adds ``text``).
    """
    given = getattr(settings, "file_format", FileFormat())  # the loader's format settings: every source's
    return Opening(
        select=selection.selector(settings),
        count=count_chunk,
        text_source=text.mixture_source,
        files=with_format(open_files, given),
    )


def index_of(source: Source, settings: Any, opened: Mapping[str, Index] | None = None) -> RowGroupIndex:
    """The index of ``source`` under ``settings`` (a ``plitzer.state.settings.LoaderSettings``).

    Its kind prepares it (:func:`kind_of`); planner's :func:`~planner.api.open_index` checks the
    keywords against it, opens paths and mixtures, and runs the selection (``where=``) through
    :mod:`plitzer.sources.selection`, whose deduplication (``dedupe=``, ``exclude=``) follows.
    ``opened``: a mixture's sources opened already, by name (a job's shared indexes).
    """
    s = settings
    given, more = kind_of(source, s).prepare(source, s)
    ix = open_index(
        given,
        column=s.column,
        storage_options=s.storage_options,
        weights=s.weights,
        selection=s.selection,
        opening=replace(opening(s), **more),
        opened=opened,
        binned=s.rule.needs_counts,
    )
    return selection.deduplicated(ix, source, s)


def open(source: Source, settings: Any, opened: Mapping[str, Index] | None = None) -> Opened:
    """``source`` opened under ``settings``: its index, its reader of row groups, its capabilities."""
    ix = index_of(source, settings, opened)
    return Opened(ix, functools.partial(read_chunk, ix), ix.capabilities)
