"""Any HTTP server that honours Range: ``https://`` and ``http://`` sources (docs/storage.md).

:class:`HTTPStorage` is the HTTP backend of :class:`planner.stores.storage.Storage`, for a
mirror, a CDN or a plain web server. A source is

* a URL whose path ends in ``.parquet``: that one file, named by its base name; or
* any other URL: a *manifest*, a text file listing one Parquet file a line, as a URL
  or a path relative to the manifest (blank lines and ``#`` comments skipped, lines
  not ending in ``.parquet`` ignored, as a listing ignores other files). A file's
  name is its path relative to the manifest's folder (so ``data/manifest.txt``
  listing ``a/part-0.parquet`` gives the name of ``data/a/part-0.parquet`` on disk),
  or host and path for one elsewhere. A list of such URLs is a list source.

HTTP has no listing, so each file costs one ``HEAD`` when the source is opened
(concurrently, 32 at a time): its size, and its ETag or, failing that, its
Last-Modified, which pins it. Every read is one GET of exactly the range with
``If-Match`` on a strong ETag (or ``If-Unmodified-Since`` on Last-Modified), and the
answer's ETag or Last-Modified is compared with the pinned one, so a file replaced
under a running job is refused (412, or the check), never decoded. A server that
sends neither header cannot pin a file, and one that ignores Range (a 200 with the
whole file) cannot serve a row group: both are a clear StorageError.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import unquote, urljoin, urlsplit

from planner.errors import ConfigError, StorageError
from planner.stores import ranged
from planner.stores.retry import Changed, Retrying, check_body
from planner.stores.storage import PARQUET, FileStat, check_range

__all__ = ["HTTPStorage"]

_OPTIONS = ("headers",)
_HINT = "check the URL and storage_options headers (an Authorization header, for a server that needs one)"
_MANIFEST_CAP = 64 << 20


class HTTPStorage(Retrying):
    """``https://host/path/file.parquet``, or ``https://host/path/manifest.txt`` listing the files (module docstring).

    ``storage_options``: ``headers`` (sent with every request, e.g.
    ``{"Authorization": "Bearer ..."}``), and plitzer's ``retry_deadline`` (600 s),
    ``attempts`` (no bound but the deadline), ``backoff`` (0.1 s),
    ``read_timeout`` (30 s), ``connect_timeout`` (10 s), ``concurrency`` (16).
    """

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        try:
            import httpx2  # noqa: F401  (the client is built by ranged.client)
        except ImportError as e:
            msg = f"source {url!r}: reading over HTTP needs httpx2; install it with: pip install 'plitzer[http]'"
            raise ConfigError(msg) from e
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            msg = f"source {url!r} is not an http:// or https:// URL with a host"
            raise ConfigError(msg)
        self.url = url
        opts = dict(storage_options or {})
        own = {k: opts.pop(k) for k in self.TUNING if k in opts}
        unknown = sorted(set(opts) - set(_OPTIONS))
        if unknown:
            known = ", ".join(_OPTIONS + self.TUNING)
            msg = f"storage_options key {unknown[0]!r} is not known for {parts.scheme}://; use some of {known}"
            raise ConfigError(msg)
        headers = opts.get("headers") or {}
        if not isinstance(headers, Mapping) or not all(isinstance(v, str) for v in headers.values()):
            msg = f"storage_options headers={headers!r} must be a dict of header names to strings"
            raise ConfigError(msg)
        self._headers: dict[str, str] = {str(k): v for k, v in headers.items()}
        self.take_tuning(own)
        slots = max(64, 2 * self.concurrency)
        self._client = ranged.client(slots)
        # Its pooled connections close with the storage (an index holds it as long as it is used).
        weakref.finalize(self, self._client.close)
        self._retrier = self.make_retrier(
            transient=ranged.transient,
            hint=_HINT,
        )

    def __repr__(self) -> str:
        return f"HTTPStorage({self.url!r})"

    def _get(
        self,
        what: str,
        url: str,
        *,
        method: str = "GET",
        file: FileStat | None = None,
        want: tuple[int, int] | None = None,
        headers: Mapping[str, str] | None = None,
        check: Any = None,
    ) -> ranged.Answer:
        length = want[1] if want else 0
        deadline = self.connect_timeout + 2 * self.read_timeout + length / (1 << 20)

        def attempt() -> ranged.Answer:
            answer = ranged.get(
                self._client,
                url,
                {**self._headers, **(headers or {})},
                connect_timeout=self.connect_timeout,
                read_timeout=self.read_timeout,
                deadline=deadline,
                file=file,
                hint=_HINT,
                want=want,
                method=method,
            )
            if check is not None:
                check(answer)
            return answer

        return self._retrier.run(what, attempt, location=file.location if file else None)

    # -- listing ---------------------------------------------------------------------

    def list_files(self, suffixes: tuple[str, ...] = PARQUET) -> list[FileStat]:
        path = urlsplit(self.url).path
        if path.endswith(suffixes):
            return [self._stat(self.url, unquote(path.rsplit("/", 1)[-1]))]
        urls = self._manifest(suffixes)
        with ThreadPoolExecutor(max_workers=max(1, min(32, len(urls)))) as pool:
            files = list(pool.map(lambda t: self._stat(*t), urls))
        files.sort(key=lambda f: f.name.encode())
        return files

    def _manifest(self, suffixes: tuple[str, ...]) -> list[tuple[str, str]]:
        """(URL, name) of every Parquet file (every file ending in one of ``suffixes``) the manifest lists."""
        answer = self._get(f"{self.url}: reading the manifest", self.url)
        if len(answer.body) > _MANIFEST_CAP:
            msg = f"{self.url}: the manifest is {len(answer.body)} bytes, over {_MANIFEST_CAP}; split it into several"
            raise StorageError(msg)
        text = answer.body.decode("utf-8", "replace")
        if text.lstrip()[:15].lower().startswith(("<!doctype", "<html")):
            msg = (
                f"{self.url}: this is an HTML page, not a manifest; an HTTP source is a URL ending in .parquet, "
                "or a text file listing one Parquet URL (or path relative to it) a line"
            )
            raise ConfigError(msg)
        base = answer.url.rsplit("/", 1)[0] + "/"
        seen: dict[str, str] = {}
        for raw in text.splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            url = urljoin(answer.url, line)
            parts = urlsplit(url)
            if not parts.path.endswith(suffixes):
                continue
            bare = url.split("?", 1)[0].split("#", 1)[0]
            name = unquote(bare[len(base) :] if bare.startswith(base) else parts.netloc + parts.path)
            if name in seen and seen[name] != url:
                msg = f"{self.url}: two lines give the name {name!r} ({seen[name]} and {url}); list each file once"
                raise ConfigError(msg)
            seen[name] = url
        return [(url, name) for name, url in seen.items()]

    def _stat(self, url: str, name: str) -> FileStat:
        """One HEAD: the file's size and the ETag (else Last-Modified) that pins it.

        A server that refuses HEAD (405, 501, or 403 from a link signed for GET only) is
        asked for the first byte instead, its size then read from ``Content-Range``.
        """

        def ask(method: str, headers: dict[str, str], want: tuple[int, int] | None) -> ranged.Answer:
            return ranged.get(
                self._client,
                url,
                {**self._headers, "Accept-Encoding": "identity", **headers},
                connect_timeout=self.connect_timeout,
                read_timeout=self.read_timeout,
                deadline=self.connect_timeout + 2 * self.read_timeout,
                file=None,
                hint=_HINT,
                want=want,
                method=method,
            )

        def attempt() -> tuple[ranged.Answer, int | None]:
            try:
                return ask("HEAD", {}, None), None
            except ranged.Refused as e:
                if e.status not in (403, 405, 501):
                    raise
            answer = ask("GET", {"Range": "bytes=0-0"}, (0, 1))
            total = str(answer.headers.get("Content-Range", "")).rpartition("/")[2]
            return answer, int(total) if total.isdigit() else None

        answer, total = self._retrier.run(f"{url}: HEAD", attempt)
        if total is not None:
            return self._pin(url, name, answer, total)
        size = answer.headers.get("Content-Length")
        if size is None or not str(size).isdigit():
            msg = f"{url}: the server gives no Content-Length; plitzer needs each file's size to read its footer"
            raise StorageError(msg)
        if str(answer.headers.get("Accept-Ranges", "")).lower() == "none":
            msg = f"{url}: the server says Accept-Ranges: none; plitzer reads byte ranges: use a server honouring Range"
            raise StorageError(msg)
        return self._pin(url, name, answer, int(size))

    def _pin(self, url: str, name: str, answer: ranged.Answer, size: int) -> FileStat:
        """The file's stat, pinned by the answer's ETag, else its Last-Modified."""
        version = str(answer.headers.get("ETag") or answer.headers.get("Last-Modified") or "")
        if not version:
            msg = (
                f"{url}: the server sends neither ETag nor Last-Modified, so a file that changes under a run "
                "could not be told apart; serve it from a server that sends one"
            )
            raise StorageError(msg)
        return FileStat(name=name, location=url, size=size, version=version)

    # -- ranged reads ------------------------------------------------------------------

    def read_range(self, file: FileStat, offset: int, length: int) -> bytes:
        check_range(file, offset, length)
        if length == 0:
            return b""
        end = offset + length - 1
        etag = file.version.startswith(('"', 'W/"'))
        headers = {"Range": f"bytes={offset}-{end}", "Accept-Encoding": "identity"}
        if etag and file.version.startswith('"'):
            headers["If-Match"] = file.version
        elif not etag:
            headers["If-Unmodified-Since"] = file.version

        def check(answer: ranged.Answer) -> None:
            got = str(answer.headers.get("ETag" if etag else "Last-Modified") or "")
            if got and _weak(got) != _weak(file.version):
                what = "ETag" if etag else "Last-Modified"
                msg = (
                    f"the file changed after it was indexed: its {what} is {got}, not {file.version}; a dataset "
                    "must not change under a running job: restore it, or start a new run"
                )
                raise Changed(msg, location=file.location)
            check_body(answer.body, offset, length)

        answer = self._get(
            f"{file.location}: reading bytes [{offset}, {offset + length})",
            file.location,
            file=file,
            want=(offset, length),
            headers=headers,
            check=check,
        )
        return answer.body

    # -- other readers of the same files -------------------------------------------------

    def polars_options(self) -> dict[str, str]:
        """Polars reads http(s) URLs itself (headers cannot be passed)."""
        return {}

    def duckdb_filesystem(self) -> Any:
        """fsspec's ``HTTPFileSystem`` with the same headers (``read_parquet('https://...')``), None without aiohttp."""
        try:
            from fsspec.implementations.http import HTTPFileSystem
        except ImportError:
            return None
        return HTTPFileSystem(headers=self._headers, skip_instance_cache=True)


def _weak(tag: str) -> str:
    return tag.removeprefix("W/")
