"""Work a job shares across its ranks: its index's footers, its selection pass, its checkpoint's parts.

Collective, whatever the framework: the functions here take a :class:`Collective`
(this rank, the world, a broadcast from rank 0 and an all-gather of objects) that an
adapter implements over its process group (``plitzer.torch`` over
``torch.distributed``), so this module imports no framework.

- :func:`share_index`: for one dataset, rank 0 lists and broadcasts the files; unless
  every rank's cache already holds the finished index, each rank reads the footers of
  files ``rank, rank + world, ...`` (its cache's, else one GET each) and an all-gather
  gives every rank all of them (kept in its cache).
- :func:`share_selection`: each rank runs ``1/world`` of the selection pass and the
  all-gather shares the parts, which land in each rank's cache.

A rank whose step fails sends its exception instead, and every rank raises the first
one (:func:`all_or_raise`), so no rank waits on a collective the others left
(docs/design.md, "One index per job"). :func:`join_parts` checks and merges the
checkpoint parts an adapter gathered.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from planner.catalog.dataset import Index
from plitzer.state.settings import LoaderSettings, Source

__all__ = ["Collective", "all_or_raise", "attempt", "join_parts", "share_index", "share_one", "share_selection"]


class Collective(Protocol):
    """A process group as the sharing needs it."""

    @property
    def rank(self) -> int:
        """This process's rank in the group."""
        ...

    @property
    def world(self) -> int:
        """The processes of the group."""
        ...

    def broadcast(self, value: Any) -> Any:
        """Rank 0's ``value`` on every rank (the others pass None)."""
        ...

    def all_gather(self, value: Any) -> list[Any]:
        """Every rank's ``value``, in rank order."""
        ...


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
    """One dataset's index for the whole group: rank 0 lists, each rank reads its share of the footers."""
    from planner.catalog import jobindex

    me, n = group.rank, group.world
    listed = group.broadcast(attempt(jobindex.listing, path, options) if me == 0 else None)
    if isinstance(listed, BaseException):
        raise listed
    entries, src = jobindex.entries_of(path, options, listed)
    if not all(all_or_raise(attempt(jobindex.has_cached_index, entries, column), group)):
        parts = all_or_raise(attempt(jobindex.footer_share, entries, me, n, threads), group)
        jobindex.take_footers(entries, parts)
    return jobindex.job_index(entries, src, column, threads=threads)


def share_index(source: Source, cfg: LoaderSettings, group: Collective) -> Source:
    """Each footer read once for the whole job, the listing once; returns the loader's source.

    For one dataset that is its index. For a mixture each token source is shared so in
    turn and lands in every rank's cache, and the mixture itself is returned (each rank
    then lists each source once more, and reads no footer). Text sources, a job index
    (``index=``) and an Index are left as they are.
    """
    from planner.mixing.sources import source_specs

    threads = cfg.threads or 32
    if cfg.tokenizer is not None or cfg.index is not None:
        return source
    if isinstance(source, Mapping):
        for spec in source_specs(source, column=cfg.column, storage_options=cfg.storage_options):
            if spec.text is None:
                share_one(spec.path, spec.column, spec.storage_options, threads, group)
        return source
    if not isinstance(source, (str, os.PathLike, list, tuple)):
        return source
    return share_one(source, cfg.column, cfg.storage_options, threads, group)


def share_selection(source: Source, cfg: LoaderSettings, group: Collective) -> None:
    """Run this rank's share of the selection pass and gather the others' (SPEC section 10).

    Collective: every rank constructs its loader. Each computes ``1/world`` of the pass
    and the all-gather shares the parts, which land in each rank's cache, so the loader
    built next finds the whole pass there.
    """
    from planner.api import open_index
    from plitzer.selection.select import Part, select_index

    def exchange(part: Part) -> list[Part]:
        return [p for p in group.all_gather(part) if p is not None]

    if cfg.where is None:
        return
    ix = open_index(source, column=cfg.column, storage_options=cfg.storage_options)
    if isinstance(ix, Index):
        select_index(
            ix,
            cfg.where,
            length_column=cfg.length_column,
            rank=cfg.rank,
            world=cfg.world,
            threads=cfg.threads,
            exchange=exchange,
        )


def join_parts(info: list[tuple[int, ...]], datas: list[bytes], world: int, processes: int) -> bytes:
    """One global checkpoint from every process's part: ``info`` is each process's (data rank, world, bytes).

    Refuses processes that disagree on ``world``, two processes of one data rank at different
    positions, and a data rank no process gave.
    """
    from plitzer.errors import CheckpointError, ConfigError
    from plitzer.state import checkpoint as ckpt

    worlds = sorted({w for _, w, _ in info})
    if worlds != [world]:
        msg = f"ranks disagree on world: {worlds}; every rank's Dataset needs the same world (and lanes)"
        raise ConfigError(msg)
    parts: dict[int, bytes] = {}
    for (r, _, _), data in zip(info, datas, strict=True):
        if parts.setdefault(r, data) != data:
            msg = (
                f"two processes with data rank {r} are at different positions; processes that "
                "share a data rank must consume the same batches"
            )
            raise CheckpointError(msg)
    missing = sorted(set(range(world)) - set(parts))
    if missing:
        msg = (
            f"state_dict() gathered no part from data ranks {missing} of world={world}: the process "
            f"group has {processes} processes; pass group= a group that holds every data rank"
        )
        raise ConfigError(msg)
    try:
        return ckpt.merge(parts[r] for r in range(world))
    except CheckpointError as e:
        msg = f"{e}. Call state_dict() on every rank at the same step"
        raise CheckpointError(msg) from e
