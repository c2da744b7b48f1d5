"""Where the bytes live: one small interface over local disk and object stores.

The planner needs three things from storage: list the ``*.parquet`` files below a
source, read a file's tail (the footer), and read a byte range (a token column
chunk). Each backend implements :class:`Storage` (local disk here, S3 in
:mod:`planner.stores.s3`, Google Cloud Storage in :mod:`planner.stores.gcs`, Azure Blob Storage
in :mod:`planner.stores.azure`, the Hugging Face Hub in :mod:`planner.stores.hf`, any HTTP server
in :mod:`planner.stores.http`); everything above it is the same code for every store,
and the same tests run against all of them (tests/stores/test_storage.py).

A file is identified by a :class:`FileStat`: ``name`` is its path relative to the
source (what the index, the fingerprint and checkpoints record, so that a dataset
copied from disk to S3 stays the same dataset), ``location`` is where this
storage finds it, and ``version`` (mtime in ns, the S3 or Azure ETag, the GCS
generation, the Hub's LFS sha256, an HTTP ETag or Last-Modified) with ``size``
detect a file that changed after it was indexed.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from planner.errors import ConfigError, FileChangedError, StorageError

__all__ = [
    "PARQUET",
    "FileStat",
    "LocalStorage",
    "ReadsInto",
    "Storage",
    "check_range",
    "duckdb_filesystems",
    "list_prefix",
    "revisions",
    "select_parquet",
]

SCHEMES = ("s3://", "gs://", "gcs://", "az://", "abfs://", "abfss://", "hf://", "https://", "http://")
PARQUET = (".parquet",)
"""What a listing keeps by default: Parquet files (a kind of token files asks for its own suffixes)."""
SOURCE_FORMS = (
    "a folder, a .parquet file, s3://, gs:// or az:// bucket/prefix, hf://datasets/ORG/NAME[@REVISION]/PATH, "
    "or an https:// URL of a .parquet file or of a manifest listing them"
)


@dataclass(frozen=True, slots=True)
class FileStat:
    """One Parquet file of a source."""

    name: str
    location: str
    size: int
    version: str


class Storage(Protocol):
    """The storage boundary: listing, ranged reads that are checked, and how others reach it.

    Every file of an index keeps the storage it was listed by (``Index.storage(f)``),
    so a list source that mixes backends, or S3 endpoints and credentials, reads
    each file through its own.
    """

    url: str
    concurrency: int
    """Reader threads this storage wants at least (object stores: threads mostly wait on GETs)."""

    @property
    def retries(self) -> int:
        """Attempts beyond the first, over every request so far (thread-safe; local disk: 0)."""
        ...

    def list_files(self, suffixes: tuple[str, ...] = PARQUET) -> list[FileStat]:
        """Every file below the source whose name ends in one of ``suffixes`` (``*.parquet``; a kind of token
        files gives its own: ``.bin``/``.idx``, ``.npy``), in bytewise order of ``name``."""
        ...

    def read_range(self, file: FileStat, offset: int, length: int) -> bytes:
        """Exactly ``length`` bytes at ``offset``, or a StorageError."""
        ...

    def polars_options(self) -> dict[str, str]:
        """``storage_options`` for ``pl.scan_parquet`` that reach the same files (empty: none needed)."""
        ...

    def duckdb_filesystem(self) -> Any:
        """The fsspec filesystem a DuckDB connection needs to read these files, or None."""
        ...

    def checkpoint_revision(self) -> tuple[str, str] | None:
        """(the source without its revision, the commit read) where the source names a revision that can
        move (the Hub's ``@main``), else None: what a checkpoint records, and a resume compares."""
        ...


def revisions(files: Iterable[tuple[Storage, FileStat]]) -> list[list[str]]:
    """What a checkpoint records of each source read at a revision: ``[source without revision, commit, files digest]``.

    Asked of each storage (:meth:`Storage.checkpoint_revision`), once per storage object. The digest
    is sha256 over the (name, content hash) of the source's files, in index order: two
    commits with the same digest hold the same bytes for this run. Sources that name no
    revision give nothing (their fingerprint is all a resume checks).
    """
    found: dict[int, tuple[tuple[str, str], Any]] = {}
    for st, f in files:
        key = id(st)
        if key not in found:
            rev = st.checkpoint_revision()
            if rev is None:
                continue
            found[key] = (rev, hashlib.sha256())
        found[key][1].update(f"{f.name}\0{f.version}\0".encode())
    return [[source, commit, h.hexdigest()] for (source, commit), h in found.values()]


class ReadsInto(Protocol):
    """A storage that can also read a range into memory the caller owns (local disk).

    Optional: the hot path (:func:`plitzer.readpath.read.read_decoded`) reads through
    ``read_into`` into a reused per-thread buffer where a storage has it, and through
    ``read_range`` otherwise (object stores, where the network costs more than a
    fresh buffer).
    """

    def read_into(self, file: FileStat, offset: int, out: memoryview) -> None:
        """Exactly ``len(out)`` bytes at ``offset`` into ``out``, or a StorageError."""
        ...


def check_range(file: FileStat, offset: int, length: int) -> None:
    if offset < 0 or length < 0 or offset + length > file.size:
        msg = (
            f"{file.location}: byte range [{offset}, {offset + length}) lies outside the "
            f"file's {file.size} bytes; the footer is damaged or the file changed: "
            "rebuild the index (delete it from PLITZER_CACHE) or restore the file"
        )
        raise StorageError(msg)


def list_prefix(key: str, suffixes: tuple[str, ...] = PARQUET) -> str:
    """The listing prefix of an object-store key: the key itself for a file of ``suffixes``, else its folder."""
    return key if key.endswith(suffixes) or not key else key + "/"


def select_parquet(
    key: str,
    objects: Iterable[tuple[str, int, str]],
    location: Callable[[str], str],
    suffixes: tuple[str, ...] = PARQUET,
) -> list[FileStat]:
    """The ``*.parquet`` files (or those ending in one of ``suffixes``) of a source from its listing (object key,
    size, version).

    ``key`` ends in ``.parquet`` (one of ``suffixes``): that one object, named by its base name like a
    local file, or else a "folder" of that name. ``location(k)`` is the URL of key k.
    """
    objs = list(objects)
    prefix = list_prefix(key, suffixes)
    if key.endswith(suffixes):
        exact = [o for o in objs if o[0] == key]
        if exact:
            objs, prefix = exact, key.rsplit("/", 1)[0] + "/" if "/" in key else ""
        else:
            prefix = key + "/"
    out = [
        FileStat(name=k[len(prefix) :], location=location(k), size=size, version=version)
        for k, size, version in objs
        if k.endswith(suffixes) and k.startswith(prefix)
    ]
    out.sort(key=lambda f: f.name.encode())
    return out


def _unchanged(file: FileStat, st: os.stat_result) -> bool:
    return st.st_size == file.size and str(st.st_mtime_ns) == file.version


class LocalStorage:
    """A local folder (searched recursively) or a single file."""

    retries = 0  # reads of local disk are not retried

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path).expanduser().resolve()
        self.url = str(self.path)
        self.concurrency = os.cpu_count() or 2
        if not self.path.exists():
            msg = f"source {str(path)!r} does not exist; pass {SOURCE_FORMS}"
            raise ConfigError(msg)

    def _stat(self, p: Path, name: str) -> FileStat:
        st = p.stat()
        return FileStat(name=name, location=str(p), size=st.st_size, version=str(st.st_mtime_ns))

    def list_files(self, suffixes: tuple[str, ...] = PARQUET) -> list[FileStat]:
        if self.path.is_file():
            return [self._stat(self.path, self.path.name)]
        found = [
            (p.relative_to(self.path).as_posix(), p) for s in suffixes for p in self.path.rglob(f"*{s}") if p.is_file()
        ]
        found.sort(key=lambda t: t[0].encode())
        return [self._stat(p, name) for name, p in found]

    def read_range(self, file: FileStat, offset: int, length: int) -> bytes:
        return self._read(file, offset, length, None)

    def read_into(self, file: FileStat, offset: int, out: memoryview) -> None:
        """Exactly ``len(out)`` bytes at ``offset`` into ``out``, or a StorageError.

        The hot path's read (:func:`plitzer.readpath.read.read_decoded`): into memory the
        caller reuses, so a chunk costs no allocation and no first-touch page faults.
        """
        self._read(file, offset, len(out), out)

    def _read(self, file: FileStat, offset: int, length: int, out: memoryview | None) -> bytes:
        """Open, ``fstat``, read, ``fstat`` again, close: a file rewritten in place or
        replaced while it is read shows another size or mtime and is refused.

        Returns the bytes read, or ``b""`` when they went into ``out``.
        """
        check_range(file, offset, length)
        try:
            fd = os.open(file.location, os.O_RDONLY)
        except OSError as e:
            msg = f"{file.location}: cannot open ({e.strerror}); check the path and permissions"
            raise StorageError(msg) from e
        data, got = b"", 0
        try:
            st = os.fstat(fd)
            if _unchanged(file, st):
                if out is None:
                    data = os.pread(fd, length, offset)
                    got = len(data)
                else:
                    got = os.preadv(fd, [out], offset)
                st = os.fstat(fd)  # a file rewritten in place while we read shows a new size or mtime
        finally:
            os.close(fd)
        if not _unchanged(file, st) or got != length:
            if _unchanged(file, st):
                what = f"short read at byte {offset}: got {got} of {length} bytes"
            else:
                what = f"size {file.size} -> {st.st_size}, mtime {file.version} -> {st.st_mtime_ns}"
            msg = (
                f"{file.location}: the file changed after it was indexed ({what}); "
                "a dataset must not change under a running job: restore it, or start "
                "a new run (the index is rebuilt on the next start)"
            )
            raise FileChangedError(msg, file=file.location)
        return data

    def polars_options(self) -> dict[str, str]:
        return {}  # Polars reads local paths itself

    def duckdb_filesystem(self) -> Any:
        return None  # DuckDB reads local paths itself

    def checkpoint_revision(self) -> tuple[str, str] | None:
        return None  # a folder has no revisions


def duckdb_filesystems(storages: Sequence[Storage]) -> list[Any]:
    """One fsspec filesystem per protocol for DuckDB, each path reaching its own source's storage.

    DuckDB keys a registered filesystem by its protocol and takes one per protocol,
    so two S3 sources with different endpoints or credentials would both be read
    through the first one's. Each protocol gets a router instead: a path goes to
    the storage whose source URL is its longest prefix (else the first storage of
    that protocol), so ``read_parquet('s3://a/...')`` and ``read_parquet('s3://b/...')``
    in one query each use their own source's credentials.
    """
    routes: dict[str, list[tuple[str, Any]]] = {}
    for st in storages:
        fs = st.duckdb_filesystem()
        if fs is None:
            continue
        protocols = (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)
        root = st.url.partition("://")[2].rstrip("/")
        entry = routes.setdefault(protocols[0], [])
        if all(other is not fs for _, other in entry):
            entry.append((root, fs))
    return [r[0][1] if len(r) == 1 else _router(r) for r in routes.values()]


def _router(routes: list[tuple[str, Any]]) -> Any:
    """An fsspec filesystem that sends each call to the filesystem whose root prefixes its path.

    By hand: fsspec has no filesystem that dispatches by path prefix within one protocol.
    """
    from fsspec import AbstractFileSystem

    first = routes[0][1]

    class Router(AbstractFileSystem):  # type: ignore[misc]
        protocol = first.protocol
        cachable = False  # one per plan: never an instance of another plan's sources

        def pick(self, path: Any) -> Any:
            text = str(path[0] if isinstance(path, (list, tuple)) and path else path)
            text = text.partition("://")[2] if "://" in text else text.lstrip("/")
            best, fs = -1, first
            for root, candidate in routes:
                if (text == root or text.startswith(root + "/")) and len(root) > best:
                    best, fs = len(root), candidate
            return fs

    def delegate(name: str) -> Any:
        def call(self: Any, path: Any, *args: Any, **kwargs: Any) -> Any:
            return getattr(self.pick(path), name)(path, *args, **kwargs)

        call.__name__ = name
        return call

    for name in (
        "open",
        "glob",
        "info",
        "ls",
        "exists",
        "isdir",
        "isfile",
        "modified",
        "size",
        "find",
        "cat_file",
        "mkdir",
        "makedirs",
        "rm",
        "rm_file",
    ):
        setattr(Router, name, delegate(name))

    def mv(self: Any, path1: Any, path2: Any, **kwargs: Any) -> Any:
        return self.pick(path1).mv(path1, path2, **kwargs)

    Router.mv = mv
    return Router()
