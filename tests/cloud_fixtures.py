"""Real GCS and Azure servers on loopback: gcp-storage-emulator and Azurite, each in its own process.

* :class:`GCSEmulator` runs ``gcp-storage-emulator`` (PyPI, in memory) on a free
  port of 127.0.0.1 and creates a bucket with one POST to ``/storage/v1/b``.
* :class:`Azurite` runs ``azurite-blob`` (npm) on a free port of 127.0.0.1 with its
  data in a temporary folder; the account is Azurite's documented development
  account (``devstoreaccount1`` and its published key, no secret).

Azurite is found as ``$PLITZER_AZURITE``, else ``azurite-blob`` on ``PATH``, else
``node_modules/.bin/azurite-blob`` below the checkout, else the tests install it
themselves: where ``npm`` exists, ``npm install azurite@AZURITE_VERSION`` into the
user's cache folder (``$XDG_CACHE_HOME/plitzer-tests``, default ``~/.cache``), once
for every later run, under a file lock so that parallel test processes install it
once. Only where npm (or node) is missing do the Azure tests skip, saying so in the
summary line; under CI (``CI`` set) they fail instead.

The session fixtures ``gcs`` and ``azure`` start each server once and upload the
same generated dataset as tests/s3_fixtures.py's ``s3``.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import SynthDataset
from tests.s3_fixtures import HOST, free_port

# Azurite's documented development account (https://learn.microsoft.com: "Use the Azurite
# emulator"): a well-known public key, not a secret.
AZ_ACCOUNT = "devstoreaccount1"
AZ_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
GCS_PROJECT = "plitzer-test"
_AZURITE_FLAGS = ("--silent", "--skipApiVersionCheck", "--disableTelemetry")
AZURITE_VERSION = "3.35.0"


def _missing(what: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{what} (CI installs it: see .ci/run)")
    pytest.skip(what)


def _wait(url: str, proc: subprocess.Popen[bytes], name: str) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except urllib.error.HTTPError:
            return  # it answers
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                _stop(proc)
                msg = f"{name} did not start on {url}"
                raise RuntimeError(msg) from None
            time.sleep(0.1)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


class GCSEmulator:
    """gcp-storage-emulator in its own process on 127.0.0.1 (in memory)."""

    def __init__(self) -> None:
        try:
            import gcp_storage_emulator  # noqa: F401

            from planner.stores.gcs import import_gcsfs

            import_gcsfs()  # (with its bucket-type probe off: see planner/stores/gcs.py)
        except ImportError:
            _missing("gcp-storage-emulator or gcsfs is not installed (pip install 'plitzer[test]')")
        self.port = free_port()
        self.endpoint = f"http://{HOST}:{self.port}"
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gcp_storage_emulator",
                "start",
                "--host",
                HOST,
                "--port",
                str(self.port),
                "-M",
                "-q",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _wait(f"{self.endpoint}/storage/v1/b?project={GCS_PROJECT}", self.proc, "gcp-storage-emulator")

    def create_bucket(self, name: str) -> None:
        req = urllib.request.Request(
            f"{self.endpoint}/storage/v1/b?project={GCS_PROJECT}",
            data=json.dumps({"name": name}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=10):
            pass

    def options(self, **extra: Any) -> dict[str, Any]:
        return {"endpoint_url": self.endpoint, "token": "anon", "project": GCS_PROJECT, **extra}

    def fs(self) -> Any:
        from planner.stores.gcs import import_gcsfs

        return import_gcsfs().GCSFileSystem(skip_instance_cache=True, **self.options())

    def stop(self) -> None:
        _stop(self.proc)


def azurite_binary() -> str | None:
    """Azurite's ``azurite-blob``: given, on PATH, in the checkout, or installed here by npm (once)."""
    env = os.environ.get("PLITZER_AZURITE")
    if env:
        return env
    found = shutil.which("azurite-blob")
    if found:
        return found
    local = Path(__file__).resolve().parent.parent / "node_modules" / ".bin" / "azurite-blob"
    if local.exists():
        return str(local)
    return _install_azurite()


def _install_azurite() -> str | None:
    """``npm install azurite`` into the user's cache folder, once, under a lock; None without npm."""
    npm = shutil.which("npm")
    if npm is None:
        return None
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "plitzer-tests"
    prefix = cache / f"azurite-{AZURITE_VERSION}"
    binary = prefix / "node_modules" / ".bin" / "azurite-blob"
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / "azurite.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # parallel test workers: one installs, the others wait
        if not binary.exists():
            done = subprocess.run(
                [
                    npm,
                    "install",
                    "--prefix",
                    str(prefix),
                    "--no-audit",
                    "--no-fund",
                    "--loglevel=error",
                    f"azurite@{AZURITE_VERSION}",
                ],
                capture_output=True,
                text=True,
                timeout=600,
                check=False,
            )
            if done.returncode != 0 or not binary.exists():
                _missing(f"npm install azurite@{AZURITE_VERSION} failed: {done.stderr.strip()[-500:]}")
    return str(binary)


class Azurite:
    """azurite-blob in its own process on 127.0.0.1, its data in a temporary folder."""

    def __init__(self) -> None:
        try:
            import adlfs  # noqa: F401
        except ImportError:
            _missing("adlfs is not installed (pip install 'plitzer[test]')")
        binary = azurite_binary()
        if binary is None or shutil.which("node") is None:
            _missing("Azurite is not installed and npm is missing (install Node.js and npm, or set PLITZER_AZURITE)")
        assert binary is not None
        self.port = free_port()
        self.endpoint = f"http://{HOST}:{self.port}/{AZ_ACCOUNT}"
        self.folder = tempfile.mkdtemp(prefix="plitzer-azurite-")
        self.proc = subprocess.Popen(
            [binary, "--blobHost", HOST, "--blobPort", str(self.port), "--location", self.folder, *_AZURITE_FLAGS],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _wait(f"{self.endpoint}?comp=list", self.proc, "Azurite")

    @property
    def connection_string(self) -> str:
        return (
            f"DefaultEndpointsProtocol=http;AccountName={AZ_ACCOUNT};AccountKey={AZ_KEY};BlobEndpoint={self.endpoint};"
        )

    def options(self, **extra: Any) -> dict[str, Any]:
        return {"connection_string": self.connection_string, **extra}

    def fs(self) -> Any:
        import adlfs

        return adlfs.AzureBlobFileSystem(skip_instance_cache=True, **self.options())

    def stop(self) -> None:
        _stop(self.proc)
        shutil.rmtree(self.folder, ignore_errors=True)


@dataclass
class CloudData:
    """A server, its bucket (container), and the generated dataset uploaded under ``synth/``."""

    server: GCSEmulator | Azurite
    scheme: str
    bucket: str
    local: dict[str, Path] = field(default_factory=dict)
    url: dict[str, str] = field(default_factory=dict)

    def options(self, **extra: Any) -> dict[str, Any]:
        return self.server.options(**extra)

    def fs(self) -> Any:
        return self.server.fs()

    def put(self, key: str, data: bytes) -> None:
        self.fs().pipe_file(f"{self.bucket}/{key}", data)

    def delete(self, key: str) -> None:
        self.fs().rm_file(f"{self.bucket}/{key}")

    def upload(self, local: Path, prefix: str) -> str:
        fs = self.fs()
        for p in sorted(local.rglob("*.parquet")):
            fs.pipe_file(f"{self.bucket}/{prefix}/{p.relative_to(local).as_posix()}", p.read_bytes())
        return f"{self.scheme}://{self.bucket}/{prefix}"


def _synth(synth_dataset: SynthDataset) -> Path:
    # The same dataset as tests/s3_fixtures.py's s3 fixture.
    return synth_dataset(tokens=200_000, seed=11, docs_per_row_group=50, row_groups_per_file=4, mean_length=200)


@pytest.fixture(scope="session")
def gcs(synth_dataset: SynthDataset) -> Iterator[CloudData]:
    """gcp-storage-emulator with bucket ``plitzer`` holding ``synth/`` (five files)."""
    server = GCSEmulator()
    try:
        server.create_bucket("plitzer")
        data = CloudData(server=server, scheme="gs", bucket="plitzer")
        d = _synth(synth_dataset)
        data.local["synth"], data.url["synth"] = d, data.upload(d, "synth")
        yield data
    finally:
        server.stop()


@pytest.fixture(scope="session")
def azure(synth_dataset: SynthDataset) -> Iterator[CloudData]:
    """Azurite with container ``plitzer`` holding ``synth/`` (five files)."""
    server = Azurite()
    try:
        server.fs().mkdir("plitzer")
        data = CloudData(server=server, scheme="az", bucket="plitzer")
        d = _synth(synth_dataset)
        data.local["synth"], data.url["synth"] = d, data.upload(d, "synth")
        yield data
    finally:
        server.stop()
