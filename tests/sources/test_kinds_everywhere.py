"""The new kinds of source (Arrow IPC, Megatron, OLMo numpy) through the entry points beyond the Loader's own.

Issue 70 item 2, SPEC section 21 point 2: each kind read from object storage, through the job
index, the passes (best-fit, ``dedupe=``, ``exclude=``), ``planner.index``, real processes of a
job (gloo) and the CLI's help; a damaged file of each kind is a DataError naming it. Each check
compares with the Parquet copy of the same documents and row groups, written by the writers of
``tests/sources/test_source_kinds.py``.

Object storage: every store is reached through planner's one storage layer
(:class:`planner.stores.storage.Storage`: its listing, given the kind's suffixes, and its ranged
reads), so S3 (moto) and one other backend (GCS's emulator) stand for them all here; the same
storage suite runs every backend for Parquet (``tests/stores/test_storage.py``).
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import plitzer
from planner.stores.storage import FileStat, Storage
from plitzer.sources import megatron, olmo_numpy
from tests.cloud_fixtures import CloudData, gcs
from tests.s3_fixtures import S3Data, s3
from tests.sources.test_source_kinds import (
    CFG,
    GROUPS,
    OPTIONS,
    WRITERS,
    documents,
    eos_documents,
    rule_groups,
    write_parquet,
)

__all__ = ["gcs", "s3"]  # the fixtures, imported for pytest

NEW = ("arrow", "megatron", "numpy")
THRESHOLD = 200
"""Megatron's and numpy's row groups here: a run of documents ending at the first end at or after 200 tokens."""
_PREFIXES = itertools.count()


def _write(kind: str, root: Path) -> tuple[Path, Path, dict[str, Any]]:
    """``kind``'s source under ``root``, the Parquet copy of the same documents and row groups, its settings."""
    docs = eos_documents() if kind == "numpy" else documents()
    (root / "k").mkdir(parents=True)
    src = WRITERS[kind](docs, root / "k")
    groups = GROUPS if kind == "arrow" else rule_groups(docs, THRESHOLD)
    return src, write_parquet(docs, root, groups), OPTIONS.get(kind, {})


NewKind = tuple[str, Path, Path, dict[str, Any]]
"""A new kind's name, its source, the Parquet copy, its settings."""


@pytest.fixture(params=NEW)
def new_kind(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> NewKind:
    """A new kind's name, its source, the Parquet copy and its settings (a private cache, 200-token row groups)."""
    monkeypatch.setenv("PLITZER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(megatron, "ROW_GROUP_TOKENS", THRESHOLD)
    monkeypatch.setattr(olmo_numpy, "ROW_GROUP_TOKENS", THRESHOLD)
    return (request.param, *_write(request.param, tmp_path))


def _steps(source: Any, steps: int = 6, **opts: Any) -> list[np.ndarray]:
    with plitzer.Loader(source, **CFG, **opts) as ld:
        it = iter(ld)
        return [np.from_dlpack(next(it).tokens).copy() for _ in range(steps)]


def _same(got: list[np.ndarray], want: list[np.ndarray]) -> bool:
    return len(got) == len(want) and all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))


def _documents(ix: Any) -> list[list[int]]:
    """Every document of ``ix`` in index order, read as the loader reads its row groups."""
    from plitzer.readpath.read import read_chunk

    return [d for rg in range(ix.row_groups) for d in read_chunk(ix, rg).to_pylist()]


# -- object storage -----------------------------------------------------------------------


def _remote_url(kind: str, src: Path, root: str) -> str:
    """The URL a kind's source is named by in a store whose objects mirror ``src``'s folder under ``root``."""
    if kind == "megatron":
        return f"{root}/{src.name}.idx"  # a pair is named by its .idx (or .bin) URL
    if kind == "arrow":
        return f"{root}/data-00000-of-00001.arrow"  # one .arrow object
    return root  # numpy: a prefix of *.npy objects


def _files_of(kind: str, src: Path) -> list[Path]:
    return sorted(src.parent.glob(f"{src.name}.*")) if kind == "megatron" else sorted(src.iterdir())


def _count_reads(monkeypatch: pytest.MonkeyPatch, cls: Any) -> list[tuple[str, int, int]]:
    reads: list[tuple[str, int, int]] = []
    real = cls.read_range

    def counted(self: Storage, file: FileStat, offset: int, length: int) -> bytes:
        reads.append((file.name, offset, length))
        return real(self, file, offset, length)  # type: ignore[no-any-return]

    monkeypatch.setattr(cls, "read_range", counted)
    return reads


def test_each_kind_from_s3_gives_the_local_batches_one_ranged_read_a_row_group(
    new_kind: NewKind, s3: S3Data, monkeypatch: pytest.MonkeyPatch
) -> None:
    from planner.stores.s3 import S3Storage
    from plitzer.sources import index_of
    from plitzer.state.settings import LoaderSettings

    kind, src, ref, opts = new_kind
    prefix = f"kinds/{kind}-{next(_PREFIXES)}"
    client = s3.client()
    for p in _files_of(kind, src):
        client.put_object(Bucket=s3.bucket, Key=f"{prefix}/{p.name}", Body=p.read_bytes())
    url = _remote_url(kind, src, f"s3://{s3.bucket}/{prefix}")
    want = _steps(ref)
    assert _same(_steps(url, storage_options=s3.options(), **opts), want)
    ix = index_of(url, LoaderSettings.of(storage_options=s3.options(), **CFG, **opts))
    assert ix.capabilities.kind == {"arrow": "arrow-ipc"}.get(kind, kind)
    reads = _count_reads(monkeypatch, S3Storage)
    assert _documents(ix) == _documents(plitzer.index(ref))
    data = [r for r in reads if not r[0].endswith(".idx")]  # a Megatron .idx: read once, for its documents
    assert len(data) == ix.row_groups and len(set(data)) == ix.row_groups  # one ranged read a row group
    assert len(reads) - len(data) <= len(ix.files)


@pytest.mark.parametrize("kind", ["megatron", "numpy"])
def test_megatron_and_numpy_from_gcs_give_the_local_batches(
    kind: str, gcs: CloudData, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PLITZER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(megatron, "ROW_GROUP_TOKENS", THRESHOLD)
    monkeypatch.setattr(olmo_numpy, "ROW_GROUP_TOKENS", THRESHOLD)
    src, ref, opts = _write(kind, tmp_path)
    prefix = f"kinds/{kind}-{next(_PREFIXES)}"
    for p in _files_of(kind, src):
        gcs.put(f"{prefix}/{p.name}", p.read_bytes())
    url = _remote_url(kind, src, f"{gcs.scheme}://{gcs.bucket}/{prefix}")
    assert _same(_steps(url, storage_options=gcs.options(), **opts), _steps(ref))
