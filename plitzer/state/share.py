"""Work a job shares across its ranks: its index's footers, its selection pass, its checkpoint's parts.

Collective, whatever the framework: the functions here take a
:class:`~plitzer.state.groups.Collective` (this rank, the world, a broadcast from rank 0
and an all-gather of objects); :mod:`plitzer.state.groups` holds the groups themselves
(:class:`~plitzer.state.groups.TorchGroup`, :func:`~plitzer.state.groups.job_group`, which
says which a loader shares over: docs/design.md, "One index per job"), and this module
re-exports them.

- :func:`share_index`: for one dataset, rank 0 lists and broadcasts the files; unless
  every rank's cache already holds the finished index, each rank reads the footers of
  files ``rank, rank + world, ...`` (its cache's, else one GET each) and an all-gather
  gives every rank all of them (kept in its cache). An Arrow IPC source
  (:func:`share_arrow`): each rank walks the framing of its share of the files, and an
  all-gather gives every rank all of them.
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
from collections.abc import Callable, Mapping
from typing import Any, cast

from planner.catalog.datasetindex import Index
from planner.parameters import Selection, TextSettings
from plitzer.readpath.read import count_chunk
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
    "share_arrow",
    "share_dedupe",
    "share_index",
    "share_one",
    "share_selection",
    "share_source",
    "share_text",
    "torch_ready",
]


def all_or_raise(value: Any, group: Collective) -> list[Any]:
    """All-gather ``value`` (or the exception it is), raising the first rank's error on every rank."""
    out = group.all_gather(value)
    for got in out:
        if isinstance(got, BaseException):
            raise got
    return out


def attempt(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, or the exception it raised (to be sent to every rank and raised there)."""
    try:
        return fn(*args)
    except Exception as e:
        return e


def share_one(
    path: Any, column: str | None, options: Mapping[str, Any] | None, threads: int, group: Collective
) -> Index:
    """One dataset's index for the whole group: rank 0 lists, each rank indexes its share of the files."""
    from planner.catalog import jobshare

    me, n = group.rank, group.world
    listed = group.broadcast(attempt(jobshare.listing, path, options) if me == 0 else None)
    if isinstance(listed, BaseException):
        raise listed
    entries, src = jobshare.entries_of(path, options, listed)
    if all(all_or_raise(attempt(jobshare.has_cached_index, entries, column), group)):
        # a restart: no footer, no exchange
        return jobshare.job_index(entries, src, column, threads=threads, count=count_chunk)
    # Each rank reads 1/world of the footers; the ranks exchange the rows (bytes a row group).
    # The shares go straight in: take_counted lets each file's rows go once copied into the frame.
    return jobshare.take_counted(
        entries,
        src,
        column,
        all_or_raise(attempt(jobshare.count_share, entries, column, me, n, threads, count_chunk), group),
    )


def share_text(
    path: Any, text: TextSettings, options: Mapping[str, Any] | None, threads: int, group: Collective
) -> Any:
    """One text dataset's index for the whole group: one listing, each footer once, the counting pass split.

    ``text``: the source's tokenizer, text column and BOS/EOS policy. Every rank's cache gets
    every file's counts; each rank's footer cache the footers it read (so a restart there reads none from storage).
    """
    from planner.catalog import jobshare
    from plitzer.text import job
    from plitzer.text.source import text_counting

    me, n = group.rank, group.world
    counting = text_counting(text)
    listed = group.broadcast(attempt(jobshare.listing, path, options) if me == 0 else None)
    if isinstance(listed, BaseException):
        raise listed
    entries, src = jobshare.entries_of(path, options, listed)
    # Each rank reads 1/world of the footers into rows (bytes a row group); the ranks then
    # tokenize 1/world each of the row groups no cache counted (plitzer.text.job: three phases).
    layouts = all_or_raise(attempt(job.layout_share, entries, counting, me, n, threads), group)
    layout = job.take_layout(entries, src, counting, layouts)
    del layouts
    shares = all_or_raise(attempt(job.count_share, layout, counting, me, n), group)
    return job.take_counts(layout, counting, shares)


def share_index(source: Source, cfg: LoaderSettings, group: Collective) -> Source:
    """Each footer read once for the whole job, the listing once; returns the loader's source.

    For one dataset that is its index (a text source's counted, the pass split across the
    ranks). For a mixture each source is shared so in turn and lands in every rank's cache
    (a selected source's selection pass too), and the mixture's index is returned, made of
    those indexes: no rank lists a source again. A source with a job index (``index=``)
    opens it on each rank; an Index is left as it is.
    """
    from planner.mixing.sources import source_specs

    threads = cfg.threads or 32
    if cfg.index is not None:
        return source
    if isinstance(source, Mapping):
        specs = source_specs(
            source,
            column=cfg.column,
            storage_options=cfg.storage_options,
            selection=cfg.selection,
        )
        opened: dict[str, Index] = {}
        for spec in specs:
            if spec.index is not None:  # its job index: one object, no footer to share
                if spec.selection.where is not None and spec.text is None:
                    from planner.catalog.jobindex import load

                    ix = load(spec.index, spec.path, column=spec.column, storage_options=spec.storage_options)
                    _select(ix, spec.selection, cfg.threads, group)
                continue
            if spec.text is not None:
                text = TextSettings.of(spec.text)
                opened[spec.name] = share_text(spec.path, text, spec.storage_options, threads, group)
                continue
            ix = opened[spec.name] = share_one(spec.path, spec.column, spec.storage_options, threads, group)
            if spec.selection.where is not None:
                _select(ix, spec.selection, cfg.threads, group)
        from plitzer.sources import index_of

        # Deduplication is shared next (share_dedupe), over one exchange: not here.
        return index_of(source, cfg.without_dedupe(), opened)
    if not isinstance(source, (str, os.PathLike, list, tuple)):
        return source
    if cfg.text.tokenizer is not None:
        out: Source = share_text(source, cfg.text, cfg.storage_options, threads, group)
        return out
    from plitzer.sources import arrow

    if arrow.claims(source, cfg):
        return share_arrow(source, cfg.column, group)
    return share_one(source, cfg.column, cfg.storage_options, threads, group)


def share_arrow(source: Source, column: str | None, group: Collective) -> Index:
    """An Arrow IPC source's index for the whole group: each rank walks the framing of its share of the files.

    Files ``rank, rank + world, ...`` (its cache's, else one pass over each file's framing:
    :func:`plitzer.sources.arrow.count_files`); an all-gather gives every rank every file's
    batches, as :func:`share_one` shares a Parquet dataset's footers. The files are local to
    each rank (a shared file system): no listing to broadcast.
    """
    from plitzer.sources import arrow

    path = cast("str", source)
    shares = all_or_raise(attempt(arrow.count_files, path, column, group.rank, group.world), group)
    return arrow.arrow_index(path, column=column, counted={i: rows for part in shares for i, rows in part.items()})


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
