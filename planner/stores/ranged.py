"""Checked HTTP requests shared by the ``hf://`` and ``https://`` sources (docs/storage.md).

The Hugging Face Hub (:mod:`planner.stores.hf`) and any HTTP server that honours Range
(:mod:`planner.stores.http`) are read the same way: one GET of exactly a byte range,
through an httpx2 client (the Hub's is huggingface_hub's shared session), checked
here and retried by :mod:`planner.stores.retry`:

* the status: 206 (or 200 for a range that is the whole file) is read; 429 and 503
  are throttling (:class:`planner.stores.retry.Throttled`, waiting what ``Retry-After``
  asks, up to :data:`RETRY_AFTER_CAP`), other 5xx and 408 transient, 404, 412 and
  416 on a file that was listed mean it changed (:class:`planner.stores.retry.Changed`),
  401 and 403 are access denied, anything else fatal;
* a 200 to a range that is not the whole file: the server ignores Range, which no
  retry fixes (fatal, and the body is never downloaded);
* ``Content-Range`` must be the range asked for, its total the listed size, and the
  body exactly the range's length; a body that takes longer than the attempt's
  deadline is cut off (a server that trickles bytes cannot hold a read forever).

The file's identity headers (ETag, Last-Modified, the Hub's commit) are checked by
the caller's ``check`` (each backend knows which it pinned).

The ``https://`` source's own client (:func:`client`) reads its sockets inside
:func:`planner.stores.stopping.interruptible`, so closing a loader ends a read from a
server that accepted and never answers at once, not at its read timeout.
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Mapping
from typing import Any, cast

from planner.stores.retry import Changed, Fatal, Throttled, Transient
from planner.stores.stopping import interruptible
from planner.stores.storage import FileStat

__all__ = ["RETRY_AFTER_CAP", "Answer", "Refused", "check_status", "client", "get", "retry_after", "transient"]

RETRY_AFTER_CAP = 60.0
"""The most seconds a ``Retry-After`` is waited before the next attempt."""

_CHUNK = 1 << 20


def client(connections: int) -> Any:
    """An httpx2 client of ``connections`` pooled connections whose blocking reads a stop interrupts.

    httpx2's transport takes no network backend, so its pool is built here as httpx2 builds it,
    with httpcore2's own backend wrapped (:class:`_Interruptible`): each read and write of a
    socket runs inside :func:`~planner.stores.stopping.interruptible`.
    """
    import httpcore2
    import httpx2

    limits = httpx2.Limits(max_connections=connections, max_keepalive_connections=connections)
    transport = httpx2.HTTPTransport(limits=limits)
    pool = getattr(transport, "_pool", None)
    backend = getattr(pool, "_network_backend", None)
    if isinstance(pool, httpcore2.ConnectionPool) and backend is not None:
        pool._network_backend = cast("Any", _Interruptible(backend))
    # else: another httpx2 than the tested one; reads still end at their read timeout.
    return httpx2.Client(follow_redirects=True, transport=transport)


class _Stream:
    """httpcore2's network stream, its reads and writes stoppable (:func:`~planner.stores.stopping.interruptible`)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        with interruptible(self._inner.get_extra_info("socket")):
            data: bytes = self._inner.read(max_bytes, timeout)
            return data

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        with interruptible(self._inner.get_extra_info("socket")):
            self._inner.write(buffer, timeout)

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None) -> Any:
        return _Stream(self._inner.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _Interruptible:
    """httpcore2's network backend, its streams wrapped in :class:`_Stream`."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def connect_tcp(self, *args: Any, **kwargs: Any) -> _Stream:
        return _Stream(self._inner.connect_tcp(*args, **kwargs))

    def connect_unix_socket(self, *args: Any, **kwargs: Any) -> _Stream:
        return _Stream(self._inner.connect_unix_socket(*args, **kwargs))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


class Answer:
    """A finished response: status, headers (case-insensitive), the final URL and the body."""

    __slots__ = ("body", "headers", "history", "status", "url")

    def __init__(self, status: int, headers: Any, url: str, body: bytes, history: list[Any]) -> None:
        self.status, self.headers, self.url, self.body, self.history = status, headers, url, body, history

    def header(self, name: str) -> str:
        """The header ``name`` of the response, else of the redirects before it ("" if none)."""
        value = self.headers.get(name)
        if value:
            return str(value)
        for r in reversed(self.history):
            value = r.headers.get(name)
            if value:
                return str(value)
        return ""


def retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds a ``Retry-After`` header asks to wait (delta-seconds or an HTTP date), None if absent or unreadable.

    >>> retry_after("3"), retry_after(None), retry_after("soon")
    (3.0, None, None)
    >>> retry_after("Thu, 01 Jan 1970 00:00:10 GMT", now=4.0)
    6.0
    """
    if not value:
        return None
    text = value.strip()
    if text.isdigit():
        return float(text)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def check_status(status: int, headers: Any, body: bytes, file: FileStat | None, hint: str) -> None:
    """Raise Throttled, Transient, Changed or Fatal for a failed answer; return for 200 and 206."""
    if status in (200, 206):
        return
    text = body[:300].decode("utf-8", "replace").strip()
    if status in (429, 503):
        wait = retry_after(headers.get("Retry-After"))
        if wait:
            # By hand: no retry library reads Retry-After; wait what the server asked (within the
            # cap) before this attempt gives its slot back, then the usual backoff follows.
            time.sleep(min(wait, RETRY_AFTER_CAP))
        after = f", Retry-After {headers.get('Retry-After')}" if wait is not None else ""
        msg = f"throttled ({status}{after}: {text})"
        raise Throttled(msg)
    if status >= 500 or status == 408:
        msg = f"server error ({status}: {text})"
        raise Transient(msg)
    if file is not None and status in (404, 410, 412, 416):
        what = {
            404: "it disappeared",
            410: "it disappeared",
            412: "its ETag or Last-Modified is no longer the one listed",
            416: "it is shorter than listed",
        }[status]
        msg = (
            f"the file changed after it was indexed ({status}: {what}); a dataset must not change under a "
            "running job: restore it, or start a new run (the index is rebuilt on the next start)"
        )
        raise Changed(msg, location=file.location)
    if status in (401, 403):
        msg = f"access denied ({status}: {text}); {hint}"
        raise Refused(msg, status)
    msg = f"the server refused the request ({status}: {text})"
    raise Refused(msg, status)


class Refused(Fatal):
    """A 4xx answer that retrying cannot change; ``status`` says which."""

    def __init__(self, msg: str, status: int) -> None:
        super().__init__(msg)
        self.status = status


def get(
    client: Any,
    url: str,
    headers: Mapping[str, str],
    *,
    connect_timeout: float,
    read_timeout: float,
    deadline: float,
    file: FileStat | None,
    hint: str,
    want: tuple[int, int] | None = None,
    method: str = "GET",
) -> Answer:
    """One request through ``client`` (an httpx2.Client), checked; ``want`` is the (offset, length) asked for.

    With ``want``, a 200 that is not the whole file is fatal (the server ignores Range) and its
    body is never read; a 206 must cover exactly the range (else Transient, read no further).
    """
    import httpx2

    timeout = httpx2.Timeout(connect=connect_timeout, read=read_timeout, write=read_timeout, pool=read_timeout)
    start = time.monotonic()
    with client.stream(method, url, headers=dict(headers), timeout=timeout) as r:
        status = int(r.status_code)
        if status not in (200, 206):
            body = r.read() if int(r.headers.get("Content-Length", "0") or 0) < (1 << 16) else b""
            check_status(status, r.headers, body, file, hint)
        if want is not None:
            offset, length = want
            end = offset + length - 1
            got = str(r.headers.get("Content-Range", ""))
            whole = file is not None and offset == 0 and length == file.size
            if status == 200 and not whole:
                msg = (
                    f"the server ignored the Range request (answered 200 with the whole file instead of bytes "
                    f"{offset}-{end}); plitzer reads one byte range per row group and needs a server that "
                    "honours Range requests (Accept-Ranges: bytes): use another server or mirror"
                )
                raise Fatal(msg)
            total = got.rpartition("/")[2]
            if file is not None and status == 206 and total not in ("", "*", str(file.size)):
                msg = (
                    f"the file changed after it was indexed: it is {total} bytes, not {file.size}; restore it, "
                    "or start a new run (the index is rebuilt on the next start)"
                )
                raise Changed(msg, location=file.location)
            if status == 206 and not got.startswith(f"bytes {offset}-{end}/"):
                msg = f"response covers {got or 'no Content-Range'} instead of the {length} bytes requested"
                raise Transient(msg)
        parts: list[bytes] = []
        for chunk in r.iter_bytes(_CHUNK):
            parts.append(chunk)
            if time.monotonic() - start > deadline:
                msg = f"no complete response within {deadline:.1f} s"
                raise Transient(msg)
        return Answer(status, r.headers, str(r.url), b"".join(parts), list(r.history))


def transient(e: BaseException) -> bool:
    """Whether another attempt may succeed: our Transient, and the network's errors."""
    import httpx2

    return isinstance(e, (Transient, OSError, TimeoutError, httpx2.TransportError))
