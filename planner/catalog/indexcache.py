"""The finished index's cache entry: where it lives, how it is written and read back.

Under ``PLITZER_CACHE`` (:mod:`planner.stores.cache`), keyed by the counting step's key and
each file's location, size, version and name; one row a file, its rows as lists
(:mod:`planner.catalog.rowlists`), the token column, dtype, fingerprint and the files'
templates in the schema's metadata. An entry that cannot be read is discarded and the index
built again, never trusted.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from planner.catalog import chunkmeta, payload, rowlists
from planner.catalog.column import TokenDtype
from planner.catalog.counting import Counting
from planner.catalog.datasetindex import Index
from planner.catalog.files import FileEntry
from planner.stores.cache import cache_dir, digest, discard, read_entry, write_entry

__all__ = ["from_cache", "index_cache_path", "to_cache"]

_INDEX_FORMAT = "5"  # 5: a row a file, its rows as lists (planner.catalog.rowlists); 4: codec, chunk_values


def index_cache_path(entries: Sequence[FileEntry], counting: Counting) -> Path | None:
    """Where the finished index of these files is cached (None: not cached for this counting)."""
    extra = counting.cache_key()
    if extra is None:
        return None
    stats = [(e.stat.location, e.stat.size, e.stat.version, e.stat.name) for e in entries]
    return cache_dir() / "index" / f"{digest(_INDEX_FORMAT, *extra, *stats)}.parquet"


def _token_dtype(name: str) -> TokenDtype:
    if name == "int32":
        return "int32"
    if name == "uint32":
        return "uint32"
    raise KeyError(name)  # a damaged cache entry: rebuilt


def from_cache(path: Path, counting: Counting, src: str, entries: list[FileEntry]) -> Index | None:
    raw = read_entry(path)
    if raw is None:
        return None
    try:
        table = payload.ParquetBytes(raw)  # a column at a time: the peak is the frame (planner.catalog.rowlists)
        meta = {k.encode(): v.encode() for k, v in table.metadata.items()}
        if table.column("name").to_pylist() != [e.stat.name for e in entries]:
            msg = "the cached files are not the listing's"  # a damaged entry
            raise ValueError(msg)
        frame, _ = rowlists.decode(table, [e.stat.name for e in entries])
        del table
        templates = chunkmeta.unpack_templates({k.decode(): v.decode() for k, v in meta.items()}, len(entries))
        for e, t in zip(entries, templates, strict=True):
            e.template = t
        return counting.wrap(
            Index(
                frame=frame,
                column=meta[b"column"].decode(),
                dtype=_token_dtype(meta[b"dtype"].decode()),
                fingerprint=meta[b"fingerprint"].decode(),
                source=src,
                _files=entries,
            )
        )
    except (OSError, KeyError, ValueError, pa.ArrowException, AssertionError) as e:
        discard(path, f"unreadable: {type(e).__name__}")  # rebuilt, never trusted
        return None


def to_cache(
    path: Path, frame: pl.DataFrame, column: str, dtype: TokenDtype, fingerprint: str, entries: Sequence[FileEntry]
) -> None:
    meta = {"column": column, "dtype": dtype, "fingerprint": fingerprint}
    _, lists = rowlists.encode(frame, len(entries))
    table = pa.Table.from_arrays(
        [rowlists.strings([e.stat.name for e in entries]), *lists.values()], names=["name", *lists]
    ).replace_schema_metadata(meta | chunkmeta.pack_templates([e.template for e in entries]))
    buf = pa.BufferOutputStream(memory_pool=pa.system_memory_pool())
    pq.write_table(
        table,
        buf,
        compression="zstd",
        row_group_size=rowlists.files_a_group(len(entries), frame.height),
        memory_pool=pa.system_memory_pool(),
    )
    write_entry(path, buf.getvalue().to_pybytes())  # a folder that cannot be written costs speed, not rows
