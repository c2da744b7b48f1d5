"""Selection: train on the rows a DuckDB predicate keeps (``where=``, SPEC section 10).

``Loader(source, where="int_score >= 3 and language = 'en'")`` streams only the rows
for which the predicate is true. Every row group of the index keeps its place in the
order; inside a row group the selected rows keep their storage order, and a row
group whose rows are all left out contributes no tokens and is never read. So the
batches are exactly those of the same dataset with the unselected rows removed and
the row groups otherwise kept. A worked example, one row group of four rows::

    row   score  tokens          where score >= 3
    0     2      [5, 6]          left out
    1     4      [7]             kept: selected row 0
    2     3      []              kept: selected row 1 (an empty document)
    3     1      [8, 9, 10]      left out
    -> rows_selected 2, tokens_selected 1, the stream sees [7], []

Planning needs each row group's selected rows and tokens before the first batch:
the *selection pass* evaluates the predicate per row group, reading only the
columns it names (one ranged read per column chunk, as the token reads) plus each
row's token count, from the token column's list lengths or, with
``length_column=``, from a column that holds it (``token_count`` in FineWeb-Edu),
which avoids decoding the tokens at all. It runs on every core with a progress bar
and caches per chunk of row groups, under ``PLITZER_CACHE``, keyed by (file
identity, token column, normalized predicate, length column), the selected row
numbers and counts: a second run reads no data. planner stays metadata-only: it
takes the counts (:func:`planner.rowgroups.stream_counts`).

At run time a selected index reads the token column chunk of a planned row group
as any index does, then keeps the selected rows with one vectorized ``take``.

Ranks split the pass: rank ``r`` of ``world`` starts at its ``1/world`` of the
chunks and goes on round the rest, skipping each chunk another rank has written to
the cache folder meanwhile (``PLITZER_CACHE`` on a shared file system), so ranks
that start together each do about ``1/world`` of it, and a rank never waits for
another (a job whose ranks start one after the other, or one process that builds
every rank's loader, is no deadlock). ``plitzer.torch`` passes an ``exchange``
(``torch.distributed.all_gather_object``) that shares the parts directly.

The predicate is normalized by DuckDB's own parser (``json_serialize_sql``, then
back to SQL), so spacing and keyword case do not change it; the normalized text and
``length_column`` are part of the fingerprint and of the checkpoint's configuration
(fields ``where`` and ``length_column``), so a checkpoint never resumes under
another selection, and the refusal names both predicates.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from numpy.typing import NDArray

from planner.api import set_selector
from planner.cache import cache_dir, digest, write_atomic
from planner.dataset import Index
from planner.errors import ConfigError, DataError, SelectionError, one_line
from planner.mixture import MixtureIndex
from planner.rowgroups import RowGroupIndex
from planner.sources import SourceSpec
from plitzer.read import decode_chunk, decode_column, list_lengths, read_chunk

__all__ = [
    "CHUNK",
    "Exchange",
    "Part",
    "SelectedIndex",
    "normalize",
    "select_config",
    "select_index",
    "select_on_ray",
    "source_rows",
]

I64 = NDArray[np.int64]
_CACHE_FORMAT = "2"
CHUNK = 16
"""Row groups per cache entry (and per unit of work that ranks split)."""

U8 = NDArray[np.uint8]
Entry = tuple[U8, I64, I64, I64, I64]
"""One chunk of the pass: (each row group's bitmap of kept rows, ``np.packbits``, concatenated;
stored rows, selected rows, selected tokens and selected empty documents per row group)."""

Part = dict[int, Entry]
"""Chunk number -> its entry."""

Exchange = Callable[[Part], list[Part]]
"""Share this rank's part of the pass, get every rank's (``torch.distributed.all_gather_object``)."""

SELECT_DEFAULTS: dict[str, Any] = {"where": "", "length_column": ""}
"""The checkpoint fields of an unselected source."""

_WHERE_PREFIX = "SELECT * FROM t WHERE "

# -- the predicate ----------------------------------------------------------------


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


# -- the selected index -----------------------------------------------------------


@dataclass
class SelectedIndex(Index):
    """An :class:`Index` of the rows ``where`` keeps: counts in ``*_selected``, rows in ``bits``.

    ``frame`` is the dataset's index with ``rows_selected``, ``tokens_selected`` and
    ``empty_docs_selected``; ``bits[rg]`` is row group ``rg``'s bitmap of selected rows
    (``np.packbits``: one bit a row, so a billion rows hold 125 MB, not the 8 GB of row
    numbers); ``fingerprint`` hashes the dataset's, the predicate, the length column and
    the selected counts.
    """

    where: str = ""
    length_column: str | None = None
    base_fingerprint: str = ""
    bits: list[U8] = field(default_factory=list, repr=False)

    @property
    def rows_selected(self) -> int:
        return int(self.frame["rows_selected"].sum())

    def selected_rows(self, row_group: int) -> I64:
        """The selected rows of ``row_group``, ascending (:class:`planner.rowgroups.SelectedRows`)."""
        rows = int(self.frame["rows"][row_group])
        return np.flatnonzero(np.unpackbits(self.bits[row_group], count=rows)).astype(np.int64)

    def read_tokens(self, rg: int) -> pa.Array:
        """Row group ``rg``'s selected documents: the token chunk read and checked, then one ``take``."""
        arr = read_chunk.dispatch(Index)(self, rg)
        if int(self.frame["rows_selected"][rg]) != len(arr):
            arr = arr.take(pa.array(self.selected_rows(rg), pa.int64()))
        want = int(self.frame["tokens_selected"][rg])
        got = arr.offsets[-1].as_py() - arr.offsets[0].as_py() if len(arr) else 0
        if got != want:
            row = self.frame.row(rg, named=True)
            where = self.location(row["file_index"], row["row_group"])
            why = (
                f"length_column={self.length_column!r} does not hold each row's token count: drop length_column="
                if self.length_column
                else f"the file changed since the selection pass: clear {cache_dir() / 'select'} and start again"
            )
            msg = f"{where}: the selected rows hold {got} tokens, but the selection pass counted {want}; {why}"
            raise DataError(msg, file=self.file(row["file_index"]).location, row_group=row["row_group"])
        return arr


@read_chunk.register
def _read_selected_chunk(index: SelectedIndex, rg: int) -> pa.Array:
    return index.read_tokens(rg)


def source_rows(index: RowGroupIndex, rgs: I64, ordinals: I64) -> I64:
    """The row (in its row group) of the ``ordinals``-th document the stream takes from row groups ``rgs``."""
    if isinstance(index, SelectedIndex):
        out = np.empty(len(rgs), np.int64)
        for g in np.unique(rgs).tolist():
            sel = rgs == g
            out[sel] = index.selected_rows(g)[ordinals[sel]]
        return out
    if isinstance(index, MixtureIndex) and any(isinstance(p, SelectedIndex) for p in index.parts):
        out = ordinals.astype(np.int64, copy=True)
        for g in np.unique(rgs).tolist():
            sub, local = index.part(int(g))
            if isinstance(sub, SelectedIndex):
                sel = rgs == g
                out[sel] = sub.selected_rows(local)[ordinals[sel]]
        return out
    return ordinals


def select_config(ix: RowGroupIndex) -> dict[str, Any]:
    """The checkpoint fields of a selection: the normalized predicate and the length column."""
    if isinstance(ix, SelectedIndex):
        return {"where": ix.where, "length_column": ix.length_column or ""}
    if isinstance(ix, MixtureIndex):
        each = [[n, p.where] for n, p in zip(ix.names, ix.parts, strict=True) if isinstance(p, SelectedIndex)]
        lengths = [
            [n, p.length_column]
            for n, p in zip(ix.names, ix.parts, strict=True)
            if isinstance(p, SelectedIndex) and p.length_column
        ]
        return {"where": each or "", "length_column": lengths or ""}
    return dict(SELECT_DEFAULTS)


# -- the pass ---------------------------------------------------------------------


def _leaf_range(md: pq.FileMetaData, g: int, column: str, size: int, where: str) -> tuple[int, int]:
    """The byte range of every leaf column chunk of top-level ``column`` in row group ``g``."""
    lo, hi = None, None
    rgm = md.row_group(g)
    for j in range(md.num_columns):
        path = md.schema.column(j).path
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
        msg = f"{where}: no column {column!r}; every file must have the columns where= names"
        raise SelectionError(msg, predicate="", column=column)
    if rgm.num_rows > 0 and (lo < 4 or hi > size):
        msg = f"{where}: the column chunk of {column!r} [{lo}, {hi}) lies outside the file; the footer is damaged"
        raise DataError(msg)
    return lo, hi - lo


@dataclass(frozen=True)
class _Pass:
    """One selection pass over an index: what to read and how to evaluate it."""

    ix: Index
    where: str  # normalized
    columns: list[str]
    length_column: str | None
    _local: threading.local = field(default_factory=threading.local, repr=False)

    def _column(self, rg: int, column: str) -> pa.Array:
        row = self.ix.frame.row(rg, named=True)
        fi, g = row["file_index"], row["row_group"]
        st = self.ix.file(fi)
        md = self.ix.metadata(fi)
        where = self.ix.location(fi, g)
        start, length = _leaf_range(md, g, column, st.size, where)
        data = self.ix.storage(fi).read_range(st, start, length)
        return decode_column(
            data,
            offset=start,
            file_size=st.size,
            metadata=md,
            row_group=g,
            column=column,
            where=where,
            what=f"{column!r}",
            file=st.location,
        )

    def _lengths(self, rg: int) -> I64:
        """Each row's token count: from the length column, else the token column's list lengths."""
        row = self.ix.frame.row(rg, named=True)
        fi, g = row["file_index"], row["row_group"]
        where = self.ix.location(fi, g)
        if self.length_column is not None:
            arr = self._column(rg, self.length_column)
            if arr.null_count:
                bad = int(np.flatnonzero(arr.is_null().to_numpy(zero_copy_only=False))[0])
                msg = f"{where}, row {bad}: length_column={self.length_column!r} is null; drop length_column="
                raise DataError(msg, file=self.ix.file(fi).location, row_group=g, row=bad)
            lengths: I64 = np.asarray(arr.to_numpy(zero_copy_only=False), dtype=np.int64)
            if int(lengths.sum()) != row["tokens"] or (len(lengths) and int(lengths.min()) < 0):
                msg = (
                    f"{where}: length_column={self.length_column!r} sums to {int(lengths.sum())} tokens, but the "
                    f"token column {self.ix.column!r} holds {row['tokens']}; it does not count each row's tokens: "
                    "drop length_column= (the pass then reads the token column's lengths)"
                )
                raise DataError(msg, file=self.ix.file(fi).location, row_group=g)
            return lengths
        st = self.ix.file(fi)
        data = self.ix.storage(fi).read_range(st, row["byte_offset"], row["byte_length"])
        arr = decode_chunk(
            data,
            offset=row["byte_offset"],
            file_size=st.size,
            metadata=self.ix.metadata(fi),
            row_group=g,
            column=self.ix.column,
            where=where,
            file=st.location,
        )
        return list_lengths(arr)

    def _con(self) -> Any:
        con = getattr(self._local, "con", None)
        if con is None:
            import duckdb

            # One connection per reader thread, one DuckDB thread each: the pass runs
            # row groups in parallel, and a single-threaded projection keeps row order.
            con = duckdb.connect(config={"threads": 1, "preserve_insertion_order": True})
            self._local.con = con
        return con

    def mask(self, table: pa.Table) -> NDArray[np.bool_]:
        """The predicate over ``table``: True where it is true (false and null leave a row out)."""
        import duckdb

        con = self._con()
        con.register("t", table)
        try:
            # The user's own predicate over their own data, parsed and checked by _parse:
            # running it is the point (one expression; no statement can follow it).
            got = con.sql(f"select ({self.where}) as keep from t").to_arrow_table()  # noqa: S608
        except duckdb.Error as e:
            msg = (
                f"where={self.where!r} cannot be evaluated ({one_line(e)}); columns here: "
                f"{', '.join(table.column_names)}"
            )
            raise SelectionError(msg, predicate=self.where, available=tuple(table.column_names)) from e
        finally:
            con.unregister("t")
        col = got.column(0)
        if not pa.types.is_boolean(col.type):
            msg = f"where={self.where!r} is {col.type}, not boolean; write a condition, e.g. 'score >= 3'"
            raise SelectionError(msg, predicate=self.where, available=tuple(table.column_names))
        filled = pc.fill_null(col, False)
        return np.asarray(filled.to_numpy(zero_copy_only=False), dtype=bool)

    def table(self, rg: int, rows: int) -> pa.Table:
        cols = {c: self._column(rg, c) for c in self.columns}
        if not cols:
            cols = {"__plitzer_row": pa.nulls(rows)}
        return pa.table(cols)

    def evaluate(self, rg: int) -> tuple[NDArray[np.bool_], int, int]:
        """Row group ``rg``: which rows are selected, their tokens and their empty documents."""
        rows = int(self.ix.frame["rows"][rg])
        if rows == 0:
            return np.zeros(0, bool), 0, 0
        keep = self.mask(self.table(rg, rows))
        if len(keep) != rows:
            where = self.ix.location(int(self.ix.frame["file_index"][rg]), int(self.ix.frame["row_group"][rg]))
            msg = f"{where}: the predicate gave {len(keep)} values for {rows} rows; the file is damaged"
            raise DataError(msg)
        if not keep.any():
            return keep, 0, 0
        lengths = self._lengths(rg)[keep]
        return keep, int(lengths.sum()), int((lengths == 0).sum())


def _chunks(ix: Index) -> list[tuple[int, int]]:
    """(first row group, end) of every chunk: runs of :data:`CHUNK` row groups of one file."""
    out = []
    fi = ix.frame["file_index"].to_list()
    start = 0
    for i in range(1, len(fi) + 1):
        if i == len(fi) or fi[i] != fi[start] or i - start == CHUNK:
            out.append((start, i))
            start = i
    return out


def _entry_path(ix: Index, chunk: tuple[int, int], where: str, length_column: str | None) -> Path:
    fi = int(ix.frame["file_index"][chunk[0]])
    st = ix.file(fi)
    g0, g1 = int(ix.frame["row_group"][chunk[0]]), int(ix.frame["row_group"][chunk[1] - 1])
    key = digest(_CACHE_FORMAT, st.location, st.size, st.version, ix.column, where, length_column or "", g0, g1)
    return cache_dir() / "select" / f"{key}.npz"


def _load(path: Path, n: int) -> Entry | None:
    try:
        with np.load(io.BytesIO(path.read_bytes()), allow_pickle=False) as z:
            bits = np.asarray(z["bits"], np.uint8)
            rows, counts, tokens, empty = (np.asarray(z[k], np.int64) for k in ("rows", "counts", "tokens", "empty"))
    except (OSError, ValueError, KeyError):
        return None
    if any(len(x) != n for x in (rows, counts, tokens, empty)) or len(bits) != int(((rows + 7) // 8).sum()):
        return None  # stale or damaged: selected again, never trusted
    return bits, rows, counts, tokens, empty


def _save(path: Path, entry: Entry) -> None:
    bits, rows, counts, tokens, empty = entry
    buf = io.BytesIO()
    np.savez(buf, bits=bits, rows=rows, counts=counts, tokens=tokens, empty=empty)
    with contextlib.suppress(OSError):  # a read-only cache folder costs time, not correctness
        write_atomic(path, buf.getvalue())


def _pack(results: Sequence[tuple[NDArray[np.bool_], int, int]]) -> Entry:
    """A chunk's entry from its row groups' masks and counts."""
    bits = [np.packbits(r[0]) for r in results]
    return (
        np.concatenate(bits).astype(np.uint8) if bits else np.zeros(0, np.uint8),
        np.array([len(r[0]) for r in results], np.int64),
        np.array([int(r[0].sum()) for r in results], np.int64),
        np.array([r[1] for r in results], np.int64),
        np.array([r[2] for r in results], np.int64),
    )


def _run(
    p: _Pass,
    chunks: list[tuple[int, int]],
    order: list[int],
    *,
    shared: bool,
    threads: int,
    progress: bool | None,
) -> Part:
    """The entries of ``chunks[order]``: from the cache, else evaluated (and written there).

    ``shared``: other ranks work on the same chunks at the same time, so a chunk is
    looked up again just before each of its row groups is evaluated.
    """
    paths = {c: _entry_path(p.ix, chunks[c], p.where, p.length_column) for c in order}
    done: Part = {}
    for c in order:
        got = _load(paths[c], chunks[c][1] - chunks[c][0])
        if got is not None:
            done[c] = got
    todo = [(c, rg) for c in order if c not in done for rg in range(*chunks[c])]
    if not todo:
        return done
    lock = threading.Lock()

    def work(item: tuple[int, int]) -> tuple[NDArray[np.bool_], int, int] | None:
        c, rg = item
        with lock:
            if c in done:
                return None
        if shared:
            got = _load(paths[c], chunks[c][1] - chunks[c][0])
            if got is not None:
                with lock:
                    done.setdefault(c, got)
                return None
        return p.evaluate(rg)

    from concurrent.futures import ThreadPoolExecutor

    from tqdm import tqdm

    parts: dict[int, list[tuple[NDArray[np.bool_], int, int] | None]] = {}
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="plitzer-select") as pool:
        bar = tqdm(
            pool.map(work, todo),
            total=len(todo),
            desc="selecting rows",
            unit="row group",
            disable=None if progress is None else not progress,
            leave=False,
        )
        for (c, _), got in zip(todo, bar, strict=True):
            parts.setdefault(c, []).append(got)
    for c, results in parts.items():
        if c in done or any(r is None for r in results):
            continue
        entry = _pack([r for r in results if r is not None])
        _save(paths[c], entry)
        done[c] = entry
    missing = [c for c in order if c not in done]
    if missing:  # a chunk another rank was writing while this one skipped part of it
        done.update(_run(p, chunks, missing, shared=False, threads=threads, progress=progress))
    return done


def _missing_column(text: str) -> str | None:
    """The column a DuckDB binder error names ('Referenced column "x" not found'), if any."""
    m = re.search(r'column "([^"]+)" not found', text)
    return m.group(1) if m else None


def _available(ix: Index) -> list[str]:
    try:
        schema = ix.metadata(0).schema.to_arrow_schema()
    except (pa.ArrowException, ValueError) as e:
        msg = f"{ix.location(0)}: unreadable schema ({one_line(e)}); the footer is damaged"
        raise DataError(msg) from e
    return [n for n in schema.names if n != ix.column]


def _check(ix: Index, where: str, length_column: str | None) -> list[str]:
    """The predicate's columns, checked against the first file's schema (a ConfigError that lists them)."""
    import duckdb

    available = _available(ix)
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
        got = con.sql(f"select ({where}) as keep from t").to_arrow_table()  # noqa: S608  # as in _Pass.mask
    except duckdb.Error as e:
        text = one_line(e)
        hint = ""
        if ix.column.lower() in text.lower():
            hint = f" (the token column {ix.column!r} cannot be selected on)"
        msg = f"where={where!r} does not bind to {ix.source!r}{hint}: {text}; available columns: {', '.join(available)}"
        raise SelectionError(msg, predicate=where, column=_missing_column(text), available=tuple(available)) from e
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


def select_index(
    ix: Index,
    where: str,
    *,
    length_column: str | None = None,
    rank: int = 0,
    world: int = 1,
    threads: int | None = None,
    progress: bool | None = None,
    exchange: Exchange | None = None,
) -> SelectedIndex:
    """The index of the rows of ``ix`` for which ``where`` is true (the selection pass, cached).

    Parameters
    ----------
    ix : planner.Index
        The dataset's index (token data; a text source is tokenized first).
    where : str
        A DuckDB SQL boolean expression over the dataset's columns other than the
        token column.
    length_column : str, optional
        An integer column holding each row's token count: the pass then reads it
        instead of decoding the token column (checked against the footer's count).
    rank, world : int
        This rank's share of the pass (see the module's docstring).
    exchange : callable, optional
        Shares this rank's part with every other rank's (``torch.distributed``).

    Examples
    --------
    >>> import plitzer, plitzer.synth, tempfile
    >>> d = tempfile.mkdtemp(); _ = plitzer.synth.write(d, tokens=40_000, seed=1)
    >>> sel = select_index(plitzer.index(d), "score >= 3 and language = 'en'")
    >>> 0 < sel.tokens < plitzer.index(d).tokens
    True
    >>> sel.frame.columns[-3:]
    ['rows_selected', 'tokens_selected', 'empty_docs_selected']
    """
    if isinstance(ix, Index) and type(ix) in (Index, SelectedIndex):
        norm = normalize(where, [*_available(ix), ix.column])
    else:
        norm = normalize(where)
    if isinstance(ix, SelectedIndex):
        if ix.where == norm and ix.length_column == length_column:
            return ix
        msg = (
            f"the index is selected by where={ix.where!r} already; pass the dataset's own index (or its path) "
            f"to select by {norm!r}"
        )
        raise ConfigError(msg)
    if not isinstance(ix, Index) or type(ix) is not Index:
        msg = f"where= needs a dataset of token columns, not a {type(ix).__name__}; tokenize text sources first"
        raise ConfigError(msg)
    columns = _check(ix, norm, length_column)
    p = _Pass(ix=ix, where=norm, columns=columns, length_column=length_column)
    chunks = _chunks(ix)
    n = len(chunks)
    workers = threads or os.cpu_count() or 2
    if exchange is not None and world > 1:
        mine = [c for c in range(n) if c * world // n == rank]
        done: Part = {}
        for part in exchange(_run(p, chunks, mine, shared=False, threads=workers, progress=progress)):
            done.update(part)
        for c, entry in done.items():
            path = _entry_path(ix, chunks[c], norm, length_column)
            if not path.exists():
                _save(path, entry)
    else:
        start = rank * n // world if world > 1 else 0
        order = [(start + i) % n for i in range(n)]
        done = _run(p, chunks, order, shared=world > 1, threads=workers, progress=progress)
    bits: list[U8] = []
    rows_sel, tokens_sel, empty_sel = [], [], []
    for c in range(n):
        b, rows, counts, tokens, empty = done[c]
        offs = np.concatenate([[0], np.cumsum((rows + 7) // 8)])
        bits.extend(b[offs[i] : offs[i + 1]] for i in range(len(counts)))
        rows_sel.extend(counts.tolist())
        tokens_sel.extend(tokens.tolist())
        empty_sel.extend(empty.tolist())
    frame = ix.frame.with_columns(
        pl.Series("rows_selected", rows_sel, pl.Int64),
        pl.Series("tokens_selected", tokens_sel, pl.Int64),
        pl.Series("empty_docs_selected", empty_sel, pl.Int64),
    )
    total = int(sum(tokens_sel))
    if total == 0:
        msg = (
            f"where={norm!r} selects no token of {ix.source!r} ({int(sum(rows_sel))} of {ix.frame['rows'].sum()} "
            f"rows, all empty); loosen it. Available columns: {', '.join(_available(ix))}"
        )
        raise SelectionError(msg, predicate=norm, available=tuple(_available(ix)))
    h = hashlib.sha256()
    h.update(f"{ix.fingerprint}\nwhere\t{norm}\tlength_column={length_column or ''}\n".encode())
    for r, t in zip(rows_sel, tokens_sel, strict=True):
        h.update(f"{r}\t{t}\n".encode())
    return SelectedIndex(
        frame=frame,
        column=ix.column,
        dtype=ix.dtype,
        fingerprint=h.hexdigest(),
        source=ix.source,
        _files=ix._files,
        where=norm,
        length_column=length_column,
        base_fingerprint=ix.fingerprint,
        bits=bits,
    )


def _ray_chunk(
    source: Any,
    column: str,
    storage_options: Mapping[str, Any] | None,
    where: str,
    columns: list[str],
    length_column: str | None,
    first: int,
    end: int,
) -> tuple[int, Entry]:
    """A Ray task: one chunk of the pass, on whichever machine runs it (its own footer cache)."""
    from planner.dataset import index

    p = _Pass(ix=index(source, column=column, storage_options=storage_options), where=where, columns=columns,
              length_column=length_column)  # fmt: skip
    return first, _pack([p.evaluate(rg) for rg in range(first, end)])


def select_on_ray(
    ix: Index,
    where: str,
    *,
    length_column: str | None = None,
    source: Any,
    storage_options: Mapping[str, Any] | None = None,
    address: str | None = None,
    progress: bool | None = True,
) -> int:
    """Run the selection pass of ``ix`` as Ray tasks (one per chunk not cached); returns the chunks run.

    For corpora one machine should not scan alone (``plitzer index DATA --where ...
    --engine ray``). Each task reads its chunk where it runs; the parts come back to
    this process, which writes them into its cache, so a :func:`select_index` that
    follows (or a job whose ranks share this cache folder) finds the whole pass.
    """
    import ray

    norm = normalize(where, [*_available(ix), ix.column])
    columns = _check(ix, norm, length_column)
    chunks = _chunks(ix)
    paths = [_entry_path(ix, c, norm, length_column) for c in chunks]
    todo = [i for i, c in enumerate(chunks) if _load(paths[i], c[1] - c[0]) is None]
    if not todo:
        return 0
    if not ray.is_initialized():
        ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
    task = ray.remote(_ray_chunk)
    by_first = {chunks[i][0]: i for i in todo}
    refs = [
        task.remote(source, ix.column, storage_options, norm, columns, length_column, chunks[i][0], chunks[i][1])
        for i in todo
    ]
    from tqdm import tqdm

    show = None if progress is None else not progress
    with tqdm(total=len(refs), desc="selecting rows (ray)", unit="chunk", disable=show, leave=False) as bar:
        while refs:
            ready, refs = ray.wait(refs, num_returns=1)
            first, entry = ray.get(ready[0])
            _save(paths[by_first[first]], entry)
            bar.update(1)
    return len(todo)


def _select_spec(ix: Index, spec: SourceSpec) -> Index:
    assert spec.where is not None
    return select_index(ix, spec.where, length_column=spec.length_column)


set_selector(_select_spec)
