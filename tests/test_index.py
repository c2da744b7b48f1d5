"""The row-group index from footers: edge cases, errors, the cache."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import planner
import planner.dataset as pindex
from tests.conftest import write_dataset

DOCS = [[[1, 2, 3], [], [4, 5]], [[6] * 7], []]  # row groups: 3 docs, 1 doc, 0 docs


def test_counts_come_from_footers(tmp_path: Path) -> None:
    write_dataset(tmp_path, [DOCS, [[[9, 9]]]])
    ix = planner.index(tmp_path)
    f = ix.frame
    assert f["file"].to_list() == ["f000.parquet"] * 3 + ["f001.parquet"]
    assert f["rows"].to_list() == [3, 1, 0, 1]
    assert f["tokens"].to_list() == [5, 7, 0, 2]
    assert f["empty_docs"].to_list() == [1, 0, 0, 0]
    assert f["file_index"].to_list() == [0, 0, 0, 1]
    md = pq.read_metadata(tmp_path / "f000.parquet")
    cc = md.row_group(1).column(0)
    assert f["byte_length"][1] == cc.total_compressed_size
    assert ix.column == "tokens" and ix.dtype == "int32"


def test_footer_without_statistics_is_read_once_to_count(tmp_path: Path) -> None:
    write_dataset(tmp_path / "a", [DOCS], statistics=True)
    write_dataset(tmp_path / "b", [DOCS], statistics=False)
    a, b = planner.index(tmp_path / "a"), planner.index(tmp_path / "b")
    assert a.frame["tokens"].to_list() == b.frame["tokens"].to_list()
    assert a.frame["empty_docs"].to_list() == b.frame["empty_docs"].to_list()
    assert a.fingerprint == b.fingerprint


def test_null_documents_count_as_empty(tmp_path: Path) -> None:
    write_dataset(tmp_path, [[[[1, 2], None, [3]]]])
    f = planner.index(tmp_path).frame
    assert f["tokens"].to_list() == [3] and f["empty_docs"].to_list() == [1]


@pytest.mark.parametrize(("dtype", "large"), [("int32", False), ("uint32", False), ("int32", True), ("uint32", True)])
def test_list_types(tmp_path: Path, dtype: str, large: bool) -> None:
    write_dataset(tmp_path, [DOCS], dtype=dtype, large=large)
    ix = planner.index(tmp_path)
    assert ix.dtype == dtype and ix.tokens == 12


def test_file_without_row_groups_and_foreign_files(tmp_path: Path) -> None:
    write_dataset(tmp_path, [DOCS, []])
    (tmp_path / "README.txt").write_text("not parquet")
    (tmp_path / "sub").mkdir()
    write_dataset(tmp_path / "sub", [[[[1]]]])
    ix = planner.index(tmp_path)
    assert ix.frame["file"].unique(maintain_order=True).to_list() == ["f000.parquet", "sub/f000.parquet"]
    assert [f.name for f in ix.files] == ["f000.parquet", "f001.parquet", "sub/f000.parquet"]


def test_files_are_ordered_bytewise_by_relative_path(tmp_path: Path) -> None:
    for name in ["b.parquet", "B.parquet", "a/z.parquet", "a.parquet"]:
        p = tmp_path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        write_dataset(p.parent / "_tmp", [[[[1]]]])
        os.replace(p.parent / "_tmp" / "f000.parquet", p)
        (p.parent / "_tmp").rmdir()
    ix = planner.index(tmp_path)
    assert [f.name for f in ix.files] == ["B.parquet", "a.parquet", "a/z.parquet", "b.parquet"]


def test_single_file_and_list_sources(tmp_path: Path) -> None:
    write_dataset(tmp_path / "x", [DOCS])
    write_dataset(tmp_path / "y", [[[[5, 5]]]])
    one = planner.index(tmp_path / "x" / "f000.parquet")
    assert one.frame["file"].to_list() == ["f000.parquet"] * 3
    both = planner.index([tmp_path / "x", tmp_path / "y"])
    assert both.frame["file"].to_list() == ["0/f000.parquet"] * 3 + ["1/f000.parquet"]


def test_type_differs_in_one_file_is_named(tmp_path: Path) -> None:
    write_dataset(tmp_path, [DOCS])
    pq.write_table(pa.table({"tokens": pa.array([[1, 2]], pa.list_(pa.int64()))}), tmp_path / "f001.parquet")
    with pytest.raises(planner.DataError, match=r"f001\.parquet.*no token column"):
        planner.index(tmp_path)
    with pytest.raises(planner.DataError, match=r"f001\.parquet: column 'tokens' has type list<element: int64>"):
        planner.index(tmp_path, column="tokens")
    pq.write_table(pa.table({"tokens": pa.array([[1, 2]], pa.list_(pa.uint32()))}), tmp_path / "f001.parquet")
    with pytest.raises(planner.DataError, match=r"f001\.parquet: token column 'tokens' of type list<.*uint32> differs"):
        planner.index(tmp_path)


def test_no_candidate_and_two_candidates(tmp_path: Path) -> None:
    pq.write_table(pa.table({"text": ["a"], "ids": pa.array([[1]], pa.list_(pa.int64()))}), tmp_path / "a.parquet")
    with pytest.raises(planner.DataError, match="no token column: none of"):
        planner.index(tmp_path)
    two = tmp_path / "two"
    two.mkdir()
    t = pa.table({"a": pa.array([[1]], pa.list_(pa.int32())), "b": pa.array([[2]], pa.list_(pa.int32()))})
    pq.write_table(t, two / "x.parquet")
    with pytest.raises(planner.DataError, match=r"several candidate token columns \['a', 'b'\]"):
        planner.index(two)
    assert planner.index(two, column="b").column == "b"
    with pytest.raises(planner.DataError, match="token column 'c' not found"):
        planner.index(two, column="c")


def test_empty_source_and_missing_path(tmp_path: Path) -> None:
    with pytest.raises(planner.ConfigError, match=r"holds no \*\.parquet file"):
        planner.index(tmp_path)
    with pytest.raises(planner.ConfigError, match="does not exist"):
        planner.index(tmp_path / "nope")


def test_not_parquet_is_a_data_error_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / "bad.parquet").write_bytes(b"hello world, certainly not parquet")
    with pytest.raises(planner.DataError, match=r"bad\.parquet: no Parquet magic"):
        planner.index(tmp_path)
    (tmp_path / "bad.parquet").write_bytes(b"")
    with pytest.raises(planner.DataError, match=r"bad\.parquet: the file is empty"):
        planner.index(tmp_path)


def test_second_call_reads_no_footer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_dataset(tmp_path, [DOCS, [[[1]]]])
    first = planner.index(tmp_path)

    def boom(entry: object) -> bytes:
        raise AssertionError("a footer was read")

    monkeypatch.setattr(pindex, "_fetch_footer", boom)
    again = planner.index(tmp_path)
    assert again.frame.equals(first.frame) and again.fingerprint == first.fingerprint
    again.metadata(0)  # the runtime's footer comes from the cache too


def test_changed_file_invalidates_the_cache(tmp_path: Path) -> None:
    write_dataset(tmp_path, [DOCS])
    a = planner.index(tmp_path)
    time.sleep(0.01)
    write_dataset(tmp_path, [[[[1, 2, 3, 4]]]])
    b = planner.index(tmp_path)
    assert b.frame["tokens"].to_list() == [4] and a.fingerprint != b.fingerprint


def test_fingerprint_ignores_location(tmp_path: Path) -> None:
    write_dataset(tmp_path / "one", [DOCS])
    write_dataset(tmp_path / "two", [DOCS])
    assert planner.index(tmp_path / "one").fingerprint == planner.index(tmp_path / "two").fingerprint


def test_cache_lives_in_plitzer_cache_not_in_the_dataset(tmp_path: Path) -> None:
    write_dataset(tmp_path / "d", [DOCS])
    before = sorted(p.name for p in (tmp_path / "d").iterdir())
    planner.index(tmp_path / "d")
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == before
    assert any(planner.cache_dir().rglob("*.footer"))


def test_many_files_read_concurrently(tmp_path: Path) -> None:
    write_dataset(tmp_path, [[[[i, i]]] for i in range(80)])
    ix = planner.index(tmp_path, progress=False)
    assert ix.frame.height == 80 and ix.tokens == 160


def test_planner_never_imports_plitzer_or_torch() -> None:
    import subprocess
    import sys

    code = (
        "import sys, planner; planner.plan; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('plitzer', 'torch')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize(
    ("typ", "value"),
    [
        (pa.list_(pa.int16()), [1, 2]),
        (pa.list_(pa.int64()), [1, 2]),
        (pa.string(), "a b"),
        (pa.list_(pa.list_(pa.int32())), [[1], [2]]),
    ],
)
def test_token_column_of_another_type_names_file_and_fix(tmp_path: Path, typ: pa.DataType, value: object) -> None:
    pq.write_table(pa.table({"tokens": pa.array([value], typ)}), tmp_path / "bad.parquet")
    with pytest.raises(planner.DataError, match=r"bad\.parquet: column 'tokens' has type .* pick another column"):
        planner.index(tmp_path, column="tokens")


def test_a_file_replaced_under_a_running_loader_is_refused(tmp_path: Path) -> None:
    import plitzer

    write_dataset(tmp_path, [[[[1] * 50] * 20 for _ in range(6)]])
    with plitzer.Loader(tmp_path, lanes=2, window=1, seq_len=10) as ld:
        ld.next_batch()
        time.sleep(0.01)
        write_dataset(tmp_path, [[[[2] * 50] * 20 for _ in range(6)]])  # same size, new mtime
        with pytest.raises(plitzer.StorageError, match=r"f000\.parquet: the file changed after it was indexed"):
            for _ in range(200):
                ld.next_batch()
