"""Every kind of source against the same documents written as Parquet (SPEC section 21, issue 70).

Each kind's writer (``WRITERS``) writes the documents in its own format with the same row
groups as a Parquet copy (the kind's rule, or one record batch a row group); every entry point
then gives the same (a kind given its settings, ``OPTIONS``): batches at world 1 and 2 (ranks
as threads sharing the index over a Collective, ``tests/share_fixtures.ThreadGroup``), a resume
at another world, the plan's tables, the CLI's plan, index, explain, locate and audit, and a mixture
beside a Parquet source (object storage, the job index and the passes: tests/sources/test_kinds_everywhere.py).
"""

from __future__ import annotations

import struct
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
from plitzer.errors import ConfigError, DataError
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


def write_parquet(docs: list[list[int]], root: Path, groups: list[list[int]] = GROUPS) -> Path:
    out = root / "pq"
    out.mkdir()
    schema = pa.schema([pa.field("tokens", pa.list_(pa.int32()))])
    with pq.ParquetWriter(out / "part.parquet", schema) as w:
        for g in groups:
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


MEGATRON_DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 8: np.uint16}


def write_megatron(docs: list[list[int]], root: Path, code: int = 8, name: str = "corpus_text_document") -> Path:
    """A ``.bin`` and ``.idx`` as Megatron-LM's builder writes them (each document two sequences where it can)."""
    out = root / "mm"
    out.mkdir(exist_ok=True)
    dtype = np.dtype(MEGATRON_DTYPES[code])
    seqs: list[list[int]] = []
    bounds = [0]
    for d in docs:
        seqs.extend([d[: len(d) // 2], d[len(d) // 2 :]] if len(d) > 1 else [d])
        bounds.append(len(seqs))
    lengths = np.array([len(q) for q in seqs], np.int32)
    pointers = np.concatenate([[0], np.cumsum(lengths[:-1].astype(np.int64) * dtype.itemsize)]).astype(np.int64)
    (out / f"{name}.bin").write_bytes(np.concatenate([np.asarray(q, dtype) for q in seqs]).tobytes())
    head = b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, code, len(seqs), len(bounds))
    body = lengths.tobytes() + pointers.tobytes() + np.asarray(bounds, np.int64).tobytes()
    (out / f"{name}.idx").write_bytes(head + body)
    return out / name


EOS = 60_000
"""The numpy fixture's end of document (above every other id)."""


def eos_documents() -> list[list[int]]:
    """:func:`documents` as OLMo's numpy files hold them: each ends at ``EOS`` but the last (a trailing run)."""
    docs = [[*d, EOS] for d in documents()]
    docs[-1] = docs[-1][:-1]
    return docs


def write_numpy(docs: list[list[int]], root: Path, dtype: str = "uint16", cut: int | None = None) -> Path:
    """Raw token files as OLMo writes them, no header: one file, or two with documents ``cut:`` in the second."""
    out = root / "npy"
    out.mkdir(exist_ok=True)
    parts = [docs] if cut is None else [docs[:cut], docs[cut:]]
    for i, part in enumerate(parts):
        (out / f"part-{i}-00000.npy").write_bytes(np.asarray([t for d in part for t in d], dtype).tobytes())
    return out


WRITERS: dict[str, Callable[[list[list[int]], Path], Path]] = {
    "parquet": write_parquet,
    "arrow": write_arrow,
    "megatron": write_megatron,
    "numpy": write_numpy,
}
OPTIONS: dict[str, dict[str, Any]] = {
    "megatron": {"row_group_tokens": 200},
    "numpy": {"format": "numpy", "eos_id": EOS, "dtype": "uint16", "row_group_tokens": 200},
}
"""A kind's settings: what its files cannot say, and the tokens of its row groups where it cuts them."""


@pytest.fixture(params=sorted(WRITERS))
def kind(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Kind:
    """A kind's source, the Parquet copy of the same documents and row groups, and the kind's settings.

    Megatron's and numpy's row groups are their rule's (a run of documents ending at the first
    end at or after ``row_group_tokens``): 200 here (their ``OPTIONS``), and the Parquet copy cut
    the same way.
    """
    monkeypatch.setenv("PLITZER_CACHE", str(tmp_path / "cache"))
    docs = eos_documents() if request.param == "numpy" else documents()
    (tmp_path / "k").mkdir()
    src = WRITERS[request.param](docs, tmp_path / "k")
    groups = GROUPS if request.param in ("parquet", "arrow") else rule_groups(docs, 200)
    return src, write_parquet(docs, tmp_path, groups), OPTIONS.get(request.param, {})


Kind = tuple[Path, Path, dict[str, Any]]
"""A kind's source, its Parquet copy, its settings."""


def rule_groups(docs: list[list[int]], threshold: int) -> list[list[int]]:
    """SPEC section 21's row groups: runs of documents, each ending at the first end at or after ``threshold``."""
    out: list[list[int]] = [[]]
    n = 0
    for i, d in enumerate(docs):
        out[-1].append(i)
        n += len(d)
        if n >= threshold and i + 1 < len(docs):
            out.append([])
            n = 0
    return out


def _batches(source: Any, world: int, steps: int = 6, **opts: Any) -> list[np.ndarray]:
    """Each step's rows of every rank, side by side, from loaders that share the index over a thread group."""
    group = ThreadGroup(world)

    def rank(r: int) -> list[np.ndarray]:
        with plitzer.Loader.in_group(group.member(r), source, rank=r, world=world, **CFG, **opts) as ld:
            it = iter(ld)
            return [np.from_dlpack(next(it).tokens).copy() for _ in range(steps)]

    per = run_ranks(world, rank)
    return [np.concatenate([p[s] for p in per]) for s in range(steps)]


def test_same_batches_at_world_1_and_2(kind: Kind) -> None:
    src, ref, opts = kind
    want = _batches(ref, 1)
    for world in (1, 2):
        got = _batches(src, world, **opts)
        assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))


def test_resume_at_another_world(kind: Kind) -> None:
    src, ref, opts = kind
    with plitzer.Loader(src, **CFG, **opts) as ld:
        it = iter(ld)
        for _ in range(3):
            next(it)
        state = ld.checkpoint()
    with plitzer.Loader(ref, **CFG) as whole:
        want = [np.from_dlpack(b.tokens).copy() for _, b in zip(range(5), whole, strict=False)][3:]
    got = []
    for r in range(2):
        with plitzer.Loader(src, **CFG, **opts, world=2, rank=r) as other:
            other.resume(state)
            it = iter(other)
            got.append([np.from_dlpack(next(it).tokens).copy() for _ in range(2)])
    for s in range(2):
        assert np.array_equal(np.concatenate([got[0][s], got[1][s]]), want[s])


def test_plan_tables_and_the_cli(kind: Kind, capsys: pytest.CaptureFixture[str]) -> None:
    src, ref, opts = kind
    a = plitzer.plan(src, seed=3, lanes=4, window=2, world=2, **opts)
    b = plitzer.plan(ref, seed=3, lanes=4, window=2, world=2)
    keep = ["epoch", "window_index", "rank", "row_group"]
    assert a.reads(0).select(keep).equals(b.reads(0).select(keep))
    assert a.row_groups(0).drop("file").equals(b.row_groups(0).drop("file"))
    flags = [f"--{'data-format' if k == 'format' else k.replace('_', '-')}={v}" for k, v in opts.items()]
    for cmd in (["plan", str(src), "--lanes", "4", "--window", "2", *flags], ["index", str(src), *flags]):
        assert main(cmd) == 0


def _cli_table(argv: list[str], capsys: pytest.CaptureFixture[str]) -> pl.DataFrame:
    """A CLI command's table (``--format csv``), its ``file`` column left out (the kinds name their files)."""
    capsys.readouterr()
    assert main([*argv, "--format", "csv"]) == 0
    got = pl.read_csv(capsys.readouterr().out.encode())
    return got.drop([c for c in got.columns if c == "file"])


def test_explain_locate_and_audit_give_the_parquet_copys(kind: Kind, tmp_path: Path, capsys: Any) -> None:
    """The CLI's explain (a step's pieces), locate (a document named by file and number) and audit, per kind."""
    src, ref, opts = kind
    flags = [f"--{'data-format' if k == 'format' else k.replace('_', '-')}={v}" for k, v in opts.items()]
    run = ["--seed", "3", "--lanes", "4", "--window", "2", "--seq-len", "64"]
    tables = []
    for path, more in ((src, flags), (ref, [])):
        first = plitzer.plan(path, seed=3, lanes=4, window=2, **opts if path == src else {}).row_groups(0)["file"][0]
        explain = _cli_table(["explain", str(path), *more, *run, "--step", "2"], capsys)
        located = _cli_table(["locate", str(path), *more, *run, "--row", f"{first}:17", "--epochs", "0:1"], capsys)
        tables.append((explain, located))
        assert main(["audit", str(path), *more, *run, "--out", str(tmp_path / f"{path.name}.html")]) == 0
    (e1, l1), (e2, l2) = tables
    assert e1.height > 0 and e1.equals(e2)
    assert l1.height > 0 and l1.equals(l2)


def test_a_mixture_beside_parquet(kind: Kind) -> None:
    src, ref, opts = kind
    mix = {"k": {"path": str(src), **opts}, "p": str(ref)}
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


@pytest.mark.parametrize("code", sorted(MEGATRON_DTYPES))
def test_every_megatron_dtype_reads_its_documents(code: int, tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("PLITZER_CACHE", str(tmp_path / "cache"))
    docs = [[t % 100 for t in d] for d in documents()]  # ids every dtype holds
    src = write_megatron(docs, tmp_path, code)
    from planner.mixing.sources import SourceSpec
    from plitzer.readpath.read import read_chunk
    from plitzer.sources import open_files

    for given in (src, src.with_suffix(".idx"), src.with_suffix(".bin"), src.parent):
        ix = open_files(SourceSpec(name="", path=str(given)))
        assert ix is not None and ix.capabilities.kind == "megatron"
        got = [d for g in range(ix.row_groups) for d in read_chunk(ix, g).to_pylist()]
        assert got == docs


def test_a_kind_without_columns_refuses_where_naming_it(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("PLITZER_CACHE", str(tmp_path / "cache"))
    src = write_megatron(documents(), tmp_path)
    with pytest.raises(ConfigError, match="megatron"):
        plitzer.Loader(src, where="tokens is not null", **CFG)


def test_a_damaged_megatron_file_is_a_data_error_naming_it(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("PLITZER_CACHE", str(tmp_path / "cache"))
    src = write_megatron(documents(), tmp_path)
    idx = src.with_suffix(".idx")
    idx.write_bytes(idx.read_bytes()[:-40])
    with pytest.raises(DataError, match=str(idx)):
        plitzer.plan(src)
    write_megatron(documents(), tmp_path)
    b = src.with_suffix(".bin")
    b.write_bytes(b.read_bytes()[:-10])
    with pytest.raises(DataError, match=str(b)):
        plitzer.plan(src)


NUMPY = OPTIONS["numpy"]


def _documents_of(source: Any, **opts: Any) -> list[list[int]]:
    """Every document of ``source``'s index, in index order (its row groups read as the loader reads them)."""
    from plitzer.sources import index_of
    from plitzer.state.settings import LoaderSettings

    ix = index_of(source, LoaderSettings.of(**opts))
    return [d for rg in range(len(ix.frame)) for d in ix.read_tokens(rg).to_pylist()]


@pytest.mark.parametrize("dtype", ["uint8", "uint16", "uint32", "uint64"])
def test_every_numpy_dtype_reads_its_documents_and_files_keep_theirs(
    dtype: str, tmp_path: Path, monkeypatch: Any
) -> None:
    monkeypatch.setenv("PLITZER_CACHE", str(tmp_path / "cache"))
    eos = 255 if dtype == "uint8" else EOS
    docs = [[t % 200 for t in d[:-1]] + [eos] for d in eos_documents()[:-1]] + [[1, 2, 3]]
    src = write_numpy(docs, tmp_path, dtype, cut=31)  # the first file ends mid-way: a trailing run of no EOS
    first = (src / "part-0-00000.npy").read_bytes()
    (src / "part-0-00000.npy").write_bytes(first[: -np.dtype(dtype).itemsize])
    want = [*docs[:30], docs[30][:-1], *docs[31:]]
    opts = {"format": "numpy", "eos_id": eos, "dtype": dtype, "row_group_tokens": 100}
    assert _documents_of(src, **opts) == want
    assert _documents_of(src, **opts) == want  # from the cached pass


def test_numpy_settings_are_refused_where_they_do_not_go_together(tmp_path: Path) -> None:
    src = write_numpy(eos_documents(), tmp_path)
    for opts, match in (
        ({"format": "numpy", "dtype": "uint16"}, "needs eos_id="),
        ({"format": "numpy", "eos_id": EOS}, "needs dtype="),
        ({"eos_id": EOS, "dtype": "uint16"}, "format='numpy'"),
        ({**NUMPY, "dtype": "uint8"}, "does not fit"),
        ({**NUMPY, "format": "olmo"}, "format='olmo'"),
    ):
        with pytest.raises(ConfigError, match=match):
            plitzer.plan(src, **opts)
    with pytest.raises(ConfigError, match="numpy"):
        plitzer.Loader(src, where="tokens is not null", **CFG, **NUMPY)
    with pytest.raises(ConfigError, match="source 'k'"):
        plitzer.plan({"k": {"path": str(src), "format": "numpy"}})


def test_a_numpy_file_of_no_whole_tokens_is_a_data_error_naming_it(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("PLITZER_CACHE", str(tmp_path / "cache"))
    src = write_numpy(eos_documents(), tmp_path)
    f = src / "part-0-00000.npy"
    f.write_bytes(f.read_bytes() + b"\x01")
    with pytest.raises(DataError, match="not whole uint16 tokens") as e:
        plitzer.plan(src, **NUMPY)
    assert str(f) in str(e.value)
    f.write_bytes(b"")
    assert len(plitzer.plan(src, **NUMPY).dataset.frame) == 0  # an empty file: no documents
