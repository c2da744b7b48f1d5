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

Capabilities: every pass (:data:`ARROW_IPC`). The order, resume, world sizes, layout stages and
best-fit (lengths from the tokens) are the index's arithmetic. The passes that read other columns
(``where=``, ``length_column=``, ``dedupe=``, ``exclude=``, aligned ``columns=``) read them
through each file's :class:`BatchFile` (its :class:`~planner.catalog.files.FileEntry`'s
``reader``): a record batch decoded from a memory map of the file, so only the pages of the
columns a pass uses are read, and every index over the files (this one, a selection's, a
deduplication's) reads them alike. The batches are those of the same data written as Parquet
with one row group a record batch (``tests/test_sources_arrow.py``).

A job's ranks share the framing pass (:func:`count_files`: each rank walks its share of the
files, ``plitzer.state.share`` gathers them), as they share a Parquet dataset's footers.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import polars as pl
import pyarrow as pa

from planner.api import Source
from planner.catalog.column import TokenDtype
from planner.catalog.datasetindex import Index
from planner.catalog.files import FileEntry
from planner.catalog.frame import fingerprint_of
from planner.catalog.rowgroups import Capabilities
from planner.catalog.rowlists import INDEX_SCHEMA
from planner.errors import ConfigError, DataError, one_line
from planner.stores.cache import cache_dir, digest, read_entry, write_entry
from planner.stores.storage import FileStat, LocalStorage
from plitzer.readpath.read import check_decoded, check_list_of_integers, check_no_null_tokens, list_lengths, to_tokens

__all__ = ["ARROW_IPC", "ArrowIndex", "BatchFile", "arrow_files", "arrow_index", "claims", "count_files", "prepare"]

ARROW_IPC = Capabilities("arrow-ipc", selectable=True, other_columns=True, column_runs=True)
"""An Arrow IPC dataset's: every pass, a record batch a read (its columns through :class:`BatchFile`)."""

_NAMES = ("input_ids", "tokens", "token_ids")
_FIELDS = 5  # rows, tokens, empty documents, byte offset, byte length: a batch's cached row


def arrow_files(source: object) -> list[Path] | None:
    """The Arrow IPC files of ``source`` in index order, or None where it is not an Arrow IPC source."""
    if not isinstance(source, (str, os.PathLike)) or "://" in os.fspath(source):
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


def claims(source: Source, settings: Any) -> bool:
    """A local ``save_to_disk`` folder, a folder of ``.arrow`` files, or one ``.arrow`` file."""
    return arrow_files(source) is not None


def prepare(source: Source, settings: Any) -> tuple[Source, dict[str, Any]]:
    """The Arrow IPC index of ``source``: planner then selects, and :mod:`plitzer.sources.selection` deduplicates."""
    return arrow_index(cast("str", source), column=settings.column), {}


@dataclass(frozen=True)
class BatchFile:
    """One Arrow IPC file's own reader of its record batches (a :class:`~planner.catalog.files.BatchReader`).

    A batch is decoded from a memory map of the file: its buffers are the map's pages, so a
    pass that uses one column reads that column's pages only. Picklable (a path and a schema).
    """

    path: str
    schema: pa.Schema

    def read(self, offset: int, length: int, where: str) -> pa.RecordBatch:
        """The record batch whose message is ``length`` bytes at ``offset``, every column."""
        try:
            with pa.memory_map(self.path) as f:
                if offset + length > f.size():
                    msg = f"the batch ends at byte {offset + length}, the file at {f.size()}"
                    raise ValueError(msg)
                f.seek(offset)
                return pa.ipc.read_record_batch(pa.ipc.read_message(f), self.schema)
        except (pa.ArrowException, OSError, ValueError) as e:
            msg = (
                f"{where}: cannot decode the record batch ({type(e).__name__}: {one_line(e)}); the file is damaged "
                f"or changed since it was indexed: restore it, or clear {cache_dir() / 'arrow'} to index it again"
            )
            raise DataError(msg, file=self.path) from e


@dataclass
class ArrowIndex(Index):
    """An :class:`~planner.catalog.datasetindex.Index` of Arrow IPC files: a row group is a record batch."""

    @property
    def capabilities(self) -> Capabilities:
        return ARROW_IPC

    def schema(self) -> pa.Schema:
        return self._schema(0)

    def _schema(self, fi: int) -> pa.Schema:
        reader = self.entries[fi].reader
        assert reader is not None  # every file of the index has its BatchFile
        return reader.schema

    def read_tokens(self, rg: int) -> pa.Array:
        """Record batch ``rg``: one ranged read of its message, decoded, checked, as ``list<dtype>``."""
        row = self.frame.row(rg, named=True)
        fi, g = int(row["file_index"]), int(row["row_group"])
        st, where = self.file(fi), self.location(fi, g)
        data = self.storage(fi).read_range(st, int(row["byte_offset"]), int(row["byte_length"]))
        try:
            batch = pa.ipc.read_record_batch(pa.ipc.read_message(pa.py_buffer(data)), self._schema(fi))
            arr = batch.column(self.column)
        except (pa.ArrowException, OSError, ValueError, KeyError) as e:
            msg = f"{where}: cannot decode the record batch ({type(e).__name__}: {one_line(e)}); the file is damaged"
            raise DataError(msg, file=st.location, row_group=g) from e
        check_list_of_integers(arr, where, file=st.location, row_group=g)
        check_no_null_tokens(arr, where, file=st.location, row_group=g)
        check_decoded(arr, rows=row["rows"], tokens=row["tokens"], where=where, file=st.location, row_group=g)
        return to_tokens(arr, self.dtype, check=bool(row["needs_check"]), where=where, file=st.location, row_group=g)

    def location(self, file_index: int, row_group: int | None = None) -> str:
        where = self.file(file_index).location
        return where if row_group is None else f"{where}, record batch {row_group}"


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
    """One pass over a file's framing: each record batch's (rows, tokens, empty documents, offset, length)."""
    out: list[tuple[int, int, int, int, int]] = []
    with pa.memory_map(str(path)) as f:
        if f.read(6) != b"ARROW1":
            f.seek(0)
        else:
            f.seek(8)
        reader = pa.ipc.MessageReader.open_stream(f)
        schema = pa.ipc.read_schema(reader.read_next_message())
        while True:
            at = f.tell()
            try:
                msg = reader.read_next_message()
            except StopIteration:
                break
            if msg.type == "dictionary batch":
                why = f"{path}: dictionary-encoded columns are not read; decode them first (Dataset.cast)"
                raise ConfigError(why)
            if msg.type != "record batch":
                continue
            arr = pa.ipc.read_record_batch(msg, schema).column(column)
            lens = list_lengths(arr)
            out.append((len(arr), int(lens.sum()), int((lens == 0).sum()), at, f.tell() - at))
    return np.asarray(out, np.int64).reshape(-1, _FIELDS)


def _batches(path: Path, stat: FileStat, column: str) -> np.ndarray:
    """The file's batches' rows, from the cache (keyed by path, size, mtime and column), else by :func:`_walk`."""
    entry = cache_dir() / "arrow" / f"{digest(stat.location, stat.size, stat.version, column)}.bin"
    got = read_entry(entry)
    if got is not None and len(got) % (8 * _FIELDS) == 0:
        return np.frombuffer(got, np.int64).reshape(-1, _FIELDS).copy()
    rows = _walk(path, column)
    write_entry(entry, rows.tobytes())
    return rows


def _file_schema(path: Path) -> pa.Schema:
    """The schema of an IPC file (its first message), read from a memory map: no batch is touched."""
    with pa.memory_map(str(path)) as f:
        head = f.read(min(f.size(), 8))
        f.seek(8 if head[:6] == b"ARROW1" else 0)
        try:
            return pa.ipc.read_schema(pa.ipc.read_message(f))
        except (pa.ArrowException, ValueError, OSError) as e:
            msg = f"{path}: not an Arrow IPC file ({one_line(e)}); pass a datasets save_to_disk folder or .arrow files"
            raise DataError(msg, file=str(path)) from e


def _stats(source: str | os.PathLike[str]) -> tuple[Path, list[Path], list[FileStat]]:
    """The source's folder (or file), its files and their stats."""
    paths = arrow_files(source)
    if not paths:
        msg = f"source {source!r} holds no Arrow IPC file; pass a datasets save_to_disk folder or .arrow files"
        raise ConfigError(msg)
    base = Path(os.fspath(source)).expanduser()
    stats = []
    for p in paths:
        st = p.stat()
        name = p.name if base.is_file() else p.relative_to(base).as_posix()
        stats.append(FileStat(name=name, location=str(p), size=st.st_size, version=str(st.st_mtime_ns)))
    return base, paths, stats


def count_files(
    source: str | os.PathLike[str], column: str | None, rank: int = 0, world: int = 1
) -> dict[int, np.ndarray]:
    """The framing pass of files ``rank, rank + world, ...`` of ``source`` (its cache's, else walked): a job's
    share, which :func:`arrow_index` takes gathered (``counted``)."""
    _, paths, stats = _stats(source)
    col = _column(_file_schema(paths[0]), column, str(paths[0]))
    return {i: _batches(paths[i], stats[i], col) for i in range(rank, len(paths), world)}


def arrow_index(
    source: str | os.PathLike[str], *, column: str | None = None, counted: Mapping[int, np.ndarray] | None = None
) -> ArrowIndex:
    """The index of an Arrow IPC source: a row a record batch, counted from the list offsets (cached).

    ``counted``: files' batches counted already (a job's ranks' shares, :func:`count_files`).
    """
    base, paths, stats = _stats(source)
    storage = LocalStorage(base)
    schemas = [_file_schema(p) for p in paths]
    col = _column(schemas[0], column, str(paths[0]))
    entries, parts = [], []
    for i, p in enumerate(paths):
        if col not in schemas[i].names:
            msg = f"{p}: no column {col!r} (its columns: {schemas[i].names}); every file must hold the token column"
            raise ConfigError(msg)
        got = counted.get(i) if counted is not None else None
        parts.append(got if got is not None else _batches(p, stats[i], col))
        reader = BatchFile(str(p), schemas[i])
        entries.append(FileEntry(stat=stats[i], storage=storage, schema=schemas[i], reader=reader))
    rows_all = np.concatenate(parts) if parts else np.zeros((0, _FIELDS), np.int64)
    per = [len(r) for r in parts]
    file_index = np.repeat(np.arange(len(paths), dtype=np.int64), per)
    value = schemas[0].field(col).type.value_type
    dtype: TokenDtype = "uint32" if value in (pa.uint32(), pa.uint64()) else "int32"
    cols: Mapping[str, Any] = {
        "file": [entries[f].stat.name for f in file_index.tolist()],
        "file_index": file_index,
        "row_group": np.concatenate([np.arange(n, dtype=np.int64) for n in per]) if per else [],
        "rows": rows_all[:, 0],
        "tokens": rows_all[:, 1],
        "empty_docs": rows_all[:, 2],
        "byte_offset": rows_all[:, 3],
        "byte_length": rows_all[:, 4],
        "needs_check": np.full(len(rows_all), value in (pa.int64(), pa.uint64())),
        "codec": np.zeros(len(rows_all), np.uint8),
        "chunk_values": rows_all[:, 1],
    }
    frame = pl.DataFrame(dict(cols)).select(pl.col(k).cast(v) for k, v in INDEX_SCHEMA.items())
    return ArrowIndex(
        frame=frame, column=col, dtype=dtype, fingerprint=fingerprint_of(frame), source=str(base), _files=entries
    )
