"""One row-group index per job without a job index: the ranks of a process group share the listing and the footers.

:func:`listing` on one rank, :func:`entries_of` on every rank from that listing,
:func:`count_share` (each rank indexes its share of the files) and :func:`take_counted`
(everyone's rows); a text source's share reads its footers through :func:`cached_footer`;
``plitzer.state.share`` runs the collectives between them. :func:`job_index` and
:func:`has_cached_index` serve a rank whose machine's cache holds the index already.
docs/design.md, "One index per job" and "Bytes a row group".
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from planner.catalog import chunkmeta, footer
from planner.catalog.counting import Counted, Counting, FooterCounting
from planner.catalog.dataset import build_index, index_entries, scan_footers
from planner.catalog.datasetindex import Index
from planner.catalog.files import FileEntry, list_files
from planner.catalog.frame import LaidOut
from planner.catalog.indexcache import index_cache_path
from planner.catalog.rowlists import ROW_FIELDS
from planner.errors import ConfigError
from planner.stores.backends import open_storages
from planner.stores.storage import FileStat

__all__ = [
    "CountedShare",
    "cached_footer",
    "count_share",
    "entries_of",
    "has_cached_index",
    "job_index",
    "listing",
    "take_counted",
]


def listing(
    source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], storage_options: Mapping[str, Any] | None
) -> list[FileStat]:
    """The files of ``source`` (one listing: what one rank does for the job)."""
    return [e.stat for e in list_files(source, storage_options)[0]]


def entries_of(
    source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    storage_options: Mapping[str, Any] | None,
    stats: Sequence[FileStat],
) -> tuple[list[FileEntry], str]:
    """The entries of a listing another rank made (no request: storages open without I/O).

    A list source's files are named ``i/name`` by their source's position (as
    :func:`planner.catalog.files.list_files` names them); each goes to its own storage.
    """
    storages = open_storages(source, storage_options)
    out = []
    for st in stats:
        i = 0 if len(storages) == 1 else int(st.name.split("/", 1)[0])
        out.append(FileEntry(stat=st, storage=storages[i]))
    return out, ", ".join(s.url for s in storages)


def has_cached_index(entries: Sequence[FileEntry], column: str | None) -> bool:
    """Whether this machine's cache holds the finished index of these files (then no footer is needed)."""
    path = index_cache_path(entries, FooterCounting(column))
    return path is not None and path.exists()


@dataclass(frozen=True, slots=True)
class CountedShare:
    """One rank's share of the row-group index a job's ranks count together: the rows and templates of files
    ``rank, rank + world, ...``.

    What the ranks exchange (bytes a row group: the rows, a field at a time, zstd-compressed
    in one buffer; a template a file), never footers. An object all-gather copies its
    payload three or four times (pickle, tensor, the gathered tensors, unpickled): as
    arrays, 72 B a row group became 330 B of a rank's peak; compressed, a few. ``counts``
    is each counted file's row groups; ``errors`` is empty or the first file's DataError message.
    """

    files: tuple[int, ...]
    rows: bytes
    counts: tuple[int, ...]
    columns: tuple[str, ...]
    dtypes: tuple[str, ...]
    stored: tuple[str, ...]
    templates: tuple[bytes, ...]

    def lay_into(self, fields: Sequence[NDArray[np.int64]], starts: NDArray[np.int64]) -> None:
        """Copy each counted file's rows into ``fields`` (a column a field) from its row ``starts[file]`` on."""
        n = sum(self.counts)
        raw = pa.decompress(
            self.rows, decompressed_size=n * len(ROW_FIELDS) * 8, codec="zstd", memory_pool=pa.system_memory_pool()
        )
        table = np.frombuffer(raw, np.int64).reshape(len(ROW_FIELDS), n)
        at = 0
        for i, c in zip(self.files, self.counts, strict=False):
            for k, out in enumerate(fields):
                out[starts[i] : starts[i] + c] = table[k, at : at + c]
            at += c


def count_share(
    entries: Sequence[FileEntry],
    column: str | None,
    rank: int,
    world: int,
    threads: int = 32,
    count: footer.ChunkCounter | None = None,
    *,
    counting: Counting | None = None,
    fetch: Callable[[FileEntry], bytes] | None = None,
) -> CountedShare:
    """Index files ``rank, rank + world, ...`` from their footers (one read each), for :func:`take_counted`.

    ``counting``: how a file's rows are made from its footer (default: the token column's
    statistics); ``fetch``: how its footer bytes are read (default: one ranged read).
    """
    mine = [entries[i] for i in range(rank, len(entries), world)]
    how = FooterCounting(column, count) if counting is None else counting
    counted = [c for c in (scan_footers(mine, how, None, threads, fetch) if mine else []) if c is not None]
    counts = tuple(len(c.rows) for c in counted)
    # Field-major, a file at a time, each file's rows let go once copied.
    fields = np.empty((len(ROW_FIELDS), sum(counts)), np.int64)
    at = 0
    for k, c in enumerate(counted):
        fields[:, at : at + counts[k]] = np.asarray(c.rows, np.int64).reshape(-1, len(ROW_FIELDS)).T
        at += counts[k]
        counted[k] = Counted([], c.column, c.dtype, c.stored)
    share = CountedShare(
        files=tuple(range(rank, len(entries), world)),
        rows=pa.compress(fields, codec="zstd", asbytes=True, memory_pool=pa.system_memory_pool()),
        counts=counts,
        columns=tuple(c.column for c in counted),
        dtypes=tuple(c.dtype for c in counted),
        stored=tuple(c.stored for c in counted),
        templates=tuple(e.template.key() if e.template else b"" for e in mine),
    )
    del counted, fields
    # The footers' threads' heaps and the rows, before the exchange: once they are let go
    # (trimmed before, the rows freed after it stayed resident: 9 MB at 60,000 row groups).
    footer.give_back_memory()
    return share


def take_counted(
    entries: list[FileEntry],
    src: str,
    column: str | None,
    parts: Sequence[CountedShare],
    counting: Counting | None = None,
) -> Index:
    """The row-group index the job's ranks counted, from every rank's :func:`count_share` (no footer read), cached here.

    ``counting``: the one the shares were made with (its fingerprint, cache and wrapping).
    """
    counted: list[Counted | None] = [None] * len(entries)
    per = np.zeros(len(entries), np.int64)
    for part in parts:
        for k, i in enumerate(part.files[: len(part.counts)]):
            counted[i] = Counted([], part.columns[k], part.dtypes[k], part.stored[k])  # type: ignore[arg-type]
            per[i] = part.counts[k]
            entries[i].template = chunkmeta.Template.from_key(part.templates[k]) if part.templates[k] else None
    missing = [e.stat.location for e, c in zip(entries, counted, strict=True) if c is None]
    if missing:
        msg = f"the ranks' shares lack {len(missing)} files, first {missing[0]}; every rank must share"
        raise ConfigError(msg)
    # Each part's rows straight into the frame's columns, one part decompressed at a time:
    # no copy a file (those were 72 B a row group on top of the columns, and left the heap
    # fragmented for what came next: docs/design.md, "Bytes a row group").
    starts = np.concatenate([[0], np.cumsum(per)]).astype(np.int64)
    fields = [np.empty(int(starts[-1]), np.int64) for _ in ROW_FIELDS]
    for part in parts:
        part.lay_into(fields, starts)
    del parts  # the caller's only reference (plitzer.state.share): the rows now live in ``fields`` alone
    footer.give_back_memory()  # the exchange's copies
    done = [c for c in counted if c is not None]
    del counted
    laid = LaidOut(per, fields)
    del fields  # build_index lets the columns the frame does not take go once it is built
    return build_index(entries, src, FooterCounting(column) if counting is None else counting, done, laid)


def cached_footer(e: FileEntry) -> bytes:
    """``e``'s footer bytes from this machine's footer cache, else one ranged read (then cached).

    A text source's job share reads footers so: a restart on the same machine reads none
    from storage (the counts are cached apart from the index, so the index is not).
    """
    raw = footer.cached(e.stat)
    if raw is None:
        with footer.fetch_lock(e.stat):
            raw = footer.cached(e.stat)
            if raw is None:
                raw = footer.fetch(e.storage, e.stat)
                footer.parse(raw, e.stat.location)  # damaged: refused here, naming the file, not cached
                with contextlib.suppress(OSError):  # a read-only cache costs speed only
                    footer.remember(e.stat, raw)
    return raw


def job_index(
    entries: list[FileEntry],
    src: str,
    column: str | None,
    threads: int = 32,
    count: footer.ChunkCounter | None = None,
) -> Index:
    """The index of files already listed: this machine's cached index, else their footers read here."""
    return index_entries(entries, src, FooterCounting(column, count), threads=threads)
