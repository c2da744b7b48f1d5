"""Sources: one file a kind of source, and :func:`open`, the one place a source is opened.

A kind is a module of this package with two functions: ``claims(source, settings)`` (whether
the source is of this kind) and ``prepare(source, settings)`` (the index it opens to, or the
source itself for planner's own dispatch of paths, indexes and mixtures, and the passes it
adds to :func:`opening`'s, by field of :class:`planner.api.Opening`: a text source's ``text``).
:data:`KINDS` lists them, the first that claims a source opens it: a job index (``index=``),
text (``tokenizer=``), then the other formats, then Parquet token columns, which claims the
rest. A selection over another source (``where=``, ``dedupe=``, ``exclude=``) is
:mod:`plitzer.sources.selection`, applied to whatever the kind opened. :func:`opening` is the
one place plitzer builds what it gives planner's :func:`~planner.api.open_index` to open a
source (its passes that read data: every caller asks for it).

What the rest of the code needs of an opened source is :class:`Opened`: the index (the
planner's format-neutral :class:`~planner.catalog.rowgroups.RowGroupIndex`), a reader of a row
group's tokens (:func:`plitzer.readpath.read.read_chunk`, which asks the index: nothing is
registered at import) and what the source can do (its
:class:`~planner.catalog.rowgroups.Capabilities`). Only this package tests an index's type
(``tests/test_structure.py``); everything else asks the index.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol, cast

import pyarrow as pa

from planner.api import Opening, Source, open_index
from planner.catalog.datasetindex import Index
from planner.catalog.rowgroups import Capabilities, RowGroupIndex
from plitzer.readpath.read import count_chunk, read_chunk
from plitzer.sources import selection, text

__all__ = ["KINDS", "Kind", "Opened", "index_of", "kind_of", "open", "opening"]

KINDS = ("jobindex", "text", "arrow", "parquet")
"""The kinds of source, each a module of this package, in the order they are asked (the last claims the rest)."""


class Kind(Protocol):
    """What a kind's module holds (``plitzer.sources.<name>``)."""

    def claims(self, source: Source, settings: Any) -> bool: ...

    def prepare(self, source: Source, settings: Any) -> tuple[Source, dict[str, Any]]:
        """The source planner opens, and the passes the kind adds to :func:`opening`'s (fields of its ``Opening``)."""
        ...


@dataclass(frozen=True)
class Opened:
    """An opened source: its index, the reader of a row group's tokens, and what it can do."""

    index: RowGroupIndex
    read: Callable[[int], pa.Array]
    capabilities: Capabilities


def kind_of(source: Source, settings: Any) -> Kind:
    """The first kind of :data:`KINDS` that claims ``source`` under ``settings``."""
    for name in KINDS:
        kind = cast("Kind", importlib.import_module(f"plitzer.sources.{name}"))
        if kind.claims(source, settings):
            return kind
    msg = f"no source kind claims {source!r}"  # parquet claims every source: never reached
    raise AssertionError(msg)


def opening(settings: Any = None) -> Opening:
    """What plitzer gives planner to open a source (:func:`planner.api.open_index`): its passes that read data.

    The selection pass (``where=``; ``settings``, a ``plitzer.state.settings.LoaderSettings``,
    splits it over its rank's world; None: this process runs the whole pass), the count of a row
    group whose footer has no statistics, and the index of a mixture's text source. A text
    source given as paths is its kind's (:func:`plitzer.sources.text.prepare` adds ``text``).
    """
    return Opening(select=selection.selector(settings), count=count_chunk, text_source=text.mixture_source)


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
        binned=s.rule.pads,
    )
    return selection.deduplicated(ix, source, s)


def open(source: Source, settings: Any, opened: Mapping[str, Index] | None = None) -> Opened:
    """``source`` opened under ``settings``: its index, its reader of row groups, its capabilities."""
    ix = index_of(source, settings, opened)
    return Opened(ix, functools.partial(read_chunk, ix), ix.capabilities)
