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

Capabilities: the order, resume, world sizes, layout stages and best-fit (lengths from the
tokens) are the index's arithmetic and need nothing more. ``where=``, ``columns=``,
``length_column=``, ``dedupe=`` and ``exclude=`` read other columns through Parquet footers, so
they are a ConfigError here, which says to write the dataset as Parquet
(``Dataset.to_parquet``) for them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
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

__all__ = ["ARROW_IPC", "ArrowIndex", "arrow_files", "arrow_index", "claims", "prepare"]

ARROW_IPC = Capabilities("arrow-ipc", selectable=False, other_columns=False, column_runs=False)
"""An Arrow IPC dataset's: the token column only, a record batch a read."""

_NAMES = ("input_ids", "tokens", "token_ids")
_FIELDS = 5  # rows, tokens, empty documents, byte offset, byte length: a batch's cached row
_REFUSED = ("where", "length_column", "dedupe", "exclude")


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
    """The Arrow IPC index of ``source``; a keyword that reads other columns is refused."""
    sel = settings.selection
    given = [k for k in _REFUSED if getattr(sel, k) is not None]
    given += ["columns"] if settings.columns else []
    if given:
        names = ", ".join(f"{k}=" for k in given)
        msg = (
            f"{names} with an Arrow IPC source ({source}): these read other columns through Parquet footers, "
            "and an Arrow IPC dataset gives its token column only; write it as Parquet first "
            "(datasets.Dataset.to_parquet, or datasets.load_from_disk(path).to_parquet('data/x.parquet'))"
        )
        raise ConfigError(msg)
    return arrow_index(cast("str", source), column=settings.column), {}


@dataclass
class ArrowIndex(Index):
    """An :class:`~planner.catalog.datasetindex.Index` of Arrow IPC files: a row group is a record batch."""

    schemas: dict[int, pa.Schema] = field(default_factory=dict, repr=False)

    @property
    def capabilities(self) -> Capabilities:
        return ARROW_IPC

    def length_source(self, given: str | None) -> str | None:
        """None: an Arrow IPC source's lengths come from its token lists."""
        return None

    def schema(self) -> pa.Schema:
        return self._schema(0)

    def _schema(self, fi: int) -> pa.Schema:
        got = self.schemas.get(fi)
        if got is None:
            first = int(self.frame.filter(pl.col("file_index") == fi)["byte_offset"].min())  # type: ignore[arg-type]
            head = self.storage(fi).read_range(self.file(fi), 0, first)
            got = self.schemas[fi] = _schema_of(head, self.file(fi).location)
        return got

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


def _schema_of(head: bytes, where: str) -> pa.Schema:
    """The schema of an IPC file whose first bytes (up to its first record batch) are ``head``."""
    buf = pa.py_buffer(head)
    start = 8 if head[:6] == b"ARROW1" else 0
    try:
        return pa.ipc.read_schema(pa.ipc.read_message(buf.slice(start)))
    except (pa.ArrowException, ValueError) as e:
        msg = f"{where}: not an Arrow IPC file ({one_line(e)}); pass a datasets save_to_disk folder or .arrow files"
        raise DataError(msg, file=where) from e


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


def _walk(path: Path, column: str) -> tuple[pa.Schema, np.ndarray]:
    """One pass over a file's framing: its schema and each record batch's (rows, tokens, empty, offset, length)."""
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
    return schema, np.asarray(out, np.int64).reshape(-1, _FIELDS)


def _batches(path: Path, stat: FileStat, column: str) -> tuple[np.ndarray, pa.Schema | None]:
    """The file's batches' rows, from the cache (keyed by path, size, mtime and column), else by :func:`_walk`."""
    entry = cache_dir() / "arrow" / f"{digest(stat.location, stat.size, stat.version, column)}.bin"
    got = read_entry(entry)
    if got is not None and len(got) % (8 * _FIELDS) == 0:
        return np.frombuffer(got, np.int64).reshape(-1, _FIELDS).copy(), None
    schema, rows = _walk(path, column)
    write_entry(entry, rows.tobytes())
    return rows, schema


def arrow_index(source: str | os.PathLike[str], *, column: str | None = None) -> ArrowIndex:
    """The index of an Arrow IPC source: a row a record batch, counted from the list offsets (cached)."""
    paths = arrow_files(source)
    if not paths:
        msg = f"source {source!r} holds no Arrow IPC file; pass a datasets save_to_disk folder or .arrow files"
        raise ConfigError(msg)
    base = Path(os.fspath(source)).expanduser()
    storage = LocalStorage(base)
    first = paths[0].read_bytes()[: 1 << 16] if paths[0].stat().st_size else b""
    col = _column(_schema_of(first, str(paths[0])), column, str(paths[0]))
    entries, parts, schemas = [], [], {}
    for i, p in enumerate(paths):
        st = p.stat()
        name = p.name if base.is_file() else p.relative_to(base).as_posix()
        stat = FileStat(name=name, location=str(p), size=st.st_size, version=str(st.st_mtime_ns))
        rows, schema = _batches(p, stat, col)
        if schema is not None:
            schemas[i] = schema
        entries.append(FileEntry(stat=stat, storage=storage))
        parts.append(rows)
    rows_all = np.concatenate(parts) if parts else np.zeros((0, _FIELDS), np.int64)
    per = [len(r) for r in parts]
    file_index = np.repeat(np.arange(len(paths), dtype=np.int64), per)
    value = (schemas.get(0) or _schema_of(first, str(paths[0]))).field(col).type.value_type
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
        frame=frame,
        column=col,
        dtype=dtype,
        fingerprint=fingerprint_of(frame),
        source=str(base),
        _files=entries,
        schemas=schemas,
    )
