"""Text in: tokenize inside the loader (docs/design.md, "Text in").

``text_index(source, text_column="text", tokenizer=...)`` gives a
:class:`TextIndex`: the row-group index of a dataset whose Parquet holds text,
not token ids. It is an ordinary :class:`planner.catalog.datasetindex.Index` (the plan tables,
``explain`` and the audit take it as they take any index) whose rows count the
tokens each row group *will* have once tokenized, and whose ``read_tokens(rg)``
reads the row group's text column chunk (one ranged read, as for tokens) and
tokenizes it into the same ``list<int32>`` (``list<uint32>`` for vocabularies over
2**31 ids) that a pre-tokenized column would give.

A document's tokens are ``[BOS] + ids + [EOS]``: ``ids`` are the tokenizer's ids
for the text with no special tokens of its own, BOS only when ``add_bos``, EOS only
when ``add_eos`` (the default). A null or empty text has no ids: with ``add_eos``
it is the one-token document ``[EOS]``, without BOS or EOS an empty document.

Text columns are ``string``, ``large_string``, ``binary`` or ``large_binary``.
Bytes that are not valid UTF-8 (binary columns, or string columns written by
tools that do not check) are decoded as ``bytes.decode("utf-8", "replace")``: each
invalid sequence becomes U+FFFD, never an error, in the loader and in
``plitzer tokenize`` alike.

Counting: the planner needs each row group's token count before the first batch.
The counting pass tokenizes every row group once, in a thread pool over every
core (both ``tokenizers``' batch encode and SentencePiece's encode release the
GIL), with a progress bar, and caches each file's per-document id counts under
``PLITZER_CACHE``, keyed by the file's location, size and mtime (ETag on S3),
the text column and the tokenizer's identity. Counts exclude BOS and EOS, so the
same cache serves any BOS/EOS policy.

The tokenizer's identity is the sha256 of its serialized form (the model file's
bytes, the ``tokenizers`` JSON) and of the BOS and EOS ids; a callable carries a
``name`` that the user vouches for (see :func:`load_tokenizer`). Identity and
policy are part of the dataset fingerprint and of the checkpoint's configuration
(fields ``tokenizer``, ``add_bos``, ``add_eos``), so a checkpoint never resumes
under another tokenizer or another policy.
"""

from __future__ import annotations

import io
import itertools
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from numpy.typing import NDArray

from planner.catalog import footer
from planner.catalog.chunkmeta import codec_of
from planner.catalog.column import TokenDtype, token_range
from planner.catalog.counting import Counted
from planner.catalog.datasetindex import Index
from planner.catalog.files import FileEntry, list_files
from planner.catalog.rowgroups import Capabilities, RowGroupIndex
from planner.errors import ConfigError, DamagedChunkError, DataError, TokenizerChangedError, TokenRangeError, one_line
from planner.parameters import DEFAULT_TEXT, TextSettings
from planner.stores.cache import cache_dir, digest, discard, read_entry, write_entry
from planner.stores.storage import FileStat
from plitzer.readpath.read import read_column
from plitzer.text.tokenizer import TextTokenizer, load_tokenizer

__all__ = [
    "TEXT_DEFAULTS",
    "Counts",
    "TextCounting",
    "TextIndex",
    "TextTokenizer",
    "encode_texts",
    "is_text_type",
    "load_tokenizer",
    "load_counts",
    "save_counts",
    "text_config",
    "text_counting",
    "text_index",
    "index_text",
    "texts_of",
    "tokens_array",
]

_CACHE_FORMAT = "3"  # 3: per row group (ids, documents without ids); 2: per document
TEXT_DEFAULTS: dict[str, Any] = {"tokenizer": "", "add_bos": False, "add_eos": False}
"""The checkpoint fields of a token (not text) source."""

# -- documents -------------------------------------------------------------------


def is_text_type(t: pa.DataType) -> bool:
    return bool(
        pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t)
    )


def texts_of(arr: pa.Array) -> list[str | None]:
    """The column's documents as Python strings (invalid UTF-8 replaced by U+FFFD)."""
    if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type):
        try:
            out: list[str | None] = arr.to_pylist()
            return out
        except UnicodeDecodeError:
            arr = arr.view(pa.binary() if pa.types.is_string(arr.type) else pa.large_binary())
    return [None if b is None else b.decode("utf-8", "replace") for b in arr.to_pylist()]


def encode_texts(tok: TextTokenizer, texts: Sequence[str | None]) -> list[list[int]]:
    """Each document's ids (no specials); a null or empty text has none."""
    keep = [i for i, t in enumerate(texts) if t]
    out: list[list[int]] = [[] for _ in texts]
    if keep:
        got = tok.encode([texts[i] for i in keep])  # type: ignore[misc]
        if len(got) != len(keep):
            msg = f"the {tok.kind} tokenizer returned {len(got)} documents for {len(keep)} texts"
            raise DataError(msg)
        for i, ids in zip(keep, got, strict=True):
            out[i] = ids
    return out


def tokens_array(
    ids: Sequence[Sequence[int]],
    *,
    bos: int | None,
    eos: int | None,
    dtype: TokenDtype,
    where: str,
    file: str | None = None,
    row_group: int | None = None,
) -> pa.Array:
    """``list<dtype>`` of ``[bos] + ids + [eos]`` per document (``None``: left out).

    ``file`` and ``row_group`` go into a :class:`TokenRangeError`'s attributes.
    """
    n = len(ids)
    extra = (bos is not None) + (eos is not None)
    raw = np.fromiter((len(x) for x in ids), np.int64, n)
    lens = raw + extra
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(lens, out=offsets[1:])
    total = int(offsets[-1])
    lo, hi = token_range(dtype)
    if total > 2**31 - 1:
        msg = f"{where}: {total} tokens do not fit one list<{dtype}> chunk; split the row group"
        raise DataError(msg)
    flat = np.empty(total, np.int64)
    body = np.fromiter(itertools.chain.from_iterable(ids), np.int64, int(raw.sum()))
    if extra:
        mask = np.ones(total, bool)
        if bos is not None:
            flat[offsets[:-1]] = bos
            mask[offsets[:-1]] = False
        if eos is not None:
            flat[offsets[1:] - 1] = eos
            mask[offsets[1:] - 1] = False
        flat[mask] = body
    else:
        flat = body
    if total and (int(flat.min()) < lo or int(flat.max()) > hi):
        bad = int(np.flatnonzero((flat < lo) | (flat > hi))[0])
        row = int(np.searchsorted(offsets, bad, side="right")) - 1
        msg = f"{where}, row {row}: token {int(flat[bad])} does not fit {dtype}; the tokenizer gave an id out of range"
        raise TokenRangeError(msg, file=file, row_group=row_group, row=row)
    values = pa.array(flat.astype(np.dtype(dtype)))
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), values)


# -- the index -----------------------------------------------------------------------


TEXT = Capabilities("text", selectable=False, other_columns=True, column_runs=False, tokenizes=True)
"""A text source's: tokenized as it is read, so no pass reads its token column through a footer."""


@dataclass
class TextIndex(Index):
    """An :class:`Index` of text whose row groups are tokenized as they are read."""

    tokenizer: TextTokenizer | None = None
    add_bos: bool = False
    add_eos: bool = True

    @property
    def capabilities(self) -> Capabilities:
        return TEXT

    def config_fields(self) -> dict[str, Any]:
        """The checkpoint fields for text: the tokenizer's identity and the BOS/EOS policy."""
        if self.tokenizer is None:
            return {}
        tokenizer = f"{self.tokenizer.kind}:{self.tokenizer.identity}"
        return {"tokenizer": tokenizer, "add_bos": self.add_bos, "add_eos": self.add_eos}

    def length_source(self, given: str | None) -> str | None:
        """None: a text source's lengths come from tokenizing it, never from a column."""
        return None

    def read_text(self, rg: int) -> pa.Array:
        """Row group ``rg``'s text column (one ranged read)."""
        arr, row, where = read_column(self, rg, what="text")
        if len(arr) != row["rows"]:
            msg = f"{where}: decoded {len(arr)} rows, but the footer says {row['rows']}; the file is damaged"
            raise DamagedChunkError(msg, file=self.file(row["file_index"]).location, row_group=row["row_group"])
        return arr

    def read_tokens(self, rg: int) -> pa.Array:
        """Row group ``rg`` tokenized: what ``plitzer.readpath.read.read_chunk`` returns for it."""
        tok = self.tokenizer
        assert tok is not None
        row = self.frame.row(rg, named=True)
        where = self.location(row["file_index"], row["row_group"])
        ids = encode_texts(tok, texts_of(self.read_text(rg)))
        bos, eos = tok.special(self.add_bos, self.add_eos)
        file = self.file(row["file_index"]).location
        arr = tokens_array(ids, bos=bos, eos=eos, dtype=self.dtype, where=where, file=file, row_group=row["row_group"])
        got = len(arr.values)
        if got != row["tokens"]:
            msg = (
                f"{where}: tokenized to {got} tokens, but the counting pass counted {row['tokens']}: the "
                f"tokenizer is not deterministic, or its code changed under the same model; clear "
                f"{cache_dir() / 'text'} and start again"
            )
            raise TokenizerChangedError(msg, file=file, row_group=row["row_group"])
        return arr


def text_config(ix: RowGroupIndex) -> dict[str, Any]:
    """The checkpoint fields for text: tokenizer identity and BOS/EOS policy (defaults for tokens)."""
    fields = ix.config_fields()
    return {k: fields.get(k, v) for k, v in TEXT_DEFAULTS.items()}


def _text_leaf(md: pq.FileMetaData, column: str, where: str) -> int:
    pschema = footer.schema_of(md)  # not md.schema: a reference cycle held every footer (footer.schema_of)
    try:
        schema = pschema.to_arrow_schema()
    except (pa.ArrowException, ValueError) as e:
        msg = f"{where}: unreadable schema ({one_line(e)}); the footer is damaged"
        raise DataError(msg) from e
    if column not in schema.names:
        texts = [f.name for f in schema if is_text_type(f.type)]
        msg = f"{where}: no text column {column!r}; text columns here: {texts or 'none'}; pass text_column="
        raise ConfigError(msg)
    t = schema.field(column).type
    if not is_text_type(t):
        msg = f"{where}: column {column!r} is {t}, not text (string, large_string, binary or large_binary)"
        raise DataError(msg)
    leaf = [j for j in range(md.num_columns) if pschema.column(j).path == column]
    if len(leaf) != 1:
        msg = f"{where}: text column {column!r} is not a flat column"
        raise DataError(msg)
    return leaf[0]


def _chunk_range(md: pq.FileMetaData, g: int, j: int, size: int, where: str) -> tuple[int, int]:
    cc = md.row_group(g).column(j)
    start = cc.data_page_offset
    if cc.has_dictionary_page and cc.dictionary_page_offset is not None and cc.dictionary_page_offset > 0:
        start = min(start, cc.dictionary_page_offset)
    length = cc.total_compressed_size
    if md.row_group(g).num_rows > 0 and (start < 4 or length < 0 or start + length > size):
        msg = f"{where}: the text column chunk [{start}, {start + length}) lies outside the file; the footer is damaged"
        raise DataError(msg)
    return start, length


Counts = NDArray[np.int64]
"""A file's counts: one ``(ids, documents without ids)`` row per row group (BOS and EOS excluded)."""


def _counts_path(st: FileStat, column: str, tok: TextTokenizer) -> Path:
    return cache_dir() / "text" / f"{digest(_CACHE_FORMAT, st.location, st.size, st.version, column, tok.identity)}.npy"


def load_counts(path: Path, row_groups: int) -> Counts | None:
    raw = read_entry(path)
    if raw is None:
        return None
    try:
        got: Counts = np.load(io.BytesIO(raw), allow_pickle=False)
    except (OSError, ValueError) as e:
        discard(path, f"unreadable: {type(e).__name__}")
        return None
    if got.shape != (row_groups, 2) or got.dtype != np.int64:
        return None  # stale or damaged: counted again, never trusted
    return got


def save_counts(path: Path, counts: Counts) -> None:
    """Cache a file's counts at ``path`` (what :meth:`TextCounting.counts_of` finds later)."""
    buf = io.BytesIO()
    np.save(buf, counts, allow_pickle=False)
    write_entry(path, buf.getvalue())  # a folder that cannot be written costs time, not rows


@dataclass(frozen=True)
class TextCounting:
    """How a text source is counted: its tokenizer, text column and BOS/EOS policy.

    Every row group not in the cache is read once and tokenized (the pass is
    :mod:`plitzer.text.job`'s, in one process or split across a job's ranks):
    per-document id counts are cached per file under ``PLITZER_CACHE``, keyed by the
    file, the text column and the tokenizer's identity, so the finished index itself is
    not cached.
    """

    tokenizer: TextTokenizer
    """``text.tokenizer`` loaded."""
    text: TextSettings = DEFAULT_TEXT
    threads: int | None = None

    @property
    def text_column(self) -> str:
        return self.text.text_column

    @property
    def add_bos(self) -> bool:
        return self.text.add_bos

    @property
    def add_eos(self) -> bool:
        return self.text.add_eos

    @property
    def extra_ids(self) -> int:
        """Ids a document gets besides its text's: a BOS, an EOS, both or none."""
        bos, eos = self.tokenizer.special(self.add_bos, self.add_eos)
        return (bos is not None) + (eos is not None)

    def fingerprint_extra(self) -> str:
        tok = self.tokenizer
        return f"text\t{tok.kind}:{tok.identity}\tbos={self.add_bos}\teos={self.add_eos}\n"

    def wrap(self, ix: Index) -> TextIndex:
        return TextIndex.over(
            ix,
            frame=ix.frame,
            fingerprint=ix.fingerprint,
            tokenizer=self.tokenizer,
            add_bos=self.add_bos,
            add_eos=self.add_eos,
        )

    def counted(self, e: FileEntry, counts: Counts) -> Counted:
        """File ``e``'s rows (its footer parsed) from its counts (ids, documents without ids, a row group)."""
        md = e.metadata
        assert md is not None
        leaf = _text_leaf(md, self.text_column, e.stat.location)
        extra = self.extra_ids
        # One int64 row a row group, filled in place (as the token column's rows are): a
        # tuple of Python ints a row group cost ~300 B each until the file's rows were
        # concatenated.
        rows = np.empty((md.num_row_groups, footer.ROW_FIELDS), np.int64)
        for g in range(md.num_row_groups):
            rg = md.row_group(g)
            n = rg.num_rows
            where = f"{e.stat.location}, row group {g}"
            start, length = _chunk_range(md, g, leaf, e.stat.size, where)
            cc = rg.column(leaf)
            rows[g] = (g, n, 0, 0, start, length, False, codec_of(cc.compression, where), cc.num_values)
        # A document is empty when it has no ids and no BOS/EOS is added.
        rows[:, 2] = counts[:, 0] + extra * rows[:, 1]
        rows[:, 3] = counts[:, 1] if extra == 0 else 0
        return Counted(rows=rows, column=self.text_column, dtype=self.tokenizer.dtype, stored="text")

    def path(self, st: FileStat) -> Path:
        """Where this machine caches the counts of file ``st``."""
        return _counts_path(st, self.text_column, self.tokenizer)

    def counts_of(self, entry: FileEntry) -> Counts | None:
        """The counts of ``entry`` (its footer parsed) in this machine's cache, else None."""
        md = entry.metadata
        assert md is not None
        return load_counts(self.path(entry.stat), md.num_row_groups)


def text_counting(text: TextSettings, threads: int | None = None) -> TextCounting:
    """The counting step of a text source, its settings checked."""
    for name in ("add_eos", "add_bos"):
        v = getattr(text, name)
        if not isinstance(v, bool):
            msg = f"{name}={v!r} must be True or False"
            raise ConfigError(msg)
    column = text.text_column
    if not isinstance(column, str) or not column:
        msg = f"text_column={column!r} must name the text column, e.g. 'text'"
        raise ConfigError(msg)
    return TextCounting(load_tokenizer(text.tokenizer), text, threads)


def text_index(
    source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    tokenizer: Any,
    text_column: str = DEFAULT_TEXT.text_column,
    add_eos: bool = DEFAULT_TEXT.add_eos,
    add_bos: bool = DEFAULT_TEXT.add_bos,
    storage_options: Mapping[str, Any] | None = None,
    progress: bool | None = None,
    threads: int | None = None,
) -> TextIndex:
    """The index of a text dataset, counted (or read from the cache) with ``tokenizer``.

    Every row group not in the cache is read once and tokenized to count its
    tokens, on ``threads`` threads (default: every core), with a progress bar
    (default: when stderr is a terminal). The pass is :func:`plitzer.text.job.text_pass`'s
    (a job's, as a group of one): no footer is held but those being parsed.
    """
    text = TextSettings(tokenizer=tokenizer, text_column=text_column, add_eos=add_eos, add_bos=add_bos)
    return index_text(source, text, storage_options=storage_options, progress=progress, threads=threads)


def index_text(
    source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    text: TextSettings,
    *,
    storage_options: Mapping[str, Any] | None = None,
    progress: bool | None = None,
    threads: int | None = None,
) -> TextIndex:
    """:func:`text_index` of the settings ``text`` (what the loader and the job index call)."""
    from plitzer.text import job  # which builds on this module

    entries, src = list_files(source, storage_options)
    return job.text_pass(entries, src, text_counting(text, threads), progress)
