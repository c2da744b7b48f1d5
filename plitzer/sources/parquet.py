"""Parquet token columns: the kind that claims every source no other kind claims.

A path, an ``s3://`` (``gs://``, ``az://``, ``hf://``, ``http(s)://``) URL, a list of them, an
index already built, or a dict of named sources (a mixture: each source opened by its own kind's
rules inside :func:`planner.api.open_index`). planner lists the files, reads the footers
(:mod:`planner.catalog`) and counts; :func:`plitzer.readpath.read.parquet_tokens` reads a row
group's token column chunk in one ranged read. Capabilities: every pass
(:data:`planner.catalog.rowgroups.PARQUET`).
"""

from __future__ import annotations

from typing import Any

from planner.api import Source

__all__ = ["claims", "prepare"]


def claims(source: Source, settings: Any) -> bool:
    """Every source: Parquet is the default kind, asked last."""
    return True


def prepare(source: Source, settings: Any) -> tuple[Source, dict[str, Any]]:
    """``source`` as given: planner opens it (paths, an index, a mixture)."""
    return source, {}
