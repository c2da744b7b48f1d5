"""The Arrow IPC kind (plitzer/sources/arrow.py): datasets' save_to_disk folders and .map caches.

The reference is the same data written as Parquet with one row group a record batch (the
Parquet kind, tested on its own): the batches of every setting must be equal.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import plitzer
from plitzer.errors import ConfigError
from plitzer.readpath.read import read_chunk
from plitzer.sources import arrow

datasets = pytest.importorskip("datasets")


def docs_of(n: int, seed: int, longest: int = 90) -> list[list[int]]:
    """``n`` documents of random ids, up to ``longest`` tokens each (empty ones too)."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 50_000, int(rng.integers(0, longest))).tolist() for _ in range(n)]


def parquet_copy(files: list[Path], out: Path) -> Path:
    """Each IPC file as a Parquet file of the same name stem, one row group a record batch."""
    out.mkdir()
    for p in files:
        with pa.memory_map(str(p)) as f:
            r = pa.ipc.open_stream(f)
            with pq.ParquetWriter(out / (p.stem + ".parquet"), r.schema) as w:
                for b in r:
                    w.write_batch(b, row_group_size=len(b))
    return out


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A save_to_disk folder of 3 shards of 2 record batches or more each, and its Parquet copy."""
    root = tmp_path_factory.mktemp("ipc")
    d = datasets.Dataset.from_dict({"input_ids": docs_of(7000, 0), "score": list(range(7000))})
    d.save_to_disk(str(root / "saved"), num_shards=3)
    files = arrow.arrow_files(root / "saved")
    assert files is not None
    return root / "saved", parquet_copy(files, root / "pq")


def _batches(src: Path, n: int, **kw: Any) -> list[np.ndarray]:
    with plitzer.Loader(src, column="input_ids", **kw) as ld:
        return [np.array(b.tokens) for b in itertools.islice(ld, n)]


def test_the_index_has_a_row_a_record_batch(saved: tuple[Path, Path]) -> None:
    ipc, ref = saved
    a, b = arrow.arrow_index(ipc), plitzer.index(ref)
    assert a.capabilities.kind == "arrow-ipc"
    assert a.row_groups == b.row_groups > 3  # several batches a shard
    for k in ("rows", "tokens", "empty_docs", "row_group", "file_index"):
        assert a.frame[k].to_list() == b.frame[k].to_list()
    assert a.column == "input_ids"
    assert a.dtype == "int32"


@pytest.mark.parametrize(
    "kw",
    [
        {"seed": 1, "lanes": 4, "window": 2, "seq_len": 64},
        {"seed": 2, "lanes": 8, "window": 3, "seq_len": 32, "shuffle": False},
        {"seed": 3, "lanes": 4, "window": 2, "seq_len": 64, "packing": "best-fit"},
    ],
)
def test_batches_equal_the_parquet_copys(saved: tuple[Path, Path], kw: dict[str, Any]) -> None:
    ipc, ref = saved
    got, want = _batches(ipc, 40, **kw), _batches(ref, 40, **kw)
    assert len(got) == len(want) == 40
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


def test_world_sizes_give_the_same_global_batch(saved: tuple[Path, Path]) -> None:
    ipc, _ = saved
    kw = {"seed": 5, "lanes": 8, "window": 2, "seq_len": 32}
    whole = _batches(ipc, 25, **kw)
    for world in (2, 4):
        ranks = [_batches(ipc, 25, rank=r, world=world, **kw) for r in range(world)]
        for t in range(25):
            np.testing.assert_array_equal(np.concatenate([r[t] for r in ranks]), whole[t])


def test_resume_continues_exactly(saved: tuple[Path, Path]) -> None:
    ipc, _ = saved
    kw = {"seed": 9, "lanes": 4, "window": 2, "seq_len": 64}
    want = _batches(ipc, 30, **kw)
    with plitzer.Loader(ipc, column="input_ids", **kw) as ld:
        it = iter(ld)
        for _ in range(13):
            next(it)
        state = ld.checkpoint()
    with plitzer.Loader(ipc, column="input_ids", **kw) as ld:
        ld.resume(state)
        got = [np.array(b.tokens) for b in itertools.islice(ld, 17)]
    for g, w in zip(got, want[13:], strict=True):
        np.testing.assert_array_equal(g, w)


def test_a_map_cache_folder_is_a_source(tmp_path: Path) -> None:
    d = datasets.Dataset.from_dict({"text": [str(i) for i in range(3000)]})
    cache = tmp_path / "cache"
    cache.mkdir()
    docs = docs_of(3000, 1)
    mapped = d.map(lambda r, i: {"input_ids": docs[i]}, with_indices=True, cache_file_name=str(cache / "cache-a.arrow"))
    assert len(mapped) == 3000
    files = arrow.arrow_files(cache)
    assert files is not None and [p.name for p in files] == ["cache-a.arrow"]
    ref = parquet_copy(files, tmp_path / "pq")
    kw = {"seed": 4, "lanes": 4, "window": 2, "seq_len": 48}
    for g, w in zip(_batches(cache, 20, **kw), _batches(ref, 20, **kw), strict=True):
        np.testing.assert_array_equal(g, w)


def test_one_read_a_batch_and_the_framing_pass_is_cached(
    saved: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    ipc, _ = saved
    arrow.arrow_index(ipc)  # the framing pass ran (or its cache is there)

    def no_walk(*a: Any) -> Any:
        raise AssertionError("the framing pass ran again")

    monkeypatch.setattr(arrow, "_walk", no_walk)
    ix = arrow.arrow_index(ipc)
    reads: list[tuple[int, int]] = []
    storage = ix.storage(0)
    real = storage.read_range
    monkeypatch.setattr(storage, "read_range", lambda st, off, n: reads.append((off, n)) or real(st, off, n))
    reads.clear()  # the schemas were read at indexing, from a memory map: no ranged read is left
    arr = read_chunk(ix, 2)
    row = ix.frame.row(2, named=True)
    assert reads == [(row["byte_offset"], row["byte_length"])]
    assert len(arr) == row["rows"]


def test_the_token_column_is_found_or_named(tmp_path: Path) -> None:
    datasets.Dataset.from_dict({"a": [[1, 2]] * 5, "b": [[3]] * 5}).save_to_disk(str(tmp_path / "two"))
    with pytest.raises(ConfigError, match="cannot tell the token column"):
        arrow.arrow_index(tmp_path / "two")
    assert arrow.arrow_index(tmp_path / "two", column="b").tokens == 5
    with pytest.raises(ConfigError, match="column='c' is not a list of integers"):
        arrow.arrow_index(tmp_path / "two", column="c")


def test_a_parquet_folder_is_not_claimed(saved: tuple[Path, Path]) -> None:
    _, ref = saved
    assert arrow.arrow_files(ref) is None
    assert arrow.arrow_files("s3://bucket/x") is None
