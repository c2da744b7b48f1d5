"""The error hierarchy shared by ``planner`` and ``plitzer``.

Every error is a :class:`PlitzerError` and also the builtin a caller would catch
for that kind of problem, so ``except ValueError`` keeps working. Messages say
what is wrong, where (setting, file, row group, row) and how to fix it.
``plitzer.errors`` re-exports these same classes: ``planner`` must not import
``plitzer``, so the classes live here.
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any

__all__ = [
    "CacheWarning",
    "PerformanceWarning",
    "PlitzerWarning",
    "StorageWaitWarning",
    "CheckpointError",
    "ConfigError",
    "DamagedChunkError",
    "DataError",
    "FileChangedError",
    "TokenRangeError",
    "TokenizerChangedError",
    "PlitzerError",
    "SelectionError",
    "StaleIndexError",
    "StorageError",
    "StoppedError",
    "UsageError",
    "one_line",
    "warn_caller",
]


class PlitzerError(Exception):
    """Base class of every error that plitzer raises on purpose."""


class ConfigError(PlitzerError, ValueError):
    """A setting is invalid: the message names the field, the value and the fix."""


class SelectionError(ConfigError):
    """A ``where=`` predicate (or ``length_column``) that cannot select: missing column, not boolean, nothing kept.

    ``predicate`` is the predicate (normalized where it parsed), ``column`` the column at
    fault (None where none is), ``available`` the dataset's columns one may select on.
    """

    def __init__(self, msg: str, *, predicate: str, column: str | None = None, available: tuple[str, ...] = ()) -> None:
        super().__init__(msg)
        self.predicate, self.column, self.available = predicate, column, available

    def __reduce__(self) -> tuple[Any, ...]:  # keep the attributes across processes (pickle)
        return _rebuild_selection, (str(self), self.predicate, self.column, self.available)


def _rebuild_selection(msg: str, predicate: str, column: str | None, available: tuple[str, ...]) -> SelectionError:
    return SelectionError(msg, predicate=predicate, column=column, available=available)


class DataError(PlitzerError, ValueError):
    """The dataset is unusable: the message names the file, row group and row.

    ``file``, ``row_group`` and ``row`` say the same for code (None where unknown or
    not at fault): ``except TokenRangeError as e: skip(e.file, e.row_group, e.row)``.
    """

    def __init__(self, msg: str, *, file: str | None = None, row_group: int | None = None, row: int | None = None):
        super().__init__(msg)
        self.file, self.row_group, self.row = file, row_group, row

    def __reduce__(self) -> tuple[Any, ...]:  # keep the attributes across processes (pickle)
        return _rebuild, (type(self), str(self), self.file, self.row_group, self.row)


def _rebuild(cls: type[DataError], msg: str, file: str | None, row_group: int | None, row: int | None) -> DataError:
    return cls(msg, file=file, row_group=row_group, row=row)


class DamagedChunkError(DataError):
    """A column chunk does not decode, or decodes to other rows or tokens than its footer says."""


class TokenRangeError(DataError):
    """A token does not fit the batch dtype (int32, or uint32): ``row`` is the document."""


class TokenizerChangedError(DataError):
    """A text row group tokenized to another count than the counting pass gave: the tokenizer changed."""


class StorageError(PlitzerError, OSError):
    """Reading from disk or object storage failed after retries."""


class FileChangedError(StorageError):
    """A file changed (size, mtime or ETag) after it was indexed, under a running loader."""

    def __init__(self, msg: str, *, file: str | None = None, row_group: int | None = None, row: int | None = None):
        super().__init__(msg)
        self.file, self.row_group, self.row = file, row_group, row


class StaleIndexError(ConfigError):
    """A job index whose files are not the dataset's any more (one added, removed or changed)."""

    def __init__(self, msg: str, *, file: str | None = None):
        super().__init__(msg)
        self.file = file


class CheckpointError(PlitzerError, ValueError):
    """A checkpoint is damaged, foreign, or does not match the loader."""


class UsageError(PlitzerError, RuntimeError):
    """An object is used where it cannot work: after close(), or in a forked child."""


class StoppedError(UsageError):
    """The loader was closed (by ``close()``, another thread, or the interpreter's end) while this waited.

    A step blocked in ``next()`` and a request waiting for a store that does not answer
    end with it at once instead of waiting out ``retry_deadline``.
    """


def one_line(e: BaseException) -> str:
    """An exception's message on one line (pyarrow's messages wrap, with indents)."""
    return " ".join(str(e).split())


# The packages' folders: a warning points past their frames, at the line that called into them.
_OWN = tuple(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep + p + os.sep for p in ("planner", "plitzer")
)


def warn_caller(message: str, category: type[Warning]) -> None:
    """``warnings.warn`` pointing at the first frame outside planner and plitzer: the user's line that led here.

    Where the warning is raised depends on the call (a footer read at construction, a
    reader's wait below ``next_batch``), so no fixed ``stacklevel`` is right. Python 3.12's
    ``skip_file_prefixes`` skips the packages' frames; on 3.11 the warning points at the
    line in plitzer that raised it.
    """
    if sys.version_info >= (3, 12):
        warnings.warn(message, category, skip_file_prefixes=_OWN)
    else:
        warnings.warn(message, category, stacklevel=2)


class PlitzerWarning(UserWarning):
    """Base class of every warning plitzer gives: something works, but not as well as it could."""


class PerformanceWarning(PlitzerWarning):
    """Settings that work but run slower than they could (say once, with the fix)."""


class CacheWarning(PlitzerWarning):
    """The local cache (``PLITZER_CACHE``) had a damaged entry, or cannot be written: it costs time, never rows.

    A damaged entry (truncated, garbled, empty) is discarded and rebuilt from the
    dataset; a folder that cannot be created or written means running uncached.
    """


class StorageWaitWarning(PlitzerWarning):
    """The store stopped answering and requests wait for it (``storage_options`` ``retry_deadline``), or it is back."""
