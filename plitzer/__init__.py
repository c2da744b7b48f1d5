"""plitzer: a deterministic, resumable loader for pre-tokenized Parquet.

>>> import plitzer
>>> sorted(n for n in ("Loader", "merge", "plan") if hasattr(plitzer, n))
['Loader', 'merge', 'plan']
"""

# First: allocator defaults that must be in place before Polars and pyarrow load.
from plitzer.readpath import allocators  # noqa: F401, I001

from plitzer import mixing, synth
from plitzer.readpath.batch import Batch, Tokens
from plitzer.errors import (
    CacheWarning,
    CheckpointError,
    ConfigError,
    DataError,
    FileChangedError,
    PerformanceWarning,
    PlitzerError,
    PlitzerWarning,
    StorageError,
    StorageWaitWarning,
    UsageError,
)
from plitzer.tools.explain import explain
from plitzer.loader import Loader, LoaderSettings
from plitzer.tools.locate import locate
from plitzer.selection.select import select_spec as selector
from plitzer.selection.dedupe import dedupe_index as deduper
from planner import index, plan
from planner.parameters import Selection
from plitzer.state.checkpoint import load_checkpoint, merge, save_checkpoint

__version__ = "0.7.0.dev0"  # the one source of the version: pyproject.toml reads it from here

__all__ = [
    "Batch",
    "CacheWarning",
    "CheckpointError",
    "ConfigError",
    "DataError",
    "FileChangedError",
    "PerformanceWarning",
    "Loader",
    "LoaderSettings",
    "PlitzerError",
    "PlitzerWarning",
    "Selection",
    "StorageError",
    "StorageWaitWarning",
    "Tokens",
    "UsageError",
    "__version__",
    "deduper",
    "explain",
    "index",
    "load_checkpoint",
    "locate",
    "merge",
    "mixing",
    "plan",
    "save_checkpoint",
    "selector",
    "synth",
]
