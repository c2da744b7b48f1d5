"""The token column: which column of a file holds the tokens, and what batches it gives.

A token column is a list or large_list of any integer width (int8..int64,
uint8..uint64). When ``column=`` is omitted it is the one integer-list column
named ``input_ids``, ``tokens`` or ``token_ids``, else the one integer-list
column; anything else is a ConfigError naming the candidates. Batches are int32,
or uint32 when the column is uint32 or uint64; int64 and uint64 data *narrow*,
so their values are checked where the footer's min/max do not prove they fit.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import pyarrow as pa
import pyarrow.parquet as pq

from planner.errors import ConfigError, DataError

__all__ = [
    "TOKEN_NAMES",
    "chunks_range",
    "TokenDtype",
    "delivered_dtype",
    "is_token_type",
    "narrows",
    "token_column_of",
    "token_range",
]

TokenDtype = Literal["int32", "uint32"]

TOKEN_NAMES = ("input_ids", "tokens", "token_ids")
"""Column names preferred, in this order of the schema, when ``column`` is omitted."""

_RANGES = {"int32": (-(2**31), 2**31 - 1), "uint32": (0, 2**32 - 1)}


def is_token_type(t: pa.DataType) -> bool:
    """A list or large_list of any integer width, signed or not."""
    return bool((pa.types.is_list(t) or pa.types.is_large_list(t)) and pa.types.is_integer(t.value_type))


def delivered_dtype(t: pa.DataType) -> TokenDtype:
    """The batch dtype of a token column of type ``t``: uint32 for uint32 and uint64, else int32."""
    return "uint32" if t.value_type in (pa.uint32(), pa.uint64()) else "int32"


def narrows(t: pa.DataType) -> bool:
    """Whether values of a token column of type ``t`` may not fit the batch dtype."""
    return t.value_type in (pa.int64(), pa.uint64())


def token_range(dtype: TokenDtype) -> tuple[int, int]:
    """The smallest and largest token a batch of ``dtype`` holds."""
    return _RANGES[dtype]


def _describe(schema: pa.Schema, names: Sequence[str]) -> str:
    return ", ".join(f"{n} ({schema.field(n).type})" for n in names)


def token_column_of(schema: pa.Schema, column: str | None, where: str) -> tuple[str, pa.DataType]:
    """The token column's name and type in ``schema`` (explicit, or found by the rule).

    When ``column`` is None: the one integer-list column named ``input_ids``,
    ``tokens`` or ``token_ids``; else the one integer-list column. Anything else is
    a ConfigError naming ``where``, the candidates with their types, and ``column=``.
    """
    if column is not None:
        if column not in schema.names:
            msg = (
                f"{where}: token column {column!r} not found; columns are {_describe(schema, schema.names)}; "
                "pass column= with one of them"
            )
            raise ConfigError(msg)
        t = schema.field(column).type
        if not is_token_type(t):
            msg = (
                f"{where}: column {column!r} has type {t}, but a token column must be a list or large_list "
                "of integers (int8..int64, uint8..uint64); pass column= naming the pre-tokenized column, "
                "or re-tokenize"
            )
            raise ConfigError(msg)
        return column, t
    candidates = [f.name for f in schema if is_token_type(f.type)]
    named = [n for n in candidates if n in TOKEN_NAMES]
    if len(named) == 1:
        return named[0], schema.field(named[0]).type
    if len(candidates) == 1:
        return candidates[0], schema.field(candidates[0]).type
    if not candidates:
        msg = (
            f"{where}: no token column: no column is a list of integers (columns: "
            f"{_describe(schema, schema.names)}); pass column= naming the pre-tokenized column"
        )
        raise ConfigError(msg)
    msg = (
        f"{where}: several candidate token columns: {_describe(schema, named or candidates)}; "
        "pass column= with one of them"
    )
    raise ConfigError(msg)


def chunks_range(md: pq.FileMetaData, g: int, column: str, size: int, where: str) -> tuple[int, int] | None:
    """``(offset, length)`` spanning every leaf chunk of top-level ``column`` in row group ``g``; None: no such column.

    One ranged read of that span reads the column (a predicate's, a key's, an aligned
    column's). A span outside the file's ``size`` bytes is a DataError naming ``where``.
    """
    lo, hi = None, None
    rgm = md.row_group(g)
    schema = pq.ParquetSchema(md)  # not md.schema: that one makes a reference cycle (footer.schema_of)
    for j in range(md.num_columns):
        path = schema.column(j).path
        if path != column and not path.startswith(column + "."):
            continue
        cc = rgm.column(j)
        start = cc.data_page_offset
        if cc.has_dictionary_page and cc.dictionary_page_offset is not None and cc.dictionary_page_offset > 0:
            start = min(start, cc.dictionary_page_offset)
        end = start + cc.total_compressed_size
        lo = start if lo is None else min(lo, start)
        hi = end if hi is None else max(hi, end)
    if lo is None or hi is None:
        return None
    if rgm.num_rows > 0 and (lo < 4 or hi > size):
        msg = f"{where}: the column chunk of {column!r} [{lo}, {hi}) lies outside the file; the footer is damaged"
        raise DataError(msg)
    return lo, hi - lo
