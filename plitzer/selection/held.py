"""Phase 1's state as phase 2 reads it: every chunk's keys, positions and counts.

In memory, :class:`Held` keeps every chunk of a pass as a few arrays (``run_chunks(...,
keep=held.keep)``), not a dict of arrays a chunk; for a pass whose keys were spilled
(:class:`plitzer.selection.firsts.Spill`), :class:`CachedLengths` reads each chunk's token
counts back from phase 1's cache. Both are a :data:`Known`, what
:func:`plitzer.selection.result.dropped_tokens` asks for a chunk's token counts.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from plitzer.selection.keying import Hashed, load_arrays

__all__ = ["CachedLengths", "Held", "Known"]


Known = Callable[[int], Mapping[str, np.ndarray] | None]
"""Chunk ``c``'s phase 1 (its ``n`` and ``len``), where it may have kept its stream rows' token counts."""


class _Grown:
    """An array appended to, its capacity doubled as it fills (amortized: no array a piece)."""

    def __init__(self, dtype: Any, width: int = 0, capacity: int = 16) -> None:
        self.shape = (width,) if width else ()
        # Zeros: pages never written are never resident, so a capacity of the most it may hold costs nothing.
        self.buf: np.ndarray = np.zeros((max(16, capacity), *self.shape), dtype)
        self.size = 0

    def add(self, a: np.ndarray) -> int:
        """Append ``a``; the position of its first row."""
        at, n = self.size, len(a)
        if at + n > len(self.buf):
            grown = np.zeros((max(2 * len(self.buf), at + n), *self.shape), self.buf.dtype)
            grown[:at] = self.buf[:at]
            self.buf = grown
        self.buf[at : at + n] = a.reshape(-1, *self.shape) if self.shape else a
        self.size = at + n
        return at


_KEPT: Hashed = {}
"""What :meth:`Held.keep` leaves in ``run_chunks``'s dict: nothing (the chunk is in the store)."""


class Held(Mapping[int, Hashed]):
    """Every chunk's phase 1 in memory as a few arrays, not a dict of seven arrays a chunk (about 2 KB).

    ``run_chunks(..., keep=held.keep)`` appends each chunk as it comes; ``held[c]`` is chunk
    ``c``'s :data:`Hashed` again, as views. Its keys, positions and counts cost their bytes
    and about 2 bytes a row group of bookkeeping: docs/design.md, "Bytes a row group".
    """

    _ROWS = ("n", "m", "x")

    def __init__(self, chunks: int, row_groups: int = 0, rows: int = 0) -> None:
        """``row_groups`` and ``rows``: the most the chunks hold (the arrays' first capacity)."""
        self.at = np.full((chunks, 6), -1, np.int64)
        """Each chunk's first row group, key, excluded row and token count in the arrays; its row groups, counts."""
        self.rg = _Grown(np.int64, 3, row_groups)
        self.hashes = _Grown(np.uint64, 2, rows)
        self.pos = _Grown(np.int32, 0, rows)
        self.excl = _Grown(np.int64)
        self.lens = _Grown(np.int32, 0, rows)
        self._lock = threading.Lock()

    def keep(self, c: int, h: Hashed) -> Hashed:
        with self._lock:
            self.at[c] = (
                self.rg.add(np.stack([np.asarray(h[k], np.int64) for k in self._ROWS], axis=1)),
                self.hashes.add(np.asarray(h["keys"], np.uint64).reshape(-1, 2)),
                self.excl.add(np.asarray(h["excl"], np.int64)),
                self.lens.add(np.asarray(h["len"], np.int32)),
                len(h["n"]),
                len(h["len"]),
            )
            self.pos.add(np.asarray(h["pos"], np.int32))
        return _KEPT

    def __getitem__(self, c: int) -> Hashed:
        r, k, e, ln, n, nl = (int(v) for v in self.at[c])
        if r < 0:
            raise KeyError(c)
        rows = self.rg.buf[r : r + n]
        m, x = rows[:, 1], rows[:, 2]
        nk, nx = int(m.sum()), int(x.sum())
        return {
            "n": rows[:, 0],
            "m": m,
            "x": x,
            "keys": self.hashes.buf[k : k + nk],
            "pos": self.pos.buf[k : k + nk],
            "excl": self.excl.buf[e : e + nx],
            "len": self.lens.buf[ln : ln + nl],
        }

    def __iter__(self) -> Iterator[int]:
        return iter(np.flatnonzero(self.at[:, 0] >= 0).tolist())

    def __len__(self) -> int:
        return int((self.at[:, 0] >= 0).sum())

    def __setitem__(self, c: int, h: Hashed) -> None:
        """What ``resolve`` leaves of a chunk (its keys moved out): the keys go at once, with :meth:`drop_keys`."""

    def in_order(self) -> bool:
        """Whether every chunk is held, in chunk order (so the keys are too: a pass that ran in order)."""
        return bool((self.at[:, 0] >= 0).all() and (np.diff(self.at[:, 1]) >= 0).all())

    def drop_keys(self) -> None:
        """Let the keys and their positions go (``resolve`` has copied them)."""
        self.hashes, self.pos = _Grown(np.uint64, 2), _Grown(np.int32)


class CachedLengths:
    """:data:`Known` read back from phase 1's cached chunks (``"tokens"``), for a pass whose keys were spilled."""

    def __init__(self, paths: list[Any]) -> None:
        self._paths = paths

    def __call__(self, c: int) -> Mapping[str, np.ndarray] | None:
        return load_arrays(self._paths[c], ("n", "len"))
