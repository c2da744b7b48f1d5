"""The rows one rank reads in one epoch, as a Polars LazyFrame over the dataset's files.

:meth:`planner.order.plan.Plan.scan` asks :func:`rank_rows` with the epoch's arrays
(:class:`planner.order.epoch.EpochPlan`): its reads of the rank, in order, each one a row
group's slice of its file (the selected rows only, under ``where=``). Nothing is read
until the frame is collected; each file is scanned with the options of the storage
that listed it.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from planner.catalog.rowgroups import RowGroupIndex, SelectedRows
from planner.order.epoch import EpochPlan
from planner.stores.storage import Storage

__all__ = ["rank_rows"]


def rank_rows(dataset: RowGroupIndex, index: pl.DataFrame, ep: EpochPlan, rank: int) -> pl.LazyFrame:
    """A LazyFrame of exactly the rows (documents) that ``rank`` reads in epoch ``ep``.

    ``index`` is the plan's index (:attr:`planner.order.plan.Plan.index`). Columns: epoch,
    window_index, position, file, row_group, row, and the token column; ``row``
    numbers a row in its file's row group.
    """
    sel = ep.read_rank == rank
    positions = ep.read_position[sel]
    windows = ep.read_window[sel]
    f = index.with_columns((pl.col("rows").cum_sum().over("file_index") - pl.col("rows")).alias("row_offset"))
    parts = [
        _read(dataset, f.row(int(ep.order[p]), named=True), int(ep.order[p]), ep.epoch, w, p)
        for p, w in zip(positions.tolist(), windows.tolist(), strict=True)
    ]
    if not parts:
        return pl.LazyFrame(schema=_schema(dataset))
    return pl.concat(parts)


def _read(dataset: RowGroupIndex, r: dict[str, Any], rg: int, epoch: int, window: int, position: int) -> pl.LazyFrame:
    """One read: row group ``rg`` (its index row ``r``) at ``position`` of ``window``."""
    col = dataset.column
    lf = (
        _scan_parquet(dataset.location(r["file_index"]), dataset.storage(r["file_index"]))
        .select(col)
        .slice(r["row_offset"], r["rows"])
        .with_row_index("row")
    )
    kept = dataset.selected_rows(rg) if isinstance(dataset, SelectedRows) else None
    if kept is not None:
        lf = lf.filter(pl.col("row").is_in(pl.Series(kept, dtype=pl.UInt32).implode()))
    return lf.select(
        pl.lit(epoch, pl.Int64).alias("epoch"),
        pl.lit(window, pl.Int64).alias("window_index"),
        pl.lit(position, pl.Int64).alias("position"),
        pl.lit(r["file"]).alias("file"),
        pl.lit(r["row_group"], pl.Int64).alias("row_group"),
        pl.col("row").cast(pl.Int64),
        pl.col(col),
    )


def _schema(dataset: RowGroupIndex) -> dict[str, Any]:
    """The columns of a rank's rows (the frame of a rank that reads nothing)."""
    return {
        "epoch": pl.Int64,
        "window_index": pl.Int64,
        "position": pl.Int64,
        "file": pl.String,
        "row_group": pl.Int64,
        "row": pl.Int64,
        dataset.column: pl.List(pl.UInt32 if dataset.dtype == "uint32" else pl.Int32),
    }


def _scan_parquet(location: str, storage: Storage) -> pl.LazyFrame:
    """Polars' scan of one file, with the options of the storage that listed it."""
    return pl.scan_parquet(location, storage_options=storage.polars_options() or None)
