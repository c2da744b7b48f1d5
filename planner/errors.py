"""The error hierarchy shared by ``planner`` and ``plitzer``.

Every error is a :class:`PlitzerError` and also the builtin a caller would catch
for that kind of problem, so ``except ValueError`` keeps working. Messages say
what is wrong, where (setting, file, row group, row) and how to fix it.
``plitzer.errors`` re-exports these same classes: ``planner`` must not import
``plitzer``, so the classes live here.
"""

from __future__ import annotations

__all__ = [
    "PerformanceWarning",
    "CheckpointError",
    "ConfigError",
    "DataError",
    "PlitzerError",
    "StorageError",
    "UsageError",
    "one_line",
]


class PlitzerError(Exception):
    """Base class of every error that plitzer raises on purpose."""


class ConfigError(PlitzerError, ValueError):
    """A setting is invalid: the message names the field, the value and the fix."""


class DataError(PlitzerError, ValueError):
    """The dataset is unusable: the message names the file, row group and row."""


class StorageError(PlitzerError, OSError):
    """Reading from disk or object storage failed after retries."""


class CheckpointError(PlitzerError, ValueError):
    """A checkpoint is damaged, foreign, or does not match the loader."""


class UsageError(PlitzerError, RuntimeError):
    """An object is used where it cannot work: after close(), or in a forked child."""


def one_line(e: BaseException) -> str:
    """An exception's message on one line (pyarrow's messages wrap, with indents)."""
    return " ".join(str(e).split())


class PerformanceWarning(UserWarning):
    """Settings that work but run slower than they could (say once, with the fix)."""
