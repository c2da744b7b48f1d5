"""A job index (``index=``): one file that lists a source's files and their row groups, read once.

The source's files are not listed and no footer is read: :func:`planner.catalog.jobindex.load`
gives the Parquet index (a text source's through :func:`plitzer.text.job.load_text_index`, which
checks its counts against the tokenizer). What follows (``where=``, ``dedupe=``) is the index's.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from planner.api import Source
from planner.errors import ConfigError

__all__ = ["claims", "prepare", "share"]


def claims(source: Source, settings: Any) -> bool:
    """Whether ``index=`` is given (a mixture's sources each give theirs in their dict, not here)."""
    return settings.index is not None


def prepare(source: Source, settings: Any) -> tuple[Source, dict[str, Any]]:
    """The index of ``source`` from the job index ``settings.index`` (one listing, one read, no footer)."""
    from planner.catalog.jobindex import load

    s = settings
    if isinstance(source, Mapping):
        msg = (
            f"index={s.index!r} needs one source, not a mixture: give each source its own job index, e.g. "
            "{'web': {'path': 's3://bucket/web', 'index': 's3://bucket/web.index'}, ...}"
        )
        raise ConfigError(msg)
    if not isinstance(source, (str, os.PathLike, list, tuple)):
        msg = f"index={s.index!r} needs the source's path, URL or list of them, not {type(source).__name__}"
        raise ConfigError(msg)
    from plitzer.sources import format_of, spec_of

    fmt = None if s.text.tokenizer is not None else format_of(spec_of(source, s))
    if fmt is not None:  # a kind of token files: its own listing, its rows from the job index
        from plitzer.sources.files import load_files

        return load_files(os.fspath(s.index), fmt, s.storage_options), {}
    if s.text.tokenizer is not None:
        from plitzer.text.job import load_text_index

        return load_text_index(s.index, source, s.text, storage_options=s.storage_options, threads=s.threads), {}
    return load(s.index, source, column=s.column, storage_options=s.storage_options), {}


def share(source: Source, settings: Any, group: Any) -> Source:
    """``source`` as given: each rank reads the job index (one object, no footer to share)."""
    return source
