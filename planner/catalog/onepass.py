"""A file's token-column index rows from one pass over its footer bytes, in C.

:func:`planner.catalog.footer.row_groups` asks pyarrow for each row group's token column
chunk (``md.row_group(g).column(j)``, its statistics, ...), a few microseconds of Python
each, and walks each chunk's ``ColumnMetaData`` in Python first for the level-histogram
check. On FineWeb-Edu's files (400 row groups a file) that is twice pyarrow's parse of
the footer, and it holds the GIL while the parse does not. :func:`rows` gets the same
rows without either:

1. **Learn the layout from row group 0.** The token column's ``ColumnMetaData`` is found
   by its encoded path (as :func:`planner.catalog.histograms.check_column_histograms` finds
   it), and its fields after the path are walked once, in Python: their field headers,
   and per field what its value looks like (a varint, a binary of a fixed length, the
   statistics struct, the size statistics with their histograms' lengths, ...).
2. **One regular expression for every row group.** The layout becomes a ``re`` pattern,
   from ``ColumnChunk.meta_data``'s header, the type and the encodings on: field headers
   literal, varints as ``[\\x80-\\xff]{0,9}[\\x00-\\x7f]``, the statistics' binaries by
   their literal length, the histograms' list headers literal, the fields the rows need
   captured. ``findall`` runs it over the whole footer in C.
3. **Certain, or nothing.** It must match exactly once a row group, at the places where
   the path is found, and the path must be found exactly once a row group (then every
   occurrence of the path anchors one match, and nothing else does: see :func:`rows`).
4. **Decoded vectorized.** Each captured field of every row group is joined into one
   bytes object and its varints decoded with numpy (:func:`_varints`); the rows are
   computed as arrays, with the per-row-group path's rules
   (:func:`planner.catalog.footer.row_groups`): the chunk's range, tokens from the
   statistics' null count, the narrowing check from min/max as pyarrow decodes them.
5. **Checked against pyarrow.** The first and last row groups' rows are computed by the
   per-row-group path too and must be equal.

Wherever the layout is not one this module knows (a field it does not read, a long field
header, a row group whose layout differs, statistics without a null count, a writer whose
statistics pyarrow distrusts, a codec outside the common ones, a chunk range outside the
file, inconsistent counts, ...) :func:`rows` returns None and the caller takes the
per-row-group path, which gives the same rows or the DataError it always gave: the
results are identical by construction, and only the common layout is fast.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import numpy as np
import pyarrow.parquet as pq
from numpy.typing import NDArray

from planner.catalog.column import TokenDtype, token_range
from planner.catalog.thrift import list_header, varint

__all__ = ["rows"]

_V = rb"[\x80-\xff]{0,9}[\x00-\x7f]"  # a varint (i16, i32, i64: zigzag; lengths: unsigned)
_CODECS = np.array([0, 1, 2, 4, 6, 7])  # Thrift's number is CODECS' (planner.catalog.chunkmeta)
_PHYSICAL = {"INT32": 1, "INT64": 2}
_WIDTH = {1: 4, 2: 8}
_BINARIES = frozenset({"max", "min", "max_value", "min_value"})


class _Unknown(Exception):
    """A layout this module does not read: the caller takes the per-row-group path."""


def _enc_list() -> bytes:
    """``ColumnMetaData.encodings``: a list of 1-14 small enum values (one byte each)."""
    return b"(?:" + b"|".join(re.escape(bytes([(n << 4) | 5])) + b"[\\x00-\\x7f]{%d}" % n for n in range(1, 15)) + b")"


def _stats_list() -> bytes:
    """``ColumnMetaData.encoding_stats``: a list of 1-14 ``PageEncodingStats`` (three i32 fields)."""
    one = b"(?:\\x15" + _V + b"\\x15" + _V + b"\\x15" + _V + b"\\x00)"
    return b"(?:" + b"|".join(re.escape(bytes([(n << 4) | 12])) + one + b"{%d}" % n for n in range(1, 15)) + b")"


_ENCODINGS = _enc_list()
_ENCODING_STATS = _stats_list()


class _Layout:
    """What row group 0's token ``ColumnMetaData`` (after its path) and ``ColumnChunk`` tail look like."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.groups: list[str] = []  # the captured fields, in pattern order
        self.histograms: tuple[int | None, int | None] = (None, None)
        self.has_stats = False

    def literal(self, b: bytes) -> None:
        self.parts.append(re.escape(b))

    def value(self, name: str | None, pattern: bytes = _V) -> None:
        if name is None:
            self.parts.append(b"(?:" + pattern + b")")
        else:
            self.parts.append(b"(" + pattern + b")")
            self.groups.append(name)

    def pattern(self) -> bytes:
        return b"".join(self.parts)


def _header(body: bytes, pos: int, last: int) -> tuple[int, int, int, int]:
    """The field header at ``pos``: (its byte, field id, type, position after it); 0 at a struct's end."""
    b = body[pos]
    if b == 0:
        return 0, 0, 0, pos + 1
    if not b >> 4:
        raise _Unknown  # a long field header: writers that write fields in order never do
    return b, last + (b >> 4), b & 0x0F, pos + 1


def _uvarint_end(body: bytes, pos: int) -> int:
    for k in range(10):
        if not body[pos + k] & 0x80:
            return pos + k + 1
    raise _Unknown


def _statistics(body: bytes, pos: int, out: _Layout) -> int:
    """``Statistics``: min/max binaries of their literal length, counts as varints, the exact flags."""
    last = 0
    names = {1: "max", 2: "min", 5: "max_value", 6: "min_value"}
    while True:
        b, fid, typ, pos = _header(body, pos, last)
        if b == 0:
            out.literal(b"\x00")
            return pos
        last = fid
        if fid in names and typ == 8:
            size = body[pos]
            if size >= 0x80:
                raise _Unknown
            out.literal(bytes([b, size]))
            out.value(names[fid], b".{%d}" % size)
            pos += 1 + size
        elif fid in (3, 4) and typ == 6:  # null_count, distinct_count: i64
            out.literal(bytes([b]))
            out.value("null_count" if fid == 3 else None)
            pos = _uvarint_end(body, pos)
        elif fid in (7, 8) and typ in (1, 2):
            out.parts.append(b"[" + re.escape(bytes([(b & 0xF0) | 1, (b & 0xF0) | 2])) + b"]")
        else:
            raise _Unknown


def _size_statistics(body: bytes, pos: int, out: _Layout) -> int:
    """``SizeStatistics``: the histograms' list headers literal (so their lengths are row group 0's)."""
    last = 0
    got: list[int | None] = [None, None]
    while True:
        b, fid, typ, pos = _header(body, pos, last)
        if b == 0:
            out.literal(b"\x00")
            out.histograms = (got[0], got[1])
            return pos
        last = fid
        if fid == 1 and typ == 6:
            out.literal(bytes([b]))
            out.value(None)
            pos = _uvarint_end(body, pos)
        elif fid in (2, 3) and typ == 9:  # repetition, definition level histograms: list<i64>
            h = body[pos]
            size = h >> 4
            if size == 15 or h & 0x0F != 6:
                raise _Unknown
            out.literal(bytes([b, h]))
            out.value(None, b"(?:" + _V + b"){%d}" % size)
            got[fid - 2] = size
            pos += 1
            for _ in range(size):
                pos = _uvarint_end(body, pos)
        else:
            raise _Unknown


# ColumnMetaData's integer fields after the path: (name captured or None, Thrift type). A
# field of another type is one pyarrow's parser skips (as unset): not this layout.
_META_FIELDS: dict[int, tuple[str | None, int]] = {
    4: ("codec", 5),
    5: ("num_values", 6),
    6: (None, 6),  # total_uncompressed_size
    7: ("length", 6),  # total_compressed_size
    9: ("data_page", 6),
    10: (None, 6),  # index_page_offset
    11: ("dictionary", 6),
    14: (None, 6),  # bloom_filter_offset
    15: (None, 5),  # bloom_filter_length
}
_CHUNK_FIELDS = {4: 6, 5: 5, 6: 6, 7: 5}  # ColumnChunk's page index offsets (i64) and lengths (i32)


def _learn(body: bytes, pos: int, last_column: bool) -> _Layout:
    """The layout of the fields after the path, from the first row group's chunk at ``pos``."""
    out = _Layout()
    pos = _column_meta(body, pos, out)
    pos = _chunk_rest(body, pos, out)
    if last_column:
        _row_group_rest(body, pos, out)
    return out


def _column_meta(body: bytes, pos: int, out: _Layout) -> int:
    """``ColumnMetaData`` after its path (field 3): its integers, statistics, encoding stats, size statistics."""
    last = 3
    while True:
        b, fid, typ, pos = _header(body, pos, last)
        if b == 0:
            out.literal(b"\x00")
            return pos
        last = fid
        if fid in _META_FIELDS and typ == _META_FIELDS[fid][1]:
            out.literal(bytes([b]))
            out.value(_META_FIELDS[fid][0])
            pos = _uvarint_end(body, pos)
        elif fid == 12 and typ == 12:
            out.literal(bytes([b]))
            out.has_stats = True
            pos = _statistics(body, pos, out)
        elif fid == 13 and typ == 9:
            out.literal(bytes([b]))
            out.value(None, _ENCODING_STATS)
            pos = _encoding_stats_end(body, pos)
        elif fid == 16 and typ == 12:
            out.literal(bytes([b]))
            pos = _size_statistics(body, pos, out)
        else:
            raise _Unknown  # key_value_metadata, geospatial statistics, anything newer


def _encoding_stats_end(body: bytes, pos: int) -> int:
    """The position after ``encoding_stats``: 1-14 structs of three i32 fields (as :data:`_ENCODING_STATS`)."""
    h = body[pos]
    if h >> 4 in (0, 15) or h & 0x0F != 12:
        raise _Unknown
    pos += 1
    for _ in range(h >> 4):
        for _ in range(3):
            if body[pos] != 0x15:
                raise _Unknown
            pos = _uvarint_end(body, pos + 1)
        if body[pos] != 0:
            raise _Unknown
        pos += 1
    return pos


def _chunk_rest(body: bytes, pos: int, out: _Layout) -> int:
    """The rest of the ``ColumnChunk``: the page index's offsets and lengths."""
    last = 3
    while True:
        b, fid, typ, pos = _header(body, pos, last)
        if b == 0:
            out.literal(b"\x00")
            return pos
        last = fid
        if _CHUNK_FIELDS.get(fid) == typ:
            out.literal(bytes([b]))
            out.value(None)
            pos = _uvarint_end(body, pos)
        else:
            raise _Unknown  # encryption


def _row_group_rest(body: bytes, pos: int, out: _Layout) -> None:
    """After the last column's chunk: the ``RowGroup``'s total_byte_size (2) and num_rows (3), captured."""
    if body[pos : pos + 1] != b"\x16":
        raise _Unknown
    pos = _uvarint_end(body, pos + 1)
    if body[pos : pos + 1] != b"\x16":
        raise _Unknown
    out.literal(b"\x16")
    out.value(None)
    out.literal(b"\x16")
    out.value("num_rows")


@functools.lru_cache(maxsize=64)
def _compile(pattern: bytes) -> re.Pattern[bytes]:
    return re.compile(pattern, re.DOTALL)


def _varints(data: bytes, n: int) -> NDArray[np.int64]:
    """The ``n`` zigzag varints that ``data`` holds back to back, decoded (int64)."""
    a = np.frombuffer(data, np.uint8)
    ends = np.flatnonzero(a < 0x80)
    if len(ends) != n:
        raise _Unknown
    starts = np.empty(n, np.int64)
    starts[:1] = 0
    starts[1:] = ends[:-1] + 1
    if n and int((ends - starts).max()) > 9:
        raise _Unknown
    k = np.arange(len(a), dtype=np.int64) - np.repeat(starts, ends - starts + 1)
    if np.any((k == 9) & (a > 1)):
        raise _Unknown  # more than 64 bits
    z = np.bitwise_or.reduceat((a & 0x7F).astype(np.uint64) << (7 * k).astype(np.uint64), starts) if n else a[:0]
    z = z.astype(np.uint64)
    return ((z >> np.uint64(1)) ^ (np.uint64(0) - (z & np.uint64(1)))).view(np.int64)


def _trusted_writer(created_by: str | None) -> bool:
    """Whether pyarrow takes the writer's statistics as they are (``ApplicationVersion::HasCorrectStatistics``).

    pyarrow distrusts some statistics of old parquet-mr and parquet-cpp versions; those
    files take the per-row-group path, which asks pyarrow.
    """
    text = (created_by or "").lower().replace("parquet-cpp-arrow", "")
    return "parquet-mr" not in text and "parquet-cpp" not in text


def _type_defined_order(body: bytes, columns: int) -> bool:
    """Whether the footer ends with ``column_orders``, every column's TYPE_ORDER (then pyarrow reads min/max_value)."""
    tail = list_header(columns, 12) + b"\x1c\x00\x00" * columns + b"\x00"
    return len(body) > len(tail) and body.endswith(tail) and body[-len(tail) - 1] & 0x0F == 9


def rows(  # noqa: PLR0911 (each return None is a layout the per-row-group path takes)
    raw: bytes,
    md: pq.FileMetaData,
    j: int,
    path: str,
    physical: str,
    delivered: TokenDtype,
    narrowing: bool,
    unsigned: bool,
    size: int,
    levels: tuple[int, int],
) -> NDArray[np.int64] | None:
    """The file's index rows (as :func:`planner.catalog.footer.row_groups` gives them), or None.

    ``raw`` is the footer with its 8-byte tail, ``j`` the token column's leaf and
    ``path`` its dotted path, ``physical`` its physical type, ``delivered`` the batches'
    dtype, ``narrowing`` whether a token may not fit it, ``unsigned`` whether its
    values are unsigned (how pyarrow decodes min/max), ``size`` the file's size and
    ``levels`` the column's (max repetition level, max definition level). None
    where the layout is not certain (the module's docstring): the caller then takes
    the per-row-group path. The histogram check of those chunks is part of it.
    """
    n = md.num_row_groups
    phys = _PHYSICAL.get(physical)
    try:
        created_by = md.created_by
    except ValueError:  # not UTF-8: the per-row-group path says what is damaged
        return None
    if n == 0 or phys is None or not _trusted_writer(created_by):
        return None
    body = raw[:-8]
    parts = [p.encode() for p in path.split(".")]
    anchor = b"\x19" + list_header(len(parts), 8) + b"".join(varint(len(p)) + p for p in parts)
    if body.count(anchor) != n:
        return None
    layout = _certain_layout(body, body.find(anchor) + len(anchor), j == md.num_columns - 1, levels)
    if layout is None:
        return None
    # Every occurrence of the path anchors one match: matches do not overlap and each holds
    # the path right after its prefix, so n matches at n occurrences leave none without one.
    # ColumnChunk.meta_data's header (after file_offset), the type, the encodings: a literal
    # start of four bytes, which the regex engine scans for fastest.
    prefix = b"\x1c\x15" + bytes([phys << 1]) + b"\x19" + _ENCODINGS
    found: list[Any] = _compile(prefix + re.escape(anchor) + layout.pattern()).findall(body)
    if len(found) != n:
        return None
    cols = dict(zip(layout.groups, zip(*found, strict=True) if len(layout.groups) > 1 else [found], strict=True))
    # Every varint field of every row group decoded at once: n of them a field, field after field.
    names = [k for k in layout.groups if k not in _BINARIES]
    try:
        flat = _varints(b"".join([b"".join(cols[k]) for k in names]), n * len(names)).reshape(len(names), n)
    except _Unknown:
        return None
    got = dict(zip(names, flat, strict=True))
    return _rows(md, got, cols, layout, delivered, narrowing, unsigned, phys, size, body)


def _certain_layout(body: bytes, pos: int, last_column: bool, levels: tuple[int, int]) -> _Layout | None:
    """Row group 0's layout (:func:`_learn`) where this module reads it: a null count, histograms of ``levels``."""
    try:
        layout = _learn(body, pos, last_column=last_column)
    except (_Unknown, IndexError):
        return None
    if not layout.has_stats or "null_count" not in layout.groups:
        return None  # counted by reading the chunk: the per-row-group path
    want = (levels[0] + 1, levels[1] + 1)
    rep, dfn = layout.histograms
    if rep not in (None, 0, want[0]) or dfn not in (None, 0, want[1]):
        return None  # the per-row-group path's check names the row group
    return layout


def _rows(
    md: pq.FileMetaData,
    got: dict[str, NDArray[np.int64]],
    cols: dict[str, Any],
    layout: _Layout,
    delivered: TokenDtype,
    narrowing: bool,
    unsigned: bool,
    phys: int,
    size: int,
    body: bytes,
) -> NDArray[np.int64] | None:
    """The index rows from the decoded fields, as arrays (:func:`rows`), or None where one is not certain."""
    n = md.num_row_groups
    if "data_page" not in got or "length" not in got or "num_values" not in got or "codec" not in got:
        return None
    if "num_rows" in got:
        num_rows = got["num_rows"]
    else:  # the token column is not the row group's last: pyarrow's accessor (no chunk touched)
        num_rows = np.fromiter((md.row_group(g).num_rows for g in range(n)), np.int64, n)
    start = got["data_page"]
    if "dictionary" in got:
        d = got["dictionary"]
        start = np.where(d > 0, np.minimum(start, d), start)
    length = got["length"]
    live = num_rows > 0
    if np.any(live & ((start < 4) | (length < 0) | (start + length > size))):
        return None  # the per-row-group path says which chunk lies outside the file
    values, nulls = got["num_values"], got["null_count"]
    tokens = np.where(live, values - nulls, 0)
    empties = np.where(live, nulls, 0)
    if np.any((tokens < 0) | (empties < 0) | (empties > num_rows)):
        return None
    codec = got["codec"]
    if not np.isin(codec, _CODECS).all():
        return None
    check: NDArray[np.bool_] | None = np.zeros(n, bool)
    if narrowing:
        check = _narrowing_check(cols, tokens, body, md.num_columns, phys, unsigned, delivered)
    if check is None:
        return None
    out = np.empty((n, 9), np.int64)
    out[:, 0] = np.arange(n)
    out[:, 1] = num_rows
    out[:, 2] = tokens
    out[:, 3] = empties
    out[:, 4] = start
    out[:, 5] = length
    out[:, 6] = check
    out[:, 7] = codec
    out[:, 8] = values
    return out


def _narrowing_check(
    cols: dict[str, Any],
    tokens: NDArray[np.int64],
    body: bytes,
    columns: int,
    phys: int,
    unsigned: bool,
    delivered: TokenDtype,
) -> NDArray[np.bool_] | None:
    """Which row groups' tokens are checked as they narrow (min/max not within ``delivered``), or None if uncertain."""
    # pyarrow reads min_value/max_value (5, 6) under TYPE_ORDER, else the deprecated
    # min/max (2, 1); a footer whose column orders are not plainly that is not certain.
    if not _type_defined_order(body, columns):
        return None
    if "min_value" not in cols or "max_value" not in cols:
        return tokens > 0  # no min/max for pyarrow: every value is checked
    n = len(tokens)
    width = _WIDTH[phys]
    lo_raw, hi_raw = b"".join(cols["min_value"]), b"".join(cols["max_value"])
    if len(lo_raw) != n * width or len(hi_raw) != n * width:
        return None  # a binary of another width: pyarrow's decode says what it is
    kind = ("<u" if unsigned else "<i") + str(width)
    lo_v, hi_v = np.frombuffer(lo_raw, kind), np.frombuffer(hi_raw, kind)
    a, b = token_range(delivered)
    fits: NDArray[np.bool_] = (lo_v >= lo_v.dtype.type(a)) & (hi_v <= hi_v.dtype.type(b))
    return (tokens > 0) & ~fits
