"""Damaged Parquet: a clear DataError naming the file, never a crash, hang or wrong tokens."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import planner
import plitzer

HERE = Path(__file__).parents[1]


def _write(path: Path, *, compression: str = "zstd", checksums: bool = True, rows: int = 60) -> Path:
    rng = np.random.default_rng(7)
    lengths = rng.integers(0, 80, rows)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    values = pa.array(rng.integers(0, 50257, int(offsets[-1])).astype(np.int32))
    t = pa.table({"tokens": pa.ListArray.from_arrays(pa.array(offsets), values)})
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(
        t, path, row_group_size=rows // 4, compression=compression, write_page_checksum=checksums, use_dictionary=False
    )
    return path


def _epoch(d: Path) -> list[np.ndarray]:
    with plitzer.Loader(d, lanes=4, window=2, seq_len=50) as ld:
        return [np.from_dlpack(ld.next_batch().tokens).copy() for _ in range(len(ld))]


def _chunk_range(path: Path, rg: int) -> tuple[int, int]:
    cc = pq.read_metadata(path).row_group(rg).column(0)
    return cc.data_page_offset, cc.total_compressed_size


@pytest.mark.parametrize(
    ("damage", "where"),
    [
        ("empty", "index"),
        ("no_magic", "index"),
        ("truncated_footer", "index"),
        ("truncated_data", "index"),
        ("footer_garbage", "index"),
    ],
)
def test_damage_found_at_indexing(tmp_path: Path, damage: str, where: str) -> None:
    p = _write(tmp_path / "d" / "x.parquet")
    data = bytearray(p.read_bytes())
    flen = int.from_bytes(data[-8:-4], "little")
    if damage == "empty":
        data = bytearray()
    elif damage == "no_magic":
        data[-4:] = b"XXXX"
    elif damage == "truncated_footer":
        data = data[: len(data) - flen // 2]
    elif damage == "truncated_data":
        data = data[:100] + data[len(data) - flen - 8 :]
    elif damage == "footer_garbage":
        start = len(data) - 8 - flen
        data[start : start + 40] = bytes(range(200, 240))
    p.write_bytes(bytes(data))
    with pytest.raises(plitzer.DataError, match=r"x\.parquet"):
        planner.index(p.parent)


@pytest.mark.parametrize("compression", ["zstd", "none"])
def test_flipped_page_byte_is_caught_at_the_step_that_reads_it(tmp_path: Path, compression: str) -> None:
    p = _write(tmp_path / "d" / "x.parquet", compression=compression)
    good = _epoch(p.parent)
    start, length = _chunk_range(p, 2)
    data = bytearray(p.read_bytes())
    data[start + length - 10] ^= 0x55  # inside row group 2's last page body
    p.write_bytes(bytes(data))
    with pytest.raises(plitzer.DataError, match=r"x\.parquet, row group 2") as err:
        got = _epoch(p.parent)
        assert got != good
    assert "damaged" in str(err.value) or "decode" in str(err.value)


def test_footer_claiming_more_rows_than_exist(tmp_path: Path) -> None:
    p = _write(tmp_path / "d" / "x.parquet", rows=60)  # row groups of 15 rows
    data = bytearray(p.read_bytes())
    flen = int.from_bytes(data[-8:-4], "little")
    footer = data[len(data) - 8 - flen : len(data) - 8]
    # RowGroup.num_rows is field 3, an i64 right after total_byte_size: header 0x16,
    # zigzag varint 30 (15 rows). Make the first row group claim 16 rows (zigzag 32).
    at = footer.find(b"\x16\x1e")
    assert at > 0
    footer[at + 1] = 0x20
    data[len(data) - 8 - flen : len(data) - 8] = footer
    p.write_bytes(bytes(data))
    with pytest.raises(plitzer.DataError, match=r"x\.parquet, row group 0"):
        _epoch(p.parent)


def _limit_memory() -> None:
    cap = 6 << 30
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))


@pytest.mark.timeout(240)
def test_fuzz_flips_and_truncations(tmp_path: Path) -> None:
    """Seeded random damage through the whole loader, in a capped subprocess."""
    base = _write(tmp_path / "base.parquet", rows=80)
    n = 150
    proc = subprocess.run(
        [sys.executable, str(HERE / "fuzz_parquet.py"), str(base), str(tmp_path / "work"), str(n), "1"],
        check=False,
        capture_output=True,
        text=True,
        timeout=200,
        preexec_fn=_limit_memory,
    )
    last = (tmp_path / "work" / "progress").read_text() if (tmp_path / "work" / "progress").exists() else "?"
    assert proc.returncode == 0, f"fuzz process died on input {last}: {proc.returncode}\n{proc.stderr[-3000:]}"
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["counts"]["different"] == 0, result
    assert result["counts"]["error"] + result["counts"]["identical"] == n
    assert result["counts"]["error"] > n // 2


# -- odd and damaged files in the manner of apache/parquet-testing's bad_data ---------


def _load_error(d: Path) -> str:
    """The DataError that indexing or loading ``d`` raises (it must raise one)."""
    with pytest.raises(plitzer.DataError) as err:
        planner.index(d)
        _epoch(d)
    msg = str(err.value)
    assert "x.parquet" in msg and "\n" not in msg, msg
    return msg


def _patch_footer(p: Path, old: bytes, new: bytes) -> None:
    data = p.read_bytes()
    flen = int.from_bytes(data[-8:-4], "little")
    start = len(data) - 8 - flen
    footer = data[start:-8]
    assert footer.count(old) == 1, footer
    assert len(old) == len(new)
    p.write_bytes(data[:start] + footer.replace(old, new) + data[-8:])


def test_repetition_levels_that_start_with_1(tmp_path: Path) -> None:
    from tests.handmade_parquet import write_two_level

    docs = [[1, 2, 3], [], [4]]
    # The first level says "this value continues the row before": there is none.
    write_two_level(tmp_path / "x.parquet", [docs], rep_override=[[1, 1, 0, 0, 0]])
    assert "repetition level" in _load_error(tmp_path)


def test_negative_dictionary_page_count(tmp_path: Path) -> None:
    t = pa.table({"tokens": pa.array([[i % 7, 3] for i in range(50)], pa.list_(pa.int32()))})
    p = tmp_path / "x.parquet"
    pq.write_table(t, p, use_dictionary=True, compression="none")
    cc = pq.read_metadata(p).row_group(0).column(0)
    assert cc.has_dictionary_page
    data = bytearray(p.read_bytes())
    at = cc.dictionary_page_offset
    # DictionaryPageHeader (PageHeader field 7) begins with num_values (i32, 7 values:
    # zigzag 14). Make it -7 (zigzag 13).
    head = data[at : at + 40]
    i = head.find(b"\x15\x0e", head.find(b"\x3c") if b"\x3c" in head else head.find(b"\x4c"))
    assert i > 0
    data[at + i + 1] = 0x0D
    p.write_bytes(bytes(data))
    _load_error(tmp_path)


def test_required_column_holding_nulls(tmp_path: Path) -> None:
    docs = [[1, None, 2], [3], [None, None], [4, 5]] * 5
    p = tmp_path / "x.parquet"
    pq.write_table(pa.table({"tokens": pa.array(docs, pa.list_(pa.int32()))}), p, store_schema=False)
    # The element's repetition type: OPTIONAL (zigzag 2) becomes REQUIRED (0), so the
    # pages' definition levels no longer match the schema.
    _patch_footer(p, b"\x15\x02\x25\x02\x18\x07element", b"\x15\x02\x25\x00\x18\x07element")
    _load_error(tmp_path)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (b"\x18\x06schema\x15\x02", b"\x18\x06schema\x15\x06"),  # the root claims 3 children
        (b"\x15\x02\x25\x00\x18\x07element", b"\x15\x0e\x25\x00\x18\x07element"),  # INT32 becomes FLBA
    ],
)
def test_corrupted_schema(tmp_path: Path, old: bytes, new: bytes) -> None:
    p = tmp_path / "x.parquet"
    typ = pa.list_(pa.field("element", pa.int32(), nullable=False))
    pq.write_table(pa.table({"tokens": pa.array([[1, 2]] * 10, typ)}), p, store_schema=False)
    _patch_footer(p, old, new)
    _load_error(tmp_path)
