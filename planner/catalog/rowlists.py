"""The index frame's schema, and its rows stored as one list a file (the job index and the index cache).

A frame of G row groups holds each row group's file name, and the fields of its row;
stored as such (a column a field, a string a row group) it decodes through buffers of
several times its size. Stored as one row a file, each field a list of that file's
row groups, the names are written once a file and each field decodes into one buffer
a column (:func:`decode`): the peak of reading it is the frame and one column's decode.
The job index (:mod:`planner.catalog.jobindex`) and the finished index's cache entry
(:mod:`planner.catalog.indexcache`) are both written so, by :func:`encode`.

>>> import polars as pl
>>> frame = pl.DataFrame({"file_index": [0, 0, 2], **{f: [1, 2, 3] for f in ROW_FIELDS}})
>>> offsets, lists = encode(frame, 3)
>>> offsets.to_pylist(), lists["rows"].to_pylist()
([0, 2, 2, 3], [[1, 2], [], [3]])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
from numpy.typing import NDArray

from planner.catalog.payload import ParquetBytes

__all__ = ["INDEX_SCHEMA", "ROW_FIELDS", "decode", "encode", "files_a_group", "ints", "strings"]

INDEX_SCHEMA: dict[str, Any] = {
    "file": pl.String,
    "file_index": pl.Int64,
    "row_group": pl.Int64,
    "rows": pl.Int64,
    "tokens": pl.Int64,
    "empty_docs": pl.Int64,
    "byte_offset": pl.Int64,
    "byte_length": pl.Int64,
    # True where a token may not fit the batch dtype (int64 or uint64 data whose
    # footer min/max are missing or out of range): decoding then checks every value.
    "needs_check": pl.Boolean,
    # What a minimal footer needs to decode the chunk (planner.catalog.chunkmeta): the
    # chunk's codec (Thrift's number) and its level count (values, empty and null lists).
    "codec": pl.UInt8,
    "chunk_values": pl.Int64,
}
"""The index frame's columns, in order: 98 bytes a row group with names of 25 characters."""

ROW_FIELDS = (
    "row_group",
    "rows",
    "tokens",
    "empty_docs",
    "byte_offset",
    "byte_length",
    "needs_check",
    "codec",
    "chunk_values",
)
"""The fields of :data:`planner.catalog.footer.Row`, in order: what a file's footer gives each row group."""


def ints(a: NDArray[Any]) -> pa.Array:
    """An Arrow array over ``a``'s own buffer (no copy)."""
    return pa.Array.from_buffers(pa.from_numpy_dtype(a.dtype), len(a), [None, pa.py_buffer(np.ascontiguousarray(a))])


def strings(items: Sequence[str]) -> pa.Array:
    """An Arrow string array of ``items``, built from two buffers (no per-item Arrow objects)."""
    data = [s.encode() for s in items]
    ends = np.cumsum([len(d) for d in data], dtype=np.int64)
    offsets = np.concatenate([[0], ends]).astype(np.int32)
    return pa.Array.from_buffers(pa.string(), len(data), [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(data))])


def encode(frame: pl.DataFrame, files: int) -> tuple[pa.Array, dict[str, pa.Array]]:
    """Each file's rows of ``frame`` as one list a field, over the frame's own columns.

    The offsets come from the file index (a file without row groups has an empty list),
    not from a group-by's copy. Returns the int32 offsets and a list array per field of
    :data:`ROW_FIELDS`.
    """
    per = np.bincount(frame["file_index"].to_numpy(), minlength=files)
    offsets = ints(np.concatenate([[0], np.cumsum(per)]).astype(np.int32))
    return offsets, {c: pa.ListArray.from_arrays(offsets, frame[c].to_arrow()) for c in ROW_FIELDS}


def files_a_group(files: int, rows: int) -> int:
    """Files a Parquet row group of the lists holds: about 32,768 index rows.

    Arrow's writer holds a row group's encoded columns (and their dictionaries) until
    it is flushed: one group of 120,000 index rows took 17 MB to write, groups of 32,768
    4 MB, and the dictionaries still find each group's repeats.
    """
    return max(1, (1 << 15) * files // max(1, rows))


def decode(table: ParquetBytes, names: Sequence[str]) -> tuple[pl.DataFrame, NDArray[np.int64]]:
    """The index frame of the lists :func:`encode` wrote, and each file's row-group count.

    The lists' values as they are (one buffer a column, no explode), a column at a time,
    each file's name repeated by its row-group count. Polars, not ``Array.to_numpy``,
    which imports pandas: a second on a fresh process.
    """
    lists: dict[str, pl.Series] = {}
    per = np.zeros(len(names), np.int64)
    for c in ROW_FIELDS:
        col = table.column(c).combine_chunks()
        if c == "row_group":  # each file's row groups
            per = pl.Series(col.value_lengths()).fill_null(0).to_numpy().astype(np.int64)
        lists[c] = pl.Series(c, col.flatten()).cast(INDEX_SCHEMA[c])
        del col
    file_index = np.repeat(np.arange(len(per), dtype=np.int64), per)
    columns: dict[str, Any] = {
        "file": pl.Series(list(names), dtype=pl.String).gather(file_index),
        "file_index": file_index,
        **lists,
    }
    del lists
    frame = pl.DataFrame(columns).select(pl.col(k).cast(v) for k, v in INDEX_SCHEMA.items())
    return frame, per
