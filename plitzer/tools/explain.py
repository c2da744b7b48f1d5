"""What step K held: the documents of each sequence, without replaying the run.

The lane cuts deal the run's tokens to lanes like cards (docs/glossary.md, "Cut"):
lane ``k``'s token ``P`` is token ``P * B + k`` of the run. At step ``K`` lane ``k`` is
at token ``K * seq_len`` of its stream, so its window is the one holding run token
``K * seq_len * B + k``, and its offset in that window's slice follows from the
windows' token counts (the footers) alone::

    run:     | window 0 (T_0 tokens) | window 1 (T_1) | ... |   epoch after epoch
    lane k:  received ceil((R - k) / B) tokens once the run has R tokens

:func:`explain` places a :class:`~plitzer.Loader` there with
:meth:`~plitzer.Loader.seek` (which reads only the windows those positions need)
and returns the next batch's provenance. The document pass below (one int and one
hash per row, read once and cached) serves the audit's length and duplicate tables.

>>> import plitzer, plitzer.synth, tempfile
>>> d = tempfile.mkdtemp(); _ = plitzer.synth.write(d, tokens=60_000, seed=1, docs_per_row_group=50)
>>> cfg = dict(seed=0, lanes=4, window=2, seq_len=64)
>>> with plitzer.Loader(d, **cfg) as ld:
...     run = [ld.next_batch().documents() for _ in range(40)]
>>> got = plitzer.explain(d, 37, **cfg)
>>> got.drop("step").equals(run[37].drop("batch_row"))
True
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any, Unpack

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from planner.api import PathSource, open_index
from planner.arraytypes import I64, U64
from planner.bounded import Bounded
from planner.catalog.payload import read_table_bytes
from planner.catalog.rowgroups import RowGroupIndex, stream_counts
from planner.errors import ConfigError, DataError
from planner.hashing import mix_array
from planner.order.epoch import check_int
from planner.parameters import document
from planner.stores.cache import cache_dir, digest, discard, read_entry, write_entry
from plitzer.loader import Loader
from plitzer.readpath.read import list_lengths, read_chunk
from plitzer.selection.select import source_rows
from plitzer.sources import opening
from plitzer.state.settings import Keywords, LoaderSettings
from plitzer.state.settings import Source as AnySource

__all__ = ["document_lengths", "document_pass", "document_table", "explain"]

Source = RowGroupIndex | PathSource

_FORMAT = "2"  # 2: entries with a length and checksum (planner.stores.cache)
_memo: Bounded[str, tuple[I64, U64]] = Bounded(4)


# -- the one pass over the data: document lengths and hashes -------------------------


def _hash_documents(arr: pa.Array) -> tuple[I64, U64]:
    """Length and a 64-bit content hash of every document of one decoded chunk.

    The hash is ``mix(sum_i mix(token_i | i << 32) ^ mix(length))`` (mod 2**64), i
    the token's position in its document: integer arithmetic only, so it is the
    same on every machine and version (a cached table stays valid).
    """
    lengths = list_lengths(arr)
    values = arr.flatten().to_numpy(zero_copy_only=False)
    tok = values.view(np.uint32).astype(np.uint64) if values.dtype.itemsize == 4 else values.astype(np.uint64)
    starts = np.cumsum(lengths) - lengths
    pos = np.arange(len(tok), dtype=np.int64) - np.repeat(starts, lengths)
    h = mix_array(tok | (pos.astype(np.uint64) << np.uint64(32)))
    sums = np.zeros(len(lengths), np.uint64)
    full = lengths > 0
    if full.any():
        sums[full] = np.add.reduceat(h, starts[full])
    return lengths, mix_array(sums ^ mix_array(lengths.astype(np.uint64)))


def _cache_path(ix: RowGroupIndex) -> Path:
    key = digest(_FORMAT, ix.column, ix.fingerprint, *[(f.location, f.size, f.version) for f in ix.files])
    return cache_dir() / "documents" / f"{key}.parquet"


def document_pass(ix: RowGroupIndex, *, progress: bool | None = None, threads: int | None = None) -> tuple[I64, U64]:
    """Lengths and hashes of every document, in index order: memory, cache, else one pass."""
    path = _cache_path(ix)
    got = _memo.get(str(path))
    if got is not None:
        return got
    rows = stream_counts(ix.frame)[1].to_numpy().astype(np.int64)  # the selected rows where selected
    result: tuple[I64, U64] | None = None
    raw = read_entry(path)
    if raw is not None:
        try:
            t = read_table_bytes(raw)
            lengths = t["length"].to_numpy().astype(np.int64)
            hashes = t["hash"].to_numpy().astype(np.uint64)
            if len(lengths) == int(rows.sum()):
                result = (lengths, hashes)
        except (OSError, KeyError, pa.ArrowException) as e:
            discard(path, f"unreadable: {type(e).__name__}")  # rebuilt, never trusted
    if result is None:
        result = _read_documents(ix, progress=progress, threads=threads)
        buf = pa.BufferOutputStream()
        pq.write_table(pa.table({"length": result[0], "hash": result[1]}), buf)
        write_entry(path, buf.getvalue().to_pybytes())  # a folder that cannot be written costs time, not rows
    _memo.put(str(path), result)
    return result


def _read_documents(ix: RowGroupIndex, *, progress: bool | None, threads: int | None) -> tuple[I64, U64]:
    from tqdm import tqdm

    from planner.progress import progress_enabled

    f = ix.frame
    where = [ix.location(fi, g) for fi, g in zip(f["file_index"].to_list(), f["row_group"].to_list(), strict=True)]
    f_tokens, f_rows, _ = stream_counts(f)  # a selected index's reads give its selected rows

    def one(rg: int) -> tuple[I64, U64]:
        if int(f_rows[rg]) == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.uint64)
        arr = read_chunk(ix, rg)
        lengths, hashes = _hash_documents(arr)
        if len(lengths) != int(f_rows[rg]) or int(lengths.sum()) != int(f_tokens[rg]):
            msg = (
                f"{where[rg]}: decoded {len(lengths)} documents of {int(lengths.sum())} tokens but the "
                f"index says {f_rows[rg]} of {f_tokens[rg]}; the file changed or is damaged: re-index it"
            )
            raise DataError(msg)
        return lengths, hashes

    workers = threads or min(32, (os.cpu_count() or 2) * 2)
    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="plitzer-lengths") as pool:
        parts = list(
            tqdm(
                pool.map(one, range(f.height)),
                total=f.height,
                desc="document lengths",
                unit="rg",
                disable=not progress_enabled(progress, f.height),
                leave=False,
            )
        )
    if not parts:
        return np.zeros(0, np.int64), np.zeros(0, np.uint64)
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def document_lengths(
    source: Source,
    *,
    column: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    progress: bool | None = None,
    threads: int | None = None,
) -> I64:
    """The token count of every document (row), files and row groups in index order.

    The first call reads every row group's token column once (with a progress bar
    on a terminal) and caches the lengths, with a content hash per document, under
    ``PLITZER_CACHE``; later calls read the cache.

    >>> import plitzer, plitzer.synth, tempfile
    >>> d = tempfile.mkdtemp(); _ = plitzer.synth.write(d, tokens=20_000, seed=0)
    >>> n = document_lengths(d)
    >>> int(n.sum()) == plitzer.index(d).tokens
    True
    """
    ix = open_index(source, column=column, storage_options=storage_options, opening=opening())
    return document_pass(ix, progress=progress, threads=threads)[0]


def document_table(
    source: Source,
    *,
    column: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    progress: bool | None = None,
    threads: int | None = None,
) -> pl.DataFrame:
    """One row per document: file, file_index, row_group, row, doc, length, hash.

    ``doc`` is the document's running number over the dataset; ``hash`` is a 64-bit
    content hash (equal documents have equal hashes), for finding duplicates.
    """
    ix = open_index(source, column=column, storage_options=storage_options, opening=opening())
    lengths, hashes = document_pass(ix, progress=progress, threads=threads)
    f = ix.frame
    rows = stream_counts(f)[1].to_numpy().astype(np.int64)
    rg = np.repeat(np.arange(f.height, dtype=np.int64), rows)
    base = np.cumsum(rows) - rows
    doc = np.arange(len(lengths), dtype=np.int64)
    return pl.DataFrame(
        {
            "file": f["file"].gather(rg),
            "file_index": f["file_index"].gather(rg),
            "row_group": f["row_group"].gather(rg),
            "row": source_rows(ix, rg, doc - base[rg]),
            "doc": doc,
            "length": lengths,
            "hash": pl.Series(hashes, dtype=pl.UInt64),
        }
    )


_EXPLAIN_OWN = ("step", "lane", "progress")  # its own keywords, besides the run's parameters


@document()
def explain(
    source: AnySource,
    step: int,
    lane: int | None = None,
    *,
    progress: bool | None = None,
    **settings: Unpack[Keywords],
) -> pl.DataFrame:
    """The source pieces of every sequence of global step ``step``.

    Parameters
    ----------
    <source>
    step : int
        Global step (from 0 over the whole run).
    lane : int, optional
        Only this lane (a row of the global batch); by default every lane of
        ``rank`` (every lane when ``world`` is 1).
    <settings>
    progress : bool, optional
        Unused (kept for compatibility): explaining a step reads no document pass.

    Returns
    -------
    polars.DataFrame
        One row per document piece: step, lane, start (in the sequence), length,
        file, row_group, row, token_offset (in the document), epoch, window;
        the same as ``batch.documents()`` of that step in a real run.

    Only the windows that hold the lanes' positions are read; nothing is replayed.
    The settings are the run's, the keywords of :class:`plitzer.Loader`; ``world`` and
    ``rank`` only choose which lanes to explain: the answer does not depend on them.
    """
    step = check_int("step", step, 0, "steps count from 0")
    s = LoaderSettings.of(caller="plitzer.explain", own=_EXPLAIN_OWN, **settings)
    only = None
    if lane is not None:
        lane = check_int("lane", lane, 0, "lanes count from 0")
        lanes = s.stages.at(step).lanes  # the layout stage in force at the step
        if lane >= lanes:
            msg = f"lane={lane} is out of range for lanes={lanes} (at step {step}); use a lane in 0..{lanes - 1}"
            raise ConfigError(msg)
        if s.stages.staged:  # other stages' lanes need not divide into one lane a rank: pick the lane after
            s, only = replace(s, plan=replace(s.plan, world=1), rank=0), lane
        else:
            # One lane is the one lane of rank `lane` in a world of `lanes` ranks: the
            # loader then reads only the row groups that can hold that lane's documents.
            s = replace(s, plan=replace(s.plan, world=s.lanes), rank=lane)
    with Loader.from_settings(source, s) as loader:
        loader.seek(step)
        docs = loader.next_batch().documents()
    if only is not None:
        docs = docs.filter(pl.col("lane") == only)
    return docs.drop("batch_row").select(pl.lit(step, pl.Int64).alias("step"), pl.all())
