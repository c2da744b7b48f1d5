"""Exclusion lists (``exclude=TABLE``, SPEC section 14): the rows whose values a table lists are dropped.

The table is one Parquet or CSV file, local or on any store plitzer reads (``s3://``,
``gs://``, ...). Its bytes are read once, through the store's own client (nothing but
that one file is opened: no query engine with file access runs on it), parsed with
Arrow, and digested (sha256 of the bytes: the configuration's ``exclude`` field). Each
of its columns must be a column of the dataset (a ``ConfigError`` otherwise, listing
the dataset's columns) and is cast to the dataset's type of it. A dataset row is
dropped when all of the table's columns equal those of some row of the table (a null
equals nothing). Rows are matched by their 128-bit keys (:mod:`plitzer.selection.keys`),
then every match is checked value by value, so a hash collision never drops a row.
"""

from __future__ import annotations

import hashlib
import io
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from numpy.typing import NDArray

from planner.errors import ConfigError, DataError, one_line
from plitzer.selection.keys import Keys, combine, hash_array, valid_rows

__all__ = ["Exclusion", "load_exclusion"]


@dataclass(frozen=True)
class Exclusion:
    """An exclusion table, loaded and keyed: what a row group's rows are checked against."""

    path: str
    digest: str  # sha256 of the file's bytes
    table: pa.Table
    keys: Keys = field(repr=False)
    _order: NDArray[np.int64] = field(repr=False)
    _sorted: NDArray[np.void] = field(repr=False)

    @property
    def columns(self) -> list[str]:
        return list(self.table.column_names)

    def check(self, schema: pa.Schema, source: str, token_column: str) -> Exclusion:
        """The table with its columns cast to the dataset's types; a ConfigError for a column it lacks."""
        names = [n for n in schema.names if n != token_column]
        unknown = [c for c in self.columns if c not in names]
        if unknown:
            msg = (
                f"exclude={self.path!r}: {', '.join(repr(c) for c in unknown)} "
                f"{'is not a column' if len(unknown) == 1 else 'are not columns'} of {source!r}; an exclusion "
                f"table's columns must be dataset columns (available: {', '.join(names)})"
            )
            raise ConfigError(msg)
        cols = []
        for c in self.columns:
            want = schema.field(c).type
            got = self.table.column(c)
            if got.type != want:
                try:
                    got = got.cast(want)
                except (pa.ArrowException, ValueError) as e:
                    msg = (
                        f"exclude={self.path!r}: column {c!r} is {got.type} and cannot be compared with the "
                        f"dataset's {want} ({one_line(e)}); write it as {want}"
                    )
                    raise ConfigError(msg) from e
            cols.append(got)
        table = pa.table(dict(zip(self.columns, cols, strict=True)))
        return _keyed(self.path, self.digest, table)

    def match(self, columns: dict[str, pa.Array]) -> NDArray[np.bool_]:
        """True for each row whose values of the table's columns equal some row of the table."""
        n = len(next(iter(columns.values())))
        if n == 0 or self.table.num_rows == 0:
            return np.zeros(n, bool)
        arrs = [columns[c] for c in self.columns]
        keys = combine([hash_array(a, f"column {c!r}") for c, a in zip(self.columns, arrs, strict=True)])
        ok = np.ones(n, bool)
        for a in arrs:
            ok &= valid_rows(a)
        probe = _void(keys)
        at = np.searchsorted(self._sorted, probe)
        at = np.minimum(at, len(self._sorted) - 1)
        hit = (self._sorted[at] == probe) & ok
        for i in np.flatnonzero(hit).tolist():  # the value check: a key match is not yet equality
            j = int(self._order[at[i]])
            if any(a[i].as_py() != self.table.column(c)[j].as_py() for c, a in zip(self.columns, arrs, strict=True)):
                hit[i] = False
        return np.asarray(hit, bool)


def _void(keys: Keys) -> NDArray[np.void]:
    k = np.ascontiguousarray(keys)
    return k.view(np.dtype((np.void, 16))).reshape(-1)


def _keyed(path: str, digest: str, table: pa.Table) -> Exclusion:
    valid = np.ones(table.num_rows, bool)
    parts = []
    for c in table.column_names:
        arr = table.column(c).combine_chunks()
        parts.append(hash_array(arr, f"exclude={path!r} column {c!r}"))
        valid &= valid_rows(arr)
    keys = combine(parts) if parts else np.zeros((0, 2), np.uint64)
    rows = np.flatnonzero(valid).astype(np.int64)  # a row with a null matches nothing
    v = _void(keys[rows]) if len(rows) else np.zeros(0, np.dtype((np.void, 16)))
    order = np.argsort(v, kind="stable")
    return Exclusion(path=path, digest=digest, table=table, keys=keys, _order=rows[order], _sorted=v[order])


def _read_bytes(path: str, storage_options: Any) -> bytes:
    if "://" not in path:
        try:
            with open(os.path.expanduser(path), "rb") as f:
                return f.read()
        except OSError as e:
            msg = f"exclude={path!r}: cannot read the exclusion table ({e.strerror}); give a Parquet or CSV file"
            raise ConfigError(msg) from e
    from planner.stores.backends import open_storages

    storage = open_storages(path, storage_options)[0]
    fs = storage.duckdb_filesystem()
    if fs is None:  # pragma: no cover - every object store has one
        msg = f"exclude={path!r}: this store cannot read a single file; copy the table to local disk"
        raise ConfigError(msg)
    try:
        data: bytes = fs.cat_file(path)
    except Exception as e:
        msg = f"exclude={path!r}: cannot read the exclusion table ({one_line(e)}); check the URL and credentials"
        raise ConfigError(msg) from e
    return data


def load_exclusion(path: str | os.PathLike[str], storage_options: Any = None) -> Exclusion:
    """The exclusion table at ``path`` (``.parquet`` or ``.csv``): read once, digested, keyed."""
    text = os.fspath(path)
    data = _read_bytes(text, storage_options)
    digest = hashlib.sha256(data).hexdigest()
    try:
        if text.lower().endswith((".csv", ".csv.gz", ".tsv")):
            opts = pacsv.ParseOptions(delimiter="\t") if text.lower().endswith(".tsv") else None
            table = pacsv.read_csv(io.BytesIO(data), parse_options=opts)
        else:
            table = pq.read_table(io.BytesIO(data))
    except (pa.ArrowException, ValueError, OSError) as e:
        msg = f"exclude={text!r} is not a readable Parquet or CSV table ({one_line(e)}); give a .parquet or .csv file"
        raise DataError(msg) from e
    if table.num_columns == 0:
        msg = f"exclude={text!r} has no column; give a table whose columns are dataset columns (e.g. url)"
        raise ConfigError(msg)
    return _keyed(text, digest, table)
