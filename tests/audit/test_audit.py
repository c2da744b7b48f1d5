"""Audits: the report and its pictures, duplicates, seek and lockstep, epochs."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import planner
import plitzer
from plitzer import audit as au
from plitzer.state import checkpoint as ckpt
from plitzer.tools.explain import document_lengths, document_table
from tests.conftest import SynthDataset, write_dataset

CFG = {"seed": 2, "lanes": 8, "window": 3, "seq_len": 80}


@pytest.fixture(scope="module")
def data(synth_dataset: SynthDataset) -> Path:
    d = synth_dataset(tokens=200_000, seed=4, docs_per_row_group=50, row_groups_per_file=4, mean_length=200)
    return d


def test_report_folder_and_single_page(data: Path, tmp_path: Path) -> None:
    report = au.audit(data, lanes=8, window=4, world=2, seq_len=96, windows=[1, 2, 4, 8])
    names = set(report.figures)
    assert {"lengths", "tokens_per_file", "lane_balance", "lockstep", "reads_per_rank", "read_amplification"} <= names
    page = report.write(tmp_path / "folder")
    assert page == tmp_path / "folder" / "report.html"
    text = page.read_text()
    for name in names:
        png = tmp_path / "folder" / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"src='{name}.png'" in text
    single = report.write(tmp_path / "one.html")
    embedded = re.findall(r"src='data:image/png;base64,", single.read_text())
    assert len(embedded) == len(names)
    for section in ("Document lengths", "Lane balance and lockstep", "Reads", "Duplicate documents", "Epochs"):
        assert f"<h2>{section}</h2>" in text
    ix = plitzer.index(data)
    assert report.tables["summary"]["documents"][0] == int(ix.frame["rows"].sum())
    assert report.tables["tokens_per_file"]["tokens"].sum() == ix.tokens


def test_balanced_steps_are_drawn_from_plan_costs(data: Path, tmp_path: Path) -> None:
    # SPEC section 18 rule 5: each sampled step's slowest rank over the mean rank, as assigned and balanced.
    report = au.audit(data, lanes=8, window=4, world=2, seq_len=96, windows=[1])
    page = report.write(tmp_path / "one.html").read_text()
    assert "<h2>Balanced steps</h2>" in page and "alt='step_balance'" in page
    got = report.tables["step_balance"]
    assert got.columns == ["step", "assigned", "balanced"] and got.height == 64  # 8 stretches of 8 steps
    assert got["step"].max() > 200  # spread over the epoch, not its first steps alone
    p = plitzer.plan(data, lanes=8, window=4, world=2, seq_len=96)
    for t, assigned, balanced in got.rows()[::9]:
        c = p.costs(t, t)
        assert assigned == pytest.approx(c["assigned"].max() / c["assigned"].mean())
        assert balanced == pytest.approx(c["balanced"].max() / c["balanced"].mean())
    summary = report.tables["step_balance_summary"]
    assert summary["rows"].to_list() == ["assigned", "balanced"] and summary["steps"].to_list() == [64, 64]
    assert 1 <= summary["median"][1] < summary["median"][0]  # dealing by cost evens the ranks out
    assert "step_balance" not in au.audit(data, lanes=8, window=4, world=1, seq_len=96, windows=[1]).figures


def test_duplicate_finder_finds_planted_duplicates(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    unique = [rng.integers(0, 50_000, int(n)).tolist() for n in rng.integers(1, 300, 60)]
    a, b = unique[3], unique[10]
    short = [5, 6, 7]
    files = [
        [[*unique[0:15], a], unique[15:30]],
        [[*unique[30:45], b, a], [a, *unique[45:60]]],
        [[b, short, [7, 6, 5], short, None, None, []]],  # permuted tokens are not duplicates
    ]
    write_dataset(tmp_path, files)
    dup = au.duplicates(tmp_path)
    groups = {
        tuple(g["length"].unique().to_list()): sorted(zip(g["file"], g["row_group"], g["row"], strict=True))
        for _, g in dup.group_by("group")
    }
    where_a = [("f000.parquet", 0, 3), ("f000.parquet", 0, 15), ("f001.parquet", 0, 16), ("f001.parquet", 1, 0)]
    assert groups[(len(a),)] == where_a
    assert sorted(groups[(len(b),)]) == [("f000.parquet", 0, 10), ("f001.parquet", 0, 15), ("f002.parquet", 0, 0)]
    assert groups[(3,)] == [("f002.parquet", 0, 1), ("f002.parquet", 0, 3)]
    assert len(groups) == 3  # empty documents are not duplicates (the length summary counts them)
    sizes = dup.group_by("group").agg(pl.col("copies").first(), pl.len())
    assert (sizes["copies"] == sizes["len"]).all()
    assert dup["group"].to_list() == sorted(dup["group"].to_list())


def test_document_table_matches_the_files(data: Path) -> None:
    docs = document_table(data)
    truth = np.concatenate(
        [pc.list_value_length(pq.read_table(p)["tokens"]).to_numpy() for p in sorted(data.glob("*.parquet"))]
    )
    np.testing.assert_array_equal(docs["length"].to_numpy(), truth)
    np.testing.assert_array_equal(document_lengths(data), truth)
    assert docs["hash"].n_unique() == docs.height  # synthetic documents are all distinct
    ix = plitzer.index(data)
    per_rg = docs.group_by("file", "row_group").agg(pl.len().alias("rows"), pl.col("length").sum().alias("tokens"))
    joined = ix.frame.join(per_rg, on=["file", "row_group"], suffix="_docs")
    assert joined.height == ix.frame.height
    assert (joined["rows"] == joined["rows_docs"]).all() and (joined["tokens"] == joined["tokens_docs"]).all()


def test_seek_and_lockstep_agree_with_the_loaders_checkpoints(data: Path) -> None:
    """seek(t) (from the plan alone) lands where the run's own checkpoint of step t is,
    and the lockstep table's lane windows are the checkpoints' units."""
    p = planner.plan(data, seed=CFG["seed"], lanes=CFG["lanes"], window=CFG["window"])
    with plitzer.Loader(data, **CFG) as loader:
        n = len(loader) + 40
        states, raw = [], []
        for _ in range(n):
            raw.append(loader.checkpoint())
            states.append(ckpt.decode(raw[-1]).positions)
            loader.next_batch()
    for t in range(0, n, 7):
        with plitzer.Loader(data, **CFG) as again:
            again.seek(t)
            np.testing.assert_array_equal(ckpt.decode(again.checkpoint()).positions, states[t], f"step {t}")
    table = au.lockstep(p, CFG["seq_len"], steps=n)
    units = np.stack([s[:, 1] * p.windows + s[:, 2] for s in states])
    np.testing.assert_array_equal(table["slowest"].to_numpy(), units.min(axis=1))
    np.testing.assert_array_equal(table["fastest"].to_numpy(), units.max(axis=1))
    assert table["token_spread"].max() <= 1
    assert table["windows_in_use"].max() <= 2 and table["windows_apart"].max() <= 1


def test_lane_balance_adds_up_and_lanes_differ_by_at_most_one(data: Path) -> None:
    p = planner.plan(data, lanes=8, window=3, world=4)
    for epoch in (0, 1):
        lanes = p.lanes(epoch)
        share = (lanes["token_end"] - lanes["token_start"]).to_numpy().reshape(-1, 8)
        np.testing.assert_array_equal(share.sum(axis=1), p.epoch(epoch).window_tokens)
        bal = au.lane_balance(p, epoch)
        assert bal["tokens"].sum() == p.tokens
        assert bal["rank"].to_list() == [0, 0, 1, 1, 2, 2, 3, 3]
        np.testing.assert_array_equal(bal["tokens"].to_numpy(), share.sum(axis=0))
        assert bal["tokens"].max() - bal["tokens"].min() <= 1


def test_every_picture_places_its_legend_without_a_timed_search(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """loc="best" searches for an empty corner and warns when that took over a second, which a
    busy machine reached (a failed audit under warnings-as-errors): every legend has its place."""
    import matplotlib.legend

    clock = iter(range(0, 10**6, 5))  # every reading 5 s after the last: any timed search is "slow"
    monkeypatch.setattr(
        matplotlib.legend, "time", type("Clock", (), {"perf_counter": staticmethod(lambda: next(clock))})
    )
    report = au.audit(data, lanes=8, window=4, world=2, seq_len=96, windows=[1, 2, 4, 8])
    report.write(tmp_path / "one.html")  # draws every figure; a warning fails the test
    with_legend = [name for name, fig in report.figures.items() if any(ax.get_legend() for ax in fig.axes)]
    assert {"lengths", "read_amplification"} <= set(with_legend)


def test_read_amplification_is_the_plans_and_within_bound(data: Path) -> None:
    amp = au.read_amplification(data, lanes=8, world=4, windows=[1, 2, 5, 20])
    for row in amp.iter_rows(named=True):
        p = planner.plan(data, lanes=8, window=row["window"], world=4)
        assert row["reads"] == p.reads(0).height
        assert row["amplification"] <= row["bound"] + 1e-12
    assert amp["amplification"][0] <= 4.0  # window 1: at most every rank reads every row group
    p = planner.plan(data, lanes=8, window=4, world=4)
    rpr = au.reads_per_rank(p)
    assert rpr["rank"].to_list() == [0, 1, 2, 3]
    assert rpr["row_groups"].sum() == p.reads(0).height and rpr["bytes"].sum() == p.reads(0)["bytes"].sum()


def test_epochs_covered_and_epoch_starts_follow_the_loader(data: Path) -> None:
    with plitzer.Loader(data, **CFG) as loader:
        n0 = len(loader)
        tokens = loader.tokens
    starts = au.epoch_starts(tokens, CFG["lanes"], CFG["seq_len"], 3)
    assert starts["first_step"].to_list()[:2] == [0, n0]
    assert starts["steps"][0] == n0
    cov = au.epochs_covered(tokens, CFG["lanes"], CFG["seq_len"], 3 * n0)
    assert cov["complete_epochs"][0] in (2, 3) and cov["last_step_epoch"][0] == (3 * n0 - 1) * 640 // tokens
    hist = au.length_histogram(document_lengths(data))
    assert hist["documents"].sum() == plitzer.index(data).frame["rows"].sum()


def test_usage_guide_examples_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/usage.md's Python blocks run in order (those marked 'not run in tests' aside)."""
    text = (Path(__file__).parents[2] / "docs" / "usage.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.DOTALL)
    assert len(blocks) >= 8
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {}
    for block in blocks:
        if not block.startswith("# not run in tests"):
            exec(compile(block, "docs/usage.md", "exec"), namespace)
    assert (tmp_path / "audit.html").exists() and (tmp_path / "audit" / "report.html").exists()
