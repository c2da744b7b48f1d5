"""The row-group index from footers: edge cases, errors, the cache."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import planner
import planner.catalog.footer
import plitzer
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
    from plitzer.readpath.read import count_chunk

    a, b = planner.index(tmp_path / "a"), planner.index(tmp_path / "b", count=count_chunk)
    assert a.frame["tokens"].to_list() == b.frame["tokens"].to_list()
    assert a.frame["empty_docs"].to_list() == b.frame["empty_docs"].to_list()
    assert a.fingerprint == b.fingerprint


def test_planner_alone_counts_a_footer_without_statistics_with_the_installed_counter(tmp_path: Path) -> None:
    """A process that never imports plitzer counts such a footer as one that did: the counter is the one
    installed (pyproject.toml's ``planner.passes``, planner.runtime), not what was imported first."""
    import subprocess
    import sys

    write_dataset(tmp_path / "b", [DOCS], statistics=False)
    code = (
        "import sys, planner\n"
        "assert not any(m.split('.')[0] == 'plitzer' for m in sys.modules)\n"
        "print(planner.index(sys.argv[1]).tokens)"
    )
    env = {**os.environ, "PLITZER_CACHE": str(tmp_path / "cache")}
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "b")], capture_output=True, text=True, check=True, env=env
    ).stdout
    assert out.split() == [str(sum(len(doc) for rg in DOCS for doc in rg))]


def test_the_counter_is_passed_not_registered(tmp_path: Path) -> None:
    """Inside planner a footer without statistics is counted by the counter passed down, or refused; only the
    public planner.index (SPEC section 2) defaults to the installed one, plitzer's (planner.runtime)."""
    import sys

    from planner.catalog.counting import FooterCounting
    from planner.catalog.dataset import index_entries
    from planner.catalog.files import list_files
    from plitzer.readpath.read import count_chunk

    assert "plitzer.readpath.read" in sys.modules
    write_dataset(tmp_path / "b", [DOCS], statistics=False)
    entries, src = list_files(tmp_path / "b", None)
    with pytest.raises(planner.DataError, match="pass count=plitzer"):
        index_entries(entries, src, FooterCounting(None))  # what the job index and a rank's share get without it
    tokens = sum(len(doc) for rg in DOCS for doc in rg)
    assert index_entries(entries, src, FooterCounting(None, count_chunk)).tokens == tokens
    assert planner.index(tmp_path / "b").tokens == tokens


def test_null_documents_count_as_empty(tmp_path: Path) -> None:
    write_dataset(tmp_path, [[[[1, 2], None, [3]]]])
    f = planner.index(tmp_path).frame
    assert f["tokens"].to_list() == [3] and f["empty_docs"].to_list() == [1]


@pytest.mark.parametrize("large", [False, True])
@pytest.mark.parametrize(
    ("width", "dtype"),
    [
        ("int8", "int32"),
        ("uint8", "int32"),
        ("int16", "int32"),
        ("uint16", "int32"),
        ("int32", "int32"),
        ("uint32", "uint32"),
        ("int64", "int32"),
        ("uint64", "uint32"),
    ],
)
def test_any_integer_width_is_a_token_column(tmp_path: Path, width: str, dtype: str, large: bool) -> None:
    write_dataset(tmp_path, [DOCS], dtype=width, large=large)
    ix = planner.index(tmp_path)
    assert ix.dtype == dtype and ix.tokens == 12
    # Narrowing is proved safe by the footer's min/max: no value is checked at decode.
    assert ix.frame["needs_check"].to_list() == [False] * 3


def test_needs_check_where_statistics_do_not_prove_the_values_fit(tmp_path: Path) -> None:
    typ = pa.list_(pa.int64())
    with pq.ParquetWriter(tmp_path / "x.parquet", pa.schema([("tokens", typ)])) as w:
        w.write_table(pa.table({"tokens": pa.array([[1, 2]], typ)}))
        w.write_table(pa.table({"tokens": pa.array([[1, 2**40]], typ)}))
        w.write_table(pa.table({"tokens": pa.array([[-(2**31), 2**31 - 1]], typ)}))
        w.write_table(pa.table({"tokens": pa.array([[], None], typ)}))
    assert planner.index(tmp_path).frame["needs_check"].to_list() == [False, True, False, False]
    write_dataset(tmp_path / "nostats", [DOCS], dtype="uint64", statistics=False)
    assert plitzer.index(tmp_path / "nostats").frame["needs_check"].to_list() == [True, True, False]


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


def test_files_may_differ_in_width_but_not_in_batch_dtype(tmp_path: Path) -> None:
    write_dataset(tmp_path, [DOCS])
    pq.write_table(pa.table({"tokens": pa.array([[1, 2]], pa.large_list(pa.int64()))}), tmp_path / "f001.parquet")
    ix = planner.index(tmp_path)  # int32 and int64 both give int32 batches
    assert ix.dtype == "int32" and ix.tokens == 14
    pq.write_table(pa.table({"tokens": pa.array([[1, 2]], pa.list_(pa.uint32()))}), tmp_path / "f001.parquet")
    with pytest.raises(
        planner.DataError, match=r"f001\.parquet: token column 'tokens' of type list<.*uint32> .* differs"
    ):
        planner.index(tmp_path)
    pq.write_table(pa.table({"tokens": pa.array([["a"]], pa.list_(pa.string()))}), tmp_path / "f001.parquet")
    with pytest.raises(
        planner.ConfigError, match=r"f001\.parquet: no token column.*tokens \(list<.*string>\).*column="
    ):
        planner.index(tmp_path)
    with pytest.raises(planner.ConfigError, match=r"f001\.parquet: column 'tokens' has type list<element: string>"):
        planner.index(tmp_path, column="tokens")
    pq.write_table(pa.table({"other": pa.array([[1]], pa.list_(pa.int32()))}), tmp_path / "f001.parquet")
    with pytest.raises(planner.ConfigError, match=r"f001\.parquet: token column 'tokens' not found; columns are other"):
        planner.index(tmp_path, column="tokens")


def test_column_found_by_name_then_by_type(tmp_path: Path) -> None:
    def one(name: str, **cols: pa.Array) -> Path:
        d = tmp_path / name
        d.mkdir()
        pq.write_table(pa.table(cols), d / "x.parquet")
        return d

    ints = pa.array([[1, 2]], pa.list_(pa.int64()))
    mask = pa.array([[1, 1]], pa.list_(pa.int8()))
    text = pa.array(["a b"])
    hf = one("hf", text=text, input_ids=pa.array([[1, 2]], pa.list_(pa.int32())), attention_mask=mask)
    assert planner.index(hf).column == "input_ids"
    for name in ("tokens", "token_ids"):
        assert planner.index(one(name, mask=mask, **{name: ints})).column == name
    assert planner.index(one("single", text=text, ids=ints)).column == "ids"
    with pytest.raises(
        planner.ConfigError,
        match=r"no token column: no column is a list of integers \(columns: text \(string\)\); pass column=",
    ):
        planner.index(one("none", text=text))
    two = one("two", a=ints, b=mask)
    with pytest.raises(
        planner.ConfigError,
        match=r"several candidate token columns: a \(list<element: int64>\), b \(list<element: int8>\); pass column=",
    ):
        planner.index(two)
    assert planner.index(two, column="b").column == "b"
    both = one("both", input_ids=ints, tokens=ints)
    with pytest.raises(planner.ConfigError, match=r"several candidate token columns: input_ids .*, tokens"):
        planner.index(both)


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

    def boom(*args: object) -> bytes:
        raise AssertionError("a footer was read")

    monkeypatch.setattr(planner.catalog.footer, "fetch", boom)
    again = planner.index(tmp_path)
    assert again.frame.equals(first.frame) and again.fingerprint == first.fingerprint
    # The read path needs no footer at all: the index's rows and the file's template make one.
    from plitzer.readpath.read import read_chunk

    assert read_chunk(again, 0).to_pylist() == read_chunk(first, 0).to_pylist()


def _newer(path: Path, than_ns: int) -> None:
    """Give ``path`` an mtime one second after ``than_ns``, without waiting for the clock."""
    os.utime(path, ns=(than_ns + 10**9, than_ns + 10**9))


def test_changed_file_invalidates_the_cache(tmp_path: Path) -> None:
    write_dataset(tmp_path, [DOCS])
    a = planner.index(tmp_path)
    before = (tmp_path / "f000.parquet").stat().st_mtime_ns
    write_dataset(tmp_path, [[[[1, 2, 3, 4]]]])
    _newer(tmp_path / "f000.parquet", before)
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
    assert any((planner.cache_dir() / "index").rglob("*.parquet"))  # the index, not its footers


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
        (pa.string(), "a b"),
        (pa.list_(pa.list_(pa.int32())), [[1], [2]]),
        (pa.list_(pa.string()), ["a"]),
        (pa.list_(pa.null()), [None]),
        (pa.list_(pa.float32()), [1.0]),
        (pa.list_(pa.bool_()), [True]),
    ],
)
def test_token_column_of_another_type_names_file_and_fix(tmp_path: Path, typ: pa.DataType, value: object) -> None:
    pq.write_table(pa.table({"tokens": pa.array([value], typ)}), tmp_path / "bad.parquet")
    with pytest.raises(
        planner.ConfigError, match=r"bad\.parquet: column 'tokens' has type .* list or large_list of integers"
    ):
        planner.index(tmp_path, column="tokens")
    with pytest.raises(planner.ConfigError, match=r"bad\.parquet: no token column"):
        planner.index(tmp_path)


def test_a_file_replaced_under_a_running_loader_is_refused(tmp_path: Path) -> None:
    import plitzer

    write_dataset(tmp_path, [[[[1] * 50] * 20 for _ in range(6)]])
    with plitzer.Loader(tmp_path, lanes=2, window=1, seq_len=10) as ld:
        ld.next_batch()
        before = (tmp_path / "f000.parquet").stat().st_mtime_ns
        write_dataset(tmp_path, [[[[2] * 50] * 20 for _ in range(6)]])  # same size, new mtime
        _newer(tmp_path / "f000.parquet", before)
        changed = r"f000\.parquet: the file changed after it was indexed"
        with pytest.raises(plitzer.FileChangedError, match=changed) as e:
            for _ in range(200):
                ld.next_batch()
        assert Path(e.value.file or "").name == "f000.parquet"
