"""``Executor.map`` with a bounded number of tasks in flight.

``ThreadPoolExecutor.map`` submits every item before it yields the first result, and
each pending task holds a ``Future`` (a lock, a condition and their waiters: about 1.7 KB
on CPython 3.12). Over a listing's row groups that is kilobytes a row group, held until
the last task runs: more than the whole index costs (docs/design.md, "Bytes a row group").
:func:`map_ahead` submits as the results are taken, so what a pass over row groups holds
in tasks is bounded by ``ahead``, not by the row groups. The standard library has no
bounded map (``concurrent.futures.Executor.map`` gained ``buffersize`` only in 3.14).

>>> from concurrent.futures import ThreadPoolExecutor
>>> with ThreadPoolExecutor(2) as pool:
...     list(map_ahead(pool, lambda x: x * x, range(5), ahead=2))
[0, 1, 4, 9, 16]
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future
from typing import TypeVar

__all__ = ["AHEAD", "map_ahead"]

T = TypeVar("T")
R = TypeVar("R")

AHEAD = 256
"""Tasks in flight by default: enough to keep dozens of threads busy, a few hundred KB at most."""


def map_ahead(pool: Executor, fn: Callable[[T], R], items: Iterable[T], ahead: int = AHEAD) -> Iterator[R]:
    """``pool.map(fn, items)``, in order, with at most ``ahead`` items submitted and not yet taken.

    The items are read only as far as the results have been taken (``ahead`` beyond). A
    task's error is raised where its result is taken; the tasks not yet started are
    cancelled when the iterator is closed early.
    """
    pending: deque[Future[R]] = deque()
    try:
        for item in items:
            pending.append(pool.submit(fn, item))
            if len(pending) >= max(1, ahead):
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        for f in pending:
            f.cancel()
