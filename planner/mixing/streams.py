"""One source's infinite stream of row groups, and the key by which a mixture merges streams.

Each source of a mixture has its own stream: its epochs one after the other, source
epoch ``k`` being ``permutation(G_s, key(seed, source_key(name), k, 3))`` of its row
groups. :class:`SourceStream` answers what the merge asks of it (items, tokens so far,
how many items hold fewer than ``a`` tokens) from one source epoch's permutation at a
time, never the items before it. :func:`finish_keys` is the merge's key, the virtual
finish time of weighted fair queueing (:mod:`planner.mixing.interleave`):

>>> from planner.mixing.streams import interleave_demo
>>> interleave_demo([[3, 3, 3, 3], [2, 2, 2, 2]], weights=[1, 1])  # (source, row group) in stream order
[(1, 0), (0, 0), (1, 1), (0, 1), (1, 2), (1, 3), (0, 2), (0, 3)]
>>> interleave_demo([[3, 3, 3, 3], [2, 2, 2, 2]], weights=[3, 1])
[(0, 0), (0, 1), (1, 0), (0, 2), (0, 3), (1, 1), (1, 2), (1, 3)]
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from planner.arraytypes import I64
from planner.bounded import Bounded
from planner.hashing import key, order_of

__all__ = ["SourceStream", "finish_keys", "interleave_demo", "source_key"]


def source_key(name: str) -> int:
    """The 64-bit key of a source's name in its permutations (first 8 bytes of sha256)."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little")


class SourceStream:
    """One source's infinite stream of row groups: its epochs' permutations in turn.

    ``cum(p)`` is the tokens of the stream's first ``p`` items and ``count_below(a)``
    how many leading items hold fewer than ``a`` tokens together: each needs the
    permutation of one source epoch (a few are kept), never the items before it.
    """

    def __init__(self, name: str, tokens: I64, base: int, seed: int, shuffle: bool = True) -> None:
        self.g = len(tokens)
        self.tokens = tokens
        self.base = base
        self.key = source_key(name)
        self.seed = seed
        self.shuffle = shuffle  # False: every source epoch in index order (SPEC section 17)
        self.epoch_tokens = int(tokens.sum())
        self.largest = int(tokens.max()) if self.g else 0
        self._perm: Bounded[int, tuple[I64, I64]] = Bounded(8)  # the epochs in use, about

    def _epoch(self, e: int) -> tuple[I64, I64]:
        """Source epoch ``e``'s permutation and its prefix sums of tokens (``g + 1`` of them)."""
        got = self._perm.get(e)
        if got is None:
            perm = order_of(self.g, key(self.seed, self.key, e, 3), self.shuffle)
            prefix = np.zeros(self.g + 1, np.int64)
            np.cumsum(self.tokens[perm], out=prefix[1:])
            got = (perm, prefix)
            self._perm.put(e, got)
        return got

    def items_kept(self) -> int:
        """Items held by the kept permutations (what ``Interleave.items_kept`` counts)."""
        return sum(len(p) for p, _ in self._perm.values())

    def items(self, start: int, stop: int) -> tuple[I64, I64, I64]:
        """Items ``[start, stop)`` of the stream: global row group, tokens, source epoch."""
        j = np.arange(start, stop, dtype=np.int64)
        k = j // self.g
        out = np.empty(len(j), np.int64)
        for e in np.unique(k).tolist():
            perm = self._epoch(e)[0]
            sel = k == e
            out[sel] = perm[j[sel] - e * self.g]
        return out + self.base, self.tokens[out], k

    def cum(self, p: int) -> int:
        """Tokens of the stream's first ``p`` items."""
        e, r = divmod(p, self.g)
        return e * self.epoch_tokens + (int(self._epoch(e)[1][r]) if r else 0)

    def count_below(self, a: int) -> int:
        """How many leading items hold fewer than ``a`` tokens (the largest ``p`` with ``cum(p) < a``)."""
        if a <= 0:
            return 0
        e = (a - 1) // self.epoch_tokens
        r = a - e * self.epoch_tokens
        return e * self.g + int(np.searchsorted(self._epoch(e)[1][1:], r, side="left"))

    def count_bounds(self, a: int) -> tuple[int, int]:
        """Bounds on :meth:`count_below` from the epoch arithmetic alone (no permutation)."""
        if a <= 0:
            return 0, 0
        e = (a - 1) // self.epoch_tokens
        return e * self.g, (e + 1) * self.g


def finish_keys(c: I64, weight: int, total: int) -> I64:
    """``floor(c * total / weight)`` without overflow (``total <= 2**24``, keys about the stage's tokens)."""
    q, r = np.divmod(c, weight)
    out: I64 = q * total + (r * total) // weight
    return out


def interleave_demo(tokens: Sequence[Sequence[int]], weights: Sequence[int]) -> list[tuple[int, int]]:
    """The merge rule on its own, for the docs: sources' row groups in stream order, one stage.

    ``tokens[s]`` are source s's row groups' token counts in its stream order (no
    shuffle here); returns (source, row group) pairs in the order the mixture takes them.
    """
    total = sum(weights)
    items = []
    for s, (ts, w) in enumerate(zip(tokens, weights, strict=True)):
        c = 0
        for m, t in enumerate(ts):
            c += t
            items.append((c * total // w, s, m))
    return [(s, m) for _, s, m in sorted(items)]
