"""Azure Blob Storage: ``az://container/prefix`` (or ``abfs://``) through adlfs (docs/storage.md).

:class:`AzureStorage` is the Azure backend of :class:`planner.stores.storage.Storage`. The
filesystem is adlfs's (its credentials and its asynchronous ``BlobServiceClient``),
and the two requests plitzer makes go through that client with the SDK's own
retries off (``retry_total=0``), checked and retried by :mod:`planner.stores.retry` like
S3's, so every retry is counted and bounded:

* listing: ``list_blobs`` (``list_page_size`` blobs a request, 1,000 by default),
  page by page, each page retried on its own;
* a ranged read: one ``download_blob`` of exactly the range with ``If-Match`` on
  the ETag recorded at indexing, so that Azure refuses (412) a blob replaced under
  a running job; the length of what came back is checked.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from planner.errors import ConfigError
from planner.stores.retry import Changed, Fatal, Retrying, Throttled, Transient, check_body, with_deadline
from planner.stores.stopping import on_loop
from planner.stores.storage import PARQUET, FileStat, check_range, list_prefix, select_parquet

__all__ = ["AzureStorage"]

_HOST = re.compile(r"(?P<account>[^.]+)\.(dfs|blob)\.core\.windows\.net$")


class AzureStorage(Retrying):
    """``az://container/prefix``, ``abfs://container/prefix`` or ``abfs://container@account.dfs.core.windows.net/prefix``.

    ``storage_options`` are the keyword arguments of ``adlfs.AzureBlobFileSystem``
    (``account_name``, ``account_key``, ``sas_token``, ``connection_string``,
    ``credential``, ``anon``, ...) plus plitzer's ``retry_deadline`` (600 s), ``attempts``
    (unbounded but by the deadline), ``backoff``
    (0.1 s), ``read_timeout`` (30 s), ``connect_timeout`` (10 s), ``concurrency``
    (16) and ``list_page_size`` (1,000). Omitted credentials are adlfs's:
    ``AZURE_STORAGE_CONNECTION_STRING``, ``AZURE_STORAGE_ACCOUNT_NAME`` with
    ``AZURE_STORAGE_ACCOUNT_KEY`` or ``AZURE_STORAGE_SAS_TOKEN``, the
    ``AZURE_STORAGE_CLIENT_*`` service principal, else Azure's default credential chain.
    """

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        try:
            import adlfs
        except ImportError as e:
            msg = (
                f"source {url!r}: reading Azure Blob Storage needs adlfs; install it with: pip install 'plitzer[azure]'"
            )
            raise ConfigError(msg) from e
        scheme, _, rest = url.partition("://")
        self.scheme = scheme
        self.url = url.rstrip("/")
        self.netloc, _, self.key = rest.rstrip("/").partition("/")
        self.container, _, host = self.netloc.partition("@")
        if not self.container:
            msg = f"source {url!r} names no container; use az://container/prefix"
            raise ConfigError(msg)
        opts = dict(storage_options or {})
        own = {k: opts.pop(k) for k in self.TUNING if k in opts}
        match = _HOST.match(host) if host else None
        if match and "account_name" not in opts and "connection_string" not in opts:
            opts["account_name"] = match["account"]
        self.take_tuning(own)
        try:
            self.fs = adlfs.AzureBlobFileSystem(skip_instance_cache=True, **opts)
        except (TypeError, ValueError) as e:
            msg = (
                f"storage_options for {url!r}: {e}; use keyword arguments of adlfs.AzureBlobFileSystem "
                f"or {', '.join(self.TUNING)}, or the AZURE_STORAGE_* variables"
            )
            raise ConfigError(msg) from e
        self._retrier = self.make_retrier(
            transient=_transient,
            hint="check storage_options (account_name, account_key, sas_token, ...) or the AZURE_STORAGE_* variables",
        )

    def __repr__(self) -> str:
        return f"AzureStorage({self.url!r}, account={self.fs.account_name!r})"

    def _run(self, what: str, make: Any, deadline: float, location: str | None = None) -> Any:
        async def once() -> Any:
            try:
                return await make()
            except Exception as e:
                _raise_classified(e)
                raise

        return self._retrier.run(what, lambda: on_loop(self.fs.loop, with_deadline, once, deadline), location=location)

    # -- listing ---------------------------------------------------------------------

    def list_files(self, suffixes: tuple[str, ...] = PARQUET) -> list[FileStat]:
        prefix = list_prefix(self.key, suffixes)
        found: list[tuple[str, int, str]] = []
        token: str | None = None

        async def page(token: str | None) -> tuple[list[tuple[str, int, str]], str | None]:
            cc = self.fs.service_client.get_container_client(self.container)
            pages = cc.list_blobs(
                name_starts_with=prefix or None, results_per_page=self.list_page_size, retry_total=0
            ).by_page(continuation_token=token)
            items = [(b.name, int(b.size), str(b.etag or "").strip('"')) async for b in await pages.__anext__()]
            return items, pages.continuation_token

        while True:
            items, token = self._run(
                f"{self.url}: listing", lambda t=token: page(t), self.connect_timeout + 2 * self.read_timeout
            )
            found.extend(items)
            if not token:
                break
        return select_parquet(self.key, found, lambda k: f"{self.scheme}://{self.netloc}/{k}", suffixes)

    # -- ranged reads ------------------------------------------------------------------

    def read_range(self, file: FileStat, offset: int, length: int) -> bytes:
        from azure.core import MatchConditions

        check_range(file, offset, length)
        if length == 0:
            return b""
        netloc, _, blob = file.location.partition("://")[2].partition("/")
        container = netloc.partition("@")[0]
        conditions: dict[str, Any] = {}
        if file.version:
            conditions = {"etag": f'"{file.version}"', "match_condition": MatchConditions.IfNotModified}

        async def get() -> bytes:
            bc = self.fs.service_client.get_blob_client(container, blob)
            stream = await bc.download_blob(
                offset=offset, length=length, max_concurrency=1, retry_total=0, **conditions
            )
            # The object's size is the total of the Content-Range ("bytes 0-3/10240").
            total = str(stream.properties.content_range or "").rpartition("/")[2]
            if total and total != str(file.size):
                msg = (
                    f"the object changed after it was indexed: it is {total} bytes, not {file.size}; "
                    "restore it, or start a new run (the index is rebuilt on the next start)"
                )
                raise Changed(msg, location=file.location)
            return check_body(await stream.readall(), offset, length)

        what = f"{file.location}: reading bytes [{offset}, {offset + length})"
        deadline = self.connect_timeout + self.read_timeout + length / (1 << 20)
        data: bytes = self._run(what, get, deadline, location=file.location)
        return data

    # -- other readers of the same objects -------------------------------------------

    def polars_options(self) -> dict[str, str]:
        """``storage_options`` for ``pl.scan_parquet`` (object_store's ``azure_*`` keys)."""
        fs = self.fs
        out: dict[str, str] = {}
        conn = _connection_string(getattr(fs, "connection_string", None) or "")
        name = conn.get("AccountName") or fs.account_name
        if name:
            out["azure_storage_account_name"] = name
        key = conn.get("AccountKey") or fs.account_key
        sas = conn.get("SharedAccessSignature") or fs.sas_token
        if key:
            out["azure_storage_account_key"] = key
        elif sas:
            out["azure_storage_sas_token"] = sas.lstrip("?")
        endpoint = conn.get("BlobEndpoint")
        if endpoint:
            out["azure_endpoint"] = endpoint.rstrip("/")
            if endpoint.startswith("http://"):
                out["azure_allow_http"] = "true"
        if getattr(fs, "anon", False):
            out["azure_skip_signature"] = "true"
        return out

    def duckdb_filesystem(self) -> Any:
        """The fsspec filesystem to ``register_filesystem`` on a DuckDB connection."""
        return self.fs


def _connection_string(text: str) -> dict[str, str]:
    parts = (p.partition("=") for p in text.split(";") if p)
    return {k: v for k, _, v in parts}


def _raise_classified(e: BaseException) -> None:
    """Raise Fatal or Throttled for an SDK error where that is what it is; return otherwise."""
    from azure.core import exceptions as ax

    if isinstance(e, (Fatal, Transient)):
        return
    if isinstance(e, ax.ResourceModifiedError) or getattr(e, "status_code", None) == 412:
        msg = (
            "the object changed after it was indexed, or disappeared: its ETag no longer matches; a dataset must "
            "not change under a running job: restore it, or start a new run (the index is rebuilt "
            "on the next start)"
        )
        raise Changed(msg) from e
    if isinstance(e, ax.ResourceNotFoundError):
        code = str(getattr(e, "error_code", "") or "")
        if "Container" in code:
            msg = "no such container; check the URL and the account"
            raise Fatal(msg) from e
        msg = "the object disappeared after indexing; restore it or start a new run"
        raise Changed(msg) from e
    if isinstance(e, ax.ClientAuthenticationError):
        code = getattr(e, "error_code", "")
        msg = f"access denied ({code}); check account_key, sas_token or the AZURE_STORAGE_* variables"
        raise Fatal(msg) from e
    if isinstance(e, ax.HttpResponseError):
        status = int(getattr(e, "status_code", 0) or 0)
        if status in (429, 503):
            msg = f"throttled ({status} {getattr(e, 'error_code', '')})"
            raise Throttled(msg) from e
        if status >= 500 or status == 408:
            msg = f"server error ({status} {getattr(e, 'error_code', '')})"
            raise Transient(msg) from e
        if status:
            msg = f"the server refused the request ({status} {getattr(e, 'error_code', '')}: {e.reason})"
            raise Fatal(msg) from e


def _transient(e: BaseException) -> bool:
    import aiohttp
    from azure.core import exceptions as ax

    kinds = (Transient, OSError, TimeoutError, aiohttp.ClientError, ax.ServiceRequestError, ax.ServiceResponseError)
    return isinstance(e, kinds)
