"""The Hugging Face Hub: ``hf://datasets/ORG/NAME[@REVISION]/PATH`` sources (docs/storage.md).

:class:`HFStorage` is the Hub backend of :class:`planner.stores.storage.Storage`. Credentials,
the endpoint and the HTTP session are huggingface_hub's (``HF_TOKEN`` or the saved
login, ``HF_ENDPOINT``, its shared httpx2 client); the three requests plitzer makes
are sent through that session by this module, so that each is one request, checked
and retried by :mod:`planner.stores.retry` like S3's (huggingface_hub's own ``http_backoff``
retries are uncounted and know no pinned file):

* the revision, once, at construction: ``GET /api/datasets/ORG/NAME/revision/REV``
  gives the commit a branch or tag points at (a full 40-hex commit is taken as it
  is, with no request). Every later request names that commit, so a branch that
  moves during the run changes nothing the run reads;
* listing: ``GET /api/datasets/ORG/NAME/tree/COMMIT/PATH?recursive=true``, page
  by page (the Hub's ``Link: <...>; rel="next"`` cursor), each page retried on its own;
* a ranged read: ``GET /datasets/ORG/NAME/resolve/COMMIT/FILE`` with a ``Range``
  (the Hub answers a Parquet file, stored in LFS or Xet, with a redirect to its CDN,
  which answers the range). ``X-Repo-Commit`` and ``X-Linked-Etag`` (the file's LFS
  sha256) are checked against what the listing gave, and the body by
  :mod:`planner.stores.ranged`.

A file's ``version`` is its content hash (the LFS sha256, else the git blob id) and
its ``location`` the resolve URL at the commit, so the footer and index caches key
on the commit and the content. :meth:`HFStorage.checkpoint_revision` gives what a checkpoint
records of each Hub source (:func:`planner.stores.storage.revisions`: its commit and a
digest of its files' hashes).
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from planner.errors import ConfigError, StorageError
from planner.stores import ranged
from planner.stores.retry import Changed, Fatal, Retrying, Transient, check_body
from planner.stores.storage import PARQUET, FileStat, check_range, select_parquet

__all__ = ["HFStorage"]

_COMMIT = re.compile(r"[0-9a-f]{40}")
_PREFIX = {"dataset": "datasets/", "space": "spaces/", "model": ""}
_OPTIONS = ("token", "endpoint")
# How long a CDN link the Hub redirected a read to is used before the Hub is asked again
# (its signed links last about an hour; an expired one is asked again anyway).
_CDN_TTL = 600.0


class HFStorage(Retrying):
    """``hf://datasets/ORG/NAME[@REVISION]/PATH`` (also ``hf://ORG/NAME`` models and ``hf://spaces/...``).

    ``storage_options``: ``token`` (else ``HF_TOKEN``, else huggingface_hub's saved
    login; ``False`` for none), ``endpoint`` (else ``HF_ENDPOINT``, else
    ``https://huggingface.co``), and plitzer's ``retry_deadline`` (600 s), ``attempts``
    (no bound but the deadline), ``backoff`` (0.1 s), ``read_timeout`` (30 s),
    ``connect_timeout`` (10 s), ``concurrency`` (16) and
    ``list_page_size`` (the Hub's 1,000 entries a page unless set: then sent as ``limit``).

    The revision (a branch, a tag, ``refs/convert/parquet``, a commit; ``main`` when
    omitted) is resolved to its commit here, once: :attr:`commit`.
    """

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        try:
            from huggingface_hub import constants
            from huggingface_hub.utils._hf_uris import parse_hf_uri
        except ImportError as e:
            msg = f"source {url!r}: reading the Hugging Face Hub needs huggingface_hub; pip install 'plitzer[hf]'"
            raise ConfigError(msg) from e
        self.url = url.rstrip("/")
        try:
            uri = parse_hf_uri(self.url)
        except ValueError as e:
            msg = f"source {url!r}: {e}; use hf://datasets/ORG/NAME[@REVISION]/PATH"
            raise ConfigError(msg) from e
        if uri.type not in _PREFIX:
            msg = f"source {url!r}: hf:// {uri.type}s are not read by plitzer; use hf://datasets/ORG/NAME/PATH"
            raise ConfigError(msg)
        self.repo_type: str = uri.type
        self.repo_id: str = uri.id
        self.revision: str = uri.revision or "main"
        self.path: str = uri.path_in_repo.strip("/")
        opts = dict(storage_options or {})
        own = {k: opts.pop(k) for k in self.TUNING if k in opts}
        # The Hub pages by 1,000 entries; a smaller page is asked for only when one is set.
        self._page_limit = "list_page_size" in own
        unknown = sorted(set(opts) - set(_OPTIONS))
        if unknown:
            known = ", ".join(_OPTIONS + self.TUNING)
            msg = f"storage_options key {unknown[0]!r} is not known for hf://; use some of {known}"
            raise ConfigError(msg)
        self.take_tuning(own)
        endpoint = opts.get("endpoint") or os.environ.get("HF_ENDPOINT") or constants.ENDPOINT
        self.endpoint: str = str(endpoint).rstrip("/")
        self._token: str | bool | None = opts.get("token")
        self._retrier = self.make_retrier(
            transient=_transient,
            hint=_HINT,
        )
        self._cdn: dict[str, tuple[str, float]] = {}  # location -> (CDN URL, until): see read_range
        self._pending: dict[str, threading.Event] = {}  # locations whose first read is asking the Hub
        self._lock = threading.Lock()
        self.commit: str = self.revision if _COMMIT.fullmatch(self.revision) else self._resolve()

    def __repr__(self) -> str:
        return f"HFStorage({self.url!r}, commit={self.commit!r}, endpoint={self.endpoint!r})"

    @property
    def repo_url(self) -> str:
        """``hf://datasets/ORG/NAME``: the repository, without revision or path."""
        return f"hf://{_PREFIX[self.repo_type]}{self.repo_id}"

    @property
    def pinned(self) -> str:
        """The source at its commit: ``hf://datasets/ORG/NAME@COMMIT/PATH`` (what a resume can pass)."""
        return f"{self.repo_url}@{self.commit}" + (f"/{self.path}" if self.path else "")

    @property
    def revision_key(self) -> str:
        """The source without its revision: what a checkpoint's revisions are matched by."""
        return self.repo_url + (f"/{self.path}" if self.path else "")

    def checkpoint_revision(self) -> tuple[str, str] | None:
        return self.revision_key, self.commit

    # -- requests --------------------------------------------------------------------

    def _headers(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        from huggingface_hub.utils._headers import build_hf_headers

        return build_hf_headers(token=self._token, headers=dict(extra or {}))

    def _get(self, what: str, url: str) -> ranged.Answer:
        """One API request (revision, a listing page) through huggingface_hub's session, retried."""
        from huggingface_hub.utils._http import get_session

        def attempt() -> ranged.Answer:
            return ranged.get(
                get_session(),
                url,
                self._headers(),
                connect_timeout=self.connect_timeout,
                read_timeout=self.read_timeout,
                deadline=self.connect_timeout + 2 * self.read_timeout,
                file=None,
                hint=_HINT,
            )

        return self._retrier.run(what, attempt)

    def _api(self, *parts: str) -> str:
        return f"{self.endpoint}/api/{self.repo_type}s/{self.repo_id}/" + "/".join(parts)

    def _json(self, what: str, answer: ranged.Answer) -> Any:
        try:
            return json.loads(answer.body)
        except ValueError as e:
            msg = f"{what}: the Hub's answer is not JSON ({e}); check the endpoint ({self.endpoint})"
            raise StorageError(msg) from e

    def _resolve(self) -> str:
        """The commit :attr:`revision` points at now (one request)."""
        what = f"{self.url}: resolving revision {self.revision!r}"
        try:
            answer = self._get(what, self._api("revision", quote(self.revision, safe="")))
        except StorageError as e:
            msg = f"{e}; check the repository name and the revision (a branch, tag or commit)"
            raise StorageError(msg) from e
        sha = self._json(what, answer).get("sha")
        if not isinstance(sha, str) or not _COMMIT.fullmatch(sha):
            msg = f"{what}: the Hub's answer names no commit (sha {sha!r}); check the endpoint ({self.endpoint})"
            raise StorageError(msg)
        return sha

    # -- listing ---------------------------------------------------------------------

    def _tree(self, folder: str, *, recursive: bool) -> list[dict[str, Any]]:
        """Every entry below ``folder`` at the commit, page by page (each page retried on its own)."""
        what = f"{self.url}: listing"
        url = self._api("tree", self.commit) + (f"/{quote(folder, safe='')}" if folder else "")
        url += f"?recursive={'true' if recursive else 'false'}&expand=false"
        if self._page_limit:
            url += f"&limit={self.list_page_size}"
        entries: list[dict[str, Any]] = []
        next_url: str | None = url
        while next_url:
            answer = self._get(what, next_url)
            page = self._json(what, answer)
            if not isinstance(page, list):
                msg = f"{what}: the Hub's answer is not a list of entries; check the endpoint ({self.endpoint})"
                raise StorageError(msg)
            entries.extend(page)
            next_url = _next_link(answer.header("Link"))
        return entries

    def _location(self, path: str) -> str:
        return f"{self.endpoint}/{_PREFIX[self.repo_type]}{self.repo_id}/resolve/{self.commit}/{quote(path)}"

    def list_files(self, suffixes: tuple[str, ...] = PARQUET) -> list[FileStat]:
        key = self.path
        if key.endswith(suffixes):
            parent = key.rsplit("/", 1)[0] if "/" in key else ""
            exact = [e for e in self._tree(parent, recursive=False) if e.get("path") == key]
            entries = exact or self._tree(key, recursive=True)
        else:
            entries = self._tree(key, recursive=True)
        found = (
            (str(e["path"]), int(e["size"]), str((e.get("lfs") or {}).get("oid") or e.get("oid") or ""))
            for e in entries
            if e.get("type") == "file"
        )
        return select_parquet(key, found, self._location, suffixes)

    # -- ranged reads ------------------------------------------------------------------

    def read_range(self, file: FileStat, offset: int, length: int) -> bytes:
        from huggingface_hub.utils._http import get_session

        check_range(file, offset, length)
        if length == 0:
            return b""
        end = offset + length - 1
        rng = {"Range": f"bytes={offset}-{end}", "Accept-Encoding": "identity"}
        deadline = self.connect_timeout + self.read_timeout + length / (1 << 20)

        def attempt() -> bytes:
            cdn = self._cdn.get(file.location)
            fresh = cdn is not None and time.monotonic() < cdn[1]
            url, headers = (cdn[0], rng) if cdn is not None and fresh else (file.location, self._headers(rng))
            try:
                answer = ranged.get(
                    get_session(),
                    url,
                    headers,
                    connect_timeout=self.connect_timeout,
                    read_timeout=self.read_timeout,
                    deadline=deadline,
                    file=file,
                    hint=_HINT,
                    want=(offset, length),
                )
            except Fatal as e:
                if url == file.location:
                    raise
                # The CDN's signed link expired (403) or its object went (404): ask the Hub again.
                self._cdn.pop(file.location, None)
                msg = f"the CDN link of the file failed ({e}); asking the Hub again"
                raise Transient(msg) from e
            if url == file.location:
                self._check_identity(answer, file)
                if answer.history:
                    # The Hub redirects every read of an LFS or Xet file to its CDN, whose signed link
                    # names the content: later reads go there straight (one request a row group).
                    self._cdn[file.location] = (answer.url, time.monotonic() + _CDN_TTL)
            return check_body(answer.body, offset, length)

        what = f"{file.location}: reading bytes [{offset}, {offset + length})"
        first = self._first_read(file.location)
        try:
            data: bytes = self._retrier.run(what, attempt, location=file.location)
        finally:
            if first is not None:
                with self._lock:
                    self._pending.pop(file.location, None)
                first.set()
        return data

    def _first_read(self, location: str) -> threading.Event | None:
        """Whether this read is the file's first (its event, set when done), else None once the first is done.

        Reads of one file start together (a window's row groups): without this, each would
        ask the Hub for the redirect. The first asks; the others wait for it (up to the read
        timeout), then use its CDN link, or ask themselves if it found none.
        """
        with self._lock:
            if location in self._cdn:
                return None
            first = self._pending.get(location)
            if first is None:
                first = self._pending[location] = threading.Event()
                return first
        first.wait(self.read_timeout)
        return None

    def _check_identity(self, answer: ranged.Answer, file: FileStat) -> None:
        """The Hub's own answer (before any redirect) names the pinned commit and the listed content hash."""
        hub = answer.history[0].headers if answer.history else answer.headers
        commit = str(hub.get("X-Repo-Commit") or "")
        etag = str(hub.get("X-Linked-Etag") or ("" if answer.history else hub.get("ETag") or ""))
        etag = etag.removeprefix("W/").strip('"')
        if commit and commit != self.commit:
            msg = f"the Hub answered commit {commit} for a read pinned to {self.commit}; check the endpoint"
            raise Changed(msg, location=file.location)
        if file.version and etag and etag != file.version:
            msg = (
                f"the file changed after it was indexed: its hash is {etag}, not {file.version} (the "
                "commit's history was rewritten?); restore it, or start a new run (the index is rebuilt "
                "on the next start)"
            )
            raise Changed(msg, location=file.location)

    # -- other readers of the same files -------------------------------------------------

    def polars_options(self) -> dict[str, str]:
        """Polars reads the resolve URLs over HTTP: no options (a token, when there is one, cannot be passed)."""
        return {}

    def duckdb_filesystem(self) -> Any:
        """huggingface_hub's ``HfFileSystem`` at this endpoint with this token (``read_parquet('hf://...')``)."""
        from huggingface_hub import HfFileSystem

        return HfFileSystem(endpoint=self.endpoint, token=self._token, skip_instance_cache=True)


_HINT = (
    "check the repository name and revision, and the token (HF_TOKEN or storage_options token): a private or "
    "gated repository needs one with access"
)


def _transient(e: BaseException) -> bool:
    """Whether another attempt may succeed: not with ``HF_HUB_OFFLINE`` set (huggingface_hub then sends nothing)."""
    from huggingface_hub.errors import OfflineModeIsEnabled

    return ranged.transient(e) and not isinstance(e, OfflineModeIsEnabled)


def _next_link(header: str) -> str | None:
    """The ``rel="next"`` URL of a ``Link`` header (the Hub's pagination, GitHub's format), None if none."""
    for part in header.split(","):
        target, _, params = part.partition(";")
        if re.search(r'rel="?next"?', params):
            return target.strip().strip("<>")
    return None
