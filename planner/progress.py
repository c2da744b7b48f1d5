"""When a progress bar is shown: on a terminal for long work, or when asked (docs/design.md, "Progress bars").

Every bar plitzer makes (footers, counting and selection passes, document lengths,
tokenizing) asks :func:`progress_enabled` and hands tqdm ``disable=not shown``. A bar
written to a file or a pipe (a job's log, a captured stderr) is noise on the line of
the error that follows, so it is shown there only when asked.

``requested`` is the caller's ``progress=``: ``True`` always shows, ``False`` never,
``None`` shows on a terminal when the work has at least ``threshold`` items.
``PLITZER_PROGRESS=1`` asks for bars everywhere (a log that wants them), ``=0`` for none.

>>> progress_enabled(True, 1, 64), progress_enabled(False, 10**6, 64)
(True, False)
>>> progress_enabled(None, 10**6, 64, stream=io.StringIO())  # not a terminal
False
"""

from __future__ import annotations

import io
import os
import sys
from typing import TextIO

__all__ = ["progress_enabled", "terminal_progress"]


def _asked() -> bool | None:
    raw = os.environ.get("PLITZER_PROGRESS", "").strip().lower()
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    return None


def _is_terminal(stream: TextIO | io.StringIO | None) -> bool:
    s = sys.stderr if stream is None else stream
    try:
        return bool(s.isatty())
    except (AttributeError, ValueError, OSError):  # closed, or not a real stream
        return False


def progress_enabled(
    requested: bool | None, n: int, threshold: int = 0, *, stream: TextIO | io.StringIO | None = None
) -> bool:
    """Whether to show a bar over ``n`` items (module docstring): asked, or a terminal and long work."""
    if requested is not None:
        return bool(requested)
    asked = _asked()
    if asked is not None:
        return asked
    return n >= threshold and _is_terminal(stream)


def terminal_progress() -> bool | None:
    """What a command line passes as ``progress=``: None (a bar on a terminal), or PLITZER_PROGRESS's answer."""
    return _asked()
