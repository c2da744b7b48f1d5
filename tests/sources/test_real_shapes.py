"""A job over files shaped like FineWeb-Edu's: eleven columns, hundreds of row groups a file.

A one-column, ten-row-group file hides what a real footer costs (about 1.4-1.8 KB a row
group, most of it about columns the loader never reads). These tests build files of the
real shape (``plitzer.synth.write_fineweb_shaped``: tiny rows, real footers) and assert
what a rank pays for them:

* the job index's bytes a row group;
* a fresh process's peak RSS growth a row group (against the same process on a one-file
  dataset), cold, with ``index=``, and as one of two gloo ranks;
* that after the job index no footer is read, and every read is a token column chunk;
* that decoding from the minimal footer gives what pyarrow gives from the real one.

Timing is the benchmark's (benchmarks/cluster.py --shapes), not these tests'.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

import plitzer
from planner.catalog import datasetindex, footer, jobindex
from planner.catalog.dataset import index
from planner.stores.storage import FileStat, LocalStorage
from plitzer.readpath.read import read_chunk
from tests.net import free_port

ROOT = Path(__file__).resolve().parents[2]
PROBE = ROOT / "tests" / "rss_probe.py"
FILES, PER_FILE = 300, 400  # 120,000 row groups, as the issue measured
RSS_PER_ROW_GROUP = 256
"""Bytes of peak RSS a row group may cost a rank that builds its index from footers, against one
file: the issue's 256 B (0.4: 11.3-13.5 KB). 171-176 B measured alone, 195-218 B for each of 2 gloo
ranks (272-312 B before their shares went straight into the frame's columns, the heap was trimmed
after the rows were let go, and the read path decoded with each row group's own footer instead of
whole files' ones: docs/design.md, "Bytes a row group"). That counts in a fixed working set of a
few MB; each further row group costs less (:data:`MID_FILES`)."""
LOADED_RSS_PER_ROW_GROUP = 256
"""The same, for a rank that loads its index (a job index, or its own cache): the issue's 256 B;
194-198 B measured (198-221 B with whole files' decoding footers; 336-373 B before the epoch plan's
slices and the cache's lists; 484-662 before planner.catalog.payload.ParquetBytes)."""


@pytest.fixture(scope="module")
def shaped(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(a one-file dataset, a 300-file dataset) of FineWeb-Edu's shape: copies of one file."""
    root = tmp_path_factory.mktemp("shaped")
    one = plitzer.synth.write_fineweb_shaped(root / "one", 1, row_groups_per_file=PER_FILE)[0]
    many = root / "many" / "CC-MAIN-2024-10"
    many.mkdir(parents=True)
    for i in range(FILES):  # hard links: 300 files' footers at no disk cost
        os.link(one, many / f"{i // 1000:03d}_{i:05d}.parquet")
    return root / "one", root / "many"


MID_FILES = 120
"""Files of the middle dataset (48,000 row groups): the growth between it and the 300-file one is
what each further row group costs, apart from the fixed working set that a growth against one
file counts in (the files being read, the threads' buffers, the parsing footers: 5-10 MB, so 40-80
B a row group at 120,000 and almost nothing at 10^6)."""


@pytest.fixture(scope="module")
def mid(shaped: tuple[Path, Path]) -> Path:
    """The first :data:`MID_FILES` files of the 300-file dataset (hard links)."""
    root = shaped[1].parent / "mid"
    some = root / "CC-MAIN-2024-10"
    some.mkdir(parents=True)
    for f in sorted(shaped[1].rglob("*.parquet"))[:MID_FILES]:
        os.link(f, some / f.name)
    return root


def test_the_shape_is_real(shaped: tuple[Path, Path]) -> None:
    md = pq.read_metadata(next(shaped[0].rglob("*.parquet")))
    assert md.num_columns == 11 and md.num_row_groups == PER_FILE
    assert md.serialized_size / PER_FILE > 1000  # a real footer's bytes a row group


@pytest.mark.parametrize("large", [False, True], ids=["files-footers", "own-footers"])
def test_minimal_footers_decode_what_the_real_footer_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, large: bool
) -> None:
    paths = plitzer.synth.write_fineweb_shaped(tmp_path, 2, row_groups_per_file=7, distinct=2)
    if large:  # as an index of more than FILE_FOOTERS_UP_TO row groups reads
        monkeypatch.setattr(datasetindex, "FILE_FOOTERS_UP_TO", 13)
    ix = index(tmp_path)
    assert ix.row_groups == 14
    for rg in range(ix.row_groups):
        fi, g = int(ix.frame["file_index"][rg]), int(ix.frame["row_group"][rg])
        want = pq.ParquetFile(paths[fi]).read_row_group(g, columns=["input_ids"]).column(0).to_pylist()
        assert read_chunk(ix, rg).to_pylist() == want
    # A small index keeps each file's minimal footer, made once; a large one decodes each
    # read with its row group's own footer and keeps no file's.
    assert len(ix._chunks) == (0 if large else 2)
    # The minimal footer is bytes a row group, the real one kilobytes.
    assert ix.chunk_metadata(0).serialized_size / 7 < 100 < pq.read_metadata(paths[0]).serialized_size / 7
    # A row group's own footer: it alone, as row group 0.
    own = ix.chunk_footer(9)
    assert own.num_row_groups == 1 and own.row_group(0).num_rows == int(ix.frame["rows"][9])
    assert own.row_group(0).column(0).data_page_offset == int(ix.frame["byte_offset"][9])


def test_the_job_index_is_bytes_a_row_group(tmp_path: Path) -> None:
    # Distinct files (their offsets and counts differ), so compression flatters nothing.
    plitzer.synth.write_fineweb_shaped(tmp_path / "d", 6, row_groups_per_file=PER_FILE, distinct=6)
    info = jobindex.write(tmp_path / "d", tmp_path / "job.index")
    assert info.row_groups == 6 * PER_FILE
    assert info.bytes / info.row_groups <= 128, info
    table = pq.read_table(tmp_path / "job.index")
    assert "footer" not in table.column_names  # what decoding needs, not the footers


def test_no_footer_after_the_job_index_and_every_read_a_chunk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "d"
    plitzer.synth.write_fineweb_shaped(data, 4, row_groups_per_file=50, distinct=4)
    jobindex.write(data, tmp_path / "job.index")
    with plitzer.Loader(data, lanes=4, seq_len=64, window=8, seed=3) as ref:
        want = [np.asarray(b.tokens).copy() for b in ref]
        frame = ref.index.frame
    chunks = set(zip(frame["file"], frame["byte_offset"], frame["byte_length"], strict=True))
    monkeypatch.setenv("PLITZER_CACHE", str(tmp_path / "fresh-cache"))

    def no_footer(*args: object) -> bytes:
        raise AssertionError("a footer was read")

    reads: list[tuple[str, int, int]] = []
    real_into = LocalStorage.read_into

    def counted_into(self: LocalStorage, file: FileStat, offset: int, out: memoryview) -> None:
        reads.append((file.name, offset, len(out)))
        real_into(self, file, offset, out)

    monkeypatch.setattr(footer, "fetch", no_footer)
    monkeypatch.setattr(LocalStorage, "read_into", counted_into)
    with plitzer.Loader(data, index=str(tmp_path / "job.index"), lanes=4, seq_len=64, window=8, seed=3) as ld:
        got = [np.asarray(b.tokens).copy() for b in ld]  # a whole epoch
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)
    assert reads and set(reads) <= chunks  # token column chunks only


def _probe(data: Path, cache: Path, *args: str) -> dict[str, float]:
    env = {**os.environ, "PLITZER_CACHE": str(cache), "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, str(PROBE), str(data), *args]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    got: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return got


def _growth(big: dict[str, float], small: dict[str, float]) -> float:
    return (big["peak_bytes"] - small["peak_bytes"]) / (big["row_groups"] - small["row_groups"])


@pytest.mark.e2e
def test_a_ranks_memory_is_bytes_a_row_group(shaped: tuple[Path, Path], mid: Path, tmp_path: Path) -> None:
    one, many = shaped
    big = _probe(many, tmp_path / "c1")
    cold = _growth(big, _probe(one, tmp_path / "c2"))
    # Each further row group, the working set apart: the 256 B (116-124 B measured).
    assert _growth(big, _probe(mid, tmp_path / "c5")) <= LOADED_RSS_PER_ROW_GROUP
    jobindex.write(one, tmp_path / "one.index")
    jobindex.write(many, tmp_path / "many.index")
    indexed = _growth(
        _probe(many, tmp_path / "c3", "--index", str(tmp_path / "many.index")),
        _probe(one, tmp_path / "c4", "--index", str(tmp_path / "one.index")),
    )
    warm = _growth(_probe(many, tmp_path / "c1"), _probe(one, tmp_path / "c2"))  # the caches the cold runs left
    assert cold <= RSS_PER_ROW_GROUP, cold
    assert indexed <= LOADED_RSS_PER_ROW_GROUP, indexed
    assert warm <= LOADED_RSS_PER_ROW_GROUP, warm


def _ranks(data: Path, cache: Path) -> list[dict[str, float]]:
    """Two gloo ranks on this machine, each its own cache folder (separate machines), to the first batch."""
    port = str(free_port())
    procs = []
    for r in range(2):
        env = {**os.environ, "PLITZER_CACHE": str(cache / f"rank{r}"), "PYTHONPATH": str(ROOT)}
        cmd = [sys.executable, str(PROBE), str(data), "--rank", str(r), "--world", "2", "--port", port]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [e[-2000:] for _, e in outs]
    return [json.loads(o.strip().splitlines()[-1]) for o, _ in outs]


@pytest.mark.e2e
def test_two_gloo_ranks_share_the_index_and_each_holds_bytes_a_row_group(
    shaped: tuple[Path, Path], mid: Path, tmp_path: Path
) -> None:
    one, many = shaped
    big, small = _ranks(many, tmp_path / "big"), _ranks(one, tmp_path / "small")
    middle = _ranks(mid, tmp_path / "mid")
    for b, s, m in zip(big, small, middle, strict=True):
        assert _growth(b, s) <= RSS_PER_ROW_GROUP, (b, s)
        # Each further row group, the working set apart: 148-185 B measured (196-258 B before
        # the shares went straight into the frame's columns).
        assert _growth(b, m) <= RSS_PER_ROW_GROUP, (b, m)
    # Each rank read and parsed half of the footers: its CPU is at most 1/2 + 25 % of one process's index.
    alone = _probe(many, tmp_path / "alone")
    assert max(b["cpu_s"] for b in big) - max(s["cpu_s"] for s in small) < 0.75 * alone["cpu_s"], (big, alone)


TEXT_RSS_PER_ROW_GROUP = RSS_PER_ROW_GROUP
"""The bound of a text source's counting pass (a slope, :data:`TEXT_FILES`): the issue's 256 B, as a
token source's: 167-180 B measured, 293-387 B before the first epoch's plan gave its temporaries back: the
first batch's tokenizing (30-40 MB on the scanner's threads) did not reuse what the plan had freed
on the loader's, so it stayed in the peak (docs/design.md, "Bytes a row group")."""

TEXT_FILES = (40, 120)
"""Files of the text and selection tests' two datasets (16,000 and 48,000 row groups): their passes
read every row group (0.3-0.5 ms each here), so fewer files than the token tests, and the growth is
taken between two sizes, not against one file: a pass holds a fixed working set (the files being
read, its threads' buffers and DuckDB's: 8-14 MB), 170-230 B a row group at 48,000."""


def _subsets(many: Path, tmp_path: Path, *args: str) -> tuple[dict[str, float], dict[str, float]]:
    """The probe on the first 40 and the first 120 files of ``many`` (hard links), each with its own cache."""
    files = sorted(many.rglob("*.parquet"))
    got = []
    for n in TEXT_FILES:
        some = tmp_path / f"d{n}" / "CC-MAIN-2024-10"
        some.mkdir(parents=True)
        for f in files[:n]:
            os.link(f, some / f.name)
        got.append(_probe(some.parent, tmp_path / f"c{n}", *args))
    small, big = got
    assert (small["row_groups"], big["row_groups"]) == tuple(n * PER_FILE for n in TEXT_FILES)
    return small, big


@pytest.mark.e2e
def test_a_text_sources_counting_pass_is_bytes_a_row_group(shaped: tuple[Path, Path], tmp_path: Path) -> None:
    # The text column tokenized by characters: the pass reads every footer once (kept by none)
    # and every row group's text chunk once (through the index's minimal footers).
    small, big = _subsets(shaped[1], tmp_path, "--text")
    # 167-180 B measured (293-387 B before the epoch's plan gave its temporaries back; 942 B
    # with a Python tuple a row group and md.schema's reference cycle; 11.7 KB at 0.4, every
    # footer held).
    assert _growth(big, small) <= TEXT_RSS_PER_ROW_GROUP, (big, small)


@pytest.mark.e2e
def test_a_selection_pass_is_bytes_a_row_group(shaped: tuple[Path, Path], tmp_path: Path) -> None:
    # where= reads a column the index does not hold: each footer is read once, for that column's
    # chunks alone, and each run of 16 row groups decoded through a footer made for it.
    small, big = _subsets(shaped[1], tmp_path, "--where", "language = 'en'")
    # 1,016 B measured with 64 whole footers kept, 477 B with 8; then no footer kept, one
    # bitmap array for all row groups and two arrays a chunk.
    assert _growth(big, small) <= LOADED_RSS_PER_ROW_GROUP, (big, small)


DEDUPE_BUDGET = str(100_000_000)
"""The probe's budget under deduplication: the copies' row groups keep no row, so a step's windows span
many row groups (the loader's budget check asks for more than the probe's 16 MB)."""
DROPPED_ROW_BYTES = 128
"""What each dropped row may cost a deduplication pass at its peak, on top of the row groups' bytes: its
row of the duplicates' table (which row was kept for it: 7 integers while resolving, 5 kept, for
``locate``), its position, the resolving sort's temporaries. Per row, not per row group: real row groups
hold thousands of rows, of which a few are dropped; here every row of the copies is, 2 a row group."""


@pytest.mark.e2e
@pytest.mark.parametrize("key", ["url", "tokens"])
def test_a_dedupe_pass_is_bytes_a_row_group(shaped: tuple[Path, Path], tmp_path: Path, key: str) -> None:
    # dedupe= keys every row group: each chunk of 16 read through a footer made for it (the
    # file's footer parsed once for the key's column, or the index's token column), phase 1
    # held as a few arrays, the dropped rows as two arrays a part. The files are copies of one,
    # so every row of the later ones is a duplicate (2 a row group).
    small, big = _subsets(shaped[1], tmp_path, "--dedupe", key, "--budget", DEDUPE_BUDGET)
    # 464-641 B measured (the index's own 278 B of it between these sizes, 130 B past them);
    # 1,264-1,724 B with a whole-file minimal footer kept for each of the last 64 files, a dict
    # of seven arrays a chunk and an array or a dict entry a row group.
    assert _growth(big, small) <= RSS_PER_ROW_GROUP + 2 * DROPPED_ROW_BYTES, (big, small)
