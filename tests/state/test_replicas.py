"""One read a replica (SPEC section 19): a data-parallel x tensor-parallel mesh of gloo processes.

Four processes as DP 2 x TP 2 (tests/replica_worker.py, ``plitzer.torch.Dataset(mesh=, dp="dp")``):
the ranks of each tensor-parallel group yield the same batches and the same ``state_dict()`` bytes;
the readers' rows are the global batch dealt over the two readers (balance on); a checkpoint taken
there resumes as DP 1 x TP 2 and in one process. Against the S3 test server with one counting
proxy a process: the non-readers make no request, and each reader makes what the same rank of a
plain DP 2 job makes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import plitzer
import plitzer.synth
from tests.net import gloo_job
from tests.readpath.test_balance import SHAPE
from tests.readpath.test_balance_gloo import _check
from tests.replica_worker import SETTINGS
from tests.s3_fixtures import FaultProxy, S3Data, s3

pytest.importorskip("torch")
pytestmark = pytest.mark.slow  # real processes and gloo (the checkout run of .ci/run runs it)
__all__ = ["s3"]  # the fixture, imported for pytest

FIELDS = (
    "step",
    "epoch",
    "lanes",
    "cost",
    "tokens",
    "labels",
    "mask",
    "source_ids",
    "source_tokens",
    "cu_seqlens",
    "doc_lengths",
    "documents",
)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("replicas")
    plitzer.synth.write(d, tokens=120_000, seed=11, **SHAPE)
    return d


def _mesh(data: str, dp: int, tp: int, out: Path, tag: str, *extra: str) -> list[dict[str, Any]]:
    args = ["--data", data, "--dp", str(dp), "--tp", str(tp), *extra]
    return gloo_job("replica_worker.py", args, out, tag, dp * tp, timeout=240)


def test_a_replica_yields_its_readers_batches_and_resumes_at_other_sizes(data: Path, tmp_path: Path) -> None:
    got = _mesh(str(data), 2, 2, tmp_path, "dp2tp2", "--steps", "5", "--state-at", "3")
    assert [g["reader"] for g in got] == [True, False, True, False]  # mesh rank = dp * 2 + tp
    assert [g["rank"] for g in got] == [0, 0, 1, 1] and {g["world"] for g in got} == {2}
    for reader, follower in ((got[0], got[1]), (got[2], got[3])):
        for a, b in zip(reader["steps"], follower["steps"], strict=True):
            assert {f: a[f] for f in FIELDS} == {f: b[f] for f in FIELDS}
            ids = np.array(a["source_ids"])  # one source: 0 on its tokens, -1 on padding
            assert ((ids == 0) == np.array(a["mask"])).all() and a["source_tokens"] == [int((ids == 0).sum())]
        assert reader["next"] == follower["next"]
    assert len({g["state"] for g in got}) == 1
    with plitzer.Loader(data, **SETTINGS) as ld:
        want = [ld.next_batch() for _ in range(5)]
    _check(want, [got[0], got[2]], 2)
    state = got[0]["state"]
    # DP 1 x TP 2, balance off: both ranks give the whole global batch of steps 3 and 4.
    again = _mesh(str(data), 1, 2, tmp_path, "dp1tp2", "--steps", "2", "--balance", "0", "--resume", state)
    for g in again:
        for s, w in zip(g["steps"], want[3:], strict=True):
            assert s["step"] == w.step and s["lanes"] == list(range(8))
            np.testing.assert_array_equal(np.array(s["tokens"]), np.asarray(w.tokens))
    with plitzer.Loader(data, **SETTINGS) as one:
        one.resume(bytes.fromhex(state))
        assert one.step == 3
        np.testing.assert_array_equal(np.asarray(one.next_batch().tokens), np.asarray(want[3].tokens))


def test_non_readers_make_no_request(s3: S3Data, tmp_path: Path) -> None:
    url = s3.url["synth"]

    def job(dp: int, tp: int, tag: str) -> tuple[list[dict[str, Any]], list[list[tuple[str, ...]]]]:
        proxies = [FaultProxy(s3.server.port) for _ in range(dp * tp)]
        try:
            endpoints = json.dumps([p.endpoint for p in proxies])
            got = _mesh(url, dp, tp, tmp_path, tag, "--steps", "-1", "--epochs", "1", "--endpoints", endpoints)
            return got, [sorted((r.method, r.path, r.query, str(r.range)) for r in p.log()) for p in proxies]
        finally:
            for p in proxies:
                p.stop()

    # One epoch to its end (a finite run): each job reads every row group it needs once, whatever
    # its threads' timing, so the requests compare one for one.
    got, requests = job(2, 2, "s3-dp2tp2")
    plain, plain_requests = job(2, 1, "s3-dp2")
    print({"dp2tp2": [len(r) for r in requests], "dp2": [len(r) for r in plain_requests]})
    assert requests[1] == [] and requests[3] == []  # the non-readers: no listing, no footer, no GET
    assert requests[0] == plain_requests[0] and requests[2] == plain_requests[1]
    assert all(any(m == "GET" for m, *_ in r) for r in plain_requests)
    for r in range(2):
        assert len(got[2 * r]["steps"]) == len(plain[r]["steps"]) > 4
        for a, b in zip(got[2 * r]["steps"], plain[r]["steps"], strict=True):
            assert a["tokens"] == b["tokens"] and a["lanes"] == b["lanes"]
