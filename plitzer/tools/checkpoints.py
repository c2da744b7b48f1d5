"""``plitzer checkpoint``: what checkpoint files hold, and their parts merged into one.

A checkpoint is typed bytes (plitzer.state.checkpoint): every file is read with
:func:`~plitzer.state.checkpoint.load_checkpoint`, which checks it whole (the magic, the
format version, the digest, every field) before anything is shown, so a truncated,
foreign or hostile file is one :class:`~planner.errors.CheckpointError` naming it.
Several files are the parts of one run's ranks: they are merged
(:func:`~plitzer.state.checkpoint.merge`, which refuses parts that disagree, overlap
or leave lanes out) and the merged checkpoint described, or written with ``out``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import polars as pl

from planner.errors import CheckpointError
from plitzer.state.checkpoint import State, decode, lanes_at, load_checkpoint, merge, save_checkpoint

__all__ = ["describe"]


def _load(path: str) -> bytes:
    try:
        return load_checkpoint(path)
    except CheckpointError as e:
        msg = f"{path}: {e}"
        raise CheckpointError(msg) from None


def describe(paths: Sequence[str | os.PathLike[str]], out: str | None = None) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(summary, config) of the checkpoint the files make: one file, or every rank's part merged.

    With ``out``, the merged checkpoint is written there too (atomically, as ``save_checkpoint``).
    """
    if not paths:
        msg = "give at least one checkpoint file"
        raise CheckpointError(msg)
    parts = [_load(os.fspath(p)) for p in paths]
    data = parts[0] if len(parts) == 1 else merge(parts)
    st: State = decode(data)
    if out is not None:
        save_checkpoint(out, data)
    lanes = st.lanes
    global_lanes = lanes_at(st.config, st.step)
    epochs = st.positions[:, 1]
    summary = pl.DataFrame(
        {
            "step": [st.step],
            "lanes": [len(lanes)],
            "lanes_of_the_step": [global_lanes],
            "whole": [len(lanes) == global_lanes],
            "parts": [len(parts)],
            "epochs": [f"{int(epochs.min())}-{int(epochs.max())}" if len(epochs) else ""],
            "bytes": [len(data)],
        }
    )
    config = pl.DataFrame(
        {"field": list(st.config), "value": [_text(v) for v in st.config.values()]},
        schema={"field": pl.String, "value": pl.String},
    )
    return summary, config


def _text(v: Any) -> str:
    return v if isinstance(v, str) else repr(v)
