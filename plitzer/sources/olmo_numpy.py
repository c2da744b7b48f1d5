"""OLMo numpy token files: raw token ids of one dtype, documents ending at an EOS id (SPEC section 21).

OLMo writes a tokenized corpus as flat files (``*.npy`` by name, but raw: no numpy header) of
little-endian token ids of one dtype (``uint8``, ``uint16``, ``uint32`` or ``uint64``); a
document is a run of tokens up to and including ``eos_id``, and a trailing run without one is a
document too (documents never cross files). Nothing in a file says its dtype or its EOS id, so
the source says them: ``format="numpy"``, ``eos_id=`` and ``dtype=`` (Loader settings, keys of
a mixture's source, CLI options); ``eos_id=`` or ``dtype=`` without ``format="numpy"`` is a
ConfigError, as is ``format="numpy"`` without either. A source is one file or a folder of
``*.npy`` files (no ``*.parquet``), in bytewise order of their names.

A file's documents are found by one pass over it (the positions of ``eos_id``, the file memory-
mapped); a row group is a run of whole consecutive documents of one file, ending at the first
document end at or after ``row_group_tokens`` tokens (the setting, default
:data:`ROW_GROUP_TOKENS`; the last may be shorter): fixed by the data and the setting, as a
Megatron dataset's, and read with one ranged read, whose EOS ids split it into its documents
again. The pass is cached by the file's identity, the dtype, the EOS id and the threshold, and
split between a job's ranks (:mod:`plitzer.sources.files`). A file whose size is not a whole
number of tokens is a DataError naming it. Tokens only: ``where=`` and ``columns=`` are
refused, naming the kind.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from planner.catalog.column import TokenDtype
from planner.catalog.files import BatchReader
from planner.catalog.rowgroups import Capabilities
from planner.errors import ConfigError, DataError
from planner.mixing.sources import SourceSpec
from planner.stores.storage import FileStat, LocalStorage, Storage
from plitzer.sources.files import FIELDS, is_url, local_listing, remote_listing, row_group_tokens

__all__ = ["DTYPES", "NUMPY", "PASS_BYTES", "ROW_GROUP_TOKENS", "NumpyFormat", "format_of", "numpy_files"]

NUMPY = Capabilities("numpy", selectable=False, other_columns=False, column_runs=False)
"""OLMo numpy token files': tokens only (no columns for ``where=``, ``columns=``, ``dedupe=NAME``)."""
DTYPES = ("uint8", "uint16", "uint32", "uint64")
"""The token dtypes of ``dtype=`` (OLMo's)."""
ROW_GROUP_TOKENS = 1 << 20
"""A row group ends at the first document end at or after this many tokens: the default of the setting
``row_group_tokens`` (``spec.file_format``)."""
PASS_BYTES = 64 << 20
"""The pass over a file in a store reads it this many bytes at a time (one ranged read each)."""


def numpy_files(source: object) -> tuple[Path, list[Path]] | None:
    """The base and the ``*.npy`` files of ``source`` (one file, or a folder of them), or None where it is not one."""
    if not isinstance(source, (str, os.PathLike)) or is_url(source):
        return None
    path = Path(source).expanduser()
    if path.is_file():
        return path.parent, [path]
    if not path.is_dir() or next(path.rglob("*.parquet"), None) is not None:
        return None
    found = sorted(path.rglob("*.npy"), key=lambda p: p.relative_to(path).as_posix().encode())
    return (path, found) if found else None


def format_of(spec: SourceSpec) -> NumpyFormat | None:
    """The numpy format where the source says ``format="numpy"``; else None (ConfigError where its settings
    do not go together)."""
    fmt, eos_id, dtype = spec.file_format.format, spec.file_format.eos_id, spec.file_format.dtype
    where = f"source {spec.name!r}: " if spec.name else ""
    if fmt is None:
        if eos_id is not None or dtype is not None:
            msg = f"{where}eos_id= and dtype= are the numpy token files' settings; give format='numpy' too"
            raise ConfigError(msg)
        return None
    if fmt != "numpy":
        msg = f"{where}format={fmt!r}: the formats named are 'numpy' (OLMo numpy token files); others are found"
        raise ConfigError(msg)
    if isinstance(eos_id, bool) or not isinstance(eos_id, (int, np.integer)) or eos_id < 0:
        msg = f"{where}format='numpy' needs eos_id=, the token id that ends each document (an int >= 0)"
        raise ConfigError(msg)
    if dtype not in DTYPES:
        msg = f"{where}format='numpy' needs dtype=, the files' token dtype: one of {', '.join(DTYPES)}"
        raise ConfigError(msg)
    if int(eos_id) > np.iinfo(np.dtype(dtype)).max:
        msg = f"{where}eos_id={eos_id} does not fit dtype={dtype!r}; check both against the tokenizer"
        raise ConfigError(msg)
    cut = row_group_tokens(spec, ROW_GROUP_TOKENS)
    if is_url(spec.path):
        listed = remote_listing(os.fspath(spec.path), spec.storage_options, (".npy",))  # type: ignore[arg-type]
        if not listed[2]:
            msg = f"{where}{spec.path!r} holds no *.npy object (format='numpy'); check the URL"
            raise ConfigError(msg)
        return NumpyFormat(listed, int(eos_id), str(dtype), cut)
    found = numpy_files(spec.path)
    if found is None:
        msg = (
            f"{where}{spec.path!r} is not a file or a folder of *.npy files, nor a store's URL of them (format='numpy')"
        )
        raise ConfigError(msg)
    base, paths = found
    return NumpyFormat(local_listing(base, paths), int(eos_id), str(dtype), cut)


def _ends(values: np.ndarray, eos_id: int) -> np.ndarray:
    """Each document's end (exclusive) in ``values``: after each ``eos_id``, and the end of a trailing run."""
    ends = np.flatnonzero(values == eos_id) + 1
    if len(values) and (not len(ends) or ends[-1] != len(values)):
        ends = np.append(ends, len(values))
    return ends.astype(np.int64)


def _groups(ends: np.ndarray, row_group_tokens: int) -> np.ndarray:
    """Each row group's last document end: a group ends at the first document end at or after the threshold."""
    out, start = [], 0
    while start < len(ends):
        first = int(ends[start - 1]) if start else 0
        i = int(np.searchsorted(ends, first + row_group_tokens, side="left"))
        i = min(i, len(ends) - 1)
        out.append(i)
        start = i + 1
    return np.asarray(out, np.int64)


@dataclass(frozen=True)
class NumpyFormat:
    """OLMo numpy token files as a :class:`~plitzer.sources.files.Format`: the files as listed (local disk, or a
    store through planner's storage layer)."""

    listed: tuple[str, Storage, list[FileStat]] = field(compare=False)
    eos_id: int
    stored: str
    row_group_tokens: int
    capabilities: Capabilities = NUMPY
    column: str = "tokens"

    @property
    def dtype(self) -> TokenDtype:
        return "uint32" if self.stored in ("uint32", "uint64") else "int32"  # SPEC section 2's rule

    @property
    def needs_check(self) -> bool:
        return self.stored == "uint64"

    @property
    def key(self) -> str:
        return f"{self.stored}:{self.eos_id}:{self.row_group_tokens}"

    def listing(self) -> tuple[str, Storage, list[FileStat]]:
        return self.listed

    def row_groups(self, file: FileStat) -> np.ndarray:
        size = np.dtype(self.stored).itemsize
        if file.size % size:
            msg = f"{file.location}: {file.size} bytes, not whole {self.stored} tokens; the file is damaged"
            raise DataError(msg, file=file.location)
        if file.size == 0:
            return np.zeros((0, FIELDS), np.int64)
        ends = self._file_ends(file)
        last = _groups(ends, self.row_group_tokens)
        first = np.concatenate([[0], last[:-1] + 1])
        start = np.where(first > 0, ends[np.maximum(first - 1, 0)], 0)
        tokens = ends[last] - start
        zeros = np.zeros(len(last), np.int64)
        return np.stack([last - first + 1, tokens, zeros, start * size, tokens * size], axis=1).astype(np.int64)

    def _file_ends(self, file: FileStat) -> np.ndarray:
        """Each document's end (exclusive, in tokens) in ``file``: memory-mapped on local disk, else ranged reads of
        :data:`PASS_BYTES` at a time."""
        dtype = np.dtype(self.stored).newbyteorder("<")
        storage = self.listed[1]
        if isinstance(storage, LocalStorage):
            return _ends(np.memmap(file.location, dtype, mode="r"), self.eos_id)
        step = PASS_BYTES - PASS_BYTES % dtype.itemsize
        parts = []
        for at in range(0, file.size, step):
            values = np.frombuffer(storage.read_range(file, at, min(step, file.size - at)), dtype)
            parts.append(np.flatnonzero(values == self.eos_id) + 1 + at // dtype.itemsize)
        ends = np.concatenate(parts).astype(np.int64)
        n = file.size // dtype.itemsize
        return ends if len(ends) and ends[-1] == n else np.append(ends, n).astype(np.int64)

    def read(self, file: FileStat, data: bytes, row_group: int, where: str) -> pa.Array:
        dtype = np.dtype(self.stored).newbyteorder("<")
        if len(data) % dtype.itemsize:
            msg = f"{where}: {len(data)} bytes, not whole {self.stored} tokens; the file is damaged"
            raise DataError(msg, file=file.location, row_group=row_group)
        values = np.frombuffer(data, dtype)
        offsets = np.concatenate([[0], _ends(values, self.eos_id)]).astype(np.int64)
        return pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values.astype(np.int64)))

    def reader(self, file: FileStat) -> BatchReader | None:
        return None
