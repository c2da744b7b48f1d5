"""How the index counts a row group's tokens: the Counting protocol and the footer statistics' step.

:func:`planner.catalog.dataset.index` lists the files, loads their footers and builds,
fingerprints and caches the frame; a counting step only counts a file's rows
(:class:`Counted`). :class:`FooterCounting` reads the token column's footer statistics;
``plitzer.text.source.TextCounting`` tokenizes text (docs/design.md, "One index protocol, one
builder, one dispatch").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from planner.catalog import footer
from planner.catalog.column import TokenDtype, delivered_dtype
from planner.catalog.datasetindex import Index
from planner.catalog.files import FileEntry

__all__ = ["Counted", "Counting", "CountsFromFooters", "FooterCounting"]


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

    :func:`~planner.catalog.dataset.index` lists the files, loads their footers and builds, fingerprints and
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

        Then :func:`~planner.catalog.dataset.index` parses footers without checking every column's (a footer's
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
