"""Work a job shares across its ranks: its index's footers, its selection pass, its checkpoint's parts.

Collective, whatever the framework: the functions here take a
:class:`~plitzer.state.groups.Collective` (this rank, the world, a broadcast from rank 0
and an all-gather of objects); :mod:`plitzer.state.groups` holds the groups themselves
(:class:`~plitzer.state.groups.TorchGroup`, :func:`~plitzer.state.groups.job_group`, which
says which a loader shares over: docs/design.md, "One index per job"), and this module
re-exports them.

- :func:`share_index`: a source's kind shares its own index (``plitzer.sources``: each
  kind's ``share``). For a Parquet dataset (:func:`share_one`), rank 0 lists and broadcasts
  the files; unless every rank's cache already holds the finished index, each rank reads
  the footers of files ``rank, rank + world, ...`` (its cache's, else one GET each) and an
  all-gather gives every rank all of them (kept in its cache). A kind of token files (Arrow
  IPC, Megatron, numpy): each rank makes the pass over its share of the files, and an
  all-gather gives every rank all of them (``plitzer.sources.files.share``).
- A text source (``tokenizer=``): the same for the listing and the footers, then each
  rank runs ``1/world`` of the counting pass and the all-gather shares the counts
  (:mod:`plitzer.text.job`), which land in each rank's cache.
- :func:`share_selection`: each rank runs ``1/world`` of the selection pass and the
  all-gather shares the parts, which land in each rank's cache.

A rank whose step fails sends its exception instead, and every rank raises the first
one (:func:`all_or_raise`), so no rank waits on a collective the others left
(docs/design.md, "One index per job").
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, cast

from planner.catalog.datasetindex import Index
from planner.parameters import Selection, TextSettings
from plitzer.sources.exchange import all_or_raise, attempt
from plitzer.sources.parquet import share_one
from plitzer.sources.text import share_text
from plitzer.state.groups import AUTO, Collective, TorchGroup, job_group, join_parts, torch_ready
from plitzer.state.settings import LoaderSettings, Source

__all__ = [
    "AUTO",
    "Collective",
    "TorchGroup",
    "all_or_raise",
    "attempt",
    "job_group",
    "job_source",
    "join_parts",
    "share_dedupe",
    "share_index",
    "share_one",
    "share_selection",
    "share_source",
    "share_text",
    "torch_ready",
]


def share_index(source: Source, cfg: LoaderSettings, group: Collective) -> Source:
    """Each footer read once for the whole job, the listing once; returns the loader's source.

    A kind shares its own index (its ``share``, :func:`plitzer.sources.kind_of`): a Parquet
    dataset's footers, a text source's counting pass, a kind of token files' passes over its
    files, each split between the ranks. For a mixture each source is shared so in turn and
    lands in every rank's cache (a selected source's selection pass too), and the mixture's
    index is returned, made of those indexes: no rank lists a source again. A source with a job
    index (``index=``) opens it on each rank; an Index is left as it is.
    """
    from planner.mixing.sources import source_specs
    from plitzer.sources import index_of, kind_of

    if cfg.index is not None:
        return source
    if not isinstance(source, Mapping):
        if not isinstance(source, (str, os.PathLike, list, tuple)):
            return source
        return kind_of(source, cfg).share(source, cfg, group)
    specs = source_specs(source, column=cfg.column, storage_options=cfg.storage_options, selection=cfg.selection)
    opened: dict[str, Index] = {}
    for spec in specs:
        if spec.index is not None:  # its job index: one object, no footer to share
            if spec.selection.where is not None and spec.text is None:
                from planner.catalog.jobindex import load

                ix = load(spec.index, spec.path, column=spec.column, storage_options=spec.storage_options)
                _select(ix, spec.selection, cfg.threads, group)
            continue
        own = _spec_settings(cfg, spec)
        ix = opened[spec.name] = cast("Index", kind_of(spec.path, own).share(spec.path, own, group))
        if spec.selection.where is not None and spec.text is None:
            _select(ix, spec.selection, cfg.threads, group)
    # Deduplication is shared next (share_dedupe), over one exchange: not here.
    return index_of(source, cfg.without_dedupe(), opened)


def _spec_settings(cfg: LoaderSettings, spec: Any) -> LoaderSettings:
    """``cfg`` as a mixture's source ``spec`` sets it (its column, storage options, tokenizer, format settings where
    it gives them; no selection)."""
    text = TextSettings.of(spec.text) if spec.text is not None else TextSettings()
    from planner.mixing.sources import joined

    return replace(
        cfg,
        column=spec.column,
        storage_options=spec.storage_options,
        text=text,
        selection=Selection(),
        weights=None,
        file_format=joined(spec.file_format, cfg.file_format),
    )


def _select(ix: Index, selection: Selection, threads: int | None, group: Collective) -> None:
    from plitzer.selection.select import Part, select_index

    def exchange(part: Part) -> list[Part]:
        return [p for p in group.all_gather(part) if p is not None]

    select_index(ix, selection, rank=group.rank, world=group.world, threads=threads, exchange=exchange)


def share_selection(source: Source, cfg: LoaderSettings, group: Collective) -> None:
    """Run this rank's share of the selection pass and gather the others' (SPEC section 10).

    Collective: every rank constructs its loader. Each computes ``1/world`` of the pass
    (the group's ranks split it) and the all-gather shares the parts, which land in each
    rank's cache, so the loader built next finds the whole pass there. A mixture's
    selections are shared by :func:`share_index`.
    """
    from planner.api import open_index
    from plitzer.sources import opening

    if cfg.selection.where is None or isinstance(source, Mapping) or cfg.text.tokenizer is not None:
        return
    if cfg.index is not None and isinstance(source, (str, os.PathLike, list, tuple)):
        from planner.catalog.jobindex import load

        ix: Any = load(cfg.index, source, column=cfg.column, storage_options=cfg.storage_options)
    else:
        ix = open_index(source, column=cfg.column, storage_options=cfg.storage_options, opening=opening())
    if ix.capabilities.selectable:
        _select(cast("Index", ix), cfg.selection, cfg.threads, group)


def share_source(source: Source, cfg: LoaderSettings, group: Collective) -> Source:
    """What a loader in ``group`` opens: :func:`share_index`, then :func:`share_selection` (both collective)."""
    out = share_index(source, cfg, group)
    share_selection(out, cfg, group)
    share_dedupe(out, cfg, group)
    return out


def job_source(source: Source, cfg: LoaderSettings, group: Any = AUTO) -> Source:
    """What a loader of ``cfg`` opens: ``source``, or its index shared over the job's ranks where ``group`` gives one.

    ``group`` as :func:`job_group` takes it; with a group this is :func:`share_source` (collective).
    """
    shared = job_group(group, cfg)
    return source if shared is None else share_source(source, cfg, shared)


def share_dedupe(source: Source, cfg: LoaderSettings, group: Collective) -> None:
    """Run this rank's share of the deduplication pass and gather the others' keys (SPEC section 14).

    Collective, as :func:`share_selection`: each rank keys ``1/world`` of the row groups
    and resolves the first occurrences of the keys it owns; all-gathers share the counts,
    route the keys to their owners and share the duplicates, so every rank writes the
    same whole pass into its cache, where the loader built next finds it, and none held
    every key (``plitzer.selection.firsts.resolve_shared``).
    """
    if cfg.selection.dedupe is None and cfg.selection.exclude is None:
        return
    from plitzer.selection.keying import Hashed
    from plitzer.sources import index_of
    from plitzer.sources.selection import deduplicate

    base = index_of(source, cfg.without_dedupe())

    def exchange(part: dict[int, Hashed]) -> list[dict[int, Hashed]]:
        return [p for p in all_or_raise(part, group) if p is not None]

    deduplicate(base, source, cfg, group.rank, group.world, exchange=exchange)
