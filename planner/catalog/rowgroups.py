"""What every row-group index is: the protocol that the plan, the runtime and the tools read.

The protocol is format-neutral: a frame of row groups (rows, tokens, a read's byte range), the
files and their storages, and what the index can do (:class:`Capabilities`). Footers, codecs and
a Parquet file's decoding belong to the Parquet kind (:class:`planner.catalog.datasetindex.Index`,
``plitzer.sources.parquet``); each other kind is one file of ``plitzer.sources`` (text, a
selection, an Arrow IPC dataset), and a mixture's :class:`planner.mixing.mixture.MixtureIndex`
holds its sources' side by side. Code that only reads an index takes a ``RowGroupIndex`` and
never asks which one it has: what differs between them (the rows a selection keeps, the
checkpoint fields a kind adds, its sources, what it can do) is a method of the protocol, so
callers ask the index (docs/design.md, "A source is one file").

This module is a leaf of planner: it imports nothing of planner but the storage types.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
import polars as pl
from numpy.typing import NDArray

from planner.catalog.column import TokenDtype
from planner.stores.storage import FileStat, Storage

__all__ = [
    "PARQUET",
    "SELECTED_COLUMNS",
    "Capabilities",
    "FrameTotals",
    "RowGroupIndex",
    "SelectedRows",
    "stream_counts",
    "with_selected",
]

SELECTED_COLUMNS: dict[str, str] = {
    "rows_selected": "rows",
    "tokens_selected": "tokens",
    "empty_docs_selected": "empty_docs",
}
"""A selected index's columns (``where=``, ``plitzer.selection.select``) and the stored counts they select from."""


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a kind of index can do: what the runtime asks instead of asking its type.

    ``kind`` names it in messages ("parquet", "text", "selection", "deduplication", "mixture",
    "arrow-ipc"). ``selectable``: ``where=`` may select its rows (a plain token dataset, Parquet or
    Arrow IPC, read column by column). ``other_columns``: its other columns can be read (``where=``'s,
    ``columns=``', ``dedupe=NAME``'s). ``column_runs``: a pass may read a run of its row groups'
    token column as stored (``plitzer.readpath.runs``: through one footer, or the files' own reader,
    ``planner.catalog.files.FileEntry.reader``). ``tokenizes``: its column is
    text, tokenized as it is read. ``deduplicated``: a deduplication pass made it (over ``unwrapped()``).
    """

    kind: str
    selectable: bool = False
    other_columns: bool = True
    column_runs: bool = False
    tokenizes: bool = False
    deduplicated: bool = False


PARQUET = Capabilities("parquet", selectable=True, other_columns=True, column_runs=True)
"""A dataset of Parquet token columns: every pass reads it."""


def stream_counts(frame: pl.DataFrame) -> tuple[pl.Series, pl.Series, pl.Series]:
    """Tokens, rows and empty documents each row group gives the stream: the selected ones where selected.

    A row-group index built with ``where=`` (``plitzer.selection.select``) carries
    ``rows_selected``, ``tokens_selected`` and ``empty_docs_selected`` beside the stored
    counts; the order, the cuts and the reads are made of those (SPEC section 10).
    """
    if "tokens_selected" in frame.columns:
        return frame["tokens_selected"], frame["rows_selected"], frame["empty_docs_selected"]
    return frame["tokens"], frame["rows"], frame["empty_docs"]


@runtime_checkable
class SelectedRows(Protocol):
    """An index whose row groups give the stream only some of their rows (``where=``, ``plitzer.selection.select``)."""

    def selected_rows(self, row_group: int) -> NDArray[np.int64] | None:
        """The rows of ``row_group`` (numbers in it, ascending) the stream takes; None: all of them."""
        ...


def with_selected(frame: pl.DataFrame) -> pl.DataFrame:
    """``frame`` with the selected columns (equal to the stored counts where nothing is selected)."""
    missing = [pl.col(base).alias(name) for name, base in SELECTED_COLUMNS.items() if name not in frame.columns]
    return frame.with_columns(missing) if missing else frame


class FrameTotals:
    """``tokens`` and ``row_groups`` of an index, from its ``frame`` (what a dataset's and a mixture's share)."""

    frame: pl.DataFrame

    @property
    def tokens(self) -> int:
        """Tokens of the stream (the selected ones where the index is selected)."""
        return int(stream_counts(self.frame)[0].sum())

    @property
    def row_groups(self) -> int:
        return self.frame.height


class RowGroupIndex(Protocol):
    """One row per row group (rows of ``frame``, the columns of ``planner.catalog.rowlists.INDEX_SCHEMA``).

    Row-group ids are rows of ``frame``; files are numbered by ``frame["file_index"]``. A row
    group is a kind's unit of one read (a Parquet row group, an Arrow IPC record batch):
    ``byte_offset`` and ``byte_length`` are that read's range in its file, whatever the format.
    """

    @property
    def capabilities(self) -> Capabilities:
        """What this kind of index can do (the runtime asks this, never the index's type)."""
        ...

    @property
    def mixed(self) -> bool:
        """Whether it holds several named sources (a mixture)."""
        ...

    @property
    def parts(self) -> Sequence[Any]:
        """Its sources' indexes in name order: itself alone where it is one source's."""
        ...

    @property
    def names(self) -> Sequence[str]:
        """Its sources' names, as ``parts`` (``[""]`` for one source's)."""
        ...

    def part(self, row_group: int) -> tuple[Any, int]:
        """The row-group index of the source holding ``row_group``, and its row there.

        One source's index answers itself and ``row_group``.
        """
        ...

    def unwrapped(self) -> Any:
        """The index a deduplication pass was made over (itself where none was)."""
        ...

    @property
    def frame(self) -> pl.DataFrame:
        """One row per row group: files in order, row groups in file order."""
        ...

    @property
    def column(self) -> str:
        """The token (or text) column."""
        ...

    @property
    def dtype(self) -> TokenDtype:
        """The dtype of every batch: int32, or uint32."""
        ...

    @property
    def fingerprint(self) -> str:
        """sha256 of the row groups' counts (and of whatever else decides them)."""
        ...

    @property
    def source(self) -> str:
        """Where the data lives, for messages."""
        ...

    @property
    def files(self) -> list[FileStat]: ...

    @property
    def tokens(self) -> int: ...

    @property
    def row_groups(self) -> int: ...

    def storage(self, file_index: int) -> Storage: ...

    def file(self, file_index: int) -> FileStat: ...

    def location(self, file_index: int, row_group: int | None = None) -> str:
        """The file (and row group) for messages: ``path`` or ``path, row group g``."""
        ...

    def selected_rows(self, row_group: int) -> NDArray[np.int64] | None:
        """The rows of ``row_group`` the stream takes (``where=``); None: every row (:class:`SelectedRows`)."""
        ...

    def config_fields(self) -> dict[str, Any]:
        """The checkpoint fields this kind of index adds: a selection's predicate, a text index's
        tokenizer, a mixture's sources (none for a dataset's); the runtime fills in the rest."""
        ...
