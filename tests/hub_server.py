"""Two HTTP servers on loopback: the Hugging Face Hub's API as huggingface_hub uses it, and a static file server.

* :class:`HubServer` answers the endpoints that huggingface_hub 2.x calls (read in its
  source: ``hf_api.py``, ``file_download.py``, ``hf_file_system.py``):

  - ``GET /api/datasets/ORG/NAME/revision/REV``: the repository at a revision, with
    its commit as ``sha`` (``HfApi.dataset_info``, which ``HfFileSystem`` calls too);
  - ``GET /api/datasets/ORG/NAME/tree/REV[/PATH]?recursive=&expand=&limit=&cursor=``:
    the entries below PATH (files with ``oid``, ``size`` and, for Parquet, ``lfs``
    with its sha256; folders), a page at a time with the next page in a
    ``Link: <...>; rel="next"`` header (``HfApi.list_repo_tree``);
  - ``GET``/``HEAD /datasets/ORG/NAME/resolve/REV/PATH``: a Parquet (LFS) file is a
    302 to ``/cdn/SHA256`` carrying ``X-Repo-Commit``, ``X-Linked-Etag`` and
    ``X-Linked-Size``, as the Hub redirects to its CDN; other files are answered
    directly with ``ETag`` (the git blob id). The CDN honours ``Range``.

  Repositories keep their commits: :meth:`HubServer.commit` adds one and moves the
  branch (what a pinned reader must not notice); ``squash=True`` rewrites the
  history so that the earlier commits are gone (what it must refuse). A configurable
  fraction of requests is answered 429 with ``Retry-After`` (:class:`Throttling`:
  drawn from a hash of path, query, range and attempt, so the same requests are
  throttled every run); every request is logged.

* :class:`StaticServer` serves a folder with ``Range``, ``ETag`` (or only
  ``Last-Modified``), ``If-Match`` / ``If-Unmodified-Since`` (412 when the file
  changed) and, for a ``manifest.txt`` that is not a file, the paths of the files
  below its folder, one a line; it can be told to ignore ``Range`` or refuse ``HEAD``.

Both are ``ThreadingHTTPServer`` in a daemon thread on 127.0.0.1 (never another
address), started once per session by the fixtures ``hub`` and ``web`` at the end.
"""

from __future__ import annotations

import email.utils
import hashlib
import json
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote

import pytest

from tests.conftest import SynthDataset

HOST = "127.0.0.1"
REPO = "plitzer/synth"
TOKEN = "hf_plitzer_test_token"


@dataclass
class Logged:
    method: str
    path: str
    query: str
    range: str | None
    status: int = 0
    fault: str | None = None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Throttling:
    """429 with Retry-After for a fraction of requests, drawn from a hash of (seed, path, query, range, attempt)."""

    seed: int
    rate: float = 0.2
    retry_after: str = "0"
    max_in_a_row: int = 3
    status: int = 429

    def __call__(self, req: Logged, attempt: int) -> str | None:
        if attempt >= self.max_in_a_row:
            return None
        h = hashlib.sha256(f"{self.seed}|{req.path}|{req.query}|{req.range}|{attempt}".encode()).digest()
        return str(self.status) if int.from_bytes(h[:8], "little") / 2**64 < self.rate else None


def _byte_range(header: str | None, size: int) -> tuple[int, int] | None:
    """(start, end inclusive) of a ``bytes=`` Range header, None for none or one not satisfiable."""
    if not header or not header.startswith("bytes="):
        return None
    first, _, last = header[len("bytes=") :].partition("-")
    if not first:
        n = int(last)
        return (max(0, size - n), size - 1) if n else None
    start = int(first)
    end = min(int(last), size - 1) if last else size - 1
    return (start, end) if start <= end and start < size else None


class _Base(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        super().__init__((HOST, 0), handler)
        self.port = int(self.server_address[1])
        self.endpoint = f"http://{HOST}:{self.port}"
        self.lock = threading.Lock()
        self.log: list[Logged] = []
        self.schedule: Any = None
        self._attempts: dict[tuple[str, str, str | None], int] = {}
        self._thread = threading.Thread(target=self.serve_forever, name=type(self).__name__, daemon=True)
        self._thread.start()

    def reset(self, schedule: Any = None) -> None:
        with self.lock:
            self.schedule, self.log, self._attempts = schedule, [], {}

    def requests(self) -> list[Logged]:
        with self.lock:
            return list(self.log)

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
        self._thread.join(10)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Base

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _begin(self) -> Logged | None:
        """Log the request; answer it with a throttle and return None if the schedule says so."""
        path, _, query = self.path.partition("?")
        req = Logged(
            self.command,
            path,
            query,
            self.headers.get("Range"),
            headers={k.lower(): v for k, v in self.headers.items()},
        )
        with self.server.lock:
            ident = (req.path, req.query, req.range)
            attempt = self.server._attempts.get(ident, 0)
            self.server._attempts[ident] = attempt + 1
            req.fault = self.server.schedule(req, attempt) if self.server.schedule else None
            self.server.log.append(req)
        if req.fault:
            body = json.dumps({"error": "You are sending requests too fast: slow down"}).encode()
            self._send(int(req.fault), body, {"Retry-After": getattr(self.server.schedule, "retry_after", "0")}, req)
            return None
        return req

    def _send(
        self, status: int, body: bytes, headers: dict[str, str], req: Logged | None, content_type: str = ""
    ) -> None:
        if req is not None:
            req.status = status
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        if content_type:
            self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, status: int, text: str, req: Logged | None, code: str = "") -> None:
        headers = {"X-Error-Code": code} if code else {}
        self._send(status, json.dumps({"error": text}).encode(), headers, req, "application/json")

    def _ranged(
        self, data: bytes, headers: dict[str, str], req: Logged, *, honour_range: bool = True, check: bool = True
    ) -> None:
        """``data`` whole (200) or the requested range (206), 416 for a range past the end."""
        rng = self.headers.get("Range") if honour_range else None
        if rng is None:
            # A server that ignores Range says nothing about it, as many do.
            self._send(200, data, {**headers, "Accept-Ranges": "bytes"} if honour_range else headers, req)
            return
        span = _byte_range(rng, len(data))
        if span is None:
            self._send(416, b"", {**headers, "Content-Range": f"bytes */{len(data)}"}, req)
            return
        start, end = span
        rh = {**headers, "Content-Range": f"bytes {start}-{end}/{len(data)}", "Accept-Ranges": "bytes"}
        self._send(206, data[start : end + 1], rh, req)


# -- the Hub ---------------------------------------------------------------------------


@dataclass
class Commit:
    sha: str
    files: dict[str, bytes]


@dataclass
class Repo:
    commits: list[Commit] = field(default_factory=list)
    refs: dict[str, str] = field(default_factory=dict)

    def at(self, revision: str) -> Commit | None:
        sha = self.refs.get(revision, revision)
        return next((c for c in self.commits if c.sha == sha), None)


def _blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _lfs(path: str) -> bool:
    return path.endswith(".parquet")


class HubServer(_Base):
    """The Hub's HTTP API on loopback (module docstring)."""

    def __init__(self, token: str | None = None) -> None:
        self.repos: dict[str, Repo] = {}
        self.token = token
        self.blobs: dict[str, bytes] = {}  # sha256 -> bytes: what the CDN serves
        self._n = 0
        super().__init__(_HubHandler)

    def commit(
        self,
        repo: str,
        put: dict[str, bytes] | None = None,
        delete: tuple[str, ...] = (),
        *,
        branch: str = "main",
        squash: bool = False,
    ) -> str:
        """A new commit on ``branch`` adding ``put`` and removing ``delete``; ``squash`` drops the history."""
        with self.lock:
            r = self.repos.setdefault(repo, Repo())
            head = r.at(branch)
            files = dict(head.files) if head else {}
            for k in delete:
                files.pop(k, None)
            files.update(put or {})
            for data in files.values():
                self.blobs[hashlib.sha256(data).hexdigest()] = data
            self._n += 1
            sha = hashlib.sha1(f"{repo}|{self._n}|{sorted(files)}".encode()).hexdigest()
            if squash:
                r.commits = []
                r.refs = {}
            r.commits.append(Commit(sha, files))
            r.refs[branch] = sha
            if squash:  # and the CDN drops what no commit holds any more (LFS garbage collection)
                kept = {
                    hashlib.sha256(d).hexdigest()
                    for rr in self.repos.values()
                    for c in rr.commits
                    for d in c.files.values()
                }
                self.blobs = {k: v for k, v in self.blobs.items() if k in kept}
            return sha

    def head(self, repo: str, branch: str = "main") -> str:
        with self.lock:
            return self.repos[repo].refs[branch]


class _HubHandler(_Handler):
    server: HubServer

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        req = self._begin()
        if req is None:
            return
        if self.server.token and self.headers.get("Authorization") != f"Bearer {self.server.token}":
            self._error(401, "Invalid credentials in Authorization header", req)
            return
        parts = req.path.split("/")
        if req.path.startswith("/cdn/"):
            self._cdn(req, parts[2])
        elif req.path.startswith("/api/datasets/") and len(parts) >= 7:
            repo, kind, rest = f"{parts[3]}/{parts[4]}", parts[5], parts[6:]
            if kind == "revision":
                self._revision(req, repo, unquote("/".join(rest)))
            elif kind == "tree":
                self._tree(req, repo, unquote(rest[0]), unquote("/".join(rest[1:])))
            else:
                self._error(404, f"no route {req.path}", req)
        elif req.path.startswith("/datasets/") and len(parts) >= 7 and parts[4] == "resolve":
            self._resolve(req, f"{parts[2]}/{parts[3]}", unquote(parts[5]), unquote("/".join(parts[6:])))
        else:
            self._error(404, f"no route {req.path}", req)

    def _commit(self, req: Logged, repo: str, revision: str) -> Commit | None:
        with self.server.lock:
            r = self.server.repos.get(repo)
            c = r.at(revision) if r else None
        if r is None:
            self._error(401, "Repository Not Found", req, "RepoNotFound")  # as the Hub: 401 without a token
        elif c is None:
            self._error(404, f"Invalid rev id: {revision}", req, "RevisionNotFound")
        return c

    def _revision(self, req: Logged, repo: str, revision: str) -> None:
        c = self._commit(req, repo, revision)
        if c is None:
            return
        siblings = [{"rfilename": p} for p in sorted(c.files)]
        body = json.dumps({"id": repo, "sha": c.sha, "private": False, "siblings": siblings}).encode()
        self._send(200, body, {}, req, "application/json")

    def _tree(self, req: Logged, repo: str, revision: str, folder: str) -> None:
        c = self._commit(req, repo, revision)
        if c is None:
            return
        q = {k: v[-1] for k, v in parse_qs(req.query).items()}
        recursive = q.get("recursive", "false").lower() in ("true", "1")
        prefix = folder + "/" if folder else ""
        below = sorted(p for p in c.files if p.startswith(prefix))
        if folder and not below:
            self._error(404, f"Entry not found: {folder}", req, "EntryNotFound")
            return
        entries: list[dict[str, Any]] = []
        dirs: set[str] = set()
        for p in below:
            rest = p[len(prefix) :].split("/")
            for i in range(1, len(rest)):  # folders on the way
                d = prefix + "/".join(rest[:i])
                if d not in dirs and (recursive or i == 1):
                    dirs.add(d)
                    entries.append({"type": "directory", "oid": _blob_id(d.encode()), "size": 0, "path": d})
            if len(rest) == 1 or recursive:
                data = c.files[p]
                e: dict[str, Any] = {"type": "file", "oid": _blob_id(data), "size": len(data), "path": p}
                if _lfs(p):
                    e["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
                entries.append(e)
        limit = max(1, min(1000, int(q.get("limit", "1000"))))
        start = int(q.get("cursor", "0"))
        page = entries[start : start + limit]
        headers = {}
        if start + limit < len(entries):
            base = f"http://{self.headers.get('Host')}{req.path}"
            args = "&".join(f"{k}={quote(v)}" for k, v in q.items() if k != "cursor")
            headers["Link"] = f'<{base}?{args}&cursor={start + limit}>; rel="next"'
        self._send(200, json.dumps(page).encode(), headers, req, "application/json")

    def _resolve(self, req: Logged, repo: str, revision: str, path: str) -> None:
        c = self._commit(req, repo, revision)
        if c is None:
            return
        data = c.files.get(path)
        if data is None:
            self._error(404, f"Entry not found: {path}", req, "EntryNotFound")
            return
        ident = {"X-Repo-Commit": c.sha}
        if _lfs(path):
            sha = hashlib.sha256(data).hexdigest()
            ident |= {
                "X-Linked-Etag": f'"{sha}"',
                "X-Linked-Size": str(len(data)),
                "ETag": f'"{_blob_id(data)}"',
                "Location": f"http://{self.headers.get('Host')}/cdn/{sha}?expires=3600",
            }
            self._send(302, b"", ident, req)
            return
        self._ranged(data, {**ident, "ETag": f'"{_blob_id(data)}"'}, req)

    def _cdn(self, req: Logged, sha: str) -> None:
        with self.server.lock:
            data = self.server.blobs.get(sha)
        if data is None:
            self._error(404, "NoSuchKey", req)
            return
        self._ranged(data, {"ETag": f'"{hashlib.md5(data).hexdigest()}"'}, req)


# -- a static server ---------------------------------------------------------------------


class StaticServer(_Base):
    """A folder over HTTP with Range and ETag or Last-Modified (module docstring)."""

    def __init__(self, root: Path, *, ranges: bool = True, etag: bool = True, head: bool = True) -> None:
        self.root = root
        self.ranges = ranges
        self.etag = etag
        self.head = head  # False: HEAD is answered 405, as by a link signed for GET only
        super().__init__(_StaticHandler)


class _StaticHandler(_Handler):
    server: StaticServer

    def do_HEAD(self) -> None:
        if not self.server.head:
            req = self._begin()
            if req is not None:
                self._error(405, "Method Not Allowed", req)
            return
        self.do_GET()

    def do_GET(self) -> None:
        req = self._begin()
        if req is None:
            return
        rel = unquote(req.path).lstrip("/")
        p = (self.server.root / rel).resolve()
        if not p.is_relative_to(self.server.root.resolve()):
            self._error(403, "outside the root", req)
            return
        if not p.is_file() and p.name == "manifest.txt" and p.parent.is_dir():
            lines = sorted(q.relative_to(p.parent).as_posix() for q in p.parent.rglob("*") if q.is_file())
            body = ("# generated by the test server\n" + "\n".join(lines) + "\n").encode()
            self._send(200, body, {}, req, "text/plain")
            return
        if not p.is_file():
            self._error(404, "Not Found", req)
            return
        data = p.read_bytes()
        st = p.stat()
        modified = email.utils.formatdate(st.st_mtime, usegmt=True)
        headers = {"Last-Modified": modified}
        tag = f'"{hashlib.sha256(data).hexdigest()[:32]}"'
        if self.server.etag:
            headers["ETag"] = tag
        match = self.headers.get("If-Match")
        unmodified = self.headers.get("If-Unmodified-Since")
        if (match and match != tag) or (unmodified and unmodified != modified):
            self._send(412, b"", headers, req)
            return
        self._ranged(data, headers, req, honour_range=self.server.ranges)


# -- fixtures ---------------------------------------------------------------------------


@dataclass
class HubData:
    """The Hub server, its repository ``plitzer/synth`` (``synth/`` holding the session's dataset)."""

    server: HubServer
    local: Path
    url: str  # hf://datasets/plitzer/synth/synth
    commit: str

    def options(self, **extra: Any) -> dict[str, Any]:
        return {"endpoint": self.server.endpoint, **extra}


@dataclass
class WebData:
    """The static server, with the session's dataset under ``synth/`` and its manifest."""

    server: StaticServer
    root: Path
    local: Path
    url: str  # the manifest's URL

    def options(self, **extra: Any) -> dict[str, Any] | None:
        return dict(extra) or None


def synth(synth_dataset: SynthDataset) -> Path:
    # The same dataset as tests/s3_fixtures.py's s3 fixture.
    return synth_dataset(tokens=200_000, seed=11, docs_per_row_group=50, row_groups_per_file=4, mean_length=200)


def files_of(local: Path, prefix: str) -> dict[str, bytes]:
    return {f"{prefix}/{p.relative_to(local).as_posix()}": p.read_bytes() for p in sorted(local.rglob("*.parquet"))}


@pytest.fixture(scope="session")
def hub(synth_dataset: SynthDataset) -> Iterator[HubData]:
    """The Hub on loopback with dataset repository ``plitzer/synth`` holding ``synth/`` (five files) and a README."""
    server = HubServer()
    try:
        d = synth(synth_dataset)
        commit = server.commit(REPO, {"README.md": b"# synth\n", **files_of(d, "synth")})
        yield HubData(server=server, local=d, url=f"hf://datasets/{REPO}/synth", commit=commit)
    finally:
        server.stop()


@pytest.fixture(scope="session")
def web(synth_dataset: SynthDataset, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebData]:
    """A static server whose root holds ``synth/`` (five files); its URL is ``synth/manifest.txt``."""
    root = tmp_path_factory.mktemp("web")
    d = synth(synth_dataset)
    for key, data in files_of(d, "synth").items():
        (root / key).parent.mkdir(parents=True, exist_ok=True)
        (root / key).write_bytes(data)
    server = StaticServer(root)
    try:
        yield WebData(server=server, root=root, local=d, url=f"{server.endpoint}/synth/manifest.txt")
    finally:
        server.stop()


def hf_env_clean() -> dict[str, str]:
    """The environment without HF_* variables that would reach another Hub."""
    return {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
