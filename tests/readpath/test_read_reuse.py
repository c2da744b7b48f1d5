"""Chunks read into reused memory: every decoded array stays intact after later reads.

``plitzer.readpath.read.read_decoded`` reads each column chunk into its thread's reused
buffer and decodes it with a ``ParquetFile`` kept per footer and thread. A decoded
array that pointed into that buffer would change under the caller at the next
read; these tests read many chunks, keep every array, and compare them at the end
with pyarrow's own read of the same row groups, for the encodings where a decoder
could be tempted to alias the page bytes (uncompressed, plain, strings).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import planner
import plitzer.readpath.read
import plitzer.readpath.readers
from planner.errors import DamagedChunkError
from planner.stores.storage import FileStat, LocalStorage
from plitzer.readpath.read import read_chunk, read_decoded


def _write(folder: Path, files: int, *, compression: str, dictionary: bool, seed: int = 0) -> None:
    """``files`` files of 12 row groups of a few hundred documents; a text column beside the tokens."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        lengths = rng.integers(0, 400, size=12 * 60)
        docs = [rng.integers(0, 50_000, size=n, dtype=np.int32) for n in lengths]
        table = pa.table(
            {
                "text": pa.array([f"doc {f}-{i}: " + "x" * (i % 97) for i in range(len(docs))]),
                "tokens": pa.array(docs, type=pa.list_(pa.int32())),
            }
        )
        pq.write_table(
            table,
            folder / f"part-{f:03d}.parquet",
            row_group_size=60,
            compression=compression,
            use_dictionary=dictionary,
        )


def _chunk(ix: planner.Index, rg: int, column: str) -> tuple[FileStat, pq.FileMetaData, int, int, int]:
    """(file, footer, row group, offset, length) of ``column``'s chunk in index row ``rg``."""
    row = ix.frame.row(rg, named=True)
    fi, g = row["file_index"], row["row_group"]
    md = ix.metadata(fi)
    leaf = next(j for j in range(md.num_columns) if md.schema.column(j).path.split(".")[0] == column)
    cc = md.row_group(g).column(leaf)
    start = cc.data_page_offset
    if cc.has_dictionary_page and cc.dictionary_page_offset:
        start = min(start, cc.dictionary_page_offset)
    return ix.file(fi), md, g, start, cc.total_compressed_size


@pytest.mark.parametrize(
    ("compression", "dictionary"), [("none", False), ("none", True), ("zstd", True), ("snappy", False)]
)
def test_many_chunks_through_the_reused_buffer_stay_intact(tmp_path: Path, compression: str, dictionary: bool) -> None:
    d = tmp_path / "data"
    _write(d, 20, compression=compression, dictionary=dictionary)  # more files than a thread keeps decoders for
    ix = planner.index(d)
    storage = LocalStorage(d)
    got: dict[tuple[int, str], pa.Array] = {}
    order = list(range(ix.row_groups))
    order = order[::2] + order[1::2]  # files interleaved: decoders are evicted and built again
    for rg in order:
        for column in ("tokens", "text"):
            st, md, g, start, length = _chunk(ix, rg, column)
            got[rg, column] = read_decoded(
                storage, st, md, row_group=g, column=column, offset=start, length=length, where=f"{st.name} {g}"
            )
    for rg in order:
        row = ix.frame.row(rg, named=True)
        pf = pq.ParquetFile(ix.file(row["file_index"]).location)
        want = pf.read_row_group(row["row_group"], columns=["tokens", "text"])
        for column in ("tokens", "text"):
            assert got[rg, column].equals(want.column(column).combine_chunks()), (rg, column)


def test_the_hot_path_reads_into_one_buffer_and_its_arrays_stay_intact(tmp_path: Path) -> None:
    d = tmp_path / "data"
    _write(d, 3, compression="none", dictionary=False, seed=1)
    ix = planner.index(d)
    largest = int(np.argmax(ix.frame["byte_length"].to_numpy()))
    kept = [read_chunk(ix, largest)]
    buffer = (
        plitzer.readpath.readers.thread_reader().buffer
    )  # grown to the largest chunk once: every later chunk reuses it
    kept += [read_chunk(ix, rg) for rg in range(ix.row_groups)]
    assert plitzer.readpath.readers.thread_reader().buffer is buffer
    for rg, arr in enumerate(kept[1:]):
        row = ix.frame.row(rg, named=True)
        want = pq.ParquetFile(ix.file(row["file_index"]).location).read_row_group(row["row_group"], columns=["tokens"])
        assert arr.equals(want.column(0).combine_chunks()), rg
    assert kept[0].equals(kept[1 + largest])


def test_reader_threads_each_reuse_their_own_buffer(tmp_path: Path) -> None:
    d = tmp_path / "data"
    _write(d, 4, compression="none", dictionary=False, seed=2)
    ix = planner.index(d)
    results: dict[int, list[tuple[int, pa.Array]]] = {}
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            results[k] = [(rg, read_chunk(ix, rg)) for _ in range(3) for rg in range(k, ix.row_groups, 4)]
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    want = pq.read_table(d, columns=["tokens"])  # files in name order, as the index lists them
    flat = want.column(0).combine_chunks()
    starts = np.concatenate([[0], np.cumsum(ix.frame["rows"].to_numpy())])
    for got in results.values():
        for rg, arr in got:
            assert arr.equals(flat.slice(int(starts[rg]), int(starts[rg + 1] - starts[rg]))), rg
    # Finished threads' readers do not pile up: the next new thread that reads drops them (a
    # thread given a finished one's id takes its reader over). Checked by id: readers of ids no
    # thread has (negative), with the finished threads' own, must be gone after one more reads.
    # (A count against the live threads was moved by other tests' threads ending meanwhile.)
    readers = plitzer.readpath.readers._READERS
    with readers.lock:
        alive = {t.ident for t in threading.enumerate()}
        for gone in [k for k in readers.by_thread if k not in alive]:
            del readers.by_thread[gone]
        for fake in range(-8, 0):
            readers.by_thread[fake] = plitzer.readpath.readers._Reader()
    one = threading.Thread(target=read_chunk, args=(ix, 0))
    one.start()
    one.join()
    assert not [k for k in readers.by_thread if k < 0]


def test_a_damaged_chunk_then_good_ones(tmp_path: Path) -> None:
    """A decode that fails drops its decoder; the next chunks of the same file decode."""
    d = tmp_path / "data"
    _write(d, 1, compression="zstd", dictionary=True, seed=3)
    ix = planner.index(d)
    st, md, g, start, length = _chunk(ix, 1, "tokens")
    storage = LocalStorage(d)
    with pytest.raises(DamagedChunkError, match=r"outside the token column chunk|cannot decode"):
        read_decoded(storage, st, md, row_group=g, column="tokens", offset=start + 8, length=length - 8, where="x")
    want = pq.ParquetFile(st.location).read_row_group(g, columns=["tokens"]).column(0).combine_chunks()
    got = read_decoded(storage, st, md, row_group=g, column="tokens", offset=start, length=length, where="x")
    assert got.equals(want)


def test_a_forked_child_reads_with_readers_of_its_own(tmp_path: Path) -> None:
    """The child starts with no readers (the parent's lock may have been held at the fork)."""
    d = tmp_path / "data"
    _write(d, 1, compression="zstd", dictionary=True, seed=4)
    f = next(d.glob("*.parquet"))
    storage = LocalStorage(f)
    st = storage.list_files()[0]
    md = pq.read_metadata(f)
    leaf = next(j for j in range(md.num_columns) if md.schema.column(j).path.startswith("tokens"))
    cc = md.row_group(0).column(leaf)
    start = min(x for x in (cc.data_page_offset, cc.dictionary_page_offset) if x)

    def read() -> pa.Array:
        return read_decoded(
            storage, st, md, row_group=0, column="tokens", offset=start, length=cc.total_compressed_size, where="x"
        )

    want = read()
    pid = os.fork()  # no Polars in the child: it reads with pyarrow alone
    if pid == 0:
        code = 3
        try:
            code = 0 if not plitzer.readpath.readers._READERS.by_thread and read().equals(want) else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
