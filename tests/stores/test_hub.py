"""The Hugging Face Hub and HTTP sources beyond the shared storage suite (tests/stores/test_storage.py).

The servers are tests/hub_server.py's, on loopback: the Hub's API as huggingface_hub
uses it, and a static server with Range and ETag or Last-Modified. What is shown here:
a branch is resolved once and every read names that commit; a resume after the branch
moved is refused naming both commits when the files changed, and accepted when they
did not; a checkpoint carries from hf:// to https:// to disk at other world sizes;
throttling (429 with Retry-After) is retried and counted; the token and endpoint come
from HF_TOKEN / HF_ENDPOINT or storage_options and never show in a message; a server
that ignores Range, or sends neither ETag nor Last-Modified, is refused clearly; the
CLI and mixtures take these sources like any other.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import planner
import plitzer
from planner.errors import CheckpointError, ConfigError, FileChangedError, StorageError
from planner.stores.backends import open_storages
from planner.stores.hf import HFStorage
from tests.conftest import SynthDataset, tokens_of, write_dataset
from tests.hub_server import TOKEN, HubData, HubServer, StaticServer, Throttling, WebData, files_of, hub, web

__all__ = ["hub", "web"]  # the fixtures, imported for pytest

CFG = {"seed": 7, "lanes": 8, "window": 3, "seq_len": 96}


def _batches(loader: plitzer.Loader, n: int | None = None) -> list[bytes]:
    if n is None:
        return [tokens_of(b).tobytes() for b in loader]
    return [tokens_of(loader.next_batch()).tobytes() for _ in range(n)]


@pytest.fixture
def moving(hub: HubData, tmp_path: Path) -> tuple[HubServer, str, Path]:
    """A repository of its own whose branch the test may move: (server, repo, local copy of synth/)."""
    repo = f"plitzer/moving-{tmp_path.name}"
    hub.server.commit(repo, {"README.md": b"# v1\n", **files_of(hub.local, "synth")})
    return hub.server, repo, hub.local


@pytest.mark.timeout(60)
def test_a_branch_is_resolved_once_and_every_read_names_its_commit(moving: tuple[HubServer, str, Path]) -> None:
    server, repo, local = moving
    first = server.head(repo)
    server.reset()
    (st,) = open_storages(f"hf://datasets/{repo}/synth", {"endpoint": server.endpoint})
    assert isinstance(st, HFStorage) and st.commit == first
    assert st.pinned == f"hf://datasets/{repo}@{first}/synth"
    files = st.list_files()
    before = [st.read_range(f, 0, 100) for f in files]
    # The branch moves: new bytes for every file. The storage reads what it listed, at its commit.
    other = {k: v[::-1] for k, v in files_of(local, "synth").items()}
    moved = server.commit(repo, other)
    assert moved != first
    assert [st.read_range(f, 0, 100) for f in files] == before
    log = server.requests()
    assert [r.path for r in log if "/revision/" in r.path] == [f"/api/datasets/{repo}/revision/main"]
    assert all(first in r.path for r in log if "/tree/" in r.path or "/resolve/" in r.path)
    # A storage made now resolves the branch anew; an explicit commit needs no request.
    (again,) = open_storages(f"hf://datasets/{repo}/synth", {"endpoint": server.endpoint})
    assert again.commit == moved  # type: ignore[attr-defined]
    server.reset()
    (pinned,) = open_storages(f"hf://datasets/{repo}@{first}/synth", {"endpoint": server.endpoint})
    assert pinned.commit == first and not server.requests()  # type: ignore[attr-defined]
    assert [pinned.read_range(f, 0, 100) for f in pinned.list_files()] == before


@pytest.mark.timeout(60)
def test_an_epoch_costs_one_request_a_row_group_after_a_redirect_a_file(hub: HubData) -> None:
    """Cached index: the revision, the listing, then per file one resolve (302 to the CDN), per row group one GET."""
    planner.index(hub.url, storage_options=hub.options())  # footers cached
    hub.server.reset()
    with plitzer.Loader(hub.url, storage_options=hub.options(), **CFG) as ld:
        _batches(ld)
        reads, files = ld.reads, len(ld.index.files)
    log = hub.server.requests()
    kinds = [r.path.split("/")[1] if not r.path.startswith("/api/") else r.path.split("/")[5] for r in log]
    assert kinds.count("revision") == 1 and kinds.count("tree") == 1
    assert kinds.count("datasets") == files  # one resolve a file: a 302 to its CDN link
    assert all(r.status == 302 for r in log if r.path.startswith("/datasets/"))
    # Then the CDN, straight: one ranged GET a row group (those read ahead into the next epoch too).
    cdn = [(r.path, r.range) for r in log if r.path.startswith("/cdn/")]
    assert len(cdn) >= reads
    assert all(r.status == 206 and r.range for r in log if r.path.startswith("/cdn/"))
    assert len(log) == len(cdn) + files + 2


@pytest.mark.timeout(120)
def test_a_resume_after_the_branch_moved_is_refused_naming_both_commits(
    moving: tuple[HubServer, str, Path],
) -> None:
    server, repo, local = moving
    url, opts = f"hf://datasets/{repo}/synth", {"endpoint": server.endpoint}
    first = server.head(repo)
    with plitzer.Loader(local, **CFG) as ref:
        full = _batches(ref, 14)
    with plitzer.Loader(url, storage_options=opts, **CFG) as ld:
        assert ld.config["revisions"][0][:2] == [f"hf://datasets/{repo}/synth", first]
        assert _batches(ld, 6) == full[:6]
        state = ld.checkpoint()
    # A commit that leaves the files alone (the README): the same bytes, so the run goes on.
    readme = server.commit(repo, {"README.md": b"# v2\n"})
    with plitzer.Loader(url, storage_options=opts, **CFG) as ld:
        ld.resume(state)
        assert _batches(ld, 4) == full[6:10]
    # A commit that changes a file the run reads, keeping its name, rows and tokens (so the
    # fingerprint alone would not tell): refused, naming both commits and the pinned URL.
    name = sorted(p.name for p in local.glob("*.parquet"))[0]
    changed = server.commit(repo, {f"synth/{name}": _shifted(local / name)})
    with plitzer.Loader(url, storage_options=opts, **CFG) as ld, pytest.raises(CheckpointError) as err:
        ld.resume(state)
    text = str(err.value)
    assert "fingerprint" not in text  # the same counts: only the revision tells
    assert first in text and changed in text and readme not in text
    assert f"hf://datasets/{repo}@{first}/synth" in text
    # Resumed at the checkpoint's commit, the run goes on exactly.
    with plitzer.Loader(f"hf://datasets/{repo}@{first}/synth", storage_options=opts, **CFG) as ld:
        ld.resume(state)
        assert _batches(ld, 8) == full[6:14]


@pytest.mark.timeout(60)
def test_ranks_that_resolved_a_branch_to_different_commits_do_not_merge(moving: tuple[HubServer, str, Path]) -> None:
    server, repo, local = moving
    url, opts = f"hf://datasets/{repo}/synth", {"endpoint": server.endpoint}
    with plitzer.Loader(url, storage_options=opts, rank=0, world=2, **CFG) as r0:
        name = sorted(p.name for p in local.glob("*.parquet"))[0]
        server.commit(repo, {f"synth/{name}": _shifted(local / name)})  # between the two ranks' starts
        with plitzer.Loader(url, storage_options=opts, rank=1, world=2, **CFG) as r1:
            with pytest.raises(CheckpointError, match=r"parts disagree.*revisions"):
                plitzer.merge([r0.checkpoint(), r1.checkpoint()])


def _shifted(path: Path) -> bytes:
    """The file with every token one higher: the same row groups, rows and tokens, other bytes."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path)
    sink = pa.BufferOutputStream()
    with pq.ParquetWriter(sink, pf.schema_arrow) as w:
        for g in range(pf.num_row_groups):
            t = pf.read_row_group(g)
            col = t.column("tokens").combine_chunks()
            values = pc.add(col.values, pa.scalar(1, col.values.type))
            shifted = type(col).from_arrays(col.offsets, values)
            w.write_table(t.set_column(t.schema.get_field_index("tokens"), "tokens", shifted))
    return sink.getvalue().to_pybytes()


@pytest.mark.timeout(120)
def test_a_checkpoint_carries_from_the_hub_to_http_to_disk_at_other_world_sizes(hub: HubData, web: WebData) -> None:
    stages = [(hub.url, hub.options(), 2), (web.url, None, 4), (str(hub.local), None, 1)]
    steps_each = 7
    with plitzer.Loader(hub.local, **CFG) as ref:
        full = [tokens_of(ref.next_batch()).copy() for _ in range(steps_each * len(stages))]
    state: bytes | None = None
    t = 0
    for url, opts, world in stages:
        with contextlib.ExitStack() as stack:
            ranks = [
                stack.enter_context(plitzer.Loader(url, storage_options=opts, world=world, rank=r, **CFG))
                for r in range(world)
            ]
            for ld in ranks:
                if state is not None:
                    ld.resume(state)
            for _ in range(steps_each):
                got = np.concatenate([tokens_of(ld.next_batch()) for ld in ranks])
                np.testing.assert_array_equal(got, full[t], err_msg=f"{url}, step {t}")
                t += 1
            state = plitzer.merge([ld.checkpoint() for ld in ranks])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ["hf", "http"])
def test_throttling_with_retry_after_is_retried_to_the_same_batches_and_counted(
    name: str, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fifth of all requests (revision, listing, footers, data) answered 429 with Retry-After."""
    monkeypatch.setenv("PLITZER_CACHE", str(tmp_path / "cache"))  # footers fetched too
    data: Any = request.getfixturevalue("hub" if name == "hf" else "web")
    server = data.server
    server.reset(Throttling(seed=3, rate=0.2, retry_after="0", max_in_a_row=3))
    try:
        opts = data.options(attempts=8, backoff=0.01)
        with plitzer.Loader(data.url, storage_options=opts, **CFG) as remote, plitzer.Loader(data.local, **CFG) as disk:
            a, b = _batches(remote), _batches(disk)
            ix = remote.index
            storages = {id(ix.storage(f)): ix.storage(f) for f in range(len(ix.files))}
        retries = remote.stats.retries
        throttled = [r for r in server.requests() if r.fault]
    finally:
        server.reset()
    assert a == b and len(a) > 0
    assert len(throttled) >= 5
    assert all(r.status == 429 for r in throttled)
    (st,) = storages.values()
    assert retries == st.retries
    # Every 429 is retried and counted, but for a read ahead that the loader's close stops: its
    # 429 ends the read (planner.stores.retry: stopped, no retry), at most one a reading thread
    # (16 at most for a remote source). Seen once in CI: 12 answered 429, 11 retried.
    assert st.retries <= len(throttled) <= st.retries + 16
    assert st.throttle.cuts >= 1  # type: ignore[attr-defined]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("header", "waited"), [("2", 2.0), ("3600", 60.0)])
def test_retry_after_is_waited_up_to_its_cap(
    hub: HubData, monkeypatch: pytest.MonkeyPatch, header: str, waited: float
) -> None:
    from planner.stores import ranged

    (st,) = open_storages(hub.url, hub.options(backoff=0))
    (f, *_) = st.list_files()
    sleeps: list[float] = []
    monkeypatch.setattr(ranged.time, "sleep", sleeps.append)  # every sleep, recorded instead of slept
    hub.server.reset(Throttling(seed=1, rate=1.0, retry_after=header, max_in_a_row=1))
    try:
        assert len(st.read_range(f, 0, 10)) == 10
    finally:
        hub.server.reset()
    assert sleeps.count(waited) == st.retries >= 1  # each throttled attempt waited what it was asked


@pytest.mark.timeout(60)
def test_a_corrupt_revisions_field_is_refused() -> None:
    from plitzer.state.checkpoint import State, decode, encode

    cfg = {"seed": 0, "lanes": 1, "seq_len": 4, "window": 1, "column": "t", "dtype": "int32", "fingerprint": "x"}
    good = encode(State(config={**cfg, "revisions": [["hf://datasets/a/b", "c" * 40, "d"]]}, step=0, positions=_pos()))
    assert decode(good).config["revisions"] == [["hf://datasets/a/b", "c" * 40, "d"]]
    bad = encode(State(config={**cfg, "revisions": [["hf://datasets/a/b", 7]]}, step=0, positions=_pos()))
    with pytest.raises(CheckpointError, match="revisions must list"):
        decode(bad)


def _pos() -> np.ndarray:
    return np.zeros((1, 5), np.int64)


@pytest.mark.timeout(60)
def test_persistent_throttling_is_a_storage_error_after_the_attempts(hub: HubData) -> None:
    (st,) = open_storages(hub.url, hub.options(attempts=3, backoff=0.01))
    (f, *_) = st.list_files()
    hub.server.reset(Throttling(seed=1, rate=1.0, retry_after="0", max_in_a_row=99))
    try:
        with pytest.raises(StorageError, match=r"failed after 3 attempts; last cause: throttled \(429, Retry-After 0"):
            st.read_range(f, 0, 10)
    finally:
        hub.server.reset()
    assert st.retries == 2


@pytest.mark.timeout(60)
def test_token_and_endpoint_come_from_the_environment_or_the_options(
    synth_dataset: SynthDataset, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HF_TOKEN", raising=False)
    (d,) = write_dataset(tmp_path / "d", [[[[1, 2, 3], [4, 5]]]])
    server = HubServer(token=TOKEN)
    try:
        server.commit("acme/private", {"data/d.parquet": d.read_bytes()})
        url = "hf://datasets/acme/private/data"
        with pytest.raises(StorageError, match=r"access denied \(401.*token") as err:
            open_storages(url, {"endpoint": server.endpoint, "attempts": 1})
        assert TOKEN not in str(err.value)
        # storage_options token and endpoint ...
        (st,) = open_storages(url, {"endpoint": server.endpoint, "token": TOKEN})
        assert [f.name for f in st.list_files()] == ["d.parquet"]
        assert TOKEN not in repr(st)
        # ... or HF_TOKEN and HF_ENDPOINT.
        monkeypatch.setenv("HF_TOKEN", TOKEN)
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
        assert planner.index(url).tokens == 5
        auth = {r.headers.get("authorization") for r in server.requests()}
        assert f"Bearer {TOKEN}" in auth
    finally:
        server.stop()


@pytest.mark.timeout(60)
def test_a_missing_repository_revision_or_folder_is_a_clear_error(hub: HubData) -> None:
    with pytest.raises(StorageError, match=r"no-such/repo: resolving revision 'main'.*repository name"):
        open_storages("hf://datasets/no-such/repo", hub.options(attempts=1))
    with pytest.raises(StorageError, match=r"resolving revision 'v9'.*404"):
        open_storages("hf://datasets/plitzer/synth@v9/synth", hub.options(attempts=1))
    (st,) = open_storages("hf://datasets/plitzer/synth/nothing-here", hub.options(attempts=1))
    with pytest.raises(StorageError, match=r"listing: .*404"):
        st.list_files()
    with pytest.raises(ConfigError, match="buckets"):
        open_storages("hf://buckets/acme/b/x", hub.options())
    with pytest.raises(ConfigError, match="storage_options key 'region' is not known for hf://"):
        open_storages(hub.url, hub.options(region="us-east-1"))


@pytest.mark.timeout(60)
def test_offline_mode_is_a_clear_error_at_once(hub: HubData, monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(StorageError, match="offline mode is enabled") as err:
        open_storages(hub.url, hub.options(attempts=5, backoff=5))  # not retried: no wait
    assert "HF_HUB_OFFLINE" in str(err.value)


@pytest.mark.timeout(60)
def test_one_hub_file_is_a_source_named_by_its_base_name(hub: HubData) -> None:
    (st,) = open_storages(hub.url, hub.options())
    first = st.list_files()[0]
    (one,) = open_storages(f"{hub.url}/{first.name}", hub.options())
    assert one.list_files() == [first]


# -- HTTP ---------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_a_server_that_ignores_range_is_a_clear_storage_error(web: WebData) -> None:
    server = StaticServer(web.root, ranges=False)
    try:
        (st,) = open_storages(web.url.replace(web.server.endpoint, server.endpoint), {"attempts": 3})
        (f, *_) = st.list_files()
        with pytest.raises(StorageError, match=r"ignored the Range request.*honours Range") as err:
            st.read_range(f, 10, 100)
        assert f.location in str(err.value)
        assert st.retries == 0  # no retry fixes it
        assert all(r.status in (200,) for r in server.requests())
    finally:
        server.stop()


@pytest.mark.timeout(60)
def test_a_server_that_refuses_head_is_asked_for_the_first_byte(web: WebData) -> None:
    server = StaticServer(web.root, head=False)
    try:
        url = web.url.replace(web.server.endpoint, server.endpoint)
        with plitzer.Loader(url, **CFG) as remote, plitzer.Loader(web.local, **CFG) as disk:
            assert [f.size for f in remote.index.files] == [f.size for f in disk.index.files]
            assert _batches(remote, 5) == _batches(disk, 5)
        log = server.requests()
        assert {r.status for r in log if r.method == "HEAD"} == {405}
        assert sum(1 for r in log if r.range == "bytes=0-0") == len(remote.index.files)
    finally:
        server.stop()


@pytest.mark.timeout(60)
def test_last_modified_pins_a_file_when_there_is_no_etag(tmp_path: Path) -> None:
    (tmp_path / "a.parquet").write_bytes(b"x" * 1000)
    server = StaticServer(tmp_path, etag=False)
    try:
        (st,) = open_storages(f"{server.endpoint}/a.parquet")
        (f,) = st.list_files()
        assert f.name == "a.parquet" and f.size == 1000 and f.version.endswith("GMT")
        assert st.read_range(f, 5, 5) == b"xxxxx"
        assert server.requests()[-1].headers.get("if-unmodified-since") == f.version
        import os

        (tmp_path / "a.parquet").write_bytes(b"y" * 1000)
        os.utime(tmp_path / "a.parquet", (f.size, 2_000_000_000))
        with pytest.raises(FileChangedError, match="changed after it was indexed"):
            st.read_range(f, 5, 5)
    finally:
        server.stop()


@pytest.mark.timeout(60)
def test_a_manifest_lists_relative_paths_and_urls(web: WebData, tmp_path: Path) -> None:
    names = sorted(p.relative_to(web.local).as_posix() for p in web.local.rglob("*.parquet"))
    lines = [
        "# the synth dataset",
        "",
        *(f"../synth/{n}" for n in names[:-1]),
        f"{web.server.endpoint}/synth/{names[-1]}",
    ]
    (web.root / "lists").mkdir(exist_ok=True)
    (web.root / "lists" / "synth.txt").write_text("\n".join([*lines, "README.md"]) + "\n")
    (st,) = open_storages(f"{web.server.endpoint}/lists/synth.txt")
    got = st.list_files()
    # Names relative to the manifest's folder, or host and path for a file elsewhere.
    host = web.server.endpoint.removeprefix("http://")
    assert [f.name for f in got] == sorted([f"{host}/synth/{n}" for n in names], key=str.encode)
    (web.root / "lists" / "page.html").write_text("<!DOCTYPE html><html></html>")
    with pytest.raises(ConfigError, match="HTML page, not a manifest"):
        open_storages(f"{web.server.endpoint}/lists/page.html")[0].list_files()


@pytest.mark.timeout(60)
def test_a_list_of_urls_is_a_list_source(web: WebData) -> None:
    names = sorted(p.relative_to(web.local).as_posix() for p in web.local.rglob("*.parquet"))[:2]
    urls = [f"{web.server.endpoint}/synth/{n}" for n in names]
    with (
        plitzer.Loader(urls, **CFG) as remote,
        plitzer.Loader([web.local / n for n in names], **CFG) as disk,
    ):
        assert [f.name for f in remote.index.files] == [f"{i}/{n}" for i, n in enumerate(names)]
        assert remote.index.fingerprint == disk.index.fingerprint
        assert _batches(remote, 5) == _batches(disk, 5)


# -- the CLI and mixtures -----------------------------------------------------------------


@pytest.mark.timeout(120)
def test_the_cli_and_mixtures_take_hub_and_http_sources(
    hub: HubData, web: WebData, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from plitzer.cli import main

    monkeypatch.setenv("HF_ENDPOINT", hub.server.endpoint)
    assert main(["index", hub.url]) == 0
    out, err = capsys.readouterr()
    assert f"at its commit: hf://datasets/plitzer/synth@{hub.commit}/synth" in err
    assert main(["index", str(hub.local)]) == 0
    assert capsys.readouterr().out.split("\n")[-4:] == out.split("\n")[-4:]
    sql = "select count(*) as n from reads"
    assert main(["plan", web.url, "--lanes", "8", "--window", "3", "--world", "2", "--sql", sql]) == 0
    assert main(["explain", hub.url, "--step", "2", "--lanes", "8", "--window", "3", "--seq-len", "96"]) == 0
    assert (
        main(["audit", web.url, "--lanes", "8", "--window", "3", "--world", "2", "--out", str(tmp_path / "a.html")])
        == 0
    )
    assert (tmp_path / "a.html").stat().st_size > 0
    capsys.readouterr()
    # A mixture of a Hub source and an HTTP source gives the batches of the same data on disk.
    sources = {"web": {"path": hub.url, "storage_options": hub.options()}, "code": web.url}
    local = {"web": str(hub.local), "code": str(web.local)}
    weights = {"web": 2, "code": 1}
    with (
        plitzer.Loader(sources, weights=weights, **CFG) as remote,
        plitzer.Loader(local, weights=weights, **CFG) as disk,
    ):
        assert remote.index.fingerprint == disk.index.fingerprint
        assert _batches(remote, 10) == _batches(disk, 10)
