"""Parquet token columns: the kind that claims every source no other kind claims.

A path, an ``s3://`` (``gs://``, ``az://``, ``hf://``, ``http(s)://``) URL, a list of them, an
index already built, or a dict of named sources (a mixture: each source opened by its own kind's
rules inside :func:`planner.api.open_index`). planner lists the files, reads the footers
(:mod:`planner.catalog`) and counts; :func:`plitzer.readpath.read.parquet_tokens` reads a row
group's token column chunk in one ranged read. Capabilities: every pass
(:data:`planner.catalog.rowgroups.PARQUET`). A job's ranks share its footers (:func:`share_one`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from planner.api import Source
from planner.catalog.datasetindex import Index
from plitzer.readpath.read import count_chunk
from plitzer.sources.exchange import all_or_raise, attempt

__all__ = ["claims", "prepare", "share", "share_one"]


def claims(source: Source, settings: Any) -> bool:
    """Every source: Parquet is the default kind, asked last."""
    return True


def prepare(source: Source, settings: Any) -> tuple[Source, dict[str, Any]]:
    """``source`` as given: planner opens it (paths, an index, a mixture)."""
    return source, {}


def share(source: Source, settings: Any, group: Any) -> Source:
    """The dataset's index for a job's ``group``: :func:`share_one`."""
    return share_one(source, settings.column, settings.storage_options, settings.threads or 32, group)


def share_one(path: Any, column: str | None, options: Mapping[str, Any] | None, threads: int, group: Any) -> Index:
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
