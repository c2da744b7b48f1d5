"""The level-histogram check: what keeps pyarrow from aborting on a damaged footer.

pyarrow (26) aborts the whole process, an uncaught C++ exception, when Python
code asks for a column chunk's metadata (``row_group(i).column(j)``) whose level
histograms (``SizeStatistics``) do not match the schema's levels: a damaged
footer, or a schema patched so that a required column holds nulls. So before any
such call, :func:`check_level_histograms` walks the footer's Thrift (compact
protocol) in Python, and a mismatch is a :class:`DataError` naming the file, row
group and column. The walk is generic (it skips every field it does not need),
bounded (every length is checked against the bytes left, nesting is capped) and
only reads. :func:`check_column_histograms` checks one column the same way, fast.
:mod:`planner.catalog.footer` runs them before it touches a chunk.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pyarrow.parquet as pq

from planner.catalog.thrift import Reader, ThriftError, list_header, skip_value, uvarint, varint
from planner.errors import DataError

__all__ = ["check_column_histograms", "check_level_histograms"]


def _histograms(r: Reader) -> tuple[int | None, int | None]:
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


def _column_chunk(r: Reader) -> tuple[int | None, int | None]:
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


def _lists(r: Reader, field: int, depth: int) -> Iterator[int]:
    """The length of each list field numbered ``field`` of the struct ``r`` reads (its other fields skipped).

    The caller reads the list's elements before asking for the next: ``r`` goes on from there.
    ``depth``: the struct's nesting, for :meth:`Reader.skip`.
    """
    for fid, typ in r.fields():
        if fid != field or typ != 9:  # 9: a Thrift list
            r.skip(typ, depth)
            continue
        n, _ = r.list_header()
        yield n


def check_level_histograms(footer: bytes, levels: Sequence[tuple[int, int]], where: str) -> None:
    """Raise DataError if a column chunk's level histograms do not fit the schema.

    ``footer`` is the Thrift FileMetaData; ``levels[j]`` is leaf column j's
    (max repetition level, max definition level). Histograms, where present and
    not empty, must have one bucket per level (max + 1).
    """
    r = Reader(footer)
    try:
        for n_groups in _lists(r, 4, 0):  # FileMetaData.row_groups
            for g in range(n_groups):
                for n_cols in _lists(r, 1, 1):  # RowGroup.columns
                    for j in range(n_cols):
                        rep, dfn = _column_chunk(r)
                        if j >= len(levels):
                            continue  # pyarrow refuses more chunks than leaves itself
                        want_rep, want_dfn = levels[j][0] + 1, levels[j][1] + 1
                        if rep not in (None, 0, want_rep) or dfn not in (None, 0, want_dfn):
                            raise _histogram_error(where, g, j, (rep, dfn), (want_rep, want_dfn))
    except ThriftError as e:
        msg = f"{where}: the Parquet footer is damaged ({e}); restore or rewrite the file"
        raise DataError(msg) from e


def _histogram_error(
    where: str, g: int, j: int, got: tuple[int | None, int | None], want: tuple[int, int]
) -> DataError:
    msg = (
        f"{where}, row group {g}, column {j}: the footer's level histograms have "
        f"{got[0]} and {got[1]} buckets but the schema's levels need {want[0]} and "
        f"{want[1]}; the footer or schema is damaged (e.g. a required column "
        "holding nulls): rewrite the file"
    )
    return DataError(msg)


def check_column_histograms(raw: bytes, md: pq.FileMetaData, j: int, where: str) -> None:
    """Raise DataError if leaf column ``j``'s level histograms do not fit the schema, in any row group.

    What :func:`check_level_histograms` checks, for one column: the one whose chunks the
    index reads through pyarrow. Walking every column of every row group in Python costs
    30 times pyarrow's parse of a FineWeb-Edu footer (eleven columns), so the column's
    ``ColumnMetaData`` is found by its encoded path (field 3, right after the encodings:
    every writer writes fields in id order) and only its remaining fields are walked.
    Where the path is not found exactly once a row group (another field order, or a
    statistic's bytes that happen to hold it), the whole footer is walked instead.
    """
    pschema = pq.ParquetSchema(md)  # not md.schema: planner.catalog.footer.schema_of says why
    col = pschema.column(j)
    want = (col.max_repetition_level + 1, col.max_definition_level + 1)
    body = raw[:-8]
    parts = [p.encode() for p in col.path.split(".")]
    pattern = b"\x19" + list_header(len(parts), 8) + b"".join(varint(len(p)) + p for p in parts)
    starts = _find_all(body, pattern)
    if len(starts) != md.num_row_groups:
        levels = [
            (pschema.column(k).max_repetition_level, pschema.column(k).max_definition_level)
            for k in range(md.num_columns)
        ]
        check_level_histograms(body, levels, where)
        return
    try:
        for g, at in enumerate(starts):
            pos, last = at + len(pattern), 3  # the path was field 3 of ColumnMetaData
            got: tuple[int | None, int | None] = (None, None)
            while True:
                b = body[pos]
                pos += 1
                if b == 0:
                    break
                typ, delta = b & 0x0F, b >> 4
                if delta:
                    last += delta
                else:
                    z, pos = uvarint(body, pos)
                    last = (z >> 1) ^ -(z & 1)
                if last == 16 and typ == 12:  # ColumnMetaData.size_statistics
                    got, pos = _size_statistics(body, pos)
                else:
                    pos = skip_value(body, pos, typ, 2)
            if got[0] not in (None, 0, want[0]) or got[1] not in (None, 0, want[1]):
                raise _histogram_error(where, g, j, got, want)
    except IndexError as e:
        msg = f"{where}: the Parquet footer is damaged (the footer ends inside a field); restore or rewrite the file"
        raise DataError(msg) from e
    except ThriftError as e:
        msg = f"{where}: the Parquet footer is damaged ({e}); restore or rewrite the file"
        raise DataError(msg) from e


def _size_statistics(data: bytes, pos: int) -> tuple[tuple[int | None, int | None], int]:
    """SizeStatistics at ``pos``: the lengths of its repetition (2) and definition (3) level histograms."""
    got: list[int | None] = [None, None]
    last = 0
    while True:
        b = data[pos]
        pos += 1
        if b == 0:
            return (got[0], got[1]), pos
        typ = b & 0x0F
        if b >> 4:
            last += b >> 4
        else:
            z, pos = uvarint(data, pos)
            last = (z >> 1) ^ -(z & 1)
        if last in (2, 3) and typ == 9:
            h = data[pos]
            size = h >> 4
            if size == 15:
                size, _ = uvarint(data, pos + 1)
            got[last - 2] = size
        pos = skip_value(data, pos, typ, 3)


def _find_all(data: bytes, pattern: bytes) -> list[int]:
    out, at = [], data.find(pattern)
    while at >= 0:
        out.append(at)
        at = data.find(pattern, at + 1)
    return out
