"""The pieces of whole epochs as frames: a Polars LazyFrame read a batch of windows at a time, or a stream for DuckDB.

:meth:`planner.order.plan.Plan.pieces` and the ``pieces`` table of :meth:`planner.order.plan.Plan.sql`
come from here. Each batch of windows' pieces (:func:`planner.lookup.pieces.epoch_pieces`) is
sorted as batches list them and named as ``batch.documents()`` names its columns,
with the step and the rank; ``row`` numbers a document in its row group (a
selection's rows are sparse: :func:`stream_rows`). Under layout stages (the plan's
``layout``) each stage's windows are cut into its lanes and the window cut again at a
change gives pieces to both sides (:mod:`planner.lookup.staged`); the stages give the
steps their ``seq_len``, and ``rank`` counts each stage's lanes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import polars as pl

from planner.arraytypes import I64
from planner.catalog.rowgroups import RowGroupIndex, SelectedRows
from planner.errors import ConfigError
from planner.lookup.lengths import Lengths, as_lengths
from planner.lookup.pieces import Pieces, epoch_pieces
from planner.lookup.staged import staged_pieces

__all__ = ["Rows", "pieces_frame", "pieces_reader", "pieces_schema", "stream_rows"]


def _frame(p: Pieces, index: pl.DataFrame, rank: I64, sources: bool) -> pl.DataFrame:
    cols: dict[str, Any] = {
        "epoch": p.epoch,
        "window_index": p.window,
        "step": p.step,
        "rank": rank,
        "lane": p.lane,
        "start": p.start,
        "length": p.length,
    }
    if sources:
        cols["source"] = index["source"].gather(p.row_group)
    cols.update(
        {
            "file": index["file"].gather(p.row_group),
            "row_group": index["row_group"].gather(p.row_group).cast(pl.Int64),
            "doc": p.doc,
            "token_offset": p.token_offset,
            "position": p.position,
        }
    )
    return pl.DataFrame(cols)


def pieces_schema(sources: bool) -> dict[str, Any]:
    """The columns of :func:`pieces_frame` (``source`` only for a mixture)."""
    out: dict[str, Any] = {
        "epoch": pl.Int64,
        "window_index": pl.Int64,
        "step": pl.Int64,
        "rank": pl.Int64,
        "lane": pl.Int64,
        "start": pl.Int64,
        "length": pl.Int64,
    }
    if sources:
        out["source"] = pl.String
    out.update({"file": pl.String, "row_group": pl.Int64, "row": pl.Int64, "token_offset": pl.Int64})
    return out


Rows = Callable[[I64, I64], I64]
"""(row groups, stream ordinals) -> the rows in their row groups (a selection's rows are sparse)."""


def stream_rows(index: RowGroupIndex) -> Rows:
    """:data:`Rows` of ``index``: the ordinal itself, or the selected row it names (``where=``)."""
    if not isinstance(index, SelectedRows):
        return lambda _rgs, docs: docs

    def rows(rgs: I64, docs: I64) -> I64:
        out = np.asarray(docs, np.int64).copy()
        for g in np.unique(rgs).tolist():
            kept = index.selected_rows(int(g))
            if kept is not None:
                sel = rgs == g
                out[sel] = kept[docs[sel]]
        return out

    return rows


def _batches(plan: Any, epoch: int, lengths: Lengths, seq_len: int, batch: int) -> Iterator[tuple[Pieces, I64]]:
    """Each batch of ``batch`` windows' pieces and their ranks (under layout stages, each stage's lanes)."""
    world = int(plan.settings.world)
    layout = getattr(plan, "layout", None)
    if layout is None or not layout.staged:  # one stage: the windows cut as they are, in ``seq_len`` rows
        per = int(plan.settings.lanes) // world
        for got in epoch_pieces(plan, epoch, lengths, seq_len, batch=batch):
            yield got, got.lane // per
        return
    n = plan.windows_in(epoch)
    for a in range(0, n, batch):
        got = staged_pieces(plan, layout, epoch, lengths, windows=np.arange(a, min(n, a + batch), dtype=np.int64))
        yield got, got.lane // (layout.lanes_at(got.step) // world)


def _pieces_batches(
    plan: Any, epochs: Sequence[int], lengths: Lengths, seq_len: int, rows: Rows, batch: int
) -> Iterator[pl.DataFrame]:
    index = plan.index
    sources = "source" in index.columns
    for e in epochs:
        for got, rank in _batches(plan, e, lengths, seq_len, batch):
            if not len(got):
                continue
            order = np.lexsort((got.start, got.lane, got.step))  # as batches list them (Pieces.sorted)
            p = got.take(order)
            f = _frame(p, index, rank[order], sources)
            row = rows(p.row_group, p.doc)
            yield f.with_columns(pl.Series("row", row, pl.Int64)).select(list(pieces_schema(sources)))


def _seq_len(plan: Any, seq_len: int | None) -> int:
    """The run's seq_len: given, the plan's (a mixture's), or its layout's first stage's."""
    layout = getattr(plan, "layout", None)
    if layout is not None and layout.staged:
        if seq_len is not None and seq_len != layout.first.seq_len:
            msg = (
                f"seq_len={seq_len!r}: the plan has layout stages {layout.as_config()} ([start step, lanes, "
                "seq_len]), which place the steps; omit seq_len="
            )
            raise ConfigError(msg)
        return int(layout.first.seq_len)
    got = seq_len if seq_len is not None else getattr(plan, "seq_len", None)
    if got is None and layout is not None:
        got = layout.first.seq_len
    if got is None:
        msg = "pieces need the run's seq_len (tokens per sequence) to place steps: pass seq_len="
        raise ConfigError(msg)
    if isinstance(got, bool) or not isinstance(got, (int, np.integer)) or got < 1:
        msg = f"seq_len={got!r} must be an integer >= 1, the run's tokens per sequence"
        raise ConfigError(msg)
    return int(got)


def pieces_frame(
    plan: Any, epoch: int, seq_len: int | None, lengths: Any = None, rows: Rows | None = None, batch: int = 64
) -> pl.LazyFrame:
    """One row per piece of ``epoch``, computed a batch of windows at a time as the frame is read.

    Columns: epoch, window_index, step, rank, lane, start, length, source (a mixture's),
    file, row_group, row, token_offset: those of ``batch.documents()`` (without
    ``batch_row``), with the step and the rank. Rows come in window order, each
    batch of windows' pieces in (step, lane, start) order.
    """
    from polars.io.plugins import register_io_source

    length = _seq_len(plan, seq_len)
    get = as_lengths(plan, lengths)
    to_rows = rows if rows is not None else stream_rows(plan.dataset)
    sources = "source" in plan.index.columns
    schema = pieces_schema(sources)

    def source(
        with_columns: list[str] | None, predicate: pl.Expr | None, n_rows: int | None, _batch_size: int | None
    ) -> Iterator[pl.DataFrame]:
        left = n_rows
        for df in _pieces_batches(plan, [epoch], get, length, to_rows, batch):
            out = df
            if predicate is not None:
                out = out.filter(predicate)
            if with_columns is not None:
                out = out.select(with_columns)
            if left is not None:
                out = out.head(left)
                left -= out.height
            yield out
            if left is not None and left <= 0:
                return

    return register_io_source(source, schema=schema)


def pieces_reader(
    plan: Any, epochs: Sequence[int], seq_len: int | None, lengths: Any = None, rows: Rows | None = None
) -> Any:
    """The pieces of ``epochs`` as a ``pyarrow.RecordBatchReader`` (for DuckDB: streamed, read once)."""
    import pyarrow as pa

    length = _seq_len(plan, seq_len)
    get = as_lengths(plan, lengths)
    to_rows = rows if rows is not None else stream_rows(plan.dataset)
    schema = pl.DataFrame(schema=pieces_schema("source" in plan.index.columns)).to_arrow().schema

    def batches() -> Iterator[Any]:
        for df in _pieces_batches(plan, list(epochs), get, length, to_rows, 64):
            yield from df.to_arrow().cast(schema).to_batches()

    return pa.RecordBatchReader.from_batches(schema, batches())
