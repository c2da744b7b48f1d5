"""One storage suite, run against every backend: local disk, S3, GCS, Azure, the Hub and HTTP.

S3 is moto's server, GCS is gcp-storage-emulator, Azure is Azurite, each a real
server in its own process on loopback, started once per session
(tests/s3_fixtures.py, tests/cloud_fixtures.py); the Hugging Face Hub and a static
HTTP server are loopback servers in this process (tests/hub_server.py). On the Hub a
source is pinned to a commit, so the suite's "replace" and "delete" rewrite the
repository's history (the pinned commit is gone); a plain commit that moves the
branch is what tests/stores/test_hub.py shows a pinned reader never notices. fsspec's shared abstract tests
are the model: each test below runs for each store, through the public
:class:`planner.stores.storage.Storage` interface and the loader.

Also here: a list source that mixes stores reads each file through its own
storage (``Index.storage(f)``), for Polars scans, DuckDB and the loader's threads.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import planner
import plitzer
from planner.errors import FileChangedError, StorageError
from planner.stores.backends import open_storages
from planner.stores.s3 import S3Storage
from planner.stores.storage import LocalStorage, Storage
from plitzer.state.settings import default_threads
from tests.cloud_fixtures import CloudData, azure, gcs
from tests.conftest import tokens_of
from tests.hub_server import HubData, WebData, hub, web
from tests.s3_fixtures import S3Data, s3

__all__ = ["azure", "gcs", "hub", "s3", "web"]  # the fixtures, imported for pytest

SETTINGS = {"lanes": 8, "window": 3, "world": 2}
CFG = {"seed": 7, "lanes": 8, "window": 3, "seq_len": 96}
STORES = ("local", "s3", "gcs", "azure", "hf", "http")
SUITE_REPO = "plitzer/suite"  # the suite's own Hub repository (its history is rewritten)


@dataclass
class Store:
    """One backend as the suite sees it: where a prefix lives, how to write and remove objects."""

    name: str
    root: str  # URL (or folder) that prefixes live below
    synth: str  # the session's generated dataset there
    local_synth: Path
    options: Callable[..., dict[str, Any] | None]
    put: Callable[[str, bytes], None]
    delete: Callable[[str], None]
    manifest: bool = False  # HTTP: a folder is read through its manifest.txt

    def url(self, prefix: str) -> str:
        if self.manifest and not prefix.endswith(".parquet"):
            return f"{self.root}/{prefix}/manifest.txt"
        return f"{self.root}/{prefix}"

    def upload(self, local: Path, prefix: str) -> str:
        for p in sorted(local.rglob("*.parquet")):
            self.put(f"{prefix}/{p.relative_to(local).as_posix()}", p.read_bytes())
        return self.url(prefix)

    def open(self, url: str, **extra: Any) -> Storage:
        (st,) = open_storages(url, self.options(**extra))
        return st


def _local_store(tmp: Path, synth: Path) -> Store:
    def put(key: str, data: bytes) -> None:
        p = tmp / key
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)

    return Store("local", str(tmp), str(synth), synth, lambda **_: None, put, lambda key: (tmp / key).unlink())


def _s3_store(s3: S3Data) -> Store:
    client = s3.client()
    return Store(
        "s3",
        f"s3://{s3.bucket}",
        s3.url["synth"],
        s3.local["synth"],
        s3.options,
        lambda key, data: client.put_object(Bucket=s3.bucket, Key=key, Body=data),
        lambda key: client.delete_object(Bucket=s3.bucket, Key=key),
    )


def _cloud_store(name: str, data: CloudData) -> Store:
    return Store(
        name,
        f"{data.scheme}://{data.bucket}",
        data.url["synth"],
        data.local["synth"],
        data.options,
        data.put,
        data.delete,
    )


def _hub_store(hub: HubData) -> Store:
    server = hub.server

    def put(key: str, data: bytes) -> None:
        server.commit(SUITE_REPO, {key: data}, squash=True)

    def delete(key: str) -> None:
        server.commit(SUITE_REPO, delete=(key,), squash=True)

    return Store("hf", f"hf://datasets/{SUITE_REPO}", hub.url, hub.local, hub.options, put, delete)


def _web_store(web: WebData) -> Store:
    def put(key: str, data: bytes) -> None:
        p = web.root / key
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)

    def delete(key: str) -> None:
        (web.root / key).unlink()

    return Store("http", web.server.endpoint, web.url, web.local, web.options, put, delete, manifest=True)


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Store:
    name = request.param
    if name == "local":
        synth = request.getfixturevalue("s3").local["synth"]
        return _local_store(tmp_path_factory.mktemp("store"), synth)
    if name == "s3":
        return _s3_store(request.getfixturevalue("s3"))
    if name == "hf":
        return _hub_store(request.getfixturevalue("hub"))
    if name == "http":
        return _web_store(request.getfixturevalue("web"))
    return _cloud_store(name, request.getfixturevalue(name))


_counter = iter(range(1_000_000))


def _fresh(store: Store) -> str:
    """A prefix no other test of this session wrote."""
    return f"t{next(_counter)}-{os.getpid()}"


# -- the suite ---------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_listing_is_complete_ordered_and_paged(store: Store) -> None:
    prefix = _fresh(store)
    keys = [f"d{i % 3}/{'B' if i % 2 else 'a'}{i:03d}.parquet" for i in range(11)]
    for i, k in enumerate(keys):
        store.put(f"{prefix}/{k}", bytes([i]) * (i + 1))
    store.put(f"{prefix}/notes.txt", b"not parquet")
    store.put(f"{prefix}-sibling/x.parquet", b"outside the prefix")
    st = store.open(store.url(prefix), list_page_size=3) if store.name != "local" else store.open(store.url(prefix))
    files = st.list_files()
    assert [f.name for f in files] == sorted(keys, key=str.encode)
    assert [f.size for f in files] == [keys.index(f.name) + 1 for f in files]
    assert all(f.version for f in files)
    assert all(f.location.endswith(f"{prefix}/{f.name}") for f in files)
    # One object is a source named by its base name, like a local file.
    (one,) = store.open(store.url(f"{prefix}/{keys[4]}")).list_files()
    assert one.name == keys[4].rsplit("/", 1)[1] and one.size == 5
    assert st.retries == 0


@pytest.mark.timeout(60)
def test_ranged_reads_are_exact_and_checked(store: Store) -> None:
    prefix = _fresh(store)
    data = bytes(range(256)) * 40
    store.put(f"{prefix}/blob.parquet", data)
    st = store.open(store.url(prefix))
    (f,) = st.list_files()
    for offset, length in ((0, 4), (5, 1000), (len(data) - 8, 8), (1234, 0), (0, len(data))):
        assert st.read_range(f, offset, length) == data[offset : offset + length]
    with pytest.raises(StorageError, match=r"lies outside the file's 10240 bytes"):
        st.read_range(f, len(data) - 4, 8)


@pytest.mark.timeout(60)
def test_a_missing_object_is_a_clear_storage_error(store: Store) -> None:
    prefix = _fresh(store)
    store.put(f"{prefix}/gone.parquet", b"x" * 100)
    st = store.open(store.url(prefix), attempts=2) if store.name != "local" else store.open(store.url(prefix))
    (f,) = st.list_files()
    store.delete(f"{prefix}/gone.parquet")
    with pytest.raises(StorageError) as err:
        st.read_range(f, 0, 10)
    assert f.location in str(err.value)
    assert "disappeared" in str(err.value) or "cannot open" in str(err.value)
    assert isinstance(err.value, OSError)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("same_size", [False, True])
def test_a_changed_object_is_refused(store: Store, same_size: bool) -> None:
    if same_size and store.name == "gcs":
        pytest.skip(
            "gcp-storage-emulator ignores ifGenerationMatch and sends no x-goog-generation, "
            "so a same-size replacement is only seen by real GCS (412); a new size is tested"
        )
    prefix = _fresh(store)
    store.put(f"{prefix}/f.parquet", b"a" * 1000)
    st = store.open(store.url(prefix))
    (f,) = st.list_files()
    assert st.read_range(f, 10, 10) == b"a" * 10
    if store.name == "local":
        os.utime(f.location, ns=(1, 1))  # a rewrite in the same nanosecond is not a change we can see
    store.put(f"{prefix}/f.parquet", b"b" * (1000 if same_size else 1200))
    with pytest.raises(FileChangedError, match="changed after it was indexed") as err:
        st.read_range(f, 10, 10)
    assert isinstance(err.value, StorageError) and isinstance(err.value, OSError)
    assert f.location in str(err.value) and err.value.file == f.location


@pytest.mark.timeout(60)
def test_the_index_cache_follows_the_version(store: Store, tmp_path: Path) -> None:
    """A replaced object is indexed anew on the next start, never served from the cache."""
    from tests.conftest import write_dataset

    prefix = _fresh(store)
    (a,) = write_dataset(tmp_path / "a", [[[[1, 2, 3], [4]]]])  # one row group of two documents
    (b,) = write_dataset(tmp_path / "b", [[[[1, 2, 3, 5, 6]], [[7]]]])  # two row groups
    store.put(f"{prefix}/x.parquet", a.read_bytes())
    if store.name == "local":  # a rewrite in the same nanosecond would be no change we can see
        os.utime(store.url(f"{prefix}/x.parquet"), ns=(1, 1))
    first = planner.index(store.url(prefix), storage_options=store.options())
    assert (first.row_groups, first.tokens) == (1, 4)
    assert planner.index(store.url(prefix), storage_options=store.options()).fingerprint == first.fingerprint
    store.put(f"{prefix}/x.parquet", b.read_bytes())
    second = planner.index(store.url(prefix), storage_options=store.options())
    assert (second.row_groups, second.tokens) == (2, 6)
    assert second.files[0].version != first.files[0].version


@pytest.mark.timeout(120)
def test_same_batches_as_local_disk(store: Store) -> None:
    with (
        plitzer.Loader(store.local_synth, **CFG) as disk,
        plitzer.Loader(store.synth, storage_options=store.options(), **CFG) as remote,
    ):
        assert remote.index.fingerprint == disk.index.fingerprint
        assert remote.index.frame.equals(disk.index.frame)
        a = [tokens_of(b).copy() for b in disk]
        b = [tokens_of(b).copy() for b in remote]
        assert len(a) == len(b) > 0
        for t, (x, y) in enumerate(zip(a, b, strict=True)):
            assert x.tobytes() == y.tobytes(), f"step {t}"
        assert _without_revisions(remote.checkpoint()) == disk.checkpoint()
        assert remote.stats.retries == 0
    # Polars reaches the same files with the storage's options (plan.scan). Not on GCS:
    # Polars' object_store needs a Last-Modified header that gcp-storage-emulator does not send.
    if store.name != "gcs":
        remote_plan = planner.plan(store.synth, storage_options=store.options(), **SETTINGS)
        disk_plan = planner.plan(store.local_synth, **SETTINGS)
        assert remote_plan.scan(0, rank=1).collect().equals(disk_plan.scan(0, rank=1).collect())


def _without_revisions(state: bytes) -> bytes:
    """The checkpoint as disk writes it: a Hub source's also records its commit (revisions)."""
    from plitzer.state.checkpoint import State, decode, encode

    st = decode(state)
    return encode(State(config={**st.config, "revisions": []}, step=st.step, positions=st.positions))


@pytest.mark.timeout(120)
def test_a_checkpoint_moves_between_stores(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """Taken on each store, resumed on a copy in the next (S3 -> GCS -> Azure -> disk -> S3), any world size."""
    ring = [_s3_store(request.getfixturevalue("s3"))]
    ring += [_cloud_store(n, request.getfixturevalue(n)) for n in ("gcs", "azure")]
    ring.append(_local_store(tmp_path, ring[0].local_synth))
    steps_each, worlds = 9, (2, 1, 4, 2)
    with plitzer.Loader(ring[0].local_synth, **CFG) as ref:
        full = [tokens_of(ref.next_batch()).copy() for _ in range(steps_each * len(ring))]
    state: bytes | None = None
    t = 0
    for i, st in enumerate(ring):
        world = worlds[i]
        with contextlib.ExitStack() as stack:
            ranks = [
                stack.enter_context(plitzer.Loader(st.synth, storage_options=st.options(), world=world, rank=r, **CFG))
                for r in range(world)
            ]
            for ld in ranks:
                if state is not None:
                    ld.resume(state)
            for _ in range(steps_each):
                got = np.concatenate([tokens_of(ld.next_batch()) for ld in ranks])
                np.testing.assert_array_equal(got, full[t], err_msg=f"{st.name}, step {t}")
                t += 1
            state = plitzer.merge([ld.checkpoint() for ld in ranks])


def _through(name: str, request: pytest.FixtureRequest, proxy: Any, **extra: Any) -> tuple[str, Path, dict[str, Any]]:
    """(URL of the session's dataset, its local copy, options that reach it through ``proxy``)."""
    data = request.getfixturevalue(name)
    if name == "s3":
        from tests.s3_fixtures import options

        return data.url["synth"], data.local["synth"], options(proxy.endpoint, **extra)
    if name == "gcs":
        return data.url["synth"], data.local["synth"], data.options(endpoint_url=proxy.endpoint, **extra)
    conn = data.server.connection_string.replace(data.server.endpoint, f"{proxy.endpoint}/devstoreaccount1")
    return data.url["synth"], data.local["synth"], {"connection_string": conn, **extra}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ["s3", "gcs", "azure"])
def test_throttling_is_retried_to_the_same_batches_and_counted(
    name: str, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fifth of all requests (listing, footers, data) answered 503 or 429, on every object store."""
    from tests.s3_fixtures import FaultProxy, SeededFaults

    monkeypatch.setenv("PLITZER_CACHE", str(tmp_path / "cache"))  # footers fetched too
    server = request.getfixturevalue(name).server
    proxy = FaultProxy(server.port)
    try:
        proxy.reset(SeededFaults(seed=9, rate=0.2, kinds=("503", "429"), max_in_a_row=7, lists=True))
        url, local, opts = _through(name, request, proxy, attempts=8, backoff=0.01, read_timeout=20)
        with (
            plitzer.Loader(url, storage_options=opts, **CFG) as remote,
            plitzer.Loader(local, **CFG) as disk,
        ):
            a = [tokens_of(b).copy() for b in remote]
            b = [tokens_of(b).copy() for b in disk]
            ix = remote.index
            storages = {id(ix.storage(f)): ix.storage(f) for f in range(len(ix.files))}
        retries = remote.stats.retries  # once the loader's threads are joined: no retry still in flight
        throttled = [r for r in proxy.log() if r.fault]
    finally:
        proxy.stop()
    assert len(a) == len(b) > 0
    assert all(x.tobytes() == y.tobytes() for x, y in zip(a, b, strict=True))
    assert len(throttled) >= 5
    # Every throttled request retried once, and nothing else.
    assert retries == sum(s.retries for s in storages.values()) == len(throttled)
    (st,) = storages.values()
    assert st.throttle.cuts >= 1  # type: ignore[attr-defined]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ["s3", "gcs", "azure"])
def test_a_missing_bucket_is_a_clear_error(name: str, request: pytest.FixtureRequest) -> None:
    data = request.getfixturevalue(name)
    scheme = {"s3": "s3", "gcs": "gs", "azure": "az"}[name]
    (st,) = open_storages(f"{scheme}://no-such-bucket/x", data.options(attempts=2))
    with pytest.raises(StorageError, match=rf"{scheme}://no-such-bucket/x: listing: no such (bucket|container)") as err:
        st.list_files()
    # The secret keys (moto's test secret, Azurite's published key) are in no message.
    from tests.cloud_fixtures import AZ_KEY
    from tests.s3_fixtures import SECRET

    texts = [str(err.value), repr(err.value.__cause__), repr(st)]
    assert not [t for t in texts if SECRET in t or AZ_KEY in t]


# -- mixed list sources ---------------------------------------------------------------


def test_local_storage_needs_no_options(tmp_path: os.PathLike[str]) -> None:
    st = LocalStorage(tmp_path)
    assert st.polars_options() == {} and st.duckdb_filesystem() is None
    assert st.concurrency == (os.cpu_count() or 2)
    assert st.retries == 0


@pytest.mark.timeout(60)
@pytest.mark.parametrize("s3_first", [False, True])
def test_a_list_source_mixing_disk_and_s3_scans_each_file_with_its_own_storage(s3: S3Data, s3_first: bool) -> None:
    local, remote = s3.local["synth"], s3.url["synth"]
    mixed = [remote, local] if s3_first else [local, remote]
    both = planner.plan(mixed, storage_options=s3.options(), **SETTINGS)
    disk = planner.plan([local, local], **SETTINGS)
    assert both.dataset.fingerprint == disk.dataset.fingerprint
    kinds = {type(both.dataset.storage(f)) for f in range(len(both.dataset.files))}
    assert kinds == {LocalStorage, S3Storage}
    for rank in (0, 1):
        assert both.scan(0, rank=rank).collect().equals(disk.scan(0, rank=rank).collect())
    # DuckDB reaches the S3 objects whichever source comes first.
    got = both.sql(f"select count(*) as n from read_parquet('{remote}/*.parquet')", external_access=True)
    assert 2 * got["n"][0] == both.index["rows"].sum()
    # The loader's reader threads: as many as the S3 storage asks for, even when it is not first.
    assert default_threads(both.dataset) == max(os.cpu_count() or 2, 16)


@pytest.mark.timeout(120)
def test_a_mixture_across_stores_reads_each_source_with_its_own_options(
    s3: S3Data, gcs: CloudData, azure: CloudData
) -> None:
    sources = {
        "web": {"path": s3.url["synth"], "storage_options": s3.options()},
        "code": {"path": gcs.url["synth"], "storage_options": gcs.options()},
        "books": {"path": azure.url["synth"], "storage_options": azure.options()},
    }
    local = {name: str(s3.local["synth"]) for name in sources}
    weights = {"web": 2, "code": 1, "books": 1}
    with (
        plitzer.Loader(sources, weights=weights, **CFG) as remote,
        plitzer.Loader(local, weights=weights, **CFG) as disk,
    ):
        assert remote.index.fingerprint == disk.index.fingerprint
        for _ in range(12):
            assert tokens_of(remote.next_batch()).tobytes() == tokens_of(disk.next_batch()).tobytes()
    # SQL over the mixture: each source's read_parquet reaches its own store.
    p = planner.plan(sources, weights=weights, **SETTINGS)
    for name, url in (("s3", s3.url["synth"]), ("gcs", gcs.url["synth"]), ("azure", azure.url["synth"])):
        got = p.sql(f"select count(*) as n from read_parquet('{url}/*.parquet')", external_access=True)
        assert got["n"][0] == planner.index(s3.local["synth"]).frame["rows"].sum(), name
