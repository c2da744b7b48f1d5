"""Per-source signals (SPEC section 20): each token's source, tokens and targets per source, running totals.

A batch's pieces carry their document's running number (``Segments.doc``: over the
dataset's documents, a mixture's sources one after the other in name order; -1 on
padding). :class:`SourceMap` turns document numbers into source numbers (the order the
sources were given, ``loader.sources``) by one ``searchsorted`` over each source's first
document number, so ``batch.source_ids`` is a piece's source repeated over its length and
``batch.source_tokens`` a ``bincount`` over the pieces: nothing is computed until asked, and
whatever moves a batch's pieces with its rows (balanced steps, a replica's followers) moves
them too. :class:`SourceTotals` keeps ``loader.stats``' running totals of the batches handed
out: a step appends its pieces' document numbers and lengths (views), and every
:data:`FOLD` steps, or when the stats are read, one ``searchsorted`` and one ``bincount``
over them all add them up (docs/design.md, "Per-source signals").
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np
from numpy.typing import NDArray

from planner.arraytypes import I64
from planner.catalog.rowgroups import RowGroupIndex
from planner.order.epoch import row_group_counts
from plitzer.readpath.labels import IGNORE_INDEX
from plitzer.readpath.packed import Segments

if TYPE_CHECKING:
    from planner.mixing.mixindex import MixtureIndex
    from plitzer.readpath.batch import Batch

__all__ = ["FOLD", "SourceMap", "SourceTotals", "piece_targets"]


FOLD = 64
"""Steps whose pieces :class:`SourceTotals` holds before adding them up (and at most: a few units' piece tables)."""


@dataclass(frozen=True, slots=True, eq=False)
class SourceMap:
    """Document numbers to source numbers: ``number[i]`` for the documents from ``first_doc[i]`` on.

    ``names``: the sources in source-number order (a lone source's one name, ``""`` for a path:
    the index's ``names``); ``mixed``: whether the loader's source is a mixture (a dict of
    named sources, one included).
    """

    names: tuple[str, ...]
    first_doc: I64
    number: I64
    mixed: bool = False

    @classmethod
    def lone(cls, name: str = "", *, mixed: bool = False) -> SourceMap:
        """One source: every document is source 0."""
        return cls((name,), np.zeros(1, np.int64), np.zeros(1, np.int64), mixed)

    @classmethod
    def of(cls, index: RowGroupIndex) -> SourceMap:
        """The map of a loader's index: each source's first document, numbered as the sources were given."""
        if not index.mixed:
            return cls.lone(str(index.names[0]))
        mix = cast("MixtureIndex", index)
        given = [*mix.given, *(n for n in mix.names if n not in mix.given)]
        _, rows, _ = row_group_counts(index)  # the documents of each row group in the stream (selected)
        base = np.concatenate([[0], np.cumsum(rows)]).astype(np.int64)
        first = base[np.asarray(mix.rg_base[:-1], np.int64)]  # sources in name order, one after the other
        number = np.array([given.index(n) for n in mix.names], np.int64)
        return cls(tuple(given), first, number, True)

    @classmethod
    def of_documents(cls, names: tuple[str, ...], docs: I64, numbers: I64, *, mixed: bool) -> SourceMap:
        """The map of some documents whose source numbers are known (a replica's follower: its batch's)."""
        if len(docs) == 0:
            return cls(names, np.zeros(1, np.int64), np.zeros(1, np.int64), mixed)
        first, at = np.unique(np.asarray(docs, np.int64), return_index=True)
        return cls(names, first, np.asarray(numbers, np.int64)[at], mixed)

    def __call__(self, doc: I64) -> I64:
        """The source number of each document number (-1 for padding, a negative number)."""
        i = np.searchsorted(self.first_doc, doc, side="right") - 1
        out: I64 = np.where(doc >= 0, self.number[np.maximum(i, 0)], -1)
        return out

    def ids(self, segs: Segments, shape: tuple[int, ...]) -> NDArray[np.int16]:
        """``(rows, seq_len)`` int16: each token's source number, -1 on padding."""
        out: NDArray[np.int16] = np.repeat(self(segs.doc).astype(np.int16), segs.length).reshape(shape)
        return out

    def tokens(self, segs: Segments) -> I64:
        """``(sources,)`` int64: the real tokens of each source among ``segs``."""
        return self._count(segs.doc, segs.length)

    def targets(self, segs: Segments, labels: NDArray[Any]) -> I64:
        """``(sources,)`` int64: the labels other than -100 of each source's tokens among ``segs``."""
        return self._count(segs.doc, piece_targets(segs, labels))

    def _count(self, doc: I64, weights: I64) -> I64:
        n = self(doc)
        real = n >= 0
        got = np.bincount(n[real], weights=weights[real], minlength=len(self.names))
        return np.rint(got).astype(np.int64)


def piece_targets(segs: Segments, labels: NDArray[Any]) -> I64:
    """Each piece's targets: its tokens, less one where its last token's label is -100 (its document ends there).

    A label is -100 only at a document's last token and on padding (SPEC section 16), so a
    piece's other tokens are all targets: one gather of ``pieces`` labels, not a pass over the batch.
    """
    length = np.asarray(segs.length, np.int64)
    last = np.maximum(np.cumsum(length) - 1, 0)  # the pieces tile the rows, in row order
    width = labels.shape[1]
    ends = (length > 0) & (np.asarray(labels)[last // width, last % width] == IGNORE_INDEX)
    out: I64 = length - ends
    return out


class SourceTotals:
    """Running totals per source of the batches a loader handed out (``loader.stats``), added up lazily."""

    def __init__(self, sources: SourceMap, labels: bool) -> None:
        self.sources = sources
        self.labels = labels
        n = len(sources.names)
        self._tokens = np.zeros(n, np.int64)
        self._targets = np.zeros(n, np.int64)
        self._padding = 0
        self._pieces: list[tuple[I64, I64]] = []  # (document numbers, lengths) of steps not added yet
        self._taken: list[tuple[I64, I64]] = []  # (document numbers, targets) of those steps, with labels
        self._lock = threading.Lock()

    def add(self, batch: Batch) -> None:
        """A step handed out: its pieces (and the targets among them, with ``labels=True``)."""
        segs = batch._segs()  # a view step's are made here: slices of its unit's tables
        taken = None if batch.labels is None else piece_targets(segs, batch.labels)
        with self._lock:
            self._pieces.append((segs.doc, segs.length))
            if taken is not None:
                self._taken.append((segs.doc, taken))
            if len(self._pieces) >= FOLD:
                self._fold()

    def _fold(self) -> None:
        """Add up the steps held: one ``searchsorted`` and one ``bincount`` over their pieces."""
        n = len(self.sources.names)
        if self._pieces:
            got = self._sum(self._pieces, n)
            self._padding += int(got[0])
            self._tokens += got[1:]
        if self._taken:
            self._targets += self._sum(self._taken, n)[1:]
        self._pieces, self._taken = [], []

    def _sum(self, held: list[tuple[I64, I64]], n: int) -> I64:
        doc = np.concatenate([d for d, _ in held])
        weights = np.concatenate([w for _, w in held])
        got = np.bincount(self.sources(doc) + 1, weights=weights, minlength=n + 1)  # slot 0: padding
        return np.rint(got).astype(np.int64)

    def figures(self) -> dict[str, Any]:
        """``Stats``' per-source fields: the totals so far."""
        with self._lock:
            self._fold()
            return {
                "sources": self.sources.names,
                "source_tokens": tuple(self._tokens.tolist()),
                "source_targets": tuple(self._targets.tolist()) if self.labels else None,
                "padding_tokens": self._padding,
            }
