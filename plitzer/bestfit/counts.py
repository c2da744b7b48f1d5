"""The bins pass: each row group's bins under best-fit (SPEC section 15 rule 8), once a job, cached.

``n_g`` (a row group's bins at ``seq_len``) depends on its documents' lengths and ``L``
alone (:mod:`planner.rules.bestfit`), so the plan needs one pass over the lengths before
the first batch, like the selection pass: every row group's token chunk is read once
(through the index's own reader, so ``where=``, ``dedupe=``, ``exclude=`` and text
sources give the documents the stream holds), its lengths binned, and the counts kept
as the frame's ``bins`` column (8 bytes a row group for the run's ``seq_len``), which the
plan cuts by under a rule of bins (``plan.packing``, :attr:`planner.rules.Rule.needs_counts`).

The counts are cached under ``PLITZER_CACHE`` (``bins/``) in chunks of :data:`CHUNK` row
groups, keyed by the index's fingerprint (which covers a selection's predicate and a text
source's tokenizer), its column, the files' identities (name, size and version), ``L`` and
the chunk: a second run reads no data. Ranks split the pass as the selection pass does:
rank ``r`` of ``world`` starts at its ``1/world`` of the chunks and goes on round the rest,
skipping each chunk another rank has written meanwhile (a cache folder on a shared file
system), so ranks that start together each count about ``1/world`` of it and none waits.
:func:`bins_on_ray` runs the chunks as Ray tasks (``plitzer index DATA --packing best-fit
--seq-len L --engine ray``). A packed row group whose bins differ from the count (the data
changed under the cache) is a ``DataError`` naming it (:mod:`plitzer.bestfit.rows`).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from planner.arraytypes import I64
from planner.catalog.rowgroups import RowGroupIndex
from planner.rules import BEST_FIT, BINS, Binned, binned_rule
from planner.stores.cache import cache_dir, digest, read_entry, write_entry
from plitzer.readpath.rayrun import run_tasks
from plitzer.readpath.read import list_lengths, read_chunk
from plitzer.selection.evaluate import SelectionPass

__all__ = [
    "CHUNK",
    "BinSpec",
    "bin_counts",
    "bin_index",
    "bins_on_ray",
    "count_chunk",
    "document_lengths",
    "plan_bins",
]

VERSION = 1
"""The cache entries' format (and the rule's: a change of either makes new keys)."""
CHUNK = 256
"""Row groups a cache entry (and a Ray task) counts."""


@dataclass(frozen=True, slots=True)
class BinSpec:
    """What the bins are counted for: the tokens of a row, the binned rule, where lengths come from.

    ``length_column``: a column of each row's token count, read instead of decoding the tokens.
    """

    seq_len: int
    packing: str = BEST_FIT
    length_column: str | None = None

    @property
    def rule(self) -> Binned:
        return binned_rule(self.packing)


def plan_bins(ix: Any, seq_len: int, *, length_column: str | None = None, packing: str = BEST_FIT) -> Any:
    """The bins pass as ``planner.plan`` takes it (``planner.passes``' ``bins``): one process, all of it."""
    return bin_index(ix, BinSpec(seq_len, packing, length_column))


def bin_index(
    ix: Any, spec: BinSpec, *, threads: int | None = None, split: tuple[int, int] = (0, 1), progress: bool | None = None
) -> Any:
    """``ix`` with each row group's bins (``spec``) in its frame (``bins``): what a binned rule plans by.

    A mixture's sources are counted (and cached) one at a time, so a source shared by two
    mixtures is counted once. ``split``: this process's ``(rank, world)``, where it starts (above).
    """
    parts = ix.parts
    counts = [bin_counts(part, spec, threads=threads, split=split, progress=progress) for part in parts]
    out = copy.copy(ix)
    out.frame = ix.frame.with_columns(pl.Series(BINS, np.concatenate(counts), pl.Int64))
    return out


def _path(ix: RowGroupIndex, spec: BinSpec, first: int, end: int) -> Path:
    files = [(f.name, f.size, f.version) for f in ix.files]
    key = digest("bins", VERSION, spec.packing, ix.fingerprint, ix.column, spec.seq_len, files, first, end)
    return cache_dir() / "bins" / f"{key}.npy"


def _chunks(n: int) -> list[tuple[int, int]]:
    return [(a, min(a + CHUNK, n)) for a in range(0, n, CHUNK)]


def _load(path: Path, n: int) -> I64 | None:
    got = read_entry(path)
    return np.frombuffer(got, np.int64).copy() if got is not None and len(got) == 8 * n else None


def document_lengths(ix: Any, rg: int, length_column: str | None = None) -> I64:
    """Row group ``rg``'s documents' token lengths, in stream order (the rows a selection keeps).

    From ``length_column`` where the index takes one (a column of each row's token count,
    its sum checked against the footer's: ``plitzer.selection.evaluate.SelectionPass``), so
    the token column is not decoded; else the token lists' lengths as the index reads them
    (a text source tokenized). What the bins pass and ``locate`` read.
    """
    column = ix.length_source(length_column) if hasattr(ix, "length_source") else length_column
    if column is None:
        return list_lengths(read_chunk(ix, rg))
    lengths = SelectionPass(ix=ix, where="", columns=[], length_column=column).lengths(rg)
    kept = ix.selected_rows(rg)
    return lengths if kept is None else lengths[kept]


def count_chunk(ix: RowGroupIndex, spec: BinSpec, first: int, end: int) -> I64:
    """``n_g`` of row groups ``[first, end)``: each one's lengths read once (:func:`document_lengths`), binned."""
    rule = spec.rule
    got = [rule.bins_of(document_lengths(ix, g, spec.length_column), spec.seq_len) for g in range(first, end)]
    return np.array(got, np.int64)


def bin_counts(
    ix: RowGroupIndex,
    spec: BinSpec,
    *,
    threads: int | None = None,
    split: tuple[int, int] = (0, 1),
    progress: bool | None = None,
) -> I64:
    """``n_g`` of every row group of ``ix``: the cache's chunks, the rest counted and kept.

    Chunks are counted on ``threads`` (a decode releases the GIL; binning is a loop per
    item, about half a microsecond each), from this rank's share on (``split``: its rank
    and the world), round the rest.
    """
    from tqdm import tqdm

    from planner.progress import progress_enabled
    from planner.threads import map_ahead

    chunks = _chunks(ix.row_groups)
    rank, world = split
    start = rank * len(chunks) // max(world, 1)
    order = chunks[start:] + chunks[:start]
    out = np.zeros(ix.row_groups, np.int64)  # filled chunk by chunk: no second copy at the end

    def one(c: tuple[int, int]) -> tuple[int, I64]:
        path = _path(ix, spec, *c)
        got = _load(path, c[1] - c[0])  # another rank's, written meanwhile
        if got is None:
            got = count_chunk(ix, spec, *c)
            write_entry(path, got.tobytes())
        return c[0], got

    todo = []
    for c in order:
        got = _load(_path(ix, spec, *c), c[1] - c[0])
        if got is None:
            todo.append(c)
        else:
            out[c[0] : c[1]] = got
    n = sum(b - a for a, b in todo)
    hide = not progress_enabled(progress, n, 64)
    with (
        ThreadPoolExecutor(max_workers=threads or 4, thread_name_prefix="plitzer-bins") as pool,
        tqdm(total=n, desc="binning documents", unit="row group", disable=hide, leave=False) as bar,
    ):
        for first, got in map_ahead(pool, one, todo):
            out[first : first + len(got)] = got
            bar.update(len(got))
    return out


def _ray_chunk(
    source: Any, column: str | None, storage_options: Mapping[str, Any] | None, spec: BinSpec, chunk: tuple[int, int]
) -> tuple[int, I64]:
    """A Ray task: the bins of one chunk, the index opened where the task runs (footers from its cache)."""
    from planner import index

    ix = index(source, column=column, storage_options=storage_options, progress=False)
    return chunk[0], count_chunk(ix, spec, *chunk)


def bins_on_ray(
    ix: RowGroupIndex,
    spec: BinSpec,
    *,
    source: Any,
    storage_options: Mapping[str, Any] | None = None,
    address: str | None = None,
    progress: bool | None = True,
) -> int:
    """Run the bins pass of a dataset's index ``ix`` as Ray tasks (one a chunk not cached); returns the chunks run.

    Each task reads its chunk where it runs; the counts come back to this process, which
    writes them into its cache, so a loader that follows (or a job whose ranks share this
    cache folder) finds the whole pass. For a dataset of pre-tokenized Parquet (a selection
    or a text source counts on the ranks).
    """
    chunks = _chunks(ix.row_groups)
    todo = [c for c in chunks if _load(_path(ix, spec, *c), c[1] - c[0]) is None]
    ends = dict(todo)
    calls = [(source, ix.column, storage_options, spec, c) for c in todo]

    def got(result: tuple[int, I64]) -> None:
        first, counts = result
        write_entry(_path(ix, spec, first, ends[first]), counts.tobytes())

    return run_tasks(_ray_chunk, calls, got, address=address, progress=progress, desc="binning (ray)")
