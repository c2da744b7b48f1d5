"""The other columns a job index carries (``--columns``): their chunks read off each file's footer.

:func:`carry` builds the index of the files as :func:`planner.catalog.dataset.index_entries`
does, with a counting step (:class:`CarryingCounting`) that reads, from the same footer read,
the chunks of ``columns`` (:func:`planner.catalog.footer.column_chunks`) into each entry;
where the index is cached already, each file's footer is read for the carried columns alone.
:mod:`planner.catalog.jobindex` writes and reads them (docs/design.md, "One index per job").
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pyarrow.parquet as pq

from planner.catalog import footer
from planner.catalog.counting import Counted, Counting, FooterCounting
from planner.catalog.dataset import index_entries
from planner.catalog.datasetindex import Index
from planner.catalog.files import FileEntry
from planner.errors import ConfigError
from planner.runtime import COUNT, runtime_pass

__all__ = ["CarryingCounting", "carry"]


@dataclass(frozen=True, slots=True)
class CarryingCounting:
    """:class:`FooterCounting`'s counts, and from the same footer read the carried columns' chunks (:func:`carry`)."""

    inner: FooterCounting
    columns: tuple[str, ...]
    first: str
    """The first file's name: its entry keeps the file's Arrow schema."""

    def cache_key(self) -> tuple[object, ...]:
        return self.inner.cache_key()  # the counts are the same: the cached index is the plain one

    def scan(self, entry: FileEntry) -> Counted:
        got = self.inner.scan(entry)
        assert entry.metadata is not None and entry.raw is not None
        _carry_file(entry, entry.raw, entry.metadata, self.columns, got.column, first=entry.stat.name == self.first)
        return got

    def finish(
        self, entries: Sequence[FileEntry], scanned: list[Counted | None], progress: bool | None
    ) -> list[Counted]:
        return self.inner.finish(entries, scanned, progress)

    def fingerprint_extra(self) -> str:
        return self.inner.fingerprint_extra()

    def checks_histograms(self) -> bool:
        return True  # the token column's in inner.scan, each carried column's in column_chunks

    def wrap(self, ix: Index) -> Index:
        return ix


def _carry_file(
    entry: FileEntry, raw: bytes, md: pq.FileMetaData, columns: Sequence[str], token: str, *, first: bool
) -> None:
    where = entry.stat.location
    for name in columns:
        if name == token:
            msg = f"columns=: {name!r} is the token column, which every job index carries; name the others"
            raise ConfigError(msg)
        got = footer.column_chunks(raw, md, name, entry.stat.size, where)
        if got is None:
            msg = (
                f"{where}: no column {name!r} to carry in the job index (its columns: "
                f"{', '.join(footer.schema_of(md).names)}); leave it out of --columns"
            )
            raise ConfigError(msg)
        entry.columns[name] = got
    if first:
        entry.schema = footer.schema_of(md).to_arrow_schema().remove_metadata()


def carry(
    entries: list[FileEntry],
    src: str,
    column: str | None,
    columns: Sequence[str],
    *,
    progress: bool | None = None,
    threads: int = 32,
    count: footer.ChunkCounter | None = None,
) -> Index:
    """The index of these files, each entry holding the chunks of ``columns`` too (for ``jobindex.encode``).

    One footer read a file: while the index is built from footers, or, where it is cached
    already, for the carried columns alone.
    """
    counting: Counting = CarryingCounting(
        FooterCounting(column, runtime_pass(count, COUNT)), tuple(columns), entries[0].stat.name
    )
    ix = index_entries(entries, src, counting, progress=progress, threads=threads)
    todo = [e for e in entries if any(c not in e.columns for c in columns)]

    def one(e: FileEntry) -> None:
        raw = footer.cached(e.stat)
        if raw is None:
            raw = footer.fetch(e.storage, e.stat)
        md = footer.parse(raw, e.stat.location, check=False)  # each carried column's histograms: column_chunks
        _carry_file(e, raw, md, columns, ix.column, first=e is entries[0])

    if todo:
        workers = min(threads, len(todo), max(e.storage.concurrency for e in todo))
        with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            list(pool.map(one, todo))
    return ix
