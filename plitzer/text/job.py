"""A text source's counting pass once a job: split across its ranks, or carried by a job index.

The counting pass (:class:`plitzer.text.source.TextCounting`) tokenizes every row group
once to learn its token count. Two ways to pay it once for a whole job instead of on
every rank (docs/design.md, "One index per job"):

- **The ranks of a process group split it** (run by :mod:`plitzer.state.share`), in
  three phases, and no rank holds a footer but the few it is parsing (bytes a row group,
  as a token source's job share; docs/design.md, "Bytes a row group"):

  1. :func:`layout_share`: rank ``r`` reads the footers of files ``r, r + world, ...``
     (or takes them from its machine's footer cache) into compact rows: the text
     column's chunks, and the counts its cache holds (-1 where none). The ranks
     all-gather the rows; :func:`take_layout` makes them one index, no footer in it.
  2. :func:`count_share`: the row groups no cache counted (:func:`to_count`, in listing
     order: files in order, row groups in file order) are cut into ``world``
     contiguous runs; rank ``r`` tokenizes run ``r``, reading each chunk through the
     index's minimal footers. The ranks all-gather their runs.
  3. :func:`take_counts`: every rank fills in every row group's counts, saves each
     file's counts in its cache, and gets the same text index one process would.
- **A job index carries them** (:func:`write_text_index`, :func:`load_text_index`):
  ``plitzer index DATA --tokenizer T --out URL`` writes the counts (ids and documents
  without ids per row group, before BOS and EOS, so any ``add_eos``/``add_bos`` policy
  reads the same index) with the tokenizer's identity and the text column; a loader of
  another tokenizer or text column is refused, as is a stale index.

>>> runs(5, 2)
[range(0, 2), range(2, 5)]
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import polars as pl
from numpy.typing import NDArray

from planner.catalog import jobindex, jobshare
from planner.catalog.counting import Counted, CountsFromFooters
from planner.catalog.datasetindex import Index
from planner.catalog.files import FileEntry
from planner.catalog.frame import fingerprint_of
from planner.errors import ConfigError
from planner.parameters import DEFAULT_TEXT, TextSettings
from planner.progress import progress_enabled
from planner.threads import map_ahead
from plitzer.readpath.read import read_column
from plitzer.text.source import (
    TextCounting,
    TextIndex,
    encode_texts,
    index_text,
    load_counts,
    save_counts,
    text_counting,
    texts_of,
)

__all__ = [
    "Share",
    "check_text_index",
    "count_share",
    "identity",
    "layout_share",
    "load_text_index",
    "runs",
    "take_counts",
    "take_layout",
    "text_pass",
    "to_count",
    "write_text_index",
]

Share = tuple[NDArray[np.int64], NDArray[np.int64]]
"""A rank's share of the pass: the row groups' ordinals in the listing, and their ``(ids, documents without ids)``."""


def identity(counting: TextCounting) -> str:
    """The tokenizer's identity as the checkpoint and the job index record it (``kind:sha256``)."""
    return f"{counting.tokenizer.kind}:{counting.tokenizer.identity}"


def runs(row_groups: int, world: int) -> list[range]:
    """The contiguous run of row-group ordinals each rank counts (as the selection pass splits its chunks)."""
    return [range(r * row_groups // world, (r + 1) * row_groups // world) for r in range(world)]


@dataclass(frozen=True)
class _Layout(CountsFromFooters):
    """A file's rows from its footer (the text column's chunks) and the counts this machine's cache holds.

    The rows' ``tokens`` and ``empty_docs`` are the counts under no BOS/EOS (ids, documents
    without ids), as the job index stores them; -1 where the cache holds none (to count).
    Not cached as an index: the counts are cached per file (:class:`TextCounting`).
    """

    counting: TextCounting

    def cache_key(self) -> None:
        return None

    def scan(self, entry: FileEntry) -> Counted:
        md = entry.metadata
        assert md is not None
        got = self.counting.counts_of(entry)
        counts = np.full((md.num_row_groups, 2), -1, np.int64) if got is None else got
        counting = self.counting
        return replace(counting, text=replace(counting.text, add_bos=False, add_eos=False)).counted(entry, counts)

    def checks_histograms(self) -> bool:
        return False


def layout_share(
    entries: Sequence[FileEntry],
    counting: TextCounting,
    rank: int,
    world: int,
    threads: int = 32,
    cache_footers: bool = True,
) -> jobshare.CountedShare:
    """Phase 1 of a job's pass: files ``rank, rank + world, ...``, their footers read once, as compact
    rows (bytes a row group) with the counts the cache holds.

    ``cache_footers``: keep each footer read in this machine's footer cache, so that a
    restart of the job here reads none from storage (a job's ranks; one process reads them
    again, as the token path does).
    """
    fetch = jobshare.cached_footer if cache_footers else None
    return jobshare.count_share(
        entries, counting.text_column, rank, world, threads, counting=_Layout(counting), fetch=fetch
    )


def text_pass(entries: list[FileEntry], src: str, counting: TextCounting, progress: bool | None = None) -> TextIndex:
    """One process's pass over listed files: the three phases as a group of one."""
    layout = take_layout(entries, src, counting, [layout_share(entries, counting, 0, 1, cache_footers=False)])
    return take_counts(layout, counting, [count_share(layout, counting, 0, 1, progress)])


def take_layout(
    entries: list[FileEntry], src: str, counting: TextCounting, shares: Sequence[jobshare.CountedShare]
) -> Index:
    """Every rank's phase-1 rows as one index of the text column (no footer held): the rows to count are -1."""
    return jobshare.take_counted(entries, src, counting.text_column, shares, _Layout(counting))


def to_count(layout: Index) -> NDArray[np.int64]:
    """The row groups of ``layout`` (:func:`take_layout`) that no rank's cache counted, in listing order."""
    return np.flatnonzero(layout.frame["tokens"].to_numpy() < 0).astype(np.int64)


def count_share(layout: Index, counting: TextCounting, rank: int, world: int, progress: bool | None = None) -> Share:
    """Phase 2: rank ``rank``'s contiguous run of :func:`to_count`, tokenized (one ranged read a row group)."""
    todo = to_count(layout)
    run = runs(len(todo), world)[rank]
    mine = todo[run.start : run.stop]
    rows = layout.frame["rows"].to_numpy()
    workers = counting.threads or os.cpu_count() or 2
    # The run reads its files in order, a few at once: it keeps their decoding footers
    # itself, not in the layout's cache of FOOTERS_KEPT (1 KB a row group each, 25 MB of
    # FineWeb-Edu's shape for nothing once a file is done).
    footers = functools.lru_cache(maxsize=workers + 2)(functools.partial(layout.chunk_metadata, keep=False))

    def one(rg: int) -> tuple[int, int]:
        if rows[rg] == 0:
            return 0, 0
        arr, _, _ = read_column(layout, int(rg), what="text", footers=footers)
        lens = np.fromiter((len(x) for x in encode_texts(counting.tokenizer, texts_of(arr))), np.int64)
        return int(lens.sum()), int((lens == 0).sum())

    out = np.zeros((len(mine), 2), np.int64)
    if len(mine):
        from tqdm import tqdm

        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="plitzer-count") as pool:
            bar = tqdm(
                map_ahead(pool, one, mine.tolist()),
                total=len(mine),
                desc="counting tokens",
                unit="row group",
                disable=not progress_enabled(progress, len(mine)),
                leave=False,
            )
            for j, c in enumerate(bar):
                out[j] = c
    return mine, out


def take_counts(layout: Index, counting: TextCounting, shares: Sequence[Share]) -> TextIndex:
    """Phase 3: the job's text index from the layout and every rank's counts, saved in this machine's cache.

    Equal to one process's :func:`plitzer.text.source.text_index` of the same files (its
    frame and fingerprint), with no footer held and no row group tokenized twice.
    """
    frame = layout.frame
    ids, bare = frame["tokens"].to_numpy().copy(), frame["empty_docs"].to_numpy().copy()
    for ks, values in shares:
        ids[ks], bare[ks] = values[:, 0], values[:, 1]
    if len(ids) and int(ids.min()) < 0:
        rg = int(np.flatnonzero(ids < 0)[0])
        msg = f"the ranks' counting shares lack {layout.location(*_file_and_group(layout, rg))}; every rank must share"
        raise ConfigError(msg)
    per = np.bincount(frame["file_index"].to_numpy(), minlength=len(layout.entries))
    at = 0
    for e, n in zip(layout.entries, per.tolist(), strict=True):
        path = counting.path(e.stat)
        if n and load_counts(path, n) is None:
            save_counts(path, np.stack([ids[at : at + n], bare[at : at + n]], axis=1))
        at += n
    counted = frame.with_columns(pl.Series("tokens", ids), pl.Series("empty_docs", bare))
    return _under_policy(counted, layout.source, layout.entries, counting)


def _file_and_group(ix: Index, rg: int) -> tuple[int, int]:
    row = ix.frame.row(rg, named=True)
    return int(row["file_index"]), int(row["row_group"])


def _under_policy(frame: pl.DataFrame, source: str, files: Any, counting: TextCounting) -> TextIndex:
    """The text index of rows counted under no BOS/EOS (a job index's, a job's pass) under ``counting``'s policy."""
    extra = counting.extra_ids
    frame = frame.with_columns(
        (pl.col("tokens") + extra * pl.col("rows")).alias("tokens"),
        pl.col("empty_docs") if extra == 0 else pl.lit(0, pl.Int64).alias("empty_docs"),
    )
    ix = Index(
        frame=frame,
        column=counting.text_column,
        dtype=counting.tokenizer.dtype,
        fingerprint=fingerprint_of(frame, counting.fingerprint_extra()),
        source=source,
        _files=files,
    )
    return counting.wrap(ix)


def check_text_index(ix: TextIndex, counting: TextCounting) -> TextIndex:
    """``ix`` if it was counted by ``counting``'s tokenizer, text column and BOS/EOS policy; else a ConfigError."""
    tok = ix.tokenizer
    got = (None if tok is None else f"{tok.kind}:{tok.identity}", ix.column, ix.add_bos, ix.add_eos)
    want = (identity(counting), counting.text_column, counting.add_bos, counting.add_eos)
    if got != want:
        msg = (
            f"the text index was counted with (tokenizer, text_column, add_bos, add_eos) = {got}, not {want}; "
            "pass the source's path instead"
        )
        raise ConfigError(msg)
    return ix


def write_text_index(
    source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    *,
    tokenizer: Any,
    text_column: str = DEFAULT_TEXT.text_column,
    storage_options: Mapping[str, Any] | None = None,
    out_options: Mapping[str, Any] | None = None,
    progress: bool | None = None,
    threads: int | None = None,
) -> jobindex.JobIndexInfo:
    """Count ``source`` with ``tokenizer`` (or take the cache's counts) and write its job index to ``out``.

    The index holds each row group's ids before BOS and EOS and its documents without
    ids, so a loader of any ``add_eos``/``add_bos`` reads it; its ``fingerprint`` is
    that of the counts under neither.
    """
    counted = TextSettings(tokenizer=tokenizer, text_column=text_column, add_eos=False, add_bos=False)
    ix = index_text(source, counted, storage_options=storage_options, progress=progress, threads=threads)
    assert ix.tokenizer is not None
    meta = {"kind": "text", "tokenizer": f"{ix.tokenizer.kind}:{ix.tokenizer.identity}"}
    data = jobindex.encode(ix, meta)
    jobindex.write_object(out, data, storage_options if out_options is None else out_options)
    return jobindex.JobIndexInfo(os.fspath(out), len(ix.files), ix.row_groups, len(data), ix.fingerprint)


def load_text_index(
    url: str | os.PathLike[str],
    source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    text: TextSettings,
    *,
    storage_options: Mapping[str, Any] | None = None,
    threads: int | None = None,
) -> TextIndex:
    """The text index of ``source`` from the job index at ``url``: one listing, one read, no footer, no tokenizing.

    Refused (ConfigError): a job index of a token column, or one counted by another
    tokenizer or text column; a stale one is a StaleIndexError naming the file.
    """
    where = os.fspath(url)
    counting = text_counting(text, threads)
    text_column = counting.text_column
    got = jobindex.read_parts(where, source, storage_options=storage_options)
    meta = got.meta
    fix = f"write it again: plitzer index DATA --tokenizer TOKENIZER --text-column {text_column} --out {where}"
    if got.kind != "text":
        msg = (
            f"job index {where} indexes the token column {meta['column']!r}, not text; leave tokenizer= out "
            f"to read it, or {fix}"
        )
        raise ConfigError(msg)
    if meta.get("tokenizer") != identity(counting):
        msg = (
            f"job index {where} was counted with tokenizer {meta.get('tokenizer')}, not tokenizer= "
            f"{identity(counting)}; {fix}"
        )
        raise ConfigError(msg)
    if meta["column"] != text_column:
        msg = f"job index {where} counted text column {meta['column']!r}, not text_column={text_column!r}; {fix}"
        raise ConfigError(msg)
    # The rows as the counting pass would give them under this BOS/EOS policy: no footer, no tokenizing.
    return _under_policy(got.frame, got.source, got.entries, counting)
