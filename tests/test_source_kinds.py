"""Every kind of source against the same documents written as Parquet (SPEC section 21, issue 70).

Each kind's writer (``WRITERS``) writes the documents in its own format with the same row
groups as a Parquet copy (the kind's rule, or one record batch a row group); every entry point
then gives the same: batches at world 1 and 2 (ranks as threads sharing the index over a
Collective, ``tests/share_fixtures.ThreadGroup``), a resume at another world, the plan's
tables, the CLI's plan, and a mixture beside a Parquet source.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import plitzer
from plitzer.cli import main
from plitzer.errors import DataError
from tests.share_fixtures import ThreadGroup, run_ranks

CFG: dict[str, Any] = {"seed": 3, "lanes": 4, "window": 2, "seq_len": 64, "threads": 2}
GROUPS = [list(range(a, a + 9)) for a in range(0, 90, 9)]
"""The documents' row groups: 9 documents each, as every kind's fixture writes them."""


def documents() -> list[list[int]]:
    """90 documents of 1 to 60 tokens (ids below 2**16), one of them empty, the last not ending at a group edge."""
    rng = np.random.default_rng(7)
    docs = [rng.integers(1, 50_000, int(n)).tolist() for n in rng.integers(1, 60, 90)]
    docs[13] = []
    return docs


def write_parquet(docs: list[list[int]], root: Path) -> Path:
    out = root / "pq"
    out.mkdir()
    schema = pa.schema([pa.field("tokens", pa.list_(pa.int32()))])
    with pq.ParquetWriter(out / "part.parquet", schema) as w:
        for g in GROUPS:
            w.write_table(pa.table({"tokens": pa.array([docs[i] for i in g], schema.field(0).type)}))
    return out


def write_arrow(docs: list[list[int]], root: Path) -> Path:
    out = root / "ipc"
    out.mkdir()
    schema = pa.schema([pa.field("tokens", pa.list_(pa.int32()))])
    with pa.ipc.new_stream(str(out / "data-00000-of-00001.arrow"), schema) as w:
        for g in GROUPS:
            w.write_batch(pa.record_batch([pa.array([docs[i] for i in g], schema.field(0).type)], schema=schema))
    return out


WRITERS: dict[str, Callable[[list[list[int]], Path], Path]] = {"parquet": write_parquet, "arrow": write_arrow}


@pytest.fixture(params=sorted(WRITERS))
def kind(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """A kind's source and the Parquet copy of the same documents and row groups."""
    monkeypatch.setenv("PLITZER_CACHE", str(tmp_path / "cache"))
    docs = documents()
    return WRITERS[request.param](docs, tmp_path / "k" if _mk(tmp_path / "k") else tmp_path), write_parquet(
        docs, tmp_path
    )


def _mk(p: Path) -> bool:
    p.mkdir()
    return True


def _batches(source: Any, world: int, steps: int = 6) -> list[np.ndarray]:
    """Each step's rows of every rank, side by side, from loaders that share the index over a thread group."""
    group = ThreadGroup(world)

    def rank(r: int) -> list[np.ndarray]:
        with plitzer.Loader.in_group(group.member(r), source, rank=r, world=world, **CFG) as ld:
            it = iter(ld)
            return [np.from_dlpack(next(it).tokens).copy() for _ in range(steps)]

    per = run_ranks(world, rank)
    return [np.concatenate([p[s] for p in per]) for s in range(steps)]


def test_same_batches_at_world_1_and_2(kind: tuple[Path, Path]) -> None:
    src, ref = kind
    want = _batches(ref, 1)
    for world in (1, 2):
        got = _batches(src, world)
        assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))


def test_resume_at_another_world(kind: tuple[Path, Path]) -> None:
    src, ref = kind
    with plitzer.Loader(src, **CFG) as ld:
        it = iter(ld)
        for _ in range(3):
            next(it)
        state = ld.checkpoint()
    with plitzer.Loader(ref, **CFG) as whole:
        want = [np.from_dlpack(b.tokens).copy() for _, b in zip(range(5), whole, strict=False)][3:]
    got = []
    for r in range(2):
        with plitzer.Loader(src, **CFG, world=2, rank=r) as other:
            other.resume(state)
            it = iter(other)
            got.append([np.from_dlpack(next(it).tokens).copy() for _ in range(2)])
    for s in range(2):
        assert np.array_equal(np.concatenate([got[0][s], got[1][s]]), want[s])


def test_plan_tables_and_the_cli(kind: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    src, ref = kind
    a = plitzer.plan(src, seed=3, lanes=4, window=2, world=2)
    b = plitzer.plan(ref, seed=3, lanes=4, window=2, world=2)
    keep = ["epoch", "window_index", "rank", "row_group"]
    assert a.reads(0).select(keep).equals(b.reads(0).select(keep))
    assert a.row_groups(0).drop("file").equals(b.row_groups(0).drop("file"))
    for cmd in (["plan", str(src), "--lanes", "4", "--window", "2"], ["index", str(src)]):
        assert main(cmd) == 0


def test_a_mixture_beside_parquet(kind: tuple[Path, Path]) -> None:
    src, ref = kind
    mix = {"k": str(src), "p": str(ref)}
    p = plitzer.plan(mix, seed=3, lanes=4, window=2, seq_len=64)
    tokens = p.sources().sort("name")["tokens"].to_list()
    assert tokens[0] == tokens[1] > 0, p.sources()
    with plitzer.Loader(mix, **CFG) as ld:
        assert pl.Series(np.from_dlpack(next(iter(ld)).tokens).ravel()).len() == 4 * 64
    assert len(_batches(mix, 2, steps=2)) == 2


def test_a_truncated_arrow_batch_is_a_data_error_naming_the_file(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("PLITZER_CACHE", str(tmp_path / "cache"))
    src = write_arrow(documents(), tmp_path)
    f = src / "data-00000-of-00001.arrow"
    f.write_bytes(f.read_bytes()[:-300])
    with pytest.raises(DataError, match=str(f)) as e:
        plitzer.plan(src)
    assert e.value.file == str(f)
