"""A source's files: the listing in index order, and each file's entry.

:func:`list_files` lists the ``*.parquet`` files below a source (bytewise order of their path
relative to it; a list source's files named by their source's position); a :class:`FileEntry`
holds a file's stat and storage, and what the index keeps of its footer (the column's template,
the carried columns, the first file's schema).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.parquet as pq

from planner.catalog.chunkmeta import ColumnChunks, Template
from planner.errors import ConfigError
from planner.stores.backends import open_storages
from planner.stores.storage import FileStat, Storage

__all__ = ["BatchReader", "FileEntry", "list_files"]


class BatchReader(Protocol):
    """A file's own reader of its row groups, where the file is not Parquet (``FileEntry.reader``).

    An Arrow IPC file's record batches (``plitzer.sources.arrow``): a row group of the index is
    one message of the file, at the frame's ``byte_offset`` and ``byte_length``, decoded with
    every column. Every index over the file's entries (its own, a selection's, a
    deduplication's) reads a column through it, so no pass asks which kind of index it has.
    """

    @property
    def schema(self) -> pa.Schema:
        """The file's Arrow schema."""
        ...

    def read(self, offset: int, length: int, where: str) -> pa.RecordBatch:
        """The row group at ``offset`` (``length`` bytes), every column, every stored row; ``where`` for messages."""
        ...


@dataclass
class FileEntry:
    stat: FileStat
    storage: Storage
    metadata: pq.FileMetaData | None = None
    """The parsed footer, only while the index is built (a counting step reads it)."""
    raw: bytes | None = None
    """The footer bytes where they came with the listing (a rank's exchange of a text source's footers)."""
    template: Template | None = None
    """What decoding the index's column needs of the footer (planner.catalog.chunkmeta): kept, the footer not."""
    columns: dict[str, ColumnChunks] = field(default_factory=dict)
    """The other columns a job index carries (``--columns``): the same, a column at a time."""
    schema: pa.Schema | None = None
    """The file's Arrow schema where a job index carries it (the first file's, with ``--columns``)."""
    job_index: str | None = None
    """The job index the entry was read from (for the message that it lacks a column), else None."""
    reader: BatchReader | None = None
    """The file's own reader of its row groups where it is not Parquet (an Arrow IPC file); None: Parquet,
    decoded through footers."""


def list_files(
    source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], storage_options: Mapping[str, Any] | None
) -> tuple[list[FileEntry], str]:
    """The ``*.parquet`` files of ``source`` in index order, and the source for messages."""
    storages = open_storages(source, storage_options)
    entries: list[FileEntry] = []
    for i, s in enumerate(storages):
        for found in s.list_files():
            # Files of a list source are named by their source's position, so two
            # folders with the same file names stay distinct.
            st = (
                found
                if len(storages) == 1
                else FileStat(f"{i}/{found.name}", found.location, found.size, found.version)
            )
            entries.append(FileEntry(stat=st, storage=s))
    src = ", ".join(s.url for s in storages)
    if not entries:
        msg = (
            f"source {src!r} holds no *.parquet file; check the path (folders are searched recursively). Other "
            "kinds: OLMo numpy token files need format='numpy' with eos_id= and dtype=; a Megatron dataset or an "
            "Arrow IPC file in a store is named by its .idx (or .bin) or .arrow URL"
        )
        raise ConfigError(msg)
    return entries, src
