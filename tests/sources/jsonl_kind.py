"""A fourth kind of source, written as a user adds one: JSON lines of token lists (SPEC section 21 item 3).

This module is everything such a kind takes: it would be ``plitzer/sources/jsonl_tokens.py``,
with ``"jsonl_tokens"`` added to ``plitzer.sources.KINDS``. The test
(tests/sources/test_a_fourth_kind.py) installs it under that name and adds that one line, and
every entry point then reads it: nothing else in plitzer or planner names it.

A source is a folder of ``*.jsonl`` files; each line is a document, a JSON list of token ids;
a row group is :data:`ROWS` consecutive lines, read with one ranged read of its bytes.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from planner.catalog.files import BatchReader
from planner.catalog.rowgroups import Capabilities
from planner.mixing.sources import SourceSpec
from planner.stores.storage import FileStat, Storage
from plitzer.sources.files import FIELDS, is_url, local_listing, read_whole

__all__ = ["JSONL", "ROWS", "JsonlFormat", "format_of"]

ROWS = 9
"""Lines a row group."""
JSONL = Capabilities("jsonl", selectable=False, other_columns=False, column_runs=False)
"""Tokens only: no columns for ``where=``."""


def format_of(spec: SourceSpec) -> JsonlFormat | None:
    """The kind's format where ``spec``'s path is a local folder of ``*.jsonl`` files, else None (another kind's)."""
    if not isinstance(spec.path, (str, os.PathLike)) or is_url(spec.path):
        return None
    path = Path(spec.path)
    found = sorted(path.glob("*.jsonl")) if path.is_dir() else []
    return JsonlFormat(local_listing(path, found)) if found else None


@dataclass(frozen=True)
class JsonlFormat:
    """JSON lines as a :class:`plitzer.sources.files.Format`."""

    listed: tuple[str, Storage, list[FileStat]] = field(compare=False)
    capabilities: Capabilities = JSONL
    column: str = "tokens"
    dtype: str = "int32"
    key: str = f"rows={ROWS}"

    def listing(self) -> tuple[str, Storage, list[FileStat]]:
        return self.listed

    def row_groups(self, file: FileStat) -> np.ndarray:
        """Rows, tokens, empty documents, byte offset and length of each run of :data:`ROWS` lines."""
        data = bytes(read_whole(self.listed[1], file))
        ends = [i + 1 for i, b in enumerate(data) if b == ord("\n")]
        starts = [0, *ends[:-1]]
        lengths = [len(json.loads(data[a:b])) for a, b in zip(starts, ends, strict=True)]
        out = []
        for g in range(0, len(ends), ROWS):
            n = lengths[g : g + ROWS]
            out.append([len(n), sum(n), n.count(0), starts[g], ends[g + len(n) - 1] - starts[g]])
        return np.asarray(out, np.int64).reshape(-1, FIELDS)

    def read(self, file: FileStat, data: bytes, row_group: int, where: str) -> pa.Array:
        return pa.array([json.loads(line) for line in bytes(data).splitlines()], pa.large_list(pa.int64()))

    def reader(self, file: FileStat) -> BatchReader | None:
        return None
