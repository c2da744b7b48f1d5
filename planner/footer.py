"""Checks on raw footer bytes that pyarrow cannot survive.

pyarrow (26) aborts the whole process, an uncaught C++ exception, when Python
code asks for a column chunk's metadata (``row_group(i).column(j)``) whose level
histograms (``SizeStatistics``) do not match the schema's levels: a damaged
footer, or a schema patched so that a required column holds nulls. So before any
such call, the footer's Thrift (compact protocol) is walked here, in Python, and
a mismatch is a :class:`DataError` naming the file, row group and column.

The walk is generic (it skips every field it does not need), bounded (every
length is checked against the bytes left, nesting is capped) and only reads.
"""

from __future__ import annotations

from collections.abc import Sequence

from planner.errors import DataError

__all__ = ["check_level_histograms"]

_MAX_DEPTH = 64


class _Bad(Exception):
    pass


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def byte(self) -> int:
        if self.pos >= len(self.data):
            msg = "the footer ends inside a field"
            raise _Bad(msg)
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
                raise _Bad(msg)

    def skip_bytes(self, n: int) -> None:
        if n < 0 or self.pos + n > len(self.data):
            msg = "a length runs past the footer"
            raise _Bad(msg)
        self.pos += n

    def list_header(self) -> tuple[int, int]:
        b = self.byte()
        size, typ = b >> 4, b & 0x0F
        if size == 15:
            size = self.varint()
        if size > len(self.data) - self.pos:  # every element takes at least one byte
            msg = "a list longer than the footer"
            raise _Bad(msg)
        return size, typ

    def skip(self, typ: int, depth: int) -> None:
        if depth > _MAX_DEPTH:
            msg = "nesting too deep"
            raise _Bad(msg)
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
            raise _Bad(msg)

    def fields(self) -> _FieldIter:
        return _FieldIter(self)


class _FieldIter:
    """The fields of one struct: yields (field id, type); the caller reads or skips each."""

    def __init__(self, r: _Reader) -> None:
        self.r = r
        self.last = 0

    def __iter__(self) -> _FieldIter:
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


def _histograms(r: _Reader) -> tuple[int | None, int | None]:
    """Lengths of SizeStatistics' repetition (2) and definition (3) level histograms."""
    rep = dfn = None
    for fid, typ in r.fields():
        if fid in (2, 3) and typ == 9:
            size, et = r.list_header()
            for _ in range(size):
                r.skip(et, 1)
            if fid == 2:
                rep = size
            else:
                dfn = size
        else:
            r.skip(typ, 1)
    return rep, dfn


def _column_chunk(r: _Reader) -> tuple[int | None, int | None]:
    found: tuple[int | None, int | None] = (None, None)
    for fid, typ in r.fields():
        if fid == 3 and typ == 12:  # ColumnChunk.meta_data
            for mfid, mtyp in r.fields():
                if mfid == 16 and mtyp == 12:  # ColumnMetaData.size_statistics
                    found = _histograms(r)
                else:
                    r.skip(mtyp, 2)
        else:
            r.skip(typ, 1)
    return found


def check_level_histograms(footer: bytes, levels: Sequence[tuple[int, int]], where: str) -> None:
    """Raise DataError if a column chunk's level histograms do not fit the schema.

    ``footer`` is the Thrift FileMetaData; ``levels[j]`` is leaf column j's
    (max repetition level, max definition level). Histograms, where present and
    not empty, must have one bucket per level (max + 1).
    """
    r = _Reader(footer)
    try:
        for fid, typ in r.fields():
            if fid != 4 or typ != 9:  # FileMetaData.row_groups
                r.skip(typ, 0)
                continue
            n_groups, _ = r.list_header()
            for g in range(n_groups):
                for gfid, gtyp in r.fields():
                    if gfid != 1 or gtyp != 9:  # RowGroup.columns
                        r.skip(gtyp, 1)
                        continue
                    n_cols, _ = r.list_header()
                    for j in range(n_cols):
                        rep, dfn = _column_chunk(r)
                        if j >= len(levels):
                            continue  # pyarrow refuses more chunks than leaves itself
                        want_rep, want_dfn = levels[j][0] + 1, levels[j][1] + 1
                        if rep not in (None, 0, want_rep) or dfn not in (None, 0, want_dfn):
                            msg = (
                                f"{where}, row group {g}, column {j}: the footer's level histograms have "
                                f"{rep} and {dfn} buckets but the schema's levels need {want_rep} and "
                                f"{want_dfn}; the footer or schema is damaged (e.g. a required column "
                                "holding nulls): rewrite the file"
                            )
                            raise DataError(msg)
    except _Bad as e:
        msg = f"{where}: the Parquet footer is damaged ({e}); restore or rewrite the file"
        raise DataError(msg) from e
