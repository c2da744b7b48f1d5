"""Parquet files written byte by byte, for layouts no library writes any more.

pyarrow, DuckDB and Polars all write the three-level list layout with a LIST
annotation. Older writers (parquet-mr before 1.8, Hive, early Spark) wrote a token
column as a bare ``repeated int32`` field: a two-level list without annotation,
which readers must still accept. No installed writer produces it, so this module
writes such a file from scratch: a Thrift compact-protocol footer, one PLAIN data
page per row group, RLE levels, no compression. The same writer takes levels as
given, so it also makes files that the Parquet community's ``bad_data`` collects
(repetition levels that start with 1: a row that continues a row before the first).

Only what the tests need: INT32 or INT64 values, a root-level repeated field (two
levels: max repetition 1, max definition 1).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from pathlib import Path

# Thrift compact protocol type ids.
_I32, _I64, _BINARY, _LIST, _STRUCT = 5, 6, 8, 9, 12
# Parquet enums.
_INT32, _INT64 = 1, 2
_REQUIRED, _REPEATED = 0, 2
_PLAIN, _RLE = 0, 3
_DATA_PAGE = 0
_UNCOMPRESSED = 0


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _zigzag(n: int) -> bytes:
    return _varint((n << 1) ^ (n >> 63))


class _Struct:
    """A Thrift struct in compact encoding: fields added in increasing id order."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.last = 0

    def _header(self, fid: int, typ: int) -> None:
        delta = fid - self.last
        assert 0 < delta <= 15
        self.buf.append((delta << 4) | typ)
        self.last = fid

    def i32(self, fid: int, v: int) -> _Struct:
        self._header(fid, _I32)
        self.buf += _zigzag(v)
        return self

    def i64(self, fid: int, v: int) -> _Struct:
        self._header(fid, _I64)
        self.buf += _zigzag(v)
        return self

    def string(self, fid: int, s: str) -> _Struct:
        self._header(fid, _BINARY)
        b = s.encode()
        self.buf += _varint(len(b)) + b
        return self

    def struct(self, fid: int, s: _Struct) -> _Struct:
        self._header(fid, _STRUCT)
        self.buf += s.end()
        return self

    def list(self, fid: int, typ: int, items: Sequence[object]) -> _Struct:
        self._header(fid, _LIST)
        n = len(items)
        self.buf += bytes([(n << 4) | typ]) if n < 15 else bytes([0xF0 | typ]) + _varint(n)
        for it in items:
            if typ == _STRUCT:
                assert isinstance(it, _Struct)
                self.buf += it.end()
            elif typ == _BINARY:
                b = str(it).encode()
                self.buf += _varint(len(b)) + b
            else:
                self.buf += _zigzag(int(it))  # type: ignore[call-overload]
        return self

    def end(self) -> bytes:
        return bytes(self.buf) + b"\x00"


def _rle(levels: Sequence[int]) -> bytes:
    """Levels of bit width 1 as RLE runs, with the 4-byte length prefix of v1 pages."""
    out = bytearray()
    i = 0
    while i < len(levels):
        j = i
        while j < len(levels) and levels[j] == levels[i]:
            j += 1
        out += _varint((j - i) << 1) + bytes([levels[i]])
        i = j
    return struct.pack("<I", len(out)) + bytes(out)


def levels_of(docs: Sequence[Sequence[int]]) -> tuple[list[int], list[int], list[int]]:
    """Repetition levels, definition levels and values of a two-level list column."""
    rep: list[int] = []
    dfn: list[int] = []
    values: list[int] = []
    for d in docs:
        if not d:
            rep.append(0)
            dfn.append(0)
            continue
        for i, v in enumerate(d):
            rep.append(0 if i == 0 else 1)
            dfn.append(1)
            values.append(v)
    return rep, dfn, values


def write_two_level(
    path: Path,
    row_groups: Sequence[Sequence[Sequence[int]]],
    *,
    name: str = "tokens",
    int64: bool = False,
    rep_override: Sequence[Sequence[int] | None] | None = None,
) -> Path:
    """Write ``repeated int32 name`` (no LIST annotation), one page per row group.

    ``rep_override`` replaces a row group's repetition levels (to damage them); the
    footer then still claims the row counts of the documents given.
    """
    fmt = "<q" if int64 else "<i"
    ptype = _INT64 if int64 else _INT32
    body = bytearray(b"PAR1")
    groups = []
    total_rows = 0
    for g, docs in enumerate(row_groups):
        rep, dfn, values = levels_of(docs)
        if rep_override is not None and rep_override[g] is not None:
            rep = list(rep_override[g])  # type: ignore[arg-type]
        data = _rle(rep) + _rle(dfn) + b"".join(struct.pack(fmt, v) for v in values)
        header = (
            _Struct()
            .i32(1, _DATA_PAGE)
            .i32(2, len(data))
            .i32(3, len(data))
            .struct(5, _Struct().i32(1, len(rep)).i32(2, _PLAIN).i32(3, _RLE).i32(4, _RLE))
            .end()
        )
        offset = len(body)
        body += header + data
        size = len(header) + len(data)
        meta = (
            _Struct()
            .i32(1, ptype)
            .list(2, _I32, [_PLAIN, _RLE])
            .list(3, _BINARY, [name])
            .i32(4, _UNCOMPRESSED)
            .i64(5, len(rep))
            .i64(6, size)
            .i64(7, size)
            .i64(9, offset)
        )
        chunk = _Struct().i64(2, offset).struct(3, meta)
        groups.append(_Struct().list(1, _STRUCT, [chunk]).i64(2, size).i64(3, len(docs)))
        total_rows += len(docs)
    schema = [
        _Struct().string(4, "schema").i32(5, 1),
        _Struct().i32(1, ptype).i32(3, _REPEATED).string(4, name),
    ]
    footer = (
        _Struct()
        .i32(1, 1)
        .list(2, _STRUCT, schema)
        .i64(3, total_rows)
        .list(4, _STRUCT, groups)
        .string(6, "plitzer tests handmade_parquet")
        .end()
    )
    body += footer + struct.pack("<I", len(footer)) + b"PAR1"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bytes(body))
    return path
