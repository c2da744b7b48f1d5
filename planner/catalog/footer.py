"""One file's footer: fetched with one ranged read, checked, parsed, turned into index rows.

:func:`fetch` reads the footer (a single ranged read of the file's tail when the
footer fits in 64 KiB, else a second one), :func:`parse` checks it and parses it,
:func:`row_groups` gives the file's index rows: per row group its rows, exact
token count (the leaf statistics' non-null value count), empty documents and the
token column chunk's byte range. :func:`cached` and :func:`remember` keep the
footer bytes in the local cache, keyed by the file's location, size and version.

pyarrow (26) aborts the whole process, an uncaught C++ exception, when Python
code asks for a column chunk's metadata (``row_group(i).column(j)``) whose level
histograms (``SizeStatistics``) do not match the schema's levels: a damaged
footer, or a schema patched so that a required column holds nulls. So before any
such call, :func:`check_level_histograms` walks the footer's Thrift (compact
protocol) in Python, and a mismatch is a :class:`DataError` naming the file, row
group and column. The walk is generic (it skips every field it does not need),
bounded (every length is checked against the bytes left, nesting is capped) and
only reads.
"""

from __future__ import annotations

import os
import struct
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.parquet as pq

from planner.catalog.column import TokenDtype, delivered_dtype, narrows, token_column_of, token_range
from planner.errors import DataError, one_line
from planner.stores.cache import cache_dir, digest, read_entry, write_entry
from planner.stores.storage import FileStat, Storage

__all__ = [
    "ChunkCounter",
    "Row",
    "cached",
    "check_level_histograms",
    "fetch",
    "fetch_lock",
    "parse",
    "read_table_bytes",
    "remember",
    "row_groups",
    "set_chunk_counter",
]

_TAIL = 64 << 10
_FORMAT = "2"  # entries with a length and checksum (planner.stores.cache)
_FOOTER_CAP = 256 << 20


class ChunkCounter(Protocol):
    """Counts (tokens, empty documents) of one row group by reading its token column.

    planner reads metadata only; a footer without statistics needs the column read
    once to count, which the runtime does (``plitzer.readpath.read.count_chunk``, set as the
    default by ``set_chunk_counter`` when plitzer is imported).
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


_counters: dict[str, ChunkCounter] = {}


def set_chunk_counter(counter: ChunkCounter | None) -> None:
    """Set the default counter for row groups whose footer lacks statistics."""
    _counters.pop("default", None)
    if counter is not None:
        _counters["default"] = counter


def read_table_bytes(data: bytes) -> pa.Table:
    """The Parquet table held in ``data`` (a cache entry, a job index), decoded on Arrow's threads.

    Decoded from an Arrow-owned copy of the bytes, never from ``pa.BufferReader(data)``
    itself: that wraps the Python object, and Arrow's pool threads release the decode
    tasks (and with them the last reference to it) after ``read()`` has returned. A
    release that comes as the interpreter ends takes the GIL inside a C++ destructor,
    and the process aborts with ``terminate called without an active exception`` (1 in
    40 ``plitzer index`` runs did, after printing everything). The copy costs a memcpy.
    """
    owned = pa.allocate_buffer(len(data))
    memoryview(owned).cast("B")[:] = data
    # ParquetFile.read, not read_table: read_table imports pyarrow.dataset and pandas on
    # first use, a fifth of a second on every fresh process's start.
    return pq.ParquetFile(pa.BufferReader(owned)).read()


def parse(raw: bytes, where: str) -> pq.FileMetaData:
    """The parsed footer, checked first for what would abort pyarrow; a DataError naming ``where``."""
    try:
        md = pq.read_metadata(pa.BufferReader(b"PAR1" + raw))
        levels = [
            (md.schema.column(j).max_repetition_level, md.schema.column(j).max_definition_level)
            for j in range(md.num_columns)
        ]
    except (pa.ArrowException, OSError, ValueError) as e:
        msg = f"{where}: the Parquet footer is damaged ({type(e).__name__}: {one_line(e)}); restore or rewrite the file"
        raise DataError(msg) from e
    # Before any column chunk's metadata is touched: pyarrow aborts the process on
    # level histograms that do not fit the schema (check_level_histograms, below).
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
    try:
        import fcntl
    except ImportError:  # not POSIX
        yield
        return
    name = _path(st).stem
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


Row = tuple[int, int, int, int, int, int, bool]  # row_group, rows, tokens, empty_docs, offset, length, check


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
    storage: Storage, st: FileStat, md: pq.FileMetaData, column: str | None, count: ChunkCounter | None
) -> tuple[list[Row], str, pa.DataType]:
    """One file's index rows, its token column's name and its type.

    A row per row group: (row_group, rows, tokens, empty_docs, offset, length,
    check), where offset and length are the token column chunk's byte range and
    check says whether decoding must check every value (``narrows``).
    """
    try:
        schema = md.schema.to_arrow_schema()
    except (pa.ArrowException, ValueError) as e:
        msg = f"{st.location}: unreadable schema ({one_line(e)}); the footer is damaged"
        raise DataError(msg) from e
    name, dtype = token_column_of(schema, column, st.location)
    delivered = delivered_dtype(dtype)
    narrowing = narrows(dtype)
    leaf = [j for j in range(md.num_columns) if md.schema.column(j).path.split(".")[0] == name]
    if len(leaf) != 1:
        msg = f"{st.location}: token column {name!r} is nested ({len(leaf)} leaves); it must be a flat list"
        raise DataError(msg)
    j = leaf[0]
    physical = md.schema.column(j).physical_type
    rows = []
    for g in range(md.num_row_groups):
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
                f"{where}: footer statistics are inconsistent (tokens {tokens}, rows {rg.num_rows}); "
                "the footer is damaged"
            )
            raise DataError(msg)
        check = narrowing and tokens > 0 and not _fits(stats, delivered)
        rows.append((g, rg.num_rows, tokens, empties, start, length, check))
    return rows, name, dtype


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
    """What counts a chunk whose footer has no statistics: ``count``, else the registered default."""
    counter = count if count is not None else _counters.get("default")
    if counter is None:
        msg = (
            f"{where}: the footer has no statistics for the token column, so its tokens must be counted "
            "by reading it once, and planner reads metadata only: import plitzer (or pass count=) "
            "to index this dataset"
        )
        raise DataError(msg)
    return counter


_MAX_DEPTH = 64


class _Bad(Exception):
    pass


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def byte(self) -> int:
        if self.pos >= len(self.data):
            msg = "the footer ends inside a field"
            raise _Bad(msg)
        b = self.data[self.pos]
        self.pos += 1
        return b

    def varint(self) -> int:
        shift = result = 0
        while True:
            b = self.byte()
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                return result
            shift += 7
            if shift > 70:
                msg = "a varint longer than 10 bytes"
                raise _Bad(msg)

    def skip_bytes(self, n: int) -> None:
        if n < 0 or self.pos + n > len(self.data):
            msg = "a length runs past the footer"
            raise _Bad(msg)
        self.pos += n

    def list_header(self) -> tuple[int, int]:
        b = self.byte()
        size, typ = b >> 4, b & 0x0F
        if size == 15:
            size = self.varint()
        if size > len(self.data) - self.pos:  # every element takes at least one byte
            msg = "a list longer than the footer"
            raise _Bad(msg)
        return size, typ

    def skip(self, typ: int, depth: int) -> None:
        if depth > _MAX_DEPTH:
            msg = "nesting too deep"
            raise _Bad(msg)
        if typ in (1, 2):  # bool in a field header: no payload
            return
        if typ == 3:
            self.skip_bytes(1)
        elif typ in (4, 5, 6):
            self.varint()
        elif typ == 7:
            self.skip_bytes(8)
        elif typ == 8:
            self.skip_bytes(self.varint())
        elif typ in (9, 10):
            size, et = self.list_header()
            for _ in range(size):
                if et in (1, 2):
                    self.skip_bytes(1)  # bools in a list are one byte each
                else:
                    self.skip(et, depth + 1)
        elif typ == 11:
            size = self.varint()
            if size:
                kv = self.byte()
                for _ in range(size):
                    self.skip(kv >> 4, depth + 1)
                    self.skip(kv & 0x0F, depth + 1)
        elif typ == 12:
            for _fid, t in self.fields():
                self.skip(t, depth + 1)
        else:
            msg = f"unknown Thrift type {typ}"
            raise _Bad(msg)

    def fields(self) -> _FieldIter:
        return _FieldIter(self)


class _FieldIter:
    """The fields of one struct: yields (field id, type); the caller reads or skips each."""

    def __init__(self, r: _Reader) -> None:
        self.r = r
        self.last = 0

    def __iter__(self) -> _FieldIter:
        return self

    def __next__(self) -> tuple[int, int]:
        b = self.r.byte()
        if b == 0:
            raise StopIteration
        delta, typ = b >> 4, b & 0x0F
        if delta:
            fid = self.last + delta
        else:
            z = self.r.varint()
            fid = (z >> 1) ^ -(z & 1)
        self.last = fid
        return fid, typ


def _histograms(r: _Reader) -> tuple[int | None, int | None]:
    """Lengths of SizeStatistics' repetition (2) and definition (3) level histograms."""
    rep = dfn = None
    for fid, typ in r.fields():
        if fid in (2, 3) and typ == 9:
            size, et = r.list_header()
            for _ in range(size):
                r.skip(et, 1)
            if fid == 2:
                rep = size
            else:
                dfn = size
        else:
            r.skip(typ, 1)
    return rep, dfn


def _column_chunk(r: _Reader) -> tuple[int | None, int | None]:
    found: tuple[int | None, int | None] = (None, None)
    for fid, typ in r.fields():
        if fid == 3 and typ == 12:  # ColumnChunk.meta_data
            for mfid, mtyp in r.fields():
                if mfid == 16 and mtyp == 12:  # ColumnMetaData.size_statistics
                    found = _histograms(r)
                else:
                    r.skip(mtyp, 2)
        else:
            r.skip(typ, 1)
    return found


def check_level_histograms(footer: bytes, levels: Sequence[tuple[int, int]], where: str) -> None:
    """Raise DataError if a column chunk's level histograms do not fit the schema.

    ``footer`` is the Thrift FileMetaData; ``levels[j]`` is leaf column j's
    (max repetition level, max definition level). Histograms, where present and
    not empty, must have one bucket per level (max + 1).
    """
    r = _Reader(footer)
    try:
        for fid, typ in r.fields():
            if fid != 4 or typ != 9:  # FileMetaData.row_groups
                r.skip(typ, 0)
                continue
            n_groups, _ = r.list_header()
            for g in range(n_groups):
                for gfid, gtyp in r.fields():
                    if gfid != 1 or gtyp != 9:  # RowGroup.columns
                        r.skip(gtyp, 1)
                        continue
                    n_cols, _ = r.list_header()
                    for j in range(n_cols):
                        rep, dfn = _column_chunk(r)
                        if j >= len(levels):
                            continue  # pyarrow refuses more chunks than leaves itself
                        want_rep, want_dfn = levels[j][0] + 1, levels[j][1] + 1
                        if rep not in (None, 0, want_rep) or dfn not in (None, 0, want_dfn):
                            msg = (
                                f"{where}, row group {g}, column {j}: the footer's level histograms have "
                                f"{rep} and {dfn} buckets but the schema's levels need {want_rep} and "
                                f"{want_dfn}; the footer or schema is damaged (e.g. a required column "
                                "holding nulls): rewrite the file"
                            )
                            raise DataError(msg)
    except _Bad as e:
        msg = f"{where}: the Parquet footer is damaged ({e}); restore or rewrite the file"
        raise DataError(msg) from e
