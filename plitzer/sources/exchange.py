"""What a kind's shared pass needs of a job's collective: an all-gather that raises the first rank's error.

A ``plitzer.state.groups.Collective`` (this rank, the world, ``all_gather``) is passed in; the
kinds (``share`` of :mod:`plitzer.sources.files`, of the Parquet and text kinds) and
``plitzer.state.share`` exchange through these two functions, so a rank whose step fails sends its
exception instead and every rank raises it: no rank waits on a collective the others left.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["all_or_raise", "attempt"]


def all_or_raise(value: Any, group: Any) -> list[Any]:
    """All-gather ``value`` (or the exception it is), raising the first rank's error on every rank."""
    out = group.all_gather(value)
    for got in out:
        if isinstance(got, BaseException):
            raise got
    return list(out)


def attempt(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, or the exception it raised (to be sent to every rank and raised there)."""
    try:
        return fn(*args)
    except Exception as e:
        return e
