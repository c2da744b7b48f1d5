"""Retries bounded by a deadline, not a count: the policy on a fake clock, and real stores that go away.

On the fake clock the default waits out (at least) ten minutes of a store that does
not answer, warns once when it starts waiting and once when the store is back, and
past the deadline fails naming the object, the time waited and the option. Through
the fault proxy in front of the S3 server (and the GCS and Azure emulators), every
connection refused for longer than the old retry budget (about 16 s of eight
attempts) gives the same batches as the local copy with the wait warned and counted;
past a short deadline the error says what it waited for and how to wait longer.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import planner
import plitzer
from planner.errors import ConfigError, StorageError, StorageWaitWarning
from planner.stores.retry import DEFAULT_DEADLINE, PATIENCE, Fatal, Retrier, Retrying, Transient
from tests.cloud_fixtures import CloudData, azure, gcs
from tests.conftest import tokens_of
from tests.s3_fixtures import FaultProxy, S3Data, SeededFaults, options, s3

__all__ = ["azure", "gcs", "s3"]  # the fixtures, imported for pytest

CFG = {"seed": 1, "lanes": 8, "window": 2, "seq_len": 64}


class FakeClock:
    """Time that passes only when the retry loop sleeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.sleeps.append(seconds)
        self.now += seconds


def _retrier(fake: FakeClock, **kw: Any) -> Retrier:
    settings: dict[str, Any] = {
        "attempts": None,
        "backoff": 0.1,
        "concurrency": 4,
        "transient": lambda e: isinstance(e, (Transient, OSError)),
        "throttled": lambda e: False,
        "hint": "check the credentials",
        "clock": fake.clock,
        "sleep": fake.sleep,
        **kw,
    }
    return Retrier(**settings)


def _down_until(fake: FakeClock, until: float) -> Callable[[], bytes]:
    def attempt() -> bytes:
        if fake.now < until:
            msg = "Could not connect to the endpoint URL"
            raise ConnectionRefusedError(msg)
        return b"ok"

    return attempt


WHAT = "s3://b/part-00000.parquet: reading bytes [4, 1004)"


def test_the_default_deadline_waits_out_ten_minutes_of_a_store_away() -> None:
    assert DEFAULT_DEADLINE >= 600
    fake = FakeClock()
    r = _retrier(fake)  # the default deadline
    with pytest.warns(StorageWaitWarning) as record:
        assert r.run(WHAT, _down_until(fake, 590.0)) == b"ok"
    messages = [str(w.message) for w in record]
    assert len(messages) == 2, messages
    assert messages[0].startswith(f"{WHAT}: the store does not answer (ConnectionRefusedError: Could not connect")
    assert "waiting for it, up to storage_options retry_deadline=600 s" in messages[0]
    # back at 590 s, seen at the next try: the backoff (jittered, capped at 15 s) decides when
    assert re.match(re.escape(WHAT) + r": the store answers again, after (59\d|60[0-5]) s", messages[1])
    assert r.retries == len(fake.sleeps) > 50
    assert max(fake.sleeps) <= 15.0  # the backoff is capped: the store is tried often
    assert 590 <= r.waited <= 605
    # Both point at the line that called into plitzer (this file), not at a module of plitzer's.
    if sys.version_info >= (3, 12):  # warnings' skip_file_prefixes
        assert {w.filename for w in record} == {__file__}, [w.filename for w in record]


def test_past_the_deadline_the_error_names_the_object_the_wait_and_the_option() -> None:
    fake = FakeClock()
    r = _retrier(fake)
    with pytest.warns(StorageWaitWarning, match="the store does not answer"), pytest.raises(StorageError) as e:
        r.run(WHAT, _down_until(fake, 10_000.0))
    text = str(e.value)
    assert text.startswith(f"{WHAT}: the store did not answer for 600 s (")
    assert "last cause: ConnectionRefusedError: Could not connect to the endpoint URL" in text
    assert "storage_options retry_deadline=600 s is the most a request waits" in text
    assert "raise it to wait longer (e.g. {'retry_deadline': 3600})" in text
    assert fake.now == pytest.approx(600.0)  # the last wait is cut to the deadline, not past it
    assert isinstance(e.value.__cause__, ConnectionRefusedError)


def test_a_short_outage_is_retried_without_a_word() -> None:
    fake = FakeClock()
    r = _retrier(fake)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert r.run(WHAT, _down_until(fake, PATIENCE / 4)) == b"ok"
    assert r.retries > 0


def test_deadline_zero_fails_at_once_and_attempts_still_bound_the_count() -> None:
    fake = FakeClock()
    with pytest.raises(StorageError, match=r"retry_deadline=0 fails at once: give it the seconds to wait"):
        _retrier(fake, deadline=0).run(WHAT, _down_until(fake, 1.0))
    assert fake.sleeps == []
    with pytest.raises(StorageError, match="failed after 3 attempts; last cause: ConnectionRefusedError"):
        _retrier(fake, attempts=3).run(WHAT, _down_until(fake, 1e9))
    assert len(fake.sleeps) == 2


def test_fatal_failures_are_not_waited_for() -> None:
    fake = FakeClock()

    def denied() -> bytes:
        msg = "access denied (AccessDenied)"
        raise Fatal(msg)

    with pytest.raises(StorageError, match="access denied"):
        _retrier(fake).run(WHAT, denied)
    assert fake.sleeps == []


def test_one_outage_is_one_pair_of_warnings_for_every_request_in_it() -> None:
    fake = FakeClock()
    r = _retrier(fake)
    with pytest.warns(StorageWaitWarning) as record:
        got = [r.run(WHAT, _down_until(fake, 40.0)), r.run(WHAT, _down_until(fake, 90.0))]  # two outages
    assert got == [b"ok", b"ok"]
    kinds = ["back" if "answers again" in str(w.message) else "wait" for w in record]
    assert kinds == ["wait", "back", "wait", "back"]


def test_retry_deadline_is_a_storage_option_checked() -> None:
    class Store(Retrying):
        pass

    s = Store()
    s.take_tuning({"retry_deadline": 30})
    assert (s.retry_deadline, s.attempts) == (30.0, None)
    s.take_tuning({})
    assert s.retry_deadline == DEFAULT_DEADLINE
    for bad in (-1, float("nan"), float("inf")):
        with pytest.raises(ConfigError, match=r"retry_deadline=.* must be a number of seconds >= 0"):
            s.take_tuning({"retry_deadline": bad})
    assert "retry_deadline" in Retrying.TUNING


# -- real stores behind a proxy that refuses every connection for a while ---------------------


@pytest.fixture
def refusing(s3: S3Data) -> Iterator[FaultProxy]:
    p = FaultProxy(s3.server.port, stall_s=3.0)
    try:
        yield p
    finally:
        p.stop()


FAST = {"backoff": 0.05, "read_timeout": 5, "connect_timeout": 2}


# slow: 20 s of waiting, by design. The long tests run first (tests/conftest.py), where CI's
# side lane fills the core a wait leaves idle; met last, it idled a core for half a minute.
@pytest.mark.slow
@pytest.mark.e2e  # 20 s of a store away, by design: the e2e run's
@pytest.mark.timeout(90)
def test_a_store_away_longer_than_the_old_budget_gives_the_same_batches(
    s3: S3Data, refusing: FaultProxy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every connection refused for 20 s (eight attempts gave up after about 16 s), and about a third
    of the responses reset mid-body before and after: waited for, retried, the same batches."""
    monkeypatch.setenv("PLITZER_CACHE", str(tmp_path / "cache"))
    refusing.reset(SeededFaults(seed=4, rate=0.3, kinds=("reset",), lists=True))
    opts = options(refusing.endpoint, retry_deadline=60, **FAST)
    steps = 6
    with plitzer.Loader(s3.local["synth"], **CFG) as disk:
        want = [tokens_of(disk.next_batch()).copy() for _ in range(steps)]
    with plitzer.Loader(s3.url["synth"], storage_options=opts, **CFG) as remote:  # listed, footers read
        refusing.refuse(20.0)
        t0 = time.monotonic()
        with pytest.warns(StorageWaitWarning) as record:
            got = [tokens_of(remote.next_batch()).copy() for _ in range(steps)]
        took = time.monotonic() - t0
        stats = remote.stats
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)
    messages = [str(w.message) for w in record]
    waiting = [m for m in messages if "the store does not answer" in m]
    back = [m for m in messages if "the store answers again" in m]
    assert waiting and back, messages
    assert re.search(
        r"s3://plitzer/synth/.*\.parquet: reading bytes \[\d+, \d+\): the store does not answer", waiting[0]
    )
    assert "retry_deadline=60 s" in waiting[0]
    assert took >= 15  # it did wait (the refusal began before the first read)
    assert any(r.fault == "reset" for r in refusing.log())  # resets mid-body too, retried
    assert stats.retries > 0
    assert stats.storage_wait_seconds >= 15
    assert stats.wait_seconds >= 15  # the consumer's side of the same wait


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ["s3", "gcs", "azure"])
def test_past_the_deadline_the_error_says_what_it_waited_for_and_how_to_wait_longer(
    name: str, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PLITZER_CACHE", str(tmp_path / "cache"))
    store = request.getfixturevalue(name)
    proxy = FaultProxy(store.server.port, stall_s=3.0)
    try:
        opts = _through(name, store, proxy, retry_deadline=2, **FAST)
        with plitzer.Loader(store.url["synth"], storage_options=opts, **CFG) as remote:
            proxy.refuse(30.0)
            with pytest.raises(StorageError) as e:  # 2 s is within the patience: no waiting warning
                remote.next_batch()
    finally:
        proxy.stop()
    text = str(e.value)
    assert re.search(r"\.parquet: reading bytes \[\d+, \d+\): the store did not answer for \d+ s", text), text
    assert "storage_options retry_deadline=2 s is the most a request waits for the store" in text
    assert "raise it to wait longer" in text


@pytest.mark.timeout(60)
def test_deadline_zero_fails_at_once_on_a_real_store(
    s3: S3Data, refusing: FaultProxy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PLITZER_CACHE", str(tmp_path / "cache"))
    refusing.refuse(30.0)
    t0 = time.monotonic()
    with pytest.raises(StorageError, match=r"listing failed; cause: .*retry_deadline=0 fails at once"):
        planner.index(s3.url["synth"], storage_options=options(refusing.endpoint, retry_deadline=0, **FAST))
    assert time.monotonic() - t0 < 10


def _through(name: str, store: Any, proxy: FaultProxy, **extra: Any) -> dict[str, Any]:
    if name == "s3":
        return options(proxy.endpoint, **extra)
    if name == "gcs":
        assert isinstance(store, CloudData)
        return store.options(endpoint_url=proxy.endpoint, **extra)
    conn = store.server.connection_string.replace(store.server.endpoint, f"{proxy.endpoint}/devstoreaccount1")
    return {"connection_string": conn, **extra}


@pytest.mark.parametrize("url", ["s3://bucket/prefix", "gs://bucket/prefix", "az://container/prefix"])
def test_every_object_store_takes_the_deadline_from_storage_options(url: str) -> None:
    """The default (checked without waiting it out), the option, and 0, on each backend's own retrier."""
    from planner.stores.backends import open_storages

    base: dict[str, Any] = {
        "s3": {"endpoint": "http://127.0.0.1:9", "region": "us-east-1", "key": "k", "secret": "s"},
        "gs": {"token": "anon", "endpoint_url": "http://127.0.0.1:9"},
        "az": {"account_name": "devstoreaccount1", "anon": True},
    }[url.split(":", maxsplit=1)[0]]
    try:
        (default,) = open_storages(url, base)
    except ConfigError as e:  # the store's client library is not installed here
        pytest.skip(str(e))
    (short,) = open_storages(url, {**base, "retry_deadline": 30})
    (zero,) = open_storages(url, {**base, "retry_deadline": 0, "attempts": 5})
    got = [(s._retrier.deadline, s._retrier.attempts) for s in (default, short, zero)]  # type: ignore[attr-defined]
    assert got == [(DEFAULT_DEADLINE, None), (30.0, None), (0.0, 5)]
    assert default.waited == 0.0  # type: ignore[attr-defined]


def _patient() -> Retrier:
    return Retrier(
        attempts=None, backoff=0.01, concurrency=4, transient=lambda e: True, throttled=lambda e: False, hint=""
    )


def test_a_stop_ends_a_blocking_socket_read_in_flight_not_at_its_timeout() -> None:
    """``stop(event)`` shuts down the socket a stopped thread reads (``interruptible``): a StoppedError at once."""
    import socket
    import threading

    from planner.errors import StoppedError
    from planner.stores.stopping import interruptible, stop, stop_on

    ours, theirs = socket.socketpair()  # `theirs` never answers
    ours.settimeout(30.0)
    ev = threading.Event()
    got: list[BaseException] = []

    def attempt() -> bytes:
        with interruptible(ours):
            data = ours.recv(1)
        if not data:
            raise ConnectionResetError("closed")
        return data

    def read() -> None:
        with stop_on(ev):
            try:
                _patient().run("reading x", attempt)
            except BaseException as e:
                got.append(e)

    t = threading.Thread(target=read)
    t.start()
    time.sleep(0.2)  # inside recv
    t0 = time.monotonic()
    stop(ev)
    t.join(5)
    assert not t.is_alive() and time.monotonic() - t0 < 1.0
    assert len(got) == 1 and isinstance(got[0], StoppedError), got
    assert "reading x: stopped during a request" in str(got[0])
    ours.close()
    theirs.close()


def test_a_stop_cancels_an_attempt_on_the_event_loop() -> None:
    """``on_loop`` (S3, GCS, Azure) waits in slices: a stop cancels the task and raises StoppedError."""
    import asyncio
    import threading

    from planner.errors import StoppedError
    from planner.stores.stopping import on_loop, stop, stop_on

    loop = asyncio.new_event_loop()
    lt = threading.Thread(target=loop.run_forever, daemon=True)
    lt.start()
    cancelled = threading.Event()

    async def never() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    ev = threading.Event()
    got: list[BaseException] = []

    def read() -> None:
        with stop_on(ev):
            try:
                _patient().run("reading y", lambda: on_loop(loop, never))
            except BaseException as e:
                got.append(e)

    assert on_loop(loop, asyncio.sleep, 0, "answer") == "answer"  # a result comes back as is
    t = threading.Thread(target=read)
    t.start()
    time.sleep(0.3)
    stop(ev)
    t.join(5)
    assert not t.is_alive()
    assert len(got) == 1 and isinstance(got[0], StoppedError), got
    assert cancelled.wait(2)  # the task was cancelled on its loop, not left to run
    loop.call_soon_threadsafe(loop.stop)
    lt.join(5)
    loop.close()
