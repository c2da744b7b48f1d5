"""The narrow data errors: each kind a caller would catch on its own, with where it happened as attributes."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import planner
import plitzer
from plitzer.errors import DamagedChunkError, DataError, TokenizerChangedError, TokenRangeError
from plitzer.readpath.read import check_decoded, read_chunk
from plitzer.text.source import load_tokenizer, text_index
from tests.share_fixtures import utf8_bytes


def test_a_token_out_of_range_is_a_token_range_error_with_file_row_group_and_row(tmp_path: Path) -> None:
    docs = [[1, 2]] * 30 + [[3]] * 17 + [[1, 2, 2**31, 3]] + [[4]] * 12  # row group 1, row 17
    pq.write_table(
        pa.table({"tokens": pa.array(docs, pa.list_(pa.int64()))}), tmp_path / "x.parquet", row_group_size=30
    )
    ix = planner.index(tmp_path)
    with pytest.raises(TokenRangeError) as e:
        read_chunk(ix, 1)
    assert isinstance(e.value, DataError) and isinstance(e.value, ValueError)
    assert (Path(e.value.file or "").name, e.value.row_group, e.value.row) == ("x.parquet", 1, 17)
    again = pickle.loads(pickle.dumps(e.value))  # errors cross process boundaries with their attributes
    assert type(again) is TokenRangeError
    assert (again.file, again.row_group, again.row, str(again)) == (e.value.file, 1, 17, str(e.value))


def test_a_chunk_that_decodes_to_other_counts_is_a_damaged_chunk_error() -> None:
    arr = pa.array([[1, 2], [3]], pa.list_(pa.int32()))
    with pytest.raises(DamagedChunkError, match=r"x\.parquet, row group 4: decoded 2 rows") as e:
        check_decoded(arr, rows=2, tokens=4, where="x.parquet, row group 4", file="x.parquet", row_group=4)
    assert (e.value.file, e.value.row_group, e.value.row) == ("x.parquet", 4, None)
    assert isinstance(e.value, plitzer.DataError)


def test_a_flipped_byte_is_a_damaged_chunk_error(tmp_path: Path) -> None:
    docs = [list(range(i % 50, i % 50 + 40)) for i in range(200)]
    p = tmp_path / "x.parquet"
    pq.write_table(pa.table({"tokens": pa.array(docs, pa.list_(pa.int32()))}), p, row_group_size=50, compression="none")
    ix = planner.index(tmp_path)
    start = int(ix.frame["byte_offset"][2])
    data = bytearray(p.read_bytes())
    data[start : start + 8] = b"\xff" * 8  # the first page header
    p.write_bytes(bytes(data))
    ix = planner.index(tmp_path)  # the file changed: indexed again (same footer)
    with pytest.raises(DamagedChunkError) as e:
        read_chunk(ix, 2)
    assert (Path(e.value.file or "").name, e.value.row_group) == ("x.parquet", 2)


def test_a_tokenizer_that_changed_is_a_tokenizer_changed_error(tmp_path: Path) -> None:
    pq.write_table(pa.table({"text": ["abc", "de", "f"] * 4}), tmp_path / "t.parquet", row_group_size=4)
    ix = text_index(tmp_path, tokenizer=load_tokenizer(utf8_bytes, name="bytes-v1", eos_id=256, vocab_size=257))
    # what a changed tokenizer looks like: the counting pass's counts no longer match
    ix.frame = ix.frame.with_columns(
        tokens=np.where(np.arange(ix.frame.height) == 1, ix.frame["tokens"] + 1, ix.frame["tokens"])
    )
    read_chunk(ix, 0)
    with pytest.raises(TokenizerChangedError, match="tokenized to") as e:
        read_chunk(ix, 1)
    assert (Path(e.value.file or "").name, e.value.row_group) == ("t.parquet", 1)
    assert isinstance(e.value, DataError)
