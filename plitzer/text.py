"""Text in: tokenize inside the loader (SPEC section 9).

``text_index(source, text_column="text", tokenizer=...)`` gives a
:class:`TextIndex`: the row-group index of a dataset whose Parquet holds text,
not token ids. It is an ordinary :class:`planner.dataset.Index` (the plan tables,
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

import hashlib
import io
import itertools
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from numpy.typing import NDArray

from planner import footer
from planner.cache import cache_dir, digest, write_atomic
from planner.column import TokenDtype, token_range
from planner.dataset import INDEX_SCHEMA, FileEntry, Index
from planner.errors import ConfigError, DataError, one_line
from planner.storage import FileStat, open_storages
from plitzer.read import decode_column, read_column
from plitzer.tokenizer import TextTokenizer, load_tokenizer

__all__ = [
    "TEXT_DEFAULTS",
    "TextIndex",
    "TextTokenizer",
    "encode_texts",
    "is_text_type",
    "load_tokenizer",
    "text_config",
    "text_index",
    "texts_of",
    "tokens_array",
]

_CACHE_FORMAT = "1"
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
) -> pa.Array:
    """``list<dtype>`` of ``[bos] + ids + [eos]`` per document (``None``: left out)."""
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
        raise DataError(msg)
    values = pa.array(flat.astype(np.dtype(dtype)))
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), values)


# -- the index -----------------------------------------------------------------------


@dataclass
class TextIndex(Index):
    """An :class:`Index` of text whose row groups are tokenized as they are read."""

    tokenizer: TextTokenizer | None = None
    add_bos: bool = False
    add_eos: bool = True

    def read_text(self, rg: int) -> pa.Array:
        """Row group ``rg``'s text column (one ranged read)."""
        arr, row, where = read_column(self, rg, what="text")
        if len(arr) != row["rows"]:
            msg = f"{where}: decoded {len(arr)} rows, but the footer says {row['rows']}; the file is damaged"
            raise DataError(msg)
        return arr

    def read_tokens(self, rg: int) -> pa.Array:
        """Row group ``rg`` tokenized: what ``plitzer.read.read_chunk`` returns for it."""
        tok = self.tokenizer
        assert tok is not None
        row = self.frame.row(rg, named=True)
        where = self.location(row["file_index"], row["row_group"])
        ids = encode_texts(tok, texts_of(self.read_text(rg)))
        bos, eos = tok.special(self.add_bos, self.add_eos)
        arr = tokens_array(ids, bos=bos, eos=eos, dtype=self.dtype, where=where)
        got = len(arr.values)
        if got != row["tokens"]:
            msg = (
                f"{where}: tokenized to {got} tokens, but the counting pass counted {row['tokens']}: the "
                f"tokenizer is not deterministic, or its code changed under the same model; clear "
                f"{cache_dir() / 'text'} and start again"
            )
            raise DataError(msg)
        return arr


def text_config(ix: Index) -> dict[str, Any]:
    """The checkpoint fields for text: tokenizer identity and BOS/EOS policy (defaults for tokens)."""
    if isinstance(ix, TextIndex) and ix.tokenizer is not None:
        return {
            "tokenizer": f"{ix.tokenizer.kind}:{ix.tokenizer.identity}",
            "add_bos": ix.add_bos,
            "add_eos": ix.add_eos,
        }
    return dict(TEXT_DEFAULTS)


def _text_leaf(md: pq.FileMetaData, column: str, where: str) -> int:
    try:
        schema = md.schema.to_arrow_schema()
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
    leaf = [j for j in range(md.num_columns) if md.schema.column(j).path == column]
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


def _lengths_path(st: FileStat, column: str, tok: TextTokenizer) -> Path:
    return cache_dir() / "text" / f"{digest(_CACHE_FORMAT, st.location, st.size, st.version, column, tok.identity)}.npy"


def _load_lengths(path: Path, rows: int) -> NDArray[np.int64] | None:
    try:
        got: NDArray[np.int64] = np.load(io.BytesIO(path.read_bytes()), allow_pickle=False)
    except (OSError, ValueError):
        return None
    if got.ndim != 1 or len(got) != rows or got.dtype != np.int64:
        return None  # stale or damaged: counted again, never trusted
    return got


def text_index(
    source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    tokenizer: Any,
    text_column: str = "text",
    add_eos: bool = True,
    add_bos: bool = False,
    storage_options: Mapping[str, Any] | None = None,
    progress: bool | None = None,
    threads: int | None = None,
) -> TextIndex:
    """The index of a text dataset, counted (or read from the cache) with ``tokenizer``.

    Every row group not in the cache is read once and tokenized to count its
    tokens, on ``threads`` threads (default: every core), with a progress bar
    (default: when stderr is a terminal).
    """
    for name, v in (("add_eos", add_eos), ("add_bos", add_bos)):
        if not isinstance(v, bool):
            msg = f"{name}={v!r} must be True or False"
            raise ConfigError(msg)
    if not isinstance(text_column, str) or not text_column:
        msg = f"text_column={text_column!r} must name the text column, e.g. 'text'"
        raise ConfigError(msg)
    tok = load_tokenizer(tokenizer)
    bos, eos = tok.special(add_bos, add_eos)
    extra = (bos is not None) + (eos is not None)
    storages = open_storages(source, storage_options)
    entries: list[FileEntry] = []
    for i, s in enumerate(storages):
        for found in s.list_files():
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
    workers = threads or os.cpu_count() or 2

    def load(entry: FileEntry) -> pq.FileMetaData:
        raw = footer.cached(entry.stat)
        fresh = raw is None
        if raw is None:
            raw = footer.fetch(entry.storage, entry.stat)
        md = footer.parse(raw, entry.stat.location)
        entry.metadata = md
        if fresh:
            footer.remember(entry.stat, raw)
        return md

    with ThreadPoolExecutor(max_workers=max(1, min(32, len(entries)))) as pool:
        mds = list(pool.map(load, entries))

    leaves = [_text_leaf(md, text_column, e.stat.location) for e, md in zip(entries, mds, strict=True)]
    lengths: list[NDArray[np.int64] | None] = []
    todo: list[tuple[int, int]] = []
    for fi, (e, md) in enumerate(zip(entries, mds, strict=True)):
        got = _load_lengths(_lengths_path(e.stat, text_column, tok), md.num_rows)
        lengths.append(got)
        if got is None:
            todo.extend((fi, g) for g in range(md.num_row_groups) if md.row_group(g).num_rows > 0)

    if todo:
        parts: dict[tuple[int, int], NDArray[np.int64]] = {}

        def count(fg: tuple[int, int]) -> tuple[tuple[int, int], NDArray[np.int64]]:
            fi, g = fg
            e, md = entries[fi], mds[fi]
            where = f"{e.stat.location}, row group {g}"
            start, length = _chunk_range(md, g, leaves[fi], e.stat.size, where)
            data = e.storage.read_range(e.stat, start, length)
            arr = decode_column(
                data,
                offset=start,
                file_size=e.stat.size,
                metadata=md,
                row_group=g,
                column=text_column,
                where=where,
                what="text",
            )
            ids = encode_texts(tok, texts_of(arr))
            return fg, np.fromiter((len(x) for x in ids), np.int64, len(ids))

        from tqdm import tqdm

        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="plitzer-count") as pool:
            bar = tqdm(
                pool.map(count, todo),
                total=len(todo),
                desc="counting tokens",
                unit="row group",
                disable=None if progress is None else not progress,
                leave=False,
            )
            parts.update(bar)
        for fi, (e, md) in enumerate(zip(entries, mds, strict=True)):
            if lengths[fi] is not None:
                continue
            per = [
                parts[(fi, g)] if md.row_group(g).num_rows > 0 else np.zeros(0, np.int64)
                for g in range(md.num_row_groups)
            ]
            got = np.concatenate(per) if per else np.zeros(0, np.int64)
            lengths[fi] = got
            try:
                buf = io.BytesIO()
                np.save(buf, got, allow_pickle=False)
                write_atomic(_lengths_path(e.stat, text_column, tok), buf.getvalue())
            except OSError:
                pass  # a read-only cache costs time, not correctness

    cols: dict[str, list[Any]] = {k: [] for k in INDEX_SCHEMA}
    for fi, (e, md) in enumerate(zip(entries, mds, strict=True)):
        per_file = lengths[fi]
        assert per_file is not None
        at = 0
        for g in range(md.num_row_groups):
            n = md.row_group(g).num_rows
            raw = per_file[at : at + n]
            at += n
            start, length = _chunk_range(md, g, leaves[fi], e.stat.size, f"{e.stat.location}, row group {g}")
            cols["file"].append(e.stat.name)
            cols["file_index"].append(fi)
            cols["row_group"].append(g)
            cols["rows"].append(n)
            cols["tokens"].append(int(raw.sum()) + extra * n)
            cols["empty_docs"].append(int(((raw + extra) == 0).sum()))
            cols["byte_offset"].append(start)
            cols["byte_length"].append(length)
            cols["file_size"].append(e.stat.size)
            cols["needs_check"].append(False)
    frame = pl.DataFrame(cols, schema=INDEX_SCHEMA)
    h = hashlib.sha256()
    for name, rows, tokens in zip(
        frame["file"].to_list(), frame["rows"].to_list(), frame["tokens"].to_list(), strict=True
    ):
        h.update(f"{name}\t{rows}\t{tokens}\n".encode())
    h.update(f"text\t{tok.kind}:{tok.identity}\tbos={add_bos}\teos={add_eos}\n".encode())
    return TextIndex(
        frame=frame,
        column=text_column,
        dtype=tok.dtype,
        fingerprint=h.hexdigest(),
        source=src,
        _files=entries,
        tokenizer=tok,
        add_bos=add_bos,
        add_eos=add_eos,
    )
