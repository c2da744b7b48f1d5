"""Text (``tokenizer=``): a Parquet text column, tokenized as it is read (SPEC section 9).

The index is :class:`plitzer.text.source.TextIndex` (counts from one tokenizing pass, cached);
it reads its own row groups (``read_tokens``: tokenized in the reader threads). A text index
given with ``tokenizer=`` is taken when this tokenizer, column and policy counted it. A
mixture's text source (one whose dict has a ``tokenizer``) is :func:`mixture_source`.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from planner.api import Source
from planner.catalog.datasetindex import Index
from planner.mixing.sources import SourceSpec
from planner.parameters import TextSettings
from plitzer.sources.exchange import all_or_raise, attempt

__all__ = ["claims", "is_text_index", "mixture_source", "prepare", "share", "share_text"]


def is_text_index(source: object) -> bool:
    """Whether ``source`` is a text source's index (counted by a tokenizer)."""
    from plitzer.text.source import TextIndex

    return isinstance(source, TextIndex)


def claims(source: Source, settings: Any) -> bool:
    """Whether a tokenizer is given (``tokenizer=``)."""
    return settings.text.tokenizer is not None


def prepare(source: Source, settings: Any) -> tuple[Source, dict[str, Any]]:
    """A text index given: checked against the tokenizer; a path: planner's text step (the opening's ``text``)."""
    from plitzer.text.source import TextIndex, index_text, text_counting

    s = settings
    if isinstance(source, TextIndex):  # counted already (the ranks of a job shared the pass)
        from plitzer.text.job import check_text_index

        return check_text_index(source, text_counting(s.text)), {}
    return source, {"text": functools.partial(index_text, text=s.text, storage_options=s.storage_options)}


def mixture_source(spec: SourceSpec) -> Index:
    """A mixture's text source, counted with its own tokenizer (``plitzer.text.source``), or from its job index."""
    from plitzer.text.source import index_text

    text = TextSettings.of(spec.text or {})
    if spec.index is not None:
        from plitzer.text.job import load_text_index

        return load_text_index(spec.index, spec.path, text, storage_options=spec.storage_options)
    return index_text(spec.path, text, storage_options=spec.storage_options)


def share(source: Source, settings: Any, group: Any) -> Source:
    """The text source's index for a job's ``group``: :func:`share_text` (an index given is checked, not shared)."""
    if is_text_index(source):
        return source
    out: Source = share_text(source, settings.text, settings.storage_options, settings.threads or 32, group)
    return out


def share_text(path: Any, text: TextSettings, options: Mapping[str, Any] | None, threads: int, group: Any) -> Any:
    """One text dataset's index for the whole group: one listing, each footer once, the counting pass split.

    ``text``: the source's tokenizer, text column and BOS/EOS policy. Every rank's cache gets
    every file's counts; each rank's footer cache the footers it read (so a restart there reads none from storage).
    """
    from planner.catalog import jobshare
    from plitzer.text import job
    from plitzer.text.source import text_counting

    me, n = group.rank, group.world
    counting = text_counting(text)
    listed = group.broadcast(attempt(jobshare.listing, path, options) if me == 0 else None)
    if isinstance(listed, BaseException):
        raise listed
    entries, src = jobshare.entries_of(path, options, listed)
    # Each rank reads 1/world of the footers into rows (bytes a row group); the ranks then
    # tokenize 1/world each of the row groups no cache counted (plitzer.text.job: three phases).
    layouts = all_or_raise(attempt(job.layout_share, entries, counting, me, n, threads), group)
    layout = job.take_layout(entries, src, counting, layouts)
    del layouts
    shares = all_or_raise(attempt(job.count_share, layout, counting, me, n), group)
    return job.take_counts(layout, counting, shares)
