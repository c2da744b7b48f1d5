"""Where the bytes live: one small interface over local disk and S3.

The planner needs three things from storage: list the ``*.parquet`` files below a
source, read a file's tail (the footer), and read a byte range (a token column
chunk). Each backend implements :class:`Storage`; everything above it is the same
code for disk and S3, and the same tests run against both.

A file is identified by a :class:`FileStat`: ``name`` is its path relative to the
source (what the index, the fingerprint and checkpoints record, so that a dataset
copied from disk to S3 stays the same dataset), ``location`` is where this
storage finds it, and ``version`` (mtime in ns, or the S3 ETag) with ``size``
detect a file that changed after it was indexed.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from planner.errors import ConfigError, StorageError

__all__ = [
    "FileStat",
    "LocalStorage",
    "S3Storage",
    "Storage",
    "open_storages",
]


@dataclass(frozen=True, slots=True)
class FileStat:
    """One Parquet file of a source."""

    name: str
    location: str
    size: int
    version: str


class Storage(Protocol):
    """The storage boundary: listing, and ranged reads that are checked."""

    url: str

    def list_files(self) -> list[FileStat]:
        """Every ``*.parquet`` file below the source, in bytewise order of ``name``."""
        ...

    def read_range(self, file: FileStat, offset: int, length: int) -> bytes:
        """Exactly ``length`` bytes at ``offset``, or a StorageError."""
        ...


def _check_range(file: FileStat, offset: int, length: int) -> None:
    if offset < 0 or length < 0 or offset + length > file.size:
        msg = (
            f"{file.location}: byte range [{offset}, {offset + length}) lies outside the "
            f"file's {file.size} bytes; the footer is damaged or the file changed: "
            "rebuild the index (delete it from PLITZER_CACHE) or restore the file"
        )
        raise StorageError(msg)


class LocalStorage:
    """A local folder (searched recursively) or a single file."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path).expanduser().resolve()
        self.url = str(self.path)
        if not self.path.exists():
            msg = f"source {str(path)!r} does not exist; pass a folder, a .parquet file or s3://bucket/prefix"
            raise ConfigError(msg)

    def _stat(self, p: Path, name: str) -> FileStat:
        st = p.stat()
        return FileStat(name=name, location=str(p), size=st.st_size, version=str(st.st_mtime_ns))

    def list_files(self) -> list[FileStat]:
        if self.path.is_file():
            return [self._stat(self.path, self.path.name)]
        found = [
            (p.relative_to(self.path).as_posix(), p)
            for p in self.path.rglob("*.parquet")
            if p.is_file()
        ]
        found.sort(key=lambda t: t[0].encode())
        return [self._stat(p, name) for name, p in found]

    def read_range(self, file: FileStat, offset: int, length: int) -> bytes:
        _check_range(file, offset, length)
        try:
            fd = os.open(file.location, os.O_RDONLY)
        except OSError as e:
            msg = f"{file.location}: cannot open ({e.strerror}); check the path and permissions"
            raise StorageError(msg) from e
        try:
            st = os.fstat(fd)
            if st.st_size != file.size or str(st.st_mtime_ns) != file.version:
                msg = (
                    f"{file.location}: the file changed after it was indexed (size "
                    f"{file.size} -> {st.st_size}, mtime {file.version} -> {st.st_mtime_ns}); "
                    "a dataset must not change under a running job: restore it, or start "
                    "a new run (the index is rebuilt on the next start)"
                )
                raise StorageError(msg)
            data = os.pread(fd, length, offset)
        finally:
            os.close(fd)
        if len(data) != length:
            msg = (
                f"{file.location}: short read at byte {offset}: got {len(data)} of "
                f"{length} bytes; the file was truncated after indexing"
            )
            raise StorageError(msg)
        return data


_RETRY_ATTEMPTS = 6


class S3Storage:
    """``s3://bucket/prefix`` through s3fs, with checked, retried ranged GETs.

    ``storage_options`` takes ``endpoint``, ``region``, ``key``, ``secret``,
    ``token`` and ``anon``; anything omitted comes from the usual ``AWS_*``
    variables. Every data read is one GET of exactly the requested range with
    ``If-Match`` on the ETag recorded at indexing, so an object replaced under a
    running job is refused instead of decoded.
    """

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        import s3fs

        self.url = url.rstrip("/")
        self.prefix = self.url[len("s3://") :]
        opts = dict(storage_options or {})
        client_kwargs: dict[str, Any] = dict(opts.pop("client_kwargs", {}))
        config_kwargs: dict[str, Any] = dict(opts.pop("config_kwargs", {}))
        endpoint = opts.pop("endpoint", None) or opts.pop("endpoint_url", None)
        if endpoint is None:
            endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        if endpoint:
            client_kwargs["endpoint_url"] = endpoint
        region = opts.pop("region", None) or opts.pop("region_name", None)
        if region:
            client_kwargs["region_name"] = region
        read_timeout = opts.pop("read_timeout", 30)
        connect_timeout = opts.pop("connect_timeout", 10)
        config_kwargs.setdefault("read_timeout", read_timeout)
        config_kwargs.setdefault("connect_timeout", connect_timeout)
        # Our own retry loop below owns retries, so that every failure is counted,
        # bounded and reported with the object and range; botocore's would hide them.
        config_kwargs.setdefault("retries", {"max_attempts": 1, "mode": "standard"})
        self.attempts = int(opts.pop("attempts", _RETRY_ATTEMPTS))
        self.backoff = float(opts.pop("backoff", 0.05))
        self.endpoint = endpoint
        self.fs = s3fs.S3FileSystem(
            client_kwargs=client_kwargs,
            config_kwargs=config_kwargs,
            retries=1,
            skip_instance_cache=True,
            **opts,
        )

    def list_files(self) -> list[FileStat]:
        try:
            infos = self.fs.find(self.prefix, detail=True)
        except FileNotFoundError as e:
            msg = f"{self.url}: no such bucket or prefix; check the URL and credentials"
            raise ConfigError(msg) from e
        except Exception as e:  # botocore raises many unrelated types
            msg = f"{self.url}: listing failed ({type(e).__name__}: {e}); check the endpoint and credentials"
            raise StorageError(msg) from e
        out = []
        for path, info in infos.items():
            if not path.endswith(".parquet") or info.get("type") == "directory":
                continue
            name = path[len(self.prefix) :].lstrip("/") or path.rsplit("/", 1)[-1]
            etag = str(info.get("ETag") or info.get("etag") or "").strip('"')
            out.append(FileStat(name=name, location=f"s3://{path}", size=int(info["size"]), version=etag))
        out.sort(key=lambda f: f.name.encode())
        return out

    def read_range(self, file: FileStat, offset: int, length: int) -> bytes:
        _check_range(file, offset, length)
        if length == 0:
            return b""
        bucket, _, key = file.location[len("s3://") :].partition("/")
        params: dict[str, Any] = {
            "Bucket": bucket,
            "Key": key,
            "Range": f"bytes={offset}-{offset + length - 1}",
        }
        if file.version:
            params["IfMatch"] = f'"{file.version}"'
        last: BaseException | None = None
        for attempt in range(self.attempts):
            try:
                data = self.fs.call_s3("get_object", **params)
                body = data["Body"]
                # s3fs hands back an aiobotocore stream; read it within the same loop.
                from fsspec.asyn import sync

                raw: bytes = sync(self.fs.loop, body.read)
                if len(raw) != length:
                    last = StorageError(f"short body: {len(raw)} of {length} bytes")
                else:
                    return raw
            except Exception as e:
                if _precondition_failed(e):
                    msg = (
                        f"{file.location}: the object changed after it was indexed (ETag is no "
                        f"longer {file.version}); a dataset must not change under a running job"
                    )
                    raise StorageError(msg) from e
                if isinstance(e, FileNotFoundError):
                    msg = f"{file.location}: object disappeared after indexing"
                    raise StorageError(msg) from e
                last = e
            time.sleep(self.backoff * (2**attempt) * (0.5 + random.random()))
        msg = (
            f"{file.location}: reading bytes [{offset}, {offset + length}) failed after "
            f"{self.attempts} attempts; last cause: {type(last).__name__}: {last}"
        )
        raise StorageError(msg) from last


def _precondition_failed(e: BaseException) -> bool:
    text = f"{type(e).__name__} {e}"
    return "PreconditionFailed" in text or "412" in text


def open_storages(
    source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    storage_options: Mapping[str, Any] | None = None,
) -> list[Storage]:
    """One storage per source; a list source gives several, in order."""
    if isinstance(source, (str, os.PathLike)):
        sources: list[str | os.PathLike[str]] = [source]
    else:
        sources = list(source)
        if not sources:
            msg = "source is an empty list; pass a folder, a .parquet file or s3://bucket/prefix"
            raise ConfigError(msg)
    out: list[Storage] = []
    for s in sources:
        text = os.fspath(s)
        if text.startswith("s3://"):
            out.append(S3Storage(text, storage_options))
        elif "://" in text:
            msg = f"source {text!r}: only local paths and s3:// URLs are supported"
            raise ConfigError(msg)
        else:
            out.append(LocalStorage(text))
    return out
