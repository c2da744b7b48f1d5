"""One index per job: 4 gloo ranks, each its own cache folder (as on 4 machines), against S3.

The ranks share one listing (rank 0's) and read each footer once between them, so the
server sees one listing for the job and at most 1.1 footer GETs a file; the ranks' rows
are world 1's batch (docs/design.md, "One index per job").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
if sys.platform == "win32":  # pragma: no cover
    pytest.skip("gloo process groups on loopback are tested on POSIX", allow_module_level=True)

import plitzer
from tests import prefork
from tests.conftest import SynthDataset, tokens_of
from tests.net import free_port, gloo_env
from tests.s3_fixtures import FaultProxy, S3Data, options, proxy, s3, upload
from tests.share_worker import SETTINGS

__all__ = ["proxy", "s3"]  # the fixtures, imported for pytest

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "share_worker.py"
WORLD = 4
STEPS = 3

pytestmark = pytest.mark.slow


def _run_job(source: str, opts: dict[str, str] | None, out: Path, mode: str = "dataset") -> None:
    port = free_port()
    env = gloo_env(WORLD)
    cmd = [sys.executable, str(WORKER), "--source", source, "--options", json.dumps(opts), "--mode", mode]
    cmd += ["--out", str(out), "--port", str(port), "--steps", str(STEPS)]
    procs = []
    for rank in range(WORLD):
        cache = out / f"cache{rank}"  # each rank its own cache folder, as on its own machine
        log = open(out / f"rank{rank}.log", "wb")  # noqa: SIM115
        procs.append(
            prefork.Popen(  # forked from an interpreter that imported torch and plitzer (tests/prefork.py)
                cmd, env={**env, "RANK": str(rank), "PLITZER_CACHE": str(cache)}, stdout=log, stderr=subprocess.STDOUT
            )
        )
        log.close()
    try:
        codes = [p.wait(timeout=240) for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
            p.wait()
        codes = [-1]
    if any(codes):
        logs = "\n".join(f"--- rank {r}\n{(out / f'rank{r}.log').read_text()[-3000:]}" for r in range(WORLD))
        pytest.fail(f"a rank failed: {codes}\n{logs}")


@pytest.mark.timeout(420)
def test_four_ranks_list_once_and_read_each_footer_once(
    s3: S3Data, proxy: FaultProxy, synth_dataset: SynthDataset, tmp_path: Path
) -> None:
    local = synth_dataset(tokens=120_000, seed=21, docs_per_row_group=12, row_groups_per_file=2, mean_length=100)
    files = upload(s3.client(), s3.bucket, local, "share")
    assert len(files) >= 40
    source = f"s3://{s3.bucket}/share"
    with plitzer.Loader(local, **SETTINGS) as ref:
        want = [tokens_of(ref.next_batch()).copy() for _ in range(STEPS)]
        frame = ref.index.frame
    chunks = {f"bytes={o}-{o + n - 1}" for o, n in zip(frame["byte_offset"], frame["byte_length"], strict=True)}
    proxy.reset()
    _run_job(source, options(proxy.endpoint), tmp_path)
    log = proxy.log()
    lists = [r for r in log if r.is_list]
    footers = [r for r in log if r.is_object_get and r.range not in chunks]
    assert len(lists) == 1, [r.query for r in lists]  # one listing for the job
    assert len(footers) <= 1.1 * len(files), (len(footers), len(files))
    assert len({(r.path, r.range) for r in footers}) == len(footers)  # no footer twice
    got = [np.load(tmp_path / f"rank{r}.npz") for r in range(WORLD)]
    order = sorted(range(WORLD), key=lambda r: int(got[r]["lanes"][0]))
    for t in range(STEPS):
        np.testing.assert_array_equal(np.concatenate([got[r]["tokens"][t] for r in order]), want[t])
    # A restart on the same machines (the same cache folders): one listing, no footer GET.
    proxy.reset()
    _run_job(source, options(proxy.endpoint), tmp_path)
    log = proxy.log()
    assert sum(r.is_list for r in log) == 1
    assert [r for r in log if r.is_object_get and r.range not in chunks] == []


def _rows_equal(out: Path, want: list[np.ndarray]) -> list[dict[str, np.ndarray]]:
    got = [dict(np.load(out / f"rank{r}.npz")) for r in range(WORLD)]
    order = sorted(range(WORLD), key=lambda r: int(got[r]["lanes"][0]))
    for t in range(STEPS):
        np.testing.assert_array_equal(np.concatenate([got[r]["tokens"][t] for r in order]), want[t])
    return got


@pytest.mark.timeout(300)
def test_a_plain_loader_in_a_process_group_shares_too(
    s3: S3Data, proxy: FaultProxy, synth_dataset: SynthDataset, tmp_path: Path
) -> None:
    """``plitzer.Loader(rank=r, world=4)`` on each rank of an initialised gloo group shares by itself."""
    local = synth_dataset(tokens=80_000, seed=23, docs_per_row_group=12, row_groups_per_file=2, mean_length=100)
    files = upload(s3.client(), s3.bucket, local, "share-loader")
    source = f"s3://{s3.bucket}/share-loader"
    with plitzer.Loader(local, **SETTINGS) as ref:
        want = [tokens_of(ref.next_batch()).copy() for _ in range(STEPS)]
        frame = ref.index.frame
    chunks = {f"bytes={o}-{o + n - 1}" for o, n in zip(frame["byte_offset"], frame["byte_length"], strict=True)}
    proxy.reset()
    _run_job(source, options(proxy.endpoint), tmp_path, mode="loader")
    log = proxy.log()
    footers = [r for r in log if r.is_object_get and r.range not in chunks]
    assert sum(r.is_list for r in log) == 1  # one listing for the job
    assert len(footers) <= 1.1 * len(files), (len(footers), len(files))
    _rows_equal(tmp_path, want)


@pytest.mark.timeout(300)
def test_a_text_source_splits_its_counting_pass_across_the_ranks(tmp_path: Path) -> None:
    """4 ranks, each its own cache: each tokenizes about a quarter of the row groups before its
    first batch (0.3: each all of them), each reads a quarter of the footers (0.4: each was sent
    all of them), and every rank's cache then holds every file's counts."""
    from tests.share_fixtures import CharTokenizer, nonempty_texts, write_text

    text = write_text(tmp_path / "text", files=8, row_groups=2, docs=10)
    total = nonempty_texts(text)
    with plitzer.Loader(text, tokenizer=CharTokenizer(), **SETTINGS) as ref:
        want = [tokens_of(ref.next_batch()).copy() for _ in range(STEPS)]
    out = tmp_path / "job"
    out.mkdir()
    _run_job(str(text), None, out, mode="text")
    got = _rows_equal(out, want)
    texts = [int(g["texts"]) for g in got]
    assert sum(texts) == total, texts  # each row group tokenized once for the job
    assert max(texts) < total / 2, texts  # split: no rank counted the lot
    footers: set[str] = set()
    for r in range(WORLD):
        assert len(list((out / f"cache{r}" / "text").glob("*.npy"))) == 8  # every file's counts, on every machine
        mine = {p.name for p in (out / f"cache{r}" / "footers").glob("*.footer")}
        assert len(mine) == 8 // WORLD, mine  # only the footers this rank read: no rank is sent the others'
        footers |= mine
    assert len(footers) == 8  # each file's footer read by one rank
    # A restart on the same machines: nothing tokenized again, the same rows.
    _run_job(str(text), None, out, mode="text")
    assert [int(g["texts"]) for g in _rows_equal(out, want)] == [0] * WORLD


@pytest.mark.timeout(300)
def test_a_mixture_reads_each_footer_once_too(
    s3: S3Data, proxy: FaultProxy, synth_dataset: SynthDataset, tmp_path: Path
) -> None:
    """Each source of a mixture is shared in turn: one listing a source for the job (rank 0's)
    and no footer read twice; every rank's mixture is made of the shared indexes."""
    files = 0
    local, remote = {}, {}
    for i, name in enumerate(("code", "web")):
        d = synth_dataset(tokens=60_000, seed=30 + i, docs_per_row_group=12, row_groups_per_file=2, mean_length=100)
        files += len(upload(s3.client(), s3.bucket, d, f"mix-{name}"))
        local[name], remote[name] = str(d), f"s3://{s3.bucket}/mix-{name}"
    with plitzer.Loader(local, **SETTINGS) as ref:
        want = [tokens_of(ref.next_batch()).copy() for _ in range(STEPS)]
        frame = ref.index.frame
    chunks = {f"bytes={o}-{o + n - 1}" for o, n in zip(frame["byte_offset"], frame["byte_length"], strict=True)}
    proxy.reset()
    _run_job(json.dumps(remote), options(proxy.endpoint), tmp_path)
    log = proxy.log()
    footers = [(r.path, r.range) for r in log if r.is_object_get and r.range not in chunks]
    lists = [r for r in log if r.is_list]
    assert len(lists) == len(remote), [r.query for r in lists]  # one listing a source for the job
    assert len(footers) <= 1.1 * files, (len(footers), files)
    assert len(set(footers)) == len(footers)
    got = [np.load(tmp_path / f"rank{r}.npz") for r in range(WORLD)]
    order = sorted(range(WORLD), key=lambda r: int(got[r]["lanes"][0]))
    for t in range(STEPS):
        np.testing.assert_array_equal(np.concatenate([got[r]["tokens"][t] for r in order]), want[t])


@pytest.mark.timeout(180)
def test_processes_sharing_one_cache_fetch_each_footer_once(
    s3: S3Data, proxy: FaultProxy, synth_dataset: SynthDataset, tmp_path: Path
) -> None:
    """Three plain processes (no process group) index the same S3 source at once into one
    cache folder: the cache's lock around a fetch lets one fetch each footer."""
    local = synth_dataset(tokens=120_000, seed=22, docs_per_row_group=12, row_groups_per_file=2, mean_length=100)
    files = upload(s3.client(), s3.bucket, local, "shared-cache")
    source = f"s3://{s3.bucket}/shared-cache"
    code = (
        "import json, sys, planner, plitzer; "
        "ix = planner.index(sys.argv[1], storage_options=json.loads(sys.argv[2]), threads=4); "
        "print(ix.fingerprint)"
    )
    env = {**os.environ, "PLITZER_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-c", code, source, json.dumps(options(proxy.endpoint))]
    proxy.reset()
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for _ in range(3)]
    outs = [p.communicate(timeout=150)[0].decode() for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    assert len(set(outs)) == 1  # the same index in every process
    gets = [(r.path, r.range) for r in proxy.log() if r.is_object_get]
    assert len(gets) == len(set(gets)) == len(files)
