"""The selection pass: which rows of each row group a predicate keeps, and their tokens (cached).

Per row group, :class:`SelectionPass` reads only the column chunks the predicate names
(one ranged read each, through :func:`plitzer.readpath.read.read_decoded`) and each row's
token count (the token column's list lengths, or a ``length_column``), and evaluates
the predicate in DuckDB. :func:`run_pass` runs row groups on every core with a progress
bar and caches one entry per chunk of :data:`CHUNK` row groups of a file under
``PLITZER_CACHE`` (a bitmap of the kept rows and the counts), keyed by file identity,
token column, normalized predicate and length column; with other ranks at work on the
same chunks (``shared``) it looks each chunk up again just before evaluating it.
:mod:`plitzer.selection.select` builds the selected index from the entries.
"""

from __future__ import annotations

import contextlib
import io
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from planner.catalog.dataset import Index
from planner.errors import DataError, SelectionError, one_line
from planner.stores.cache import cache_dir, digest, discard, read_entry, write_entry
from plitzer.readpath.read import list_lengths, read_column, read_decoded
from plitzer.selection.predicate import connect

__all__ = [
    "CHUNK",
    "Entry",
    "Exchange",
    "Part",
    "SelectionPass",
    "chunks_of",
    "entry_path",
    "load_entry",
    "pack_entry",
    "read_other",
    "run_pass",
    "save_entry",
]

I64 = NDArray[np.int64]
U8 = NDArray[np.uint8]
_CACHE_FORMAT = "3"  # 3: entries with a length and checksum (planner.stores.cache)
CHUNK = 16
"""Row groups per cache entry (and per unit of work that ranks split)."""

Entry = tuple[U8, I64, I64, I64, I64]
"""One chunk of the pass: (each row group's bitmap of kept rows, ``np.packbits``, concatenated;
stored rows, selected rows, selected tokens and selected empty documents per row group)."""

Part = dict[int, Entry]
"""Chunk number -> its entry."""

Exchange = Callable[[Part], list[Part]]
"""Share this rank's part of the pass, get every rank's (``torch.distributed.all_gather_object``)."""


def read_other(ix: Index, rg: int, column: str) -> pa.Array | None:
    """Row group ``rg``'s ``column`` (every stored row), one ranged read; None where its file has no such column.

    Decoded through the job index alone where it carries the column (``plitzer index DATA
    --out JOB --columns ...``), else through the file's footer (read once, kept). A minimal
    footer holds no Arrow schema, so a type Arrow would have restored from it (a large
    string, a time zone) is cast to the first file's, as the real footer gives it.
    """
    got = ix.column_chunk(rg, column)
    if got is None:
        return None
    fi, g = int(ix.frame["file_index"][rg]), int(ix.frame["row_group"][rg])
    st = ix.file(fi)
    arr = read_decoded(
        ix.storage(fi),
        st,
        got.metadata,
        row_group=g,
        column=column,
        offset=got.offset,
        length=got.length,
        where=ix.location(fi, g),
        what=repr(column),
    )
    if got.carried:
        schema = ix.schema()
        k = schema.get_field_index(column)
        if k >= 0 and arr.type != schema.field(k).type:
            with contextlib.suppress(pa.ArrowException):  # another file's own type: kept as decoded
                arr = arr.cast(schema.field(k).type)
    return arr


@dataclass(frozen=True)
class SelectionPass:
    """One selection pass over an index: what to read and how to evaluate it."""

    ix: Index
    where: str  # normalized
    columns: list[str]
    length_column: str | None
    _local: threading.local = field(default_factory=threading.local, repr=False)

    def _column(self, rg: int, column: str) -> pa.Array:
        arr = read_other(self.ix, rg, column)
        if arr is None:
            where = self.ix.location(int(self.ix.frame["file_index"][rg]), int(self.ix.frame["row_group"][rg]))
            msg = f"{where}: no column {column!r}; every file must have the columns where= names"
            raise SelectionError(msg, predicate=self.where, column=column)
        return arr

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
        arr, _, _ = read_column(self.ix, rg)
        return list_lengths(arr)

    def _con(self) -> Any:
        con = getattr(self._local, "con", None)
        if con is None:
            # One connection per reader thread, one DuckDB thread each: the pass runs
            # row groups in parallel, and a single-threaded projection keeps row order.
            # External access off: the predicate reads the columns handed over, nothing else.
            con = connect(threads=1, preserve_insertion_order=True)
            self._local.con = con
        return con

    def mask(self, table: pa.Table) -> NDArray[np.bool_]:
        """The predicate over ``table``: True where it is true (false and null leave a row out)."""
        import duckdb

        con = self._con()
        con.register("t", table)
        try:
            # The predicate as plitzer.selection.predicate.normalize checked and wrote it back: one
            # expression over the registered columns, on a connection without external access.
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


def chunks_of(ix: Index) -> list[tuple[int, int]]:
    """(first row group, end) of every chunk: runs of :data:`CHUNK` row groups of one file."""
    out = []
    fi = ix.frame["file_index"].to_list()
    start = 0
    for i in range(1, len(fi) + 1):
        if i == len(fi) or fi[i] != fi[start] or i - start == CHUNK:
            out.append((start, i))
            start = i
    return out


def entry_path(ix: Index, chunk: tuple[int, int], where: str, length_column: str | None) -> Path:
    fi = int(ix.frame["file_index"][chunk[0]])
    st = ix.file(fi)
    g0, g1 = int(ix.frame["row_group"][chunk[0]]), int(ix.frame["row_group"][chunk[1] - 1])
    key = digest(_CACHE_FORMAT, st.location, st.size, st.version, ix.column, where, length_column or "", g0, g1)
    return cache_dir() / "select" / f"{key}.npz"


def load_entry(path: Path, n: int) -> Entry | None:
    raw = read_entry(path)
    if raw is None:
        return None
    try:
        with np.load(io.BytesIO(raw), allow_pickle=False) as z:
            bits = np.asarray(z["bits"], np.uint8)
            rows, counts, tokens, empty = (np.asarray(z[k], np.int64) for k in ("rows", "counts", "tokens", "empty"))
    except (OSError, ValueError, KeyError) as e:
        discard(path, f"unreadable: {type(e).__name__}")
        return None
    if any(len(x) != n for x in (rows, counts, tokens, empty)) or len(bits) != int(((rows + 7) // 8).sum()):
        return None  # stale or damaged: selected again, never trusted
    return bits, rows, counts, tokens, empty


def save_entry(path: Path, entry: Entry) -> None:
    bits, rows, counts, tokens, empty = entry
    buf = io.BytesIO()
    np.savez(buf, bits=bits, rows=rows, counts=counts, tokens=tokens, empty=empty)
    write_entry(path, buf.getvalue())  # a folder that cannot be written costs time, not correctness


def pack_entry(results: Sequence[tuple[NDArray[np.bool_], int, int]]) -> Entry:
    """A chunk's entry from its row groups' masks and counts."""
    bits = [np.packbits(r[0]) for r in results]
    return (
        np.concatenate(bits).astype(np.uint8) if bits else np.zeros(0, np.uint8),
        np.array([len(r[0]) for r in results], np.int64),
        np.array([int(r[0].sum()) for r in results], np.int64),
        np.array([r[1] for r in results], np.int64),
        np.array([r[2] for r in results], np.int64),
    )


def run_pass(
    p: SelectionPass,
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
    paths = {c: entry_path(p.ix, chunks[c], p.where, p.length_column) for c in order}
    done: Part = {}
    for c in order:
        got = load_entry(paths[c], chunks[c][1] - chunks[c][0])
        if got is not None:
            done[c] = got
    # Streamed, bytes a row group (docs/design.md, "Bytes a row group"): the row groups to
    # evaluate are generated as the pool takes them, and a chunk is packed (and its row
    # groups' masks let go) as soon as its last row group is in, not after the whole pass:
    # a list of every row group and every row group's result tuple were ~1 KB a row group.
    size = {c: chunks[c][1] - chunks[c][0] for c in order if c not in done}
    if not size:
        return done
    lock = threading.Lock()

    def todo() -> Iterator[tuple[int, int]]:
        for c in size:
            for rg in range(*chunks[c]):
                yield c, rg

    def work(item: tuple[int, int]) -> tuple[int, tuple[NDArray[np.bool_], int, int] | None]:
        c, rg = item
        with lock:
            if c in done:
                return c, None
        if shared:
            got = load_entry(paths[c], size[c])
            if got is not None:
                with lock:
                    done.setdefault(c, got)
                return c, None
        return c, p.evaluate(rg)

    from concurrent.futures import ThreadPoolExecutor

    from tqdm import tqdm

    from planner.progress import progress_enabled
    from planner.threads import map_ahead

    total = sum(size.values())
    parts: dict[int, list[tuple[NDArray[np.bool_], int, int] | None]] = {}
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="plitzer-select") as pool:
        bar = tqdm(
            map_ahead(pool, work, todo()),
            total=total,
            desc="selecting rows",
            unit="row group",
            disable=not progress_enabled(progress, total),
            leave=False,
        )
        for c, got in bar:  # in order: a chunk's row groups arrive together
            results = parts.setdefault(c, [])
            results.append(got)
            if len(results) < size[c]:
                continue
            del parts[c]
            if c in done or any(r is None for r in results):
                continue
            entry = pack_entry([r for r in results if r is not None])
            save_entry(paths[c], entry)
            done[c] = entry
    missing = [c for c in order if c not in done]
    if missing:  # a chunk another rank was writing while this one skipped part of it
        done.update(run_pass(p, chunks, missing, shared=False, threads=threads, progress=progress))
    return done
