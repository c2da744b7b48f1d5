"""plitzer's errors: one hierarchy, each also the matching builtin.

The classes are defined in :mod:`planner.errors` (``planner`` never imports
``plitzer``) and are the same objects here.
"""

from planner.errors import (
    CheckpointError,
    ConfigError,
    DamagedChunkError,
    DataError,
    FileChangedError,
    PerformanceWarning,
    PlitzerError,
    SelectionError,
    StaleIndexError,
    StorageError,
    TokenizerChangedError,
    TokenRangeError,
    UsageError,
)

__all__ = [
    "CheckpointError",
    "ConfigError",
    "DamagedChunkError",
    "DataError",
    "FileChangedError",
    "PerformanceWarning",
    "PlitzerError",
    "SelectionError",
    "StaleIndexError",
    "StorageError",
    "TokenRangeError",
    "TokenizerChangedError",
    "UsageError",
]
