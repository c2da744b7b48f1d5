"""A job index that carries more columns than the token column (``plitzer index DATA --out JOB --columns a,b``).

With the columns a run's ``where=``, ``length_column=``, aligned ``columns=`` and ``dedupe=``
key read carried in the job index, a rank reads no footer at all, in the selection pass as
in the epoch, and gets the batches it gets without a job index. A column it does not carry
is read through the footers as before, said once with the fix. Files of FineWeb-Edu's shape
(``plitzer.synth.write_fineweb_shaped``), footers counted where they are fetched
(``planner.catalog.footer.fetch``), as tests/sources/test_real_shapes.py does.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import plitzer
import plitzer.synth
from planner.catalog import footer, jobindex
from plitzer.cli import main
from plitzer.errors import ConfigError, PerformanceWarning

CFG: dict[str, Any] = {"lanes": 4, "seq_len": 64, "window": 2, "seed": 3}
CARRIED = ["int_score", "language_score", "token_count", "url", "loss_mask"]
PER_FILE = 400
BYTES_PER_ROW_GROUP = 128
"""What a job index may cost a row group with the token column alone (tests/sources/test_real_shapes.py)."""
BYTES_PER_CARRIED_COLUMN = 16
"""What each carried column may add a row group: its chunk's offset, length, codec and value count."""


def _with_mask(paths: list[Path]) -> None:
    """Add an aligned ``loss_mask`` (one bool a token) to files of FineWeb-Edu's shape, row groups kept."""
    for p in paths:
        f = pq.ParquetFile(p)
        size = f.metadata.row_group(0).num_rows
        table = f.read()
        ids = table.column("input_ids").combine_chunks()
        mask = pc.equal(pc.bit_wise_and(ids.values, pa.scalar(1, pa.int32())), pa.scalar(0, pa.int32()))
        table = table.append_column("loss_mask", pa.ListArray.from_arrays(ids.offsets, mask))
        pq.write_table(table, p, row_group_size=size, compression="zstd")


@pytest.fixture
def data(tmp_path: Path) -> Path:
    """Four files, two distinct (so ``url`` repeats across files: a dedupe key with duplicates)."""
    d = tmp_path / "data"
    _with_mask(plitzer.synth.write_fineweb_shaped(d, 4, row_groups_per_file=30, distinct=2, rows_per_row_group=3))
    return d


@pytest.fixture
def fetched(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every footer fetched from storage (the name of its file), as it is fetched."""
    got: list[str] = []
    real = footer.fetch
    monkeypatch.setattr(footer, "fetch", lambda st, f: got.append(f.name) or real(st, f))
    return got


def _epoch(ld: plitzer.Loader) -> list[tuple[np.ndarray, dict[str, np.ndarray]]]:
    return [(np.asarray(b.tokens).copy(), {k: np.asarray(v).copy() for k, v in b.columns.items()}) for b in ld]


def _same(a: list[tuple[np.ndarray, dict[str, np.ndarray]]], b: list[tuple[np.ndarray, dict[str, np.ndarray]]]) -> None:
    assert len(a) == len(b) and a
    for (ta, ca), (tb, cb) in zip(a, b, strict=True):
        np.testing.assert_array_equal(ta, tb)
        assert ca.keys() == cb.keys()
        for k in ca:
            np.testing.assert_array_equal(ca[k], cb[k])


RUNS: dict[str, dict[str, Any]] = {
    "where": {"where": "int_score >= 2 and language_score > 0.2"},
    "length_column": {"where": "int_score >= 1", "length_column": "token_count"},
    "aligned": {"columns": ["loss_mask"]},
    "dedupe": {"dedupe": "url"},
    "everything": {
        "where": "int_score >= 1",
        "length_column": "token_count",
        "columns": ["loss_mask"],
        "dedupe": "url",
    },
}


@pytest.mark.parametrize("run", list(RUNS))
def test_carried_columns_give_the_same_batches_and_no_footer_is_read(
    run: str, data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fetched: list[str]
) -> None:
    kw = RUNS[run]
    out = tmp_path / "job.index"
    jobindex.write(data, out, columns=CARRIED)
    monkeypatch.setenv("PLITZER_CACHE", str(tmp_path / "cache-plain"))
    with plitzer.Loader(data, **kw, **CFG) as plain:
        want = _epoch(plain)
        config = plain.config
    assert fetched  # without the job index: footers
    fetched.clear()
    monkeypatch.setenv("PLITZER_CACHE", str(tmp_path / "cache-job"))  # nothing cached: a footer would be fetched
    with warnings.catch_warnings():
        warnings.simplefilter("error", PerformanceWarning)  # nothing to say: every column is carried
        with plitzer.Loader(data, index=str(out), **kw, **CFG) as ld:
            assert fetched == []  # the selection, length, key and column passes, before the first batch
            got = _epoch(ld)  # a whole epoch
            assert ld.config == config
    assert fetched == []
    _same(got, want)


def test_a_column_it_lacks_is_read_through_footers_said_once_with_the_fix(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fetched: list[str]
) -> None:
    out = tmp_path / "job.index"
    jobindex.write(data, out, columns=["int_score"])
    kw: dict[str, Any] = {"where": "int_score >= 2 and language_score > 0.2", "columns": ["loss_mask"]}
    monkeypatch.setenv("PLITZER_CACHE", str(tmp_path / "cache-plain"))
    with plitzer.Loader(data, **kw, **CFG) as plain:
        want = _epoch(plain)
    fetched.clear()
    monkeypatch.setenv("PLITZER_CACHE", str(tmp_path / "cache-job"))
    with pytest.warns(PerformanceWarning) as said, plitzer.Loader(data, index=str(out), **kw, **CFG) as ld:
        got = _epoch(ld)
    _same(got, want)
    texts = [str(w.message) for w in said if issubclass(w.category, PerformanceWarning)]
    for name in ("language_score", "loss_mask"):
        mine = [t for t in texts if f"does not carry column {name!r}" in t]
        assert len(mine) == 1, texts  # once, however many row groups read it
        assert f"plitzer index DATA --out {out} --columns {name}" in mine[0]
    assert not [t for t in texts if "'int_score'" in t]  # carried: no footer for it
    files = sorted(p.relative_to(data).as_posix() for p in data.rglob("*.parquet"))
    assert sorted(set(fetched)) == files and len(fetched) == len(files)  # each footer once, for what it lacks


def test_an_old_token_only_job_index_keeps_loading_and_reads_footers_for_the_rest(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fetched: list[str]
) -> None:
    out = tmp_path / "old.index"
    info = jobindex.write(data, out)
    assert jobindex.write(data, tmp_path / "same.index", columns=()).bytes == info.bytes
    assert (tmp_path / "same.index").read_bytes() == out.read_bytes()  # no columns named: the object of before
    table = pq.read_table(out)
    assert not [c for c in table.column_names if c.startswith("c0_")]
    assert {b"columns", b"column_templates", b"schema"}.isdisjoint(table.schema.metadata or {})
    monkeypatch.setenv("PLITZER_CACHE", str(tmp_path / "cache-plain"))
    with plitzer.Loader(data, where="int_score >= 2", **CFG) as plain:
        want = _epoch(plain)
    monkeypatch.setenv("PLITZER_CACHE", str(tmp_path / "cache-job"))
    fetched.clear()
    with plitzer.Loader(data, index=str(out), **CFG) as ld:  # the token column alone: no footer
        ld.next_batch()
    assert fetched == []
    with pytest.warns(PerformanceWarning, match="does not carry column 'int_score'"):
        with plitzer.Loader(data, index=str(out), where="int_score >= 2", **CFG) as ld:
            got = _epoch(ld)
    _same(got, want)


def test_the_job_index_is_bytes_a_row_group_and_each_carried_column_a_few_more(tmp_path: Path) -> None:
    # Distinct files (their offsets and counts differ), so compression flatters nothing.
    plitzer.synth.write_fineweb_shaped(tmp_path / "d", 6, row_groups_per_file=PER_FILE, distinct=6)
    plain = jobindex.write(tmp_path / "d", tmp_path / "plain.index")
    two = jobindex.write(tmp_path / "d", tmp_path / "two.index", columns=["int_score", "token_count"])
    rgs = 6 * PER_FILE
    per_plain, per_two = plain.bytes / rgs, two.bytes / rgs
    print(f"job index: token column alone {per_plain:.1f} B a row group; with 2 columns {per_two:.1f}")
    assert per_plain <= BYTES_PER_ROW_GROUP, plain
    assert per_two <= BYTES_PER_ROW_GROUP + 2 * BYTES_PER_CARRIED_COLUMN, two
    assert per_two > per_plain  # the columns cost bytes only when named


def test_cli_index_columns_and_what_it_refuses(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cli.index"
    assert main(["index", str(data), "--no-lengths", "--out", str(out), "--columns", "int_score,token_count"]) == 0
    assert "carries int_score, token_count" in capsys.readouterr().out
    ix = jobindex.load(out, data)
    assert ix.carries("int_score") and ix.carries("token_count") and not ix.carries("url")
    assert ix.schema().names == pq.read_schema(next(data.rglob("*.parquet"))).names
    assert main(["index", str(data), "--columns", "int_score"]) != 0  # a job index's columns: no --out
    assert "give --out" in capsys.readouterr().err
    assert main(["index", str(data), "--out", str(out), "--columns", "nope"]) != 0
    assert "no column 'nope' to carry" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="is the token column"):
        jobindex.write(data, tmp_path / "x.index", columns=["input_ids"])
    with pytest.raises(ConfigError, match="names 'url' twice"):
        jobindex.write(data, tmp_path / "x.index", columns=["url", "url"])


def test_a_cached_index_still_gets_its_columns_from_one_footer_read_a_file(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fetched: list[str]
) -> None:
    monkeypatch.setenv("PLITZER_CACHE", str(tmp_path / "cache"))
    plitzer.index(data)  # the index is cached: building the job index reads no footer for the counts
    fetched.clear()
    jobindex.write(data, tmp_path / "job.index", columns=["url"])
    files = sorted(p.relative_to(data).as_posix() for p in data.rglob("*.parquet"))
    assert sorted(fetched) == files  # one footer a file, for the carried column
    fetched.clear()
    monkeypatch.setenv("PLITZER_CACHE", str(tmp_path / "cache2"))
    jobindex.write(data, tmp_path / "job2.index", columns=["url"])  # nothing cached: still one a file
    assert sorted(fetched) == files
    assert (tmp_path / "job.index").read_bytes() == (tmp_path / "job2.index").read_bytes()
