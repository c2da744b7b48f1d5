"""The SQL surface of a plan: its tables registered in DuckDB, one query run over them.

:meth:`planner.order.plan.Plan.sql` gathers the tables; this module knows DuckDB only.
Frames reach DuckDB through Arrow, without a copy into a database. A table that costs
a pass to make (``steps``, ``pieces``) is given as a maker and made only when the query
names it. The query runs with DuckDB's external access off (it reads no file, URL or
extension) unless the caller asks for it; then the dataset's own storages are
registered as DuckDB filesystems, so ``read_parquet`` of its files works with the
same credentials.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Mapping
from typing import Any

import polars as pl

from planner.catalog.rowgroups import RowGroupIndex
from planner.errors import ConfigError
from planner.stores.storage import Storage, duckdb_filesystems

__all__ = ["dataset_filesystems", "names_table", "run_query"]


def names_table(query: str, name: str) -> bool:
    """Whether ``query`` names ``name`` as a word (so the table is worth making)."""
    return re.search(rf"\b{re.escape(name)}\b", query, re.IGNORECASE) is not None


def run_query(
    query: str,
    tables: Mapping[str, pl.DataFrame],
    *,
    makers: Mapping[str, Callable[[], Any]],
    dataset: RowGroupIndex,
    external_access: bool,
) -> pl.DataFrame:
    """Run DuckDB ``query`` over ``tables`` and those of ``makers`` the query names.

    A maker returns a Polars frame or anything DuckDB registers as it is (a
    ``pyarrow.RecordBatchReader`` streams, read once). A query that reads a file or URL
    with ``external_access`` off is a ConfigError saying how to allow it.
    """
    import duckdb

    con = duckdb.connect(config={"enable_external_access": bool(external_access)})
    try:
        for name, frame in tables.items():
            con.register(name, frame.to_arrow())
        for name, make in makers.items():
            if names_table(query, name):
                got = make()
                con.register(name, got.to_arrow() if isinstance(got, pl.DataFrame) else got)
        # read_parquet('s3://...') in the query reaches the dataset's objects through
        # the same s3fs filesystem (DuckDB's httpfs extension may not be installable).
        for fs in dataset_filesystems(dataset) if external_access else ():
            con.register_filesystem(fs)
        try:
            result: pl.DataFrame = _integers(con.sql(query).pl())
        except duckdb.PermissionException as e:
            msg = (
                f"the query reads a file or URL ({' '.join(str(e).split())}), and plan.sql runs with "
                "DuckDB's external access off: it sees the plan's tables only. For a query you wrote, "
                "pass plan.sql(query, external_access=True) (CLI: plitzer plan ... --external-access)"
            )
            raise ConfigError(msg) from e
        return result
    finally:
        con.close()


def _integers(frame: pl.DataFrame) -> pl.DataFrame:
    """DuckDB's ``sum`` of integers is a HUGEINT, which arrives as ``decimal(38, 0)``: give Int64 back.

    A sum of token counts or bytes is an integer; a column that does not fit Int64 stays
    as it came (docs/usage.md, "Plans as tables").
    """
    for name, dtype in frame.schema.items():
        if isinstance(dtype, pl.Decimal) and dtype.scale == 0:
            with contextlib.suppress(pl.exceptions.InvalidOperationError):
                frame = frame.with_columns(pl.col(name).cast(pl.Int64, strict=True))
    return frame


def dataset_filesystems(idx: RowGroupIndex) -> list[Any]:
    """The filesystems DuckDB needs: one per protocol, routing each path to its own source's storage."""
    seen: dict[int, Storage] = {}
    for f in range(len(idx.files)):
        st = idx.storage(f)
        seen.setdefault(id(st), st)
    return duckdb_filesystems(list(seen.values()))
