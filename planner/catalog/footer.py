"""One file's footer: fetched with one ranged read, checked, parsed, turned into index rows.

:func:`fetch` reads the footer (a single ranged read of the file's tail when the
footer fits in 64 KiB, else a second one), :func:`parse` checks it and parses it,
:func:`row_groups` gives the file's index rows: per row group its rows, exact
token count (the leaf statistics' non-null value count), empty documents and the
token column chunk's byte range (from one pass over the footer's bytes where the
layout is certain: :mod:`planner.catalog.onepass`). :func:`cached` and :func:`remember` keep the
footer bytes in the local cache, keyed by the file's location, size and version.

Before pyarrow touches a column chunk's metadata, the footer's level histograms are
checked (:mod:`planner.catalog.histograms`): pyarrow aborts the process on ones that do
not fit the schema. :func:`give_back_memory` returns the heaps of the threads that
parsed footers.
"""

from __future__ import annotations

import os
import struct
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from numpy.typing import NDArray

from planner.catalog import onepass
from planner.catalog.chunkmeta import ColumnChunks, codec_of, template_of
from planner.catalog.column import TokenDtype, delivered_dtype, narrows, token_column_of, token_range
from planner.catalog.histograms import check_column_histograms, check_level_histograms
from planner.errors import DataError, one_line
from planner.stores.cache import cache_dir, digest, read_entry, write_entry
from planner.stores.storage import FileStat, Storage

__all__ = [
    "column_chunks",
    "leaves_of",
    "ROW_FIELDS",
    "ChunkCounter",
    "Row",
    "cached",
    "fetch",
    "cache_lock",
    "fetch_lock",
    "give_back_memory",
    "parse",
    "remember",
    "row_groups",
    "schema_of",
]

_TAIL = 64 << 10
_FORMAT = "2"  # entries with a length and checksum (planner.stores.cache)
_FOOTER_CAP = 256 << 20


class ChunkCounter(Protocol):
    """Counts (tokens, empty documents) of one row group by reading its token column.

    planner reads metadata only; a footer without statistics needs the column read
    once to count, which the runtime does (``plitzer.readpath.read.count_chunk``, which
    plitzer's entry points pass as ``count=``; nothing is registered).
    """

    def __call__(
        self,
        storage: Storage,
        file: FileStat,
        metadata: pq.FileMetaData,
        *,
        row_group: int,
        column: str,
        offset: int,
        length: int,
        where: str,
    ) -> tuple[int, int]: ...


def give_back_memory() -> None:
    """Return the C heap's free memory to the system (glibc's ``malloc_trim``; elsewhere nothing).

    Footers are parsed on many threads, and glibc gives each thread's allocations an
    arena of its own, whose freed pages stay resident: after a cold index those were a
    hundred bytes a row group that the next phase (the frame, the first epoch's plan) did
    not reuse, since it allocates on another thread. Called once after each of those
    phases; no library exposes it (Arrow's ``release_unused`` covers Arrow's pool only).
    """
    if _LIBC is not None:
        _LIBC.malloc_trim(0)
    pa.default_memory_pool().release_unused()


def _libc() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:  # glibc by its soname (ctypes.util.find_library would run ldconfig at import)
        lib = ctypes.CDLL("libc.so.6")
    except OSError:
        return None
    return lib if hasattr(lib, "malloc_trim") else None


_LIBC = _libc()


def schema_of(md: pq.FileMetaData) -> pq.ParquetSchema:
    """``md.schema`` without the reference cycle it makes.

    ``FileMetaData.schema`` caches a ParquetSchema that refers back to it, so a footer
    whose schema was looked at is freed only by the cycle collector, some full passes
    later: megabytes a footer on files of many columns, and the index's peak grew with
    the files (1.3 GB at 300 FineWeb-Edu-shaped files). A schema made apart is not cached.
    """
    return pq.ParquetSchema(md)


def parse(raw: bytes, where: str, *, check: bool = True) -> pq.FileMetaData:
    """The parsed footer, checked first for what would abort pyarrow; a DataError naming ``where``.

    ``check=False`` leaves the level histograms unchecked: the caller then touches only
    the column chunks it checked itself (:func:`check_column_histograms`).
    """
    try:
        md = pq.read_metadata(pa.BufferReader(b"PAR1" + raw))
        schema = schema_of(md)
        levels = [
            (schema.column(j).max_repetition_level, schema.column(j).max_definition_level)
            for j in range(md.num_columns)
        ]
    except (pa.ArrowException, OSError, ValueError) as e:
        msg = f"{where}: the Parquet footer is damaged ({type(e).__name__}: {one_line(e)}); restore or rewrite the file"
        raise DataError(msg) from e
    # Before any column chunk's metadata is touched: pyarrow aborts the process on
    # level histograms that do not fit the schema (check_level_histograms, below).
    if check:
        check_level_histograms(raw[:-8], levels, where)
    return md


def fetch(storage: Storage, st: FileStat) -> bytes:
    """The footer bytes plus its 8-byte tail (length and magic): one read if it fits."""
    if st.size == 0:
        msg = f"{st.location}: the file is empty (0 bytes), not Parquet; delete it or restore it"
        raise DataError(msg)
    if st.size < 12:
        msg = f"{st.location}: {st.size} bytes is too short for Parquet; the file is truncated"
        raise DataError(msg)
    n = min(st.size, _TAIL)
    tail = storage.read_range(st, st.size - n, n)
    if tail[-4:] != b"PAR1":
        msg = f"{st.location}: no Parquet magic at the end of the file; it is not Parquet or it is truncated"
        raise DataError(msg)
    (flen,) = struct.unpack("<I", tail[-8:-4])
    if flen + 12 > st.size or flen > _FOOTER_CAP:
        msg = f"{st.location}: footer length {flen} does not fit the file's {st.size} bytes; the file is truncated"
        raise DataError(msg)
    if flen + 8 > n:
        tail = storage.read_range(st, st.size - flen - 8, flen + 8)
    return tail[-(flen + 8) :]


def _path(st: FileStat) -> Path:
    return cache_dir() / "footers" / f"{digest(_FORMAT, st.location, st.size, st.version)}.footer"


def cached(st: FileStat) -> bytes | None:
    """The file's footer bytes from the local cache, or None (absent, or damaged: then discarded)."""
    return read_entry(_path(st))


def remember(st: FileStat, raw: bytes) -> None:
    """Keep the file's footer bytes in the local cache (where it can be written)."""
    write_entry(_path(st), raw)


_LOCK_STRIPES = 1024


@contextmanager
def fetch_lock(st: FileStat) -> Iterator[None]:
    """Hold the cache's lock for ``st``'s footer, so processes sharing the cache fetch it once.

    An advisory ``flock`` on one of 1,024 lock files (picked by the footer's cache name)
    in a folder of the system's temporary folder named after the cache folder: the
    holder fetches and remembers, the next finds the footer cached. Where locks are
    unavailable (no ``fcntl``, no writable temporary folder) it holds nothing: a footer
    may then be fetched twice, never wrongly.
    """
    with cache_lock(_path(st).stem):
        yield


@contextmanager
def cache_lock(name: str) -> Iterator[None]:
    """Hold the cache's lock for the entry named ``name`` (a hex digest), across processes.

    What :func:`fetch_lock` holds for a footer, for any entry: the first process builds
    it, the next finds it built (the index of a dataset that several processes open at once).
    """
    try:
        import fcntl
    except ImportError:  # not POSIX
        yield
        return
    # Beside the cache, not in it (the cache holds entries only): processes of one machine
    # that share the cache folder share the temporary folder too.
    folder = Path(tempfile.gettempdir()) / f"plitzer-locks-{digest(str(cache_dir()))[:16]}"
    path = folder / f"{int(name[:8], 16) % _LOCK_STRIPES:04d}"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


ROW_FIELDS = 9
Row = tuple[int, int, int, int, int, int, bool, int, int]
"""row_group, rows, tokens, empty_docs, offset, length, check, codec, chunk_values (the chunk's level count)."""


def _fits(stats: Any, dtype: TokenDtype) -> bool:
    """Whether the footer's min/max prove every token of the chunk fits ``dtype``."""
    try:
        if stats is None or not stats.has_min_max:
            return False
        lo, hi = token_range(dtype)
        return lo <= int(stats.min) and int(stats.max) <= hi
    except (pa.ArrowException, ValueError, TypeError):
        return False  # unreadable statistics: check every value at decode


def row_groups(
    storage: Storage,
    st: FileStat,
    md: pq.FileMetaData,
    column: str | None,
    count: ChunkCounter | None,
    *,
    raw: bytes | None = None,
    checked: bool = True,
) -> tuple[NDArray[np.int64], str, pa.DataType]:
    """One file's index rows (an int64 array, a :data:`Row` a row), its token column's name and its type.

    A row per row group: (row_group, rows, tokens, empty_docs, offset, length,
    check, codec, chunk_values), where offset and length are the token column chunk's
    byte range, check says whether decoding must check every value (``narrows``), and
    codec and chunk_values are what a minimal footer needs (:mod:`planner.catalog.chunkmeta`).
    ``checked=False``: ``md`` was parsed without the level-histogram check, so the token
    column's chunks are checked here (from ``raw``) before any of them is touched.
    """
    name, dtype, j = _token_leaf(md, column, st.location)
    delivered = delivered_dtype(dtype)
    narrowing = narrows(dtype)
    col = schema_of(md).column(j)
    physical = col.physical_type
    if raw is not None:
        fast = _one_pass(raw, storage, st, md, j, col, name, delivered, narrowing)
        if fast is not None:
            return fast, name, dtype
    if not checked:
        if raw is None:
            msg = "row_groups(checked=False) needs the footer's bytes (raw=)"
            raise ValueError(msg)
        check_column_histograms(raw, md, j, st.location)
    # One int64 row a row group, filled in place: no tuple or int object outlives the loop.
    rows = np.empty((md.num_row_groups, ROW_FIELDS), np.int64)
    for g in range(md.num_row_groups):
        rows[g] = _row(storage, st, md, g, j, name, physical, delivered, narrowing, count)
    return rows, name, dtype


def _token_leaf(md: pq.FileMetaData, column: str | None, where: str) -> tuple[str, pa.DataType, int]:
    """The token column's name and type, and its one leaf's number in the footer (a DataError if nested)."""
    try:
        schema = schema_of(md).to_arrow_schema()
    except (pa.ArrowException, ValueError) as e:
        msg = f"{where}: unreadable schema ({one_line(e)}); the footer is damaged"
        raise DataError(msg) from e
    name, dtype = token_column_of(schema, column, where)
    pschema = schema_of(md)
    leaf = [j for j in range(md.num_columns) if pschema.column(j).path.split(".")[0] == name]
    if len(leaf) != 1:
        msg = f"{where}: token column {name!r} is nested ({len(leaf)} leaves); it must be a flat list"
        raise DataError(msg)
    return name, dtype, leaf[0]


def _one_pass(
    raw: bytes,
    storage: Storage,
    st: FileStat,
    md: pq.FileMetaData,
    j: int,
    col: pq.ColumnSchema,
    name: str,
    delivered: TokenDtype,
    narrowing: bool,
) -> NDArray[np.int64] | None:
    """The rows from one pass over the footer's bytes (:mod:`planner.catalog.onepass`), or None where not certain.

    One pass in C over the token column ``col`` (leaf ``j``), checked against :func:`_row`'s rows
    for the first and last row groups; None where the layout is not certain (the caller then
    takes every row group itself).
    """
    try:
        fast = onepass.rows(
            raw,
            md,
            j,
            col.path,
            col.physical_type,
            delivered,
            narrowing,
            '"isSigned":false' in col.logical_type.to_json(),
            st.size,
            (col.max_repetition_level, col.max_definition_level),
        )
    except (ValueError, pa.ArrowException):  # a damaged footer: the per-row-group path's error
        return None
    if fast is not None and _agrees(fast, storage, st, md, j, name, col.physical_type, delivered, narrowing):
        return fast
    return None


def _agrees(
    fast: NDArray[np.int64],
    storage: Storage,
    st: FileStat,
    md: pq.FileMetaData,
    j: int,
    name: str,
    physical: str,
    delivered: TokenDtype,
    narrowing: bool,
) -> bool:
    """Whether the first and last rows of the one-pass path are the per-row-group path's (no chunk read)."""
    try:
        return all(
            tuple(int(x) for x in fast[g]) == _row(storage, st, md, g, j, name, physical, delivered, narrowing, None)
            for g in {0, md.num_row_groups - 1}
        )
    except DataError:
        return False  # the per-row-group path raises its own first error


def _row(
    storage: Storage,
    st: FileStat,
    md: pq.FileMetaData,
    g: int,
    j: int,
    name: str,
    physical: str,
    delivered: TokenDtype,
    narrowing: bool,
    count: ChunkCounter | None,
) -> Row:
    """Row group ``g``'s index row from pyarrow's accessors (its token chunk's histograms checked already)."""
    rg = md.row_group(g)
    cc = rg.column(j)
    where = f"{st.location}, row group {g}"
    start, length = _chunk_range(cc, rg.num_rows, physical, st.size, where)
    stats = cc.statistics if cc.is_stats_set else None
    if rg.num_rows == 0:
        tokens, empties = 0, 0
    elif stats is not None and stats.has_null_count:
        tokens = int(stats.num_values)
        empties = int(cc.num_values) - tokens
    else:
        tokens, empties = _counter(count, where)(
            storage, st, md, row_group=g, column=name, offset=start, length=length, where=where
        )
    if tokens < 0 or empties < 0 or empties > rg.num_rows:
        msg = (
            f"{where}: footer statistics are inconsistent (tokens {tokens}, rows {rg.num_rows}); the footer is damaged"
        )
        raise DataError(msg)
    check = narrowing and tokens > 0 and not _fits(stats, delivered)
    codec = codec_of(cc.compression, where)
    return (g, rg.num_rows, tokens, empties, start, length, check, codec, cc.num_values)


def _chunk_range(cc: Any, num_rows: int, physical: str, size: int, where: str) -> tuple[int, int]:
    """The token column chunk's byte range ``(offset, length)``, checked against the file and the column's type."""
    start = cc.data_page_offset
    if cc.has_dictionary_page and cc.dictionary_page_offset is not None and cc.dictionary_page_offset > 0:
        start = min(start, cc.dictionary_page_offset)
    length = cc.total_compressed_size
    if num_rows > 0 and (start < 4 or length < 0 or start + length > size):
        msg = (
            f"{where}: the token column chunk [{start}, {start + length}) lies outside the file; the footer is damaged"
        )
        raise DataError(msg)
    # pyarrow aborts the process (an uncaught C++ exception) when statistics are
    # read from a column chunk whose type field was damaged; check it first.
    if cc.physical_type != physical:
        msg = (
            f"{where}: the footer gives the token column type {cc.physical_type}, not {physical}; the footer is damaged"
        )
        raise DataError(msg)
    return int(start), int(length)


def _counter(count: ChunkCounter | None, where: str) -> ChunkCounter:
    """What counts a chunk whose footer has no statistics: ``count``, as passed (nothing is registered)."""
    counter = count
    if counter is None:
        msg = (
            f"{where}: the footer has no statistics for the token column, so its tokens must be counted "
            "by reading it once, and planner reads metadata only: import plitzer and index it with plitzer "
            "(plitzer.index, plitzer.plan, plitzer.Loader), or pass count=plitzer.readpath.read.count_chunk"
        )
        raise DataError(msg)
    return counter


def leaves_of(pschema: pq.ParquetSchema, column: str) -> list[int]:
    """The leaf columns (numbers in the footer) of top-level column ``column``: one for a flat column or a list."""
    return [j for j in range(len(pschema)) if pschema.column(j).path.split(".")[0] == column]


def column_chunks(raw: bytes, md: pq.FileMetaData, column: str, size: int, where: str) -> ColumnChunks | None:
    """What decoding ``column`` of every row group of this file needs, from its footer; None: no such column.

    ``column`` must be a top-level column of one leaf (a flat column, or a list of
    scalars): a struct or map is a DataError naming the file and the column.
    """
    try:
        pschema = schema_of(md)
        leaves = leaves_of(pschema, column)
    except (ValueError, pa.ArrowException) as e:
        msg = f"{where}: unreadable schema ({type(e).__name__}); the footer is damaged"
        raise DataError(msg) from e
    if not leaves:
        return None
    if len(leaves) != 1:
        msg = (
            f"{where}: column {column!r} has {len(leaves)} leaf columns (a struct or map); a job index carries "
            f"columns of one leaf (flat, or a list of scalars): leave {column!r} out of --columns"
        )
        raise DataError(msg)
    j = leaves[0]
    check_column_histograms(raw, md, j, where)  # pyarrow's accessors below must not meet damaged ones
    physical = pschema.column(j).physical_type
    n = md.num_row_groups
    offsets, lengths = np.zeros(n, np.int64), np.zeros(n, np.int64)
    codecs, values = np.zeros(n, np.uint8), np.zeros(n, np.int64)
    for g in range(n):
        rg = md.row_group(g)
        cc = rg.column(j)
        at = f"{where}, row group {g}"
        if cc.physical_type != physical:
            msg = f"{at}: the footer gives column {column!r} type {cc.physical_type}, not {physical}; it is damaged"
            raise DataError(msg)
        start = cc.data_page_offset
        if cc.has_dictionary_page and cc.dictionary_page_offset is not None and cc.dictionary_page_offset > 0:
            start = min(start, cc.dictionary_page_offset)
        length = cc.total_compressed_size
        if rg.num_rows > 0 and (start < 4 or length < 0 or start + length > size):
            msg = f"{at}: the chunk of {column!r} [{start}, {start + length}) lies outside the file; it is damaged"
            raise DataError(msg)
        offsets[g], lengths[g] = start, length
        codecs[g], values[g] = codec_of(cc.compression, at), cc.num_values
    return ColumnChunks(template_of(raw, md, column, where), offsets, lengths, codecs, values)
