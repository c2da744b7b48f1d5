"""planner: Parquet footers in, each epoch's plan as small tables out.

Pure planning: reads Parquet metadata only, never token data, and never imports
torch or plitzer. (A row group whose footer lacks statistics is counted by the
runtime's reader, ``plitzer.readpath.read.count_chunk``, passed in as a ``ChunkCounter``.)

>>> import planner
>>> planner.permutation(4, planner.key(7, 0, 1)).tolist()
[0, 3, 1, 2]
"""

from planner.api import index as _index
from planner.api import plan
from planner.catalog.datasetindex import Index
from planner.catalog.rowgroups import RowGroupIndex
from planner.errors import CheckpointError, ConfigError, DataError, PlitzerError, StorageError
from planner.hashing import key, mix, permutation
from planner.lanes import cut_at, lane_of
from planner.order.epoch import EpochPlan, PlanSettings, plan_epoch
from planner.order.plan import Plan
from planner.parameters import check_keywords as _check_keywords
from planner.stores.cache import cache_dir

index = _check_keywords("planner.index")(_index)  # a misspelt keyword: TypeError suggesting the name

__all__ = [
    "CheckpointError",
    "ConfigError",
    "DataError",
    "EpochPlan",
    "Index",
    "Plan",
    "PlanSettings",
    "PlitzerError",
    "RowGroupIndex",
    "StorageError",
    "cache_dir",
    "cut_at",
    "index",
    "key",
    "lane_of",
    "mix",
    "permutation",
    "plan",
    "plan_epoch",
]
