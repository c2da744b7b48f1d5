"""Keywords an entry point does not take: the TypeError that names the closest one (``planner.parameters`` re-exports).

Apart from the parameters' table, which it does not need: a caller passes the names it knows.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

__all__ = ["check_keywords", "unknown_keyword"]

F = TypeVar("F", bound=Callable[..., Any])


def unknown_keyword(caller: str, name: str, known: Iterable[str]) -> TypeError:
    """The TypeError for keyword ``name``, which ``caller`` does not take: the closest known name suggested.

    >>> print(unknown_keyword("Loader", "seqlen", ["seed", "lanes", "seq_len"]))
    Loader() got an unexpected keyword argument 'seqlen'; did you mean seq_len?
    >>> print(unknown_keyword("plan", "colour", ["seed", "lanes"]))
    plan() got an unexpected keyword argument 'colour'; it takes seed, lanes
    """
    import difflib

    names = list(dict.fromkeys(known))
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
    if not close:  # a prefix or a word of it (``len`` for ``seq_len``, ``deadline`` for ``retry_deadline``)
        close = [k for k in names if name and (k.startswith(name) or name in k.split("_"))][:1]
    hint = f"did you mean {close[0]}?" if close else f"it takes {', '.join(names)}"
    return TypeError(f"{caller}() got an unexpected keyword argument {name!r}; {hint}")


def check_keywords(caller: str) -> Callable[[F], F]:
    """Decorate a function so that an unknown keyword is :func:`unknown_keyword`'s TypeError naming ``caller``.

    For functions with an explicit signature (``planner.plan``); those taking
    ``**settings`` check them where they are read (``plitzer.state.settings.keywords``).
    """
    import functools

    def wrap(fn: F) -> F:
        params = inspect.signature(fn).parameters
        names = [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        allowed = frozenset(names)

        @functools.wraps(fn)
        def checked(*args: Any, **kwargs: Any) -> Any:
            for k in kwargs:
                if k not in allowed:
                    raise unknown_keyword(caller, k, names)
            return fn(*args, **kwargs)

        return checked  # type: ignore[return-value]

    return wrap
