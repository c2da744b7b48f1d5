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
from plitzer.sources import megatron
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
THRESHOLD = OPTIONS["megatron"]["row_group_tokens"]
"""Megatron's and numpy's row groups here (their setting ``row_group_tokens``, in ``OPTIONS``): a run of documents
ending at the first end at or after 200 tokens."""
_PREFIXES = itertools.count()


def _write(kind: str, root: Path, *, duplicates: bool = False) -> tuple[Path, Path, dict[str, Any]]:
    """``kind``'s source under ``root``, the Parquet copy of the same documents and row groups, its settings
    (``duplicates``: documents 20, 50 and 80 copies of 3, 10 and 11)."""
    docs = eos_documents() if kind == "numpy" else documents()
    if duplicates:
        for a, b in ((20, 3), (50, 10), (80, 11)):
            docs[a] = list(docs[b])
    (root / "k").mkdir(parents=True)
    src = WRITERS[kind](docs, root / "k")
    groups = GROUPS if kind == "arrow" else rule_groups(docs, THRESHOLD)
    return src, write_parquet(docs, root, groups), OPTIONS.get(kind, {})


NewKind = tuple[str, Path, Path, dict[str, Any]]
"""A new kind's name, its source, the Parquet copy, its settings."""


@pytest.fixture(params=NEW)
def new_kind(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> NewKind:
    """A new kind's name, its source, the Parquet copy and its settings (a private cache; Megatron's and numpy's
    settings give 200-token row groups)."""
    monkeypatch.setenv("PLITZER_CACHE", str(tmp_path / "cache"))
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


def test_an_arrow_files_columns_are_read_from_s3_as_from_disk(
    tmp_path: Path, s3: S3Data, monkeypatch: pytest.MonkeyPatch
) -> None:
    """dedupe= on a column and where= read the record batches' other columns through the store's ranged reads."""
    import pyarrow as pa

    monkeypatch.setenv("PLITZER_CACHE", str(tmp_path / "cache"))
    docs = documents()
    schema = pa.schema([pa.field("tokens", pa.list_(pa.int32())), pa.field("url", pa.string())])
    local = tmp_path / "one.arrow"
    with pa.ipc.new_stream(str(local), schema) as w:
        for g in GROUPS:
            urls = [f"u{i % 40}" for i in g]  # 50 of the 90 urls are an earlier document's
            w.write_batch(pa.record_batch([pa.array([docs[i] for i in g], schema.field(0).type), urls], schema=schema))
    key = f"kinds/columns-{next(_PREFIXES)}/one.arrow"
    s3.client().put_object(Bucket=s3.bucket, Key=key, Body=local.read_bytes())
    url = f"s3://{s3.bucket}/{key}"
    for opts in ({"dedupe": "url"}, {"where": "url like 'u1%'"}):
        got = _steps(url, steps=3, storage_options=s3.options(), **opts)
        assert _same(got, _steps(local, steps=3, **opts)), opts


def test_a_megatron_pair_in_s3_in_a_mixture_and_through_its_job_index(
    s3: S3Data, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from plitzer.cli import main

    monkeypatch.setenv("PLITZER_CACHE", str(tmp_path / "cache"))
    src, ref, opts = _write("megatron", tmp_path)
    prefix = f"kinds/pair-{next(_PREFIXES)}"
    for p in _files_of("megatron", src):
        s3.client().put_object(Bucket=s3.bucket, Key=f"{prefix}/{p.name}", Body=p.read_bytes())
    url = f"s3://{s3.bucket}/{prefix}/{src.name}.idx"
    mix = {"m": {"path": url, **opts}, "p": str(ref)}  # its row_group_tokens, a key of the source
    p = plitzer.plan(mix, storage_options=s3.options(), seed=3, lanes=4, window=2, seq_len=64)
    assert p.sources().sort("name")["tokens"].to_list() == [plitzer.index(ref).tokens] * 2
    job = tmp_path / "job.index"
    endpoint = ["--endpoint", s3.options()["endpoint"]]
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3.options()["key"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3.options()["secret"])
    assert main(["index", url, "--out", str(job), "--no-lengths", *endpoint, *_flags(opts)]) == 0
    got = _steps(url, index=str(job), storage_options=s3.options(), **opts)
    assert _same(got, _steps(ref))


def test_a_megatron_pair_in_a_store_lacking_its_idx_is_refused_naming_it(
    s3: S3Data, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from plitzer.errors import ConfigError

    monkeypatch.setenv("PLITZER_CACHE", str(tmp_path / "cache"))
    src, _, _ = _write("megatron", tmp_path)
    prefix = f"kinds/lone-{next(_PREFIXES)}"
    s3.client().put_object(Bucket=s3.bucket, Key=f"{prefix}/{src.name}.bin", Body=src.with_suffix(".bin").read_bytes())
    url = f"s3://{s3.bucket}/{prefix}/{src.name}.bin"
    with pytest.raises(ConfigError, match=r"\.idx; one of them is missing"):
        plitzer.plan(url, storage_options=s3.options())


@pytest.mark.parametrize("kind", ["megatron", "numpy"])
def test_megatron_and_numpy_from_gcs_give_the_local_batches(
    kind: str, gcs: CloudData, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PLITZER_CACHE", str(tmp_path / "cache"))
    src, ref, opts = _write(kind, tmp_path)
    prefix = f"kinds/{kind}-{next(_PREFIXES)}"
    for p in _files_of(kind, src):
        gcs.put(f"{prefix}/{p.name}", p.read_bytes())
    url = _remote_url(kind, src, f"{gcs.scheme}://{gcs.bucket}/{prefix}")
    assert _same(_steps(url, storage_options=gcs.options(), **opts), _steps(ref))


# -- the job index ---------------------------------------------------------------------


def _flags(opts: dict[str, Any]) -> list[str]:
    return [f"--{'data-format' if k == 'format' else k.replace('_', '-')}={v}" for k, v in opts.items()]


def test_the_job_index_of_each_kind_gives_its_batches_without_a_pass(
    new_kind: NewKind, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from plitzer.cli import main
    from plitzer.errors import ConfigError, StaleIndexError
    from plitzer.sources import files

    kind, src, ref, opts = new_kind
    job = tmp_path / "job.index"
    assert main(["index", str(src), "--out", str(job), "--no-lengths", *_flags(opts)]) == 0
    monkeypatch.setenv("PLITZER_CACHE", str(tmp_path / "empty-cache"))  # nothing cached: a pass would run
    monkeypatch.setattr(files, "file_rows", _no_pass)
    assert _same(_steps(src, index=str(job), **opts), _steps(ref))
    if kind == "numpy":  # the job index was written under other settings: refused, naming the kind and the fix
        with pytest.raises(ConfigError, match=r"numpy source's \(key uint16:7:.*plitzer index DATA --out"):
            plitzer.Loader(src, index=str(job), **CFG, **{**opts, "eos_id": 7})
    changed = _files_of(kind, src)[-1 if kind != "megatron" else 0]  # Megatron: its .bin
    changed.write_bytes(changed.read_bytes() + bytes(8))
    with pytest.raises(StaleIndexError, match=str(changed)):
        plitzer.Loader(src, index=str(job), **CFG, **opts)


def _no_pass(fmt: Any, file: FileStat) -> np.ndarray:
    raise AssertionError(f"a pass over {file.location}: the job index has its rows")


# -- the passes ------------------------------------------------------------------------


def test_best_fit_gives_the_parquet_copys_batches(new_kind: NewKind) -> None:
    _, src, ref, opts = new_kind
    bestfit = {"packing": "best-fit", "pad_id": 0}
    assert _same(_steps(src, **bestfit, **opts), _steps(ref, **bestfit))


def test_dedupe_tokens_gives_the_parquet_copys_batches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLITZER_CACHE", str(tmp_path / "cache"))
    for kind in NEW:
        src, ref, opts = _write(kind, tmp_path / kind, duplicates=True)
        got, want = _steps(src, dedupe="tokens", **opts), _steps(ref, dedupe="tokens")
        assert _same(got, want), kind
        with plitzer.Loader(src, dedupe="tokens", **CFG, **opts) as ld:
            assert ld.index.tokens < plitzer.index(ref).tokens  # the copies were dropped


@pytest.mark.parametrize("kind", ["megatron", "numpy"])
def test_exclude_and_a_named_dedupe_key_are_refused_naming_the_kind(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from plitzer.errors import ConfigError

    monkeypatch.setenv("PLITZER_CACHE", str(tmp_path / "cache"))
    src, _, opts = _write(kind, tmp_path)
    table = tmp_path / "exclude.parquet"
    pq.write_table(pa.table({"url": ["u1"]}), table)
    for given in ({"exclude": str(table)}, {"dedupe": "url"}):
        with pytest.raises(ConfigError, match=f"a {kind} source has no columns but its tokens; give dedupe='tokens'"):
            plitzer.Loader(src, **given, **CFG, **opts)
    mix = {"k": {"path": str(src), **opts}, "p": str(tmp_path / "pq")}
    with pytest.raises(ConfigError, match=f"source 'k', a {kind} source has no columns"):
        plitzer.Loader(mix, exclude=str(table), **CFG)


# -- planner.index, the CLI's help -------------------------------------------------------


def test_planner_index_opens_an_arrow_folder_and_a_megatron_dataset(new_kind: NewKind, tmp_path: Path) -> None:
    import planner
    from planner.errors import ConfigError

    kind, src, ref, _ = new_kind
    if kind == "numpy":  # nothing in the files says their dtype or EOS id: planner.index cannot open them
        with pytest.raises(ConfigError, match="format='numpy' with eos_id= and dtype="):
            planner.index(src)
        return
    ix = planner.index(src)
    if kind == "megatron":  # planner.index takes no settings: row_group_tokens' default, 2**20 (one group here)
        (tmp_path / "default").mkdir()
        ref = write_parquet(documents(), tmp_path / "default", rule_groups(documents(), megatron.ROW_GROUP_TOKENS))
    assert ix.capabilities.kind == {"arrow": "arrow-ipc"}.get(kind, kind)
    keep = ["file_index", "row_group", "rows", "tokens", "empty_docs"]
    assert ix.frame.select(keep).equals(planner.index(ref).frame.select(keep))


def test_the_data_help_names_every_kind_and_its_options(capsys: pytest.CaptureFixture[str]) -> None:
    from plitzer.cli import main

    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for said in ("Arrow IPC", "Megatron indexed dataset", ".idx", "OLMo numpy", "--data-format numpy", "--eos-id"):
        assert said in text
    assert "--dtype" in text and ".arrow URL" in text


# -- damaged files -----------------------------------------------------------------------


def test_a_truncated_file_of_each_kind_is_a_data_error_naming_it(new_kind: NewKind) -> None:
    from plitzer.errors import DataError

    kind, src, _, opts = new_kind
    cut = {"arrow": -300, "megatron": -40, "numpy": -1}[kind]  # an Arrow batch, a Megatron .idx, half a token
    damaged = src.with_suffix(".idx") if kind == "megatron" else _files_of(kind, src)[0]
    damaged.write_bytes(damaged.read_bytes()[:cut])
    with pytest.raises(DataError, match=str(damaged)) as e:
        plitzer.plan(src, **opts)
    assert e.value.file == str(damaged)


def test_a_megatron_bin_cut_short_is_a_data_error_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from plitzer.errors import DataError

    monkeypatch.setenv("PLITZER_CACHE", str(tmp_path / "cache"))
    src, _, _ = _write("megatron", tmp_path)
    b = src.with_suffix(".bin")
    b.write_bytes(b.read_bytes()[:-10])
    with pytest.raises(DataError, match=str(b)) as e:
        plitzer.plan(src)
    assert e.value.file == str(b)


# -- a job's ranks as real processes -----------------------------------------------------


@pytest.mark.slow  # real processes and gloo (the checkout run of .ci/run runs it)
def test_two_gloo_processes_read_a_megatron_dataset_as_world_1(tmp_path: Path) -> None:
    import json

    pytest.importorskip("torch")
    from tests.net import gloo_job

    src, ref, opts = _write("megatron", tmp_path)
    settings = {**CFG, "threads": 1}
    args = ["--data", str(src), "--opts", json.dumps({**settings, **opts}), "--steps", "4"]
    got = gloo_job("kinds_worker.py", args, tmp_path, "w2", 2, timeout=60)  # row_group_tokens: one of opts
    with plitzer.Loader(ref, **settings) as ld:
        want = [ld.next_batch() for _ in range(4)]
    for i, w in enumerate(want):
        steps = [r["steps"][i] for r in got]
        rows = {lane: row for s in steps for lane, row in zip(s["lanes"], s["tokens"], strict=True)}
        assert sorted(rows) == list(range(CFG["lanes"]))
        np.testing.assert_array_equal(np.array([rows[k] for k in sorted(rows)]), np.from_dlpack(w.tokens))
