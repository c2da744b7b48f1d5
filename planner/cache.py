"""The local cache: where it lives, how an entry is named, how it is written.

Three things are cached, all outside the dataset: each file's footer bytes and the
finished index (``planner.dataset``), and each dataset's document lengths and
hashes (``plitzer.explain``). An entry's name is the :func:`digest` of everything
it depends on (a file's location, size and mtime or ETag, a format version), so a
changed input finds no entry and a stale one is never read. Entries and
checkpoints are written by :func:`write_atomic`: a reader sees the old file or the
new one, never half of one, even with several processes writing at once.

A cache entry that cannot be read is rebuilt, never trusted; a cache folder that
cannot be written costs time, not correctness.
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

__all__ = ["cache_dir", "digest", "write_atomic"]


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


def write_atomic(path: str | os.PathLike[str], data: bytes | memoryview, *, durable: bool = False) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the new one.

    The bytes go to a temporary file beside ``path`` (named by process and thread,
    so concurrent writers do not collide) that then replaces it. ``durable=True``
    also syncs the file and its folder to disk before returning, so the new file
    survives a power loss (checkpoints); cache entries do not need it. The folder
    is created when missing.
    """
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, p)
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
