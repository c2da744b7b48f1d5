"""S3 against a real server on loopback (moto in its own process), no mocked client.

Same bytes as on disk, for every world; checkpoints that move between disk and S3;
exactly one ranged GET per planned row group; listing in one request and footers
in parallel; transient faults (throttling, 5xx, resets, short bodies, stalls)
retried to identical batches, persistent ones a clear StorageError, never a hang.
"""

from __future__ import annotations

import contextlib
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import polars as pl
import pytest

import planner
import plitzer
from planner.errors import ConfigError, StorageError
from planner.stores.s3 import S3Storage
from tests.conftest import tokens_of
from tests.s3_fixtures import FAULTS, FaultProxy, S3Data, SeededFaults, always, options, proxy, s3, upload

__all__ = ["proxy", "s3"]  # the fixtures, imported for pytest

CFG = {"seed": 7, "lanes": 8, "window": 3, "seq_len": 96}
FAST = {"attempts": 4, "backoff": 0.01, "read_timeout": 0.5, "connect_timeout": 2}


def _epoch(loader: plitzer.Loader) -> list[np.ndarray]:
    return [tokens_of(b).copy() for b in loader]


@pytest.fixture
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty index cache: footers are fetched again."""
    d = tmp_path / "cache"
    monkeypatch.setenv("PLITZER_CACHE", str(d))
    return d


@pytest.mark.timeout(60)
def test_index_and_fingerprint_do_not_depend_on_location(s3: S3Data, tmp_path: Path) -> None:
    """Nested folders, bytewise order, the same index and fingerprint as the local copy."""
    src = s3.local["synth"]
    tree = tmp_path / "tree"
    for i, p in enumerate(sorted(src.glob("*.parquet"))):
        dest = tree / ["b", "a/z", "a", "B", "a_"][i % 5] / p.name
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(p, dest)
    (tree / "a" / "notes.txt").write_text("not parquet")
    client = s3.client()
    upload(client, s3.bucket, tree, "tree")
    client.put_object(Bucket=s3.bucket, Key="tree/a/notes.txt", Body=b"not parquet")
    client.put_object(Bucket=s3.bucket, Key="tree-sibling/x.parquet", Body=b"outside the prefix")
    local = planner.index(tree)
    remote = planner.index(f"s3://{s3.bucket}/tree/", storage_options=s3.options())
    assert remote.frame.equals(local.frame)
    assert remote.fingerprint == local.fingerprint
    assert [f.name for f in remote.files] == [f.name for f in local.files]
    assert all(f.version and f.location.startswith(f"s3://{s3.bucket}/tree/") for f in remote.files)
    # A single object is a source, named by its base name, like a local file.
    one = planner.index(f"{s3.url['synth']}/part-00001.parquet", storage_options=s3.options())
    assert one.frame.equals(planner.index(src / "part-00001.parquet").frame)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("world", [1, 2, 4])
def test_batches_are_byte_identical_to_disk(s3: S3Data, world: int) -> None:
    for rank in range(world):
        with (
            plitzer.Loader(s3.local["synth"], rank=rank, world=world, **CFG) as disk,
            plitzer.Loader(s3.url["synth"], rank=rank, world=world, storage_options=s3.options(), **CFG) as remote,
        ):
            assert remote.index.fingerprint == disk.index.fingerprint
            a, b = _epoch(disk), _epoch(remote)
            assert len(a) == len(b) > 0
            for t, (x, y) in enumerate(zip(a, b, strict=True)):
                assert x.dtype == y.dtype
                assert x.tobytes() == y.tobytes(), f"rank {rank} step {t}"
            # The checkpoint is the same bytes: nothing in it says where the data lives.
            assert disk.checkpoint() == remote.checkpoint()
            assert remote.next_batch().documents().equals(disk.next_batch().documents())


@pytest.mark.timeout(60)
def test_checkpoint_moves_between_s3_and_disk(s3: S3Data) -> None:
    k1, k2, steps = 23, 61, 80
    with plitzer.Loader(s3.local["synth"], **CFG) as ref:
        full = [tokens_of(ref.next_batch()).copy() for _ in range(steps)]
    with plitzer.Loader(s3.url["synth"], storage_options=s3.options(), world=2, rank=1, **CFG) as remote:
        for _ in range(k1):
            remote.next_batch()
        part = remote.checkpoint()
    with plitzer.Loader(s3.local["synth"], world=2, rank=0, **CFG) as other:
        for _ in range(k1):
            other.next_batch()
        state = plitzer.merge([other.checkpoint(), part])
    # S3 (2 ranks) -> disk (1 rank)
    with plitzer.Loader(s3.local["synth"], **CFG) as disk:
        disk.resume(state)
        for t in range(k1, k2):
            np.testing.assert_array_equal(tokens_of(disk.next_batch()), full[t])
        back = disk.checkpoint()
    # disk -> S3 (4 ranks)
    with contextlib.ExitStack() as stack:
        parts = [
            stack.enter_context(plitzer.Loader(s3.url["synth"], storage_options=s3.options(), world=4, rank=r, **CFG))
            for r in range(4)
        ]
        for ld in parts:
            ld.resume(back)
        for t in range(k2, steps):
            np.testing.assert_array_equal(np.concatenate([tokens_of(ld.next_batch()) for ld in parts]), full[t])


def _chunk_ranges(ix: planner.Index) -> dict[tuple[str, str], int]:
    """(object path, Range header) of every row group's token column chunk -> row."""
    out = {}
    for i, r in enumerate(ix.frame.iter_rows(named=True)):
        loc = ix.files[r["file_index"]].location
        path = "/" + loc[len("s3://") :]
        out[(path, f"bytes={r['byte_offset']}-{r['byte_offset'] + r['byte_length'] - 1}")] = i
    return out


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("world", "rank"), [(1, 0), (2, 1)])
def test_one_ranged_get_per_planned_row_group(s3: S3Data, proxy: FaultProxy, world: int, rank: int) -> None:
    """Once the index is cached: one listing, then exactly the plan's reads, nothing else."""
    opts = options(proxy.endpoint)
    planner.index(s3.url["synth"], storage_options=opts)  # the index and footers are cached now
    proxy.reset()
    with plitzer.Loader(s3.url["synth"], storage_options=opts, world=world, rank=rank, **CFG) as loader:
        log = proxy.log()
        assert [r.is_list for r in log] == [True]  # construction: one listing, no footer
        batches = len(_epoch(loader))
        assert batches > 0
        plan, ix = loader.plan, loader.index
    # A read that timed out under load is asked again: the proxy logs both requests, the
    # loader counts one read and one retry (once its threads are joined).
    reads, retries = loader.reads, loader.stats.retries
    log = proxy.log()[1:]
    assert all(r.is_object_get and r.range and r.status == 206 for r in log), Counter(
        (r.method, r.status, bool(r.range)) for r in log
    )
    ranges = _chunk_ranges(ix)
    got = Counter(ranges[(r.path, r.range or "")] for r in log)  # KeyError: a read that is no chunk
    assert sum(got.values()) == len(log) == reads + retries

    # Every planned read of epoch 0 exactly once, and beyond it only the start of epoch 1
    # (the lanes that finished epoch 0 early, and the prefetch of the next windows).
    def planned(epoch: int) -> list[list[int]]:
        r = plan.reads(epoch).filter(pl.col("rank") == rank)
        rows = ix.frame.with_row_index("i").join(r, on=["file", "row_group"]).sort("window_index")
        return [rows.filter(pl.col("window_index") == w)["i"].to_list() for w in range(plan.windows)]

    epoch0 = Counter(i for w in planned(0) for i in w)
    assert all(got[i] >= n for i, n in epoch0.items()), "a planned read is missing"
    extra = got - epoch0
    later = [Counter(i for w in planned(1)[:k] for i in w) for k in range(plan.windows + 1)]
    # (closing cancels the reads of a window that had not started yet; a retried read is
    # one request more of a planned chunk)
    assert (
        any(later[k - 1] <= extra and (extra - later[k]).total() <= retries for k in range(1, len(later)))
        or extra.total() <= retries
    ), (extra, retries)
    # Requests per planned row group in epoch 0: 1.0; bytes: exactly the chunks.
    bytes_asked = sum(int(ix.frame["byte_length"][i]) * n for i, n in got.items())
    assert sum(r.body_bytes for r in log) == bytes_asked


@pytest.mark.timeout(60)
def test_listing_is_one_request_and_footers_are_fetched_in_parallel(
    s3: S3Data, proxy: FaultProxy, tmp_path: Path, private_cache: Path
) -> None:
    from tests.conftest import write_dataset

    files = [[[[i, i + 1, i + 2]], [[i] * 5, []]] for i in range(240)]
    write_dataset(tmp_path / "many", files)
    upload(s3.client(), s3.bucket, tmp_path / "many", "many")
    proxy.reset()
    ix = planner.index(f"s3://{s3.bucket}/many", storage_options=options(proxy.endpoint))
    log = proxy.log()
    assert ix.frame.height == 480 and ix.tokens == 240 * 8
    assert sum(r.is_list for r in log) == 1  # 240 objects: one ListObjectsV2 page
    gets = [r for r in log if r.is_object_get]
    assert len(gets) == len(log) - 1 == 240  # one tail read per file (footer fits 64 KiB)
    assert proxy.peak_inflight >= 8, proxy.peak_inflight
    # Cached: a second index lists again (to see changes) and reads no footer.
    proxy.reset()
    again = planner.index(f"s3://{s3.bucket}/many", storage_options=options(proxy.endpoint))
    assert again.fingerprint == ix.fingerprint
    assert [r.is_list for r in proxy.log()] == [True]


@pytest.mark.timeout(90)
def test_transient_faults_give_identical_batches(s3: S3Data, proxy: FaultProxy, private_cache: Path) -> None:
    """Every kind of fault, on footers and data, retried: the same batches as on disk."""
    schedule = SeededFaults(seed=3, rate=0.35, max_in_a_row=2, lists=True, rotate=True)
    proxy.reset(schedule)
    opts = options(proxy.endpoint, **{**FAST, "attempts": 6})  # 2 faults in a row, and a slow machine
    with (
        plitzer.Loader(s3.url["synth"], storage_options=opts, **CFG) as remote,
        plitzer.Loader(s3.local["synth"], **CFG) as disk,
    ):
        a, b = _epoch(remote), _epoch(disk)
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.tobytes() == y.tobytes()
    injected = Counter(r.fault for r in proxy.log() if r.fault)
    assert set(injected) == set(FAULTS), injected  # each kind happened at least once


def _storages(loader: plitzer.Loader) -> list[S3Storage]:
    """The loader's storages (one per source), reached through its public index."""
    ix = loader.index
    found = {id(ix.storage(f)): ix.storage(f) for f in range(len(ix.files))}
    return [s for s in found.values() if isinstance(s, S3Storage)]


@pytest.mark.timeout(120)
def test_throttling_is_retried_to_the_same_batches_and_counted(
    s3: S3Data, proxy: FaultProxy, private_cache: Path
) -> None:
    """20 % of requests (listing, footers, data) answered 503 SlowDown or 429: same batches, every retry counted."""
    proxy.reset(SeededFaults(seed=5, rate=0.2, kinds=("503", "429"), max_in_a_row=7, lists=True))
    # Patient timeouts: every retry here is one the proxy caused, so the count is exact.
    opts = options(proxy.endpoint, attempts=8, backoff=0.01, read_timeout=20, connect_timeout=10)
    with (
        plitzer.Loader(s3.url["synth"], storage_options=opts, **CFG) as remote,
        plitzer.Loader(s3.local["synth"], **CFG) as disk,
    ):
        a = _epoch(remote)
        # What the loader reads ahead from here may be cut by its close, and a request
        # throttled then is not retried: so nothing from here is throttled.
        proxy.stop_faults()
        b = _epoch(disk)
        (storage,) = _storages(remote)
    retries = remote.stats.retries  # the sum over the loader's storages, once its threads are joined
    assert len(a) == len(b) > 0
    for x, y in zip(a, b, strict=True):
        assert x.tobytes() == y.tobytes()
    log = proxy.log()
    throttled = [r for r in log if r.fault]
    assert {r.fault for r in throttled} == {"503", "429"}
    # About 20 %: a seeded draw over some 55 requests (retries included), whose ranges
    # depend on the synth's bytes.
    assert 0.1 < len(throttled) / len(log) < 0.35, (len(throttled), len(log))
    # Each throttled request was retried once, and only those were.
    assert retries == storage.retries == len(throttled)
    # The throttle cut the requests in flight (multiplicative decrease) ...
    assert storage.throttle.cuts >= 1 and storage.throttle.lowest < storage.throttle.top


def test_the_throttle_halves_once_a_round_and_grows_back() -> None:
    from planner.stores.throttle import Throttle

    t = Throttle(16)
    with t.slot() as first, t.slot() as second:  # two requests of the same round, both throttled
        t.cut(first)
        t.cut(second)
    assert (t.limit, t.cuts) == (8, 1)  # one cut per round
    with t.slot() as third:
        t.cut(third)
    assert (t.limit, t.lowest, t.cuts) == (4, 4, 2)
    for _ in range(3):
        with t.slot() as s:
            t.cut(s)
    assert t.limit == 1  # never below one request in flight
    grown = 0
    while t.limit < t.top:
        with t.slot():
            t.grow()
        grown += 1
    # Additive increase: one slot per round of `limit` successes (1 + 2 + ... + 15).
    assert grown == 120, grown
    assert (t.limit, t.lowest) == (16, 1)


def test_the_throttle_bounds_requests_in_flight() -> None:
    import threading

    from planner.stores.throttle import Throttle

    t = Throttle(8)
    with t.slot() as s:
        t.cut(s)  # limit 4
    inside, peak, lock = 0, 0, threading.Lock()
    gate = threading.Barrier(4)

    def work() -> None:
        nonlocal inside, peak
        with t.slot():
            with lock:
                inside += 1
                peak = max(peak, inside)
            gate.wait(timeout=10)  # four at once are let in ...
            with lock:
                inside -= 1

    threads = [threading.Thread(target=work) for _ in range(12)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(20)
    assert peak == 4


def _loader_through(proxy: FaultProxy, s3: S3Data, **extra: object) -> plitzer.Loader:
    opts = options(proxy.endpoint, **{**FAST, **extra})
    planner.index(s3.url["synth"], storage_options=opts)  # cached: nothing below fails early
    return plitzer.Loader(s3.url["synth"], storage_options=opts, **CFG)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", FAULTS)
def test_persistent_faults_are_a_clear_storage_error(s3: S3Data, proxy: FaultProxy, kind: str) -> None:
    with _loader_through(proxy, s3, attempts=3) as loader:
        proxy.reset(always(kind))
        with pytest.raises(StorageError) as err:
            loader.next_batch()
    text = str(err.value)
    assert f"s3://{s3.bucket}/synth/part-" in text
    assert "reading bytes [" in text and "failed after 3 attempts; last cause:" in text
    cause = {
        "503": "SlowDown",
        "429": "TooManyRequests",
        "500": "InternalError",
        "short": "instead of the",
        "stall": "Timeout",
        "stall_body": "Timeout",
    }.get(kind)
    if cause:
        assert cause in text, text
    assert isinstance(err.value, OSError)
    # Exactly the attempts, per range: bounded, and nothing was decoded from a bad body.
    per_range = Counter((r.path, r.range) for r in proxy.log() if r.range)
    assert max(per_range.values()) == 3


@pytest.mark.timeout(30)
def test_an_object_changed_since_indexing_is_refused(s3: S3Data, tmp_path: Path) -> None:
    client = s3.client()
    upload(client, s3.bucket, s3.local["synth"], "mutable")
    url = f"s3://{s3.bucket}/mutable"
    with plitzer.Loader(url, storage_options=s3.options(), **CFG) as loader:
        for f in loader.index.files:  # same sizes, other bytes: only the ETag tells
            data = bytearray((s3.local["synth"] / f.name).read_bytes())
            data[4] ^= 0xFF
            client.put_object(Bucket=s3.bucket, Key=f"mutable/{f.name}", Body=bytes(data))
        with pytest.raises(StorageError, match="the object changed after it was indexed") as err:
            loader.next_batch()
    assert "ETag is no longer" in str(err.value) and "s3://plitzer/mutable/part-" in str(err.value)
    # The index cache is keyed by ETag: the next start indexes the new objects.
    again = planner.index(url, storage_options=s3.options())
    assert {f.version for f in again.files}.isdisjoint(f.version for f in loader.index.files)


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_listing_pages_are_followed(s3: S3Data, proxy: FaultProxy) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from planner.stores.s3 import S3Storage

    client = s3.client()
    keys = [f"paged/d{i % 7}/{i:05d}.parquet" for i in range(1234)] + ["paged/readme.md"]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda k: client.put_object(Bucket=s3.bucket, Key=k, Body=b"x"), keys))
    proxy.reset(SeededFaults(seed=1, rate=0.5, kinds=("503", "reset"), lists=True))
    # A page of 1,000 keys from moto takes a while on a busy machine: the point here is
    # paging and per-page retries, not timeouts, so the read timeout is generous.
    patient = {**FAST, "read_timeout": 10, "attempts": 8}
    files = S3Storage(f"s3://{s3.bucket}/paged", options(proxy.endpoint, **patient)).list_files()
    assert [f.name for f in files] == sorted((k[len("paged/") :] for k in keys[:-1]), key=str.encode)
    assert all(f.size == 1 and f.version for f in files)
    pages = [r for r in proxy.log() if r.is_list and not r.fault]
    assert len(pages) == 2  # 1,000 objects a page, each page retried on its own


@pytest.mark.timeout(60)
def test_polars_and_duckdb_reach_the_same_objects(s3: S3Data) -> None:
    remote = planner.plan(s3.url["synth"], storage_options=s3.options(), lanes=8, window=3, world=2)
    local = planner.plan(s3.local["synth"], lanes=8, window=3, world=2)
    for rank in (0, 1):
        assert remote.scan(0, rank=rank).collect().equals(local.scan(0, rank=rank).collect())
    query = "select count(*) as n from reads"
    assert remote.sql(query).equals(local.sql(query))
    docs = remote.sql(
        f"select count(*) as n, sum(len(tokens)) as t from read_parquet('{s3.url['synth']}/*.parquet')",
        external_access=True,
    )
    assert docs["n"][0] == remote.index["rows"].sum() and docs["t"][0] == remote.dataset.tokens


@pytest.mark.timeout(60)
def test_sql_reaches_each_s3_source_with_its_own_options(s3: S3Data, proxy: FaultProxy) -> None:
    """Two S3 sources, two endpoints: DuckDB's read_parquet of each goes through its own."""
    upload(s3.client(), s3.bucket, s3.local["synth"], "synth-copy")
    direct, through = s3.url["synth"], f"s3://{s3.bucket}/synth-copy"
    p = planner.plan(
        {
            "a": {"path": direct, "storage_options": s3.options()},
            "b": {"path": through, "storage_options": options(proxy.endpoint)},
        },
        weights={"a": 1, "b": 1},
        lanes=8,
        window=3,
    )
    rows = planner.index(s3.local["synth"]).frame["rows"].sum()
    for url, via_proxy in ((through, True), (direct, False), (through, True)):
        proxy.reset()
        got = p.sql(f"select count(*) as n from read_parquet('{url}/*.parquet')", external_access=True)
        assert got["n"][0] == rows
        paths = {f"{r.path}?{r.query}" for r in proxy.log()}  # listings name the prefix in the query
        if via_proxy:
            assert paths and all("synth-copy" in q for q in paths), paths
        else:
            assert not paths, paths


@pytest.mark.timeout(30)
def test_aws_variables_when_options_are_omitted(s3: S3Data, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.s3_fixtures import KEY, REGION, SECRET

    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.server.endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    ix = planner.index(s3.url["synth"])
    assert ix.fingerprint == planner.index(s3.local["synth"]).fingerprint
    opts = ix.storage(0).polars_options()  # type: ignore[attr-defined]
    assert opts["aws_endpoint_url"] == s3.server.endpoint and opts["aws_access_key_id"] == KEY
    # Unsigned requests (a public bucket): moto does not check signatures.
    anon = planner.index(s3.url["synth"], storage_options={"endpoint": s3.server.endpoint, "anon": True})
    assert anon.fingerprint == ix.fingerprint
    assert anon.storage(0).polars_options()["aws_skip_signature"] == "true"  # type: ignore[attr-defined]


@pytest.mark.timeout(30)
def test_bad_sources_and_options_are_clear_errors(s3: S3Data) -> None:
    with pytest.raises(StorageError, match=r"s3://no-such-bucket/x: listing: no such bucket"):
        planner.index("s3://no-such-bucket/x", storage_options=s3.options())
    with pytest.raises(ConfigError, match=r"holds no \*\.parquet file"):
        planner.index(f"s3://{s3.bucket}/nothing-here", storage_options=s3.options())
    with pytest.raises(ConfigError, match="storage_options key 'endpiont' is not known"):
        planner.index(s3.url["synth"], storage_options={"endpiont": s3.server.endpoint})
    with pytest.raises(ConfigError, match="attempts=0 must be >= 1"):
        planner.index(s3.url["synth"], storage_options=s3.options(attempts=0))
    # Nothing listens on this port: a bounded number of attempts, then the cause.
    from tests.s3_fixtures import free_port

    dead = options(f"http://127.0.0.1:{free_port()}", **{**FAST, "attempts": 2})
    with pytest.raises(StorageError, match=r"listing failed after 2 attempts; last cause: .*Connect"):
        planner.index(s3.url["synth"], storage_options=dead)


@pytest.mark.timeout(60)
def test_credentials_never_appear_in_errors_logs_or_checkpoints(
    s3: S3Data, proxy: FaultProxy, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    from tests.s3_fixtures import KEY, SECRET

    caplog.set_level(logging.DEBUG)
    texts: list[str] = []
    with plitzer.Loader(s3.url["synth"], storage_options=s3.options(), **CFG) as loader:
        loader.next_batch()
        state = loader.checkpoint()
        texts.append(repr(loader))
        texts.append(repr(loader.index))
    assert SECRET.encode() not in state and KEY.encode() not in state
    for bad in (
        lambda: planner.index("s3://no-such-bucket/x", storage_options=s3.options()),
        lambda: planner.index(s3.url["synth"], storage_options={**s3.options(), "endpiont": "x"}),
    ):
        with pytest.raises(plitzer.PlitzerError) as err:
            bad()
        texts.append(str(err.value))
        texts.append(repr(err.value.__cause__))
    with _loader_through(proxy, s3, attempts=2) as loader:
        proxy.reset(always("500"))
        with pytest.raises(StorageError) as err:
            loader.next_batch()
        texts.append(str(err.value))
    texts.extend(r.getMessage() for r in caplog.records)
    assert texts
    leaked = [t for t in texts if SECRET in t]
    assert not leaked, leaked[:3]
