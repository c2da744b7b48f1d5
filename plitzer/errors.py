"""plitzer's errors: one hierarchy, each also the matching builtin.

The classes are defined in :mod:`planner.errors` (``planner`` never imports
``plitzer``) and are the same objects here.
"""

from planner.errors import (
    CacheWarning,
    CheckpointError,
    ConfigError,
    DamagedChunkError,
    DataError,
    FileChangedError,
    PerformanceWarning,
    PlitzerError,
    PlitzerWarning,
    SelectionError,
    StaleIndexError,
    StoppedError,
    StorageError,
    StorageWaitWarning,
    TokenizerChangedError,
    TokenRangeError,
    UsageError,
)

__all__ = [
    "CacheWarning",
    "CheckpointError",
    "ConfigError",
    "DamagedChunkError",
    "DataError",
    "FileChangedError",
    "PerformanceWarning",
    "PlitzerError",
    "PlitzerWarning",
    "SelectionError",
    "StaleIndexError",
    "StorageError",
    "StorageWaitWarning",
    "StoppedError",
    "TokenRangeError",
    "TokenizerChangedError",
    "UsageError",
]
