"""The bins pass: each row group's bins under best-fit (SPEC section 15 rule 8), once a job, cached.

``n_g`` (a row group's bins at ``seq_len``) depends on its documents' lengths and ``L``
alone (:mod:`planner.rules.bestfit`), so the plan needs one pass over the lengths before
the first batch, like the selection pass: every row group's token chunk is read once
(through the index's own reader, so ``where=``, ``dedupe=``, ``exclude=`` and text
sources give the documents the stream holds), its lengths binned, and the counts kept
as the frame's ``bins`` column, which the plan cuts by (:func:`planner.rules.rule_of`).

The counts are cached under ``PLITZER_CACHE`` (``bins/``), keyed by the index's
fingerprint (which covers a selection's predicate and a text source's tokenizer), its
column, the files' identities (size and version) and ``L``: a second run, or another
rank on the same machine, reads no data. 8 bytes a row group, one array a source. A
packed row group whose bins differ from the count (the data changed under the cache)
is a ``DataError`` naming it (``plitzer.readpath.bins``).
"""

from __future__ import annotations

import copy
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import polars as pl

from planner.arraytypes import I64
from planner.catalog.rowgroups import RowGroupIndex
from planner.mixing.mixindex import MixtureIndex
from planner.rules import BINS
from planner.rules.bestfit import bins_of
from planner.stores.cache import cache_dir, digest, read_entry, write_entry
from plitzer.readpath.read import list_lengths, read_chunk

__all__ = ["bin_counts", "bin_index"]

VERSION = 1
"""The cache entries' format (and the rule's: a change of either makes new keys)."""


def bin_index(index: Any, seq_len: int, *, threads: int | None = None, progress: bool | None = None) -> Any:
    """``index`` with each row group's bins at ``seq_len`` in its frame (``bins``): what best-fit plans by.

    A mixture's sources are counted (and cached) one at a time, so a source shared by
    two mixtures is counted once.
    """
    if isinstance(index, MixtureIndex):
        counts = [bin_counts(ix, seq_len, threads=threads, progress=progress) for ix in index.parts]
        bins = np.concatenate(counts) if counts else np.zeros(0, np.int64)
    else:
        bins = bin_counts(index, seq_len, threads=threads, progress=progress)
    out = copy.copy(index)
    out.frame = index.frame.with_columns(pl.Series(BINS, bins, pl.Int64))
    return out


def _key(index: RowGroupIndex, seq_len: int) -> str:
    files = [(f.name, f.size, f.version) for f in index.files]
    return digest("bins", VERSION, index.fingerprint, index.column, seq_len, files)


def bin_counts(index: RowGroupIndex, seq_len: int, *, threads: int | None = None, progress: bool | None = None) -> I64:
    """``n_g`` of every row group of ``index`` at ``seq_len`` (the cache's, else counted and kept)."""
    path = cache_dir() / "bins" / f"{_key(index, seq_len)}.npy"
    got = read_entry(path)
    n = index.row_groups
    if got is not None and len(got) == 8 * n:
        return np.frombuffer(got, np.int64).copy()
    out = _count(index, seq_len, threads, progress)
    write_entry(path, out.tobytes())
    return out


def _count(index: RowGroupIndex, seq_len: int, threads: int | None, progress: bool | None) -> I64:
    """Read each row group's token chunk once (threads: decodes release the GIL), its lengths binned."""
    from tqdm import tqdm

    from planner.progress import progress_enabled
    from planner.threads import map_ahead

    n = index.row_groups

    def one(rg: int) -> int:
        return bins_of(list_lengths(read_chunk(index, rg)), seq_len)

    out = np.zeros(n, np.int64)
    with (
        ThreadPoolExecutor(max_workers=threads or 4, thread_name_prefix="plitzer-bins") as pool,
        tqdm(
            total=n,
            desc="binning documents",
            unit="row group",
            disable=not progress_enabled(progress, n, 64),
            leave=False,
        ) as bar,
    ):
        for rg, count in enumerate(map_ahead(pool, one, range(n))):
            out[rg] = count
            bar.update(1)
    return out
