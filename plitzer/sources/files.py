"""Kinds of token files: what a kind states (:class:`Format`), and the one index over it (SPEC section 21).

A kind that is not Parquet states what it is, as Polars' ``register_io_source`` takes a source:
its files (the listing, in index order), each file's row groups with their documents' counts
(one pass over the file: rows, tokens, empty documents and the row group's byte range), how one
row group's tokens are read from its one ranged read, and whether it has columns besides the
tokens (then ``where=``, ``columns=`` and ``dedupe=NAME`` read them through its files' reader;
without, it refuses them, naming the kind). It does not subclass the Parquet index:
:func:`files_index` builds the one :class:`FileIndex` over any :class:`Format`, fills the
columns the frame's schema shares with Parquet's (``codec``, ``chunk_values``, ``needs_check``)
and caches each file's pass under ``PLITZER_CACHE`` by the file's identity (path, size,
mtime) and the kind's :attr:`Format.key`. A job's ranks split the passes by file
(:func:`count_share`) and gather them (``plitzer.state.share``; :func:`share`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import polars as pl
import pyarrow as pa

from planner.catalog.column import TokenDtype
from planner.catalog.datasetindex import Index
from planner.catalog.files import BatchReader, FileEntry
from planner.catalog.frame import fingerprint_of
from planner.catalog.rowgroups import Capabilities
from planner.catalog.rowlists import INDEX_SCHEMA
from planner.errors import ConfigError, DataError
from planner.mixing.sources import SourceSpec
from planner.stores.backends import open_storages
from planner.stores.cache import cache_dir, digest, read_entry, write_entry
from planner.stores.storage import FileStat, LocalStorage, Storage
from plitzer.readpath.read import check_decoded, check_list_of_integers, check_no_null_tokens, to_tokens
from plitzer.sources.exchange import all_or_raise, attempt

__all__ = [
    "FIELDS",
    "FileIndex",
    "Format",
    "count_share",
    "file_rows",
    "files_index",
    "is_url",
    "load_files",
    "local_listing",
    "read_whole",
    "remote_listing",
    "row_group_tokens",
    "share",
]

FIELDS = 5
"""A row group's counts as a kind's pass gives them: rows, tokens, empty documents, byte offset, byte length."""


class Format(Protocol):
    """What a kind of token files states: its files, their row groups, how one is read, what it can do."""

    @property
    def capabilities(self) -> Capabilities:
        """Its name (``kind``, in messages) and the passes it takes (``selectable``: it has columns for ``where=``)."""
        ...

    @property
    def column(self) -> str:
        """The token column's name (a kind without columns names its tokens, e.g. ``"tokens"``)."""
        ...

    @property
    def dtype(self) -> TokenDtype:
        """The dtype of every batch (SPEC section 2's rule: uint32 for unsigned 32 or 64-bit tokens, else int32)."""
        ...

    @property
    def key(self) -> str:
        """What besides a file's identity decides its row groups (settings: column, ``row_group_tokens``)."""
        ...

    def listing(self) -> tuple[str, Storage, list[FileStat]]:
        """The source for messages, the storage its files are read from, and its files in index order."""
        ...

    def row_groups(self, file: FileStat) -> np.ndarray:
        """One pass over ``file``: a row a row group, the :data:`FIELDS` counts (int64)."""
        ...

    def read(self, file: FileStat, data: bytes, row_group: int, where: str) -> pa.Array:
        """Row group ``row_group``'s documents (a list of integers) from ``data``, its one ranged read; DataError
        naming ``file`` where it cannot be decoded."""
        ...

    def reader(self, file: FileStat) -> BatchReader | None:
        """The file's reader of its row groups' columns (every column, ``where=``'s), or None: tokens only."""
        ...


def local_listing(base: Path, paths: Sequence[Path]) -> tuple[str, Storage, list[FileStat]]:
    """:meth:`Format.listing` of local ``paths`` under folder ``base``: names relative to it, mtime versions."""
    stats = []
    for p in paths:
        st = p.stat()
        stats.append(
            FileStat(name=p.relative_to(base).as_posix(), location=str(p), size=st.st_size, version=str(st.st_mtime_ns))
        )
    return str(base), LocalStorage(base), stats


def row_group_tokens(spec: SourceSpec, default: int) -> int:
    """The tokens at or after which a kind that cuts its own row groups ends one: ``spec``'s ``row_group_tokens``
    setting, ``default`` where it gives none; a ConfigError naming the source unless an int >= 1."""
    got = spec.file_format.row_group_tokens
    if got is None:
        return default
    if isinstance(got, bool) or not isinstance(got, (int, np.integer)) or got < 1:
        where = f"source {spec.name!r}: " if spec.name else ""
        msg = f"{where}row_group_tokens={got!r}: give an int >= 1, the tokens of a row group (default {default})"
        raise ConfigError(msg)
    return int(got)


def is_url(source: object) -> bool:
    """Whether ``source`` is one URL (``s3://``, ``gs://``, ``az://``, ``hf://``, ``https://``): a store's object."""
    return isinstance(source, (str, os.PathLike)) and "://" in os.fspath(source)


def remote_listing(
    url: str, storage_options: Mapping[str, Any] | None, suffixes: tuple[str, ...]
) -> tuple[str, Storage, list[FileStat]]:
    """:meth:`Format.listing` of a store's ``url`` through planner's storage layer: its files ending in one of
    ``suffixes`` (one object where ``url`` names it), named as a local copy's would be, read with ranged reads."""
    (storage,) = open_storages(url, storage_options)
    return storage.url, storage, storage.list_files(suffixes)


def read_whole(storage: Storage, file: FileStat) -> memoryview | np.ndarray:
    """All of ``file``'s bytes: memory-mapped on local disk, one ranged read from a store."""
    if isinstance(storage, LocalStorage):
        return np.memmap(file.location, np.uint8, mode="r") if file.size else np.zeros(0, np.uint8)
    return memoryview(storage.read_range(file, 0, file.size))


def file_rows(fmt: Format, file: FileStat) -> np.ndarray:
    """``file``'s row groups: its cache entry's (path, size, mtime, the kind's key), else the kind's pass."""
    kind = fmt.capabilities.kind
    entry = cache_dir() / kind / f"{digest(file.location, file.size, file.version, fmt.key)}.bin"
    got = read_entry(entry)
    if got is not None and len(got) % (8 * FIELDS) == 0:
        return np.frombuffer(got, np.int64).reshape(-1, FIELDS).copy()
    rows = np.ascontiguousarray(fmt.row_groups(file), np.int64).reshape(-1, FIELDS)
    write_entry(entry, rows.tobytes())
    return rows


def count_share(fmt: Format, rank: int = 0, world: int = 1) -> dict[int, np.ndarray]:
    """The row groups of files ``rank, rank + world, ...`` (a job's share, which :func:`files_index` takes gathered)."""
    _, _, stats = fmt.listing()
    return {i: file_rows(fmt, stats[i]) for i in range(rank, len(stats), world)}


def share(fmt: Format, group: Any) -> FileIndex:
    """``fmt``'s index for a job: each rank of ``group`` (a ``plitzer.state.groups.Collective``) passes over its
    share of the files and an all-gather gives every rank all of them (the files are each rank's: local or shared)."""
    shares = all_or_raise(attempt(count_share, fmt, group.rank, group.world), group)
    return files_index(fmt, counted={i: rows for part in shares for i, rows in part.items()})


@dataclass
class FileIndex(Index):
    """The row-group index of any :class:`Format`: a row group is one of the kind's, read with one ranged read."""

    format: Format | None = None

    @property
    def capabilities(self) -> Capabilities:
        assert self.format is not None  # files_index gives every FileIndex its format
        return self.format.capabilities

    def schema(self) -> pa.Schema:
        reader = self.entries[0].reader if self.entries else None
        if reader is not None:
            return reader.schema
        return pa.schema([pa.field(self.column, pa.list_(pa.uint32() if self.dtype == "uint32" else pa.int32()))])

    def read_tokens(self, rg: int) -> pa.Array:
        """Row group ``rg``: one ranged read, decoded by its kind, checked against its counts, as ``list<dtype>``."""
        assert self.format is not None
        row = self.frame.row(rg, named=True)
        fi, g = int(row["file_index"]), int(row["row_group"])
        st, where = self.file(fi), self.location(fi, g)
        data = self.storage(fi).read_range(st, int(row["byte_offset"]), int(row["byte_length"]))
        arr = self.format.read(st, data, g, where)
        check_list_of_integers(arr, where, file=st.location, row_group=g)
        check_no_null_tokens(arr, where, file=st.location, row_group=g)
        check_decoded(arr, rows=row["rows"], tokens=row["tokens"], where=where, file=st.location, row_group=g)
        return to_tokens(arr, self.dtype, check=bool(row["needs_check"]), where=where, file=st.location, row_group=g)

    def location(self, file_index: int, row_group: int | None = None) -> str:
        where = self.file(file_index).location
        if row_group is None:
            return where
        unit = "record batch" if self.capabilities.kind == "arrow-ipc" else "row group"
        return f"{where}, {unit} {row_group}"


def files_index(fmt: Format, *, counted: Mapping[int, np.ndarray] | None = None) -> FileIndex:
    """The index of ``fmt``'s files: a row a row group (each file's pass cached; ``counted``: passes made already,
    a job's ranks' shares by file number)."""
    src, storage, stats = fmt.listing()
    parts = [got if (got := (counted or {}).get(i)) is not None else file_rows(fmt, st) for i, st in enumerate(stats)]
    entries = [FileEntry(stat=st, storage=storage, reader=fmt.reader(st)) for st in stats]
    for e in entries:
        e.schema = e.reader.schema if e.reader is not None else None
    rows = np.concatenate(parts) if parts else np.zeros((0, FIELDS), np.int64)
    per = [len(r) for r in parts]
    file_index = np.repeat(np.arange(len(stats), dtype=np.int64), per)
    cols: Mapping[str, Any] = {
        "file": [stats[f].name for f in file_index.tolist()],
        "file_index": file_index,
        "row_group": np.concatenate([np.arange(n, dtype=np.int64) for n in per]) if per else [],
        "rows": rows[:, 0],
        "tokens": rows[:, 1],
        "empty_docs": rows[:, 2],
        "byte_offset": rows[:, 3],
        "byte_length": rows[:, 4],
        "needs_check": np.full(len(rows), _needs_check(fmt)),
        "codec": np.zeros(len(rows), np.uint8),
        "chunk_values": rows[:, 1],
    }
    frame = pl.DataFrame(dict(cols)).select(pl.col(k).cast(v) for k, v in INDEX_SCHEMA.items())
    return FileIndex(
        frame=frame,
        column=fmt.column,
        dtype=fmt.dtype,
        fingerprint=fingerprint_of(frame),
        source=src,
        _files=entries,
        format=fmt,
    )


def load_files(url: str, fmt: Format, storage_options: Mapping[str, Any] | None) -> FileIndex:
    """``fmt``'s index from its job index at ``url`` (``plitzer index DATA --out URL``): the kind's listing, checked
    against it (a stale one refused, naming the file), its rows from the job index, no pass over a file."""
    from planner.catalog.jobindex import read_parts

    src, storage, stats = fmt.listing()
    entries = [FileEntry(stat=st, storage=storage) for st in stats]
    got = read_parts(url, src, storage_options=storage_options, listed=(entries, src))
    kind, key = got.meta.get("files_kind"), got.meta.get("files_key")
    if (kind, key) != (fmt.capabilities.kind, fmt.key):
        was = f"a {kind} source's, key {key}" if kind else "a Parquet source's"
        msg = (
            f"job index {url} holds {was}, not this {fmt.capabilities.kind} source's (key {fmt.key}: its settings); "
            f"write it again with the source's settings: plitzer index DATA --out {url}"
        )
        raise ConfigError(msg)
    file_index = got.frame["file_index"].to_numpy()
    rows = got.frame.select(["rows", "tokens", "empty_docs", "byte_offset", "byte_length"]).to_numpy().astype(np.int64)
    ix = files_index(fmt, counted={i: rows[file_index == i] for i in range(len(stats))})
    if ix.fingerprint != got.meta.get("fingerprint"):
        msg = f"job index {url}: its rows do not give its fingerprint; the file is damaged: write it again"
        raise DataError(msg)
    return ix


def _needs_check(fmt: Format) -> bool:
    """Whether a read's values are checked against the batch dtype (a kind whose values may pass it says so)."""
    return bool(getattr(fmt, "needs_check", False))
