"""A job index: a dataset's index in one object, for every rank of a job: bytes a row group, no footer.

``write(source, out)`` indexes ``source`` and writes one Parquet object (format 2): a row
per file with its identity (``name``, ``size``, ``version``: what the listing gives) and its
index rows as lists (``row_group``, ``rows``, ``tokens``, ``empty_docs``, ``byte_offset``,
``byte_length``, ``needs_check``, ``codec``, ``chunk_values``); the schema's metadata holds
the token column, the batch dtype, the fingerprint, the format and the files' templates
(:mod:`planner.catalog.chunkmeta`: what decoding the token column needs of a footer, each
distinct one once). ``load(url, source)`` lists ``source`` once, refuses the job index if a
file was added, removed or changed since (:class:`planner.errors.StaleIndexError`, naming
it), and gives the :class:`planner.catalog.dataset.Index`: a rank reads this one object and
then only the token column chunks, decoded against minimal footers made from the rows.

``write(..., columns=("int_score", "token_count"))`` (``plitzer index DATA --out JOB --columns
...``) makes it carry those columns too, for the selection pass, a length column, aligned
columns and a dedupe key: per file a template a column (``column_templates``), per row group
``cN_byte_offset``, ``cN_byte_length``, ``cN_codec`` and ``cN_chunk_values`` for the N-th
column of ``columns`` (metadata), and the first file's Arrow schema (``schema``). Without
``columns`` the object is byte for byte what it was (an older reader ignores what it does
not know; this one reads an index without them, and reads footers for what it lacks).

A file changed in place after the listing (same size, so the listing cannot see it on
local disk within the mtime's resolution) is refused on its first read, as without a job
index (the version check of every ranged read). ``out`` and ``url`` are local paths or any
object-store URL a source may be (``s3://``, ``gs://``, ``az://``), read and written with
the store's own client and ``storage_options``.

The ranks of a process group build the same index without a job index file:
:func:`listing` on one rank, :func:`entries_of` on every rank from that listing,
:func:`count_share` (each rank indexes its share of the files) and :func:`take_counted`
(everyone's rows); a text source's share reads its footers through :func:`cached_footer`;
``plitzer.state.share`` runs the collectives between them.
docs/design.md, "One index per job" and "Bytes a row group".
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from numpy.typing import NDArray

from planner.catalog import chunkmeta, footer, payload, rowlists
from planner.catalog.chunkmeta import ColumnChunks
from planner.catalog.dataset import (
    Counted,
    Counting,
    FileEntry,
    FooterCounting,
    Index,
    LaidOut,
    build_index,
    index,
    index_cache_path,
    index_entries,
    list_files,
    scan_footers,
)
from planner.catalog.rowlists import ROW_FIELDS, ints, strings
from planner.errors import ConfigError, DataError, StaleIndexError
from planner.runtime import COUNT, runtime_pass
from planner.stores.backends import open_storages
from planner.stores.cache import write_atomic
from planner.stores.storage import SCHEMES, FileStat

__all__ = [
    "FORMAT",
    "CarryingCounting",
    "JobIndexInfo",
    "JobIndexParts",
    "CountedShare",
    "count_share",
    "entries_of",
    "has_cached_index",
    "job_index",
    "listing",
    "load",
    "read_object",
    "read_parts",
    "cached_footer",
    "take_counted",
    "write",
    "write_object",
]

FORMAT = "plitzer-job-index/2"  # 2: no footers; templates, codec and chunk_values (planner.catalog.chunkmeta)
_CARRIED = ("byte_offset", "byte_length", "codec", "chunk_values")  # a carried column's lists: c{N}_{field}
_CARRIED_TYPES = {"byte_offset": np.int64, "byte_length": np.int64, "codec": np.uint8, "chunk_values": np.int64}


@dataclass(frozen=True, slots=True)
class JobIndexInfo:
    """What :func:`write` wrote: where, how many files and row groups, how many bytes."""

    out: str
    files: int
    row_groups: int
    bytes: int
    fingerprint: str


def _is_url(path: str) -> bool:
    return path.startswith(SCHEMES)


def _store(url: str, storage_options: Mapping[str, Any] | None) -> Any:
    fs = getattr(open_storages(url, storage_options)[0], "fs", None)
    if fs is None:  # every object store has its fsspec filesystem
        msg = f"{url}: this store cannot read or write a job index; use a local path"
        raise ConfigError(msg)
    return fs


def read_object(url: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None) -> bytes:
    """The bytes of one object or local file (one GET on an object store)."""
    text = os.fspath(url)
    try:
        if _is_url(text):
            data: bytes = _store(text, storage_options).cat_file(text)
            return data
        return Path(text).expanduser().read_bytes()
    except FileNotFoundError as e:
        msg = f"job index {text!r} does not exist; write it with: plitzer index DATA --out {text}"
        raise ConfigError(msg) from e


def write_object(url: str | os.PathLike[str], data: bytes, storage_options: Mapping[str, Any] | None = None) -> None:
    """Write one object (a local file atomically; an object store's PUT is atomic)."""
    text = os.fspath(url)
    if _is_url(text):
        _store(text, storage_options).pipe_file(text, data)
    else:
        write_atomic(Path(text).expanduser(), data)


def encode(ix: Index, meta: Mapping[str, str] | None = None, columns: Sequence[str] = ()) -> bytes:
    """The job index of ``ix`` as Parquet bytes: its rows and its files' templates, no footer.

    ``meta``: more schema metadata (a text source's ``kind``, ``tokenizer``: ``plitzer.text.job``).
    ``columns``: the other columns it carries, as its entries hold them (:func:`carry`).
    """
    entries = ix.entries
    offsets, lists = rowlists.encode(ix.frame, len(entries))
    table_columns = {
        "name": strings([e.stat.name for e in entries]),
        "location": strings([e.stat.location for e in entries]),
        "size": ints(np.asarray([e.stat.size for e in entries], np.int64)),
        "version": strings([e.stat.version for e in entries]),
        **lists,
    }
    plain = list(table_columns)
    carried_meta = _carried_columns(entries, columns, offsets, table_columns) if columns else {}
    table = pa.Table.from_arrays(list(table_columns.values()), names=list(table_columns)).replace_schema_metadata(
        {
            "format": FORMAT,
            "column": ix.column,
            "dtype": ix.dtype,
            "fingerprint": ix.fingerprint,
            "source": ix.source,
            **chunkmeta.pack_templates([e.template for e in entries]),
            **carried_meta,
            **(meta or {}),
        }
    )
    buf = pa.BufferOutputStream()
    group = rowlists.files_a_group(len(entries), ix.frame.height)
    if columns:
        # A carried column's offsets and lengths grow along a file: delta-encoded, not
        # dictionary-encoded (the token column's lists stay as they were).
        extra = [c for c in table_columns if c not in plain]
        pq.write_table(
            table,
            buf,
            compression="zstd",
            row_group_size=group,
            use_dictionary=plain,
            column_encoding={f"{c}.list.element": "DELTA_BINARY_PACKED" for c in extra},
        )
    else:
        pq.write_table(table, buf, compression="zstd", row_group_size=group)
    data: bytes = buf.getvalue().to_pybytes()
    return data


def _carried_columns(
    entries: Sequence[FileEntry], columns: Sequence[str], offsets: pa.Array, out: dict[str, pa.Array]
) -> dict[str, str]:
    """The carried columns' lists (added to ``out``) and their metadata: names, templates, the first schema."""
    templates: dict[str, dict[str, str]] = {}
    for k, name in enumerate(columns):
        lacking = [e.stat.location for e in entries if name not in e.columns]
        if lacking:
            msg = f"{lacking[0]}: no column {name!r} to carry ({len(lacking)} files lack it); leave it out of columns="
            raise ConfigError(msg)
        for f in _CARRIED:
            values = np.concatenate([getattr(e.columns[name], f) for e in entries]).astype(_CARRIED_TYPES[f])
            out[f"c{k}_{f}"] = pa.ListArray.from_arrays(offsets, ints(values))
        templates[name] = chunkmeta.pack_templates([e.columns[name].template for e in entries])
    schema = entries[0].schema
    assert schema is not None  # carry() sets it
    return {
        "columns": json.dumps(list(columns)),
        "column_templates": json.dumps(templates),
        "schema": chunkmeta.pack_schema(schema),
    }


# From buffers, not pa.array or pa.table: those import pandas where it is installed (pyarrow's
# pandas shim), 0.6 s of every `plitzer index` process's start.
def write(
    source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    *,
    column: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    out_options: Mapping[str, Any] | None = None,
    progress: bool | None = None,
    count: footer.ChunkCounter | None = None,
    columns: Sequence[str] = (),
) -> JobIndexInfo:
    """Index ``source`` and write its job index to ``out`` (a local path or a store URL).

    ``out_options`` are the ``storage_options`` of ``out`` (default: ``storage_options``);
    ``count`` counts a row group whose footer has no statistics (:func:`planner.index`).
    ``columns``: other columns the job index carries, so that a selection pass, a length
    column, aligned columns or a dedupe key over them reads no footer either (each costs a
    few bytes a row group); every file must have each, as a column of one leaf.
    """
    names = _column_names(columns)
    if not names:
        ix = index(source, column=column, storage_options=storage_options, progress=progress, count=count)
        data = encode(ix)
    else:
        entries, src = list_files(source, storage_options)
        ix = carry(entries, src, column, names, progress=progress, count=count)
        data = encode(ix, columns=names)
    write_object(out, data, storage_options if out_options is None else out_options)
    return JobIndexInfo(os.fspath(out), len(ix.files), ix.row_groups, len(data), ix.fingerprint)


def _column_names(columns: Sequence[str] | str) -> list[str]:
    """``columns`` as a list of distinct names (a string: comma-separated, the command line's)."""
    names = [c.strip() for c in columns.split(",")] if isinstance(columns, str) else [str(c) for c in columns]
    names = [c for c in names if c]
    if len(set(names)) != len(names):
        dup = next(c for c in names if names.count(c) > 1)
        msg = f"columns= names {dup!r} twice; name each column once"
        raise ConfigError(msg)
    return names


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
    """The index of these files, each entry holding the chunks of ``columns`` too (for :func:`encode`).

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


def _stale(where: str, listed: list[FileEntry], kept: dict[str, tuple[int, str]]) -> None:
    """Refuse a job index whose files are not the listing's, naming the first that differs."""
    names = set()
    for e in listed:
        st = e.stat
        names.add(st.name)
        got = kept.get(st.name)
        if got is None:
            what = f"{st.location} was added since it was written"
        elif got != (st.size, st.version):
            what = (
                f"{st.location} changed since it was written (size {got[0]} -> {st.size}, "
                f"version {got[1]!r} -> {st.version!r})"
            )
        else:
            continue
        msg = f"job index {where} is stale: {what}; write it again (plitzer index DATA --out {where})"
        raise StaleIndexError(msg, file=st.location)
    for name in kept:
        if name not in names:
            msg = (
                f"job index {where} is stale: {name} was removed since it was written; "
                f"write it again (plitzer index DATA --out {where})"
            )
            raise StaleIndexError(msg, file=name)


@dataclass(frozen=True, slots=True)
class JobIndexParts:
    """A job index read and checked against the listing: what :func:`load` (and a text source's) builds from.

    ``entries`` carry their footer bytes; ``frame`` is the job index's rows (the index
    schema); ``meta`` its schema metadata (``column``, ``dtype``, ``fingerprint``, ``kind``).
    """

    entries: list[FileEntry]
    source: str
    frame: pl.DataFrame
    meta: dict[str, str]

    @property
    def kind(self) -> str:
        """``tokens`` (a token column's index) or ``text`` (a text source's counts, by one tokenizer)."""
        return self.meta.get("kind", "tokens")


def read_parts(
    url: str | os.PathLike[str],
    source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    storage_options: Mapping[str, Any] | None = None,
    index_options: Mapping[str, Any] | None = None,
) -> JobIndexParts:
    """Read the job index at ``url``, list ``source`` once and refuse the index if stale (no footer read)."""
    where = os.fspath(url)
    data = read_object(where, storage_options if index_options is None else index_options)
    try:
        table = payload.ParquetBytes(data)
        meta = table.metadata
        if meta.get("format") != FORMAT:
            msg = f"format {meta.get('format')!r}, not {FORMAT!r}"
            raise ValueError(msg)
        cols = {c: table.column(c).to_pylist() for c in ("name", "size", "version")}
        templates = chunkmeta.unpack_templates(meta, len(cols["name"]))
        missing = [c for c in ROW_FIELDS if c not in table.names]
        if missing:
            msg = f"no column {missing[0]!r}"
            raise ValueError(msg)
        lacking = [k for k in ("column", "dtype", "fingerprint") if k not in meta]
        if lacking:
            msg = f"no {lacking[0]!r} in its metadata"
            raise ValueError(msg)
    except (OSError, KeyError, ValueError, pa.ArrowException, AssertionError) as e:
        msg = f"{where} is not a plitzer job index ({e}); write it with: plitzer index DATA --out {where}"
        raise DataError(msg) from e
    entries, src = list_files(source, storage_options)
    kept = {n: (s, v) for n, s, v in zip(cols["name"], cols["size"], cols["version"], strict=True)}
    _stale(where, entries, kept)
    if [e.stat.name for e in entries] != cols["name"]:  # the same files, so only a damaged index
        msg = f"{where}: its files are not in the listing's order; write it again (plitzer index DATA --out {where})"
        raise DataError(msg)
    for entry, template in zip(entries, templates, strict=True):
        entry.template = template
    frame, per = rowlists.decode(table, cols["name"])
    carried = _read_carried(where, table, meta, entries, per)
    del table
    for entry, got in zip(entries, carried, strict=True):
        entry.columns = got
    return JobIndexParts(entries=entries, source=src, frame=frame, meta=meta)


def _read_carried(
    where: str, table: payload.ParquetBytes, meta: Mapping[str, str], entries: list[FileEntry], per: NDArray[np.int64]
) -> list[dict[str, ColumnChunks]]:
    """Each file's carried columns (a job index written with ``columns=``), and the first file's schema."""
    out: list[dict[str, ColumnChunks]] = [{} for _ in entries]
    if "columns" not in meta:
        return out
    try:
        names = json.loads(meta["columns"])
        templates = json.loads(meta["column_templates"])
        entries[0].schema = chunkmeta.unpack_schema(meta["schema"])
        bounds = np.concatenate([[0], np.cumsum(per)]).astype(np.int64)
        for k, name in enumerate(names):
            per_file = chunkmeta.unpack_templates(templates[name], len(entries))
            values = {}
            for f in _CARRIED:
                col = table.column(f"c{k}_{f}").combine_chunks()
                if len(col) != len(entries) or not np.array_equal(
                    pl.Series(col.value_lengths()).fill_null(0).to_numpy(), per
                ):
                    msg = f"column {name!r}: its {f} lists are not the row groups'"
                    raise ValueError(msg)
                values[f] = pl.Series(col.flatten()).to_numpy().astype(_CARRIED_TYPES[f])
            for i, t in enumerate(per_file):
                if t is None:
                    msg = f"column {name!r}: no template for {entries[i].stat.location}"
                    raise ValueError(msg)
                a, b = int(bounds[i]), int(bounds[i + 1])
                out[i][name] = ColumnChunks(t, *(values[f][a:b] for f in _CARRIED))
    except (KeyError, ValueError, TypeError, pa.ArrowException) as e:
        msg = f"{where}: its carried columns are damaged ({e}); write it again (plitzer index DATA --out {where})"
        raise DataError(msg) from e
    return out


def load(
    url: str | os.PathLike[str],
    source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    column: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    index_options: Mapping[str, Any] | None = None,
) -> Index:
    """The index of ``source`` from its job index at ``url``: one listing, one read, no footer read.

    ``index_options`` are the ``storage_options`` of ``url`` (default: ``storage_options``).
    A text source's job index (written with a tokenizer) is refused: it needs ``tokenizer=``.
    """
    where = os.fspath(url)
    got = read_parts(where, source, storage_options=storage_options, index_options=index_options)
    meta = got.meta
    if got.kind != "tokens":
        msg = (
            f"job index {where} holds the token counts of text column {meta['column']!r} under tokenizer "
            f"{meta.get('tokenizer', '?')}; pass that tokenizer= (and text_column=) to read it"
        )
        raise ConfigError(msg)
    if column is not None and column != meta["column"]:
        msg = (
            f"column={column!r} differs from the job index's token column {meta['column']!r} ({where}); "
            f"write it again with --column {column}"
        )
        raise ConfigError(msg)
    for e in got.entries:
        e.job_index = where  # a column it does not carry is read through footers, said once
    return Index(
        frame=got.frame,
        column=meta["column"],
        dtype="uint32" if meta["dtype"] == "uint32" else "int32",
        fingerprint=meta["fingerprint"],
        source=got.source,
        _files=got.entries,
    )


# -- one index per job: the ranks of a process group share the listing and the footers --------


def listing(
    source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], storage_options: Mapping[str, Any] | None
) -> list[FileStat]:
    """The files of ``source`` (one listing: what one rank does for the job)."""
    return [e.stat for e in list_files(source, storage_options)[0]]


def entries_of(
    source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    storage_options: Mapping[str, Any] | None,
    stats: Sequence[FileStat],
) -> tuple[list[FileEntry], str]:
    """The entries of a listing another rank made (no request: storages open without I/O).

    A list source's files are named ``i/name`` by their source's position (as
    :func:`planner.catalog.dataset.list_files` names them); each goes to its own storage.
    """
    storages = open_storages(source, storage_options)
    out = []
    for st in stats:
        i = 0 if len(storages) == 1 else int(st.name.split("/", 1)[0])
        out.append(FileEntry(stat=st, storage=storages[i]))
    return out, ", ".join(s.url for s in storages)


def has_cached_index(entries: Sequence[FileEntry], column: str | None) -> bool:
    """Whether this machine's cache holds the finished index of these files (then no footer is needed)."""
    path = index_cache_path(entries, FooterCounting(column))
    return path is not None and path.exists()


@dataclass(frozen=True, slots=True)
class CountedShare:
    """One rank's share of a job's index: the rows and templates of files ``rank, rank + world, ...``.

    What the ranks exchange (bytes a row group: the rows, a field at a time, zstd-compressed
    in one buffer; a template a file), never footers. An object all-gather copies its
    payload three or four times (pickle, tensor, the gathered tensors, unpickled): as
    arrays, 72 B a row group became 330 B of a rank's peak; compressed, a few. ``counts``
    is each counted file's row groups; ``errors`` is empty or the first file's DataError message.
    """

    files: tuple[int, ...]
    rows: bytes
    counts: tuple[int, ...]
    columns: tuple[str, ...]
    dtypes: tuple[str, ...]
    stored: tuple[str, ...]
    templates: tuple[bytes, ...]

    def lay_into(self, fields: Sequence[NDArray[np.int64]], starts: NDArray[np.int64]) -> None:
        """Copy each counted file's rows into ``fields`` (a column a field) from its row ``starts[file]`` on."""
        n = sum(self.counts)
        raw = pa.decompress(
            self.rows, decompressed_size=n * len(ROW_FIELDS) * 8, codec="zstd", memory_pool=pa.system_memory_pool()
        )
        table = np.frombuffer(raw, np.int64).reshape(len(ROW_FIELDS), n)
        at = 0
        for i, c in zip(self.files, self.counts, strict=False):
            for k, out in enumerate(fields):
                out[starts[i] : starts[i] + c] = table[k, at : at + c]
            at += c


def count_share(
    entries: Sequence[FileEntry],
    column: str | None,
    rank: int,
    world: int,
    threads: int = 32,
    count: footer.ChunkCounter | None = None,
    *,
    counting: Counting | None = None,
    fetch: Callable[[FileEntry], bytes] | None = None,
) -> CountedShare:
    """Index files ``rank, rank + world, ...`` from their footers (one read each), for :func:`take_counted`.

    ``counting``: how a file's rows are made from its footer (default: the token column's
    statistics); ``fetch``: how its footer bytes are read (default: one ranged read).
    """
    mine = [entries[i] for i in range(rank, len(entries), world)]
    how = FooterCounting(column, count) if counting is None else counting
    counted = [c for c in (scan_footers(mine, how, None, threads, fetch) if mine else []) if c is not None]
    counts = tuple(len(c.rows) for c in counted)
    # Field-major, a file at a time, each file's rows let go once copied.
    fields = np.empty((len(ROW_FIELDS), sum(counts)), np.int64)
    at = 0
    for k, c in enumerate(counted):
        fields[:, at : at + counts[k]] = np.asarray(c.rows, np.int64).reshape(-1, len(ROW_FIELDS)).T
        at += counts[k]
        counted[k] = Counted([], c.column, c.dtype, c.stored)
    share = CountedShare(
        files=tuple(range(rank, len(entries), world)),
        rows=pa.compress(fields, codec="zstd", asbytes=True, memory_pool=pa.system_memory_pool()),
        counts=counts,
        columns=tuple(c.column for c in counted),
        dtypes=tuple(c.dtype for c in counted),
        stored=tuple(c.stored for c in counted),
        templates=tuple(e.template.key() if e.template else b"" for e in mine),
    )
    del counted, fields
    # The footers' threads' heaps and the rows, before the exchange: once they are let go
    # (trimmed before, the rows freed after it stayed resident: 9 MB at 60,000 row groups).
    footer.give_back_memory()
    return share


def take_counted(
    entries: list[FileEntry],
    src: str,
    column: str | None,
    parts: Sequence[CountedShare],
    counting: Counting | None = None,
) -> Index:
    """The job's index from every rank's :func:`count_share` (no footer read), cached on this machine.

    ``counting``: the one the shares were made with (its fingerprint, cache and wrapping).
    """
    counted: list[Counted | None] = [None] * len(entries)
    per = np.zeros(len(entries), np.int64)
    for part in parts:
        for k, i in enumerate(part.files[: len(part.counts)]):
            counted[i] = Counted([], part.columns[k], part.dtypes[k], part.stored[k])  # type: ignore[arg-type]
            per[i] = part.counts[k]
            entries[i].template = chunkmeta.Template.from_key(part.templates[k]) if part.templates[k] else None
    missing = [e.stat.location for e, c in zip(entries, counted, strict=True) if c is None]
    if missing:
        msg = f"the ranks' shares lack {len(missing)} files, first {missing[0]}; every rank must share"
        raise ConfigError(msg)
    # Each part's rows straight into the frame's columns, one part decompressed at a time:
    # no copy a file (those were 72 B a row group on top of the columns, and left the heap
    # fragmented for what came next: docs/design.md, "Bytes a row group").
    starts = np.concatenate([[0], np.cumsum(per)]).astype(np.int64)
    fields = [np.empty(int(starts[-1]), np.int64) for _ in ROW_FIELDS]
    for part in parts:
        part.lay_into(fields, starts)
    del parts  # the caller's only reference (plitzer.state.share): the rows now live in ``fields`` alone
    footer.give_back_memory()  # the exchange's copies
    done = [c for c in counted if c is not None]
    del counted
    laid = LaidOut(per, fields)
    del fields  # build_index lets the columns the frame does not take go once it is built
    return build_index(entries, src, FooterCounting(column) if counting is None else counting, done, laid)


def cached_footer(e: FileEntry) -> bytes:
    """``e``'s footer bytes from this machine's footer cache, else one ranged read (then cached).

    A text source's job share reads footers so: a restart on the same machine reads none
    from storage (the counts are cached apart from the index, so the index is not).
    """
    raw = footer.cached(e.stat)
    if raw is None:
        with footer.fetch_lock(e.stat):
            raw = footer.cached(e.stat)
            if raw is None:
                raw = footer.fetch(e.storage, e.stat)
                footer.parse(raw, e.stat.location)  # damaged: refused here, naming the file, not cached
                with contextlib.suppress(OSError):  # a read-only cache costs speed only
                    footer.remember(e.stat, raw)
    return raw


def job_index(
    entries: list[FileEntry],
    src: str,
    column: str | None,
    threads: int = 32,
    count: footer.ChunkCounter | None = None,
) -> Index:
    """The index of files already listed: this machine's cached index, else their footers read here."""
    return index_entries(entries, src, FooterCounting(column, count), threads=threads)
