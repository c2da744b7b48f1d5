"""The Index: a dataset's row-group index, and the footers its reads decode through.

An :class:`Index` is a Polars frame (a row a row group, ``INDEX_SCHEMA``), the token column,
the batch dtype, the fingerprint and the files' entries. Its reads decode each chunk through
a footer made from the index's rows (:mod:`planner.catalog.chunkmeta`): a file's minimal
footer of the token column (:meth:`Index.decoding_footer`), a run's footer of another column
(:meth:`Index.span_source`), and a file's whole parsed footer only where nothing less decodes
it (:meth:`Index.metadata`); each kept in a bounded cache (docs/design.md, "Bytes a row
group"). :func:`planner.catalog.dataset.index` builds it.
"""

from __future__ import annotations

import enum
import threading
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Self

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from numpy.typing import NDArray

from planner.bounded import Bounded
from planner.catalog import chunkmeta, footer
from planner.catalog.chunkmeta import ColumnChunks
from planner.catalog.column import TokenDtype, chunks_range
from planner.catalog.files import FileEntry
from planner.catalog.rowgroups import PARQUET, Capabilities, FrameTotals
from planner.errors import DataError, PerformanceWarning
from planner.stores.storage import FileStat, Storage

__all__ = ["FILE_FOOTERS_UP_TO", "FOOTERS_KEPT", "WHOLE_FOOTERS_KEPT", "Index", "Leaves", "SpanSource"]

FOOTERS_KEPT = 64
"""Minimal parsed footers of the token column an index keeps (about 800 B a row group each, parsed:
320 KB on FineWeb-Edu's shape): the files being read, about. Also the files whose other columns'
chunk numbers (:meth:`Index._compact_chunks`) are kept, a few bytes a row group each."""
FILE_FOOTERS_UP_TO = 4096
"""Row groups up to which the read path decodes through each file's minimal footer, kept.

A file's minimal footer costs about 11 us a row group to make and about 0.9 KB a row group
parsed; a row group's own about 70 us, made again at each read (and a decoder built for it). A
dataset of at most this many row groups has every file's footer made once and kept (at most
about 3.7 MB, whatever its files): 1 ns a token less on row groups of 180,000 tokens. Past it
a file's footer would be made for one row group of a shuffled window and dropped before its
next (4.6 ms for a file of 400), so each read makes its row group's own (docs/design.md,
"Bytes a row group")."""
WHOLE_FOOTERS_KEPT = 2
"""Whole parsed footers an index keeps: several MB each on files of many columns (3.7 MB on
FineWeb-Edu's shape). Only the first file's schema and a column of many leaves (a struct, a map)
need one now; every other column is decoded from its chunks' few numbers (:meth:`Index.span_source`).
A footer dropped is parsed again from this machine's footer cache, never fetched again."""
_UNKNOWN: Any = object()  # a column not asked of the file yet (None is an answer: the file lacks it)


class Leaves(enum.Enum):
    """What :meth:`Index._compact_chunks` says of a column that it gives no chunk numbers of."""

    MANY = "many"
    """A column of many leaves (a struct, a map): only the file's whole footer decodes it."""


class SpanSource(NamedTuple):
    """What reading one column of a run of row groups of one file needs (:meth:`Index.span_source`)."""

    metadata: pq.FileMetaData
    """A footer to decode them with: made for the run alone (a few KB), or the file's whole one."""
    groups: NDArray[np.int64]
    """Each row group's number in ``metadata``."""
    offsets: NDArray[np.int64]
    lengths: NDArray[np.int64]
    carried: bool
    """Whether ``metadata`` is a minimal one (it holds no Arrow schema: types as Parquet's)."""


@dataclass
class Index(FrameTotals):
    """The row-group index of a dataset.

    Attributes
    ----------
    frame : polars.DataFrame
        One row per row group (files in order, row groups in file order) with the
        columns of ``INDEX_SCHEMA``.
    column : str
        The token column.
    dtype : {"int32", "uint32"}
        The dtype of every batch and of every decoded chunk: uint32 when the
        column is uint32 or uint64, else int32 (whatever the files' widths).
    fingerprint : str
        sha256 of (relative path, rows, tokens) of every row group, in order; it
        does not depend on where the dataset lives.
    """

    frame: pl.DataFrame
    column: str
    dtype: TokenDtype
    fingerprint: str
    source: str
    _files: list[FileEntry] = field(repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _footers: Bounded[int, pq.FileMetaData] = field(default_factory=lambda: Bounded(WHOLE_FOOTERS_KEPT), repr=False)
    _chunks: Bounded[int, pq.FileMetaData] = field(default_factory=lambda: Bounded(FOOTERS_KEPT), repr=False)
    _compact: Bounded[tuple[int, str], ColumnChunks | Leaves | None] = field(
        default_factory=lambda: Bounded(FOOTERS_KEPT), repr=False
    )
    _wanted: set[str] = field(default_factory=set, repr=False)
    _fill: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _starts: NDArray[np.int64] | None = field(default=None, repr=False)

    @property
    def files(self) -> list[FileStat]:
        return [f.stat for f in self._files]

    @property
    def entries(self) -> list[FileEntry]:
        """Each file's entry (its stat, storage, column template, carried columns), in file order."""
        return self._files

    @classmethod
    def over(cls, of: Index, /, *, frame: pl.DataFrame, fingerprint: str, **more: Any) -> Self:
        """An index of ``cls`` over ``of``'s files, column and source, with its own frame and fingerprint.

        What a stage that changes which documents are in the stream (a selection, a
        deduplication) or a text source's tokenized view builds: ``more`` are its own fields.
        """
        return cls(
            frame=frame,
            column=of.column,
            dtype=of.dtype,
            fingerprint=fingerprint,
            source=of.source,
            _files=of._files,
            **more,
        )

    def storage(self, file_index: int) -> Storage:
        return self._files[file_index].storage

    def file(self, file_index: int) -> FileStat:
        return self._files[file_index].stat

    def metadata(self, file_index: int) -> pq.FileMetaData:
        """The file's whole parsed footer (every column): the cache's, else storage's.

        For the passes that read other columns than the index's (a selection's
        predicate, a schema's look-up); the read path needs only :meth:`decoding_footer`.
        The last :data:`WHOLE_FOOTERS_KEPT` are kept: a working set, whatever the file count.
        """
        got = self._footers.get(file_index)
        if got is not None:
            return got
        e = self._files[file_index]
        md = e.metadata
        if md is None:
            md = footer.parse(self._raw_footer(e), e.stat.location)
        self._footers.put(file_index, md)
        return md

    def chunk_metadata(self, file_index: int, *, keep: bool = True) -> pq.FileMetaData:
        """A footer for decoding the file's chunks of the index's column, made from the index alone.

        Row group ``g`` of it is row group ``g`` of the file, holding only the index's
        column (:func:`planner.catalog.chunkmeta.footer`): no footer is read. The last
        :data:`FOOTERS_KEPT` are kept (``keep=False``: not this one, for a pass that
        reads every file once and keeps its own few).
        """
        got = self._chunks.get(file_index)
        if got is not None:
            return got
        a, b = self._file_rows(file_index)
        md = self._token_footer(file_index, self.frame.slice(a, b - a))
        if keep:
            self._chunks.put(file_index, md)
        return md

    def chunk_footer(self, rg: int) -> pq.FileMetaData:
        """A footer for decoding row group ``rg``'s chunk of the index's column alone: its row group 0.

        What the read path decodes each chunk with (:func:`plitzer.readpath.read.read_column`),
        made from the index's row (a few dozen bytes, tens of microseconds) and kept by
        none. A footer of a file's every row group (:meth:`chunk_metadata`) parses into
        about 900 B a row group: the few files a first batch touched held 6-7 MB, and
        64 kept ones 23 MB (docs/design.md, "Bytes a row group").
        """
        return self._token_footer(int(self.frame["file_index"][rg]), self.frame.slice(rg, 1))

    def decoding_footer(self, rg: int) -> tuple[pq.FileMetaData, int]:
        """The footer the read path decodes row group ``rg``'s token chunk with, and its row group in it.

        The file's minimal footer (:meth:`chunk_metadata`, kept) for an index of at most
        :data:`FILE_FOOTERS_UP_TO` row groups, else the row group's own (:meth:`chunk_footer`,
        kept by none): the working set stays a few MB whatever the dataset's size.
        """
        if self.row_groups <= FILE_FOOTERS_UP_TO:
            return self.chunk_metadata(int(self.frame["file_index"][rg])), int(self.frame["row_group"][rg])
        return self.chunk_footer(rg), 0

    def schema(self) -> pa.Schema:
        """The first file's Arrow schema (names and types): the job index's where it carries it, else the footer's.

        What a predicate, a dedupe key or an aligned column is checked against.
        """
        carried = self._files[0].schema
        if carried is not None:
            return carried
        try:
            return footer.schema_of(self.metadata(0)).to_arrow_schema()
        except (pa.ArrowException, ValueError) as e:
            msg = f"{self.location(0)}: unreadable schema ({type(e).__name__}: {e}); the footer is damaged"
            raise DataError(msg) from e

    def carries(self, column: str) -> bool:
        """Whether the index decodes ``column`` without a footer (a job index written with ``--columns``)."""
        return bool(self._files) and all(column in e.columns for e in self._files)

    def span_source(self, first: int, end: int, column: str, also: Sequence[str] = ()) -> SpanSource | None:
        """What reading ``column`` of row groups ``[first, end)`` (of one file) needs; None: no such column.

        A pass that walks the dataset a run at a time (a selection's, a dedupe key's, an
        exclusion's) decodes each run through a footer made for those row groups alone, and the
        read path an aligned column's row group through one made for it: from the index (the
        token column), the job index (``--columns``; one that lacks the column says so once, a
        :class:`PerformanceWarning` naming the fix) or the file's footer read once
        (:meth:`_compact_chunks`), and lets it go with the run: it keeps no file's footer. A
        column of many leaves (a struct, a map) is read through the whole footer. ``also``: the
        other columns the pass reads, whose chunks the same read of the footer then gives.
        """
        fi = int(self.frame["file_index"][first])
        gs = self.frame["row_group"].slice(first, end - first).to_numpy().astype(np.int64)
        e = self._files[fi]
        if column == self.column:
            part = self.frame.slice(first, end - first)
            md = self._token_footer(fi, part)
            offsets = part["byte_offset"].to_numpy().astype(np.int64)
            lengths = part["byte_length"].to_numpy().astype(np.int64)
            return SpanSource(md, np.arange(len(gs), dtype=np.int64), offsets, lengths, True)
        chunks = e.columns.get(column)
        if chunks is None:
            if e.job_index is not None:
                _lacks(e.job_index, column)
            got = self._compact_chunks(fi, column, also)
            if got is None:
                return None
            if got is Leaves.MANY:
                whole = self.metadata(fi)
                spans = [chunks_range(whole, int(g), column, e.stat.size, self.location(fi, int(g))) for g in gs]
                if any(sp is None for sp in spans):
                    return None
                ranges = np.array(spans, np.int64).reshape(-1, 2)
                return SpanSource(whole, gs, ranges[:, 0].copy(), ranges[:, 1].copy(), False)
            chunks = got
        rows = self.frame["rows"].slice(first, end - first).to_numpy()
        offsets, lengths = chunks.byte_offset[gs], chunks.byte_length[gs]
        md = chunkmeta.footer(chunks.template, rows, offsets, lengths, chunks.codec[gs], chunks.chunk_values[gs])
        return SpanSource(md, np.arange(len(gs), dtype=np.int64), offsets, lengths, True)

    def _token_footer(self, fi: int, part: pl.DataFrame) -> pq.FileMetaData:
        """A footer of the token column's chunks in ``part`` (rows of the frame, of file ``fi``), alone.

        Row group ``i`` of it is ``part``'s row ``i``: made from the file's template and the
        rows' chunk numbers (:func:`planner.catalog.chunkmeta.footer`), no footer read.
        """
        template = self._files[fi].template
        if template is None:
            msg = f"{self.location(fi)}: the index holds no template of its column; build the index again"
            raise DataError(msg)
        cols = [part[c].to_numpy() for c in ("rows", "byte_offset", "byte_length", "codec", "chunk_values")]
        return chunkmeta.footer(template, *cols)

    def _compact_chunks(self, fi: int, column: str, also: Sequence[str] = ()) -> ColumnChunks | Leaves | None:
        """``column``'s chunks in file ``fi`` as a job index carries them, read off the file's footer once.

        None: the file has no such column; :attr:`Leaves.MANY`: it has many leaves (a struct or
        map), so only the whole footer decodes it. The footer is parsed once for every column asked of
        the index so far (a predicate's, a length column, an aligned column), and only those
        columns' few numbers a row group are kept, for the last :data:`FOOTERS_KEPT` files:
        a pass over many files holds bytes a row group, not whole footers (3.7 MB each on
        FineWeb-Edu's shape; docs/design.md, "Bytes a row group").
        """
        key = (fi, column)
        known = self._compact.get(key, _UNKNOWN)
        if known is not _UNKNOWN:
            return known
        with self._fill:  # one parse a file, whichever thread asks first
            known = self._compact.get(key, _UNKNOWN)
            if known is not _UNKNOWN:
                return known
            with self._lock:
                self._wanted.update((column, *(c for c in also if c != self.column)))
                wanted = sorted(self._wanted)
            e = self._files[fi]
            raw = self._raw_footer(e)
            where = e.stat.location
            md = footer.parse(raw, where, check=False)  # each column's histograms: footer.column_chunks
            pschema = footer.schema_of(md)
            got: dict[str, ColumnChunks | Leaves | None] = {}
            for c in wanted:
                leaves = footer.leaves_of(pschema, c)
                got[c] = (
                    None
                    if not leaves
                    else Leaves.MANY
                    if len(leaves) > 1
                    else footer.column_chunks(raw, md, c, e.stat.size, where)
                )
            del md, pschema
            self._compact.size = FOOTERS_KEPT * max(1, len(wanted))
            for c, v in got.items():
                self._compact.put((fi, c), v)
            return got[column]

    def _raw_footer(self, e: FileEntry) -> bytes:
        """The file's footer bytes: the listing's, the cache's, else storage's (fetched once across ranks)."""
        raw = e.raw if e.raw is not None else footer.cached(e.stat)
        if raw is None:
            # Ranks (threads or processes) sharing the cache, each running its share
            # of a selection pass, fetch a file's footer once: the first under the lock.
            with footer.fetch_lock(e.stat):
                raw = footer.cached(e.stat)
                if raw is None:
                    raw = footer.fetch(e.storage, e.stat)
                    footer.remember(e.stat, raw)
        return raw

    def _file_rows(self, file_index: int) -> tuple[int, int]:
        """The frame's rows of the file: ``[a, b)``."""
        with self._lock:
            if self._starts is None:
                fi = self.frame["file_index"].to_numpy()
                self._starts = np.searchsorted(fi, np.arange(len(self._files) + 1)).astype(np.int64)
            return int(self._starts[file_index]), int(self._starts[file_index + 1])

    def location(self, file_index: int, row_group: int | None = None) -> str:
        where = self._files[file_index].stat.location
        return where if row_group is None else f"{where}, row group {row_group}"

    # -- what a kind of index says of itself (docs/design.md, "A source is one file") --------

    @property
    def capabilities(self) -> Capabilities:
        """A dataset of Parquet token columns: every pass reads it (a kind that is not overrides this)."""
        return PARQUET

    @property
    def mixed(self) -> bool:
        return False

    @property
    def parts(self) -> list[Index]:
        """Itself: one source."""
        return [self]

    @property
    def names(self) -> list[str]:
        return [""]

    def part(self, row_group: int) -> tuple[Index, int]:
        """Itself and ``row_group``: one source holds every row group."""
        return self, row_group

    def unwrapped(self) -> Index:
        """Itself: no deduplication made it (``plitzer.selection.dedupe.DedupedIndex`` says otherwise)."""
        return self

    def config_fields(self) -> dict[str, Any]:
        """The checkpoint fields this kind of index adds (SPEC section 7): none for a dataset's.

        A selected index adds its predicate, a text index its tokenizer, a mixture its
        sources; the runtime gives the fields an index leaves out their defaults.
        """
        return {}

    def selected_rows(self, row_group: int) -> NDArray[np.int64] | None:
        """The rows of ``row_group`` the stream takes (numbers in it, ascending); None: every row."""
        return None

    def length_source(self, given: str | None) -> str | None:
        """The column that holds each row's token count, if any: ``given`` (a selected index has its own)."""
        return given


_warned: set[tuple[str, str]] = set()
_warned_lock = threading.Lock()


def _lacks(job_index: str, column: str) -> None:
    """Say once a process that ``job_index`` does not carry ``column``, so its footers are read for it."""
    with _warned_lock:
        if (job_index, column) in _warned:
            return
        _warned.add((job_index, column))
    msg = (
        f"job index {job_index} does not carry column {column!r}: the footers of the files are read for it (one "
        f"GET a file, as without a job index). To read none, write it with the column: plitzer index DATA --out "
        f"{job_index} --columns {column} (name every column where=, length_column=, columns= and dedupe= read)"
    )
    warnings.warn(msg, PerformanceWarning, stacklevel=3)
