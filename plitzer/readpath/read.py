"""The read path: one ranged read per row group, decoded and checked into tokens.

Every column chunk is read and decoded by one function, :func:`read_decoded`: one
ranged read of exactly the chunk's bytes (a ``preadv`` into the calling thread's
reused buffer on local disk, one ranged GET on an object store), decoded by pyarrow
through a file object that serves only that byte range plus a footer made from the
index (so a decode can never issue a second, hidden read): for the read path
:meth:`planner.Index.decoding_footer`'s (each file's, made once and kept, on an index of at
most 4,096 row groups; else the row group's own, tens of microseconds, kept by none), for a
pass that keeps a few files' footers theirs, with one ``ParquetFile`` kept per footer and
thread. The decode copies into Arrow's memory, so the buffer is reused by the
thread's next chunk.

``read_chunk(index, rg)`` reads row group ``rg``'s token column that way, checks it,
and returns a plain ``list<int32>`` (or ``list<uint32>``, as ``index.dtype`` says)
whatever the column's integer width and list type in the file:

* a null token inside a document, or rows and tokens other than the footer's, is
  a :class:`DataError` naming file, row group and row;
* narrower integers are widened by one vectorized cast; int64 and uint64 are
  narrowed, and where the index's ``needs_check`` says the footer's min/max do not
  prove every value fits, every value is checked first (a value out of range is a
  DataError naming file, row group and row);
* large_list offsets become int32 offsets, so the packer always sees one type.

planner reads metadata only; this module is where token data is read.
``count_chunk`` is the :class:`planner.catalog.footer.ChunkCounter` that counts a row
group whose footer lacks statistics; importing this module makes it planner's
default.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from numpy.typing import NDArray

from planner.catalog.column import TokenDtype, token_range
from planner.catalog.datasetindex import Index
from planner.catalog.rowgroups import RowGroupIndex
from planner.errors import DamagedChunkError, DataError, TokenRangeError, one_line
from planner.stores.storage import FileStat, Storage
from plitzer.readpath.readers import thread_reader

__all__ = [
    "ReadsTokens",
    "check_decoded",
    "check_list_of_integers",
    "check_no_null_tokens",
    "checked_tokens",
    "count_chunk",
    "decode_chunk",
    "decode_column",
    "list_lengths",
    "numpy_view",
    "own_column",
    "parquet_tokens",
    "read_chunk",
    "read_column",
    "read_decoded",
    "to_tokens",
]

_TARGET = {"int32": pa.int32(), "uint32": pa.uint32()}


def decode_column(
    data: Any,
    *,
    offset: int,
    file_size: int,
    metadata: pq.FileMetaData,
    row_group: int,
    column: str,
    where: str,
    what: str = "token",
    file: str | None = None,
    footer_row_group: int | None = None,
) -> pa.Array:
    """Decode one row group's ``column`` from the bytes of its column chunk, as the file holds it.

    ``data`` is any buffer (it may be reused once this returns: the decoded array
    lives in Arrow's memory). Damaged data is a DataError naming ``where`` (on one
    line), never a bare pyarrow error; ``what`` names the column in that message
    ("token", "text"); ``file`` (the file's location) goes into the error's attributes.
    ``footer_row_group``: the row group of ``metadata`` that describes the chunk, where
    that footer is not the file's (default ``row_group``: :meth:`planner.Index.chunk_footer`'s is 0).
    """
    r = thread_reader()
    f, pf = r.decoder(metadata, file_size)
    f.load(data, offset, where, file=file, row_group=row_group)
    try:
        at = row_group if footer_row_group is None else footer_row_group
        table = pf.read_row_group(at, columns=[column], use_threads=False)
    except DataError:
        r.decoders.discard(id(metadata))
        raise
    except (pa.ArrowException, OSError, ValueError, IndexError, TypeError) as e:
        r.decoders.discard(id(metadata))
        msg = f"{where}: cannot decode the {what} column ({type(e).__name__}: {one_line(e)}); the file is damaged"
        raise DamagedChunkError(msg, file=file, row_group=row_group) from e
    finally:
        f.load(b"", 0, "")  # nothing refers to the chunk's bytes once decoded: its buffer is reused
    col = table.column(0)
    return col.chunk(0) if col.num_chunks == 1 else pa.concat_arrays(col.chunks)


def read_decoded(
    storage: Storage,
    stat: FileStat,
    metadata: pq.FileMetaData,
    *,
    row_group: int,
    column: str,
    offset: int,
    length: int,
    where: str,
    what: str = "token",
    footer_row_group: int | None = None,
) -> pa.Array:
    """Read a column chunk's byte range (one ranged read) and decode it: the read path's one reader.

    Where the storage has ``read_into`` (local disk) the bytes go into the calling
    thread's reused buffer, else ``read_range`` returns them (object stores). The
    decode copies out of that buffer into Arrow's memory, so the buffer is reused
    by the thread's next chunk. Returns the column as the file holds it; errors as
    :func:`decode_column`.
    """
    into = getattr(storage, "read_into", None)
    data: Any
    if into is not None:
        data = thread_reader().view(length)
        into(stat, offset, data)
    else:
        data = storage.read_range(stat, offset, length)
    return decode_column(
        data,
        offset=offset,
        file_size=stat.size,
        metadata=metadata,
        row_group=row_group,
        column=column,
        where=where,
        what=what,
        file=stat.location,
        footer_row_group=footer_row_group,
    )


def check_list_of_integers(arr: pa.Array, where: str, *, file: str | None = None, row_group: int | None = None) -> None:
    """The token column must decode as a list (or large_list) of integers."""
    if not (pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type)) or not pa.types.is_integer(
        arr.type.value_type
    ):
        msg = f"{where}: the token column decoded as {arr.type}, not a list of integers; the file is damaged"
        raise DamagedChunkError(msg, file=file, row_group=row_group)


def decode_chunk(data: Any, **chunk: Any) -> pa.Array:
    """Decode one row group's token column from the bytes of its column chunk.

    Takes :func:`decode_column`'s keywords (``offset``, ``file_size``, ``metadata``,
    ``row_group``, ``column``, ``where``, ``file``). Returns the column as the file
    holds it (a ListArray or LargeListArray of some integer type); raises DataError
    (naming ``where``, on one line) for damaged data, never a bare pyarrow error.
    """
    arr = decode_column(data, **chunk)
    check_list_of_integers(arr, chunk["where"], file=chunk.get("file"), row_group=chunk["row_group"])
    return arr


def read_column(
    index: Index, rg: int, *, what: str = "token", footers: Callable[[int], pq.FileMetaData] | None = None
) -> tuple[pa.Array, dict[str, Any], str]:
    """Row group ``rg``'s column chunk (one ranged read), decoded as the file holds it.

    ``footers``: a file's decoding footer by its index (a pass that keeps its own few);
    by default the index's (:meth:`planner.Index.decoding_footer`: a few MB at most are held).
    Returns the array, the row group's index row and where it is (for messages).
    """
    row = index.frame.row(rg, named=True)
    fi, g = row["file_index"], row["row_group"]
    st = index.file(fi)
    where = index.location(fi, g)
    if index.entries[fi].reader is not None:  # a file of another format (an Arrow IPC file): its own reader
        got = own_column(index, rg, index.column)
        assert got is not None  # the index's own column
        arr = got
    else:
        # The index's decoding footer (the file's, kept, on a small index; else the row group's own,
        # as its row group 0), unless the caller keeps whole files' footers.
        md, at = index.decoding_footer(rg) if footers is None else (footers(fi), g)
        arr = _read_parquet(index, st, md, row, at, where, what)
    if what == "token":
        check_list_of_integers(arr, where, file=st.location, row_group=g)
    return arr, row, where


def _read_parquet(
    index: Index, st: FileStat, md: pq.FileMetaData, row: Mapping[str, Any], at: int, where: str, what: str
) -> pa.Array:
    fi, g = row["file_index"], row["row_group"]
    return read_decoded(
        index.storage(fi),
        st,
        md,
        row_group=g,
        footer_row_group=at,
        column=index.column,
        offset=row["byte_offset"],
        length=row["byte_length"],
        where=where,
        what=what,
    )


def own_column(index: Index, rg: int, column: str) -> pa.Array | None:
    """Row group ``rg``'s ``column`` (every stored row) read by its file's own reader; None where it has no such column.

    For a file that is not Parquet (:attr:`planner.catalog.files.FileEntry.reader`: an Arrow IPC
    file's record batch, decoded from a memory map, so only the pages of the columns used are read).
    """
    row = index.frame.row(rg, named=True)
    fi, g = int(row["file_index"]), int(row["row_group"])
    reader = index.entries[fi].reader
    assert reader is not None  # a file of another format than Parquet
    batch = reader.read(int(row["byte_offset"]), int(row["byte_length"]), index.location(fi, g))
    k = batch.schema.get_field_index(column)
    return None if k < 0 else batch.column(k)


def _values(arr: pa.Array) -> pa.Array:
    """The values the (unsliced or sliced) list array's rows cover, zero-copy."""
    if len(arr) == 0:
        return arr.values.slice(0, 0)
    first, last = arr.offsets[0].as_py(), arr.offsets[-1].as_py()
    return arr.values.slice(first, last - first)


def _row_of(arr: pa.Array, value_position: int) -> int:
    offsets = arr.offsets.to_numpy()
    return int(np.searchsorted(offsets, value_position + offsets[0], side="right")) - 1


def check_decoded(
    arr: pa.Array, *, rows: int, tokens: int, where: str, file: str | None = None, row_group: int | None = None
) -> None:
    """The decoded chunk must hold the rows and tokens its footer promised.

    A damaged page can decode without an error into other lengths; counting is
    cheap and catches it before a single token is handed out.
    """
    got_tokens = len(_values(arr))
    if len(arr) != rows or got_tokens != tokens:
        msg = (
            f"{where}: decoded {len(arr)} rows and {got_tokens} tokens, but the footer says {rows} rows "
            f"and {tokens} tokens; the file is damaged: restore it from a good copy"
        )
        raise DamagedChunkError(msg, file=file, row_group=row_group)


def check_no_null_tokens(
    arr: pa.Array, where: str, first_row: int = 0, *, file: str | None = None, row_group: int | None = None
) -> None:
    """Raise DataError naming the row if any token inside a list is null."""
    values = _values(arr)
    if values.null_count == 0:
        return
    flat_null = int(np.flatnonzero(values.is_null().to_numpy(zero_copy_only=False))[0])
    row = first_row + _row_of(arr, flat_null)
    msg = (
        f"{where}, row {row}: a null token inside a document; tokens must be "
        "non-null integers: fix the tokenizer output or drop the row"
    )
    raise DataError(msg, file=file, row_group=row_group, row=row)


def to_tokens(
    arr: pa.Array,
    dtype: TokenDtype,
    *,
    check: bool,
    where: str,
    file: str | None = None,
    row_group: int | None = None,
) -> pa.Array:
    """``arr`` as a plain ``list<dtype>``: widened, or narrowed (checked when ``check``).

    ``check`` is the index's ``needs_check``: False where the footer's min/max
    prove every value fits (or no value can be out of range), so narrowing is one
    unchecked cast. A value that does not fit is a DataError naming the row.
    """
    target = _TARGET[dtype]
    if pa.types.is_list(arr.type) and arr.type.value_type == target:
        return arr
    source = arr.type.value_type
    if check:
        values = _values(arr)
        lo, hi = token_range(dtype)
        mm = pc.min_max(values)
        small, large = mm["min"].as_py(), mm["max"].as_py()
        if small is not None and (small < lo or large > hi):
            v = values.to_numpy(zero_copy_only=False)
            bad = v > hi if pa.types.is_unsigned_integer(source) else (v < lo) | (v > hi)
            i = int(np.flatnonzero(bad)[0])
            row = _row_of(arr, i)
            msg = (
                f"{where}, row {row}: token {values[i].as_py()} does not fit {dtype} (the column is "
                f"{source}; batches are {dtype}, whose tokens lie in [{lo}, {hi}]); re-tokenize this row or "
                "fix the file"
            )
            raise TokenRangeError(msg, file=file, row_group=row_group, row=row)
    try:
        return arr.cast(pa.list_(target), safe=False)
    except (pa.ArrowException, ValueError) as e:  # a large_list of more than 2**31 - 1 tokens
        msg = f"{where}: cannot convert the token column to list<{dtype}> ({one_line(e)}); split the row group"
        raise DataError(msg, file=file, row_group=row_group) from e


@runtime_checkable
class ReadsTokens(Protocol):
    """A source kind that reads its own row groups' tokens (text tokenizes, a selection drops rows, Arrow IPC)."""

    def read_tokens(self, rg: int) -> pa.Array:
        """Row group ``rg``'s documents, checked: what :func:`read_chunk` returns for it."""
        ...


def read_chunk(index: RowGroupIndex, rg: int) -> pa.Array:
    """Read, decode and check row group ``rg`` (a row of ``index.frame``): one ranged read.

    Returns a ``list<int32>`` (``list<uint32>`` when ``index.dtype`` is uint32)
    holding the row group's documents, or raises DataError naming file, row group
    and (where one is at fault) row. The source holding ``rg`` (``index.part``: a mixture's
    source, else the index itself) reads it: a kind of ``plitzer.sources`` that reads its
    own (:class:`ReadsTokens`: text tokenizes, a selection drops rows, Arrow IPC decodes a
    record batch), else a Parquet dataset's token column (:func:`parquet_tokens`). Nothing is
    registered: the index says how it is read.
    """
    part = getattr(index, "part", None)
    if part is None:
        msg = f"read_chunk: no reader for a {type(index).__name__}; pass an index (plitzer.sources.open gives one)"
        raise TypeError(msg)
    sub, local = part(rg)
    if isinstance(sub, ReadsTokens):
        return sub.read_tokens(local)
    return parquet_tokens(sub, local)


def parquet_tokens(index: Index, rg: int) -> pa.Array:
    """A dataset's row group ``rg``: its token column chunk read (one ranged read), checked, converted.

    A Parquet file's chunk decoded through the index's footer; a file that reads its own row
    groups (``FileEntry.reader``: an Arrow IPC file's record batch) through that reader.
    """
    return checked_tokens(index, *read_column(index, rg))


def checked_tokens(index: Index, arr: pa.Array, row: Mapping[str, Any], where: str) -> pa.Array:
    """A dataset's token chunk as decoded (``arr``, of the index's frame row ``row``), checked and converted.

    What :func:`read_chunk` returns for it, however its bytes were read (a pass reads a run of
    row groups through one footer: :class:`plitzer.readpath.runs.ColumnRun`).
    """
    file, g = index.file(row["file_index"]).location, int(row["row_group"])
    check_no_null_tokens(arr, where, file=file, row_group=g)
    check_decoded(arr, rows=row["rows"], tokens=row["tokens"], where=where, file=file, row_group=g)
    return to_tokens(arr, index.dtype, check=bool(row["needs_check"]), where=where, file=file, row_group=g)


def numpy_view(a: pa.Array) -> NDArray[Any]:
    """A primitive Arrow array without nulls as a NumPy view of its buffer.

    Not ``Array.to_numpy``: its conversion imports pandas the first time (0.23 s
    measured), which a fresh process's first batch would otherwise wait for.
    """
    dtype = np.dtype(a.type.to_pandas_dtype())
    buf = a.buffers()[1]
    if buf is None:
        return np.zeros(0, dtype)
    return np.frombuffer(buf, dtype=dtype)[a.offset : a.offset + len(a)]


def list_lengths(arr: pa.Array) -> NDArray[np.int64]:
    """Each list's length, 0 for a null list (what ``list_value_length().fill_null(0)`` gives)."""
    off = numpy_view(arr.offsets).astype(np.int64, copy=False)
    lens: NDArray[np.int64] = off[1:] - off[:-1]
    if arr.null_count:
        valid = np.frombuffer(arr.buffers()[0], dtype=np.uint8)
        bits = np.unpackbits(valid, bitorder="little")[arr.offset : arr.offset + len(arr)]
        lens[bits == 0] = 0
    return lens


def count_chunk(storage: Storage, file: FileStat, metadata: pq.FileMetaData, **chunk: Any) -> tuple[int, int]:
    """Tokens and empty documents of one row group, by reading it once (no statistics).

    A :class:`planner.catalog.footer.ChunkCounter`: ``chunk`` holds its keywords
    (``row_group``, ``column``, ``offset``, ``length``, ``where``), as :func:`read_decoded` takes them.
    """
    arr = read_decoded(storage, file, metadata, **chunk)
    row_group, where = chunk["row_group"], chunk["where"]
    check_list_of_integers(arr, where, file=file.location, row_group=row_group)
    check_no_null_tokens(arr, where, file=file.location, row_group=row_group)
    lengths = list_lengths(arr)
    if len(arr) != metadata.row_group(row_group).num_rows:
        msg = (
            f"{where}: decoded {len(arr)} rows, but the footer says {metadata.row_group(row_group).num_rows}; "
            "the file is damaged: restore it from a good copy"
        )
        raise DamagedChunkError(msg, file=file.location, row_group=row_group)
    return int(lengths.sum()), int((lengths == 0).sum())
