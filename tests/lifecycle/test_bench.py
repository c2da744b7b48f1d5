"""The comparison harness (``plitzer.bench.baseline``), end to end on a tiny dataset.

Timings are never asserted: only that every row is produced, and that the
resume check finds what it must (plitzer and hf resume exactly, losing nothing).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import plitzer.synth
from plitzer.bench import baseline

# The harness hands every loader's batches over as torch tensors (the `baseline` extra).
pytest.importorskip("torch")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("bench-data")
    plitzer.synth.write(d, tokens=300_000, seed=3, docs_per_row_group=25, row_groups_per_file=4)
    return d


def run(tiny: Path, tmp_path: Path, loaders: str) -> dict[str, dict[str, Any]]:
    out = tmp_path / "rows.json"
    rc = baseline.main(
        [
            str(tiny),
            "--loaders",
            loaders,
            "--batch",
            "8",
            "--workers",
            "1",
            "--seq-len",
            "256",
            "--window",
            "4",
            "--time-limit",
            "10",
            "--repeat",
            "2",
            "--work",
            str(tmp_path / "work"),
            "--json",
            str(out),
        ]
    )
    assert rc == 0
    record = json.loads(out.read_text())
    assert record["tokens"] > 0 and record["lanes"] == baseline.match_lanes(
        8, record["tokens"] / record["documents"], 256
    )
    return {r["loader"]: r for r in record["rows"]}


def check_row(row: dict[str, Any]) -> None:
    assert not row["reason"], row
    assert row["mtok_s"] > 0 and row["cores"] > 0 and row["ns_token"] > 0
    assert row["peak_rss_mib"] > 0 and row["first_batch_s"] >= 0


# The peers that are installed (the `baseline` extra has them all), run with plitzer in
# one harness call: the ceiling rows and the dataset are shared, as a user's run shares them.
PEERS = [
    name
    for name, module in (("hf", "datasets"), ("litdata", "litdata"), ("grain", "grain"))
    if importlib.util.find_spec(module) is not None
]


def check_plitzer(p: dict[str, Any]) -> None:
    check_row(p)
    assert p["convert_s"] == 0 and p["converted_mib"] == 0
    assert p["exact"] == "yes" and p["lost"] == 0 and p["repeated"] == 0
    assert p["resume_s"] is not None and p["resume_s"] >= 0


def check_hf(hf: dict[str, Any]) -> None:
    check_row(hf)
    assert hf["convert_s"] > 0 and hf["converted_mib"] > 0  # the Arrow copy
    if importlib.util.find_spec("torchdata") is not None:
        assert hf["exact"] == "yes" and hf["lost"] == 0


def check_litdata(lit: dict[str, Any]) -> None:
    check_row(lit)
    assert lit["convert_s"] > 0 and lit["converted_mib"] > 0  # optimize wrote its chunks
    assert lit["exact"] in {"yes", "no"} and lit["lost"] is not None and lit["resume_s"] is not None
    assert any(n.startswith("litdata chunks hold") for n in lit["notes"]), lit["notes"]
    assert any(n.startswith("one epoch delivered") for n in lit["notes"]), lit["notes"]


def check_grain(g: dict[str, Any]) -> None:
    check_row(g)
    assert g["convert_s"] == 0 and g["converted_mib"] == 0  # the Parquet as it is
    # Grain's iterator state restores its shuffle window and packer: exactly the rest of the epoch.
    assert g["exact"] == "yes" and g["lost"] == 0 and g["repeated"] == 0, g


CHECKS = {"plitzer": check_plitzer, "hf": check_hf, "litdata": check_litdata, "grain": check_grain}


@pytest.mark.e2e
@pytest.mark.timeout(900)  # every peer's conversion and resume check in one run: 2-5 minutes on 2 busy cores
def test_plitzer_and_the_peers_end_to_end(tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = run(tiny, tmp_path, ",".join(["plitzer", *PEERS]))
    assert list(rows)[:2] == ["pyarrow", "pyarrow-rg"]  # the ceiling rows are always there, first
    assert sorted(rows) == sorted(["pyarrow", "pyarrow-rg", "plitzer", *PEERS])
    check_row(rows["pyarrow"])
    check_row(rows["pyarrow-rg"])
    for name in ["plitzer", *PEERS]:
        CHECKS[name](rows[name])
    assert rows["pyarrow"]["window_s"] > 0 and rows["pyarrow"]["resume_window_s"] > 0
    printed = capsys.readouterr().out
    assert "| loader | convert (s) |" in printed and "| plitzer | 0.0 | 0.0 |" in printed
    assert "plitzer's first batch: median " in printed and "x decoding its first window on all cores" in printed
    assert "; resume: " in printed
    assert "decode reference: pyarrow" in printed and "plitzer / reference: " in printed  # the faster decode
    record = json.loads((tmp_path / "rows.json").read_text())
    runs = record["first_batch"]["runs"]
    assert len(runs["first"]) == len(runs["window"]) == len(runs["resume"]) == 2, printed
    assert all(x > 0 for v in runs.values() for x in v)


def test_missing_peer_is_a_row_with_the_reason(
    tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PLITZER_BENCH_VENVS", str(tmp_path / "venvs"))
    monkeypatch.setitem(baseline.PEERS, "mosaic", baseline.Peer("mosaic", ("no_such_module_plitzer",), "test peer"))
    python, reason = baseline.interpreter("mosaic", setup=False)
    assert python is None and "--setup" in reason and "no_such_module_plitzer" in reason
    row = baseline.Row("mosaic", reason=reason)
    assert "| mosaic | not run: " in baseline.table([row])


def test_compare_counts_lost_and_repeated_documents(tmp_path: Path) -> None:
    # reference after the split: documents 3, 4, 5; the resumed stream lost 4 and repeated 2
    np.save(tmp_path / "save-digests.npy", np.array([1, 2, 3, 4, 5], dtype=np.uint64))
    np.save(tmp_path / "save-lengths.npy", np.array([10, 20, 30, 40, 50]))
    np.save(tmp_path / "resume-digests.npy", np.array([3, 2, 5], dtype=np.uint64))
    np.save(tmp_path / "resume-lengths.npy", np.array([30, 20, 50]))
    assert baseline.compare(tmp_path, 2, docs=True) == (False, 40, 20)
    np.save(tmp_path / "resume-digests.npy", np.array([3, 4, 5], dtype=np.uint64))
    np.save(tmp_path / "resume-lengths.npy", np.array([30, 40, 50]))
    assert baseline.compare(tmp_path, 2, docs=True) == (True, 0, 0)
