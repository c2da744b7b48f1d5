"""plitzer's errors: one hierarchy, each also the matching builtin.

The classes are defined in :mod:`planner.errors` (``planner`` never imports
``plitzer``) and are the same objects here.
"""

from planner.errors import (
    CheckpointError,
    ConfigError,
    DataError,
    PerformanceWarning,
    PlitzerError,
    StorageError,
    UsageError,
)

__all__ = [
    "CheckpointError",
    "ConfigError",
    "DataError",
    "PerformanceWarning",
    "PlitzerError",
    "StorageError",
    "UsageError",
]
