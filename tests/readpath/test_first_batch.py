"""The first batch: it waits for its window's decode and packing, nothing more, and a
fresh process reaches it without paying for imports it does not need."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import plitzer
import plitzer.readpath.scan
from plitzer.readpath.read import read_chunk
from tests.conftest import SynthDataset

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def data(synth_dataset: SynthDataset) -> Path:
    return synth_dataset(tokens=200_000, seed=5, docs_per_row_group=50, row_groups_per_file=4, mean_length=120)


CFG = {"seed": 3, "lanes": 16, "window": 8, "seq_len": 64, "threads": 2}


def test_the_first_batch_waits_for_its_window_and_nothing_else(data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first window is READING until its last row group decodes, then packed and served."""
    with plitzer.Loader(data, **CFG) as ref:  # type: ignore[arg-type]
        want = np.from_dlpack(ref.next_batch().tokens).copy()
        plan = ref.plan
    ep = plan.epoch(0)
    rgs = ep.order[ep.reads_of(0, 0)].tolist()
    assert len(rgs) == CFG["window"]
    last = rgs[-1]
    gate = threading.Event()
    real = read_chunk

    def slow_last(index: object, g: int) -> object:
        if g == last:
            assert gate.wait(30), "the test never released the last row group"
        return real(index, g)  # type: ignore[arg-type]

    monkeypatch.setattr(plitzer.readpath.scan, "read_chunk", slow_last)
    with plitzer.Loader(data, **CFG) as ld:  # type: ignore[arg-type]
        assert ld.stats.units_in_flight == 0  # construction starts no read
        got: list[np.ndarray] = []
        worker = threading.Thread(target=lambda: got.append(np.from_dlpack(ld.next_batch().tokens)))
        worker.start()
        deadline = time.monotonic() + 30
        while ld.stats.rows_read < len(rgs) - 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert ld.stats.units_in_flight >= 1 and not got  # waits for the last row group
        gate.set()
        worker.join(30)
        assert ld.stats.wait_seconds > 0
    np.testing.assert_array_equal(got[0], want)


def test_a_read_error_fails_the_step(data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with plitzer.Loader(data, **CFG) as ref:  # type: ignore[arg-type]
        ep = ref.plan.epoch(0)
    bad = int(ep.order[ep.reads_of(0, 0)][3])
    real = read_chunk

    def broken(index: object, g: int) -> object:
        if g == bad:
            msg = f"row group {g} is damaged"
            raise plitzer.DataError(msg)
        return real(index, g)  # type: ignore[arg-type]

    monkeypatch.setattr(plitzer.readpath.scan, "read_chunk", broken)
    with plitzer.Loader(data, **CFG) as ld, pytest.raises(plitzer.DataError, match=f"row group {bad}"):  # type: ignore[arg-type]
        ld.next_batch()


def test_the_first_batch_does_not_import_pandas(data: Path) -> None:
    """pyarrow's ``to_numpy`` and ``pa.array`` import pandas on first use (0.23 s):
    a cost on the first batch of every fresh process that the read and pack paths avoid."""
    code = (
        "import sys, plitzer\n"
        f"ld = plitzer.Loader({str(data)!r}, seed=0, lanes=16, window=8, seq_len=64, threads=2)\n"
        "ld.next_batch(); ld.checkpoint(); ld.close()\n"
        "assert 'pandas' not in sys.modules, 'pandas was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, timeout=120)


def _env_after_import(env: dict[str, str], first: str = "") -> dict[str, object]:
    code = (
        f"{first}\nimport json, os, plitzer\n"
        "print(json.dumps({'applied': plitzer.readpath.allocators.applied,"
        " 'rjem': os.environ.get('_RJEM_MALLOC_CONF'), 'mi': os.environ.get('MIMALLOC_PURGE_DELAY')}))"
    )
    base = {k: v for k, v in os.environ.items() if k not in {"_RJEM_MALLOC_CONF", "MIMALLOC_PURGE_DELAY"}}
    out = subprocess.run(
        [sys.executable, "-c", code], env={**base, **env}, cwd=REPO, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_allocator_defaults_keep_freed_window_buffers() -> None:
    """Polars' jemalloc and pyarrow's mimalloc keep freed pages a few seconds (docs/design.md, 'Page faults')."""
    got = _env_after_import({})
    assert got["applied"] == {"polars": True, "pyarrow": True}
    # Polars prepends its own defaults; jemalloc takes the last value of a repeated key.
    assert str(got["rjem"]).endswith("dirty_decay_ms:5000,muzzy_decay_ms:5000")
    assert got["mi"] == "5000"


def test_allocator_defaults_yield_to_the_user() -> None:
    got = _env_after_import({"MIMALLOC_PURGE_DELAY": "10"})
    assert got["mi"] == "10" and got["applied"] == {"polars": True, "pyarrow": False}
    got = _env_after_import({"PLITZER_ALLOCATOR": "default"})
    assert got["applied"] == {"polars": False, "pyarrow": False} and got["mi"] is None
    got = _env_after_import({}, first="import polars, pyarrow")  # loaded first: too late to change
    assert got["applied"] == {"polars": False, "pyarrow": False} and got["mi"] is None


def test_a_unit_packed_for_some_lanes_is_those_rows_of_all_lanes(data: Path) -> None:
    """pack_unit for a rank's lanes gives those rows of the all-lanes packing, and from_step
    drops exactly the steps before it: the step-major layout does not depend on the world size."""
    from planner.run import UnitPlace, lane_base
    from plitzer.readpath.pack import pack_unit
    from plitzer.readpath.packed import UnitReads

    with plitzer.Loader(data, **CFG) as ld:  # type: ignore[arg-type]
        plan, index = ld.plan, ld.index
    rows = index.frame["rows"].to_numpy()
    doc_base = np.cumsum(rows) - rows
    seq_len = CFG["seq_len"]
    for epoch, window in [(0, 0), (0, 1), (1, 2)]:
        ep = plan.epoch(epoch)
        pos = ep.reads_of(window, 0)
        rgs = ep.order[pos]
        chunks = [read_chunk(index, int(g)) for g in rgs]
        unit = plan.unit(epoch, window)
        base = lane_base(plan, unit, range(16))

        def pack(lanes: range, from_step: int = 0) -> Any:
            place = UnitPlace(
                unit=unit,  # noqa: B023
                epoch=epoch,  # noqa: B023
                window=window,  # noqa: B023
                row_groups=rgs,  # noqa: B023
                token_start=ep.token_start[pos],  # noqa: B023
                window_tokens=int(ep.window_tokens[window]),  # noqa: B023
                window_z=int(ep.window_z[window]),  # noqa: B023
                lanes=CFG["lanes"],
                rank_lanes=lanes,
                lane_base=base[lanes.start : lanes.stop],  # noqa: B023
                units_per_row=seq_len,
                seed=CFG["seed"],
                from_step=from_step,
            )
            return pack_unit(chunks, UnitReads(place, doc_base[rgs], 0, np.dtype(np.int32)))  # noqa: B023

        whole = pack(range(16))
        assert whole.t1 > whole.t0
        for lanes in (range(0, 8), range(5, 11)):
            part = pack(lanes)
            np.testing.assert_array_equal(part.block, whole.block[:, lanes.start : lanes.stop])
        later = pack(range(16), from_step=whole.t0 + 2)
        assert later.steps.first == whole.t0 + 2
        np.testing.assert_array_equal(later.block, whole.block[2:])


def test_a_budget_that_cannot_read_ahead_gives_the_same_batches(data: Path) -> None:
    """At the budget floor units are read only when asked for: the batches are the same."""
    from plitzer.loader import budget_floor

    with plitzer.Loader(data, **CFG) as ref:  # type: ignore[arg-type]
        f = ref.index.frame
        want = [np.from_dlpack(ref.next_batch().tokens).copy() for _ in range(40)]
    floor, _ = budget_floor(
        f["tokens"].to_numpy(), f["rows"].to_numpy(), lanes=CFG["lanes"], window=CFG["window"], seq_len=CFG["seq_len"]
    )
    with pytest.warns(plitzer.PerformanceWarning):
        ld = plitzer.Loader(data, **CFG, budget=floor)  # type: ignore[arg-type]
    with ld:
        for t in range(40):
            np.testing.assert_array_equal(np.from_dlpack(ld.next_batch().tokens), want[t])
        assert ld.stats.overruns == 0
