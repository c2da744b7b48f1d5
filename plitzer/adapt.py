"""What the torch and Grain adapters share without importing torch or grain.

The checks that every rank makes the same live call (``set_weights``, ``set_layout``)
at the same step, given the adapter's all-gather of a few int64, and the refusal of
DataLoader's automatic batching (its collate of whole steps).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from plitzer.errors import ConfigError

__all__ = ["BATCH_SIZE_NONE", "refuse_collate", "same_layout_call", "same_weights_call"]

BATCH_SIZE_NONE = (
    "plitzer.torch.Dataset yields whole steps: use DataLoader(dataset, batch_size=None, num_workers=0). "
    "DataLoader's default batch_size=1 would wrap each step in a batch of one step and collate it, "
    "and a batch_size of k would join k steps: the global batch is already lanes x seq_len"
)


def refuse_collate(batch: Any, *, collate_fn_map: Any = None) -> Any:
    """Refuse to collate whole steps (the ``collate_fn_map`` entry of the adapter's batch type).

    Each step is already the global batch's rows of this rank: DataLoader's default
    ``batch_size=1`` would wrap it in a batch of one, a ``batch_size`` of k would join k.
    The adapter gives the steps in ``batch`` back to its dataset before calling this.
    """
    raise ConfigError(BATCH_SIZE_NONE)


IntGather = Callable[[list[int]], list[tuple[int, ...]]]
"""Every rank's int64 vector, in rank order (an all-gather)."""


def _weights_key(weights: object) -> object:
    """A JSON form of ``set_weights``' weights to compare across ranks (no parsing: that is the loader's)."""
    if isinstance(weights, Mapping):
        return sorted([str(k), repr(v)] for k, v in weights.items())
    return repr(weights)


def same_weights_call(step: int, weights: object, at_step: int | None, gather: IntGather) -> None:
    """Check that every rank calls ``set_weights`` at the same step with the same weights and ``at_step``.

    One small all-gather (the step, ``at_step`` and a hash of the weights: six int64 a
    rank); a mismatch is a ConfigError on every rank naming what each rank asked for.
    """
    key = json.dumps(_weights_key(weights), separators=(",", ":")).encode()
    digest = np.frombuffer(hashlib.sha256(key).digest(), dtype="<i8").tolist()
    got = gather([step, -1 if at_step is None else at_step, *digest])
    if len(set(got)) > 1:
        kinds = {k: i + 1 for i, k in enumerate(dict.fromkeys(c[2:] for c in got))}
        each = "; ".join(
            f"rank {r}: step {c[0]}, at_step {None if c[1] < 0 else c[1]}, weights #{kinds[c[2:]]}"
            for r, c in enumerate(got)
        )
        msg = (
            f"set_weights() differs across ranks ({each}; this rank asked for {weights!r}): every rank must "
            "make the same call at the same step"
        )
        raise ConfigError(msg)


def same_layout_call(step: int, lanes: int | None, seq_len: int | None, at_step: int | None, gather: IntGather) -> None:
    """Check that every rank calls ``set_layout`` at the same step with the same values (one all-gather)."""
    got = gather([step, *(-1 if v is None else int(v) for v in (lanes, seq_len, at_step))])
    if len(set(got)) > 1:

        def show(v: int) -> str:
            return "None" if v < 0 else str(v)

        each = "; ".join(
            f"rank {r}: step {c[0]}, lanes {show(c[1])}, seq_len {show(c[2])}, at_step {show(c[3])}"
            for r, c in enumerate(got)
        )
        msg = f"set_layout() differs across ranks ({each}): every rank must make the same call at the same step"
        raise ConfigError(msg)
