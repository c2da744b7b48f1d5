"""The hash behind every shuffle: SplitMix64's finaliser, in pure integer arithmetic.

The order must be reproducible in any language, on any OS and with any numpy
version, so it is defined by integer arithmetic alone (docs/design.md, "Why a
hash-sorted permutation"): ``mix`` is SplitMix64's output function, ``key`` folds
several integers into one, and ``permutation(n, k)`` sorts ``0..n-1`` by
``mix(k ^ i)`` (ties by ``i``). Sorting by a hash is one vectorized ``argsort``,
needs no random-number generator whose stream could change between releases, and
any single position can be recomputed without the others.

>>> hex(mix(0))
'0xe220a8397b1dcdaf'
>>> permutation(5, key(0, 0, 1)).tolist()
[2, 1, 3, 4, 0]
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

__all__ = ["MASK64", "key", "mix", "mix_array", "order_of", "permutation"]

MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB


def mix(x: int) -> int:
    """SplitMix64's finaliser of ``x`` (taken mod 2**64), as a Python int."""
    x = (x + _GOLDEN) & MASK64
    x = ((x ^ (x >> 30)) * _M1) & MASK64
    x = ((x ^ (x >> 27)) * _M2) & MASK64
    return x ^ (x >> 31)


def mix_array(x: NDArray[np.uint64]) -> NDArray[np.uint64]:
    """``mix`` of every element; uint64 arithmetic wraps mod 2**64 as required."""
    x = x + np.uint64(_GOLDEN)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(_M1)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(_M2)
    return x ^ (x >> np.uint64(31))


def key(*parts: int) -> int:
    """Fold integers into one 64-bit key: ``h = mix(h ^ p)`` for each part."""
    h = 0
    for p in parts:
        h = mix(h ^ (int(p) & MASK64))
    return h


def permutation(n: int, k: int) -> NDArray[np.int64]:
    """Indices ``0..n-1`` sorted by ``mix(k ^ i)``, ties broken by ``i``."""
    i = np.arange(n, dtype=np.uint64)
    h = mix_array(i ^ np.uint64(k & MASK64))
    return np.argsort(h, kind="stable").astype(np.int64, copy=False)


def order_of(n: int, k: int, shuffle: bool = True) -> NDArray[np.int64]:
    """``permutation(n, k)``, or ``0..n-1`` in order where ``shuffle`` is False (storage order, SPEC section 17).

    >>> order_of(5, key(0, 0, 1), shuffle=False).tolist()
    [0, 1, 2, 3, 4]
    """
    return permutation(n, k) if shuffle else np.arange(n, dtype=np.int64)
