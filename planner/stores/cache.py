"""The local cache: where it lives, how an entry is named, written and read back.

Five things are cached, all outside the dataset: each file's footer bytes and the
finished index (``planner.catalog.indexcache``), the selection pass (``plitzer.selection.evaluate``),
a text dataset's token counts (``plitzer.text.source``) and each dataset's document lengths
and hashes (``plitzer.explain``). An entry's name is the :func:`digest` of everything
it depends on (a file's location, size and mtime or ETag, a format version), so a
changed input finds no entry and a stale one is never read.

Every entry is written by :func:`write_entry`: the payload behind a small header
(magic, payload length, sha256 of the payload), to a temporary name that then
replaces the entry (:func:`write_atomic`), so a reader sees the old entry or the new
one, never half of one, even with several processes writing at once. :func:`read_entry`
checks the header against the bytes read back: an entry that is truncated, garbled or
empty (a full disk, a torn write on a shared file system) is discarded with one
:class:`~planner.errors.CacheWarning` naming the file, and the caller rebuilds it
from the dataset and writes it again; it is never an error about the dataset.

A cache folder that cannot be created or written (missing, read-only, not a
directory, disk full, quota exceeded) means running uncached: one CacheWarning
naming ``PLITZER_CACHE``, and nothing else changes (entries already there are still
read where they can be). Checkpoints use :func:`write_atomic` too, durably, and
their errors are the caller's.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import struct
import threading
import warnings
from pathlib import Path

from planner.errors import CacheWarning

__all__ = ["cache_dir", "digest", "discard", "read_entry", "write_atomic", "write_entry"]

_MAGIC = b"PLZCACHE"
_HEADER = struct.Struct("<8sQ32s")  # magic, payload length, sha256 of the payload
_lock = threading.Lock()
_unwritable: set[str] = set()  # cache folders found unwritable in this process
_warned: set[str] = set()  # damaged entries warned about in this process


def cache_dir() -> Path:
    """The local cache folder: ``PLITZER_CACHE``, else ``$XDG_CACHE_HOME/plitzer``.

    ``$XDG_CACHE_HOME`` defaults to ``~/.cache``.
    """
    env = os.environ.get("PLITZER_CACHE")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "plitzer"


def digest(*parts: object) -> str:
    """A cache key: sha256 (hex) of the parts' ``str``, each followed by a NUL byte.

    >>> digest("a", 1) == digest("a", 1) != digest("a1")
    True
    """
    h = hashlib.sha256()
    for p in parts:
        h.update(str(p).encode())
        h.update(b"\0")
    return h.hexdigest()


def _open(path: Path) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)


def _write(fd: int, data: memoryview) -> int:
    return os.write(fd, data)


def write_atomic(path: str | os.PathLike[str], data: bytes | memoryview, *, durable: bool = False) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the new one.

    The bytes go to a temporary file beside ``path`` (named by process and thread,
    so concurrent writers do not collide) that then replaces it. ``durable=True``
    also syncs the file and its folder to disk before returning, so the new file
    survives a power loss (checkpoints); cache entries do not need it. The folder
    is created when missing. A write that fails leaves no temporary file behind.
    """
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    fd = _open(tmp)
    try:
        try:
            view = memoryview(data)
            while view:
                n = _write(fd, view)
                view = view[n:]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, p)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    if not durable:
        return
    try:
        dfd = os.open(p.parent, os.O_RDONLY)
    except OSError:
        return  # a folder that cannot be opened (some platforms) cannot be synced
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _root() -> str:
    return str(cache_dir())


def write_entry(path: Path, payload: bytes | memoryview) -> bool:
    """Keep ``payload`` at ``path`` (under :func:`cache_dir`) with its length and checksum; False if uncached.

    A folder that cannot be created or written is warned about once (naming
    ``PLITZER_CACHE``) and not tried again in this process.
    """
    root = _root()
    with _lock:
        if root in _unwritable:
            return False
    body = bytes(payload)
    head = _HEADER.pack(_MAGIC, len(body), hashlib.sha256(body).digest())
    try:
        write_atomic(path, head + body)
    except OSError as e:
        with _lock:
            first = root not in _unwritable
            _unwritable.add(root)
        if first:
            code = errno.errorcode.get(e.errno or 0, "")
            msg = (
                f"the plitzer cache folder {root} (PLITZER_CACHE) cannot be written "
                f"({code + ': ' if code else ''}{e.strerror or e}); running uncached: footers, indexes and "
                "selections are rebuilt from the dataset each time (slower, the same batches). "
                "Set PLITZER_CACHE to a writable folder with free space"
            )
            warnings.warn(msg, CacheWarning, stacklevel=2)
        return False
    return True


def discard(path: Path, why: str) -> None:
    """Drop a damaged cache entry (it is rebuilt from the dataset), with one CacheWarning naming it."""
    with contextlib.suppress(OSError):
        path.unlink()
    key = str(path)
    with _lock:
        first = key not in _warned
        _warned.add(key)
    if first:
        msg = (
            f"damaged cache entry {path} ({why}; a full disk or a torn write on a shared file system leaves "
            "such entries): discarded, and rebuilt from the dataset, which is not at fault"
        )
        warnings.warn(msg, CacheWarning, stacklevel=3)


def read_entry(path: Path) -> bytes | None:
    """The payload kept at ``path``, checked against its length and checksum; None if absent or damaged.

    A damaged entry is discarded (:func:`discard`): the caller rebuilds it.
    """
    try:
        raw = path.read_bytes()
    except OSError:
        return None  # absent, or a cache folder that cannot be read: a miss
    if len(raw) < _HEADER.size:
        discard(path, "empty" if not raw else f"truncated: {len(raw)} bytes, shorter than its header")
        return None
    magic, length, checksum = _HEADER.unpack_from(raw)
    body = raw[_HEADER.size :]
    if magic != _MAGIC:
        discard(path, "garbled: no plitzer cache header")
    elif len(body) != length:
        discard(path, f"truncated: {len(body)} of {length} bytes")
    elif hashlib.sha256(body).digest() != checksum:
        discard(path, "garbled: its checksum does not match")
    else:
        return body
    return None
