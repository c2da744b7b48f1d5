"""What the torch and Grain adapters share without importing torch or grain.

The checks that every rank makes the same live call (``set_weights``, ``set_layout``)
at the same step, given the adapter's all-gather of a few int64, and the torch adapter's
refusals: DataLoader's automatic batching (its collate of whole steps), its worker
processes, a copy to another process, pinning without an accelerator, and a gather of
checkpoint parts without ``torch.distributed``; the checkpoint inside a state
either framework hands back; and the tensors a torch batch's ``to`` and ``pin_memory`` carry.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar

import numpy as np

from plitzer.errors import CheckpointError, ConfigError

__all__ = [
    "BATCH_SIZE_NONE",
    "CARRIED",
    "Carrier",
    "NOT_COPIED",
    "NOT_PINNED",
    "carried_like",
    "checkpoint_entry",
    "in_worker",
    "jax_rank_world",
    "map_tensors",
    "no_gather",
    "refuse_collate",
    "run_length",
    "same_layout_call",
    "same_weights_call",
]

BATCH_SIZE_NONE = (
    "plitzer.torch.Dataset yields whole steps: use DataLoader(dataset, batch_size=None, num_workers=0). "
    "DataLoader's default batch_size=1 would wrap each step in a batch of one step and collate it, "
    "and a batch_size of k would join k steps: the global batch is already lanes x seq_len"
)


CARRIED = ("tokens", "position_ids", "cu_seqlens", "piece_lengths", "pieces_per_row", "mask", "labels", "_source_ids")
"""The tensors of a ``plitzer.torch.Batch`` that ``to`` and ``pin_memory`` carry, besides its aligned columns
(``lanes``, ``cost`` and the per-source counts stay on the host; ``_source_ids`` once read)."""


class Carrier(Protocol):
    """What :func:`map_tensors` takes: a frozen dataclass of tensors and ``columns`` (``plitzer.torch.Batch``)."""

    @property
    def columns(self) -> dict[str, Any]: ...


B = TypeVar("B", bound=Carrier)


def map_tensors(batch: B, move: Callable[[Any], Any]) -> B:
    """``batch`` with ``move`` applied to each :data:`CARRIED` tensor and aligned column (None stays None)."""
    moved = {n: move(t) for n in CARRIED if (t := getattr(batch, n)) is not None}
    columns = {n: move(c) for n, c in batch.columns.items()}
    return dataclasses.replace(batch, columns=columns, **moved)  # type: ignore[type-var]  # a dataclass


def carried_like(tensor: Any, like: Any) -> Any:
    """``tensor`` (made on the host) where ``like`` is: on its device, or pinned where it is pinned."""
    if like.device.type != "cpu":
        return tensor.to(like.device)
    return tensor.pin_memory() if like.is_pinned() else tensor


def refuse_collate(batch: Any, *, collate_fn_map: Any = None) -> Any:
    """Refuse to collate whole steps (the ``collate_fn_map`` entry of the adapter's batch type).

    Each step is already the global batch's rows of this rank: DataLoader's default
    ``batch_size=1`` would wrap it in a batch of one, a ``batch_size`` of k would join k.
    The adapter gives the steps in ``batch`` back to its dataset before calling this.
    """
    raise ConfigError(BATCH_SIZE_NONE)


def run_length(steps: int | None) -> int:
    """An adapter's ``len()``: a finite run's steps (``epochs``, SPEC section 17); a run without end has none."""
    if steps is None:
        msg = "a run without end has no len(): give epochs= for a finite run, or ask steps_in_epoch(e)"
        raise TypeError(msg)
    return steps


def in_worker(worker: int, workers: int, threads: int | None) -> str:
    """The refusal of a torch Dataset iterated in DataLoader worker ``worker`` of ``workers``."""
    msg = (
        f"plitzer.torch.Dataset is running in DataLoader worker {worker} of {workers}: "
        "num_workers > 0 is not supported. Use DataLoader(dataset, batch_size=None, "
        "num_workers=0): plitzer already reads and decodes in its own threads "
        f"(threads={threads or os.cpu_count()}), and each worker "
        "process would give the same steps again, so batches would repeat and the "
        "checkpoint would not match what was trained"
    )
    return msg


NOT_COPIED = (
    "plitzer.torch.Dataset cannot be copied to another process (DataLoader num_workers > 0, "
    "or pickling): it holds running reader threads. Use DataLoader(dataset, batch_size=None, "
    "num_workers=0) and create the Dataset in the process that trains"
)
"""The refusal of a torch Dataset pickled (a DataLoader worker process, or a copy)."""

NOT_PINNED = "plitzer.torch.Dataset(pin_memory=True): no accelerator is available, so tensors are not pinned"
"""The warning of a torch Dataset asked to pin memory where no accelerator is."""


def no_gather(world: int) -> str:
    """The refusal of a torch Dataset's ``state_dict()`` at ``world`` > 1 without ``torch.distributed``."""
    msg = (
        f"state_dict() with world={world} gathers every rank's part through torch.distributed, "
        "which is not initialised. Call init_process_group first, or collect "
        "dataset.loader.checkpoint() from each rank yourself and join them with plitzer.merge"
    )
    return msg


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


def checkpoint_entry(state: object, what: str) -> object:
    """The ``"checkpoint"`` entry of an adapter's state (``what``: its name, for the message), else ``state``."""
    if not isinstance(state, Mapping):
        return state
    if "checkpoint" not in state:
        msg = f"{what} has a 'checkpoint' entry; got keys {sorted(map(str, state))}"
        raise CheckpointError(msg)
    return state["checkpoint"]


def jax_rank_world() -> tuple[int, int] | None:
    """(process_index, process_count) where JAX is imported and initialised, else None.

    Only asks JAX when it is already in this process and its distributed runtime or
    its backends are up: calling ``jax.process_count()`` earlier would start the
    backends, after which ``jax.distributed.initialize()`` can no longer be called.
    """
    jax = sys.modules.get("jax")
    if jax is None:
        return None
    ready = False
    distributed = getattr(jax, "distributed", None)
    is_initialized = getattr(distributed, "is_initialized", None)
    if callable(is_initialized):
        ready = bool(is_initialized())
    if not ready:
        bridge = sys.modules.get("jax._src.xla_bridge")
        up = getattr(bridge, "backends_are_initialized", None)
        ready = bool(up()) if callable(up) else False
    if not ready:
        return None
    return int(jax.process_index()), int(jax.process_count())
