"""Each row group's bitmap of the rows a selection keeps, all row groups in one array.

A selected index answers "which rows of row group ``rg`` does the stream take" from a
bitmap of its stored rows (``np.packbits``: a bit a row, so a billion rows hold 125 MB,
not the 8 GB of row numbers). One numpy array a row group costs about 110 B of object
header before its first bit, more than the index's whole row on small row groups, so
:class:`RowBits` keeps every row group's bits in one ``uint8`` array and where each
starts (8 B a row group): docs/design.md, "Bytes a row group".
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from planner.arraytypes import I64

__all__ = ["RowBits"]

U8 = NDArray[np.uint8]


@dataclass(frozen=True, slots=True)
class RowBits:
    """Row group ``g``'s packed bitmap is ``data[starts[g]:starts[g + 1]]`` (``bits[g]``)."""

    data: U8
    starts: I64

    @classmethod
    def of(cls, bitmaps: Sequence[U8]) -> RowBits:
        """From one packed bitmap a row group."""
        sizes = np.fromiter((len(b) for b in bitmaps), np.int64, len(bitmaps))
        data = np.concatenate(bitmaps).astype(np.uint8, copy=False) if len(bitmaps) else np.zeros(0, np.uint8)
        return cls(data, np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64))

    @classmethod
    def packed(cls, data: U8, rows: I64) -> RowBits:
        """From the row groups' packed bitmaps concatenated, and each one's stored rows."""
        starts = np.concatenate([[0], np.cumsum((rows.astype(np.int64) + 7) // 8)]).astype(np.int64)
        if int(starts[-1]) != len(data):
            msg = f"{len(data)} bytes of bitmaps for row groups that need {int(starts[-1])}"
            raise ValueError(msg)
        return cls(np.ascontiguousarray(data, np.uint8), starts)

    def __len__(self) -> int:
        return len(self.starts) - 1

    def __getitem__(self, rg: int) -> U8:
        return self.data[int(self.starts[rg]) : int(self.starts[rg + 1])]

    def __iter__(self) -> Iterator[U8]:
        return (self[g] for g in range(len(self)))

    def rows(self, rg: int, stored: int) -> I64:
        """The kept rows of row group ``rg`` (of ``stored`` rows), ascending."""
        return np.flatnonzero(np.unpackbits(self[rg], count=stored)).astype(np.int64)
