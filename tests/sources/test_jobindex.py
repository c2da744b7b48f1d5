"""The job index (``plitzer index DATA --out PATH``, ``Loader(..., index=PATH)``): written, read, refused when stale."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import plitzer
import plitzer.synth
from planner.catalog import footer, jobindex
from planner.stores.storage import FileStat, LocalStorage
from plitzer.cli import main
from plitzer.errors import ConfigError, DataError, PerformanceWarning, StaleIndexError
from tests.conftest import tokens_of
from tests.s3_fixtures import FaultProxy, S3Data, options, proxy, s3
from tests.share_fixtures import CharTokenizer, nonempty_texts, write_text

__all__ = ["proxy", "s3"]  # the fixtures, imported for pytest

CFG = {"seed": 3, "lanes": 8, "window": 2, "seq_len": 64}


@pytest.fixture
def data(tmp_path: Path) -> Path:
    d = tmp_path / "data"
    plitzer.synth.write(d, tokens=120_000, seed=5, docs_per_row_group=10, row_groups_per_file=2)
    return d


@pytest.fixture
def fresh_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty footer cache: without a job index every footer would be read from storage."""
    d = tmp_path / "cache"
    monkeypatch.setenv("PLITZER_CACHE", str(d))
    return d


def _batches(ld: plitzer.Loader, n: int) -> list[np.ndarray]:
    return [tokens_of(ld.next_batch()).copy() for _ in range(n)]


def _count_reads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int, int]]:
    reads: list[tuple[str, int, int]] = []
    real = LocalStorage.read_range

    def counted(self: LocalStorage, file: FileStat, offset: int, length: int) -> bytes:
        reads.append((file.name, offset, length))
        return real(self, file, offset, length)

    real_into = LocalStorage.read_into

    def counted_into(self: LocalStorage, file: FileStat, offset: int, out: memoryview) -> None:
        reads.append((file.name, offset, len(out)))
        real_into(self, file, offset, out)

    monkeypatch.setattr(LocalStorage, "read_range", counted)
    monkeypatch.setattr(LocalStorage, "read_into", counted_into)  # the hot path's read, into a reused buffer
    return reads


def test_written_then_read_gives_the_same_batches_and_reads_no_footer(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "job.index"
    info = jobindex.write(data, out)
    assert out.exists() and info.files == len(list(data.rglob("*.parquet"))) and info.bytes == out.stat().st_size
    with plitzer.Loader(data, **CFG) as plain:
        want = _batches(plain, 6)
        frame = plain.index.frame
    monkeypatch.setenv("PLITZER_CACHE", str(tmp_path / "empty-cache"))  # nothing cached: footers would be read
    reads = _count_reads(monkeypatch)
    with plitzer.Loader(data, index=str(out), **CFG) as ld:
        assert reads == []  # opened from the one object: no footer read
        assert ld.index.frame.equals(frame)
        got = _batches(ld, 6)
        ranges = set(
            zip(frame["file"].to_list(), frame["byte_offset"].to_list(), frame["byte_length"].to_list(), strict=True)
        )
        assert reads and all(r in ranges for r in reads)  # every read is a token column chunk
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_selection_and_the_torch_settings_take_it_too(data: Path, tmp_path: Path) -> None:
    out = tmp_path / "job.index"
    jobindex.write(data, out)
    where = "int_score >= 2"
    with plitzer.Loader(data, where=where, **CFG) as a, plitzer.Loader(data, where=where, index=str(out), **CFG) as b:
        for x, y in zip(_batches(a, 4), _batches(b, 4), strict=True):
            np.testing.assert_array_equal(x, y)
        assert a.config == b.config  # the job index is where footers come from, not part of the run


def test_stale_when_a_file_changed_was_added_or_removed(data: Path, tmp_path: Path) -> None:
    out = tmp_path / "job.index"
    jobindex.write(data, out)
    files = sorted(data.rglob("*.parquet"))
    # changed: rewritten with other content
    victim = files[1]
    table = pq.read_table(victim)
    pq.write_table(table.slice(0, table.num_rows - 1), victim, row_group_size=10)
    with pytest.raises(StaleIndexError, match=f"{victim.name} changed since it was written") as e:
        plitzer.Loader(data, index=str(out), **CFG)
    assert e.value.file == str(victim)
    jobindex.write(data, out)  # fresh again
    extra = data / "zz-new.parquet"
    shutil.copy(files[0], extra)
    with pytest.raises(StaleIndexError, match=r"zz-new\.parquet was added"):
        plitzer.Loader(data, index=str(out), **CFG)
    extra.unlink()
    files[2].unlink()
    with pytest.raises(StaleIndexError, match=f"{files[2].name} was removed"):
        plitzer.Loader(data, index=str(out), **CFG)


def test_a_copy_with_the_same_bytes_but_a_new_mtime_is_the_same_file(data: Path, tmp_path: Path) -> None:
    """``cp`` without ``-p``: every mtime changes, no byte does; the job index still serves, with a warning."""
    out = tmp_path / "job.index"
    jobindex.write(data, out)
    with plitzer.Loader(data, index=str(out), **CFG) as ld:
        want = _batches(ld, 3)
    copy = tmp_path / "copy"
    shutil.copytree(data, copy, copy_function=shutil.copyfile)  # contents only, new mtimes
    for f in sorted(copy.rglob("*.parquet")):
        os.utime(f, ns=(f.stat().st_atime_ns, f.stat().st_mtime_ns + 7_000_000_000))
    jobindex.write(data, copy / "job.index")
    with pytest.warns(PerformanceWarning, match=r"same footer as when it was written.*write it again") as record:
        ld = plitzer.Loader(copy, index=str(copy / "job.index"), **CFG)
    if sys.version_info >= (3, 12):  # warnings' skip_file_prefixes: the user's line
        assert record[0].filename == __file__
    with ld:
        for x, y in zip(want, _batches(ld, 3), strict=True):
            np.testing.assert_array_equal(x, y)
    # The same size and a new mtime but other rows (row groups of 3 and 5 tokens, then 5 and 3) is stale.
    other = tmp_path / "other"
    other.mkdir()
    f = other / "a.parquet"

    def write(lengths: list[int]) -> int:
        docs = pa.array([[7] * n for n in lengths], pa.list_(pa.int32()))
        pq.write_table(pa.table({"tokens": docs}), f, row_group_size=1, compression="none", use_dictionary=False)
        return f.stat().st_size

    size = write([3, 5])
    jobindex.write(other, other / "job.index")
    assert write([5, 3]) == size  # the listing sees the same size, another mtime
    os.utime(f, ns=(f.stat().st_atime_ns, f.stat().st_mtime_ns + 7_000_000_000))
    with pytest.raises(StaleIndexError, match=r"a\.parquet changed since it was written \(same size, another footer\)"):
        plitzer.Loader(other, index=str(other / "job.index"), lanes=2, window=1, seq_len=4)


def test_changed_in_place_after_the_listing_is_refused_on_first_read(data: Path, tmp_path: Path) -> None:
    """A rewrite the listing cannot see (same size, same mtime) is caught by the read's own check."""
    out = tmp_path / "job.index"
    jobindex.write(data, out)
    with plitzer.Loader(data, index=str(out), **CFG) as ld:
        for f in data.rglob("*.parquet"):
            os.utime(f, ns=(1, 1))  # another version under the running loader
        with pytest.raises(plitzer.FileChangedError, match="changed after it was indexed"):
            ld.next_batch()


def test_cli_writes_it_and_bad_uses_are_refused(data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cli.index"
    assert main(["index", str(data), "--no-lengths", "--out", str(out)]) == 0
    assert f"job index: {out}" in capsys.readouterr().out
    with plitzer.Loader(data, index=str(out), **CFG) as ld:
        assert ld.next_batch().step == 0
    with pytest.raises(ConfigError, match="needs one source"):
        plitzer.Loader({"a": str(data), "b": str(data)}, index=str(out), **CFG)
    with pytest.raises(ConfigError, match="differs from the job index's token column"):
        plitzer.Loader(data, index=str(out), column="other", **CFG)
    with pytest.raises(ConfigError, match="does not exist"):
        plitzer.Loader(data, index=str(tmp_path / "missing.index"), **CFG)
    bad = tmp_path / "bad.index"
    pq.write_table(pa.table({"x": [1]}), bad)
    with pytest.raises(DataError, match="is not a plitzer job index"):
        plitzer.Loader(data, index=str(bad), **CFG)


@pytest.mark.timeout(120)
def test_on_s3_one_listing_one_get_then_only_chunks(s3: S3Data, proxy: FaultProxy, fresh_cache: Path) -> None:
    """Written to and read from s3:// through the store's client; before the first batch the
    server sees one listing and one GET (the job index), and no footer GET after it."""
    src, url = s3.url["synth"], f"s3://{s3.bucket}/jobs/synth.index"
    opts = options(proxy.endpoint)
    jobindex.write(src, url, storage_options=s3.options())  # the proxy forwards no request body
    with plitzer.Loader(src, storage_options=opts, **CFG) as plain:
        want = _batches(plain, 3)
        frame = plain.index.frame
    shutil.rmtree(fresh_cache, ignore_errors=True)
    proxy.reset()
    with plitzer.Loader(src, storage_options=opts, index=url, **CFG) as ld:
        before = proxy.log()
        assert sum(r.is_list for r in before) == 1
        gets = [r for r in before if r.is_object_get]
        assert len(gets) == 1 and gets[0].path.endswith("/jobs/synth.index")
        got = _batches(ld, 3)
        chunks = {f"bytes={o}-{o + n - 1}" for o, n in zip(frame["byte_offset"], frame["byte_length"], strict=True)}
        later = [r for r in proxy.log()[len(before) :] if r.is_object_get]
        assert later and all(r.range in chunks for r in later)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)


def test_explain_takes_it_through_the_shared_settings(data: Path, tmp_path: Path) -> None:
    from plitzer.tools.explain import explain

    out = tmp_path / "job.index"
    jobindex.write(data, out)
    want = explain(data, 2, **CFG)  # type: ignore[arg-type]
    assert explain(data, 2, index=str(out), **CFG).equals(want)  # type: ignore[arg-type]


# -- a text source's job index: the counting pass's result, keyed by the tokenizer ---------------


def test_a_text_job_index_skips_footers_and_the_counting_pass(tmp_path: Path, fresh_cache: Path) -> None:
    from plitzer.text.job import write_text_index

    text = write_text(tmp_path / "text", files=4)
    out = tmp_path / "text.index"
    tok = CharTokenizer()
    info = write_text_index(text, out, tokenizer=tok)
    assert info.files == 4 and tok.texts == nonempty_texts(text)
    for policy in ({}, {"add_eos": False}):  # any BOS/EOS policy reads the same index
        with plitzer.Loader(text, tokenizer=tok, **policy, **CFG) as plain:
            want = _batches(plain, 3)
            config, frame = plain.config, plain.index.frame
        shutil.rmtree(fresh_cache, ignore_errors=True)  # nothing cached: footers and counts would be redone
        tok.texts = 0
        with plitzer.Loader(text, tokenizer=tok, index=str(out), **policy, **CFG) as ld:
            assert tok.texts == 0  # no counting pass
            assert not (fresh_cache / "footers").exists()
            assert ld.index.frame.equals(frame) and ld.config == config
            got = _batches(ld, 3)
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(a, b)


def test_a_text_job_index_is_refused_for_another_tokenizer_column_or_kind(tmp_path: Path, data: Path) -> None:
    from plitzer.text.job import write_text_index

    text = write_text(tmp_path / "text", files=3)
    out = tmp_path / "text.index"
    write_text_index(text, out, tokenizer=CharTokenizer("chars-v1"))
    with pytest.raises(ConfigError, match=r"was counted with tokenizer callable:\w+, not tokenizer="):
        plitzer.Loader(text, tokenizer=CharTokenizer("chars-v2"), index=str(out), **CFG)
    with pytest.raises(ConfigError, match="counted text column 'text', not text_column='body'"):
        plitzer.Loader(text, tokenizer=CharTokenizer(), text_column="body", index=str(out), **CFG)
    with pytest.raises(ConfigError, match="pass that tokenizer="):
        plitzer.Loader(text, index=str(out), **CFG)  # a text index read as tokens
    tokens = tmp_path / "tokens.index"
    jobindex.write(data, tokens)
    with pytest.raises(ConfigError, match="indexes the token column 'tokens', not text"):
        plitzer.Loader(data, tokenizer=CharTokenizer(), index=str(tokens), **CFG)
    extra = text / "zz.parquet"
    shutil.copy(sorted(text.glob("*.parquet"))[0], extra)
    with pytest.raises(StaleIndexError, match=r"zz\.parquet was added") as e:
        plitzer.Loader(text, tokenizer=CharTokenizer(), index=str(out), **CFG)
    assert e.value.file == str(extra)


def test_cli_writes_a_text_job_index(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tk = pytest.importorskip("tokenizers")
    text = write_text(tmp_path / "text", files=2)
    bpe = tk.Tokenizer(tk.models.BPE(unk_token="[UNK]"))
    bpe.pre_tokenizer = tk.pre_tokenizers.Whitespace()
    trainer = tk.trainers.BpeTrainer(special_tokens=["</s>", "[UNK]"])
    bpe.train_from_iterator(["the loader packs tokens x deja vu"] * 5, trainer)
    model = tmp_path / "tok.json"
    bpe.save(str(model))
    out = tmp_path / "cli-text.index"
    assert main(["index", str(text), "--tokenizer", str(model), "--out", str(out)]) == 0
    assert f"job index: {out}" in capsys.readouterr().out
    with (
        plitzer.Loader(text, tokenizer=str(model), **CFG) as a,
        plitzer.Loader(text, tokenizer=str(model), index=str(out), **CFG) as b,
    ):
        for x, y in zip(_batches(a, 2), _batches(b, 2), strict=True):
            np.testing.assert_array_equal(x, y)
    capsys.readouterr()
    assert main(["index", str(text), "--tokenizer", str(model)]) != 0
    assert "give --out" in capsys.readouterr().err


# -- a mixture: each source its own job index --------------------------------------------------


def test_a_mixtures_sources_each_read_their_own_job_index(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from plitzer.text.job import write_text_index

    code = tmp_path / "code"
    plitzer.synth.write(code, tokens=50_000, seed=9, docs_per_row_group=10, row_groups_per_file=2)
    text = write_text(tmp_path / "text", files=3)
    tok = CharTokenizer()
    jobindex.write(data, tmp_path / "web.index")
    jobindex.write(code, tmp_path / "code.index")
    write_text_index(text, tmp_path / "notes.index", tokenizer=tok)
    plain: dict[str, object] = {
        "web": {"path": str(data), "where": "int_score >= 2"},
        "code": str(code),
        "notes": {"path": str(text), "tokenizer": tok},
    }
    indexed = {
        "web": {"path": str(data), "where": "int_score >= 2", "index": str(tmp_path / "web.index")},
        "code": {"path": str(code), "index": str(tmp_path / "code.index")},
        "notes": {"path": str(text), "tokenizer": tok, "index": str(tmp_path / "notes.index")},
    }
    with plitzer.Loader(plain, **CFG) as a:
        want = _batches(a, 4)
        config = a.config
    monkeypatch.setenv("PLITZER_CACHE", str(tmp_path / "empty-cache"))  # footers and counts would be redone
    tok.texts = 0
    fetched: list[str] = []
    real_fetch = footer.fetch
    monkeypatch.setattr(footer, "fetch", lambda st, f: fetched.append(f.name) or real_fetch(st, f))
    # No footer for decoding or planning. Only the selection pass of "web" (where=) reads
    # footers, each once, for its predicate's columns, which the job index does not carry:
    # said once, with the fix (tests/sources/test_jobindex_columns.py: with --columns, none).
    with pytest.warns(PerformanceWarning, match="does not carry column 'int_score'"):
        b = plitzer.Loader(indexed, **CFG)  # the selection pass runs before the first batch
    with b:
        assert tok.texts == 0  # no counting pass
        assert sorted(fetched) == sorted(p.name for p in data.glob("*.parquet"))
        assert b.config == config  # where the footers come from is not part of the run
        got = _batches(b, 4)
    for x, y in zip(got, want, strict=True):
        np.testing.assert_array_equal(x, y)
    victim = sorted(code.glob("*.parquet"))[-1]
    victim.unlink()
    with pytest.raises(StaleIndexError, match=f"{victim.name} was removed"):
        plitzer.Loader(indexed, **CFG)
    with pytest.raises(ConfigError, match="give each source its own job index"):
        plitzer.Loader(plain, index=str(tmp_path / "web.index"), **CFG)
    with pytest.raises(ConfigError, match="must be the path or URL of its job index"):
        plitzer.Loader({"code": {"path": str(code), "index": 3}}, **CFG)


def test_cli_writes_one_job_index_a_source_of_a_mixture(
    data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = tmp_path / "code"
    plitzer.synth.write(code, tokens=30_000, seed=11, docs_per_row_group=10, row_groups_per_file=2)
    mix = tmp_path / "mix.toml"
    mix.write_text(f'[sources.web]\npath = "{data}"\nweight = 3\n[sources.code]\npath = "{code}"\nweight = 1\n')
    out = tmp_path / "indexes"
    assert main(["index", "--mixture", str(mix), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"job index: {out}/code.index" in printed and f"job index: {out}/web.index" in printed
    plain = {"web": str(data), "code": str(code)}
    indexed = {name: {"path": path, "index": str(out / f"{name}.index")} for name, path in plain.items()}
    weights = {"web": 3, "code": 1}
    with plitzer.Loader(plain, weights=weights, **CFG) as a, plitzer.Loader(indexed, weights=weights, **CFG) as b:
        for x, y in zip(_batches(a, 3), _batches(b, 3), strict=True):
            np.testing.assert_array_equal(x, y)
    assert main(["index", "--mixture", str(mix)]) != 0  # no --out: one dataset only
    assert "--out FOLDER_OR_PREFIX writes one job index per source" in capsys.readouterr().err
