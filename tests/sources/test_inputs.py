"""Pre-tokenized Parquet as people have it: any integer width, any common writer.

Every case writes the same documents with one writer and settings, then checks
two things against a reference dataset of the same documents and row groups
written as plain ``list<int32>`` with pyarrow's defaults (``list<uint32>`` for
uint32 and uint64 data):

* every decoded row group (``plitzer.readpath.read.read_chunk``) holds exactly the
  documents written, as ``list<int32>``/``list<uint32>``;
* a Loader gives the same batches, step by step, as a Loader on the reference.

The reference's row groups are copied from the written file's footer, so writers
that choose their own row-group sizes (DuckDB, HF datasets) are compared fairly.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import planner
import plitzer
from plitzer.readpath.read import read_chunk
from tests.handmade_parquet import write_two_level

SETTINGS = {"seed": 3, "lanes": 4, "window": 2, "seq_len": 24}
Docs = list[list[int] | None]


def make_docs(n: int = 90, vocab: int = 30_000, seed: int = 0) -> Docs:
    rng = np.random.default_rng(seed)
    docs: Docs = [rng.integers(0, vocab, int(k)).tolist() for k in rng.integers(0, 40, n)]
    docs[5] = []
    docs[17] = None  # a null list is an empty document
    return docs


def _pa_table(docs: Docs, typ: pa.DataType, column: str = "tokens") -> pa.Table:
    return pa.table({column: pa.array(docs, typ)})


def write_reference(like: Path, docs: Docs, root: Path, dtype: str = "int32") -> Path:
    """``docs`` as plain list<dtype>, pyarrow defaults, row groups as in file ``like``."""
    md = pq.read_metadata(like)
    typ = pa.list_(pa.uint32() if dtype == "uint32" else pa.int32())
    root.mkdir(parents=True, exist_ok=True)
    out = root / like.name
    with pq.ParquetWriter(out, pa.schema([("tokens", typ)])) as w:
        start = 0
        for g in range(md.num_row_groups):
            n = md.row_group(g).num_rows
            w.write_table(_pa_table(docs[start : start + n], typ))
            start += n
    assert start == len(docs)
    return root


def batches(source: Path, column: str | None = None) -> list[np.ndarray]:
    with plitzer.Loader(source, column=column, **SETTINGS) as ld:  # type: ignore[arg-type]
        return [np.from_dlpack(b.tokens).copy() for _ in range(2) for b in ld]


def check_same(got_dir: Path, docs_per_file: list[Docs], ref_dir: Path, *, dtype: str = "int32") -> None:
    ix = plitzer.index(got_dir)  # plitzer counts a footer without statistics (count=)
    assert ix.dtype == dtype
    want = [[] if d is None else d for docs in docs_per_file for d in docs]
    target = pa.uint32() if dtype == "uint32" else pa.int32()
    got: list[list[int]] = []
    for rg in range(ix.row_groups):
        arr = read_chunk(ix, rg)
        assert pa.types.is_list(arr.type) and arr.type.value_type == target
        got += [[] if d is None else d for d in arr.to_pylist()]
    assert got == want
    a, b = batches(got_dir), batches(ref_dir)
    assert len(a) == len(b) > 0
    for x, y in zip(a, b, strict=True):
        assert x.dtype == y.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(x, y)


INT32_LIST = pa.list_(pa.int32())


def _pyarrow(typ: pa.DataType = INT32_LIST, **kw: object) -> Callable[[Path, Docs], None]:
    def write(path: Path, docs: Docs) -> None:
        pq.write_table(_pa_table(docs, typ), path, row_group_size=25, **kw)  # type: ignore[arg-type]

    return write


PYARROW_CASES = {
    "dictionary-off": _pyarrow(use_dictionary=False),
    "delta-binary-packed": _pyarrow(use_dictionary=False, column_encoding={"tokens": "DELTA_BINARY_PACKED"}),
    "byte-stream-split": _pyarrow(use_dictionary=False, column_encoding={"tokens": "BYTE_STREAM_SPLIT"}),
    "data-page-v2": _pyarrow(data_page_version="2.0"),
    "no-statistics": _pyarrow(write_statistics=False),
    "tiny-pages-page-index": _pyarrow(data_page_size=64, write_page_index=True),
    "large-list-int64-delta": _pyarrow(
        pa.large_list(pa.int64()), use_dictionary=False, column_encoding={"tokens": "DELTA_BINARY_PACKED"}
    ),
    **{f"codec-{c}": _pyarrow(compression=c) for c in ["snappy", "gzip", "brotli", "zstd", "lz4", "none"]},
}


@pytest.mark.parametrize("case", list(PYARROW_CASES))
def test_pyarrow_encodings_codecs_and_layouts(tmp_path: Path, case: str) -> None:
    docs = make_docs()
    path = tmp_path / "got" / "data.parquet"
    path.parent.mkdir()
    PYARROW_CASES[case](path, docs)
    check_same(path.parent, [docs], write_reference(path, docs, tmp_path / "ref"))


@pytest.mark.parametrize(
    ("width", "large", "vocab", "dtype"),
    [
        ("int8", False, 128, "int32"),
        ("uint8", True, 256, "int32"),
        ("int16", False, 32_768, "int32"),
        ("uint16", False, 65_536, "int32"),
        ("int64", True, 2**31, "int32"),
        ("uint32", False, 2**32, "uint32"),
        ("uint64", True, 2**32, "uint32"),
    ],
)
def test_every_integer_width(tmp_path: Path, width: str, large: bool, vocab: int, dtype: str) -> None:
    docs = make_docs(vocab=vocab)
    docs[3] = [vocab - 1, 0, vocab - 1]  # the extremes of the width survive
    if width.startswith("int"):
        docs[4] = [-(min(vocab, 2**31)), -1]
    typ = (pa.large_list if large else pa.list_)(pa.from_numpy_dtype(np.dtype(width)))
    path = tmp_path / "got" / "data.parquet"
    path.parent.mkdir()
    pq.write_table(_pa_table(docs, typ), path, row_group_size=30)
    check_same(path.parent, [docs], write_reference(path, docs, tmp_path / "ref", dtype), dtype=dtype)


def test_duckdb_writer(tmp_path: Path) -> None:
    import duckdb

    docs = make_docs()
    t = _pa_table(docs, pa.list_(pa.int64()))  # DuckDB writes BIGINT[]
    path = tmp_path / "got" / "data.parquet"
    path.parent.mkdir()
    con = duckdb.connect()
    con.execute("SET threads = 1")  # one thread keeps the rows in order
    con.register("t", t)
    con.execute(f"COPY (SELECT * FROM t) TO '{path}' (FORMAT parquet, ROW_GROUP_SIZE 32)")
    con.close()
    assert pq.read_metadata(path).schema.column(0).physical_type == "INT64"
    check_same(path.parent, [docs], write_reference(path, docs, tmp_path / "ref"))


def test_polars_writer(tmp_path: Path) -> None:
    import polars as pl

    docs = make_docs()
    frame = pl.DataFrame({"tokens": docs}, schema={"tokens": pl.List(pl.UInt16)})
    path = tmp_path / "got" / "data.parquet"
    path.parent.mkdir()
    frame.write_parquet(path, row_group_size=20)
    check_same(path.parent, [docs], write_reference(path, docs, tmp_path / "ref"))


def test_pandas_list_int64(tmp_path: Path) -> None:
    import pandas as pd

    docs = make_docs()
    path = tmp_path / "got" / "data.parquet"
    path.parent.mkdir()
    pd.DataFrame({"text": [str(i) for i in range(len(docs))], "tokens": docs}).to_parquet(path, row_group_size=40)
    assert pq.read_schema(path).field("tokens").type == pa.list_(pa.int64())
    check_same(path.parent, [docs], write_reference(path, docs, tmp_path / "ref"))


def test_hf_datasets_tokenized(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")

    docs = [d if d is not None else [] for d in make_docs()]
    features = datasets.Features(
        {
            "text": datasets.Value("string"),
            "input_ids": datasets.Sequence(datasets.Value("int32")),
            "attention_mask": datasets.Sequence(datasets.Value("int8")),
        }
    )
    ds = datasets.Dataset.from_dict(
        {"text": ["x"] * len(docs), "input_ids": docs, "attention_mask": [[1] * len(d) for d in docs]},
        features=features,
    )
    path = tmp_path / "got" / "data.parquet"
    path.parent.mkdir()
    ds.to_parquet(str(path), batch_size=32)
    assert planner.index(path.parent).column == "input_ids"  # not the int8 attention_mask
    check_same(path.parent, [docs], write_reference(path, docs, tmp_path / "ref"))


@pytest.mark.parametrize("int64", [False, True])
def test_two_level_legacy_list(tmp_path: Path, int64: bool) -> None:
    """``repeated int32 tokens`` without a LIST annotation (parquet-mr < 1.8, Hive)."""
    docs = [d if d is not None else [] for d in make_docs()]
    path = write_two_level(tmp_path / "got" / "data.parquet", [docs[:30], docs[30:31], docs[31:]], int64=int64)
    assert "repeated" in str(pq.read_metadata(path).schema) and "LIST" not in str(pq.read_metadata(path).schema)
    check_same(path.parent, [docs], write_reference(path, docs, tmp_path / "ref"))


def test_files_of_one_dataset_may_differ_in_layout_and_width(tmp_path: Path) -> None:
    parts = [make_docs(40, seed=s) for s in range(4)]
    parts[0] = [d or [] for d in parts[0]]  # a two-level list has no null list
    got = tmp_path / "got"
    write_two_level(got / "a.parquet", [parts[0][:25], parts[0][25:]])
    pq.write_table(_pa_table(parts[1], pa.large_list(pa.int64())), got / "b.parquet", row_group_size=15)
    pq.write_table(_pa_table(parts[2], pa.list_(pa.uint16())), got / "c.parquet", row_group_size=15)
    pq.write_table(_pa_table(parts[3], pa.list_(pa.int32())), got / "d.parquet", row_group_size=15)
    ref = tmp_path / "ref"
    for name, docs in zip("abcd", parts, strict=True):
        write_reference(got / f"{name}.parquet", docs, ref)
    check_same(got, parts, ref)


# -- narrowing: a value that does not fit is a DataError naming file, row group, row ---


@pytest.mark.parametrize("statistics", [True, False])
@pytest.mark.parametrize(("width", "bad"), [("int64", 2**31), ("int64", -(2**31) - 1), ("uint64", 2**32)])
def test_a_token_that_does_not_fit_names_file_row_group_and_row(
    tmp_path: Path, statistics: bool, width: str, bad: int
) -> None:
    docs = make_docs(60, vocab=1000)
    docs[47] = [1, 2, bad, 3]  # row group 1 (rows 30..59), row 17
    typ = pa.list_(pa.from_numpy_dtype(np.dtype(width)))
    pq.write_table(_pa_table(docs, typ), tmp_path / "x.parquet", row_group_size=30, write_statistics=statistics)
    ix = planner.index(tmp_path)
    assert ix.frame["needs_check"].to_list() == [not statistics, True]
    read_chunk(ix, 0)
    with pytest.raises(plitzer.DataError, match=rf"x\.parquet, row group 1, row 17: token {bad} does not fit") as e:
        read_chunk(ix, 1)
    assert "\n" not in str(e.value)
    with pytest.raises(plitzer.DataError, match=r"x\.parquet, row group 1, row 17"):
        batches(tmp_path)


def test_a_null_token_in_a_wide_column_names_the_row(tmp_path: Path) -> None:
    docs: list[list[int | None] | None] = [[1, 2], [3, None, 4], None]
    pq.write_table(pa.table({"tokens": pa.array(docs, pa.list_(pa.int64()))}), tmp_path / "x.parquet")
    with pytest.raises(plitzer.DataError, match=r"x\.parquet, row group 0, row 1: a null token"):
        read_chunk(planner.index(tmp_path), 0)
