"""What decoding one column chunk needs, without the file's footer.

A FineWeb-Edu file's footer describes eleven columns in each of its few hundred row
groups (about 1.8 KB a row group); decoding the token column needs a few numbers of
one of them. So the index keeps, per row group, the token column chunk's byte range,
its codec and its value count (``chunk_values``), and per file a :class:`Template`:
the token column's schema elements (their Thrift bytes, copied from the footer as
they are), its physical type and path, and the writer's ``created_by`` (pyarrow
applies writer-specific fixes from it). Files written by one writer share one
template. :func:`footer` writes, from those, the footer of a file that holds only
that column: a Thrift ``FileMetaData`` of a few dozen bytes a row group, which
pyarrow parses in microseconds and decodes the chunk with, exactly as it would with
the real footer (the chunk's bytes are the file's, at the file's offsets).

Example: a file with ``id``, ``text`` and ``input_ids`` (``list<int32>``) keeps the
template of ``input_ids`` (root, ``input_ids``, ``list``, ``element``); the footer
written for row groups 3 and 7 says "row group 0: rows 1,000, one column chunk at
[4,096, 9,000), ZSTD, 251,000 values; row group 1: ...".

The minimal footer sets ``data_page_offset`` to the chunk's first byte (the
dictionary page, where there is one, comes first) and no dictionary offset: the page
reader reads the pages in order from there and knows a dictionary page by its header.
It carries no statistics, no page index and no size statistics, so nothing in it can
make pyarrow abort (:func:`planner.catalog.histograms.check_level_histograms`).

A job index may carry more columns than the token column (``plitzer index DATA --out JOB
--columns a,b``: a predicate's, a length column, aligned columns, a dedupe key): each the
same way, a template a file (:class:`ColumnChunks`, :func:`column_chunks`) and per row
group its chunk's byte range, codec and value count, so a selection pass decodes them
without a footer too (:func:`planner.catalog.footer.column_chunks` reads them off a
footer); and the first file's Arrow schema (:func:`pack_schema`), so the
columns a predicate may name are known without one.

Written by hand (about a hundred lines of Thrift compact protocol): pyarrow cannot
write or prune a footer, and no installed library writes Parquet's Thrift (the
seed's reader did the same in Rust). docs/design.md, "Bytes a row group".
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from numpy.typing import NDArray

from planner.catalog.thrift import Reader, Struct, ThriftError, binary, list_header, zigzag
from planner.errors import DataError

__all__ = [
    "CODECS",
    "ColumnChunks",
    "Template",
    "codec_of",
    "footer",
    "pack_schema",
    "pack_templates",
    "template_of",
    "unpack_schema",
    "unpack_templates",
]

CODECS = {"UNCOMPRESSED": 0, "SNAPPY": 1, "GZIP": 2, "LZO": 3, "BROTLI": 4, "UNKNOWN": 5, "ZSTD": 6, "LZ4": 7}
"""pyarrow's codec names to Thrift's ``CompressionCodec``: pyarrow names LZ4_RAW (7) ``LZ4``
and Hadoop's LZ4 (5), which it reads but has no name for, ``UNKNOWN``."""

_PHYSICAL = {
    "BOOLEAN": 0,
    "INT32": 1,
    "INT64": 2,
    "INT96": 3,
    "FLOAT": 4,
    "DOUBLE": 5,
    "BYTE_ARRAY": 6,
    "FIXED_LEN_BYTE_ARRAY": 7,
}


def codec_of(name: str, where: str) -> int:
    """Thrift's codec number for pyarrow's name of it; a DataError for a codec pyarrow cannot read."""
    got = CODECS.get(name)
    if got is None:
        msg = f"{where}: the column chunk's codec {name!r} is not one pyarrow reads; rewrite the file"
        raise DataError(msg)
    return got


@dataclass(frozen=True, slots=True)
class Template:
    """One column's part of a footer: what every minimal footer of its files repeats.

    ``schema`` is the encoded ``FileMetaData.schema`` list: a root with one child and
    the column's elements as the file's footer has them.
    """

    column: str
    schema: bytes
    physical: int
    path: tuple[str, ...]
    created_by: str

    def key(self) -> bytes:
        """Equal for equal templates (files of one writer share one)."""
        parts = [self.column, self.schema.hex(), str(self.physical), "\x1f".join(self.path), self.created_by]
        return "\x1e".join(parts).encode()

    @classmethod
    def from_key(cls, key: bytes) -> Template:
        column, schema, physical, path, created_by = key.decode().split("\x1e")
        return cls(column, bytes.fromhex(schema), int(physical), tuple(path.split("\x1f")), created_by)


def _schema_elements(raw: bytes) -> list[tuple[bytes, str, int]]:
    """The footer's schema elements: (their Thrift bytes, name, children) in order."""
    r = Reader(raw)
    try:
        for fid, typ in r.fields():
            if fid != 2 or typ != 9:  # FileMetaData.schema; version (1) comes before it
                r.skip(typ, 0)
                continue
            n, _ = r.list_header()
            out = []
            for _ in range(n):
                start = r.pos
                name, children = "", 0
                for efid, etyp in r.fields():
                    if efid == 4 and etyp == 8:
                        size = r.varint()
                        name = raw[r.pos : r.pos + size].decode("utf-8", "replace")
                        r.skip_bytes(size)
                    elif efid == 5 and etyp == 5:
                        z = r.varint()
                        children = (z >> 1) ^ -(z & 1)
                    else:
                        r.skip(etyp, 1)
                out.append((raw[start : r.pos], name, children))
            return out
    except ThriftError as e:
        msg = f"the schema is damaged ({e})"
        raise ValueError(msg) from e
    msg = "no schema"
    raise ValueError(msg)


def template_of(raw: bytes, md: pq.FileMetaData, column: str, where: str) -> Template:
    """The template of ``column`` (a top-level column with one leaf) from the footer bytes ``raw``."""
    try:
        elements = _schema_elements(raw[:-8])
        # Top-level fields follow the root in preorder: skip each one's subtree to the next.
        i, span = 1, None
        while i < len(elements):
            j, pending = i, 1
            while pending:  # a subtree: every element adds its children to what is pending
                if j >= len(elements):
                    msg = "a schema element claims more children than the schema holds"
                    raise ValueError(msg)
                pending += elements[j][2] - 1
                j += 1
            if elements[i][1] == column:
                span = (i, j)
                break
            i = j
        if span is None:
            msg = f"no column {column!r} in the schema"
            raise ValueError(msg)
    except ValueError as e:
        msg = f"{where}: cannot read the schema of column {column!r} ({e}); the footer is damaged"
        raise DataError(msg) from e
    try:
        schema = pq.ParquetSchema(md)  # not md.schema: planner.catalog.footer.schema_of says why
        leaves = [k for k in range(md.num_columns) if schema.column(k).path.split(".")[0] == column]
        leaf = schema.column(leaves[0])
        physical, path, created_by = _PHYSICAL[leaf.physical_type], tuple(leaf.path.split(".")), md.created_by
    except (ValueError, KeyError, IndexError, pa.ArrowException) as e:  # UnicodeDecodeError is a ValueError
        msg = f"{where}: unreadable schema or writer name ({type(e).__name__}); the footer is damaged"
        raise DataError(msg) from e
    root = Struct().field(4, 8, binary(b"schema")).i32(5, 1).done()
    parts = [elements[k][0] for k in range(*span)]
    schema = list_header(len(parts) + 1, 12) + root + b"".join(parts)
    return Template(column=column, schema=schema, physical=physical, path=path, created_by=created_by or "")


def footer(
    t: Template,
    rows: Sequence[int] | NDArray[np.int64],
    offsets: Sequence[int] | NDArray[np.int64],
    lengths: Sequence[int] | NDArray[np.int64],
    codecs: Sequence[int] | NDArray[np.uint8],
    values: Sequence[int] | NDArray[np.int64],
) -> pq.FileMetaData:
    """The parsed footer of a file holding only ``t``'s column, one row group per entry.

    Row group ``i`` of it has ``rows[i]`` rows and the column chunk ``[offsets[i],
    offsets[i] + lengths[i])`` of the real file, compressed with ``codecs[i]``,
    holding ``values[i]`` values (levels). Decode row group ``i`` of it from the real
    file's bytes, as with the real footer.
    """
    path = list_header(len(t.path), 8) + b"".join(binary(p.encode()) for p in t.path)
    encodings = list_header(2, 5) + zigzag(0) + zigzag(3)  # PLAIN, RLE: informative only
    groups = []
    for n, off, length, codec, nv in zip(rows, offsets, lengths, codecs, values, strict=True):
        meta = (
            Struct()
            .i32(1, t.physical)
            .field(2, 9, encodings)
            .field(3, 9, path)
            .i32(4, int(codec))
            .i64(5, int(nv))
            .i64(6, int(length))
            .i64(7, int(length))
            .i64(9, int(off))
            .done()
        )
        chunk = Struct().i64(2, int(off)).field(3, 12, meta).done()
        groups.append(Struct().field(1, 9, list_header(1, 12) + chunk).i64(2, int(length)).i64(3, int(n)).done())
    body = (
        Struct()
        .i32(1, 1)
        .field(2, 9, t.schema)
        .i64(3, int(np.sum(np.asarray(rows, np.int64))) if len(rows) else 0)
        .field(4, 9, list_header(len(groups), 12) + b"".join(groups))
    )
    if t.created_by:  # absent stays absent: pyarrow's writer-specific fixes key on it
        body.field(6, 8, binary(t.created_by.encode()))
    data = body.done()
    return pq.read_metadata(pa.BufferReader(b"PAR1" + data + len(data).to_bytes(4, "little") + b"PAR1"))


def pack_templates(templates: Sequence[Template | None]) -> dict[str, str]:
    """The files' templates as schema metadata (each distinct one once, then one number a file; -1: none)."""
    keys: dict[bytes, int] = {}
    ids = [-1 if t is None else keys.setdefault(t.key(), len(keys)) for t in templates]
    return {
        "templates": json.dumps([k.hex() for k in keys]),
        "file_templates": ",".join(map(str, ids)),
    }


def unpack_templates(meta: Mapping[str, str], files: int) -> list[Template | None]:
    """What :func:`pack_templates` wrote, for ``files`` files; a ValueError where it is not that."""
    distinct = [Template.from_key(bytes.fromhex(k)) for k in json.loads(meta["templates"])]
    text = meta["file_templates"]
    ids = [int(x) for x in text.split(",")] if text else []
    if len(ids) != files:
        msg = f"templates for {len(ids)} files, not {files}"
        raise ValueError(msg)
    return [None if i < 0 else distinct[i] for i in ids]


@dataclass(frozen=True, slots=True)
class ColumnChunks:
    """One carried column's chunks in one file: its template and, per row group, what :func:`footer` needs.

    ``byte_offset[g]``, ``byte_length[g]``, ``codec[g]`` and ``chunk_values[g]`` describe the
    column's chunk in row group ``g`` of the file (the rows are the index's).
    """

    template: Template
    byte_offset: NDArray[np.int64]
    byte_length: NDArray[np.int64]
    codec: NDArray[np.uint8]
    chunk_values: NDArray[np.int64]


def pack_schema(schema: pa.Schema) -> str:
    """An Arrow schema (names and types, no metadata) as text for a job index's metadata."""
    return base64.b64encode(schema.remove_metadata().serialize().to_pybytes()).decode()


def unpack_schema(text: str) -> pa.Schema:
    """What :func:`pack_schema` wrote; a ValueError where it is not that."""
    try:
        return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text.encode(), validate=True)))
    except (pa.ArrowException, ValueError) as e:
        msg = f"a damaged schema ({type(e).__name__})"
        raise ValueError(msg) from e
