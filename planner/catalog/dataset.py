"""The row-group index: one row per row group, built from Parquet footers alone.

``index(source)`` lists the ``*.parquet`` files below ``source`` (bytewise order of
their path relative to it), reads every footer concurrently, and returns an
:class:`Index`: a Polars frame with, per row group, its file, rows, exact token
count, and the byte range of the token column chunk (the one ranged read the
runtime will issue), plus the dataset fingerprint.

Token counts come from the footer: for a list column the leaf statistics'
``num_values`` is the number of non-null tokens, and the chunk's own
``num_values`` minus that is the number of empty (or null) documents. planner
reads metadata only: a row group whose footer has no statistics is counted by a
:class:`planner.catalog.footer.ChunkCounter` that reads it once (the runtime's, ``plitzer.readpath.read``).

The token column is a list or large_list of any integer type; batches are int32,
or uint32 for uint32 and uint64 data (``Index.dtype``). Where a token may not fit
(int64 or uint64 data whose footer min/max do not prove it), ``needs_check`` marks
the row group and decoding checks every value.

How a row group's tokens are counted is a :class:`~planner.catalog.counting.Counting`
step; this module runs everything else, so the text index
(``plitzer.text.source.TextCounting``, a tokenizer pass) shares it: the listing
(:mod:`planner.catalog.files`), the footers (:func:`scan_footers`), the frame and its
fingerprint (:mod:`planner.catalog.frame`) and the cache entry
(:mod:`planner.catalog.indexcache`). The :class:`~planner.catalog.datasetindex.Index` it
gives is :mod:`planner.catalog.datasetindex`'s.

Footers are streamed: parsed, counted and dropped; what is kept of each is its rows and a
template (:mod:`planner.catalog.chunkmeta`), bytes a row group. The finished index is
cached under ``PLITZER_CACHE`` (default ``~/.cache/plitzer``), keyed by each file's
location, size and mtime (ETag on S3), never inside the dataset. A second call on an
unchanged dataset lists the files and reads no footer.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from planner.catalog import chunkmeta, footer
from planner.catalog.counting import Counted, Counting, FooterCounting
from planner.catalog.datasetindex import Index
from planner.catalog.files import FileEntry, list_files
from planner.catalog.frame import LaidOut, build_frame, fingerprint_of
from planner.catalog.indexcache import from_cache, index_cache_path, to_cache
from planner.errors import ConfigError
from planner.progress import progress_enabled
from planner.runtime import COUNT, runtime_pass

__all__ = ["Index", "build_index", "ensure_index", "index", "index_entries", "scan_footers"]


def scan_footers(
    entries: list[FileEntry],
    counting: Counting,
    progress: bool | None,
    threads: int,
    fetch: Callable[[FileEntry], bytes] | None = None,
) -> list[Counted | None]:
    """Every file's footer (read once, one ranged read) and what ``counting`` gets from it, concurrently.

    Streaming: a footer is parsed, counted and dropped in one task, so what is held is
    the files' rows and templates (bytes a row group), never every footer. A counting
    step that reads its footers again in :meth:`Counting.finish` (a text pass) keeps
    them until then. Footers are not cached on disk: the finished index is (``fetch``, one
    file's footer bytes, may read them from a cache of its own: a text source's job share).
    """
    own_check = counting.checks_histograms()

    # Fetches run on every thread (an object store's latency); parsing and counting on as
    # many as there are cores, so the parsed footers held at once (several MB each on
    # files of many columns) are bounded by the cores, not by the threads.
    parsing = threading.BoundedSemaphore(os.cpu_count() or 2)

    def load(entry: FileEntry) -> Counted | None:
        if entry.raw is not None:
            raw = entry.raw
        else:
            raw = footer.fetch(entry.storage, entry.stat) if fetch is None else fetch(entry)
        with parsing:
            md = footer.parse(raw, entry.stat.location, check=not own_check)
            entry.metadata, entry.raw = md, raw
            result = counting.scan(entry)
            if result is not None:
                entry.template = chunkmeta.template_of(raw, md, result.column, entry.stat.location)
                entry.metadata = entry.raw = None
            del md
        return result

    from tqdm import tqdm

    # No more fetches at once than the stores serve well (local disk: its cores), so that
    # the footers fetched and waiting for a core stay few.
    workers = min(threads, len(entries), max(e.storage.concurrency for e in entries))
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return list(
            tqdm(
                pool.map(load, entries),
                total=len(entries),
                desc="footers",
                unit="file",
                disable=not progress_enabled(progress, len(entries), 64),
                leave=False,
            )
        )


def index(
    source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    column: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    *,
    progress: bool | None = None,
    threads: int = 32,
    count: footer.ChunkCounter | None = None,
    counting: Counting | None = None,
) -> Index:
    """Build (or load from the cache) the row-group index of ``source``.

    Parameters
    ----------
    source : str, PathLike or list of them
        A local folder (searched recursively for ``*.parquet``), one file,
        ``s3://bucket/prefix``, ``gs://bucket/prefix``, ``az://container/prefix`` (or
        ``abfs://``), or a list of these (files of each source in turn).
    column : str, optional
        The token column (a list or large_list of any integer type); by default
        the one integer-list column named ``input_ids``, ``tokens`` or
        ``token_ids``, else the one integer-list column.
    storage_options : dict, optional
        S3 settings: ``endpoint``, ``region``, ``key``, ``secret``, ``anon``.
    progress : bool, optional
        Show a progress bar while reading footers (default: when there are many
        files and stderr is a terminal).
    count : callable, optional
        Counts a row group whose footer lacks statistics by reading its token
        column once (:class:`planner.catalog.footer.ChunkCounter`): by default the
        runtime's, ``plitzer.readpath.read.count_chunk``, as installed
        (:mod:`planner.runtime`). planner itself reads metadata only: without that pass such
        a footer is a DataError saying what to pass.
    counting : Counting, optional
        How to count a row group's tokens; by default ``FooterCounting(column, count)``
        (footer statistics). ``plitzer.text.source`` passes a tokenizer pass.

    Examples
    --------
    An HF-style file: ``input_ids`` (list<int32>) beside an int8 ``attention_mask``.

    >>> import os, tempfile, planner, pyarrow as pa, pyarrow.parquet as pq
    >>> d = tempfile.mkdtemp()
    >>> ids = pa.array([[5, 6, 7], [8, 9]], pa.list_(pa.int32()))
    >>> mask = pa.array([[1, 1, 1], [1, 1]], pa.list_(pa.int8()))
    >>> pq.write_table(pa.table({"input_ids": ids, "attention_mask": mask}), os.path.join(d, "a.parquet"))
    >>> ix = planner.index(d)
    >>> ix.column, ix.dtype, ix.tokens
    ('input_ids', 'int32', 5)
    >>> ix.frame.columns[:5]
    ['file', 'file_index', 'row_group', 'rows', 'tokens']
    """
    if counting is None:  # plitzer's counter as installed (planner.runtime), unless given
        counting = FooterCounting(column, runtime_pass(count, COUNT))
    entries, src = list_files(source, storage_options)
    return index_entries(entries, src, counting, progress=progress, threads=threads)


def index_entries(
    entries: list[FileEntry], src: str, counting: Counting, *, progress: bool | None = None, threads: int = 32
) -> Index:
    """The index of files already listed (:func:`index` after its listing; a job's shared listing)."""
    cached = index_cache_path(entries, counting)
    if cached is None:
        return _index_entries(entries, src, counting, progress, threads)
    hit = from_cache(cached, counting, src, entries)
    if hit is not None:
        return hit
    # Processes that share the cache folder and open the dataset at once read its footers
    # once: the first builds the index under the lock, the others then find it cached.
    with footer.cache_lock(cached.stem):
        hit = from_cache(cached, counting, src, entries)
        return hit if hit is not None else _index_entries(entries, src, counting, progress, threads)


def _index_entries(
    entries: list[FileEntry], src: str, counting: Counting, progress: bool | None, threads: int
) -> Index:
    counted = counting.finish(entries, scan_footers(entries, counting, progress, threads), progress)
    footer.give_back_memory()  # the footers' threads' heaps (footer.give_back_memory)
    for e, c in zip(entries, counted, strict=True):  # what finish counted kept its footer until now
        if e.metadata is not None and e.raw is not None:
            e.template = chunkmeta.template_of(e.raw, e.metadata, c.column, e.stat.location)
        e.metadata = e.raw = None
    return build_index(entries, src, counting, counted)


def build_index(
    entries: list[FileEntry], src: str, counting: Counting, counted: list[Counted], laid_out: LaidOut | None = None
) -> Index:
    """The index of files counted already (here, or by the ranks of a job), cached where ``counting`` is.

    ``laid_out``: the rows, where ``counted`` holds each file's column alone (:class:`LaidOut`).
    """
    frame = build_frame(entries, counted, laid_out)
    del laid_out
    footer.give_back_memory()  # the rows it was built from, before the cache entry is written
    first = counted[0]
    fp = fingerprint_of(frame, counting.fingerprint_extra())
    cached = index_cache_path(entries, counting)
    if cached is not None:
        to_cache(cached, frame, first.column, first.dtype, fp, entries)
    footer.give_back_memory()
    ix = Index(frame=frame, column=first.column, dtype=first.dtype, fingerprint=fp, source=src, _files=entries)
    return counting.wrap(ix)


def ensure_index(
    source: Index | str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    column: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    *,
    count: footer.ChunkCounter | None = None,
) -> Index:
    """``source`` if it is an :class:`Index` (of the same ``column``), else its index (``count``: as :func:`index`)."""
    if isinstance(source, Index):
        if column is not None and column != source.column:
            msg = f"column={column!r} differs from the index's token column {source.column!r}; pass the same column"
            raise ConfigError(msg)
        return source
    return index(source, column=column, storage_options=storage_options, count=count)
