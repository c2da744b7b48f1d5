"""The NumPy array types that planner and plitzer annotate with, named once."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

__all__ = ["I64", "U64"]

I64 = NDArray[np.int64]
"""An int64 array: positions, lengths, counts, ids."""

U64 = NDArray[np.uint64]
"""A uint64 array: hashes and keys."""
