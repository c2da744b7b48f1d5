"""The predicate of a selection (``where=``): one expression, checked on DuckDB's own parse tree.

A predicate is one DuckDB SQL boolean expression over a dataset's columns other than
the token column, and nothing else: it is what plitzer asks DuckDB to evaluate over
the columns it hands over, never text spliced into a query. :func:`normalize` parses
``SELECT <where>`` (``json_serialize_sql``, the text exactly as given, unwrapped) and
checks the tree (docs/design.md, "Predicates that are only predicates"):

* one statement, a bare select list of one expression: no ``FROM``, ``WHERE``,
  ``LIMIT``, ``UNION``, alias, comment or ``;`` (so ``score >= 3) or (1=1`` is refused:
  it is not one expression);
* expression nodes of the known harmless kinds only (comparisons, boolean logic,
  constants, column references, casts, ``CASE``, ``BETWEEN``, ``IN`` lists, lambdas,
  function calls): no subquery, no ``*``/``COLUMNS``, no window, no parameter;
* function calls by plain name only, never a table function (``read_text``,
  ``read_csv``, ``read_parquet``, ``glob``, ...), an aggregate, a function that is not
  deterministic (``random``, ``now``, ...), that reads the session (``current_setting``,
  ``getenv``, ...) or a macro that runs a query.

It then writes the expression back as DuckDB prints it, column names spelled as the
dataset spells them, so that spacing and case do not change a selection's identity.
:func:`check_predicate` checks every column it names against the dataset's schema
(a lambda's parameters excepted) and binds it once against an empty table, before
any data is read: a missing column, a type that is not boolean or a syntax error is
a :class:`~planner.errors.SelectionError` that names what is at fault and lists the
columns one may select on. Every connection that evaluates a predicate has DuckDB's
external access off (:func:`connect`): it reads nothing but the Arrow columns it is given.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal

import pyarrow as pa

from planner.catalog.datasetindex import Index
from planner.errors import DataError, SelectionError, one_line

__all__ = [
    "available_columns",
    "check_predicate",
    "check_length_column",
    "connect",
    "missing_column",
    "normalize",
    "predicate_columns",
]

_PREFIX = "SELECT "
_HOW = "write one boolean expression over the dataset's columns, e.g. \"int_score >= 3 and language = 'en'\""
# Expression nodes a predicate may hold (DuckDB's ParsedExpression classes).
_NODES = frozenset(
    {
        "BETWEEN",
        "CASE",
        "CAST",
        "COLLATE",
        "COLUMN_REF",
        "COMPARISON",
        "CONJUNCTION",
        "CONSTANT",
        "FUNCTION",
        "LAMBDA",
        "LAMBDA_REF",
        "OPERATOR",
        "TYPE",  # a cast's target type
    }
)
_NODE_NAMES = {
    "SUBQUERY": "a subquery",
    "STAR": "* or COLUMNS(...)",
    "WINDOW": "a window function (OVER)",
    "PARAMETER": "a prepared-statement parameter",
    "POSITIONAL_REFERENCE": "a positional reference (#n)",
    "DEFAULT": "DEFAULT",
}
# Functions that read the clock, the session or the environment: a predicate must give
# the same rows on every rank and every run, and read nothing but its columns.
_SESSION = frozenset(
    {
        "ago",
        "age",
        "current_catalog",
        "current_connection_id",
        "current_database",
        "current_date",
        "current_localtime",
        "current_localtimestamp",
        "current_query",
        "current_query_id",
        "current_role",
        "current_schema",
        "current_schemas",
        "current_setting",
        "current_time",
        "current_timestamp",
        "current_transaction_id",
        "current_user",
        "get_current_time",
        "get_current_timestamp",
        "getenv",
        "getvariable",
        "in_search_path",
        "now",
        "session_user",
        "today",
        "transaction_timestamp",
        "txid_current",
        "user",
        "version",
    }
)


def connect(**config: Any) -> Any:
    """A DuckDB connection with external access off: it reads only what is registered on it.

    ``enable_external_access = false`` (set at connect, it cannot be turned back on)
    refuses every file, URL and extension; Arrow tables registered on the connection
    are read as usual.
    """
    import duckdb

    return duckdb.connect(config={**config, "enable_external_access": False})


@functools.cache
def _refused_functions() -> dict[str, str]:
    """Function name -> why a predicate may not call it (from ``duckdb_functions()``)."""
    con = connect()
    try:
        rows = con.sql(
            "select lower(function_name), function_type, coalesce(stability, ''), coalesce(has_side_effects, false), "
            "coalesce(macro_definition, '') from duckdb_functions()"
        ).fetchall()
    finally:
        con.close()
    scalar: set[str] = set()
    out: dict[str, str] = {}
    for name, kind, stability, effects, definition in rows:
        if kind in ("scalar", "macro"):
            scalar.add(name)
        if kind in ("table", "table_macro", "pragma"):
            out.setdefault(name, "a table function")
        elif kind == "aggregate":
            out.setdefault(name, "an aggregate")
        elif kind == "window":
            out.setdefault(name, "a window function")
        elif kind == "scalar" and (stability == "VOLATILE" or effects):
            out[name] = "not deterministic"
        elif kind == "macro" and re.search(r"\bselect\b|current_|now\(", str(definition), re.IGNORECASE):
            out[name] = "a macro that runs a query or reads the session"
    for name in list(out):
        # A name that is also a harmless scalar function (DuckDB overloads some) stays callable.
        if name in scalar and out[name] in ("a table function", "an aggregate", "a window function"):
            del out[name]
    for name in _SESSION:
        out[name] = "it reads the clock, the session or the environment"
    return out


def _fail(where: str, what: str) -> SelectionError:
    msg = f"where={where!r} is not a DuckDB SQL expression that plitzer evaluates: {what} is not allowed; {_HOW}"
    return SelectionError(msg, predicate=where)


def _tokens_ok(where: str) -> None:
    """No comment and no statement separator, read off DuckDB's own tokenizer."""
    import duckdb

    for start, kind in duckdb.tokenize(where):
        if kind == duckdb.token_type.comment:
            raise _fail(where, f"a comment (at character {start})")
        if kind == duckdb.token_type.operator and where[start : start + 1] == ";":
            raise _fail(where, "a statement separator ';'")


@functools.lru_cache(maxsize=1024)
def _sql_call(function: Literal["json_serialize_sql", "json_deserialize_sql"], text: str) -> str | None:
    """DuckDB's ``function(text)``: its parser's serializer (``json_serialize_sql``) or printer.

    Cached: the answer depends on the text alone, and a connection costs about 20 ms,
    which a loader paid a few times for every source and every plan it made.
    """
    con = connect()
    try:
        # The text exactly as given after SELECT, not wrapped in anything: whatever is not
        # one expression shows in the tree (a FROM, a second item, a LIMIT...), and an
        # unbalanced parenthesis is a syntax error instead of an escape.
        row = con.execute(f"select {function}($1)", [text]).fetchone()  # one of the two names above
    finally:
        con.close()
    return None if row is None else str(row[0])


def _parse(where: str) -> dict[str, Any]:
    """The checked parse tree of ``SELECT <where>``: one statement, one bare expression."""
    if not isinstance(where, str) or not where.strip():
        msg = f"where={where!r} must be a DuckDB SQL boolean expression, e.g. \"int_score >= 3 and language = 'en'\""
        raise SelectionError(msg, predicate=str(where))
    _tokens_ok(where)
    raw = _sql_call("json_serialize_sql", _PREFIX + where)
    if raw is None:  # pragma: no cover - DuckDB always answers
        raise _fail(where, "an expression DuckDB does not serialize")
    ast: dict[str, Any] = json.loads(raw)  # a fresh tree on every call: callers respell it in place
    if ast.get("error"):
        msg = f"where={where!r} is not a DuckDB SQL expression ({ast.get('error_message', 'syntax error')}); {_HOW}"
        raise SelectionError(msg, predicate=where)
    statements = ast.get("statements") or []
    if len(statements) != 1:
        raise _fail(where, f"{len(statements)} statements")
    node = statements[0].get("node") or {}
    if node.get("type") != "SELECT_NODE":
        raise _fail(where, f"a query ({str(node.get('type', '?')).removesuffix('_NODE').replace('_', ' ')})")
    clauses = (
        ("modifiers", "LIMIT, OFFSET, ORDER BY or DISTINCT"),
        ("group_expressions", "GROUP BY"),
        ("group_sets", "GROUP BY"),
        ("where_clause", "WHERE"),
        ("having", "HAVING"),
        ("qualify", "QUALIFY"),
        ("sample", "USING SAMPLE"),
    )
    for key, name in clauses:
        if node.get(key):
            raise _fail(where, name)
    if (node.get("cte_map") or {}).get("map"):
        raise _fail(where, "WITH")
    if (node.get("from_table") or {}).get("type", "EMPTY") != "EMPTY":
        raise _fail(where, "FROM")
    if node.get("aggregate_handling", "STANDARD_HANDLING") != "STANDARD_HANDLING":
        raise _fail(where, "GROUP BY ALL")
    items = node.get("select_list") or []
    if len(items) != 1:
        raise _fail(where, f"a list of {len(items)} expressions")
    if items[0].get("alias"):
        raise _fail(where, f"an alias (AS {items[0]['alias']})")
    _check_nodes(where, items[0])
    return ast


def _check_nodes(where: str, node: Any) -> None:
    """Every expression node of a kind :data:`_NODES` allows, every function callable."""
    if isinstance(node, list):
        for v in node:
            _check_nodes(where, v)
        return
    if not isinstance(node, dict):
        return
    if "node" in node or "from_table" in node or "subquery" in node:
        raise _fail(where, "a subquery")
    kind = node.get("class")
    if kind is not None:
        if kind not in _NODES:
            raise _fail(where, _NODE_NAMES.get(str(kind), f"an expression of kind {kind}"))
        if kind == "FUNCTION":
            _check_function(where, node)
    for v in node.values():
        _check_nodes(where, v)


def _check_function(where: str, node: Mapping[str, Any]) -> None:
    name = str(node.get("function_name", ""))
    if node.get("schema") or node.get("catalog"):
        qualified = ".".join(p for p in (node.get("catalog"), node.get("schema"), name) if p)
        raise _fail(where, f"a qualified function name ({qualified})")
    if node.get("filter") or (node.get("order_bys") or {}).get("orders") or node.get("distinct"):
        raise _fail(where, f"an aggregate call ({name} with FILTER, ORDER BY or DISTINCT)")
    if node.get("is_operator"):
        return  # +, -, ||, ...: the operators themselves
    why = _refused_functions().get(name.lower())
    if why is not None:
        raise _fail(where, f"{name}() ({why})")


def _expression(ast: Mapping[str, Any]) -> Any:
    return ast["statements"][0]["node"]["select_list"][0]


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
    """``where`` checked, and written back as DuckDB's parser prints it: spacing and keyword case do not change it.

    ``columns`` (the dataset's) respell column names as the dataset does, so
    ``INT_SCORE`` and ``int_score`` are one predicate. Anything but one expression
    (module docstring) is a :class:`SelectionError` naming what is not allowed.

    >>> normalize("int_score>=3 and   language='en'")
    '((int_score >= 3) AND ("language" = \\'en\\'))'
    >>> normalize("INT_SCORE >= 3", ["int_score"])
    '(int_score >= 3)'
    >>> normalize("score >= 3) or (1=1")  # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    planner.errors.SelectionError: where='score >= 3) or (1=1' is not a DuckDB SQL expression (syntax error ...)
    """
    ast = _parse(where)
    if columns:
        _spell(ast, {c.lower(): c for c in columns})
    text = _sql_call("json_deserialize_sql", json.dumps(ast)) or ""
    if not text.startswith(_PREFIX):  # pragma: no cover - DuckDB writes back what it parsed
        raise _fail(where, "an expression DuckDB does not write back")
    out = text[len(_PREFIX) :]
    # What is evaluated is this text, in parentheses: it must parse to the same single expression.
    if not _same_shape(_parse(out), ast):  # pragma: no cover - a DuckDB printing bug
        raise _fail(where, "an expression DuckDB does not write back as it parsed")
    return out


def _same_shape(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether two parse trees hold the same expression, source positions aside."""

    def strip(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: strip(v) for k, v in node.items() if k not in ("query_location", "query_location_length")}
        if isinstance(node, list):
            return [strip(v) for v in node]
        return node

    return bool(strip(_expression(a)) == strip(_expression(b)))


def _references(node: Any, bound: frozenset[str]) -> Iterator[str]:
    """The column names an expression refers to, a lambda's parameters excepted.

    A struct's field counts as its column.
    """
    if isinstance(node, list):
        for v in node:
            yield from _references(v, bound)
        return
    if not isinstance(node, dict):
        return
    kind = node.get("class")
    if kind == "LAMBDA":
        params = {n["column_names"][0].lower() for n in _column_refs(node.get("lhs")) if n.get("column_names")}
        yield from _references(node.get("expr"), bound | params)
        return
    if kind == "COLUMN_REF" and node.get("column_names"):
        names = node["column_names"]
        name = names[1] if names[0] == "t" and len(names) > 1 else names[0]
        if name.lower() not in bound:
            yield name
        return
    for v in node.values():
        yield from _references(v, bound)


def _column_refs(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, list):
        for v in node:
            yield from _column_refs(v)
    elif isinstance(node, dict):
        if node.get("class") == "COLUMN_REF":
            yield node
        for v in node.values():
            yield from _column_refs(v)


def predicate_columns(where: str, available: Sequence[str]) -> list[str]:
    """The columns of ``available`` that ``where`` names (DuckDB matches names case-insensitively)."""
    named = set(_references(_expression(_parse(where)), frozenset()))
    by_lower = {c.lower(): c for c in available}
    return [by_lower[n.lower()] for n in sorted(named) if n.lower() in by_lower]


def _unknown_columns(where: str, available: Sequence[str]) -> list[str]:
    known = {c.lower() for c in available}
    return sorted({n for n in _references(_expression(_parse(where)), frozenset()) if n.lower() not in known})


def missing_column(text: str) -> str | None:
    """The column a DuckDB binder error names ('Referenced column "x" not found'), if any."""
    m = re.search(r'column "([^"]+)" not found', text)
    return m.group(1) if m else None


def _schema(ix: Index) -> pa.Schema:
    """The first file's schema: the job index's where it carries it (``--columns``), else the footer's."""
    try:
        return ix.schema()
    except (pa.ArrowException, ValueError) as e:
        msg = f"{ix.location(0)}: unreadable schema ({one_line(e)}); the footer is damaged"
        raise DataError(msg) from e


def available_columns(ix: Index) -> list[str]:
    """The columns a predicate may name: the first file's, the token column aside."""
    return [n for n in _schema(ix).names if n != ix.column]


def check_length_column(ix: Index, length_column: str, where: str = "") -> None:
    """``length_column`` is an integer column of the first file beside the token column, or a SelectionError."""
    available = available_columns(ix)
    schema = _schema(ix)
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


def check_predicate(ix: Index, where: str, length_column: str | None) -> list[str]:
    """The predicate's columns, checked against the first file's schema (a SelectionError that lists them)."""
    import duckdb

    available = available_columns(ix)
    listed = ", ".join(available)
    schema = _schema(ix)
    if length_column is not None:
        check_length_column(ix, length_column, where)
    unknown = _unknown_columns(where, available)
    if unknown:
        token = [n for n in unknown if n.lower() == ix.column.lower()]
        session = [n for n in unknown if n.lower() in _SESSION]
        if token:
            why = f"the token column {ix.column!r} cannot be selected on"
        elif session:
            raise _fail(where, f"{session[0]} (it reads the clock, the session or the environment)")
        else:
            verb = "is not a column" if len(unknown) == 1 else "are not columns"
            why = f"{', '.join(repr(n) for n in unknown)} {verb}"
        msg = f"where={where!r} does not bind to {ix.source!r}: {why}; available columns: {listed}"
        raise SelectionError(msg, predicate=where, column=unknown[0], available=tuple(available))
    columns = predicate_columns(where, available)
    empty = pa.table({c: pa.array([], schema.field(c).type) for c in available})
    con = connect()
    try:
        con.register("t", empty)
        got = con.sql(f"select ({where}) as keep from t").to_arrow_table()  # noqa: S608  # checked by _parse
    except duckdb.Error as e:
        text = one_line(e)
        hint = ""
        if ix.column.lower() in text.lower():
            hint = f" (the token column {ix.column!r} cannot be selected on)"
        msg = f"where={where!r} does not bind to {ix.source!r}{hint}: {text}; available columns: {listed}"
        raise SelectionError(msg, predicate=where, column=missing_column(text), available=tuple(available)) from e
    finally:
        con.close()
    kind = got.schema.field(0).type
    if not pa.types.is_boolean(kind) and not pa.types.is_null(kind):
        msg = (
            f"where={where!r} is {kind}, not boolean; write a condition over the columns ({listed}), e.g. 'score >= 3'"
        )
        raise SelectionError(msg, predicate=where, available=tuple(available))
    return columns
