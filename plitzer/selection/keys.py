"""Keys of documents for deduplication and exclusion: 128 bits a row, hashed vectorized (SPEC section 14).

A row's key is two independent 64-bit hashes (``(n, 2)`` uint64) of its value: for
``dedupe="tokens"`` its token list, for a column its value (a string's bytes, an
integer, a float's bits, a list's elements), for an exclusion table the tuple of its
columns' values. Each element ``v`` at position ``j`` of a row of length ``n`` gives
the term ``mix(v ^ mix(j + s))`` (``mix``: SplitMix64's finalizer, a bijection of 64-bit
words; ``s`` the lane's seed) and a row's hash is ``mix(sum of its terms + mix(n + s))``,
sums modulo 2**64 computed as differences of one cumulative sum: no Python loop over
rows, a few NumPy passes over the values.

Collision bound. Treating each lane as a random function, two different rows share
both 64-bit hashes with probability 2**-128, so among ``N`` documents the chance that any
two different ones collide is at most ``N**2 / 2**129`` (10**9 documents: under 1.5e-21).
Deduplication trusts the hash; an exclusion match is checked value by value.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from planner.arraytypes import U64
from planner.bounded import Bounded
from planner.errors import ConfigError

__all__ = ["Keys", "combine", "hash_array", "hash_lists", "valid_rows"]

Keys = NDArray[np.uint64]
"""``(rows, 2)`` uint64: each row's two 64-bit hashes."""

_SEEDS = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xD1B54A32D192ED03))
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)
_BLOCK = 1 << 16
"""Values a block: the mixing runs on blocks that stay in the CPU's cache."""


def _mix(x: U64, tmp: U64 | None = None) -> U64:
    """SplitMix64's finalizer, element-wise (wrapping arithmetic), in place on a fresh ``x``."""
    t = np.empty_like(x) if tmp is None else tmp[: len(x)]
    with np.errstate(over="ignore"):
        np.right_shift(x, _S30, out=t)
        x ^= t
        x *= _M1
        np.right_shift(x, _S27, out=t)
        x ^= t
        x *= _M2
        np.right_shift(x, _S31, out=t)
        x ^= t
        return x


_KEPT = 1 << 20
"""The longest table of positions kept (8 MiB a lane): longer documents' tables are made for the call."""

# Each lane's table of position terms, grown as needed, shared by every call: one entry a
# lane (two), each at most _KEPT long, so 16 MiB at most however long the documents are.
_POS = Bounded[int, U64](len(_SEEDS))


def _positions(lane: int, n: int) -> U64:
    """``mix(j + seed)`` for j < n (grown as needed up to ``_KEPT``, shared by every call)."""
    have = _POS.get(lane)
    if have is None or len(have) < n:
        size = max(n, 1 << 16, 2 * (0 if have is None else len(have)))
        size = n if n > _KEPT else min(size, _KEPT)
        with np.errstate(over="ignore"):
            have = _mix(np.arange(size, dtype=np.uint64) + _SEEDS[lane])
        if size <= _KEPT:
            _POS.put(lane, have)
    return have


def hash_lists(offsets: NDArray[np.int64], values: U64) -> Keys:
    """The key of every row of a list (or bytes) array given as ``offsets`` into ``values``."""
    offsets = np.asarray(offsets, np.int64)
    n = len(offsets) - 1
    out = np.empty((n, 2), np.uint64)
    if n == 0:
        return out
    lo, hi = int(offsets[0]), int(offsets[-1])
    vals = np.asarray(values[lo:hi], np.uint64)
    lengths = np.diff(offsets)
    pos = np.arange(hi - lo, dtype=np.int64)
    pos -= np.repeat(offsets[:-1] - lo, lengths)
    longest = int(lengths.max()) if n else 0
    rel = offsets - lo
    total = hi - lo
    tmp = np.empty(min(total, _BLOCK), np.uint64)
    term = np.empty(min(total, _BLOCK), np.uint64)
    with np.errstate(over="ignore"):
        for lane, seed in enumerate(_SEEDS):
            table = _positions(lane, longest + 1)
            cs = np.empty(total + 1, np.uint64)
            cs[0] = 0
            carry = np.uint64(0)
            for a in range(0, total, _BLOCK):  # one block at a time: the mixing's passes stay in cache
                b = min(total, a + _BLOCK)
                t = term[: b - a]
                np.take(table, pos[a:b], out=t)
                t ^= vals[a:b]
                _mix(t, tmp)
                np.cumsum(t, dtype=np.uint64, out=cs[a + 1 : b + 1])
                cs[a + 1 : b + 1] += carry
                carry = cs[b]
            sums = cs[rel[1:]] - cs[rel[:-1]]
            sums += _mix(lengths.astype(np.uint64) + seed)
            out[:, lane] = _mix(sums)
    return out


def combine(parts: list[Keys]) -> Keys:
    """One key of several columns' keys (a row of an exclusion table: all its columns)."""
    if len(parts) == 1:
        return parts[0]
    flat = np.stack(parts, axis=1).reshape(len(parts[0]), -1)  # (rows, 2 * columns)
    offsets = np.arange(0, flat.size + 1, flat.shape[1], dtype=np.int64)
    return hash_lists(offsets, flat.reshape(-1))


def _flat(arr: pa.Array) -> pa.Array:
    return arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr


def _scalars(arr: pa.Array, what: str) -> U64:
    """One 64-bit word a row of a primitive array (nulls as 0: :func:`valid_rows` leaves them out)."""
    t = arr.type
    if pa.types.is_floating(t):
        f = np.asarray(pc.fill_null(arr.cast(pa.float64()), 0.0).to_numpy(zero_copy_only=False), np.float64) + 0.0
        return f.view(np.uint64)  # + 0.0: -0.0 and 0.0 are one value
    if pa.types.is_boolean(t) or pa.types.is_integer(t) or pa.types.is_temporal(t) or pa.types.is_decimal(t):
        if pa.types.is_decimal(t):
            arr = arr.cast(pa.string())
            return hash_array(arr, what)[:, 0]
        if pa.types.is_integer(t) and arr.null_count == 0:  # the common case (token ids): no Arrow cast
            return np.asarray(arr.to_numpy(zero_copy_only=True)).astype(np.int64).view(np.uint64)
        try:
            ints = arr.cast(pa.int64()) if not pa.types.is_unsigned_integer(t) else arr.cast(pa.uint64())
        except (pa.ArrowException, ValueError):
            ints = arr.cast(pa.timestamp("ns")).cast(pa.int64())
        return np.asarray(pc.fill_null(ints, 0).to_numpy(zero_copy_only=False)).astype(np.int64).view(np.uint64)
    msg = f"{what} is {t}: deduplication and exclusion compare strings, binary, numbers, dates and lists of them"
    raise ConfigError(msg)


def hash_array(arr: pa.Array, what: str = "the column") -> Keys:
    """The key of every value of ``arr`` (strings, binary, numbers, dates, lists of those)."""
    arr = _flat(arr)
    t = arr.type
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t):
        b = arr.cast(pa.large_binary())
        offsets = np.frombuffer(b.buffers()[1], np.int64)[b.offset : b.offset + len(b) + 1]
        data = b.buffers()[2]
        values = np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)
        return hash_lists(offsets, values.astype(np.uint64))
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        lst = arr.cast(pa.large_list(t.value_type)) if not pa.types.is_large_list(t) else arr
        offsets = np.asarray(lst.offsets.to_numpy(zero_copy_only=False), np.int64)
        inner = lst.values
        if pa.types.is_string(inner.type) or pa.types.is_large_string(inner.type) or pa.types.is_binary(inner.type):
            words = hash_array(inner, what)[:, 0]
        else:
            words = _scalars(inner, what)
        return hash_lists(offsets, words)
    words = _scalars(arr, what)
    offsets = np.arange(len(words) + 1, dtype=np.int64)
    return hash_lists(offsets, words)


def valid_rows(arr: pa.Array) -> NDArray[np.bool_]:
    """True where ``arr`` is not null (a null never equals anything)."""
    arr = _flat(arr)
    if arr.null_count == 0:
        return np.ones(len(arr), bool)
    return np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), bool)
