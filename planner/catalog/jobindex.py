"""A job index: a dataset's index in one object, for every rank of a job: bytes a row group, no footer.

``write(source, out)`` indexes ``source`` and writes one Parquet object (format 2): a row
per file with its identity (``name``, ``size``, ``version``: what the listing gives) and its
index rows as lists (``row_group``, ``rows``, ``tokens``, ``empty_docs``, ``byte_offset``,
``byte_length``, ``needs_check``, ``codec``, ``chunk_values``); the schema's metadata holds
the token column, the batch dtype, the fingerprint, the format and the files' templates
(:mod:`planner.catalog.chunkmeta`: what decoding the token column needs of a footer, each
distinct one once). ``load(url, source)`` lists ``source`` once, refuses the job index if a
file was added, removed or changed since (:class:`planner.errors.StaleIndexError`, naming
it), and gives the :class:`planner.catalog.datasetindex.Index`: a rank reads this one object and
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

The ranks of a process group build the same index without a job index file
(:mod:`planner.catalog.jobshare`); :mod:`planner.catalog.carried` reads the carried columns
off the footers.
docs/design.md, "One index per job" and "Bytes a row group".
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from numpy.typing import NDArray

from planner.catalog import chunkmeta, footer, payload, rowlists
from planner.catalog.carried import carry
from planner.catalog.chunkmeta import ColumnChunks
from planner.catalog.dataset import index
from planner.catalog.datasetindex import Index
from planner.catalog.files import FileEntry, list_files
from planner.catalog.rowlists import ROW_FIELDS, ints, strings
from planner.errors import ConfigError, DataError, PerformanceWarning, StaleIndexError, warn_caller
from planner.stores.backends import open_storages
from planner.stores.cache import write_atomic
from planner.stores.storage import SCHEMES

__all__ = [
    "FORMAT",
    "JobIndexInfo",
    "JobIndexParts",
    "encode",
    "load",
    "read_object",
    "read_parts",
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
            **_files_kind(ix),
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


def _files_kind(ix: Index) -> dict[str, str]:
    """A kind of token files' name and key (the settings its rows follow), for the loader to check: an index over
    a kind's format (``plitzer.sources.files.FileIndex``) has them; a Parquet index nothing."""
    fmt = getattr(ix, "format", None)
    return {} if fmt is None else {"files_kind": str(fmt.capabilities.kind), "files_key": str(fmt.key)}


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


def _stale(where: str, listed: list[FileEntry], kept: dict[str, tuple[int, str]]) -> list[int]:
    """Refuse a job index whose files are not the listing's, naming the first that differs.

    A file of the same size whose version alone differs (copied without its mtime, an
    object copied again) is not refused here: its position is returned, for
    :func:`_same_footers` to compare its footer with the job index's rows.
    """
    names = set()
    moved: list[int] = []
    for i, e in enumerate(listed):
        st = e.stat
        names.add(st.name)
        got = kept.get(st.name)
        if got is None:
            what = f"{st.location} was added since it was written"
        elif got[0] == st.size and got[1] != st.version:
            moved.append(i)
            continue
        elif got != (st.size, st.version):
            what = f"{st.location} changed since it was written (size {got[0]} -> {st.size})"
        else:
            continue
        raise _stale_error(where, what, st.location)
    for name in kept:
        if name not in names:
            raise _stale_error(where, f"{name} was removed since it was written", name)
    return moved


def _stale_error(where: str, what: str, file: str) -> StaleIndexError:
    msg = f"job index {where} is stale: {what}; write it again (plitzer index DATA --out {where})"
    return StaleIndexError(msg, file=file)


def _same_footers(where: str, moved: list[int], entries: list[FileEntry], frame: pl.DataFrame, column: str) -> None:
    """Accept the files whose version alone changed when their footers give the job index's rows exactly.

    A file's rows (row groups, their rows and tokens, the token column's byte ranges,
    codecs and values) and its template are all its footer says; the fingerprint is
    names, rows and tokens. So a file copied with the same bytes but not its mtime (``cp``
    without ``-p``, ``rsync`` without ``-t``) is the same file to the index: its footer is
    read (one ranged read) and compared, and only a difference is stale. The reads check
    the listing's version from then on. Decision: docs/design.md, "One index per job".
    """
    if not moved:
        return
    firsts = np.searchsorted(frame["file_index"].to_numpy(), np.arange(len(entries) + 1))
    fields = frame.select(ROW_FIELDS).to_numpy()
    for i in moved:
        e = entries[i]
        loc = e.stat.location
        try:
            raw = footer.fetch(e.storage, e.stat)
            md = footer.parse(raw, loc)
            rows, _, _ = footer.row_groups(e.storage, e.stat, md, column, None, raw=raw)
            same = np.array_equal(rows, fields[firsts[i] : firsts[i + 1]]) and e.template == chunkmeta.template_of(
                raw, md, column, loc
            )
        except (DataError, OSError, ValueError, pa.ArrowException):
            same = False
        if not same:
            raise _stale_error(where, f"{loc} changed since it was written (same size, another footer)", loc)
    warn_caller(
        f"job index {where}: {len(moved)} file(s) have a new version (mtime or ETag) but the same footer as when it "
        f"was written (e.g. {entries[moved[0]].stat.location}), so their footers were read to check them; write it "
        f"again to skip those reads (plitzer index DATA --out {where})",
        PerformanceWarning,
    )


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
    listed: tuple[list[FileEntry], str] | None = None,
) -> JobIndexParts:
    """Read the job index at ``url``, list ``source`` once and refuse the index if stale (no footer read).

    ``listed``: the files and the source for messages where the caller lists them (a kind of token files, its own
    listing); a file of a new version is then refused (it has no footer to compare).
    """
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
    entries, src = list_files(source, storage_options) if listed is None else listed
    kept = {n: (s, v) for n, s, v in zip(cols["name"], cols["size"], cols["version"], strict=True)}
    moved = _stale(where, entries, kept)
    if [e.stat.name for e in entries] != cols["name"]:  # the same files, so only a damaged index
        msg = f"{where}: its files are not in the listing's order; write it again (plitzer index DATA --out {where})"
        raise DataError(msg)
    for entry, template in zip(entries, templates, strict=True):
        entry.template = template
    frame, per = rowlists.decode(table, cols["name"])
    if moved and (meta.get("kind", "tokens") != "tokens" or "files_kind" in meta):  # counts not in footers
        at = entries[moved[0]].stat.location
        raise _stale_error(where, f"{at} has a new version (mtime or ETag)", at)
    _same_footers(where, moved, entries, frame, meta["column"])
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
