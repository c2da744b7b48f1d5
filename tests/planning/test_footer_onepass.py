"""The one-pass rows (``planner.catalog.onepass``) against the per-row-group path.

``footer.row_groups`` with the footer's bytes takes one regex pass over them where the
token column's layout is one it knows, and the per-row-group path (pyarrow's accessors)
otherwise. These tests write every setting the input tests cover and check, file by
file, that the rows are exactly the per-row-group path's, and which path was taken:
the one pass where the layout is common, a fallback (never an error) where it is not.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import plitzer
from planner.catalog import footer, onepass
from planner.catalog.files import list_files
from planner.stores.storage import FileStat
from plitzer.readpath.read import count_chunk
from tests.handmade_parquet import write_two_level
from tests.sources.test_inputs import PYARROW_CASES, make_docs


def rows_both(path: Path, column: str | None = None, monkeypatch: Any = None) -> tuple[np.ndarray, bool]:
    """(the rows, whether the one pass gave them), checked equal to the per-row-group path's rows."""
    (entry,), _ = list_files(path, None)
    raw = footer.fetch(entry.storage, entry.stat)
    taken: list[bool] = []
    real = onepass.rows

    def spy(*a: Any, **k: Any) -> Any:
        got = real(*a, **k)
        taken.append(got is not None)
        return got

    assert monkeypatch is not None
    monkeypatch.setattr(onepass, "rows", spy)
    md = footer.parse(raw, entry.stat.location, check=False)
    fast, name, dtype = footer.row_groups(entry.storage, entry.stat, md, column, count_chunk, raw=raw, checked=False)
    assert taken, "the one pass was not tried"
    monkeypatch.setattr(onepass, "rows", real)
    slow, name2, dtype2 = footer.row_groups(
        entry.storage, entry.stat, footer.parse(raw, entry.stat.location), column, count_chunk
    )
    assert (name, dtype) == (name2, dtype2)
    assert fast.dtype == slow.dtype == np.int64 and fast.shape == slow.shape
    np.testing.assert_array_equal(fast, slow)
    return fast, taken[0]


def _write(path: Path, table: pa.Table, **kw: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, **kw)
    return path


def _tokens(docs: list[Any], typ: pa.DataType) -> pa.Table:
    return pa.table({"tokens": pa.array(docs, typ)})


FAST_CASES = [c for c in PYARROW_CASES if c != "no-statistics"]


@pytest.mark.parametrize("case", list(PYARROW_CASES))
def test_every_pyarrow_setting_gives_the_same_rows(tmp_path: Path, case: str, monkeypatch: Any) -> None:
    path = tmp_path / "d" / "data.parquet"
    path.parent.mkdir()
    PYARROW_CASES[case](path, make_docs())
    rows, fast = rows_both(path, monkeypatch=monkeypatch)
    assert len(rows) == pq.read_metadata(path).num_row_groups > 1
    assert fast == (case in FAST_CASES)  # no statistics: counted by reading, the per-row-group path


@pytest.mark.parametrize("large", [False, True])
@pytest.mark.parametrize("width", ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"])
def test_every_width_and_list_type(tmp_path: Path, width: str, large: bool, monkeypatch: Any) -> None:
    info = np.iinfo(np.dtype(width))
    docs = make_docs(vocab=min(int(info.max), 2**31 - 1))
    docs[3] = [int(info.max), 0]  # the width's extremes: out of int32's or uint32's range for 64 bits
    docs[50] = [int(info.min), 1]
    typ = (pa.large_list if large else pa.list_)(pa.from_numpy_dtype(np.dtype(width)))
    path = _write(tmp_path / "d" / "x.parquet", _tokens(docs, typ), row_group_size=20)
    rows, fast = rows_both(path, monkeypatch=monkeypatch)
    assert fast
    check = rows[:, 6].astype(bool)
    wide = {"int64": (0, 2), "uint64": (0,)}.get(width, ())  # beyond int32 / uint32, by min/max
    assert check.tolist() == [g in wide for g in range(len(rows))]


@pytest.mark.parametrize("bad", [2**31, -(2**31) - 1])
def test_narrowing_check_follows_min_and_max(tmp_path: Path, bad: int, monkeypatch: Any) -> None:
    docs = make_docs(60, vocab=1000)
    docs[47] = [1, 2, bad, 3]
    path = _write(tmp_path / "d" / "x.parquet", _tokens(docs, pa.list_(pa.int64())), row_group_size=30)
    rows, fast = rows_both(path, monkeypatch=monkeypatch)
    assert fast and rows[:, 6].tolist() == [0, 1]


def test_fineweb_shaped_many_row_groups(tmp_path: Path, monkeypatch: Any) -> None:
    (path,) = plitzer.synth.write_fineweb_shaped(tmp_path / "d", 1, row_groups_per_file=300)
    md = pq.read_metadata(path)
    assert md.num_columns == 11 and md.num_row_groups == 300
    rows, fast = rows_both(path.parent, monkeypatch=monkeypatch)
    assert fast and rows[:, 0].tolist() == list(range(300))
    assert rows[:, 2].sum() == sum(md.row_group(g).column(10).statistics.num_values for g in range(300))


def test_token_column_not_the_last(tmp_path: Path, monkeypatch: Any) -> None:
    docs = make_docs(200)
    t = pa.table(
        {
            "input_ids": pa.array(docs, pa.list_(pa.int32())),
            "text": pa.array([f"doc {i}" for i in range(200)]),
            "score": pa.array(np.arange(200) / 7),
        }
    )
    path = _write(tmp_path / "d" / "x.parquet", t, row_group_size=17)
    rows, fast = rows_both(path, monkeypatch=monkeypatch)
    assert fast and rows[:, 1].sum() == 200


@pytest.mark.parametrize("writer", ["polars", "two-level", "pandas", "duckdb"])
def test_other_writers_give_the_same_rows(tmp_path: Path, writer: str, monkeypatch: Any) -> None:
    docs = make_docs()
    path = tmp_path / "d" / "x.parquet"
    path.parent.mkdir()
    if writer == "polars":
        import polars as pl

        pl.DataFrame({"tokens": docs}, schema={"tokens": pl.List(pl.UInt16)}).write_parquet(path, row_group_size=20)
    elif writer == "two-level":
        plain = [d or [] for d in docs]
        write_two_level(path, [plain[:30], plain[30:31], plain[31:]])
    elif writer == "pandas":
        import pandas as pd

        pd.DataFrame({"tokens": docs}).to_parquet(path, row_group_size=40)
    else:
        duckdb = pytest.importorskip("duckdb")
        con = duckdb.connect()
        con.execute("SET threads = 1")
        con.register("t", _tokens(docs, pa.list_(pa.int64())))
        con.execute(f"COPY (SELECT * FROM t) TO '{path}' (FORMAT parquet, ROW_GROUP_SIZE 32)")
        con.close()
    _, fast = rows_both(path, monkeypatch=monkeypatch)
    assert fast == (writer != "two-level")  # the hand-made writer writes no statistics: counted by reading


def _rewrite_footer(path: Path, edit: Callable[[bytes], bytes]) -> None:
    data = path.read_bytes()
    flen = int.from_bytes(data[-8:-4], "little")
    body = edit(data[-8 - flen : -8])
    path.write_bytes(data[: -8 - flen] + body + len(body).to_bytes(4, "little") + b"PAR1")


def _insert_index_page_offset(body: bytes, g: int) -> bytes:
    """Row group ``g``'s token chunk gains ``index_page_offset`` (field 10): valid, but another layout."""
    md_path = b"\x19\x38\x06tokens\x04list\x07element"
    at = -1
    for _ in range(g + 1):
        at = body.index(md_path, at + 1)
    pos = at + len(md_path)
    # walk i32/i64 fields up to data_page_offset (9), then put field 10 before field 11 (delta 2 -> 1)
    last = 3
    while True:
        b = body[pos]
        last += b >> 4
        pos += 1
        while body[pos] & 0x80:
            pos += 1
        pos += 1
        if last == 9:
            break
    assert body[pos] == 0x26  # field 11 (dictionary_page_offset), delta 2
    return body[:pos] + b"\x16\x00\x16" + body[pos + 1 :]


def _retype_dictionary_offset(body: bytes) -> bytes:
    """Every token chunk's ``dictionary_page_offset`` header says i32, not i64: a field pyarrow skips."""
    md_path = b"\x19\x38\x06tokens\x04list\x07element"
    out, at = bytearray(body), body.find(md_path)
    while at >= 0:
        pos, last = at + len(md_path), 3
        while last != 9:
            last += out[pos] >> 4
            pos += 1
            while out[pos] & 0x80:
                pos += 1
            pos += 1
        assert out[pos] == 0x26
        out[pos] = 0x25
        at = body.find(md_path, at + 1)
    return bytes(out)


def test_a_field_of_another_type_falls_back(tmp_path: Path, monkeypatch: Any) -> None:
    """pyarrow skips a field of another type (unset): the one pass must not read it either."""
    path = _write(tmp_path / "d" / "x.parquet", _tokens(make_docs(), pa.list_(pa.int32())), row_group_size=25)
    _rewrite_footer(path, _retype_dictionary_offset)
    assert not pq.read_metadata(path).row_group(1).column(0).has_dictionary_page
    (entry,), _ = list_files(path, None)
    raw = footer.fetch(entry.storage, entry.stat)
    md = footer.parse(raw, entry.stat.location, check=False)
    real = onepass.rows
    got: list[Any] = []
    monkeypatch.setattr(onepass, "rows", lambda *a, **k: got.append(real(*a, **k)) or got[-1])
    # Without the dictionary page the chunk's range runs past the file: the per-row-group error.
    with pytest.raises(plitzer.DataError, match=r"row group \d: the token column chunk .* lies outside the file"):
        footer.row_groups(entry.storage, entry.stat, md, None, count_chunk, raw=raw, checked=False)
    assert got == [None]


def test_a_row_group_of_another_layout_falls_back(tmp_path: Path, monkeypatch: Any) -> None:
    path = _write(tmp_path / "d" / "x.parquet", _tokens(make_docs(), pa.list_(pa.int32())), row_group_size=25)
    _rewrite_footer(path, lambda body: _insert_index_page_offset(body, 2))
    rows, fast = rows_both(path, monkeypatch=monkeypatch)
    assert not fast and len(rows) == 4


def test_a_writer_whose_statistics_pyarrow_doubts_falls_back(tmp_path: Path, monkeypatch: Any) -> None:
    path = _write(tmp_path / "d" / "x.parquet", _tokens(make_docs(), pa.list_(pa.int64())), row_group_size=25)
    created = pq.read_metadata(path).created_by.encode()
    other = b"parquet-mr version 1.12.3 (build x)"
    _rewrite_footer(
        path,
        lambda body: body.replace(b"\x18" + bytes([len(created)]) + created, b"\x18" + bytes([len(other)]) + other),
    )
    assert pq.read_metadata(path).created_by == other.decode()
    rows, fast = rows_both(path, monkeypatch=monkeypatch)
    assert not fast and len(rows) == 4


def test_fuzzed_footers_give_the_same_rows_or_the_same_error(tmp_path: Path, monkeypatch: Any) -> None:
    """Bytes flipped in a FineWeb-shaped footer: both paths give the same rows, or the same DataError."""
    (path,) = plitzer.synth.write_fineweb_shaped(tmp_path / "d", 1, row_groups_per_file=6)
    good = path.read_bytes()
    start = len(good) - 8 - int.from_bytes(good[-8:-4], "little")
    st = FileStat(path.name, str(path), len(good), "v")
    real = onepass.rows
    rng = np.random.default_rng(5)
    outcomes = {"rows": 0, "error": 0}

    def outcome(raw: bytes, one_pass: bool) -> tuple[Any, ...]:
        monkeypatch.setattr(onepass, "rows", real if one_pass else lambda *a, **k: None)
        try:
            md = footer.parse(raw, "x.parquet", check=False)
            rows, name, dtype = footer.row_groups(None, st, md, None, None, raw=raw, checked=False)  # type: ignore[arg-type]
        except plitzer.DataError as e:
            return ("error", str(e))
        return ("rows", rows.tolist(), name, str(dtype))

    for _ in range(600):
        data = bytearray(good)
        for _ in range(int(rng.integers(1, 4))):
            data[int(rng.integers(start, len(good) - 8))] ^= int(rng.integers(1, 256))
        raw = bytes(data[start:])
        got = outcome(raw, True)
        assert got == outcome(raw, False)
        outcomes[got[0]] += 1
    assert min(outcomes.values()) > 20  # both kinds of footer were tried
