"""When did the model see this document: every step, lane and offset that held it, without replaying the run.

:func:`plitzer.explain` answers "what did step K hold"; :func:`locate` answers the
reverse. plitzer's order is arithmetic (docs/design.md, "Locating documents"): a row
group's place in each epoch is a permutation of the index, its documents' places in
the window stream follow from the footers' token counts and the documents' lengths,
the lane cuts deal that stream like cards, and each lane's slice is shuffled by a
hash of (seed, epoch, window, lane). So the pieces of a document follow from the
plan and the token lengths of the few row groups that share its lanes
(:mod:`planner.lookup.pieces` does the arithmetic). Reading is limited to the footers, the
predicate's columns (to find the documents), and those row groups' token lengths
(from ``length_column`` where given); no token value is needed.

>>> import plitzer, plitzer.synth, polars as pl, tempfile
>>> d = tempfile.mkdtemp(); _ = plitzer.synth.write(d, tokens=60_000, seed=1, docs_per_row_group=50)
>>> cfg = dict(seed=0, lanes=4, window=2, seq_len=64)
>>> seen = plitzer.locate(d, "id = 7", steps=200, **cfg)
>>> with plitzer.Loader(d, **cfg) as ld:
...     run = [ld.next_batch().documents() for _ in range(200)]
>>> want = [b.filter((pl.col("file") == "part-00000.parquet") & (pl.col("row_group") == 0) & (pl.col("row") == 7))
...         for b in run]
>>> sum(w.height for w in want) == seen.height and seen["length"].sum() > 0
True
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Unpack

import numpy as np
import polars as pl
import pyarrow as pa
from numpy.typing import NDArray

from planner.catalog.dataset import Index
from planner.catalog.rowgroups import RowGroupIndex, stream_counts
from planner.errors import ConfigError, DataError, SelectionError, one_line
from planner.lookup.pieces import (
    Lengths,
    OneSource,
    Pieces,
    epochs_of_steps,
    lengths_from_array,
    locate_pieces,
    set_length_reader,
)
from planner.mixing.mixture import MixtureIndex
from planner.order.plan import Permutation, Plan, check_int, row_group_counts
from planner.parameters import document
from plitzer.loader import open_plan
from plitzer.readpath.read import list_lengths, read_chunk
from plitzer.selection.evaluate import SelectionPass
from plitzer.selection.predicate import available_columns, check_predicate, missing_column, normalize, predicate_columns
from plitzer.selection.select import source_rows
from plitzer.state.settings import KeywordsLessWhere, LoaderSettings
from plitzer.state.settings import Source as AnySource
from plitzer.text.source import TextIndex

__all__ = ["Keywords", "RowLengths", "locate", "locate_in_plan", "parse_epochs", "target_documents"]

I64 = NDArray[np.int64]

Rows = Sequence[tuple[Any, ...]] | pl.DataFrame


Keywords = KeywordsLessWhere
"""The run's settings (:class:`plitzer.state.settings.Keywords` less ``where``: locate's own names documents)."""


def _parts(ix: RowGroupIndex) -> list[tuple[str | None, Index, int]]:
    """(source name, source index, first global row group) of every source."""
    if isinstance(ix, MixtureIndex):
        base = np.concatenate([[0], np.cumsum([p.row_groups for p in ix.parts])])
        return [(n, p, int(base[i])) for i, (n, p) in enumerate(zip(ix.names, ix.parts, strict=True))]
    assert isinstance(ix, Index)
    return [(None, ix, 0)]


def _part_of(ix: RowGroupIndex, rg: int) -> tuple[Index, int]:
    if isinstance(ix, MixtureIndex):
        return ix.part(rg)
    assert isinstance(ix, Index)
    return ix, rg


# -- the documents: a predicate, or rows given by file and row ------------------------


def _bind(part: Index, where: str) -> tuple[str, list[str]]:
    """The normalized predicate and the columns it reads; a SelectionError that lists the columns."""
    if not isinstance(part, TextIndex):
        norm = normalize(where, [*available_columns(part), part.column])
        return norm, check_predicate(part, norm, None)
    # A text source: its text column may be searched too (a contamination audit's question).
    import duckdb

    schema = part.metadata(0).schema.to_arrow_schema()
    names = list(schema.names)
    norm = normalize(where, names)
    con = duckdb.connect()
    try:
        con.register("t", pa.table({c: pa.array([], schema.field(c).type) for c in names}))
        con.sql(f"select ({norm}) as keep from t").fetchall()  # noqa: S608  # bound on no rows: never runs on data
    except duckdb.Error as e:
        text = one_line(e)
        msg = f"where={norm!r} does not bind to {part.source!r}: {text}; available columns: {', '.join(names)}"
        raise SelectionError(msg, predicate=norm, column=missing_column(text), available=tuple(names)) from e
    finally:
        con.close()
    return norm, predicate_columns(norm, names)


def _matches(part: Index, where: str, columns: list[str], threads: int, progress: bool | None) -> list[I64]:
    """Per row group of ``part``: the stream ordinals of the documents ``where`` selects."""
    from tqdm import tqdm

    p = SelectionPass(ix=part, where=where, columns=columns, length_column=None)
    stored = part.frame["rows"].to_list()

    def one(rg: int) -> I64:
        if stored[rg] == 0:
            return np.zeros(0, np.int64)
        mask = p.mask(p.table(rg, stored[rg]))
        kept = part.selected_rows(rg)
        if kept is not None:
            mask = mask[kept]  # the run's selection: its rows are the stream's
        return np.flatnonzero(mask).astype(np.int64)

    with ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="plitzer-locate") as pool:
        bar = tqdm(
            pool.map(one, range(len(stored))),
            total=len(stored),
            desc="finding documents",
            unit="row group",
            disable=None if progress is None else not progress,
            leave=False,
        )
        return list(bar)


def _rows_frame(rows: Rows) -> pl.DataFrame:
    """``rows=`` as a frame of source (or null), file, row_group (or null), row."""
    if isinstance(rows, pl.DataFrame):
        missing = [c for c in ("file", "row") if c not in rows.columns]
        if missing:
            msg = f"rows= frame lacks {missing}; give columns file and row (and row_group, source where known)"
            raise ConfigError(msg)
        f = rows
    else:
        items = list(rows)
        bad = [x for x in items if not isinstance(x, (tuple, list)) or len(x) not in (2, 3)]
        if bad:
            msg = (
                f"rows= item {bad[0]!r} is not (file, row) or (file, row_group, row); e.g. "
                "rows=[('part-00000.parquet', 17)] (row counted in the file)"
            )
            raise ConfigError(msg)
        f = pl.DataFrame(
            {
                "file": [str(x[0]) for x in items],
                "row_group": [x[1] if len(x) == 3 else None for x in items],
                "row": [x[-1] for x in items],
            },
            schema={"file": pl.String, "row_group": pl.Int64, "row": pl.Int64},
        )
    for c in ("source", "row_group"):
        if c not in f.columns:
            f = f.with_columns(pl.lit(None, pl.String if c == "source" else pl.Int64).alias(c))
    return f.select(
        pl.col("source").cast(pl.String),
        pl.col("file").cast(pl.String),
        pl.col("row_group").cast(pl.Int64),
        pl.col("row").cast(pl.Int64),
    )


def _resolve_rows(ix: RowGroupIndex, rows: Rows) -> tuple[I64, I64]:
    """Global row groups and stream ordinals of the documents ``rows`` names (unselected ones dropped)."""
    parts = _parts(ix)
    by_name = {n: i for i, (n, _, _) in enumerate(parts)}
    files = [set(p.frame["file"].to_list()) for _, p, _ in parts]
    out_rg: list[int] = []
    out_doc: list[int] = []
    for source, file, row_group, row in _rows_frame(rows).iter_rows():
        if source is not None:
            if source not in by_name:
                msg = f"rows=: source {source!r} is not one of the mixture's sources {sorted(map(str, by_name))}"
                raise ConfigError(msg)
            where = [by_name[source]]
        else:
            where = [i for i, names in enumerate(files) if file in names]
        if not where:
            known = sorted(set().union(*files))
            msg = (
                f"rows=: file {file!r} is not a file of {ix.source!r}; name it as batch.documents() does "
                f"(its path under the source), e.g. {known[:3]}"
            )
            raise ConfigError(msg)
        if len(where) > 1:
            names = [parts[i][0] for i in where]
            msg = f"rows=: file {file!r} is in sources {names}; pass a frame with a source column to say which"
            raise ConfigError(msg)
        _, part, base = parts[where[0]]
        f = part.frame.with_row_index("rg").filter(pl.col("file") == file)
        if f.is_empty():
            msg = f"rows=: file {file!r} is not a file of source {source!r}"
            raise ConfigError(msg)
        counts = f["rows"].to_numpy().astype(np.int64)
        if row_group is None:
            total = int(counts.sum())
            if row is None or not 0 <= row < total:
                msg = f"rows=: row {row} is outside {file!r}, which has {total} rows (0..{total - 1}); give a row in it"
                raise ConfigError(msg)
            ends = np.cumsum(counts)
            i = int(np.searchsorted(ends, row, side="right"))
            local, in_rg = int(f["rg"][i]), row - int(ends[i] - counts[i])
        else:
            hit = f.filter(pl.col("row_group") == row_group)
            if hit.is_empty():
                msg = (
                    f"rows=: row group {row_group} is outside {file!r}, which has {f.height} row groups "
                    f"(0..{f.height - 1})"
                )
                raise ConfigError(msg)
            n = int(hit["rows"][0])
            if row is None or not 0 <= row < n:
                msg = f"rows=: row {row} is outside {file!r} row group {row_group}, which has {n} rows (0..{n - 1})"
                raise ConfigError(msg)
            local, in_rg = int(hit["rg"][0]), int(row)
        ordinal = in_rg
        kept = part.selected_rows(local)
        if kept is not None:
            j = int(np.searchsorted(kept, in_rg))
            if j >= len(kept) or int(kept[j]) != in_rg:
                continue  # the run's where= leaves it out: the model never saw it
            ordinal = j
        out_rg.append(base + local)
        out_doc.append(ordinal)
    return np.array(out_rg, np.int64), np.array(out_doc, np.int64)


def target_documents(
    ix: RowGroupIndex,
    where: str | None = None,
    rows: Rows | None = None,
    *,
    threads: int | None = None,
    progress: bool | None = None,
) -> tuple[I64, I64]:
    """The documents to locate: (global row group, ordinal among the stream's documents of it).

    ``where`` is evaluated on every source of a mixture that has the columns it names
    (a source without them has no such document); naming a column no source has is a
    :class:`~planner.errors.SelectionError` that lists the columns.
    """
    if (where is None) == (rows is None):
        msg = "locate needs the documents: where= (a DuckDB predicate over the columns) or rows= (file, row pairs)"
        raise ConfigError(msg)
    if rows is not None:
        return _resolve_rows(ix, rows)
    assert where is not None
    workers = threads or os.cpu_count() or 2
    out_rg: list[I64] = []
    out_doc: list[I64] = []
    first_error: SelectionError | None = None
    bound = 0
    for _, part, base in _parts(ix):
        try:
            norm, columns = _bind(part, where)
        except SelectionError as e:
            bare = not isinstance(part, TextIndex) and not available_columns(part)  # the token column alone
            if not isinstance(ix, MixtureIndex) or (e.column is None and not bare):
                raise
            first_error = first_error or e
            continue  # this source lacks the column: it holds no such document
        bound += 1
        for rg, docs in enumerate(_matches(part, norm, columns, workers, progress)):
            if len(docs):
                out_rg.append(np.full(len(docs), base + rg, np.int64))
                out_doc.append(docs)
    if bound == 0 and first_error is not None:
        msg = f"where={where!r} binds to none of the mixture's sources: {first_error}"
        raise SelectionError(msg, predicate=where, column=first_error.column, available=first_error.available)
    if not out_rg:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(out_rg), np.concatenate(out_doc)


# -- the token lengths of the row groups involved -------------------------------------


class RowLengths:
    """:data:`planner.lookup.pieces.Lengths` read from the data: each row group's documents' token lengths, once.

    From ``length_column`` where given (a column of each row's token count, checked
    against the footer), else the token column's list lengths (a text source is
    tokenized). Row groups are read in parallel and kept for the call.
    """

    def __init__(self, ix: RowGroupIndex, *, length_column: str | None = None, threads: int | None = None) -> None:
        self.ix = ix
        self.length_column = length_column
        self.threads = threads or os.cpu_count() or 2
        self._tokens, self._rows, _ = (x.to_numpy().astype(np.int64) for x in stream_counts(ix.frame))
        self._memo: dict[int, I64] = {}
        self.reads = 0

    def _read(self, rg: int) -> I64:
        if self._rows[rg] == 0:
            return np.zeros(0, np.int64)
        part, local = _part_of(self.ix, rg)
        column = part.length_source(self.length_column)  # a selection's own, none for text
        if column is not None:
            p = SelectionPass(ix=part, where="", columns=[], length_column=column)
            lengths = p._lengths(local)  # checked against the footer's tokens
            kept = part.selected_rows(local)
            if kept is not None:
                lengths = lengths[kept]
        else:
            lengths = list_lengths(read_chunk(part, local))
        if len(lengths) != self._rows[rg] or int(lengths.sum()) != self._tokens[rg]:
            where = part.location(int(part.frame["file_index"][local]), int(part.frame["row_group"][local]))
            msg = (
                f"{where}: read {len(lengths)} documents of {int(lengths.sum())} tokens, but the index says "
                f"{self._rows[rg]} of {self._tokens[rg]}; the file changed since it was indexed: index it again"
            )
            raise DataError(msg)
        return lengths.astype(np.int64, copy=False)

    def __call__(self, rgs: I64) -> list[I64]:
        todo = [g for g in dict.fromkeys(np.asarray(rgs).tolist()) if g not in self._memo]
        if len(todo) > 1 and self.threads > 1:
            workers = min(self.threads, len(todo))
            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="plitzer-lengths") as pool:
                got = list(pool.map(self._read, todo))
        else:
            got = [self._read(g) for g in todo]
        self.reads += len(todo)
        self._memo.update(zip(todo, got, strict=True))
        return [self._memo[g] for g in np.asarray(rgs).tolist()]


# -- which part of the run ------------------------------------------------------------


def _steps(steps: object) -> tuple[int, int] | None:
    if steps is None:
        return None
    if isinstance(steps, range):
        if steps.step != 1:
            msg = f"steps={steps!r} must be a range with step 1 (a stretch of the run)"
            raise ConfigError(msg)
        a, b = steps.start, steps.stop
    elif isinstance(steps, (tuple, list)) and len(steps) == 2:
        a, b = steps
    else:
        b = check_int("steps", steps, 0, "steps=N is the run's first N steps; or give range(start, stop)")
        a = 0
    a = check_int("steps start", a, 0, "steps count from 0")
    b = check_int("steps stop", b, a, "give steps as (start, stop) with stop >= start")
    return a, b


def parse_epochs(epochs: object) -> list[int] | None:
    """``epochs=`` as a sorted list: an int, a range, an iterable of ints, or ``"a:b"`` (b excluded)."""
    if epochs is None:
        return None
    if isinstance(epochs, str):
        a, sep, b = epochs.partition(":")
        try:
            got: Iterable[object] = range(int(a), int(b)) if sep else [int(a)]
        except ValueError:
            msg = f"epochs={epochs!r} is not an epoch or a range 'a:b' of epochs (b excluded), e.g. '0:3'"
            raise ConfigError(msg) from None
    elif isinstance(epochs, Iterable):
        got = epochs
    else:
        got = [epochs]
    return sorted({check_int("epochs", e, 0, "epochs count from 0") for e in got})


# -- the answer -----------------------------------------------------------------------


def _frame(ix: RowGroupIndex, p: Pieces, per: int) -> pl.DataFrame:
    rg = p.row_group
    frame = ix.frame
    cols: dict[str, Any] = {
        "step": p.step,
        "rank": p.lane // per,
        "lane": p.lane,
        "start": p.start,
        "length": p.length,
    }
    if "source" in frame.columns:  # a mixture's
        cols["source"] = frame["source"].gather(rg).cast(pl.String)
    cols.update(
        {
            "file": frame["file"].gather(rg).cast(pl.String),
            "row_group": frame["row_group"].gather(rg).cast(pl.Int64),
            "row": source_rows(ix, rg, p.doc),
            "token_offset": p.token_offset,
            "epoch": p.epoch,
            "window_index": p.window,
        }
    )
    return pl.DataFrame(cols)


def locate_in_plan(
    plan: Plan,
    row_groups: I64,
    docs: I64,
    lengths: Lengths,
    seq_len: int,
    *,
    epochs: list[int] | None = None,
    steps: tuple[int, int] | None = None,
    lanes: range | None = None,
) -> pl.DataFrame:
    """The pieces of the given documents in ``plan``'s run, as :func:`locate` returns them."""
    if epochs is None:
        epochs = list(epochs_of_steps(plan, steps, seq_len)) if steps is not None else [0]
    # One source: its epochs are permutations of the index, laid out without the reads.
    view: Any = OneSource(plan, row_group_counts(plan.dataset)[0]) if isinstance(plan.order, Permutation) else plan
    parts = [locate_pieces(view, e, row_groups, docs, lengths, seq_len, steps=steps) for e in epochs]
    got = Pieces.concat(parts)
    if lanes is not None:
        got = got.take(np.flatnonzero((got.lane >= lanes.start) & (got.lane < lanes.stop)))
    per = plan.settings.lanes // plan.settings.world
    return _frame(plan.dataset, got.sorted(), per)


@document(exclude=("where",))
def locate(
    source: AnySource,
    where: str | None = None,
    *,
    rows: Rows | None = None,
    epochs: object = None,
    steps: object = None,
    selection: str | None = None,
    progress: bool | None = None,
    **settings: Unpack[Keywords],
) -> pl.DataFrame:
    """Every piece of the documents ``where`` (or ``rows``) names that the run delivers.

    Parameters
    ----------
    source : str, PathLike, list, dict of named sources, or an index
        The dataset (or mixture), as for :class:`plitzer.Loader`.
    where : str, optional
        A DuckDB SQL boolean expression over the dataset's columns: the documents to
        locate (``"url = 'https://...'"``, ``"id in (3, 17)"``). On a mixture, every
        source that has the columns it names is searched; on a text source, the text
        column too.
    rows : list of (file, row) or (file, row_group, row), or a polars DataFrame
        The documents by place instead: ``file`` as ``batch.documents()`` names it,
        ``row`` counted in the file (or in ``row_group`` where given). A frame may
        carry ``source`` (a mixture's). A document the run's selection leaves out
        has no piece.
    epochs : int, range, iterable of ints, or "a:b"
        The epochs whose windows to search (the ``epoch`` column, the window's epoch,
        as ``batch.documents()`` has it). Default: epoch 0, or the epochs ``steps`` touch.
    steps : int, range or (start, stop)
        Only pieces of these global steps; an int ``N`` is the run's first N steps
        (``steps=loader.step``: everything the model has seen so far).
    selection : str, optional
        The run's own ``where=`` (its selection, SPEC section 10): ``where`` here names the
        documents to find, so the loader's keyword is spelled ``selection``.
    <settings>

    Returns
    -------
    polars.DataFrame
        One row per piece, in (step, lane, start) order: step, rank, lane, start (in the
        sequence), length, source (mixtures only), file, row_group, row (in the row
        group), token_offset (in the document), epoch, window_index: the rows
        ``batch.documents()`` of those steps give for those documents (with ``step`` and
        ``rank``; ``batch_row`` is ``lane`` less the rank's first lane).

    Nothing is replayed and no token value is read: footers, the predicate's columns,
    and the token lengths of the row groups that share a lane with the documents.
    The settings are the run's, the keywords of :class:`plitzer.Loader` but ``where``
    (spelled ``selection`` here): ``world`` decides the ``rank`` column; ``rank``, when
    given, keeps that rank's lanes only; ``length_column`` also spares decoding the
    token column for the lengths, without ``selection``.
    """
    length_column = settings.get("length_column")
    rank_given = "rank" in settings
    if selection is None:
        settings.pop("length_column", None)  # for the lengths only: the loader's length_column serves a selection
    s = LoaderSettings.of(**settings, where=selection)
    if s.stages.staged:
        msg = (
            f"locate with layout stages ({s.stages.as_config()}, [start step, lanes, seq_len]) is not supported yet: "
            "it places documents under one layout; give lanes= and seq_len= as ints (the first stage's layout "
            "holds for the steps before the first change)"
        )
        raise ConfigError(msg)
    span = _steps(steps)
    eps = parse_epochs(epochs)
    plan = open_plan(source, s)
    rgs, docs = target_documents(plan.dataset, where, rows, threads=s.threads, progress=progress)
    lengths = RowLengths(plan.dataset, length_column=length_column, threads=s.threads)
    lanes = range(s.rank * (s.lanes // s.world), (s.rank + 1) * (s.lanes // s.world)) if rank_given else None
    return locate_in_plan(plan, rgs, docs, lengths, s.seq_len, epochs=eps, steps=span, lanes=lanes)


def _plan_lengths(ix: RowGroupIndex) -> Lengths:
    """:meth:`planner.order.plan.Plan.pieces`'s lengths: the cached document pass over the whole dataset."""
    from plitzer.tools.explain import document_pass

    rows = stream_counts(ix.frame)[1].to_numpy().astype(np.int64)
    return lengths_from_array(document_pass(ix)[0], rows)


set_length_reader(_plan_lengths)
