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
:class:`ChunkCounter` that reads it once (the runtime's, ``plitzer.read``).

The token column is a list or large_list of any integer type; batches are int32,
or uint32 for uint32 and uint64 data (``Index.dtype``). Where a token may not fit
(int64 or uint64 data whose footer min/max do not prove it), ``needs_check`` marks
the row group and decoding checks every value.

Footers and the finished index are cached under ``PLITZER_CACHE`` (default
``~/.cache/plitzer``), keyed by each file's location, size and mtime (ETag on S3),
never inside the dataset. A second call on an unchanged dataset lists the files
and reads no footer.
"""

from __future__ import annotations

import hashlib
import os
import struct
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from planner.errors import ConfigError, DataError
from planner.footer import check_level_histograms
from planner.storage import FileStat, Storage, open_storages

__all__ = [
    "INDEX_SCHEMA",
    "TOKEN_NAMES",
    "ChunkCounter",
    "Index",
    "cache_dir",
    "delivered_dtype",
    "ensure_index",
    "index",
    "is_token_type",
    "narrows",
    "one_line",
    "set_chunk_counter",
    "token_column_of",
    "token_range",
]

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
    # True where a token may not fit the batch dtype (int64 or uint64 data whose
    # footer min/max are missing or out of range): decoding then checks every value.
    "needs_check": pl.Boolean,
}
_INDEX_FORMAT = "2"
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


TOKEN_NAMES = ("input_ids", "tokens", "token_ids")
"""Column names preferred, in this order of the schema, when ``column`` is omitted."""

_RANGES = {"int32": (-(2**31), 2**31 - 1), "uint32": (0, 2**32 - 1)}


def one_line(e: BaseException) -> str:
    """An exception's message on one line (pyarrow's messages wrap, with indents)."""
    return " ".join(str(e).split())


def is_token_type(t: pa.DataType) -> bool:
    """A list or large_list of any integer width, signed or not."""
    return bool((pa.types.is_list(t) or pa.types.is_large_list(t)) and pa.types.is_integer(t.value_type))


def delivered_dtype(t: pa.DataType) -> TokenDtype:
    """The batch dtype of a token column of type ``t``: uint32 for uint32 and uint64, else int32."""
    return "uint32" if t.value_type in (pa.uint32(), pa.uint64()) else "int32"


def narrows(t: pa.DataType) -> bool:
    """Whether values of a token column of type ``t`` may not fit the batch dtype."""
    return t.value_type in (pa.int64(), pa.uint64())


def token_range(dtype: TokenDtype) -> tuple[int, int]:
    """The smallest and largest token a batch of ``dtype`` holds."""
    return _RANGES[dtype]


def _describe(schema: pa.Schema, names: Sequence[str]) -> str:
    return ", ".join(f"{n} ({schema.field(n).type})" for n in names)


def token_column_of(schema: pa.Schema, column: str | None, where: str) -> tuple[str, pa.DataType]:
    """The token column's name and type in ``schema`` (explicit, or found by the rule).

    When ``column`` is None: the one integer-list column named ``input_ids``,
    ``tokens`` or ``token_ids``; else the one integer-list column. Anything else is
    a ConfigError naming ``where``, the candidates with their types, and ``column=``.
    """
    if column is not None:
        if column not in schema.names:
            msg = (
                f"{where}: token column {column!r} not found; columns are {_describe(schema, schema.names)}; "
                "pass column= with one of them"
            )
            raise ConfigError(msg)
        t = schema.field(column).type
        if not is_token_type(t):
            msg = (
                f"{where}: column {column!r} has type {t}, but a token column must be a list or large_list "
                "of integers (int8..int64, uint8..uint64); pass column= naming the pre-tokenized column, "
                "or re-tokenize"
            )
            raise ConfigError(msg)
        return column, t
    candidates = [f.name for f in schema if is_token_type(f.type)]
    named = [n for n in candidates if n in TOKEN_NAMES]
    if len(named) == 1:
        return named[0], schema.field(named[0]).type
    if len(candidates) == 1:
        return candidates[0], schema.field(candidates[0]).type
    if not candidates:
        msg = (
            f"{where}: no token column: no column is a list of integers (columns: "
            f"{_describe(schema, schema.names)}); pass column= naming the pre-tokenized column"
        )
        raise ConfigError(msg)
    msg = (
        f"{where}: several candidate token columns: {_describe(schema, named or candidates)}; "
        "pass column= with one of them"
    )
    raise ConfigError(msg)


class ChunkCounter(Protocol):
    """Counts (tokens, empty documents) of one row group by reading its token column.

    planner reads metadata only; a footer without statistics needs the column read
    once to count, which the runtime does (``plitzer.read.count_chunk``, set as the
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


@dataclass
class _FileEntry:
    stat: FileStat
    storage: Storage
    footer: bytes | None = None
    metadata: pq.FileMetaData | None = None


def _parse_footer(raw: bytes, where: str) -> pq.FileMetaData:
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
    # level histograms that do not fit the schema (planner/footer.py).
    check_level_histograms(raw[:-8], levels, where)
    return md


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
        The dtype of every batch and of every decoded chunk: uint32 when the
        column is uint32 or uint64, else int32 (whatever the files' widths).
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

    def file(self, file_index: int) -> FileStat:
        return self._files[file_index].stat

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


def _footer_path(st: FileStat) -> Path:
    return cache_dir() / "footers" / f"{_digest(st.location, st.size, st.version)}.footer"


_Row = tuple[int, int, int, int, int, int, bool]  # row_group, rows, tokens, empty_docs, offset, length, check


def _fits(stats: Any, dtype: TokenDtype) -> bool:
    """Whether the footer's min/max prove every token of the chunk fits ``dtype``."""
    try:
        if stats is None or not stats.has_min_max:
            return False
        lo, hi = token_range(dtype)
        return lo <= int(stats.min) and int(stats.max) <= hi
    except (pa.ArrowException, ValueError, TypeError):
        return False  # unreadable statistics: check every value at decode


def _file_rows(
    entry: _FileEntry, column: str | None, count: ChunkCounter | None
) -> tuple[list[_Row], str, pa.DataType]:
    """Per row group of one file: (row_group, rows, tokens, empty_docs, offset, length, check)."""
    st = entry.stat
    md = entry.metadata
    assert md is not None
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
        start = cc.data_page_offset
        if cc.has_dictionary_page and cc.dictionary_page_offset is not None and cc.dictionary_page_offset > 0:
            start = min(start, cc.dictionary_page_offset)
        length = cc.total_compressed_size
        where = f"{st.location}, row group {g}"
        if rg.num_rows > 0 and (start < 4 or length < 0 or start + length > st.size):
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
            counter = count if count is not None else _counters.get("default")
            if counter is None:
                msg = (
                    f"{where}: the footer has no statistics for the token column, so its tokens must be counted "
                    "by reading it once, and planner reads metadata only: import plitzer (or pass count=) "
                    "to index this dataset"
                )
                raise DataError(msg)
            tokens, empties = counter(
                entry.storage, st, md, row_group=g, column=name, offset=start, length=length, where=where
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
    count: ChunkCounter | None = None,
) -> Index:
    """Build (or load from the cache) the row-group index of ``source``.

    Parameters
    ----------
    source : str, PathLike or list of them
        A local folder (searched recursively for ``*.parquet``), one file,
        ``s3://bucket/prefix``, or a list of these (files of each source in turn).
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
        column once (:class:`ChunkCounter`); by default the runtime's, set when
        plitzer is imported. planner itself reads metadata only.

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
        result = _file_rows(entry, column, count)
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
    dtype_name = delivered_dtype(first_type)
    cols: dict[str, list[Any]] = {k: [] for k in INDEX_SCHEMA}
    for fi, (entry, (rows, name, dtype)) in enumerate(zip(entries, results, strict=True)):
        # list and large_list, and integer widths, may differ between files as long
        # as the batches they give have the same dtype.
        if name != first_name or delivered_dtype(dtype) != dtype_name:
            msg = (
                f"{entry.stat.location}: token column {name!r} of type {dtype} (batches of "
                f"{delivered_dtype(dtype)}) differs from {first_name!r} of type {first_type} (batches of "
                f"{dtype_name}) in {entries[0].stat.location}; all files must agree: rewrite this file "
                "or pass column="
            )
            raise DataError(msg)
        for g, n, tokens, empties, start, length, check in rows:
            cols["file"].append(entry.stat.name)
            cols["file_index"].append(fi)
            cols["row_group"].append(g)
            cols["rows"].append(n)
            cols["tokens"].append(tokens)
            cols["empty_docs"].append(empties)
            cols["byte_offset"].append(start)
            cols["byte_length"].append(length)
            cols["file_size"].append(entry.stat.size)
            cols["needs_check"].append(check)
    frame = pl.DataFrame(cols, schema=INDEX_SCHEMA)
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
