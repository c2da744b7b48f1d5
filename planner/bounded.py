"""One policy for the in-memory caches: a map of at most ``size`` entries that drops the least recently used.

Footers and chunk footers (:mod:`planner.catalog.datasetindex`), epochs' plans
(:mod:`planner.order.plan`, :mod:`planner.mixing`), positions (:mod:`planner.lookup`),
``explain``'s documents and each reader thread's decoders (``plitzer.readpath.readers``)
keep a few entries of something that is cheap to make
again and costly to hold: a :class:`Bounded` each, instead of a hand-written
``OrderedDict`` (or a dict cleared when full) with its own eviction.

Every call takes the map's lock, so one map may be shared by threads; a copy
(:meth:`Bounded.copy`, :func:`copy.copy` of a holder then ``.copy()``) shares the
values, not the map. It pickles (a plan sent to another process), the lock made anew.

>>> c = Bounded[str, int](2)
>>> c.put("a", 1), c.put("b", 2), c.get("a"), c.put("c", 3)
([], [], 1, ['b'])
>>> sorted(c), len(c), c.get("b")
(['a', 'c'], 2, None)
>>> c.get_or_make("d", lambda: 4), list(c)
(4, ['c', 'd'])
>>> c.discard("c"), c.discard("x"), list(c)
(None, None, ['d'])
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar, overload

__all__ = ["Bounded"]

K = TypeVar("K")
V = TypeVar("V")
D = TypeVar("D")
_MISSING: Any = object()


class Bounded(Generic[K, V]):
    """At most ``size`` entries; :meth:`put` beyond that drops the least recently used (got or put) first."""

    __slots__ = ("_items", "_lock", "size")

    def __init__(self, size: int) -> None:
        if size < 1:
            msg = f"size={size} must be >= 1"
            raise ValueError(msg)
        self.size = size
        self._items: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    @overload
    def get(self, key: K) -> V | None: ...
    @overload
    def get(self, key: K, default: D) -> V | D: ...
    def get(self, key: K, default: Any = None) -> Any:
        """The value of ``key`` (now the most recently used), else ``default``."""
        with self._lock:
            got = self._items.get(key, _MISSING)
            if got is _MISSING:
                return default
            self._items.move_to_end(key)
            return got

    def put(self, key: K, value: V) -> list[K]:
        """Keep ``value`` under ``key`` (the most recently used); returns the keys dropped to stay within ``size``."""
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            dropped = []
            while len(self._items) > self.size:
                dropped.append(self._items.popitem(last=False)[0])
            return dropped

    def get_or_make(self, key: K, make: Callable[[], V]) -> V:
        """The value of ``key``, else ``make()``'s, kept (``make`` runs outside the lock: two threads may make it)."""
        got = self.get(key, _MISSING)
        if got is _MISSING:
            got = make()
            self.put(key, got)
        return got

    def copy(self) -> Bounded[K, V]:
        """A new map of the same size and entries (the values shared)."""
        new = Bounded[K, V](self.size)
        with self._lock:
            new._items = OrderedDict(self._items)
        return new

    def discard(self, key: K) -> None:
        """Drop ``key``'s entry, if there is one (a value found bad)."""
        with self._lock:
            self._items.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()

    def values(self) -> list[V]:
        with self._lock:
            return list(self._items.values())

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __iter__(self) -> Iterator[K]:
        with self._lock:
            return iter(list(self._items))

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"Bounded({len(self)} of {self.size})"

    def __getstate__(self) -> tuple[int, OrderedDict[K, V]]:
        with self._lock:
            return self.size, OrderedDict(self._items)

    def __setstate__(self, state: tuple[int, Any]) -> None:
        self.size, self._items = state
        self._lock = threading.Lock()
