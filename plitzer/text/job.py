"""A text source's counting pass once a job: split across its ranks, or carried by a job index.

The counting pass (:class:`plitzer.text.source.TextCounting`) tokenizes every row group
once to learn its token count. Two ways to pay it once for a whole job instead of on
every rank (docs/design.md, "One index per job"):

- **The ranks of a process group split it** (:func:`count_share`, run by
  :mod:`plitzer.state.share`): with every footer at hand, the row groups of the listing
  (files in order, row groups in file order) are cut into ``world`` contiguous runs;
  rank ``r`` counts run ``r`` (from its cache where it holds the file, else by
  tokenizing), the ranks all-gather their runs, and :func:`take_counts` gives every
  rank every file's counts, which land in its cache.
- **A job index carries them** (:func:`write_text_index`, :func:`load_text_index`):
  ``plitzer index DATA --tokenizer T --out URL`` writes the counts (ids and documents
  without ids per row group, before BOS and EOS, so any ``add_eos``/``add_bos`` policy
  reads the same index) with the tokenizer's identity and the text column; a loader of
  another tokenizer or text column is refused, as is a stale index.

>>> runs(5, 2)
[range(0, 2), range(2, 5)]
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import polars as pl
from numpy.typing import NDArray

from planner.catalog import footer, jobindex
from planner.catalog.dataset import FileEntry, Index, fingerprint_of, index_entries
from planner.errors import ConfigError
from plitzer.text.source import Counts, TextCounting, TextIndex, file_key, save_counts, text_counting, text_index

__all__ = [
    "Share",
    "check_text_index",
    "count_share",
    "identity",
    "load_text_index",
    "parse_footers",
    "runs",
    "shared_text_index",
    "take_counts",
    "text_ready",
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


def _ordinals(entries: Sequence[FileEntry]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for i, e in enumerate(entries):
        md = e.metadata
        assert md is not None  # parsed by the caller
        out.extend((i, g) for g in range(md.num_row_groups))
    return out


def parse_footers(entries: Sequence[FileEntry]) -> None:
    """Parse every entry's footer bytes (they came with the listing or the ranks' exchange)."""
    for e in entries:
        if e.metadata is None:
            raw = e.raw if e.raw is not None else footer.cached(e.stat)
            if raw is None:
                raw = footer.fetch(e.storage, e.stat)
            e.metadata = footer.parse(raw, e.stat.location)


def text_ready(entries: Sequence[FileEntry], counting: TextCounting) -> bool:
    """Whether this machine's cache holds every footer and every file's counts (a restart: nothing to share)."""
    for e in entries:
        raw = footer.cached(e.stat)
        if raw is None:
            return False
        e.metadata = footer.parse(raw, e.stat.location)
        if counting.counts_of(e) is None:
            return False
    return True


def count_share(
    entries: Sequence[FileEntry], counting: TextCounting, rank: int, world: int, progress: bool | None = None
) -> Share:
    """Rank ``rank``'s run of the pass: its cache's counts where it holds the file, else tokenized."""
    parse_footers(entries)
    order = _ordinals(entries)
    mine = runs(len(order), world)[rank]
    cached: dict[int, Counts | None] = {}
    out = np.zeros((len(mine), 2), np.int64)
    todo: list[tuple[int, int]] = []  # (position in mine, ordinal)
    for j, k in enumerate(mine):
        i, g = order[k]
        if i not in cached:
            cached[i] = counting.counts_of(entries[i])
        got = cached[i]
        if got is None:
            todo.append((j, k))
        else:
            out[j] = got[g]
    counted = counting.count_many([(entries[order[k][0]], order[k][1]) for _, k in todo], progress)
    for (j, _), c in zip(todo, counted, strict=True):
        out[j] = c
    return np.arange(mine.start, mine.stop, dtype=np.int64), out


def take_counts(
    entries: Sequence[FileEntry], counting: TextCounting, shares: Sequence[Share]
) -> dict[tuple[str, int, str], Counts]:
    """Every file's counts from the ranks' shares, saved in this machine's cache where it lacks them."""
    order = _ordinals(entries)
    every = np.full((len(order), 2), -1, np.int64)
    for ks, values in shares:
        every[ks] = values
    if len(order) and int(every.min()) < 0:
        missing = int(np.flatnonzero(every[:, 0] < 0)[0])
        i, g = order[missing]
        msg = f"the ranks' counting shares lack {entries[i].stat.location}, row group {g}; every rank must share"
        raise ConfigError(msg)
    known: dict[tuple[str, int, str], Counts] = {}
    at = 0
    for e in entries:
        md = e.metadata
        assert md is not None
        n = md.num_row_groups
        counts = every[at : at + n].copy()
        at += n
        known[file_key(e.stat)] = counts
        if counting.counts_of(e) is None:
            save_counts(counting.path(e.stat), counts)
    return known


def shared_text_index(
    entries: list[FileEntry], src: str, counting: TextCounting, known: Mapping[tuple[str, int, str], Counts]
) -> TextIndex:
    """The text index of files whose footers and counts are at hand (no read, no tokenizing)."""
    ix = index_entries(entries, src, replace(counting, known=known), threads=counting.threads or 32)
    assert isinstance(ix, TextIndex)
    return ix


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
    text_column: str = "text",
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
    ix = text_index(
        source,
        tokenizer=tokenizer,
        text_column=text_column,
        add_eos=False,
        add_bos=False,
        storage_options=storage_options,
        progress=progress,
        threads=threads,
    )
    assert ix.tokenizer is not None
    meta = {"kind": "text", "tokenizer": f"{ix.tokenizer.kind}:{ix.tokenizer.identity}"}
    data = jobindex.encode(ix, meta)
    jobindex.write_object(out, data, storage_options if out_options is None else out_options)
    return jobindex.JobIndexInfo(os.fspath(out), len(ix.files), ix.row_groups, len(data), ix.fingerprint)


def load_text_index(
    url: str | os.PathLike[str],
    source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    tokenizer: Any,
    text_column: str = "text",
    add_eos: bool = True,
    add_bos: bool = False,
    storage_options: Mapping[str, Any] | None = None,
    threads: int | None = None,
) -> TextIndex:
    """The text index of ``source`` from the job index at ``url``: one listing, one read, no footer, no tokenizing.

    Refused (ConfigError): a job index of a token column, or one counted by another
    tokenizer or text column; a stale one is a StaleIndexError naming the file.
    """
    where = os.fspath(url)
    counting = text_counting(tokenizer, text_column=text_column, add_eos=add_eos, add_bos=add_bos, threads=threads)
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
    extra = counting.extra_ids
    frame = got.frame.with_columns(
        (pl.col("tokens") + extra * pl.col("rows")).alias("tokens"),
        pl.col("empty_docs") if extra == 0 else pl.lit(0, pl.Int64).alias("empty_docs"),
    )
    ix = Index(
        frame=frame,
        column=text_column,
        dtype=counting.tokenizer.dtype,
        fingerprint=fingerprint_of(frame, counting.fingerprint_extra()),
        source=got.source,
        _files=got.entries,
    )
    return counting.wrap(ix)
