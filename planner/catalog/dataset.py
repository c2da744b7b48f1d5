"""The row-group index: one row per row group, built from Parquet footers alone.

``index(source)`` lists the ``*.parquet`` files below ``source`` (bytewise order of
their path relative to it), reads every footer concurrently, and returns an
:class:`Index`: a Polars frame with, per row group, its file, rows, exact token
count, and the byte range of the token column chunk (the one ranged read the
runtime will issue), plus the dataset fingerprint.

Token counts come from the footer: for a list column the leaf statistics'
``num_values`` is the number of non-null tokens, and the chunk's own
``num_values`` minus that is the number of empty (or null) documents. planner
reads metadata only: a row group whose footer has no statistics is counted by a
:class:`planner.catalog.footer.ChunkCounter` that reads it once (the runtime's, ``plitzer.readpath.read``).

The token column is a list or large_list of any integer type; batches are int32,
or uint32 for uint32 and uint64 data (``Index.dtype``). Where a token may not fit
(int64 or uint64 data whose footer min/max do not prove it), ``needs_check`` marks
the row group and decoding checks every value.

How a row group's tokens are counted is a :class:`Counting` step; this module owns
everything else (listing, footers, the frame, the fingerprint, the cache), so the
text index (``plitzer.text.source.TextCounting``, a tokenizer pass) shares it.

Footers are streamed: parsed, counted and dropped; what is kept of each is its rows and a
template (:mod:`planner.catalog.chunkmeta`), bytes a row group. The finished index is
cached under ``PLITZER_CACHE`` (default ``~/.cache/plitzer``), keyed by each file's
location, size and mtime (ETag on S3), never inside the dataset. A second call on an
unchanged dataset lists the files and reads no footer.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import os
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Protocol, Self

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from numpy.typing import NDArray

from planner.bounded import Bounded
from planner.catalog import chunkmeta, footer, payload, rowlists
from planner.catalog.chunkmeta import ColumnChunks, Template
from planner.catalog.column import TokenDtype, chunks_range, delivered_dtype
from planner.catalog.rowgroups import FrameTotals
from planner.catalog.rowlists import INDEX_SCHEMA, ROW_FIELDS
from planner.errors import ConfigError, DataError, PerformanceWarning
from planner.progress import progress_enabled
from planner.runtime import COUNT, runtime_pass
from planner.stores.backends import open_storages
from planner.stores.cache import cache_dir, digest, discard, read_entry, write_entry
from planner.stores.storage import FileStat, Storage

__all__ = [
    "INDEX_SCHEMA",
    "Leaves",
    "SpanSource",
    "Counted",
    "CountsFromFooters",
    "Counting",
    "FileEntry",
    "ROW_FIELDS",
    "FooterCounting",
    "Index",
    "LaidOut",
    "build_index",
    "fingerprint_of",
    "ensure_index",
    "index",
    "index_cache_path",
    "index_entries",
    "list_files",
    "scan_footers",
]

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
_INDEX_FORMAT = "5"  # 5: a row a file, its rows as lists (planner.catalog.rowlists); 4: codec, chunk_values


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
class FileEntry:
    stat: FileStat
    storage: Storage
    metadata: pq.FileMetaData | None = None
    """The parsed footer, only while the index is built (a counting step reads it)."""
    raw: bytes | None = None
    """The footer bytes where they came with the listing (a rank's exchange of a text source's footers)."""
    template: Template | None = None
    """What decoding the index's column needs of the footer (planner.catalog.chunkmeta): kept, the footer not."""
    columns: dict[str, ColumnChunks] = field(default_factory=dict)
    """The other columns a job index carries (``--columns``): the same, a column at a time."""
    schema: pa.Schema | None = None
    """The file's Arrow schema where a job index carries it (the first file's, with ``--columns``)."""
    job_index: str | None = None
    """The job index the entry was read from (for the message that it lacks a column), else None."""


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
        """What reading ``column`` of index rows ``[first, end)`` (row groups of one file) needs; None: no such column.

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

    # -- what a kind of index says of itself (docs/design.md, "One index protocol") --------

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


def fingerprint_of(frame: pl.DataFrame, extra: str = "") -> str:
    """sha256 of ``name\trows\ttokens\n`` for every row group, then ``extra``.

    The lines are formatted by Polars, a million row groups a second, in slices so
    that the text held at once stays small.
    """
    h = hashlib.sha256()
    step = 1 << 12  # Polars' formatting takes about 450 B a line while it runs: 2 MB a slice
    for a in range(0, frame.height, step):
        lines = frame.slice(a, step).select(pl.format("{}\t{}\t{}\n", "file", "rows", "tokens").str.join(""))
        h.update(lines.item().encode())
    h.update(extra.encode())
    return h.hexdigest()


@dataclass(frozen=True, slots=True)
class Counted:
    """One file's index rows as a counting step gives them.

    ``rows`` are :data:`planner.catalog.footer.Row` tuples; ``column`` and ``dtype`` are the
    column counted and the dtype of its batches; ``stored`` is the column's type in
    the file, for messages.
    """

    rows: list[footer.Row] | NDArray[np.int64]
    column: str
    dtype: TokenDtype
    stored: str


class Counting(Protocol):
    """How :func:`index` counts a row group's tokens (docs/design.md, "One index protocol, one builder, one dispatch").

    :func:`index` lists the files, loads their footers and builds, fingerprints and
    caches the frame; a counting step only counts. :class:`FooterCounting` reads the
    token column's footer statistics; ``plitzer.text.source.TextCounting`` tokenizes text.
    """

    def cache_key(self) -> tuple[object, ...] | None:
        """What besides the files decides the counts (None: the finished index is not cached)."""
        ...

    def scan(self, entry: FileEntry) -> Counted | None:
        """One file's rows from its footer (``entry.metadata`` is set), or None where :meth:`finish` counts them."""
        ...

    def finish(
        self, entries: Sequence[FileEntry], scanned: list[Counted | None], progress: bool | None
    ) -> list[Counted]:
        """Every file's rows, counting those that :meth:`scan` left as None."""
        ...

    def fingerprint_extra(self) -> str:
        """Hashed into the fingerprint after the row groups' counts ("" for footer counts)."""
        ...

    def checks_histograms(self) -> bool:
        """Whether :meth:`scan` checks the level histograms of the chunks it touches itself.

        Then :func:`index` parses footers without checking every column's (a footer's
        check costs 30 times its parse on files of many columns).
        """
        ...

    def wrap(self, ix: Index) -> Index:
        """The index to hand out for ``ix``: ``ix`` itself, or an index that reads it differently."""
        ...


class CountsFromFooters:
    """A counting step's defaults where :meth:`Counting.scan` counts every file from its footer alone.

    Nothing left to :meth:`~Counting.finish`, nothing added to the fingerprint, the index
    handed out as built (:class:`FooterCounting`; a text job's layout, ``plitzer.text.job``).
    """

    __slots__ = ()

    def finish(
        self, entries: Sequence[FileEntry], scanned: list[Counted | None], progress: bool | None
    ) -> list[Counted]:
        return [c for c in scanned if c is not None]

    def fingerprint_extra(self) -> str:
        return ""

    def wrap(self, ix: Index) -> Index:
        return ix


@dataclass(frozen=True, slots=True)
class FooterCounting(CountsFromFooters):
    """Counts from the token column's footer statistics (a row group without them is read once by ``count``)."""

    column: str | None = None
    count: footer.ChunkCounter | None = None

    def cache_key(self) -> tuple[object, ...]:
        return (self.column,)

    def scan(self, entry: FileEntry) -> Counted:
        assert entry.metadata is not None
        rows, name, dtype = footer.row_groups(
            entry.storage, entry.stat, entry.metadata, self.column, self.count, raw=entry.raw, checked=False
        )
        return Counted(rows=rows, column=name, dtype=delivered_dtype(dtype), stored=str(dtype))

    def checks_histograms(self) -> bool:
        return True


def list_files(
    source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], storage_options: Mapping[str, Any] | None
) -> tuple[list[FileEntry], str]:
    """The ``*.parquet`` files of ``source`` in index order, and the source for messages."""
    storages = open_storages(source, storage_options)
    entries: list[FileEntry] = []
    for i, s in enumerate(storages):
        for found in s.list_files():
            # Files of a list source are named by their source's position, so two
            # folders with the same file names stay distinct.
            st = (
                found
                if len(storages) == 1
                else FileStat(f"{i}/{found.name}", found.location, found.size, found.version)
            )
            entries.append(FileEntry(stat=st, storage=s))
    src = ", ".join(s.url for s in storages)
    if not entries:
        msg = f"source {src!r} holds no *.parquet file; check the path (folders are searched recursively)"
        raise ConfigError(msg)
    return entries, src


def _token_dtype(name: str) -> TokenDtype:
    if name == "int32":
        return "int32"
    if name == "uint32":
        return "uint32"
    raise KeyError(name)  # a damaged cache entry: rebuilt


def _from_cache(path: Path, counting: Counting, src: str, entries: list[FileEntry]) -> Index | None:
    raw = read_entry(path)
    if raw is None:
        return None
    try:
        table = payload.ParquetBytes(raw)  # a column at a time: the peak is the frame (planner.catalog.rowlists)
        meta = {k.encode(): v.encode() for k, v in table.metadata.items()}
        if table.column("name").to_pylist() != [e.stat.name for e in entries]:
            msg = "the cached files are not the listing's"  # a damaged entry
            raise ValueError(msg)
        frame, _ = rowlists.decode(table, [e.stat.name for e in entries])
        del table
        templates = chunkmeta.unpack_templates({k.decode(): v.decode() for k, v in meta.items()}, len(entries))
        for e, t in zip(entries, templates, strict=True):
            e.template = t
        return counting.wrap(
            Index(
                frame=frame,
                column=meta[b"column"].decode(),
                dtype=_token_dtype(meta[b"dtype"].decode()),
                fingerprint=meta[b"fingerprint"].decode(),
                source=src,
                _files=entries,
            )
        )
    except (OSError, KeyError, ValueError, pa.ArrowException, AssertionError) as e:
        discard(path, f"unreadable: {type(e).__name__}")  # rebuilt, never trusted
        return None


def _to_cache(
    path: Path, frame: pl.DataFrame, column: str, dtype: TokenDtype, fingerprint: str, entries: Sequence[FileEntry]
) -> None:
    meta = {"column": column, "dtype": dtype, "fingerprint": fingerprint}
    _, lists = rowlists.encode(frame, len(entries))
    table = pa.Table.from_arrays(
        [rowlists.strings([e.stat.name for e in entries]), *lists.values()], names=["name", *lists]
    ).replace_schema_metadata(meta | chunkmeta.pack_templates([e.template for e in entries]))
    buf = pa.BufferOutputStream(memory_pool=pa.system_memory_pool())
    pq.write_table(
        table,
        buf,
        compression="zstd",
        row_group_size=rowlists.files_a_group(len(entries), frame.height),
        memory_pool=pa.system_memory_pool(),
    )
    write_entry(path, buf.getvalue().to_pybytes())  # a folder that cannot be written costs speed, not rows


def scan_footers(
    entries: list[FileEntry],
    counting: Counting,
    progress: bool | None,
    threads: int,
    fetch: Callable[[FileEntry], bytes] | None = None,
) -> list[Counted | None]:
    """Every file's footer (read once, one ranged read) and what ``counting`` gets from it, concurrently.

    Streaming: a footer is parsed, counted and dropped in one task, so what is held is
    the files' rows and templates (bytes a row group), never every footer. A counting
    step that reads its footers again in :meth:`Counting.finish` (a text pass) keeps
    them until then. Footers are not cached on disk: the finished index is (``fetch``, one
    file's footer bytes, may read them from a cache of its own: a text source's job share).
    """
    own_check = counting.checks_histograms()

    # Fetches run on every thread (an object store's latency); parsing and counting on as
    # many as there are cores, so the parsed footers held at once (several MB each on
    # files of many columns) are bounded by the cores, not by the threads.
    parsing = threading.BoundedSemaphore(os.cpu_count() or 2)

    def load(entry: FileEntry) -> Counted | None:
        if entry.raw is not None:
            raw = entry.raw
        else:
            raw = footer.fetch(entry.storage, entry.stat) if fetch is None else fetch(entry)
        with parsing:
            md = footer.parse(raw, entry.stat.location, check=not own_check)
            entry.metadata, entry.raw = md, raw
            result = counting.scan(entry)
            if result is not None:
                entry.template = chunkmeta.template_of(raw, md, result.column, entry.stat.location)
                entry.metadata = entry.raw = None
            del md
        return result

    from tqdm import tqdm

    # No more fetches at once than the stores serve well (local disk: its cores), so that
    # the footers fetched and waiting for a core stay few.
    workers = min(threads, len(entries), max(e.storage.concurrency for e in entries))
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return list(
            tqdm(
                pool.map(load, entries),
                total=len(entries),
                desc="footers",
                unit="file",
                disable=not progress_enabled(progress, len(entries), 64),
                leave=False,
            )
        )


@dataclass(frozen=True, slots=True)
class LaidOut:
    """Every file's rows in frame order already (the shares of a job: :func:`planner.catalog.jobshare.take_counted`).

    ``per``: each file's row-group count; ``fields``: one int64 column a field of
    :data:`ROW_FIELDS`, which the frame takes over without a copy.
    """

    per: NDArray[np.int64]
    fields: list[NDArray[np.int64]]


def _frame(entries: list[FileEntry], counted: list[Counted], laid_out: LaidOut | None = None) -> pl.DataFrame:
    """The index frame of every file's rows; every file's column must give the same batches.

    The rows are ``counted``'s, or ``laid_out``'s (then ``counted`` gives each file's column alone).
    """
    first = counted[0]
    names = []
    for entry, c in zip(entries, counted, strict=True):
        # list and large_list, and integer widths, may differ between files as long
        # as the batches they give have the same dtype.
        if c.column != first.column or c.dtype != first.dtype:
            msg = (
                f"{entry.stat.location}: token column {c.column!r} of type {c.stored} (batches of "
                f"{c.dtype}) differs from {first.column!r} of type {first.stored} (batches of "
                f"{first.dtype}) in {entries[0].stat.location}; all files must agree: rewrite this file "
                "or pass column="
            )
            raise DataError(msg)
        names.append(entry.stat.name)
    if laid_out is None:
        per = np.asarray([len(c.rows) for c in counted], np.int64)
        fields = _lay_out(counted, int(per.sum()))
    else:
        per, fields = laid_out.per, laid_out.fields
    file_index = np.repeat(np.arange(len(entries), dtype=np.int64), per)
    cols: dict[str, Any] = {
        "file": pl.Series(names, dtype=pl.String).gather(file_index) if len(file_index) else [],
        "file_index": file_index,
        **{name: fields[k] for k, name in enumerate(ROW_FIELDS) if name != "needs_check"},
        "needs_check": fields[ROW_FIELDS.index("needs_check")].astype(bool),
    }
    return pl.DataFrame(cols).select(
        pl.col(k).cast(v) if k in cols else pl.lit(None, v).alias(k) for k, v in INDEX_SCHEMA.items()
    )


def _lay_out(counted: list[Counted], total: int) -> list[NDArray[np.int64]]:
    """Each field of every file's rows as one column, a file at a time, each file's rows let go once copied.

    ``counted`` keeps their columns and dtypes, not their rows: the peak is the frame and
    what is left of the rows, not the rows twice (docs/design.md, "Bytes a row group").
    """
    fields = [np.empty(total, np.int64) for _ in ROW_FIELDS]
    at = 0
    for i, c in enumerate(counted):
        rows = np.asarray(c.rows, dtype=np.int64).reshape(-1, len(ROW_FIELDS))
        for k, out in enumerate(fields):
            out[at : at + len(rows)] = rows[:, k]
        at += len(rows)
        counted[i] = dataclasses.replace(c, rows=_NO_ROWS)
        del rows
    return fields


_NO_ROWS = np.zeros((0, len(ROW_FIELDS)), np.int64)


def index(
    source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    column: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    *,
    progress: bool | None = None,
    threads: int = 32,
    count: footer.ChunkCounter | None = None,
    counting: Counting | None = None,
) -> Index:
    """Build (or load from the cache) the row-group index of ``source``.

    Parameters
    ----------
    source : str, PathLike or list of them
        A local folder (searched recursively for ``*.parquet``), one file,
        ``s3://bucket/prefix``, ``gs://bucket/prefix``, ``az://container/prefix`` (or
        ``abfs://``), or a list of these (files of each source in turn).
    column : str, optional
        The token column (a list or large_list of any integer type); by default
        the one integer-list column named ``input_ids``, ``tokens`` or
        ``token_ids``, else the one integer-list column.
    storage_options : dict, optional
        S3 settings: ``endpoint``, ``region``, ``key``, ``secret``, ``anon``.
    progress : bool, optional
        Show a progress bar while reading footers (default: when there are many
        files and stderr is a terminal).
    count : callable, optional
        Counts a row group whose footer lacks statistics by reading its token
        column once (:class:`planner.catalog.footer.ChunkCounter`): by default the
        runtime's, ``plitzer.readpath.read.count_chunk``, as installed
        (:mod:`planner.runtime`). planner itself reads metadata only: without that pass such
        a footer is a DataError saying what to pass.
    counting : Counting, optional
        How to count a row group's tokens; by default ``FooterCounting(column, count)``
        (footer statistics). ``plitzer.text.source`` passes a tokenizer pass.

    Examples
    --------
    An HF-style file: ``input_ids`` (list<int32>) beside an int8 ``attention_mask``.

    >>> import os, tempfile, planner, pyarrow as pa, pyarrow.parquet as pq
    >>> d = tempfile.mkdtemp()
    >>> ids = pa.array([[5, 6, 7], [8, 9]], pa.list_(pa.int32()))
    >>> mask = pa.array([[1, 1, 1], [1, 1]], pa.list_(pa.int8()))
    >>> pq.write_table(pa.table({"input_ids": ids, "attention_mask": mask}), os.path.join(d, "a.parquet"))
    >>> ix = planner.index(d)
    >>> ix.column, ix.dtype, ix.tokens
    ('input_ids', 'int32', 5)
    >>> ix.frame.columns[:5]
    ['file', 'file_index', 'row_group', 'rows', 'tokens']
    """
    if counting is None:  # plitzer's counter as installed (planner.runtime), unless given
        counting = FooterCounting(column, runtime_pass(count, COUNT))
    entries, src = list_files(source, storage_options)
    return index_entries(entries, src, counting, progress=progress, threads=threads)


def index_cache_path(entries: Sequence[FileEntry], counting: Counting) -> Path | None:
    """Where the finished index of these files is cached (None: not cached for this counting)."""
    extra = counting.cache_key()
    if extra is None:
        return None
    stats = [(e.stat.location, e.stat.size, e.stat.version, e.stat.name) for e in entries]
    return cache_dir() / "index" / f"{digest(_INDEX_FORMAT, *extra, *stats)}.parquet"


def index_entries(
    entries: list[FileEntry], src: str, counting: Counting, *, progress: bool | None = None, threads: int = 32
) -> Index:
    """The index of files already listed (:func:`index` after its listing; a job's shared listing)."""
    cached = index_cache_path(entries, counting)
    if cached is None:
        return _index_entries(entries, src, counting, progress, threads)
    hit = _from_cache(cached, counting, src, entries)
    if hit is not None:
        return hit
    # Processes that share the cache folder and open the dataset at once read its footers
    # once: the first builds the index under the lock, the others then find it cached.
    with footer.cache_lock(cached.stem):
        hit = _from_cache(cached, counting, src, entries)
        return hit if hit is not None else _index_entries(entries, src, counting, progress, threads)


def _index_entries(
    entries: list[FileEntry], src: str, counting: Counting, progress: bool | None, threads: int
) -> Index:
    counted = counting.finish(entries, scan_footers(entries, counting, progress, threads), progress)
    footer.give_back_memory()  # the footers' threads' heaps (footer.give_back_memory)
    for e, c in zip(entries, counted, strict=True):  # what finish counted kept its footer until now
        if e.metadata is not None and e.raw is not None:
            e.template = chunkmeta.template_of(e.raw, e.metadata, c.column, e.stat.location)
        e.metadata = e.raw = None
    return build_index(entries, src, counting, counted)


def build_index(
    entries: list[FileEntry], src: str, counting: Counting, counted: list[Counted], laid_out: LaidOut | None = None
) -> Index:
    """The index of files counted already (here, or by the ranks of a job), cached where ``counting`` is.

    ``laid_out``: the rows, where ``counted`` holds each file's column alone (:class:`LaidOut`).
    """
    frame = _frame(entries, counted, laid_out)
    del laid_out
    footer.give_back_memory()  # the rows it was built from, before the cache entry is written
    first = counted[0]
    fp = fingerprint_of(frame, counting.fingerprint_extra())
    cached = index_cache_path(entries, counting)
    if cached is not None:
        _to_cache(cached, frame, first.column, first.dtype, fp, entries)
    footer.give_back_memory()
    ix = Index(frame=frame, column=first.column, dtype=first.dtype, fingerprint=fp, source=src, _files=entries)
    return counting.wrap(ix)


def ensure_index(
    source: Index | str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    column: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    *,
    count: footer.ChunkCounter | None = None,
) -> Index:
    """``source`` if it is an :class:`Index` (of the same ``column``), else its index (``count``: as :func:`index`)."""
    if isinstance(source, Index):
        if column is not None and column != source.column:
            msg = f"column={column!r} differs from the index's token column {source.column!r}; pass the same column"
            raise ConfigError(msg)
        return source
    return index(source, column=column, storage_options=storage_options, count=count)
