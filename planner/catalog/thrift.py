"""The Thrift compact protocol, as far as Parquet footers need it: a bounded reader and a small writer.

:class:`Reader` walks a footer's bytes without building it (every length is checked
against the bytes left, nesting is capped, unknown fields are skipped), for the checks
pyarrow cannot survive without (:mod:`planner.catalog.histograms`) and for the schema a
minimal footer copies (:mod:`planner.catalog.chunkmeta`). :class:`Struct` and the
encoders write the few structures a minimal footer is made of.

Written by hand: pyarrow parses footers but neither walks their bytes nor writes them,
and a Thrift library would be a dependency for a hundred lines (docs/design.md,
"Bytes a row group").
"""

from __future__ import annotations

__all__ = [
    "FieldIter",
    "MAX_DEPTH",
    "Reader",
    "Struct",
    "ThriftError",
    "binary",
    "list_header",
    "skip_value",
    "uvarint",
    "varint",
    "zigzag",
]

MAX_DEPTH = 64


class ThriftError(Exception):
    """Bytes that are not the Thrift they should be (the message says how)."""


class Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def byte(self) -> int:
        if self.pos >= len(self.data):
            msg = "the footer ends inside a field"
            raise ThriftError(msg)
        b = self.data[self.pos]
        self.pos += 1
        return b

    def varint(self) -> int:
        shift = result = 0
        while True:
            b = self.byte()
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                return result
            shift += 7
            if shift > 70:
                msg = "a varint longer than 10 bytes"
                raise ThriftError(msg)

    def skip_bytes(self, n: int) -> None:
        if n < 0 or self.pos + n > len(self.data):
            msg = "a length runs past the footer"
            raise ThriftError(msg)
        self.pos += n

    def list_header(self) -> tuple[int, int]:
        b = self.byte()
        size, typ = b >> 4, b & 0x0F
        if size == 15:
            size = self.varint()
        if size > len(self.data) - self.pos:  # every element takes at least one byte
            msg = "a list longer than the footer"
            raise ThriftError(msg)
        return size, typ

    def skip(self, typ: int, depth: int) -> None:
        if depth > MAX_DEPTH:
            msg = "nesting too deep"
            raise ThriftError(msg)
        if typ in (1, 2):  # bool in a field header: no payload
            return
        if typ == 3:
            self.skip_bytes(1)
        elif typ in (4, 5, 6):
            self.varint()
        elif typ == 7:
            self.skip_bytes(8)
        elif typ == 8:
            self.skip_bytes(self.varint())
        elif typ in (9, 10):
            size, et = self.list_header()
            for _ in range(size):
                if et in (1, 2):
                    self.skip_bytes(1)  # bools in a list are one byte each
                else:
                    self.skip(et, depth + 1)
        elif typ == 11:
            size = self.varint()
            if size:
                kv = self.byte()
                for _ in range(size):
                    self.skip(kv >> 4, depth + 1)
                    self.skip(kv & 0x0F, depth + 1)
        elif typ == 12:
            for _fid, t in self.fields():
                self.skip(t, depth + 1)
        else:
            msg = f"unknown Thrift type {typ}"
            raise ThriftError(msg)

    def fields(self) -> FieldIter:
        return FieldIter(self)


class FieldIter:
    """The fields of one struct: yields (field id, type); the caller reads or skips each."""

    def __init__(self, r: Reader) -> None:
        self.r = r
        self.last = 0

    def __iter__(self) -> FieldIter:
        return self

    def __next__(self) -> tuple[int, int]:
        b = self.r.byte()
        if b == 0:
            raise StopIteration
        delta, typ = b >> 4, b & 0x0F
        if delta:
            fid = self.last + delta
        else:
            z = self.r.varint()
            fid = (z >> 1) ^ -(z & 1)
        self.last = fid
        return fid, typ


# -- writing ---------------------------------------------------------------------------------


def varint(n: int) -> bytes:
    """ULEB128 of a non-negative integer."""
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | 0x80 if n else b)
        if not n:
            return bytes(out)


def zigzag(n: int) -> bytes:
    """A signed integer (i16, i32, i64) as compact Thrift writes it."""
    return varint((n << 1) ^ (n >> 63))


def binary(s: bytes) -> bytes:
    """A string or binary: its length, then its bytes."""
    return varint(len(s)) + s


def list_header(n: int, typ: int) -> bytes:
    """The header of a list of ``n`` elements of Thrift type ``typ``."""
    return bytes([(n << 4) | typ]) if n < 15 else bytes([0xF0 | typ]) + varint(n)


class Struct:
    """A struct written field by field, in increasing id order; :meth:`done` ends it."""

    def __init__(self) -> None:
        self.out = bytearray()
        self.last = 0

    def field(self, fid: int, typ: int, payload: bytes) -> Struct:
        delta = fid - self.last
        self.out += bytes([(delta << 4) | typ]) if 0 < delta <= 15 else bytes([typ]) + zigzag(fid)
        self.out += payload
        self.last = fid
        return self

    def i32(self, fid: int, v: int) -> Struct:
        return self.field(fid, 5, zigzag(v))

    def i64(self, fid: int, v: int) -> Struct:
        return self.field(fid, 6, zigzag(v))

    def done(self) -> bytes:
        return bytes(self.out) + b"\x00"


def uvarint(data: bytes, pos: int) -> tuple[int, int]:
    """The unsigned varint at ``pos`` and the position after it."""
    shift = result = 0
    while True:
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 70:
            msg = "a varint longer than 10 bytes"
            raise ThriftError(msg)


def skip_value(data: bytes, pos: int, typ: int, depth: int = 0) -> int:  # noqa: PLR0911 (a return a Thrift type)
    """The position after a value of Thrift type ``typ`` at ``pos``: :meth:`Reader.skip` without objects.

    The hot loop of a footer's walk (a FineWeb-Edu footer's column chunks hold some 60
    fields each), so functions of local variables: the scalars here, a container's
    elements in its own (:func:`_skip_list`, :func:`_skip_map`, :func:`_skip_struct`).
    Bounded as :class:`Reader` is: a position past the end, nesting past :data:`MAX_DEPTH`
    or an unknown type is a :class:`ThriftError` (a caller checks the final position
    against the length).
    """
    if depth > MAX_DEPTH:
        msg = "nesting too deep"
        raise ThriftError(msg)
    try:
        if typ in (1, 2):
            return pos
        if typ == 3:
            return pos + 1
        if typ in (4, 5, 6):
            while data[pos] & 0x80:
                pos += 1
            return pos + 1
        if typ == 7:
            return pos + 8
        if typ == 8:
            size, pos = uvarint(data, pos)
            if pos + size > len(data):
                msg = "a length runs past the footer"
                raise ThriftError(msg)
            return pos + size
        if typ == 12:
            return _skip_struct(data, pos, depth)
        if typ in (9, 10):
            return _skip_list(data, pos, depth)
        if typ == 11:
            return _skip_map(data, pos, depth)
    except IndexError as e:
        msg = "the footer ends inside a field"
        raise ThriftError(msg) from e
    msg = f"unknown Thrift type {typ}"
    raise ThriftError(msg)


def _skip_struct(data: bytes, pos: int, depth: int) -> int:
    """The position after a struct's fields and its stop byte (an IndexError past the end)."""
    while True:
        b = data[pos]
        pos += 1
        if b == 0:
            return pos
        if not b >> 4:  # a long field header: the id follows
            _, pos = uvarint(data, pos)
        pos = skip_value(data, pos, b & 0x0F, depth + 1)


def _skip_list(data: bytes, pos: int, depth: int) -> int:
    """The position after a list's or set's header and elements (bytes and booleans skipped at once)."""
    b = data[pos]
    pos += 1
    size, et = b >> 4, b & 0x0F
    if size == 15:
        size, pos = uvarint(data, pos)
    if size > len(data) - pos:  # every element takes at least one byte
        msg = "a list longer than the footer"
        raise ThriftError(msg)
    if et in (1, 2, 3):
        return pos + size
    for _ in range(size):
        pos = skip_value(data, pos, et, depth + 1)
    return pos


def _skip_map(data: bytes, pos: int, depth: int) -> int:
    """The position after a map's size, its key and value types, and its pairs."""
    size, pos = uvarint(data, pos)
    if size:
        kv = data[pos]
        pos += 1
        for _ in range(size):
            pos = skip_value(data, pos, kv >> 4, depth + 1)
            pos = skip_value(data, pos, kv & 0x0F, depth + 1)
    return pos
