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
takes the counts (:func:`planner.catalog.rowgroups.stream_counts`).

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

import hashlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import polars as pl
import pyarrow as pa
from numpy.typing import NDArray

from planner.arraytypes import I64
from planner.catalog.datasetindex import Index
from planner.catalog.rowgroups import PARQUET, Capabilities, RowGroupIndex
from planner.errors import ConfigError, DataError, SelectionError
from planner.mixing.sources import SourceSpec
from planner.parameters import Selection
from planner.stores.cache import cache_dir
from plitzer.readpath.rayrun import run_tasks
from plitzer.readpath.read import parquet_tokens
from plitzer.selection.evaluate import (
    CHUNK,
    Entry,
    Exchange,
    Part,
    SelectionPass,
    chunks_of,
    entry_path,
    load_entry,
    pack_entry,
    run_pass,
    save_entry,
)
from plitzer.selection.predicate import available_columns, check_predicate, normalize
from plitzer.selection.rowbits import RowBits

__all__ = [
    "CHUNK",
    "kept_rows",
    "Exchange",
    "Part",
    "SelectedIndex",
    "normalize",
    "select_config",
    "select_index",
    "select_on_ray",
    "select_spec",
    "source_rows",
]

U8 = NDArray[np.uint8]

SELECT_DEFAULTS: dict[str, Any] = {"where": "", "length_column": ""}
"""The checkpoint fields of an unselected source."""

# -- the selected index -----------------------------------------------------------


SELECTION = Capabilities("selection", selectable=False, other_columns=True, column_runs=True)
"""A selection of a dataset's rows (Parquet or Arrow IPC): its passes read the dataset's columns, through the
files' footers or their own reader (:class:`plitzer.readpath.runs.ColumnRun`); a new where= is refused."""


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
    bits: RowBits = field(default_factory=lambda: RowBits.of([]), repr=False)

    @property
    def capabilities(self) -> Capabilities:
        return SELECTION

    def config_fields(self) -> dict[str, Any]:
        """The checkpoint fields of a selection: the normalized predicate and the length column."""
        return {"where": self.where, "length_column": self.length_column or ""}

    def length_source(self, given: str | None) -> str | None:
        """The selection's own length column: its pass read the lengths from there (or from the tokens)."""
        return self.length_column

    @property
    def rows_selected(self) -> int:
        return int(self.frame["rows_selected"].sum())

    def selected_rows(self, row_group: int) -> I64:
        """The selected rows of ``row_group``, ascending (:class:`planner.catalog.rowgroups.SelectedRows`)."""
        return self.bits.rows(row_group, int(self.frame["rows"][row_group]))

    def read_tokens(self, rg: int) -> pa.Array:
        """Row group ``rg``'s selected documents: the token chunk read and checked, then one ``take``."""
        arr = parquet_tokens(self, rg)
        return kept_rows(self, rg, arr, self.selected_rows, self.length_column, ("selected", "selection", "select"))


def kept_rows(
    ix: Index, rg: int, arr: pa.Array, rows: Callable[[int], I64], length_column: str | None, names: tuple[str, ...]
) -> pa.Array:
    """The rows a pass kept of row group ``rg``'s token chunk ``arr`` (``rows``: their positions in it), checked
    against the pass's count of their tokens (``ix.frame``'s ``tokens_selected``).

    A mismatch names the length column the pass counted with, else the pass's cache to clear.
    ``names``: how the message calls the rows, the pass and its cache folder.
    """
    if int(ix.frame["rows_selected"][rg]) != len(arr):
        arr = arr.take(pa.array(rows(rg), pa.int64()))
    want = int(ix.frame["tokens_selected"][rg])
    got = arr.offsets[-1].as_py() - arr.offsets[0].as_py() if len(arr) else 0
    if got != want:
        rows_are, the_pass, folder = names
        row = ix.frame.row(rg, named=True)
        where = ix.location(row["file_index"], row["row_group"])
        why = (
            f"length_column={length_column!r} does not hold each row's token count: drop length_column="
            if length_column
            else f"the file changed since the {the_pass} pass: clear {cache_dir() / folder} and start again"
        )
        msg = f"{where}: the {rows_are} rows hold {got} tokens, but the {the_pass} pass counted {want}; {why}"
        raise DataError(msg, file=ix.file(row["file_index"]).location, row_group=row["row_group"])
    return arr


def source_rows(index: RowGroupIndex, rgs: I64, ordinals: I64) -> I64:
    """The row (in its row group) of the ``ordinals``-th document the stream takes from row groups ``rgs``."""
    if "tokens_selected" not in index.frame.columns:  # nothing selected: the ordinal is the row
        return ordinals
    out = ordinals.astype(np.int64, copy=True)
    for g in np.unique(rgs).tolist():
        kept = index.selected_rows(int(g))
        if kept is not None:
            sel = rgs == g
            out[sel] = kept[ordinals[sel]]
    return out


def select_config(ix: RowGroupIndex) -> dict[str, Any]:
    """The checkpoint fields of a selection: the normalized predicate and the length column (or their defaults)."""
    fields = ix.config_fields()
    return {k: fields.get(k, v) for k, v in SELECT_DEFAULTS.items()}


def select_index(
    ix: Index,
    selection: Selection | str,
    *,
    rank: int = 0,
    world: int = 1,
    threads: int | None = None,
    progress: bool | None = None,
    exchange: Exchange | None = None,
) -> SelectedIndex:
    """The index of the rows of ``ix`` that ``selection``'s predicate keeps (the selection pass, cached).

    Parameters
    ----------
    ix : planner.Index
        The dataset's index (token data; a text source is tokenized first).
    selection : planner.parameters.Selection or str
        Its ``where``: a DuckDB SQL boolean expression over the dataset's columns other
        than the token column; its ``length_column`` (optional): an integer column holding
        each row's token count, which the pass then reads instead of decoding the token
        column (checked against the footer's count). A str is the predicate alone
        (``Selection(where=that)``); ``dedupe`` and ``exclude`` are another pass's
        (:func:`plitzer.selection.dedupe.dedupe_index`).
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
    where, length_column = _predicate(selection)
    norm = _normalized(ix, where)
    caps = ix.capabilities
    if caps.kind == SELECTION.kind:
        return _selected_already(cast("SelectedIndex", ix), norm, length_column)
    if not caps.selectable:
        msg = (
            f"where= needs a dataset of token columns (Parquet, Arrow IPC), not a {caps.kind} source; tokenize "
            "text sources first (plitzer tokenize), and select before deduplicating"
        )
        raise ConfigError(msg)
    columns = check_predicate(ix, norm, length_column)
    p = SelectionPass(ix=ix, where=norm, columns=columns, length_column=length_column)
    chunks = chunks_of(ix)
    done = _run_shares(p, chunks, rank, world, threads or os.cpu_count() or 2, progress, exchange)
    return _selected_index(ix, norm, length_column, [done[c] for c in range(len(chunks))])


def _predicate(selection: Selection | str) -> tuple[str, str | None]:
    """``selection``'s predicate and length column (a str: the predicate); one without a predicate is refused."""
    sel = selection if isinstance(selection, Selection) else Selection(where=selection)
    if sel.where is None:
        msg = (
            f'{sel!r} has no predicate to select by; give its where= (e.g. Selection(where="score >= 3"), '
            "or the predicate alone as a str)"
        )
        raise ConfigError(msg)
    return sel.where, sel.length_column


def _normalized(ix: object, where: str) -> str:
    """``where`` normalized, its columns checked against the dataset's where ``ix`` is an index of token data."""
    caps = getattr(ix, "capabilities", None)
    if caps is not None and caps.column_runs:  # a Parquet dataset's columns (selected or not)
        pq_ix = cast("Index", ix)
        return normalize(where, [*available_columns(pq_ix), pq_ix.column])
    return normalize(where)


def _selected_already(ix: SelectedIndex, norm: str, length_column: str | None) -> SelectedIndex:
    """``ix`` itself when it is selected by this very selection; another is refused."""
    if ix.where == norm and ix.length_column == length_column:
        return ix
    msg = (
        f"the index is selected by where={ix.where!r} already; pass the dataset's own index (or its path) "
        f"to select by {norm!r}"
    )
    raise ConfigError(msg)


def _run_shares(
    p: SelectionPass,
    chunks: list[tuple[int, int]],
    rank: int,
    world: int,
    workers: int,
    progress: bool | None,
    exchange: Exchange | None,
) -> Part:
    """Every chunk's entry: with ``exchange``, this rank's share, then every rank's; else all, from its own first."""
    n = len(chunks)
    if exchange is not None and world > 1:
        mine = [c for c in range(n) if c * world // n == rank]
        done: Part = {}
        for part in exchange(run_pass(p, chunks, mine, shared=False, threads=workers, progress=progress)):
            done.update(part)
        for c, entry in done.items():
            path = entry_path(p.ix, chunks[c], p.where, p.length_column)
            if not path.exists():
                save_entry(path, entry)
        return done
    start = rank * n // world if world > 1 else 0
    order = [(start + i) % n for i in range(n)]
    return run_pass(p, chunks, order, shared=world > 1, threads=workers, progress=progress)


def _selected_index(ix: Index, norm: str, length_column: str | None, entries: list[Entry]) -> SelectedIndex:
    """The selected index of the pass's ``entries`` (one a chunk, in order); a selection of no token is refused."""

    counts = np.concatenate([e[1] for e in entries], axis=1) if entries else np.zeros((4, 0), np.int64)
    bits = RowBits.packed(np.concatenate([e[0] for e in entries]) if entries else np.zeros(0, np.uint8), counts[0])
    rows_sel, tokens_sel, empty_sel = counts[1], counts[2], counts[3]
    frame = ix.frame.with_columns(
        pl.Series("rows_selected", rows_sel, pl.Int64),
        pl.Series("tokens_selected", tokens_sel, pl.Int64),
        pl.Series("empty_docs_selected", empty_sel, pl.Int64),
    )
    total = int(tokens_sel.sum())
    if total == 0:
        msg = (
            f"where={norm!r} selects no token of {ix.source!r} ({int(rows_sel.sum())} of {ix.frame['rows'].sum()} "
            f"rows, all empty); loosen it. Available columns: {', '.join(available_columns(ix))}"
        )
        raise SelectionError(msg, predicate=norm, available=tuple(available_columns(ix)))
    h = hashlib.sha256()
    h.update(f"{ix.fingerprint}\nwhere\t{norm}\tlength_column={length_column or ''}\n".encode())
    step = 1 << 14  # the same text as a line a row group, formatted a slice at a time
    for a in range(0, len(rows_sel), step):
        pairs = zip(rows_sel[a : a + step].tolist(), tokens_sel[a : a + step].tolist(), strict=True)
        h.update("".join(f"{r}\t{t}\n" for r, t in pairs).encode())
    return SelectedIndex.over(
        ix,
        frame=frame,
        fingerprint=h.hexdigest(),
        where=norm,
        length_column=length_column,
        base_fingerprint=ix.fingerprint,
        bits=bits,
    )


def _ray_chunk(
    source: Any,
    column: str,
    storage_options: Mapping[str, Any] | None,
    selection: Selection,
    columns: list[str],
    first: int,
    end: int,
) -> tuple[int, Entry]:
    """A Ray task: one chunk of the pass (``selection``'s predicate normalized), on whichever machine runs it."""
    from planner.catalog.dataset import index

    where, length_column = _predicate(selection)
    p = SelectionPass(ix=index(source, column=column, storage_options=storage_options), where=where, columns=columns,
              length_column=length_column)  # fmt: skip
    return first, pack_entry(p.evaluate_many(range(first, end)))


def select_on_ray(
    ix: Index,
    selection: Selection | str,
    *,
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
    ``selection`` as :func:`select_index` takes it.
    """
    if ix.capabilities.kind != PARQUET.kind:  # each task opens the source again, as Parquet
        msg = f"the Ray engine selects a Parquet dataset of token columns, not a {ix.capabilities.kind} source: run "
        msg += "the pass on this machine (select_index, or --engine local)"
        raise ConfigError(msg)
    where, length_column = _predicate(selection)
    norm = normalize(where, [*available_columns(ix), ix.column])
    columns = check_predicate(ix, norm, length_column)
    chunks = chunks_of(ix)
    paths = [entry_path(ix, c, norm, length_column) for c in chunks]
    todo = [i for i, c in enumerate(chunks) if load_entry(paths[i], c[1] - c[0]) is None]
    by_first = {chunks[i][0]: i for i in todo}
    normalized = Selection(where=norm, length_column=length_column)
    calls = [(source, ix.column, storage_options, normalized, columns, chunks[i][0], chunks[i][1]) for i in todo]

    def got(result: tuple[int, Entry]) -> None:
        save_entry(paths[by_first[result[0]]], result[1])

    return run_tasks(_ray_chunk, calls, got, address=address, progress=progress, desc="selecting rows (ray)")


def select_spec(ix: Index, spec: SourceSpec) -> Index:
    """The selection pass as planner takes it (``planner.plan(..., selector=plitzer.selector)``).

    :data:`planner.api.Selector`: ``ix`` selected by ``spec.selection`` (its ``where`` and
    ``length_column``), this process doing the whole pass; the loader passes its own, which
    splits it across ranks.
    """
    if spec.selection.where is None:
        return ix
    return select_index(ix, spec.selection)
