"""The row-group index: one row per row group, built from Parquet footers alone.

``index(source)`` lists the ``*.parquet`` files below ``source`` (bytewise order of
their path relative to it), reads every footer concurrently, and returns an
:class:`Index`: a Polars frame with, per row group, its file, rows, exact token
count, and the byte range of the token column chunk (the one ranged read the
runtime will issue), plus the dataset fingerprint.

Token counts come from the footer: for a list column the leaf statistics'
``num_values`` is the number of non-null tokens, and the chunk's own
``num_values`` minus that is the number of empty (or null) documents. Only a row
group whose footer has no statistics is read, once, to count.

Footers and the finished index are cached under ``PLITZER_CACHE`` (default
``~/.cache/plitzer``), keyed by each file's location, size and mtime (ETag on S3),
never inside the dataset. A second call on an unchanged dataset lists the files
and reads no footer.
"""

from __future__ import annotations

import hashlib
import io
import os
import struct
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from planner.errors import ConfigError, DataError
from planner.storage import FileStat, Storage, open_storages

__all__ = ["INDEX_SCHEMA", "Index", "cache_dir", "decode_chunk", "index", "token_column_of"]

TokenDtype = Literal["int32", "uint32"]

INDEX_SCHEMA: dict[str, Any] = {
    "file": pl.String,
    "file_index": pl.Int64,
    "row_group": pl.Int64,
    "rows": pl.Int64,
    "tokens": pl.Int64,
    "empty_docs": pl.Int64,
    "byte_offset": pl.Int64,
    "byte_length": pl.Int64,
    "file_size": pl.Int64,
}
_INDEX_FORMAT = "1"
_TAIL = 64 << 10
_FOOTER_CAP = 256 << 20


def cache_dir() -> Path:
    """The local cache folder: ``PLITZER_CACHE``, else ``$XDG_CACHE_HOME/plitzer``."""
    env = os.environ.get("PLITZER_CACHE")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "plitzer"


def _digest(*parts: object) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(str(p).encode())
        h.update(b"\0")
    return h.hexdigest()


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


class _RangeFile(io.RawIOBase):
    """A read-only file that holds one byte range of a larger file.

    pyarrow decodes a column chunk from a file object plus the cached footer; this
    object serves exactly the chunk we fetched (one ranged read) and refuses any
    other offset, so a decode can never trigger a second, hidden read.
    """

    def __init__(self, data: bytes, offset: int, size: int, where: str) -> None:
        super().__init__()
        self._data = data
        self._view = memoryview(data)
        self._offset = offset
        self._size = size
        self._pos = 0
        self._where = where

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, pos: int, whence: int = 0) -> int:
        self._pos = pos if whence == 0 else (self._pos + pos if whence == 1 else self._size + pos)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def size(self) -> int:
        return self._size

    def read(self, n: int | None = -1) -> bytes:
        n = self._size - self._pos if n is None or n < 0 else n
        a = self._pos - self._offset
        if a < 0 or a + n > len(self._data):
            msg = f"{self._where}: decoding needed bytes outside the token column chunk; the footer is damaged"
            raise DataError(msg)
        self._pos += n
        return self._view[a : a + n]  # type: ignore[return-value]  # zero-copy: pyarrow takes any buffer

    def readinto(self, b: Any) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)


def decode_chunk(
    data: bytes,
    *,
    offset: int,
    file_size: int,
    metadata: pq.FileMetaData,
    row_group: int,
    column: str,
    where: str,
) -> pa.Array:
    """Decode one row group's token column from the bytes of its column chunk.

    Returns a ListArray or LargeListArray; raises DataError (naming ``where``) for
    damaged data, never a bare pyarrow error.
    """
    f = _RangeFile(data, offset, file_size, where)
    try:
        # Page CRCs are verified whenever the writer stored them (docs/reliability.md).
        pf = pq.ParquetFile(f, metadata=metadata, pre_buffer=True, page_checksum_verification=True)
        table = pf.read_row_group(row_group, columns=[column], use_threads=False)
    except DataError:
        raise
    except (pa.ArrowException, OSError, ValueError, IndexError) as e:
        msg = f"{where}: cannot decode the token column ({type(e).__name__}: {e}); the file is damaged"
        raise DataError(msg) from e
    col = table.column(0)
    arr = col.chunk(0) if col.num_chunks == 1 else pa.concat_arrays(col.chunks)
    return arr


def token_column_of(schema: pa.Schema, column: str | None, where: str) -> tuple[str, pa.DataType]:
    """The token column's name and type in ``schema`` (explicit, or the one candidate)."""

    def ok(t: pa.DataType) -> bool:
        return (pa.types.is_list(t) or pa.types.is_large_list(t)) and t.value_type in (
            pa.int32(),
            pa.uint32(),
        )

    if column is not None:
        if column not in schema.names:
            msg = (
                f"{where}: token column {column!r} not found; columns are {schema.names}; pass column= with one of them"
            )
            raise DataError(msg)
        t = schema.field(column).type
        if not ok(t):
            msg = (
                f"{where}: column {column!r} has type {t}, but a token column must be "
                "list<int32>, list<uint32> or their large_list forms; re-tokenize or pick another column"
            )
            raise DataError(msg)
        return column, t
    candidates = [f.name for f in schema if ok(f.type)]
    if len(candidates) == 1:
        return candidates[0], schema.field(candidates[0]).type
    if not candidates:
        msg = (
            f"{where}: no token column: none of {schema.names} is list<int32> or list<uint32>; "
            "pass column= naming the pre-tokenized column"
        )
        raise DataError(msg)
    msg = f"{where}: several candidate token columns {candidates}; pass column= with one of them"
    raise DataError(msg)


@dataclass
class _FileEntry:
    stat: FileStat
    storage: Storage
    footer: bytes | None = None
    metadata: pq.FileMetaData | None = None


def _parse_footer(raw: bytes, where: str) -> pq.FileMetaData:
    try:
        return pq.read_metadata(pa.BufferReader(b"PAR1" + raw))
    except (pa.ArrowException, OSError, ValueError) as e:
        msg = f"{where}: the Parquet footer is damaged ({type(e).__name__}: {e}); restore or rewrite the file"
        raise DataError(msg) from e


def _fetch_footer(entry: _FileEntry) -> bytes:
    """The footer bytes plus its 8-byte tail (length and magic): one read if it fits."""
    st = entry.stat
    if st.size == 0:
        msg = f"{st.location}: the file is empty (0 bytes), not Parquet; delete it or restore it"
        raise DataError(msg)
    if st.size < 12:
        msg = f"{st.location}: {st.size} bytes is too short for Parquet; the file is truncated"
        raise DataError(msg)
    n = min(st.size, _TAIL)
    tail = entry.storage.read_range(st, st.size - n, n)
    if tail[-4:] != b"PAR1":
        msg = f"{st.location}: no Parquet magic at the end of the file; it is not Parquet or it is truncated"
        raise DataError(msg)
    (flen,) = struct.unpack("<I", tail[-8:-4])
    if flen + 12 > st.size or flen > _FOOTER_CAP:
        msg = f"{st.location}: footer length {flen} does not fit the file's {st.size} bytes; the file is truncated"
        raise DataError(msg)
    if flen + 8 > n:
        tail = entry.storage.read_range(st, st.size - flen - 8, flen + 8)
    return tail[-(flen + 8) :]


@dataclass
class Index:
    """The row-group index of a dataset.

    Attributes
    ----------
    frame : polars.DataFrame
        One row per row group (files in order, row groups in file order) with the
        columns of ``INDEX_SCHEMA``.
    column : str
        The token column.
    dtype : {"int32", "uint32"}
        The token type, also the dtype of every batch.
    fingerprint : str
        sha256 of (relative path, rows, tokens) of every row group, in order; it
        does not depend on where the dataset lives.
    """

    frame: pl.DataFrame
    column: str
    dtype: TokenDtype
    fingerprint: str
    source: str
    _files: list[_FileEntry] = field(repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def files(self) -> list[FileStat]:
        return [f.stat for f in self._files]

    @property
    def tokens(self) -> int:
        return int(self.frame["tokens"].sum())

    @property
    def row_groups(self) -> int:
        return self.frame.height

    def storage(self, file_index: int) -> Storage:
        return self._files[file_index].storage

    def metadata(self, file_index: int) -> pq.FileMetaData:
        """The file's parsed footer: from memory, else the cache, else storage."""
        e = self._files[file_index]
        if e.metadata is not None:
            return e.metadata
        with self._lock:
            if e.metadata is None:
                raw = e.footer
                if raw is None:
                    path = _footer_path(e.stat)
                    raw = path.read_bytes() if path.exists() else None
                if raw is None:
                    raw = _fetch_footer(e)
                    _write_atomic(_footer_path(e.stat), raw)
                e.metadata = _parse_footer(raw, e.stat.location)
                e.footer = None
            return e.metadata

    def location(self, file_index: int, row_group: int | None = None) -> str:
        where = self._files[file_index].stat.location
        return where if row_group is None else f"{where}, row group {row_group}"

    def read_chunk(self, rg: int) -> pa.Array:
        """Read and decode row group ``rg`` (a row of ``frame``): one ranged read."""
        row = self.frame.row(rg, named=True)
        fi = row["file_index"]
        e = self._files[fi]
        where = self.location(fi, row["row_group"])
        data = e.storage.read_range(e.stat, row["byte_offset"], row["byte_length"])
        return decode_chunk(
            data,
            offset=row["byte_offset"],
            file_size=e.stat.size,
            metadata=self.metadata(fi),
            row_group=row["row_group"],
            column=self.column,
            where=where,
        )


def _footer_path(st: FileStat) -> Path:
    return cache_dir() / "footers" / f"{_digest(st.location, st.size, st.version)}.footer"


_Row = tuple[int, int, int, int, int, int]  # row_group, rows, tokens, empty_docs, offset, length


def _file_rows(entry: _FileEntry, column: str | None) -> tuple[list[_Row], str, pa.DataType]:
    """Per row group of one file: (row_group, rows, tokens, empty_docs, offset, length)."""
    st = entry.stat
    md = entry.metadata
    assert md is not None
    try:
        schema = md.schema.to_arrow_schema()
    except (pa.ArrowException, ValueError) as e:
        msg = f"{st.location}: unreadable schema ({e}); the footer is damaged"
        raise DataError(msg) from e
    name, dtype = token_column_of(schema, column, st.location)
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
        start = cc.data_page_offset
        if cc.has_dictionary_page and cc.dictionary_page_offset is not None and cc.dictionary_page_offset > 0:
            start = min(start, cc.dictionary_page_offset)
        length = cc.total_compressed_size
        where = f"{st.location}, row group {g}"
        if rg.num_rows > 0 and (start < 4 or start + length > st.size):
            msg = (
                f"{where}: the token column chunk [{start}, {start + length}) lies outside the file; "
                "the footer is damaged"
            )
            raise DataError(msg)
        # pyarrow aborts the process (an uncaught C++ exception) when statistics are
        # read from a column chunk whose type field was damaged; check it first.
        if cc.physical_type != physical:
            msg = (
                f"{where}: the footer gives the token column type {cc.physical_type}, not {physical}; "
                "the footer is damaged"
            )
            raise DataError(msg)
        stats = cc.statistics if cc.is_stats_set else None
        if rg.num_rows == 0:
            tokens, empties = 0, 0
        elif stats is not None and stats.has_null_count:
            tokens = int(stats.num_values)
            empties = int(cc.num_values) - tokens
        else:
            tokens, empties = _count(entry, g, name, start, length, where)
        if tokens < 0 or empties < 0 or empties > rg.num_rows:
            msg = (
                f"{where}: footer statistics are inconsistent (tokens {tokens}, rows {rg.num_rows}); "
                "the footer is damaged"
            )
            raise DataError(msg)
        rows.append((g, rg.num_rows, tokens, empties, start, length))
    return rows, name, dtype


def _count(entry: _FileEntry, g: int, column: str, start: int, length: int, where: str) -> tuple[int, int]:
    """Count tokens and empty documents by reading the chunk once (no statistics)."""
    assert entry.metadata is not None
    data = entry.storage.read_range(entry.stat, start, length)
    arr = decode_chunk(
        data,
        offset=start,
        file_size=entry.stat.size,
        metadata=entry.metadata,
        row_group=g,
        column=column,
        where=where,
    )
    check_no_null_tokens(arr, where)
    lengths = arr.value_lengths().fill_null(0).to_numpy()
    return int(lengths.sum()), int((lengths == 0).sum())


def check_decoded(arr: pa.Array, *, rows: int, tokens: int, where: str) -> None:
    """The decoded chunk must hold the rows and tokens its footer promised.

    A damaged page can decode without an error into other lengths; counting is
    cheap and catches it before a single token is handed out.
    """
    got_tokens = len(arr.values) if arr.offset == 0 and len(arr.values) == arr.offsets[-1].as_py() else None
    if got_tokens is None:
        got_tokens = int(pc.sum(pc.list_value_length(arr)).as_py() or 0)
    if len(arr) != rows or got_tokens != tokens:
        msg = (
            f"{where}: decoded {len(arr)} rows and {got_tokens} tokens, but the footer says {rows} rows "
            f"and {tokens} tokens; the file is damaged: restore it from a good copy"
        )
        raise DataError(msg)


def check_no_null_tokens(arr: pa.Array, where: str, first_row: int = 0) -> None:
    """Raise DataError naming the row if any token inside a list is null."""
    values = arr.values if arr.offset == 0 else arr.flatten()
    if values.null_count == 0:
        return
    flat_null = np.flatnonzero(values.is_null().to_numpy(zero_copy_only=False))[0]
    offsets = arr.offsets.to_numpy()
    row = int(np.searchsorted(offsets, flat_null + offsets[0], side="right")) - 1
    msg = (
        f"{where}, row {first_row + row}: a null token inside a document; tokens must be "
        "non-null integers: fix the tokenizer output or drop the row"
    )
    raise DataError(msg)


def _fingerprint(frame: pl.DataFrame) -> str:
    h = hashlib.sha256()
    for name, rows, tokens in zip(
        frame["file"].to_list(), frame["rows"].to_list(), frame["tokens"].to_list(), strict=True
    ):
        h.update(f"{name}\t{rows}\t{tokens}\n".encode())
    return h.hexdigest()


def index(
    source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    column: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    *,
    progress: bool | None = None,
    threads: int = 32,
) -> Index:
    """Build (or load from the cache) the row-group index of ``source``.

    Parameters
    ----------
    source : str, PathLike or list of them
        A local folder (searched recursively for ``*.parquet``), one file,
        ``s3://bucket/prefix``, or a list of these (files of each source in turn).
    column : str, optional
        The token column; by default the one ``list<int32|uint32>`` column.
    storage_options : dict, optional
        S3 settings: ``endpoint``, ``region``, ``key``, ``secret``, ``anon``.
    progress : bool, optional
        Show a progress bar while reading footers (default: when there are many
        files and stderr is a terminal).

    Examples
    --------
    >>> import planner, plitzer.synth, tempfile
    >>> d = tempfile.mkdtemp()
    >>> _ = plitzer.synth.write(d, tokens=20_000, seed=1)
    >>> ix = planner.index(d)
    >>> ix.frame.columns[:5]
    ['file', 'file_index', 'row_group', 'rows', 'tokens']
    >>> ix.tokens == ix.frame["tokens"].sum()
    True
    """
    storages = open_storages(source, storage_options)
    entries: list[_FileEntry] = []
    for i, s in enumerate(storages):
        for found in s.list_files():
            # Files of a list source are named by their source's position, so two
            # folders with the same file names stay distinct.
            st = (
                found
                if len(storages) == 1
                else FileStat(f"{i}/{found.name}", found.location, found.size, found.version)
            )
            entries.append(_FileEntry(stat=st, storage=s))
    src = ", ".join(s.url for s in storages)
    if not entries:
        msg = f"source {src!r} holds no *.parquet file; check the path (folders are searched recursively)"
        raise ConfigError(msg)

    key = _digest(
        _INDEX_FORMAT, column, *[(e.stat.location, e.stat.size, e.stat.version, e.stat.name) for e in entries]
    )
    cached = cache_dir() / "index" / f"{key}.parquet"
    if cached.exists():
        try:
            # ParquetFile.read, not read_table: read_table imports pyarrow.dataset and
            # pandas on first use, a fifth of a second on every fresh process's start.
            table = pq.ParquetFile(cached).read()
            meta = table.schema.metadata or {}
            frame = pl.from_arrow(table)
            assert isinstance(frame, pl.DataFrame)
            return Index(
                frame=frame,
                column=meta[b"column"].decode(),
                dtype=meta[b"dtype"].decode(),  # type: ignore[arg-type]
                fingerprint=meta[b"fingerprint"].decode(),
                source=src,
                _files=entries,
            )
        except (OSError, KeyError, pa.ArrowException, AssertionError):
            cached.unlink(missing_ok=True)  # a damaged cache entry is rebuilt, never trusted

    def load(entry: _FileEntry) -> tuple[list[_Row], str, pa.DataType]:
        path = _footer_path(entry.stat)
        raw = None
        if path.exists():
            raw = path.read_bytes()
        if raw is None:
            raw = _fetch_footer(entry)
        entry.metadata = _parse_footer(raw, entry.stat.location)
        result = _file_rows(entry, column)
        if not path.exists():
            _write_atomic(path, raw)
        return result

    show = progress if progress is not None else (len(entries) >= 64 and None)
    from tqdm import tqdm

    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(entries)))) as pool:
        results = list(
            tqdm(
                pool.map(load, entries),
                total=len(entries),
                desc="footers",
                unit="file",
                disable=None if show is None else not show,
                leave=False,
            )
        )

    first_name, first_type = results[0][1], results[0][2]
    cols: dict[str, list[Any]] = {k: [] for k in INDEX_SCHEMA}
    for fi, (entry, (rows, name, dtype)) in enumerate(zip(entries, results, strict=True)):
        if name != first_name or dtype != first_type:
            msg = (
                f"{entry.stat.location}: token column {name!r} of type {dtype} differs from "
                f"{first_name!r} of type {first_type} in {entries[0].stat.location}; all files "
                "must agree: rewrite this file or pass column="
            )
            raise DataError(msg)
        for g, n, tokens, empties, start, length in rows:
            cols["file"].append(entry.stat.name)
            cols["file_index"].append(fi)
            cols["row_group"].append(g)
            cols["rows"].append(n)
            cols["tokens"].append(tokens)
            cols["empty_docs"].append(empties)
            cols["byte_offset"].append(start)
            cols["byte_length"].append(length)
            cols["file_size"].append(entry.stat.size)
    frame = pl.DataFrame(cols, schema=INDEX_SCHEMA)
    dtype_name: TokenDtype = "uint32" if first_type.value_type == pa.uint32() else "int32"
    fp = _fingerprint(frame)
    table = frame.to_arrow().replace_schema_metadata({"column": first_name, "dtype": dtype_name, "fingerprint": fp})
    try:
        buf = pa.BufferOutputStream()
        pq.write_table(table, buf)
        _write_atomic(cached, buf.getvalue().to_pybytes())
    except OSError:
        pass  # a read-only cache folder costs speed, not correctness
    return Index(frame=frame, column=first_name, dtype=dtype_name, fingerprint=fp, source=src, _files=entries)


def ensure_index(
    source: Index | str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    column: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> Index:
    if isinstance(source, Index):
        if column is not None and column != source.column:
            msg = f"column={column!r} differs from the index's token column {source.column!r}; pass the same column"
            raise ConfigError(msg)
        return source
    return index(source, column=column, storage_options=storage_options)
