"""Arrow IPC: the files Hugging Face ``datasets`` writes (``save_to_disk`` folders, ``.map`` caches).

A folder that ``Dataset.save_to_disk`` wrote holds ``state.json``, ``dataset_info.json`` and its
shards, ``data-00000-of-0000N.arrow``, in the Arrow IPC *stream* format; ``Dataset.map``'s
caches are ``cache-*.arrow`` files of the same format. This kind claims a local folder that
holds ``state.json`` (its files are those ``state.json`` lists, in that order), a folder of
``*.arrow`` files and no ``*.parquet`` (bytewise order of their names, as Parquet's), or one
``.arrow`` file. The IPC *file* format (``ARROW1`` magic, a footer) reads the same way: its
messages are the stream's, after the magic.

A record batch is the kind's row group: the unit of one read. The stream's framing gives each
message's offset and length (a continuation marker, the metadata's length, the metadata, the
body), so one pass over a file's framing finds every batch's byte range and counts its rows,
tokens and empty documents from the list offsets alone (the values are not touched: the file is
memory-mapped and only the framing and the offsets' pages are read). That pass is cached under
``PLITZER_CACHE`` by the file's path, size, mtime and column, as footers are. A read is then
one ranged read of one batch's message, decoded by ``pyarrow.ipc`` against the file's schema
(its first message, read once and kept).

The kind states what it is (:class:`ArrowFormat`, a :class:`~plitzer.sources.files.Format`): its
files, their record batches (the framing pass), one batch's tokens from its one ranged read, and
its columns (:class:`BatchFile`); :func:`plitzer.sources.files.files_index` is its index, as any
kind's. Capabilities: every pass (:data:`ARROW_IPC`). The order, resume, world sizes, layout
stages and best-fit (lengths from the tokens) are the index's arithmetic. The passes that read other columns
(``where=``, ``length_column=``, ``dedupe=``, ``exclude=``, aligned ``columns=``) read them
through each file's :class:`BatchFile` (its :class:`~planner.catalog.files.FileEntry`'s
``reader``): a record batch decoded from a memory map of the file, so only the pages of the
columns a pass uses are read, and every index over the files (this one, a selection's, a
deduplication's) reads them alike. The batches are those of the same data written as Parquet
with one row group a record batch (``tests/sources/test_sources_arrow.py``).

A job's ranks share the framing pass (:func:`plitzer.sources.files.share`: each rank walks its
share of the files, an all-gather gives every rank all of them), as they share a Parquet
dataset's footers.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from planner.catalog.column import TokenDtype
from planner.catalog.rowgroups import Capabilities
from planner.errors import ConfigError, DataError, one_line
from planner.mixing.sources import SourceSpec
from planner.stores.cache import cache_dir
from planner.stores.storage import FileStat, LocalStorage, Storage
from plitzer.readpath.read import list_lengths
from plitzer.sources.files import FIELDS, FileIndex, files_index, is_url, remote_listing

__all__ = ["ARROW_IPC", "ArrowFormat", "BatchFile", "arrow_files", "arrow_index", "format_of"]

ARROW_IPC = Capabilities("arrow-ipc", selectable=True, other_columns=True, column_runs=True)
"""An Arrow IPC dataset's: every pass, a record batch a read (its columns through :class:`BatchFile`)."""

_NAMES = ("input_ids", "tokens", "token_ids")
_HEAD_BYTES = 1 << 16
"""A store's Arrow IPC file: its schema is looked for in this many bytes first."""


def arrow_files(source: object) -> list[Path] | None:
    """The Arrow IPC files of ``source`` in index order, or None where it is not an Arrow IPC source."""
    if not isinstance(source, (str, os.PathLike)) or is_url(source):
        return None
    path = Path(source).expanduser()
    if path.is_file():
        return [path] if path.suffix == ".arrow" else None
    if not path.is_dir():
        return None
    state = path / "state.json"
    if state.is_file():
        listed = json.loads(state.read_text(encoding="utf-8")).get("_data_files") or []
        return [path / str(f["filename"]) for f in listed]
    if next(path.rglob("*.parquet"), None) is not None:
        return None
    found = sorted(
        (p for p in path.rglob("*.arrow") if p.is_file()), key=lambda p: p.relative_to(path).as_posix().encode()
    )
    return found or None


def format_of(spec: SourceSpec) -> ArrowFormat | None:
    """A local ``save_to_disk`` folder, a folder of ``.arrow`` files, one ``.arrow`` file or a store's ``.arrow``
    URL; else None."""
    if is_url(spec.path):
        url = os.fspath(spec.path)  # type: ignore[arg-type]
        return ArrowFormat.remote(url, spec.storage_options, spec.column) if url.endswith(".arrow") else None
    paths = arrow_files(spec.path)
    return None if paths is None else ArrowFormat.of(spec.path, paths, spec.column)  # type: ignore[arg-type]


def arrow_index(source: str | os.PathLike[str], *, column: str | None = None) -> FileIndex:
    """The index of an Arrow IPC source: a row a record batch, counted from the list offsets (cached)."""
    paths = arrow_files(source)
    if not paths:
        msg = f"source {source!r} holds no Arrow IPC file; pass a datasets save_to_disk folder or .arrow files"
        raise ConfigError(msg)
    return files_index(ArrowFormat.of(source, paths, column))


@dataclass(frozen=True)
class BatchFile:
    """One Arrow IPC file's own reader of its record batches (a :class:`~planner.catalog.files.BatchReader`).

    A batch is decoded from a memory map of the file: its buffers are the map's pages, so a
    pass that uses one column reads that column's pages only. Picklable (a path and a schema).
    """

    path: str
    schema: pa.Schema
    storage: Storage | None = field(default=None, compare=False)
    """A file in a store: its storage and its listing's :class:`FileStat` (a batch is one ranged read); None:
    local disk, memory-mapped."""
    stat: FileStat | None = field(default=None, compare=False)

    def read(self, offset: int, length: int, where: str) -> pa.RecordBatch:
        """The record batch whose message is ``length`` bytes at ``offset``, every column."""
        if self.storage is not None and self.stat is not None:
            data = self.storage.read_range(self.stat, offset, length)
            try:
                return pa.ipc.read_record_batch(pa.ipc.read_message(pa.py_buffer(data)), self.schema)
            except (pa.ArrowException, OSError, ValueError) as e:
                raise _damaged(where, e, self.path) from e
        try:
            with pa.memory_map(self.path) as f:
                if offset + length > f.size():
                    msg = f"the batch ends at byte {offset + length}, the file at {f.size()}"
                    raise ValueError(msg)
                f.seek(offset)
                return pa.ipc.read_record_batch(pa.ipc.read_message(f), self.schema)
        except (pa.ArrowException, OSError, ValueError) as e:
            raise _damaged(where, e, self.path, again=True) from e


def _damaged(where: str, e: Exception, file: str, *, again: bool = False) -> DataError:
    more = f": restore it, or clear {cache_dir() / ARROW_IPC.kind} to index it again" if again else ": restore it"
    msg = f"{where}: cannot decode the record batch ({type(e).__name__}: {one_line(e)}); the file is damaged{more}"
    return DataError(msg, file=file)


@dataclass(frozen=True)
class ArrowFormat:
    """An Arrow IPC source as a :class:`~plitzer.sources.files.Format`: a record batch a row group."""

    base: Path
    paths: tuple[Path, ...]
    column: str
    schemas: tuple[pa.Schema, ...] = field(repr=False)
    capabilities: Capabilities = ARROW_IPC
    listed: tuple[str, Storage, list[FileStat]] | None = field(default=None, repr=False, compare=False)
    """A file in a store, as listed through planner's storage layer; None: local files (``paths``)."""

    @classmethod
    def of(cls, source: str | os.PathLike[str], paths: list[Path], column: str | None) -> ArrowFormat:
        """The format of ``paths`` (``source``'s files), its token column ``column`` or the one found."""
        if not paths:
            msg = f"source {source!r} holds no Arrow IPC file; pass a datasets save_to_disk folder or .arrow files"
            raise ConfigError(msg)
        schemas = tuple(_file_schema(p) for p in paths)
        col = _column(schemas[0], column, str(paths[0]))
        for p, sch in zip(paths, schemas, strict=True):
            if col not in sch.names:
                msg = f"{p}: no column {col!r} (its columns: {sch.names}); every file must hold the token column"
                raise ConfigError(msg)
        return cls(Path(os.fspath(source)).expanduser(), tuple(paths), col, schemas)

    @classmethod
    def remote(cls, url: str, storage_options: Mapping[str, Any] | None, column: str | None) -> ArrowFormat:
        """The format of a store's ``.arrow`` object: its schema from a ranged read of its head."""
        listed = remote_listing(url, storage_options, (".arrow",))
        if len(listed[2]) != 1:
            msg = f"{url}: no such .arrow object; an Arrow IPC file in a store is named by its URL"
            raise ConfigError(msg)
        file = listed[2][0]
        schema = _remote_schema(listed[1], file)
        return cls(Path(file.name), (), _column(schema, column, file.location), (schema,), listed=listed)

    @property
    def dtype(self) -> TokenDtype:
        value = self.schemas[0].field(self.column).type.value_type
        return "uint32" if value in (pa.uint32(), pa.uint64()) else "int32"

    @property
    def needs_check(self) -> bool:
        """64-bit token values may pass the batch dtype: each read checks them."""
        return bool(self.schemas[0].field(self.column).type.value_type in (pa.int64(), pa.uint64()))

    @property
    def key(self) -> str:
        return self.column

    def listing(self) -> tuple[str, Storage, list[FileStat]]:
        if self.listed is not None:
            return self.listed
        stats = []
        for p in self.paths:
            st = p.stat()
            name = p.name if self.base.is_file() else p.relative_to(self.base).as_posix()
            stats.append(FileStat(name=name, location=str(p), size=st.st_size, version=str(st.st_mtime_ns)))
        return str(self.base), LocalStorage(self.base), stats

    def _schema_of(self, file: FileStat) -> pa.Schema:
        if self.listed is not None:
            return self.schemas[[f.location for f in self.listed[2]].index(file.location)]
        return self.schemas[[str(p) for p in self.paths].index(file.location)]

    def row_groups(self, file: FileStat) -> np.ndarray:
        if self.listed is None:
            return _walk(Path(file.location), self.column)
        with pa.BufferReader(self.listed[1].read_range(file, 0, file.size)) as f:  # the pass reads the file once
            return _walk_in(f, file.location, self.column)

    def read(self, file: FileStat, data: bytes, row_group: int, where: str) -> pa.Array:
        try:
            batch = pa.ipc.read_record_batch(pa.ipc.read_message(pa.py_buffer(data)), self._schema_of(file))
            return batch.column(self.column)
        except (pa.ArrowException, OSError, ValueError, KeyError) as e:
            raise _damaged(where, e, file.location) from e

    def reader(self, file: FileStat) -> BatchFile:
        if self.listed is not None:
            return BatchFile(file.location, self._schema_of(file), self.listed[1], file)
        return BatchFile(file.location, self._schema_of(file))


def _column(schema: pa.Schema, given: str | None, where: str) -> str:
    """The token column: ``given``, else input_ids, tokens or token_ids, else the one list of integers."""
    lists = [f.name for f in schema if _int_list(f.type)]
    if given is not None:
        if given not in schema.names or given not in lists:
            msg = f"{where}: column={given!r} is not a list of integers here; its columns of token lists: {lists}"
            raise ConfigError(msg)
        return given
    named = [n for n in _NAMES if n in lists]
    if len(named) == 1 or len(lists) == 1:
        return named[0] if named else lists[0]
    msg = f"{where}: cannot tell the token column among {lists or schema.names}; pass column="
    raise ConfigError(msg)


def _int_list(t: pa.DataType) -> bool:
    return bool(pa.types.is_list(t) or pa.types.is_large_list(t)) and pa.types.is_integer(t.value_type)


def _walk(path: Path, column: str) -> np.ndarray:
    """One pass over a local file's framing, memory-mapped: each record batch's (rows, tokens, empty documents,
    offset, length)."""
    with pa.memory_map(str(path)) as f:
        return _walk_in(f, str(path), column)


def _walk_in(f: pa.NativeFile, path: str, column: str) -> np.ndarray:
    """One pass over the framing of file ``f`` (at ``path``): each record batch's (rows, tokens, empty documents,
    offset, length).

    A file cut short or damaged (a message's body past its end, bad metadata) is a DataError naming it.
    """
    out: list[tuple[int, int, int, int, int]] = []
    f.seek(8 if f.read(6) == b"ARROW1" else 0)
    try:
        reader = pa.ipc.MessageReader.open_stream(f)
        schema = pa.ipc.read_schema(reader.read_next_message())
        while (got := _next(reader, f)) is not None:
            msg, at = got
            if msg.type == "dictionary batch":
                why = f"{path}: dictionary-encoded columns are not read; decode them first (Dataset.cast)"
                raise ConfigError(why)
            if msg.type != "record batch":
                continue
            arr = pa.ipc.read_record_batch(msg, schema).column(column)
            lens = list_lengths(arr)
            out.append((len(arr), int(lens.sum()), int((lens == 0).sum()), at, f.tell() - at))
    except ConfigError:
        raise
    except (pa.ArrowException, OSError, ValueError) as e:
        where = f"{path}, record batch {len(out)}"
        raise _damaged(where, e, str(path)) from e
    return np.asarray(out, np.int64).reshape(-1, FIELDS)


def _next(reader: pa.ipc.MessageReader, f: pa.NativeFile) -> tuple[pa.ipc.Message, int] | None:
    """The stream's next message and its offset, or None at its end."""
    at = f.tell()
    try:
        return reader.read_next_message(), at
    except StopIteration:
        return None


def _remote_schema(storage: Storage, file: FileStat) -> pa.Schema:
    """The schema of a store's IPC file: its first message, from a ranged read of its head (all of it if needed)."""
    for length in sorted({min(file.size, _HEAD_BYTES), file.size}):
        with pa.BufferReader(storage.read_range(file, 0, length)) as f:
            try:
                return _schema_in(f)
            except (pa.ArrowException, ValueError, OSError) as e:
                if length == file.size:
                    msg = f"{file.location}: not an Arrow IPC file ({one_line(e)}); pass a .arrow file's URL"
                    raise DataError(msg, file=file.location) from e
    msg = f"{file.location}: an empty file is not an Arrow IPC file"  # no length tried: size 0
    raise DataError(msg, file=file.location)


def _schema_in(f: pa.NativeFile) -> pa.Schema:
    """The schema of the IPC file ``f`` (stream or file format): its first message."""
    head = f.read(min(f.size(), 8))
    f.seek(8 if head[:6] == b"ARROW1" else 0)
    return pa.ipc.read_schema(pa.ipc.read_message(f))


def _file_schema(path: Path) -> pa.Schema:
    """The schema of an IPC file (its first message), read from a memory map: no batch is touched."""
    with pa.memory_map(str(path)) as f:
        try:
            return _schema_in(f)
        except (pa.ArrowException, ValueError, OSError) as e:
            msg = f"{path}: not an Arrow IPC file ({one_line(e)}); pass a datasets save_to_disk folder or .arrow files"
            raise DataError(msg, file=str(path)) from e
