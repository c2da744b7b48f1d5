"""Document lengths in: what the piece arithmetic (:mod:`planner.lookup.pieces`) asks of the data.

Where a piece lands depends on the token lengths of the documents that share its lane
(the shuffle places a piece after those it draws ahead of it). planner reads no data,
so lengths come in as :data:`Lengths`, a function of row groups: from an array of
every document's length (:func:`lengths_from_array`), any callable, or the runtime's
reader as installed (:mod:`planner.runtime`: plitzer's cached document pass).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from planner.arraytypes import I64
from planner.catalog.rowgroups import RowGroupIndex, stream_counts
from planner.errors import ConfigError
from planner.runtime import LENGTHS, runtime_pass

__all__ = ["LengthReader", "Lengths", "as_lengths", "default_lengths", "lengths_from_array"]


Lengths = Callable[[I64], Sequence[I64]]
"""Row groups (ids, rows of the index) -> each one's documents' token lengths, in stream order.

A selected row group (``where=``) gives its selected documents only."""

LengthReader = Callable[[RowGroupIndex], Lengths]
"""What makes :data:`Lengths` for an index that reads data: the runtime's (``plitzer.tools.locate.plan_lengths``)."""


def default_lengths(index: RowGroupIndex) -> Lengths:
    """The runtime's :data:`Lengths` of ``index`` (a ConfigError saying what to do where none is installed)."""
    reader: LengthReader | None = runtime_pass(None, LENGTHS)
    if reader is None:
        msg = (
            "plan.pieces needs each document's token length, which is data: import plitzer first (its "
            "cached document pass reads them), or pass lengths= (every document's length, in index order)"
        )
        raise ConfigError(msg)
    return reader(index)


def lengths_from_array(lengths: I64, rows: I64) -> Lengths:
    """:data:`Lengths` from every document's length in index order (``rows`` documents per row group)."""
    lengths = np.asarray(lengths, np.int64)
    rows = np.asarray(rows, np.int64)
    if len(lengths) != int(rows.sum()):
        msg = (
            f"lengths= holds {len(lengths)} documents but the index's row groups give the stream "
            f"{int(rows.sum())}; pass one length per document, in index order (plitzer.tools.explain.document_lengths)"
        )
        raise ConfigError(msg)
    base = np.cumsum(rows) - rows

    def of(rgs: I64) -> list[I64]:
        return [lengths[int(base[g]) : int(base[g] + rows[g])] for g in np.asarray(rgs).tolist()]

    return of


def as_lengths(plan: Any, lengths: Any) -> Lengths:
    """``lengths=`` as :data:`Lengths`: a callable as it is, an array of every document's length, or the default."""
    if lengths is None:
        return default_lengths(plan.dataset)
    if callable(lengths):
        out: Lengths = lengths
        return out
    return lengths_from_array(np.asarray(lengths), stream_counts(plan.dataset.frame)[1].to_numpy())
