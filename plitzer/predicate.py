"""The predicate of a selection (``where=``): parsed, normalized and checked by DuckDB itself.

A predicate is one DuckDB SQL boolean expression over a dataset's columns other than
the token column. :func:`normalize` parses it (``json_serialize_sql``: nothing after
the expression can parse, so no second statement or clause slips in) and writes it
back, column names spelled as the dataset spells them, so that spacing and case do
not change a selection's identity. :func:`predicate_columns` reads the column names
off the same syntax tree (the pass reads only those), and :func:`check_predicate`
binds the predicate against the dataset's schema once, before any data is read: a
missing column, a type that is not boolean or a syntax error is a
:class:`~planner.errors.SelectionError` that lists the columns one may select on.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from planner.dataset import Index
from planner.errors import DataError, SelectionError, one_line

__all__ = ["available_columns", "check_predicate", "missing_column", "normalize", "predicate_columns"]

_WHERE_PREFIX = "SELECT * FROM t WHERE "


def _parse(where: str) -> dict[str, Any]:
    import duckdb

    if not isinstance(where, str) or not where.strip():
        msg = f"where={where!r} must be a DuckDB SQL boolean expression, e.g. \"int_score >= 3 and language = 'en'\""
        raise SelectionError(msg, predicate=str(where))
    con = duckdb.connect()
    try:
        # Parenthesized, so that nothing after the expression (LIMIT, GROUP BY, a second
        # statement) can parse: the predicate is one expression or an error.
        query = f"select * from t where ({where})"  # noqa: S608  # parsed, never run
        raw = con.execute("select json_serialize_sql($1)", [query]).fetchone()
    finally:
        con.close()
    assert raw is not None
    ast: dict[str, Any] = json.loads(raw[0])
    if ast.get("error"):
        msg = (
            f"where={where!r} is not a DuckDB SQL expression ({ast.get('error_message', 'syntax error')}); "
            "write one boolean expression over the dataset's columns"
        )
        raise SelectionError(msg, predicate=where)
    return ast


def _spell(node: Any, by_lower: Mapping[str, str]) -> None:
    """Column names as the dataset spells them (DuckDB matches them case-insensitively)."""
    if isinstance(node, dict):
        if node.get("class") == "COLUMN_REF" and node.get("column_names"):
            node["column_names"] = [by_lower.get(n.lower(), n) for n in node["column_names"]]
        for v in node.values():
            _spell(v, by_lower)
    elif isinstance(node, list):
        for v in node:
            _spell(v, by_lower)


def normalize(where: str, columns: Sequence[str] = ()) -> str:
    """``where`` as DuckDB's parser writes it back: spacing and keyword case do not change it.

    ``columns`` (the dataset's) respell column names as the dataset does, so
    ``INT_SCORE`` and ``int_score`` are one predicate.

    >>> normalize("int_score>=3 and   language='en'")
    '((int_score >= 3) AND ("language" = \\'en\\'))'
    >>> normalize("INT_SCORE >= 3", ["int_score"])
    '(int_score >= 3)'
    """
    import duckdb

    ast = _parse(where)
    if columns:
        _spell(ast, {c.lower(): c for c in columns})
    con = duckdb.connect()
    try:
        row = con.execute("select json_deserialize_sql($1)", [json.dumps(ast)]).fetchone()
    finally:
        con.close()
    assert row is not None
    text = str(row[0])
    if not text.startswith(_WHERE_PREFIX):
        msg = f"where={where!r} is not one boolean expression; write it as a WHERE clause's condition"
        raise SelectionError(msg, predicate=where)
    return text[len(_WHERE_PREFIX) :]


def _referenced(node: Any, out: set[str]) -> set[str]:
    """The column names an expression's syntax tree refers to (a struct's field counts as its column)."""
    if isinstance(node, dict):
        if node.get("class") == "COLUMN_REF" and node.get("column_names"):
            names = node["column_names"]
            out.add(names[1] if names[0] == "t" and len(names) > 1 else names[0])
        for v in node.values():
            _referenced(v, out)
    elif isinstance(node, list):
        for v in node:
            _referenced(v, out)
    return out


def predicate_columns(where: str, available: Sequence[str]) -> list[str]:
    """The columns of ``available`` that ``where`` names (DuckDB matches names case-insensitively)."""
    ast = _parse(where)
    node = ast["statements"][0]["node"]
    named = _referenced(node.get("where_clause"), set())
    by_lower = {c.lower(): c for c in available}
    out = []
    for n in sorted(named):
        if n.lower() not in by_lower:
            continue  # not a column (a lambda's parameter, say): DuckDB's binder decides below
        out.append(by_lower[n.lower()])
    return out


def missing_column(text: str) -> str | None:
    """The column a DuckDB binder error names ('Referenced column "x" not found'), if any."""
    m = re.search(r'column "([^"]+)" not found', text)
    return m.group(1) if m else None


def available_columns(ix: Index) -> list[str]:
    try:
        schema = ix.metadata(0).schema.to_arrow_schema()
    except (pa.ArrowException, ValueError) as e:
        msg = f"{ix.location(0)}: unreadable schema ({one_line(e)}); the footer is damaged"
        raise DataError(msg) from e
    return [n for n in schema.names if n != ix.column]


def check_predicate(ix: Index, where: str, length_column: str | None) -> list[str]:
    """The predicate's columns, checked against the first file's schema (a ConfigError that lists them)."""
    import duckdb

    available = available_columns(ix)
    schema = ix.metadata(0).schema.to_arrow_schema()
    if length_column is not None:
        if length_column == ix.column or length_column not in schema.names:
            msg = (
                f"length_column={length_column!r} is not a column of {ix.source!r} beside the token column "
                f"{ix.column!r}; available columns: {', '.join(available)}"
            )
            raise SelectionError(msg, predicate=where, column=length_column, available=tuple(available))
        if not pa.types.is_integer(schema.field(length_column).type):
            msg = (
                f"length_column={length_column!r} is {schema.field(length_column).type}, not an integer "
                "column of each row's token count"
            )
            raise SelectionError(msg, predicate=where, column=length_column, available=tuple(available))
    columns = predicate_columns(where, available)
    empty = pa.table({c: pa.array([], schema.field(c).type) for c in available})
    con = duckdb.connect()
    try:
        con.register("t", empty)
        got = con.sql(f"select ({where}) as keep from t").to_arrow_table()  # noqa: S608  # as in SelectionPass.mask
    except duckdb.Error as e:
        text = one_line(e)
        hint = ""
        if ix.column.lower() in text.lower():
            hint = f" (the token column {ix.column!r} cannot be selected on)"
        msg = f"where={where!r} does not bind to {ix.source!r}{hint}: {text}; available columns: {', '.join(available)}"
        raise SelectionError(msg, predicate=where, column=missing_column(text), available=tuple(available)) from e
    finally:
        con.close()
    kind = got.schema.field(0).type
    if not pa.types.is_boolean(kind) and not pa.types.is_null(kind):
        msg = (
            f"where={where!r} is {kind}, not boolean; write a condition over the columns "
            f"({', '.join(available)}), e.g. 'score >= 3'"
        )
        raise SelectionError(msg, predicate=where, available=tuple(available))
    return columns
