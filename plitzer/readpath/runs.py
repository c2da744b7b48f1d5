"""One column of a run of row groups of one file, read through a footer made for the run alone.

A pass over the dataset (a selection's, a deduplication key's, an exclusion's) reads a chunk
of row groups of one file at a time, and the read path reads an aligned column a row group
at a time. Each :class:`ColumnRun` decodes its row groups through one footer that describes
them alone (:meth:`planner.catalog.datasetindex.Index.span_source`: a few hundred bytes a row group
from the index, the job index or the file's footer parsed once), and is dropped with the
run, so a pass over many files keeps no file's footer and no whole-file minimal footer
(320 KB each, parsed, on FineWeb-Edu's shape): docs/design.md, "Bytes a row group". A file that
reads its own row groups (``FileEntry.reader``: an Arrow IPC file's record batches) is read
through that reader instead, whichever index is over it (the dataset's, a selection's, a
deduplication's): the passes never ask which kind of index they have.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import pyarrow as pa

from planner.catalog.datasetindex import Index
from plitzer.readpath.read import check_list_of_integers, checked_tokens, own_column, read_decoded

__all__ = ["ColumnRun", "read_other"]


class ColumnRun:
    """``column`` of row groups ``[first, end)`` (of one file), read a row group at a time.

    ``also``: the other columns the pass reads, whose chunk numbers the same parse of the
    file's footer then gives (one parse a file for every column).
    """

    def __init__(self, ix: Index, first: int, end: int, column: str, also: Sequence[str] = ()) -> None:
        self.ix, self.first, self.column = ix, first, column
        self.own = ix.entries[int(ix.frame["file_index"][first])].reader is not None
        """Whether the file reads its own row groups (an Arrow IPC file's record batches: no footer)."""
        self.source = None if self.own else ix.span_source(first, end, column, also)
        self.token_ids = column == ix.column and "tokenizer" not in ix.config_fields()
        """Whether the column is the index's token ids (not a text source's text): a list of integers."""

    def read(self, rg: int) -> pa.Array | None:
        """Row group ``rg``'s column (every stored row); None where the file has no such column.

        A minimal footer holds no Arrow schema, so a type Arrow would have restored from it (a
        large string, a time zone) is cast to the first file's, as the real footer gives it.
        """
        src = self.source
        fi, g = int(self.ix.frame["file_index"][rg]), int(self.ix.frame["row_group"][rg])
        if self.own:
            got = own_column(self.ix, rg, self.column)
            if got is not None and self.token_ids:
                check_list_of_integers(got, self.ix.location(fi, g), file=self.ix.file(fi).location, row_group=g)
            return got
        if src is None:
            return None
        i = rg - self.first
        arr = read_decoded(self.ix.storage(fi), self.ix.file(fi), src.metadata, row_group=int(src.groups[i]),
                           column=self.column, offset=int(src.offsets[i]), length=int(src.lengths[i]),
                           where=self.ix.location(fi, g), what=repr(self.column))  # fmt: skip
        if self.token_ids:
            check_list_of_integers(arr, self.ix.location(fi, g), file=self.ix.file(fi).location, row_group=g)
            return arr
        return _as_first_files(self.ix, self.column, arr) if src.carried else arr

    def tokens(self, rg: int) -> pa.Array:
        """Row group ``rg`` of the token column (every stored row), checked and converted as ``read_chunk`` does."""
        arr = self.read(rg)
        assert arr is not None and self.token_ids  # the index's own column
        row = self.ix.frame.row(rg, named=True)
        return checked_tokens(self.ix, arr, row, self.ix.location(row["file_index"], row["row_group"]))


def read_other(ix: Index, rg: int, column: str) -> pa.Array | None:
    """Row group ``rg``'s ``column`` (every stored row), one ranged read; None where its file has no such column.

    A run of one row group (:class:`ColumnRun`): decoded through the job index alone where it
    carries the column (``plitzer index DATA --out JOB --columns ...``), else through the
    column's chunk numbers read off the file's footer once.
    """
    return ColumnRun(ix, rg, rg + 1, column).read(rg)


def _as_first_files(ix: Index, column: str, arr: pa.Array) -> pa.Array:
    """``arr`` cast to the type the first file's schema gives ``column``, where it can be."""
    schema = ix.schema()
    k = schema.get_field_index(column)
    if k >= 0 and arr.type != schema.field(k).type:
        with contextlib.suppress(pa.ArrowException):  # another file's own type: kept as decoded
            arr = arr.cast(schema.field(k).type)
    return arr
