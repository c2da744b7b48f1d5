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

import io
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from planner.arraytypes import I64
from planner.catalog.datasetindex import Index
from planner.errors import DataError, SelectionError, one_line
from planner.stores.cache import cache_dir, digest, discard, read_entry, write_entry
from plitzer.readpath.read import list_lengths
from plitzer.readpath.runs import ColumnRun, read_other
from plitzer.selection.predicate import connect

__all__ = [
    "CHUNK",
    "COUNTS",
    "ColumnRun",
    "Entry",
    "Exchange",
    "Part",
    "Result",
    "SelectionPass",
    "chunks_of",
    "entry_path",
    "load_entry",
    "pack_entry",
    "read_other",
    "run_pass",
    "save_entry",
]

U8 = NDArray[np.uint8]
_CACHE_FORMAT = "3"  # 3: entries with a length and checksum (planner.stores.cache)
CHUNK = 16
"""Row groups per cache entry (and per unit of work that ranks split)."""

Entry = tuple[U8, I64]
"""One chunk of the pass: (each row group's bitmap of kept rows, ``np.packbits``, concatenated;
a ``(4, row groups)`` array of the stored rows, selected rows, selected tokens and selected empty
documents of each). Two arrays, not five: a pass over 10^6 row groups keeps 62,500 of them."""

COUNTS = ("rows", "counts", "tokens", "empty")
"""The rows of an entry's counts, and their names in a cache entry."""

Part = dict[int, Entry]
"""Chunk number -> its entry."""

Result = tuple[NDArray[np.bool_], int, int]
"""One row group of the pass: its mask of kept rows, their tokens, their empty documents."""

BATCH_BYTES = 8 << 20
"""The predicate's columns evaluated at once (row groups of one chunk, concatenated): a few MB, so
the query's cost is spread over many rows and a pass over text columns holds little."""

Exchange = Callable[[Part], list[Part]]
"""Share this rank's part of the pass, get every rank's (``torch.distributed.all_gather_object``)."""


Runs = dict[str, ColumnRun]
"""The columns of one run being read, by name (:meth:`SelectionPass.evaluate_many`)."""


@dataclass(frozen=True)
class SelectionPass:
    """One selection pass over an index: what to read and how to evaluate it."""

    ix: Index
    where: str  # normalized
    columns: list[str]
    length_column: str | None
    _local: threading.local = field(default_factory=threading.local, repr=False)

    def runs(self, first: int, end: int) -> Runs:
        """The columns the pass reads of row groups ``[first, end)`` (of one file), one footer parse."""
        names = [*self.columns, self.length_column or self.ix.column]
        return {c: ColumnRun(self.ix, first, end, c, names) for c in dict.fromkeys(names)}

    def _column(self, rg: int, column: str, runs: Runs | None = None) -> pa.Array:
        arr = (self.runs(rg, rg + 1) if runs is None else runs)[column].read(rg)
        if arr is None:
            where = self.ix.location(int(self.ix.frame["file_index"][rg]), int(self.ix.frame["row_group"][rg]))
            msg = f"{where}: no column {column!r}; every file must have the columns where= names"
            raise SelectionError(msg, predicate=self.where, column=column)
        return arr

    def lengths(self, rg: int, runs: Runs | None = None) -> I64:
        """Each row's token count: from the length column, else the token column's list lengths."""
        row = self.ix.frame.row(rg, named=True)
        fi, g = row["file_index"], row["row_group"]
        where = self.ix.location(fi, g)
        if self.length_column is not None:
            arr = self._column(rg, self.length_column, runs)
            if arr.null_count:
                bad = int(np.flatnonzero(arr.is_null().to_numpy(zero_copy_only=False))[0])
                msg = f"{where}, row {bad}: length_column={self.length_column!r} is null; drop length_column="
                raise DataError(msg, file=self.ix.file(fi).location, row_group=g, row=bad)
            lengths: I64 = np.asarray(arr.to_numpy(zero_copy_only=False), dtype=np.int64)
            if len(lengths) and int(lengths.min()) < 0:
                bad = int(np.flatnonzero(lengths < 0)[0])
                msg = (
                    f"{where}, row {bad}: length_column={self.length_column!r} is {int(lengths[bad])}, not a count "
                    "of tokens: drop length_column= (the pass then reads the token column's lengths)"
                )
                raise DataError(msg, file=self.ix.file(fi).location, row_group=g, row=bad)
            if int(lengths.sum()) != row["tokens"]:
                msg = (
                    f"{where}: length_column={self.length_column!r} sums to {int(lengths.sum())} tokens, but the "
                    f"token column {self.ix.column!r} holds {row['tokens']}; it does not count each row's tokens: "
                    "drop length_column= (the pass then reads the token column's lengths)"
                )
                raise DataError(msg, file=self.ix.file(fi).location, row_group=g)
            return lengths
        tokens = (self.runs(rg, rg + 1) if runs is None else runs)[self.ix.column].read(rg)
        assert tokens is not None  # the index's own column
        return list_lengths(tokens)

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

    def table(self, rg: int, rows: int, runs: Runs | None = None) -> pa.Table:
        """The predicate's columns of row group ``rg`` (``runs``: read through its run's footers)."""
        runs = self.runs(rg, rg + 1) if runs is None and self.columns else runs
        cols = {c: self._column(rg, c, runs) for c in self.columns}
        if not cols:
            cols = {"__plitzer_row": pa.nulls(rows)}
        return pa.table(cols)

    def evaluate(self, rg: int) -> Result:
        """Row group ``rg``: which rows are selected, their tokens and their empty documents."""
        return self.evaluate_many(range(rg, rg + 1))[0]

    def evaluate_many(self, rgs: range) -> list[Result]:
        """:meth:`evaluate` of each of ``rgs`` (row groups of one file), the predicate run once a batch.

        The row groups' columns are concatenated until they hold :data:`BATCH_BYTES`, and
        DuckDB evaluates the predicate once over them: a query costs about a millisecond
        whatever its rows, so one a row group was most of the pass on small row groups.
        """
        frame_rows = self.ix.frame["rows"].slice(rgs.start, len(rgs)).to_numpy()
        runs = self.runs(rgs.start, rgs.stop)
        masks: list[NDArray[np.bool_]] = [np.zeros(0, bool)] * len(rgs)
        batch: list[tuple[int, pa.Table]] = []
        held = 0

        def flush() -> None:
            nonlocal held
            if not batch:
                return
            tables = [t for _, t in batch]
            keep = self.mask(tables[0] if len(tables) == 1 else pa.concat_tables(tables))
            want = sum(t.num_rows for t in tables)
            if len(keep) != want:
                rg = rgs.start + batch[0][0]
                where = self.ix.location(int(self.ix.frame["file_index"][rg]), int(self.ix.frame["row_group"][rg]))
                msg = f"{where}: the predicate gave {len(keep)} values for {want} rows; the file is damaged"
                raise DataError(msg)
            at = 0
            for i, t in batch:
                masks[i] = keep[at : at + t.num_rows]
                at += t.num_rows
            batch.clear()
            held = 0

        for i, rows in enumerate(frame_rows.tolist()):
            if rows == 0:
                continue
            t = self.table(rgs.start + i, rows, runs)
            if t.num_rows != rows:
                rg = rgs.start + i
                where = self.ix.location(int(self.ix.frame["file_index"][rg]), int(self.ix.frame["row_group"][rg]))
                msg = f"{where}: the predicate's columns hold {t.num_rows} rows, the index {rows}; the file is damaged"
                raise DataError(msg)
            batch.append((i, t))
            held += t.nbytes
            if held >= BATCH_BYTES:
                flush()
        flush()
        out: list[Result] = []
        for i, keep in enumerate(masks):
            if not keep.any():
                out.append((keep, 0, 0))
                continue
            lengths = self.lengths(rgs.start + i, runs)[keep]
            out.append((keep, int(lengths.sum()), int((lengths == 0).sum())))
        return out


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
            counts = np.stack([np.asarray(z[k], np.int64) for k in COUNTS])
    except (OSError, ValueError, KeyError) as e:
        discard(path, f"unreadable: {type(e).__name__}")
        return None
    if counts.shape[1] != n or len(bits) != int(((counts[0] + 7) // 8).sum()):
        return None  # stale or damaged: selected again, never trusted
    return bits, counts


def save_entry(path: Path, entry: Entry) -> None:
    bits, counts = entry
    buf = io.BytesIO()
    np.savez(buf, bits=bits, **dict(zip(COUNTS, counts, strict=True)))
    write_entry(path, buf.getvalue())  # a folder that cannot be written costs time, not correctness


def pack_entry(results: Sequence[Result]) -> Entry:
    """A chunk's entry from its row groups' masks and counts."""
    bits = [np.packbits(r[0]) for r in results]
    counts = np.array([[len(r[0]), int(r[0].sum()), r[1], r[2]] for r in results], np.int64).reshape(-1, 4)
    return (np.concatenate(bits).astype(np.uint8) if bits else np.zeros(0, np.uint8), np.ascontiguousarray(counts.T))


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
    looked up again just before it is evaluated.
    """
    done: Part = {}
    for c in order:
        got = load_entry(_path(p, chunks[c]), chunks[c][1] - chunks[c][0])
        if got is not None:
            done[c] = got
    todo = [c for c in order if c not in done]
    if todo:
        _evaluate(p, chunks, todo, done, shared=shared, threads=threads, progress=progress)
    return done


def _path(p: SelectionPass, chunk: tuple[int, int]) -> Path:
    """A chunk's cache entry (made when needed: a dict of every chunk's was ~20 B a row group)."""
    return entry_path(p.ix, chunk, p.where, p.length_column)


def _evaluate(
    p: SelectionPass,
    chunks: list[tuple[int, int]],
    todo: list[int],
    done: Part,
    *,
    shared: bool,
    threads: int,
    progress: bool | None,
) -> None:
    """Evaluate the chunks ``todo`` in a pool of ``threads``, each entry saved and put in ``done`` as it ends."""
    # Streamed, bytes a row group (docs/design.md, "Bytes a row group"): the pool takes the
    # chunks as they come and each chunk is packed (its row groups' masks let go) as soon as
    # it is in, not after the whole pass; a chunk is the unit of work, so the predicate runs
    # once over its row groups (SelectionPass.evaluate_many), not once a row group.
    lock = threading.Lock()

    def work(c: int) -> tuple[int, list[Result] | None]:
        n = chunks[c][1] - chunks[c][0]
        with lock:
            if c in done:
                return c, None
        if shared:
            got = load_entry(_path(p, chunks[c]), n)
            if got is not None:
                with lock:
                    done.setdefault(c, got)
                return c, None
        return c, p.evaluate_many(range(*chunks[c]))

    from concurrent.futures import ThreadPoolExecutor

    from tqdm import tqdm

    from planner.progress import progress_enabled
    from planner.threads import map_ahead

    total = sum(chunks[c][1] - chunks[c][0] for c in todo)
    with (
        ThreadPoolExecutor(max_workers=threads, thread_name_prefix="plitzer-select") as pool,
        tqdm(
            total=total,
            desc="selecting rows",
            unit="row group",
            disable=not progress_enabled(progress, total),
            leave=False,
        ) as bar,
    ):
        for c, results in map_ahead(pool, work, todo):
            if results is not None:
                # Packed here, not in the reader threads: what the pass keeps is then allocated
                # apart from the threads' transient buffers, whose memory goes back when freed.
                entry = pack_entry(results)
                save_entry(_path(p, chunks[c]), entry)
                with lock:
                    done[c] = entry
            bar.update(chunks[c][1] - chunks[c][0])
