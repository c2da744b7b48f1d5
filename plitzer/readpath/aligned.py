"""Aligned columns: per-token values (loss masks, weights, labels) packed with the tokens (SPEC section 13).

``columns=["loss_mask", "weight"]`` (or ``{"loss_mask": 0, "weight": 0.0}``: a fill value for
the sources that lack a column) names list columns that hold one value per token. Each is:

* resolved once at construction (:func:`resolve`): every source's schema is looked at (its
  first file's footer); a column that is not a list of bool, integer or float is a
  :class:`ConfigError` listing the candidates, a source without it a ConfigError naming the
  source unless a fill is given; a text source takes fills only. The batch's dtype of a
  column is its sources' (promoted where they differ), else the fill's;
* read with one ranged read per planned row group and column (:func:`read_columns`, beside
  the token column's read in the read pool's threads; through a footer of that row group
  alone, :func:`plitzer.readpath.runs.read_other`), the rows a selection keeps
  taken, and checked: a row whose length differs from its token list is a
  :class:`DataError` naming file, row group, row and both lengths;
* packed with exactly the tokens' cuts and pieces: the packer computes the pieces, row cuts
  and layout once (:mod:`planner.packing`), and gathers each column through the same lists as
  the tokens (:func:`aligned_chunks`, :func:`plitzer.readpath.pack.finish_unit`), in an unsigned integer of
  the column's width (bool as uint8), viewed as the column's dtype when delivered;
* delivered as ``batch.columns[name]``, shaped like ``batch.tokens``: a view of the unit's
  block, or owned writable memory for a step that straddles windows
  (:func:`assemble_columns`).

docs/design.md, "Aligned columns".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from planner.arraytypes import I64
from planner.catalog.datasetindex import Index
from planner.catalog.footer import schema_of
from planner.catalog.rowgroups import RowGroupIndex
from planner.errors import ConfigError, DataError
from plitzer.readpath.packed import (
    ColumnBlock,
    PackedUnit,
    StepCopies,
    arrow_ints,
    edge_values,
)
from plitzer.readpath.read import list_lengths, numpy_view
from plitzer.readpath.runs import read_other

__all__ = [
    "Columns",
    "aligned_chunks",
    "assemble_columns",
    "columns_config",
    "parse_columns",
    "read_columns",
    "resolve",
    "storage_dtype",
    "unit_columns",
]

Fill = bool | int | float
_READ = object()  # a source that holds the column: read it


def parse_columns(value: Any) -> tuple[tuple[str, ...], dict[str, Fill | None]] | None:
    """``columns=`` as (names in the order given, name -> fill or None); None: no aligned columns.

    A list (or tuple) of names, a mapping name -> fill value (None: no fill), or a string
    of comma-separated names (the command line's). Names must be distinct, non-empty strings;
    fills bool, int or float.
    """
    if value is None:
        return None
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
    if isinstance(value, Mapping):
        names = list(value)
        fills: dict[str, Fill | None] = {}
        for k, v in value.items():
            if v is not None and (not isinstance(v, (bool, int, float, np.bool_, np.integer, np.floating))):
                msg = (
                    f"columns={{{k!r}: {v!r}}}: a fill value is a bool, int or float (the value of the column "
                    "for sources that lack it), e.g. columns={'loss_mask': 0}"
                )
                raise ConfigError(msg)
            fills[str(k)] = None if v is None else v.item() if isinstance(v, np.generic) else v
    elif isinstance(value, Sequence):
        names = list(value)
        fills = {str(n): None for n in names}
    else:
        msg = (
            f"columns={value!r} must be a list of column names or a mapping name -> fill value, "
            "e.g. columns=['loss_mask'] or columns={'loss_mask': 0}"
        )
        raise ConfigError(msg)
    for n in names:
        if not isinstance(n, str) or not n:
            msg = f"columns={value!r}: every name must be a non-empty string, not {n!r}"
            raise ConfigError(msg)
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        msg = f"columns={value!r} names {dup!r} twice; name each column once"
        raise ConfigError(msg)
    if not names:
        return None
    return tuple(names), fills


def columns_config(value: Any) -> list[list[Any]]:
    """The checkpoint's ``columns`` field: ``[[name, fill or None], ...]`` sorted by name ([] for none)."""
    got = parse_columns(value)
    if got is None:
        return []
    names, fills = got
    return [[n, fills[n]] for n in sorted(names)]


def storage_dtype(dtype: np.dtype[Any]) -> np.dtype[Any]:
    """The unsigned integer of ``dtype``'s width: what the packer gathers (bool as uint8, float16 as uint16)."""
    return np.dtype(f"u{dtype.itemsize}")


def _aligned_type(t: pa.DataType) -> bool:
    if not (pa.types.is_list(t) or pa.types.is_large_list(t)):
        return False
    v = t.value_type
    return bool(pa.types.is_boolean(v) or pa.types.is_integer(v) or pa.types.is_floating(v))


def _value_dtype(t: pa.DataType) -> np.dtype[Any]:
    v = t.value_type
    return np.dtype(np.bool_) if pa.types.is_boolean(v) else np.dtype(v.to_pandas_dtype())


@dataclass(frozen=True, eq=False)
class Columns:
    """The aligned columns of a run, resolved against its sources.

    ``names`` in the order given; ``fills`` name -> fill (None: none given); ``dtypes`` the
    batch's dtype of each; ``plans`` for each source's row-group index (by ``id``): name -> the fill
    to use, or ``_READ``. ``indexes`` keeps those indexes alive (their ids are the keys).
    """

    names: tuple[str, ...]
    fills: dict[str, Fill | None]
    dtypes: dict[str, np.dtype[Any]]
    plans: dict[int, dict[str, Any]]
    indexes: list[RowGroupIndex] = field(repr=False)

    @property
    def itemsize(self) -> int:
        """Bytes per token of all the columns together (what the budget adds per token)."""
        return sum(d.itemsize for d in self.dtypes.values())

    def config(self) -> list[list[Any]]:
        """The checkpoint's ``columns`` field (:func:`columns_config`)."""
        return [[n, self.fills[n]] for n in sorted(self.names)]

    def of_unit(self, per: list[dict[str, NDArray[Any]] | None]) -> dict[str, tuple[list[NDArray[Any]], np.dtype[Any]]]:
        """A unit's columns as the packer takes them: name -> (each read row group's values, dtype)."""
        assert all(c is not None for c in per)
        return {n: ([c[n] for c in per if c is not None], self.dtypes[n]) for n in self.names}

    def describe(self) -> str:
        """``loss_mask (bool, fill 0), weight (float32)``: what explain and the CLI show."""
        parts = []
        for n in self.names:
            fill = self.fills[n]
            parts.append(f"{n} ({self.dtypes[n]}" + ("" if fill is None else f", fill {fill!r}") + ")")
        return ", ".join(parts)


def _sources(index: RowGroupIndex) -> list[tuple[str | None, RowGroupIndex]]:
    return [(n or None, p) for n, p in zip(index.names, index.parts, strict=True)]


def _is_text(ix: RowGroupIndex) -> bool:
    return "tokenizer" in ix.config_fields()


def _schema(ix: RowGroupIndex) -> pa.Schema:
    """The first file's schema: the job index's where it carries it (``--columns``), else the footer's."""
    return cast("Index", ix).schema()


def _candidates(schema: pa.Schema, token_column: str) -> list[str]:
    return [f.name for f in schema if f.name != token_column and _aligned_type(f.type)]


def _named(src: str | None, ix: RowGroupIndex) -> str:
    return f"source {src!r} ({ix.source})" if src is not None else f"{ix.source}"


def _text_plan(src: str | None, ix: RowGroupIndex, names: Sequence[str], fills: Mapping[str, Any]) -> dict[str, Any]:
    """A text source's plan: every column its fill (a text source has no aligned column to read)."""
    for n in names:
        if fills[n] is None:
            msg = (
                f"{_named(src, ix)} is text, tokenized as it is read: it has no aligned column {n!r}, and "
                f"text sources take fills only: give one, e.g. columns={{{n!r}: 0}}"
            )
            raise ConfigError(msg)
    return {n: fills[n] for n in names}


def _parquet_plan(
    src: str | None,
    ix: RowGroupIndex,
    names: Sequence[str],
    fills: Mapping[str, Any],
    found: dict[str, list[np.dtype[Any]]],
) -> dict[str, Any]:
    """A Parquet source's plan: each column read (its value dtype added to ``found``) or its fill."""
    schema = _schema(ix)
    token_column = getattr(ix, "column", "")
    cands = _candidates(schema, token_column)
    plan: dict[str, Any] = {}
    for n in names:
        if n == token_column:
            msg = f"columns=: {n!r} is the token column; name the per-token columns beside it ({cands or 'none'})"
            raise ConfigError(msg)
        if schema.get_field_index(n) < 0:
            if fills[n] is None:
                what = "a mixture" if src is not None else "the dataset"
                msg = (
                    f"{_named(src, ix)} has no column {n!r} (its aligned candidates: {cands or 'none'}); "
                    f"columns= as a list needs every source of {what} to have every column: give a fill "
                    f"for the sources that lack it, e.g. columns={{{n!r}: 0}}"
                )
                raise ConfigError(msg)
            plan[n] = fills[n]
            continue
        t = schema.field(n).type
        if not _aligned_type(t):
            msg = (
                f"{_named(src, ix)}: column {n!r} is {t}, not a list of bool, integer or float; "
                f"aligned columns are list columns of one value per token: candidates {cands or 'none'}"
            )
            raise ConfigError(msg)
        found[n].append(_value_dtype(t))
        plan[n] = _READ
    return plan


def _dtypes(
    names: Sequence[str], fills: Mapping[str, Any], found: dict[str, list[np.dtype[Any]]]
) -> dict[str, np.dtype[Any]]:
    """Each column's dtype: its sources' values' in common, else its fill's; a fill that does not fit refused."""
    dtypes: dict[str, np.dtype[Any]] = {}
    for n in names:
        fill = fills[n]
        if found[n]:
            dt = np.result_type(*found[n]) if len(found[n]) > 1 else found[n][0]
        else:
            assert fill is not None
            dt = np.asarray(fill).dtype
        dtypes[n] = np.dtype(dt)
        if fill is not None:
            fitted = np.asarray(fill).astype(dt)
            if fitted.item() != fill:
                msg = f"columns={{{n!r}: {fill!r}}}: the fill does not fit the column's dtype {dt}; use a value of it"
                raise ConfigError(msg)
    return dtypes


def resolve(index: RowGroupIndex, value: Any) -> Columns | None:
    """The run's aligned columns (``columns=``) checked against every source of ``index``; None for none."""
    got = parse_columns(value)
    if got is None:
        return None
    names, fills = got
    found: dict[str, list[np.dtype[Any]]] = {n: [] for n in names}
    srcs = _sources(index)
    plans: dict[int, dict[str, Any]] = {
        id(ix): _text_plan(src, ix, names, fills) if _is_text(ix) else _parquet_plan(src, ix, names, fills, found)
        for src, ix in srcs
    }
    return Columns(names, dict(fills), _dtypes(names, fills, found), plans, [ix for _, ix in srcs])


def _missing(ix: Index, rg: int, column: str) -> ConfigError:
    """A file of the source lacks an aligned column it is read for."""
    fi, g = int(ix.frame["file_index"][rg]), int(ix.frame["row_group"][rg])
    reader = ix.entries[fi].reader  # a file that reads its own row groups (Arrow IPC) has no footer
    schema = reader.schema if reader is not None else schema_of(ix.metadata(fi)).to_arrow_schema()
    msg = (
        f"{ix.location(fi, g)}: no column {column!r} (aligned candidates: {_candidates(schema, '') or 'none'}); every "
        f"file of a source must have the aligned columns it is read for, or give a fill: columns={{{column!r}: 0}}"
    )
    return ConfigError(msg)


def _read_one(ix: Index, rg: int, name: str, dtype: np.dtype[Any], lens: I64) -> NDArray[Any]:
    """Row group ``rg``'s ``name`` (one ranged read), its selected rows, checked against the token lengths."""
    fi, g = int(ix.frame["file_index"][rg]), int(ix.frame["row_group"][rg])
    st = ix.file(fi)
    where = ix.location(fi, g)
    # Through a footer of this row group alone: from the job index where it carries the column
    # (--columns), else from the column's chunk numbers read off the file's footer once.
    arr = read_other(ix, rg, name)
    if arr is None:
        raise _missing(ix, rg, name)
    if not _aligned_type(arr.type):
        msg = f"{where}: column {name!r} is {arr.type}, not a list of bool, integer or float; it cannot be aligned"
        raise ConfigError(msg)
    kept = ix.selected_rows(rg)
    rows: I64 = np.arange(len(arr), dtype=np.int64)
    if kept is not None and len(kept) != len(arr):
        arr = arr.take(pa.array(kept, pa.int64()))
        rows = kept
    clens = list_lengths(arr)
    nulls = arr.is_null().to_numpy(zero_copy_only=False) if arr.null_count else np.zeros(len(arr), bool)
    if len(clens) != len(lens):
        msg = f"{where}: column {name!r} decoded {len(clens)} rows, the token column {len(lens)}; the file is damaged"
        raise DataError(msg, file=st.location, row_group=g)
    bad = np.flatnonzero((clens != lens) | (nulls & (lens > 0)))
    if len(bad):
        i = int(bad[0])
        got = "null" if nulls[i] else f"{int(clens[i])} values"
        msg = (
            f"{where}, row {int(rows[i])}: column {name!r} holds {got} but the token list {int(lens[i])} tokens; "
            "an aligned column must hold exactly one value per token (a null row only where the tokens are null): "
            "fix the row or drop it"
        )
        raise DataError(msg, file=st.location, row_group=g, row=int(rows[i]))
    values = pc.list_flatten(arr)
    if values.null_count:
        flat = int(np.flatnonzero(values.is_null().to_numpy(zero_copy_only=False))[0])
        at = int(rows[int(np.searchsorted(np.cumsum(clens), flat, side="right"))])
        msg = f"{where}, row {at}: a null value inside column {name!r}; aligned values must be non-null"
        raise DataError(msg, file=st.location, row_group=g, row=at)
    boolean = pa.types.is_boolean(values.type)
    out = numpy_view(values.cast(pa.uint8())).view(np.bool_) if boolean else numpy_view(values)
    return out if out.dtype == dtype else out.astype(dtype)


def read_columns(cols: Columns, index: RowGroupIndex, rg: int, tokens: pa.Array) -> dict[str, NDArray[Any]]:
    """Each aligned column of row group ``rg``, as the values of its documents end to end (token order).

    ``tokens`` is the row group's token chunk as read (its documents are the rows the stream
    takes); a source that lacks a column gives its fill. In the batch's dtype of each column.
    """
    sub, local = index.part(rg)
    plan = cols.plans[id(sub)]
    lens = list_lengths(tokens)
    total = int(lens.sum())
    out: dict[str, NDArray[Any]] = {}
    for n in cols.names:
        how, dt = plan[n], cols.dtypes[n]
        if how is _READ:
            out[n] = _read_one(cast("Index", sub), local, n, dt, lens)
        else:
            out[n] = np.full(total, how, dt)
    return out


def aligned_chunks(arrays: list[pa.Array], values: list[NDArray[Any]], dtype: np.dtype[Any]) -> list[pa.Array]:
    """The column's values as list arrays over the same value positions as the token chunks ``arrays``.

    ``arrays`` are the packer's token chunks (whose documents' values are contiguous from
    ``offsets[0]``); ``values`` each chunk's column values end to end. The packer only reads
    ``.values`` at the tokens' indexes, so the lists share the tokens' offsets.
    """
    sd = storage_dtype(dtype)
    typ = pa.from_numpy_dtype(sd)
    out = []
    for arr, v in zip(arrays, values, strict=True):
        n = len(arr.values)
        if len(arr):
            off = numpy_view(arr.offsets)
            lo, hi = int(off[0]), int(off[-1])
        else:
            lo = hi = 0
        raw = v.view(sd) if v.dtype.itemsize == sd.itemsize else v.astype(dtype).view(sd)
        if lo == 0 and hi == n and len(raw) == n:
            full = raw
        else:
            full = np.zeros(n, sd)
            full[lo:hi] = raw
        out.append(
            pa.LargeListArray.from_arrays(arrow_ints(np.array([0, n], np.int64), pa.int64()), arrow_ints(full, typ))
        )
    return out


def unit_columns(u: PackedUnit, t: int) -> dict[str, NDArray[Any]]:
    """Step ``t``'s columns as views of the unit's blocks (``u.t0 <= t < u.t1``), in their dtypes."""
    return {n: c.block[t - u.t0].view(c.dtype) for n, c in u.columns.items()}


def assemble_columns(
    units: list[PackedUnit], step: int, rows: int, seq_len: int, pad: Columns | None = None
) -> dict[str, NDArray[Any]]:
    """Step ``step``'s columns from the windows it straddles: the tokens' blocks (:func:`packed.assemble`) again.

    The same sub-pieces in the same places, over each unit's column edges; copied into memory
    the step owns, as the tokens are. ``pad``: a finite run's last step (the run's columns),
    its rows padded after their last token with each column's fill (0 or False where none).
    """
    if pad is None and (not units or not units[0].columns):
        return {}
    copies = StepCopies.of(units, step, seq_len)
    dtypes = pad.dtypes if pad is not None else {n: c.dtype for n, c in units[0].columns.items()}
    out: dict[str, NDArray[Any]] = {}
    for n, dt in dtypes.items():
        sd = storage_dtype(dt)
        edges = [edge_values(u.columns[n].edges, sd) for u in units]
        if pad is None:
            out[n] = copies.copy(edges, np.empty((rows, seq_len), sd)).view(dt)
        else:
            fill = np.full((rows, seq_len), pad.fills.get(n) or 0, dt).view(sd)
            out[n] = copies.copy(edges, fill, full=False).view(dt)
    return out


__all__ += ["ColumnBlock", "aligned_chunks", "unit_columns"]
