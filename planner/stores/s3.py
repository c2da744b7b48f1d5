"""S3: listing, footers and one checked, retried ranged GET per row group (docs/storage.md).

:class:`S3Storage` is the S3 backend of :class:`planner.stores.storage.Storage`: one listing
request per 1,000 objects, and every ranged GET straight through the aiobotocore
client with ``If-Match`` on the ETag from indexing and checked lengths, retried by
planner.stores.retry where the failure is transient (throttling, 5xx, resets, timeouts, short
bodies) for up to ``retry_deadline`` seconds, then a :class:`StorageError` naming object,
byte range, the time waited and the cause.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from typing import Any

from planner.errors import ConfigError
from planner.stores.retry import Changed, Retrying
from planner.stores.retry import Fatal as _Fatal
from planner.stores.retry import Transient as _Retry
from planner.stores.retry import with_deadline as _with_deadline
from planner.stores.stopping import on_loop
from planner.stores.storage import PARQUET, FileStat, check_range, list_prefix, select_parquet

__all__ = ["S3Storage"]

# Retries: attempt k (from 0) waits about backoff * 2**k (jittered, capped) first, for as
# long as retry_deadline allows (planner.stores.retry).
_RETRY_BACKOFF = 0.1
# An attempt never runs longer than connect + read timeout plus the body at this rate,
# so a server that trickles bytes cannot hold a read forever.
_MIN_RATE = 1 << 20
_S3_OPTIONS = (
    "endpoint",
    "region",
    "key",
    "secret",
    "token",
    "anon",
    "attempts",
    "retry_deadline",
    "backoff",
    "read_timeout",
    "connect_timeout",
    "concurrency",
    "list_page_size",
    "client_kwargs",
    "config_kwargs",
    # passed to s3fs as they are
    "profile",
    "use_ssl",
    "requester_pays",
    "s3_additional_kwargs",
    "session",
)
_ALIASES = {
    "endpoint_url": "endpoint",
    "region_name": "region",
    "aws_access_key_id": "key",
    "aws_secret_access_key": "secret",
    "aws_session_token": "token",
}
_THROTTLE_CODES = ("SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded", "TooManyRequests")


class S3Storage(Retrying):
    """``s3://bucket/prefix`` through s3fs's aiobotocore client.

    ``storage_options`` takes ``endpoint``, ``region``, ``key``, ``secret``,
    ``token`` and ``anon``; anything omitted comes from the usual ``AWS_*``
    variables (``AWS_ENDPOINT_URL_S3``/``AWS_ENDPOINT_URL``, ``AWS_REGION``/
    ``AWS_DEFAULT_REGION``, ``AWS_ACCESS_KEY_ID``, ...) and botocore's profiles.
    Tuning: ``retry_deadline`` (600 s: how long a request keeps retrying a store
    that does not answer; 0 fails at once), ``attempts`` (no bound but the
    deadline, unless given), ``backoff`` (0.1 s, doubled per attempt, capped at 10 s),
    ``read_timeout`` (30 s), ``connect_timeout`` (10 s), ``concurrency`` (16
    reader threads the loader uses at least; requests in flight start capped at
    twice that, at least 64), ``list_page_size`` (1,000 keys a listing request).

    Listing is one paginated ``ListObjectsV2`` (1,000 objects a request). Every
    read is one GET of exactly the requested range with ``If-Match`` on the ETag
    recorded at indexing, so an object replaced under a running job is refused
    instead of decoded. Throttling (503 SlowDown, 429), other 5xx, connection
    resets, timeouts and bodies shorter than the range are retried with
    jittered exponential backoff (:mod:`planner.stores.retry`), and throttling halves
    the requests in flight, which then grow back (AIMD); past ``retry_deadline``
    (or ``attempts``) the read fails with a StorageError naming the object, the
    range, the time waited and the last cause. A body whose length differs from the range is never returned.
    :attr:`retries` counts the attempts beyond the first.
    """

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        try:
            import s3fs
        except ImportError as e:
            msg = f"source {url!r}: reading S3 needs s3fs; install it with: pip install 'plitzer[s3]'"
            raise ConfigError(msg) from e

        self.url = url.rstrip("/")
        self.bucket, _, self.key = self.url[len("s3://") :].partition("/")
        if not self.bucket:
            msg = f"source {url!r} names no bucket; use s3://bucket/prefix"
            raise ConfigError(msg)
        opts: dict[str, Any] = {}
        for k, v in dict(storage_options or {}).items():
            name = _ALIASES.get(k, k)
            if name not in _S3_OPTIONS:
                msg = f"storage_options key {k!r} is not known; use some of {', '.join(_S3_OPTIONS)}"
                raise ConfigError(msg)
            opts[name] = v
        client_kwargs: dict[str, Any] = dict(opts.pop("client_kwargs", None) or {})
        config_kwargs: dict[str, Any] = dict(opts.pop("config_kwargs", None) or {})
        endpoint = opts.pop("endpoint", None) or client_kwargs.get("endpoint_url")
        if endpoint is None:
            endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        if endpoint:
            client_kwargs["endpoint_url"] = endpoint
        region = opts.pop("region", None) or client_kwargs.get("region_name")
        if region is None:
            region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        if region:
            client_kwargs["region_name"] = region
        self.endpoint: str | None = endpoint or None
        self.region: str | None = region or None
        self.take_tuning(opts, backoff=_RETRY_BACKOFF)
        config_kwargs.setdefault("read_timeout", self.read_timeout)
        config_kwargs.setdefault("connect_timeout", self.connect_timeout)
        # Footers are fetched by up to 32 threads at once; never queue on the pool.
        config_kwargs.setdefault("max_pool_connections", max(64, 2 * self.concurrency))
        # Our retries (planner.stores.retry, in _run) own them, so that every failure is counted,
        # bounded and reported with the object and range; botocore's and s3fs's would
        # hide them, and they cannot see a body cut short or a response past its deadline.
        config_kwargs.setdefault("retries", {"total_max_attempts": 1, "mode": "standard"})
        self.anon = bool(opts.get("anon", False))
        self._key = opts.get("key")
        self._secret = opts.get("secret")
        self._token = opts.get("token")
        self._retrier = self.make_retrier(
            transient=_transient,
            throttled=_throttled,
            hint="check storage_options and the credentials (key/secret or AWS_* variables)",
        )
        self.fs = s3fs.S3FileSystem(
            client_kwargs=client_kwargs,
            config_kwargs=config_kwargs,
            skip_instance_cache=True,
            **opts,
        )

    def __repr__(self) -> str:
        return f"S3Storage({self.url!r}, endpoint={self.endpoint!r})"

    # -- the retry loop ------------------------------------------------------------

    def _run(self, what: str, make: Any, deadline: float) -> Any:
        """Run coroutine ``make()`` on s3fs's event loop, retrying transient failures.

        What counts as transient is ours (:func:`_transient`, :func:`_raise_fatal`):
        botocore's own retries see neither a body cut short nor a deadline, so they
        are off (``__init__``).
        """
        return self._retrier.run(what, lambda: on_loop(self.fs.loop, _with_deadline, make, deadline))

    # -- listing ---------------------------------------------------------------------

    def list_files(self, suffixes: tuple[str, ...] = PARQUET) -> list[FileStat]:
        key = self.key
        prefix = list_prefix(key, suffixes)

        async def page(token: str | None) -> dict[str, Any]:
            s3 = await self.fs.set_session()
            params: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix, "MaxKeys": self.list_page_size}
            if token:
                params["ContinuationToken"] = token
            try:
                result: dict[str, Any] = await s3.list_objects_v2(**params)
            except Exception as e:
                _raise_fatal(e)
                raise
            return result

        # One ListObjectsV2 request per list_page_size (1,000) objects, each retried on its own.
        objects: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            result = self._run(
                f"{self.url}: listing",
                functools.partial(page, token),
                self.connect_timeout + 2 * self.read_timeout,
            )
            objects.extend(result.get("Contents", []))
            token = result.get("NextContinuationToken")
            if not result.get("IsTruncated") or not token:
                break
        found = ((str(o["Key"]), int(o["Size"]), str(o.get("ETag") or "").strip('"')) for o in objects)
        return select_parquet(key, found, lambda k: f"s3://{self.bucket}/{k}", suffixes)

    # -- ranged reads ------------------------------------------------------------------

    def read_range(self, file: FileStat, offset: int, length: int) -> bytes:
        check_range(file, offset, length)
        if length == 0:
            return b""
        bucket, _, key = file.location[len("s3://") :].partition("/")
        end = offset + length - 1
        params: dict[str, Any] = {"Bucket": bucket, "Key": key, "Range": f"bytes={offset}-{end}"}
        if file.version:
            # By hand: no retry library knows an object replaced under a job; 412 is fatal.
            params["IfMatch"] = f'"{file.version}"'

        async def get() -> bytes:
            s3 = await self.fs.set_session()
            try:
                resp = await s3.get_object(**params)
            except Exception as e:
                _raise_fatal(e, file)
                raise
            body = resp["Body"]
            try:
                got = resp.get("ContentLength")
                if got != length or not str(resp.get("ContentRange", "")).startswith(f"bytes {offset}-{end}/"):
                    # Wrong range (or the whole object): drop the connection unread.
                    msg = (
                        f"response covers {resp.get('ContentRange') or 'the whole object'} "
                        f"({got} bytes) instead of the {length} requested"
                    )
                    raise _Retry(msg)
                try:
                    raw: bytes = await body.read()
                except Exception as e:
                    _raise_fatal(e, file)
                    raise
            finally:
                body.close()
            if len(raw) != length:
                # By hand: botocore retries a request that fails, never a body that ends early.
                msg = f"short body: {len(raw)} of {length} bytes"
                raise _Retry(msg)
            return raw

        what = f"{file.location}: reading bytes [{offset}, {offset + length})"
        data: bytes = self._run(what, get, self.connect_timeout + self.read_timeout + length / _MIN_RATE)
        return data

    # -- other readers of the same objects -------------------------------------------

    def credentials(self) -> tuple[str | None, str | None, str | None]:
        """(key, secret, token): explicit, else what botocore resolves (env, profile)."""
        if self.anon or self._key:
            return self._key, self._secret, self._token
        from fsspec.asyn import sync

        async def resolve() -> Any:
            await self.fs.set_session()
            creds = await self.fs.session.get_credentials()
            return None if creds is None else await creds.get_frozen_credentials()

        try:
            frozen = sync(self.fs.loop, resolve, timeout=self.connect_timeout + self.read_timeout)
        except Exception:  # no credentials found: let the other reader try its own
            return None, None, None
        if frozen is None:
            return None, None, None
        return frozen.access_key, frozen.secret_key, frozen.token

    def polars_options(self) -> dict[str, str]:
        """``storage_options`` for ``pl.scan_parquet`` that reach the same objects."""
        out: dict[str, str] = {"aws_region": self.region or "us-east-1"}
        if self.endpoint:
            out["aws_endpoint_url"] = self.endpoint
            if self.endpoint.startswith("http://"):
                out["aws_allow_http"] = "true"
        if self.anon:
            out["aws_skip_signature"] = "true"
            return out
        key, secret, token = self.credentials()
        if key:
            out["aws_access_key_id"] = key
        if secret:
            out["aws_secret_access_key"] = secret
        if token:
            out["aws_session_token"] = token
        return out

    def duckdb_filesystem(self) -> Any:
        """The fsspec filesystem to ``register_filesystem`` on a DuckDB connection."""
        return self.fs


def _transient(e: BaseException) -> bool:
    """Whether another attempt may succeed: network, timeout, short body, 5xx, throttling."""
    import aiohttp
    from botocore import exceptions as bx
    from botocore.parsers import ResponseParserError

    kinds = (
        _Retry,
        OSError,
        TimeoutError,
        aiohttp.ClientError,
        bx.HTTPClientError,
        bx.ConnectionError,
        bx.IncompleteReadError,
        ResponseParserError,
        bx.ClientError,  # only retryable ones get here: _raise_fatal took the rest
    )
    return isinstance(e, kinds)


def _throttled(e: BaseException) -> bool:
    """Whether the server asked us to slow down (503 SlowDown, 429)."""
    response = getattr(e, "response", None)
    if not isinstance(response, dict):
        return False
    code = str(response.get("Error", {}).get("Code", ""))
    status = int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    return code in _THROTTLE_CODES or status in (429, 503)


def _raise_fatal(e: BaseException, file: FileStat | None = None) -> None:
    """Raise _Fatal for a failure that retrying cannot fix; return for a transient one."""
    response = getattr(e, "response", None)
    if not isinstance(response, dict):
        return  # connection reset, timeout, short read, parse error: transient
    code = str(response.get("Error", {}).get("Code", ""))
    status = int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    if status >= 500 or status in (408, 429) or code in ("SlowDown", "Throttling", "RequestTimeout", "InternalError"):
        return
    where = "" if file is None else f" (indexed size {file.size}, ETag {file.version})"
    if status == 412 or code == "PreconditionFailed":
        msg = (
            f"the object changed after it was indexed: its ETag is no longer {file.version if file else '?'}; "
            "a dataset must not change under a running job: restore it, or start a new run "
            "(the index is rebuilt on the next start)"
        )
    elif code == "NoSuchBucket":
        msg = "no such bucket; check the URL, the endpoint and the region"
    elif code in ("NoSuchKey", "404") or status == 404:
        msg = f"the object disappeared after indexing{where}; restore it or start a new run"
    elif status == 403 or code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
        msg = f"access denied ({code}); check key/secret (or AWS_* variables) and the bucket policy"
    elif status == 416 or code == "InvalidRange":
        msg = f"the object is shorter than indexed{where}; it changed after indexing: start a new run"
    else:
        msg = f"the server refused the request ({status} {code}: {e})"
    changed = file is not None and (
        status in (412, 416, 404) or code in ("PreconditionFailed", "InvalidRange", "NoSuchKey", "404")
    )
    if changed:
        raise Changed(msg, location=file.location if file else None) from e
    raise _Fatal(msg) from e
