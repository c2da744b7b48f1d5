"""Megatron indexed datasets: a ``.bin`` of tokens and a ``.idx`` of its sequences (SPEC section 21).

The ``.idx`` (Megatron-LM's megatron/core/datasets/indexed_dataset.py) is the magic
``MMIDIDX\\x00\\x00``, a version (``<Q``, 1), the dtype code (``<B``: 1 uint8, 2 int8, 3 int16,
4 int32, 5 int64, 6 float64, 7 float32, 8 uint16), the sequence count and the document-index
count (``<Q`` each), then the sequences' lengths (int32), their byte offsets in the ``.bin``
(int64) and the document index (int64: n + 1 sequence boundaries for n documents). A document
of several sequences is their concatenation. A source is a prefix (``data/x_text_document``),
its ``.idx`` or ``.bin`` path, or a folder of such pairs (no ``*.parquet``); its files are the
``.bin`` files, in bytewise order of their names.

A row group is a run of whole consecutive documents of one file, ending at the first document
end at or after ``row_group_tokens`` tokens (the setting, default :data:`ROW_GROUP_TOKENS`; the
last may be shorter): fixed by the data and the setting, read with one ranged read of the
``.bin`` (its documents' bytes are consecutive there; a file whose sequences are not is a
DataError). The pass over the ``.idx`` is cached by the ``.bin``'s identity
(:mod:`plitzer.sources.files`). Tokens only: ``where=`` and ``columns=`` are refused.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from planner.bounded import Bounded
from planner.catalog.column import TokenDtype
from planner.catalog.files import BatchReader
from planner.catalog.rowgroups import Capabilities
from planner.errors import ConfigError, DataError
from planner.mixing.sources import SourceSpec
from planner.stores.storage import FileStat, Storage
from plitzer.sources.files import FIELDS, is_url, local_listing, read_whole, remote_listing, row_group_tokens

__all__ = [
    "DTYPES",
    "MAGIC",
    "MEGATRON",
    "ROW_GROUP_TOKENS",
    "MegatronFormat",
    "format_of",
    "groups_of",
    "megatron_files",
]

MEGATRON = Capabilities("megatron", selectable=False, other_columns=False, column_runs=False)
"""A Megatron indexed dataset's: tokens only (no columns for ``where=``, ``columns=``, ``dedupe=NAME``)."""
MAGIC = b"MMIDIDX\x00\x00"
DTYPES: dict[int, np.dtype] = {
    1: np.dtype(np.uint8),
    2: np.dtype(np.int8),
    3: np.dtype(np.int16),
    4: np.dtype(np.int32),
    5: np.dtype(np.int64),
    6: np.dtype(np.float64),
    7: np.dtype(np.float32),
    8: np.dtype(np.uint16),
}
"""The ``.idx`` dtype codes (Megatron-LM's ``DType``)."""
ROW_GROUP_TOKENS = 1 << 20
"""A row group ends at the first document end at or after this many tokens: the default of the setting
``row_group_tokens`` (``spec.file_format``)."""
_HEAD = len(MAGIC) + 8 + 1 + 8 + 8


def megatron_files(source: object) -> list[Path] | None:
    """The ``.bin`` files of ``source`` (each with its ``.idx``) in index order, or None where it is not one."""
    if not isinstance(source, (str, os.PathLike)) or is_url(source):
        return None
    path = Path(source).expanduser()
    if path.suffix in (".idx", ".bin") and path.is_file():
        path = path.with_suffix("")
    if path.with_suffix(".idx").is_file() and path.with_suffix(".bin").is_file() and not path.is_dir():
        return [path.with_suffix(".bin")]
    if not path.is_dir() or next(path.rglob("*.parquet"), None) is not None:
        return None
    found = [p.with_suffix(".bin") for p in path.rglob("*.idx") if p.with_suffix(".bin").is_file()]
    found.sort(key=lambda p: p.relative_to(path).as_posix().encode())
    return found or None


def format_of(spec: SourceSpec) -> MegatronFormat | None:
    """A prefix, a ``.idx`` or ``.bin`` path, or a folder of pairs; a store's ``.idx`` or ``.bin`` URL; else None."""
    if is_url(spec.path):
        url = os.fspath(spec.path)  # type: ignore[arg-type]
        return _remote(url, spec) if url.endswith((".idx", ".bin")) else None
    paths = megatron_files(spec.path)
    if paths is None:
        return None
    base = Path(os.fspath(spec.path)).expanduser()  # type: ignore[arg-type]
    base = base if base.is_dir() else paths[0].parent
    bins = local_listing(base, paths)
    _, _, idx = local_listing(base, [p.with_suffix(".idx") for p in paths])
    return MegatronFormat(bins, tuple(idx), row_group_tokens(spec, ROW_GROUP_TOKENS))


def _remote(url: str, spec: SourceSpec) -> MegatronFormat:
    """The pair a store's ``.idx`` or ``.bin`` URL names: each object listed through planner's storage layer."""
    prefix = url.rsplit(".", 1)[0]
    src, storage, bins = remote_listing(prefix + ".bin", spec.storage_options, (".bin",))
    _, _, idx = remote_listing(prefix + ".idx", spec.storage_options, (".idx",))
    if len(bins) != 1 or len(idx) != 1:
        msg = f"{url}: a Megatron dataset in a store is its {prefix}.bin and {prefix}.idx; one of them is missing"
        raise ConfigError(msg)
    return MegatronFormat((src, storage, bins), tuple(idx), row_group_tokens(spec, ROW_GROUP_TOKENS))


def _header(head: bytes | np.ndarray | memoryview, idx: str) -> tuple[np.dtype, int, int]:
    """The ``.idx``'s token dtype, sequence count and document-index count; DataError naming it where damaged."""
    head = bytes(head[:_HEAD])
    if len(head) < _HEAD or head[: len(MAGIC)] != MAGIC:
        msg = f"{idx}: not a Megatron .idx (no MMIDIDX magic); the file is damaged or of another format"
        raise DataError(msg, file=idx)
    version, code, seqs, docs = struct.unpack("<QBQQ", head[len(MAGIC) :])
    if version != 1 or code not in DTYPES:
        msg = f"{idx}: version {version}, dtype code {code}: a Megatron .idx is version 1, codes 1-8"
        raise DataError(msg, file=idx)
    if DTYPES[code].kind == "f":
        msg = f"{idx}: its tokens are {DTYPES[code]}, not integers; convert the dataset to an integer dtype"
        raise ConfigError(msg)
    return DTYPES[code], int(seqs), int(docs)


def _documents(raw: np.ndarray | memoryview, idx: str) -> tuple[np.dtype, np.ndarray, np.ndarray]:
    """The token dtype, each document's token count and each document's first byte in the ``.bin``, from the
    ``.idx``'s bytes ``raw`` (``idx``: where it is, for messages)."""
    dtype, seqs, docs = _header(raw, idx)
    want = _HEAD + seqs * 4 + seqs * 8 + docs * 8
    if len(raw) < want or docs < 1:
        msg = f"{idx}: {len(raw)} bytes, its header promises {want}; the file is truncated"
        raise DataError(msg, file=idx)
    lengths = np.frombuffer(raw, np.int32, seqs, _HEAD).astype(np.int64)
    pointers = np.frombuffer(raw, np.int64, seqs, _HEAD + 4 * seqs)
    bounds = np.frombuffer(raw, np.int64, docs, _HEAD + 12 * seqs)
    if bounds[0] != 0 or bounds[-1] != seqs or np.any(np.diff(bounds) < 0):
        msg = f"{idx}: its document index does not run from 0 to its {seqs} sequences; the file is damaged"
        raise DataError(msg, file=idx)
    if seqs and np.any(pointers[1:] != pointers[:-1] + lengths[:-1] * dtype.itemsize):
        msg = f"{idx}: its sequences are not consecutive in the .bin; rewrite it with Megatron's builder"
        raise DataError(msg, file=idx)
    ends = np.concatenate([[0], np.cumsum(lengths)])
    doc_tokens = ends[bounds[1:]] - ends[bounds[:-1]]
    first = pointers[0] if seqs else 0
    starts = first + ends[bounds[:-1]] * dtype.itemsize
    return dtype, doc_tokens, starts


def groups_of(doc_tokens: np.ndarray, row_group_tokens: int) -> np.ndarray:
    """Each row group's first document: a group ends at the first document end at or after the threshold."""
    starts, n = [0], 0
    for i, t in enumerate(doc_tokens.tolist()):
        n += t
        if n >= row_group_tokens and i + 1 < len(doc_tokens):
            starts.append(i + 1)
            n = 0
    return np.asarray(starts if len(doc_tokens) else [], np.int64)


@dataclass(frozen=True)
class MegatronFormat:
    """A Megatron indexed dataset as a :class:`~plitzer.sources.files.Format`: its ``.bin`` files as listed (local
    disk or a store, through planner's storage layer) and each one's ``.idx`` (``idx``, in the same order)."""

    listed: tuple[str, Storage, list[FileStat]] = field(compare=False)
    idx: tuple[FileStat, ...]
    row_group_tokens: int
    capabilities: Capabilities = MEGATRON
    column: str = "tokens"
    _docs: Bounded[str, tuple[np.dtype, np.ndarray, np.ndarray, np.ndarray]] = field(
        default_factory=lambda: Bounded(8), repr=False, compare=False
    )

    @property
    def dtype(self) -> TokenDtype:
        return "int32"  # every .idx dtype is an integer of at most 16 bits, int32 or int64 (checked)

    @property
    def needs_check(self) -> bool:
        storage = self.listed[1]
        return any(_header(storage.read_range(i, 0, min(_HEAD, i.size)), i.location)[0] == np.int64 for i in self.idx)

    @property
    def key(self) -> str:
        return str(self.row_group_tokens)

    def listing(self) -> tuple[str, Storage, list[FileStat]]:
        return self.listed

    def _of(self, file: FileStat) -> tuple[np.dtype, np.ndarray, np.ndarray, np.ndarray]:
        got = self._docs.get(file.location)
        if got is None:
            idx = self.idx[[f.location for f in self.listed[2]].index(file.location)]
            dtype, tokens, starts = _documents(read_whole(self.listed[1], idx), idx.location)
            got = (dtype, tokens, starts, groups_of(tokens, self.row_group_tokens))
            self._docs.put(file.location, got)
        return got

    def row_groups(self, file: FileStat) -> np.ndarray:
        dtype, tokens, starts, groups = self._of(file)
        ends = np.append(groups[1:], len(tokens)).astype(np.int64)
        out = np.zeros((len(groups), FIELDS), np.int64)
        for g, (a, b) in enumerate(zip(groups.tolist(), ends.tolist(), strict=True)):
            n = int(tokens[a:b].sum())
            out[g] = (b - a, n, int((tokens[a:b] == 0).sum()), int(starts[a]), n * dtype.itemsize)
        if len(out) and int(out[-1, 3] + out[-1, 4]) > file.size:
            msg = f"{file.location}: the .idx gives {int(out[-1, 3] + out[-1, 4])} bytes, the .bin holds {file.size}"
            raise DataError(msg, file=file.location)
        return out

    def read(self, file: FileStat, data: bytes, row_group: int, where: str) -> pa.Array:
        dtype, tokens, _, groups = self._of(file)
        a = int(groups[row_group])
        b = int(groups[row_group + 1]) if row_group + 1 < len(groups) else len(tokens)
        if len(data) % dtype.itemsize:
            msg = f"{where}: {len(data)} bytes, not whole {dtype} tokens; the file is damaged"
            raise DataError(msg, file=file.location, row_group=row_group)
        values = np.frombuffer(data, dtype)
        offsets = np.concatenate([[0], np.cumsum(tokens[a:b])]).astype(np.int64)
        if offsets[-1] != len(values):
            msg = f"{where}: {len(values)} tokens read, its .idx gives {int(offsets[-1])}; the file is damaged"
            raise DataError(msg, file=file.location, row_group=row_group)
        return pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values.astype(np.int64)))

    def reader(self, file: FileStat) -> BatchReader | None:
        return None
