"""Each reader thread's reused memory: its read buffer, and one decoder per footer it reads with.

A chunk is read into the thread's buffer (grown to the largest chunk, then reused: no
allocation and no first-touch page faults per chunk) and decoded by a ``ParquetFile``
kept per footer, over a :class:`RangeFile` that serves only that chunk's bytes, so a
decode can never issue a second, hidden read (docs/design.md, "Reused read memory").
"""

from __future__ import annotations

import io
import os
import threading
from typing import Any

import pyarrow.parquet as pq

from planner.bounded import Bounded
from planner.errors import DamagedChunkError

__all__ = ["RangeFile", "thread_reader"]


class RangeFile(io.RawIOBase):
    """A read-only file that holds one byte range of a larger file.

    pyarrow decodes a column chunk from a file object plus the cached footer; this
    object serves exactly the chunk we fetched (one ranged read) and refuses any
    other offset, so a decode can never trigger a second, hidden read.
    """

    def __init__(
        self, data: Any, offset: int, size: int, where: str, *, file: str | None = None, row_group: int | None = None
    ) -> None:
        super().__init__()
        self._size = size
        self.load(data, offset, where, file=file, row_group=row_group)

    def load(
        self, data: Any, offset: int, where: str, *, file: str | None = None, row_group: int | None = None
    ) -> None:
        """Serve ``data`` (any buffer: bytes, or a view of a reused buffer) as the file's bytes at ``offset``."""
        self._file, self._row_group = file, row_group
        self._data = data
        self._view = memoryview(data)
        self._offset = offset
        self._pos = 0
        self._where = where

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, pos: int, whence: int = 0) -> int:
        self._pos = pos if whence == 0 else (self._pos + pos if whence == 1 else self._size + pos)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def size(self) -> int:
        return self._size

    def read(self, n: int | None = -1) -> bytes:
        n = self._size - self._pos if n is None or n < 0 else n
        a = self._pos - self._offset
        if a < 0 or a + n > len(self._data):
            msg = f"{self._where}: decoding needed bytes outside the token column chunk; the footer is damaged"
            raise DamagedChunkError(msg, file=self._file, row_group=self._row_group)
        self._pos += n
        return self._view[a : a + n]  # type: ignore[return-value]  # zero-copy: pyarrow takes any buffer

    def readinto(self, b: Any) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)


_KEEP = 64 << 20
"""The largest read buffer a thread keeps between chunks (a larger chunk reads into a buffer of its own)."""

_DECODERS = 16
"""Decoders (one ``ParquetFile`` per footer) a thread keeps: the files a window reads from, about.

Each holds its footer, so at most this many footers per reader thread outlive a dropped index, until
the thread reads other files or ends (a finished thread's reader is dropped by the next one)."""


class _Reader:
    """One thread's reused memory: its read buffer and a decoder per footer it reads with.

    The buffer grows to the largest chunk read (up to :data:`_KEEP`) and is then
    reused, so a chunk costs neither an allocation nor first-touch page faults. A
    decoder is a ``ParquetFile`` over a :class:`RangeFile` that is loaded with each
    chunk's bytes, built once per footer instead of once per chunk.
    """

    def __init__(self) -> None:
        self.buffer = bytearray(0)
        self.decoders = Bounded[int, tuple[pq.FileMetaData, RangeFile, pq.ParquetFile]](_DECODERS)

    def view(self, n: int) -> memoryview:
        if n > _KEEP:
            return memoryview(bytearray(n))
        if len(self.buffer) < n:
            self.buffer = bytearray(min(max(n, 2 * len(self.buffer)), _KEEP))
        return memoryview(self.buffer)[:n]

    def decoder(self, metadata: pq.FileMetaData, file_size: int) -> tuple[RangeFile, pq.ParquetFile]:
        key = id(metadata)
        got = self.decoders.get(key)
        if got is not None and got[0] is metadata and got[1].size() == file_size:
            return got[1], got[2]
        f = RangeFile(b"", 0, file_size, "")
        # Page CRCs are verified whenever the writer stored them (docs/reliability.md).
        # pre_buffer=False: the chunk is read here, in the calling thread. With
        # pre_buffer, Arrow's I/O pool calls f.read and may drop the last reference to
        # f, so one of its threads can enter Python as the interpreter ends, and the
        # process aborts (docs/reliability.md, "How a run ends"; plitzer/readpath/shutdown.py).
        pf = pq.ParquetFile(f, metadata=metadata, pre_buffer=False, page_checksum_verification=True)
        self.decoders.put(key, (metadata, f, pf))  # the footer held: its id is not reused while cached
        return f, pf


class _Readers:
    """Every thread's :class:`_Reader`, by thread id, and the lock that adds one."""

    def __init__(self) -> None:
        self.by_thread: dict[int, _Reader] = {}
        self.lock = threading.Lock()

    def forget(self) -> None:
        """In a forked child: a fresh lock (another thread may have held it at the fork) and no readers."""
        self.lock = threading.Lock()
        self.by_thread.clear()


_READERS = _Readers()
os.register_at_fork(after_in_child=_READERS.forget)


def thread_reader() -> _Reader:
    """The calling thread's :class:`_Reader`.

    Kept in a module dict by thread id, not a ``threading.local``: a thread-local's
    objects are released as their thread ends, where ``threading`` no longer knows
    the thread; here a finished thread's reader is dropped by the next thread that
    starts reading, a live one (plitzer/readpath/shutdown.py).
    """
    me = threading.get_ident()
    readers = _READERS.by_thread
    r = readers.get(me)
    if r is None:
        with _READERS.lock:
            alive = {t.ident for t in threading.enumerate()}
            for gone in [k for k in readers if k not in alive]:
                del readers[gone]
            r = readers[me] = _Reader()
    return r
