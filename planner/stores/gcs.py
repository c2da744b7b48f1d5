"""Google Cloud Storage: ``gs://bucket/prefix`` through gcsfs (docs/storage.md).

:class:`GCSStorage` is the GCS backend of :class:`planner.stores.storage.Storage`. The
filesystem is gcsfs's (its credentials, its session, its endpoint), and the two
requests plitzer makes are sent through that session by this module so that each
is one request, checked and retried by :mod:`planner.stores.retry` like S3's:

* listing: the JSON API's ``objects.list`` (``list_page_size`` objects a request,
  1,000 by default), page by page, each page retried on its own;
* a ranged read: one ``alt=media`` GET of exactly the range, with
  ``ifGenerationMatch`` on the generation recorded at indexing, so that GCS refuses
  (412) an object replaced under a running job; the body's length, its
  ``Content-Range`` and, where the server sends it, ``x-goog-generation`` are checked.

gcsfs's own retry loop (six attempts, up to 32 s apart, uncounted and without a
deadline) is not used for these; the rest of gcsfs (DuckDB's reads, Polars'
options) is gcsfs as it is.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from planner.errors import ConfigError
from planner.stores.retry import Changed, Fatal, Retrying, Throttled, Transient, check_body, with_deadline
from planner.stores.stopping import on_loop
from planner.stores.storage import PARQUET, FileStat, check_range, list_prefix, select_parquet

__all__ = ["GCSStorage", "import_gcsfs"]


def import_gcsfs() -> Any:
    """gcsfs, imported with its bucket-type probe off unless the user set it.

    gcsfs 2026.10 asks each bucket whether it is zonal or hierarchical over gRPC
    before it lists or reads; against an endpoint that speaks only HTTP (an
    emulator, a proxy) that waits 60 s before it falls back. plitzer reads plain
    objects and needs neither, so the probe is off unless the user chose.
    """
    os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    import gcsfs

    return gcsfs


class GCSStorage(Retrying):
    """``gs://bucket/prefix`` (or ``gcs://``) through gcsfs.

    ``storage_options`` are the keyword arguments of ``gcsfs.GCSFileSystem``
    (``project``, ``token``, ``endpoint_url``, ``requester_pays``, ...) plus
    plitzer's ``retry_deadline`` (600 s), ``attempts`` (unbounded but by the deadline),
    ``backoff`` (0.1 s), ``read_timeout`` (30 s),
    ``connect_timeout`` (10 s), ``concurrency`` (16) and ``list_page_size``
    (1,000). Omitted credentials are gcsfs's: ``GOOGLE_APPLICATION_CREDENTIALS``,
    gcloud's, the metadata server; ``STORAGE_EMULATOR_HOST`` sets the endpoint.
    """

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        try:
            gcsfs = import_gcsfs()
        except ImportError as e:
            msg = f"source {url!r}: reading GCS needs gcsfs; install it with: pip install 'plitzer[gcs]'"
            raise ConfigError(msg) from e
        scheme, _, rest = url.partition("://")
        self.scheme = scheme
        self.url = url.rstrip("/")
        self.bucket, _, self.key = rest.rstrip("/").partition("/")
        if not self.bucket:
            msg = f"source {url!r} names no bucket; use gs://bucket/prefix"
            raise ConfigError(msg)
        opts = dict(storage_options or {})
        own = {k: opts.pop(k) for k in self.TUNING if k in opts}
        self.take_tuning(own)
        self._token = opts.get("token")
        try:
            self.fs = gcsfs.GCSFileSystem(skip_instance_cache=True, **opts)
        except TypeError as e:
            keys = ", ".join(self.TUNING)
            msg = f"storage_options for {url!r}: {e}; use keyword arguments of gcsfs.GCSFileSystem or {keys}"
            raise ConfigError(msg) from e
        self.endpoint: str = str(self.fs._location).rstrip("/")
        self._retrier = self.make_retrier(
            transient=_transient,
            hint="check storage_options (token, project) or GOOGLE_APPLICATION_CREDENTIALS",
        )

    def __repr__(self) -> str:
        return f"GCSStorage({self.url!r}, endpoint={self.endpoint!r})"

    # -- one request ------------------------------------------------------------------

    def _get(
        self,
        what: str,
        url: str,
        params: dict[str, str],
        headers: dict[str, str],
        deadline: float,
        file: FileStat | None,
        check: Any = None,
    ) -> tuple[Any, bytes]:
        """One GET through gcsfs's session and credentials, retried; (headers, body).

        ``check(headers, body)`` runs inside each attempt: it raises Transient for an
        answer worth another attempt, Fatal for one that is not.
        """
        import aiohttp

        timeout = aiohttp.ClientTimeout(sock_connect=self.connect_timeout, sock_read=self.read_timeout)

        async def once() -> tuple[Any, bytes]:
            await self.fs._set_session()
            hdrs = {**self.fs._get_headers(None), **headers}
            async with self.fs.session.get(url, params=params, headers=hdrs, timeout=timeout) as r:
                body = await r.read()
                _check_status(r.status, body, file)
                return r.headers, body

        def attempt() -> tuple[Any, bytes]:
            out: tuple[Any, bytes] = on_loop(self.fs.loop, with_deadline, once, deadline)
            if check is not None:
                check(*out)
            return out

        return self._retrier.run(what, attempt)

    # -- listing ---------------------------------------------------------------------

    def list_files(self, suffixes: tuple[str, ...] = PARQUET) -> list[FileStat]:
        prefix = list_prefix(self.key, suffixes)
        url = f"{self.endpoint}/storage/v1/b/{quote(self.bucket, safe='')}/o"
        found: list[tuple[str, int, str]] = []
        token = ""
        while True:
            params = {"prefix": prefix, "maxResults": str(self.list_page_size), "fields": _LIST_FIELDS}
            if token:
                params["pageToken"] = token
            _, body = self._get(
                f"{self.url}: listing", url, params, {}, self.connect_timeout + 2 * self.read_timeout, None
            )
            try:
                page = json.loads(body)
            except ValueError as e:
                msg = f"{self.url}: listing: the server's answer is not JSON ({e}); check endpoint_url"
                raise ConfigError(msg) from e
            found.extend((str(o["name"]), int(o["size"]), str(o.get("generation", ""))) for o in page.get("items", []))
            token = str(page.get("nextPageToken") or "")
            if not token:
                break
        return select_parquet(self.key, found, lambda k: f"{self.scheme}://{self.bucket}/{k}", suffixes)

    # -- ranged reads ------------------------------------------------------------------

    def read_range(self, file: FileStat, offset: int, length: int) -> bytes:
        check_range(file, offset, length)
        if length == 0:
            return b""
        bucket, _, key = file.location.partition("://")[2].partition("/")
        url = f"{self.endpoint}/download/storage/v1/b/{quote(bucket, safe='')}/o/{quote(key, safe='')}"
        params = {"alt": "media"}
        if file.version:
            params["ifGenerationMatch"] = file.version
        end = offset + length - 1
        what = f"{file.location}: reading bytes [{offset}, {offset + length})"

        def check(headers: Any, body: bytes) -> None:
            generation = headers.get("x-goog-generation")
            if file.version and generation and generation != file.version:
                msg = (
                    f"the object changed after it was indexed: its generation is {generation}, not "
                    f"{file.version}; a dataset must not change under a running job: restore it, "
                    "or start a new run (the index is rebuilt on the next start)"
                )
                raise Changed(msg, location=file.location)
            got = str(headers.get("Content-Range", ""))
            if got.rpartition("/")[2] not in ("", str(file.size)):
                msg = (
                    f"the object changed after it was indexed: it is {got.rpartition('/')[2]} bytes, "
                    f"not {file.size}; restore it, or start a new run (the index is rebuilt on the next start)"
                )
                raise Changed(msg, location=file.location)
            if not got.startswith(f"bytes {offset}-{end}/"):
                # Wrong range (or the whole object): never decoded, asked again.
                msg = (
                    f"response covers {got or 'the whole object'} ({len(body)} bytes) instead of the {length} requested"
                )
                raise Transient(msg)
            check_body(body, offset, length)

        _, body = self._get(
            what,
            url,
            params,
            {"Range": f"bytes={offset}-{end}"},
            self.connect_timeout + self.read_timeout + length / (1 << 20),
            file,
            check,
        )
        return body

    # -- other readers of the same objects -------------------------------------------

    def polars_options(self) -> dict[str, str]:
        """``storage_options`` for ``pl.scan_parquet`` (object_store's ``google_*`` keys)."""
        token = self._token
        custom = self.endpoint != "https://storage.googleapis.com"
        if token == "anon" and custom:  # noqa: S105  (a mode, not a secret)
            # object_store takes a custom endpoint only inside a service account key.
            key = {"gcs_base_url": self.endpoint, "disable_oauth": True, "client_email": "", "private_key": ""}
            return {"google_service_account_key": json.dumps(key)}
        if token == "anon":  # noqa: S105
            return {"google_skip_signature": "true"}
        if isinstance(token, str) and os.path.isfile(token):
            return {"google_service_account": token}
        if isinstance(token, Mapping):
            return {"google_service_account_key": json.dumps(dict(token))}
        return {}  # object_store finds GOOGLE_APPLICATION_CREDENTIALS itself

    def duckdb_filesystem(self) -> Any:
        """The fsspec filesystem to ``register_filesystem`` on a DuckDB connection."""
        return self.fs


_LIST_FIELDS = "items(name,size,generation),nextPageToken"


def _check_status(status: int, body: bytes, file: FileStat | None) -> None:
    """Raise Fatal, Throttled or Transient for a failed answer; return for 200/206."""
    if status in (200, 206):
        return
    text = body[:300].decode("utf-8", "replace").strip()
    if status in (429, 503):
        msg = f"throttled ({status}: {text})"
        raise Throttled(msg)
    if status >= 500 or status == 408:
        msg = f"server error ({status}: {text})"
        raise Transient(msg)
    where = "" if file is None else f" (indexed size {file.size}, generation {file.version})"
    if status == 412:
        msg = (
            f"the object changed after it was indexed: its generation is no longer {file.version if file else '?'}; "
            "a dataset must not change under a running job: restore it, or start a new run "
            "(the index is rebuilt on the next start)"
        )
    elif status == 404 and file is None:
        msg = "no such bucket; check the URL, endpoint_url and project"
    elif status == 404:
        msg = f"the object disappeared after indexing{where}; restore it or start a new run"
    elif status in (401, 403):
        msg = f"access denied ({status}); check token (or GOOGLE_APPLICATION_CREDENTIALS) and the bucket's IAM"
    elif status == 416:
        msg = f"the object is shorter than indexed{where}; it changed after indexing: start a new run"
    else:
        msg = f"the server refused the request ({status}: {text})"
    if file is not None and status in (404, 412, 416):
        raise Changed(msg, location=file.location)
    raise Fatal(msg)


def _transient(e: BaseException) -> bool:
    import aiohttp

    return isinstance(e, (Transient, OSError, TimeoutError, aiohttp.ClientError))
