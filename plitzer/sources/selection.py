"""A selection over another source: ``where=`` (SPEC section 10), ``dedupe=`` and ``exclude=`` (section 14).

Whatever kind opened the source, these keep some of each row group's rows: the index they
give wraps the source's (:class:`plitzer.selection.select.SelectedIndex`,
:class:`plitzer.selection.dedupe.DedupedIndex`) and reads its row groups by reading the
source's and dropping the rows it left out. ``where=`` needs a source whose capabilities say
it is selectable (a dataset of token columns: Parquet, Arrow IPC): another is a ConfigError
naming its kind. The passes read a row group's other columns through
:class:`plitzer.readpath.runs.ColumnRun`, which reads a Parquet file's chunks through footers
and a file that reads its own row groups (``FileEntry.reader``: an Arrow IPC file) through its
reader, so a selection works over any kind whose files say how they are read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from planner.api import Selector, Source
from planner.catalog.datasetindex import Index
from planner.catalog.rowgroups import RowGroupIndex
from planner.errors import ConfigError
from planner.mixing.sources import SourceSpec

__all__ = ["check_columns", "deduplicate", "deduplicated", "selector"]


def selector(settings: Any = None) -> Selector:
    """The selection pass of ``settings`` (``where=``): this rank's share of it, the rest from the cache.

    None: this process runs the whole pass (:func:`plitzer.selection.select.select_spec`).
    """
    s = settings
    if s is None:
        from plitzer.selection.select import select_spec

        return select_spec

    def select(ix: Index, spec: SourceSpec) -> Index:
        from plitzer.selection.select import select_index

        return select_index(ix, spec.selection, rank=s.rank, world=s.world, threads=s.threads)

    return select


def deduplicated(ix: RowGroupIndex, source: Source, settings: Any) -> RowGroupIndex:
    """``ix`` deduplicated and excluded as ``settings`` says (itself where it says neither)."""
    s = settings
    if s.selection.dedupe is None and s.selection.exclude is None:
        return ix
    return deduplicate(ix, source, s, s.rank, s.world)


def check_columns(ix: RowGroupIndex, dedupe: str | None, exclude: Any) -> None:
    """A ConfigError naming the kind where a source without columns (Megatron, numpy: tokens only) is given
    ``exclude=`` or ``dedupe=NAME`` (``dedupe="tokens"`` works for every kind); a mixture's sources each."""
    parts = getattr(ix, "parts", None) or [ix]
    names = getattr(ix, "names", None) or [""]
    for name, part in zip(names, parts, strict=True):
        caps = part.capabilities
        if caps.other_columns or caps.tokenizes or (exclude is None and dedupe in (None, "tokens")):
            continue
        given = f"exclude={exclude!r}" if exclude is not None else f"dedupe={dedupe!r}"
        where = f"source {name!r}, " if name else ""
        msg = (
            f"{given}: {where}a {caps.kind} source has no columns but its tokens; give dedupe='tokens' (equal token "
            "lists), or write the data as Parquet with the columns to exclude or deduplicate by"
        )
        raise ConfigError(msg)


def deduplicate(ix: RowGroupIndex, source: Source, s: Any, rank: int, world: int, **more: Any) -> RowGroupIndex:
    """The deduplication and exclusion pass of ``s`` over ``ix`` (SPEC section 14), ``rank``'s share of ``world``.

    ``more``: the pass's other keywords (a job's ``exchange``, ``plitzer.state.share``).
    """
    from plitzer.selection.dedupe import dedupe_index

    check_columns(ix, s.selection.dedupe, s.selection.exclude)
    order = list(source) if isinstance(source, Mapping) else None
    return dedupe_index(
        ix,
        s.selection,
        storage_options=s.storage_options,
        order=order,
        rank=rank,
        world=world,
        threads=s.threads,
        **more,
    )
