"""The CLI against the planner's own tables, and explain against real runs."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import planner
import plitzer
from plitzer.cli import main
from tests.conftest import SynthDataset, write_dataset
from tests.s3_fixtures import S3Data, s3

__all__ = ["s3"]  # the session's S3 server fixture, imported for pytest

CFG = {"seed": 7, "lanes": 8, "window": 3, "seq_len": 96}


def _flags(cfg: dict[str, int]) -> list[str]:
    return [f"--{k.replace('_', '-')}={v}" for k, v in cfg.items()]


@pytest.fixture(scope="module")
def data(synth_dataset: SynthDataset) -> Path:
    d = synth_dataset(tokens=200_000, seed=11, docs_per_row_group=50, row_groups_per_file=4, mean_length=200)
    return d


@pytest.fixture(scope="module")
def run(data: Path) -> list[pl.DataFrame]:
    """batch.documents() of every step of an uninterrupted run past two epochs."""
    with plitzer.Loader(data, **CFG) as loader:
        steps = 2 * len(loader) + 10
        return [loader.next_batch().documents() for _ in range(steps)]


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code = main([str(a) for a in argv])
    out = capsys.readouterr().out
    assert code == 0, out
    return out


def _json_frames(out: str) -> list[pl.DataFrame]:
    return [pl.read_json(io.StringIO(line)) for line in out.splitlines() if line.startswith("[")]


def _lengths(data: Path) -> np.ndarray:
    parts = [pc.list_value_length(pq.read_table(p)["tokens"]).to_numpy() for p in sorted(data.glob("*.parquet"))]
    return np.concatenate(parts)


def test_synth_writes_what_it_says(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = _cli(capsys, "synth", tmp_path, "--tokens", "30000", "--docs-per-row-group", "20", "--seed", "3")
    files = sorted(tmp_path.glob("*.parquet"))
    assert f"wrote {len(files)} files" in out
    assert plitzer.index(tmp_path).tokens >= 30_000


def test_index_prints_the_index_and_the_length_distribution(data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = _cli(capsys, "index", data, "--format", "json")
    summary, per_rg, lengths, histogram = _json_frames(out)
    ix = planner.index(data)
    f = ix.frame
    assert summary.row(0, named=True) | {"fingerprint": ""} == {
        "files": len(list(data.glob("*.parquet"))),
        "row_groups": f.height,
        "documents": int(f["rows"].sum()),
        "tokens": ix.tokens,
        "empty_documents": 0,
        "column": "tokens",
        "dtype": "int32",
        "fingerprint": "",
    }
    assert per_rg["max"][0] == f["tokens"].max() and per_rg["min"][0] == f["tokens"].min()
    truth = _lengths(data)
    assert lengths["documents"][0] == len(truth)
    assert lengths["max"][0] == truth.max() and lengths["min"][0] == truth.min()
    assert lengths["median"][0] == round(float(np.median(truth)))
    assert histogram["documents"].sum() == len(truth) and histogram["tokens"].sum() == truth.sum()
    for row in histogram.iter_rows(named=True):
        assert row["documents"] == int(((truth >= row["from"]) & (truth < row["below"])).sum())
    # --no-lengths prints the footer-only tables.
    assert len(_json_frames(_cli(capsys, "index", data, "--format", "json", "--no-lengths"))) == 2


def test_plan_summary_tables_sql_and_files(data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = planner.plan(data, seed=1, lanes=8, window=4, world=4)
    flags = ["--seed=1", "--lanes=8", "--window=4", "--world=4"]
    out = _cli(capsys, "plan", data, *flags, "--epoch", "1", "--format", "csv")
    reads = p.reads(1)
    assert f"{reads.height} reads for {p.index.height} row groups" in out
    per_rank = pl.read_csv(io.StringIO(out.split("\n", 2)[2]))
    want = reads.group_by("rank").agg(pl.len().alias("row_groups"), pl.col("bytes").sum()).sort("rank")
    assert per_rank["row_groups"].to_list() == want["row_groups"].to_list()
    assert per_rank["bytes"].to_list() == want["bytes"].to_list()
    for table in ("index", "row_groups", "lanes", "reads"):
        got = pl.read_csv(io.StringIO(_cli(capsys, "plan", data, *flags, "--table", table, "--format", "csv")))
        frame = {"index": p.index, "row_groups": p.row_groups(0), "lanes": p.lanes(0), "reads": p.reads(0)}[table]
        assert got.equals(frame.cast(got.schema)), table  # type: ignore[arg-type]
    query = "select rank, count(*) as n, sum(bytes) as b from reads group by rank order by rank"
    got = pl.read_json(io.StringIO(_cli(capsys, "plan", data, *flags, "--sql", query, "--format", "json")))
    assert got["n"].to_list() == p.reads(0).group_by("rank").len().sort("rank")["len"].to_list()
    target = tmp_path / "rg.parquet"
    _cli(capsys, "plan", data, *flags, "--table", "row_groups", "--epoch", "2", "--format", "parquet", "--out", target)
    assert pl.read_parquet(target).equals(p.row_groups(2))


@pytest.mark.parametrize("step", [0, 1, 37, 120, 205, 290])
def test_explain_equals_the_run(data: Path, run: list[pl.DataFrame], step: int) -> None:
    got = plitzer.explain(data, step, **CFG)
    want = run[step]
    assert got["step"].unique().to_list() == [step]
    assert got.drop("step").equals(want.drop("batch_row"))
    for lane in (0, 5, 7):
        one = plitzer.explain(data, step, lane, **CFG)
        assert one.drop("step").equals(want.filter(pl.col("lane") == lane).drop("batch_row"))


@pytest.mark.parametrize("trial", range(6))
def test_explain_with_empty_and_null_documents(tmp_path: Path, trial: int) -> None:
    """Odd shapes: empty and null documents, empty row groups, long documents, uint32."""
    rng = np.random.default_rng(trial)

    def doc() -> list[int] | None:
        return None if rng.random() < 0.1 else rng.integers(0, 99, int(rng.choice([0, 1, 7, 60, 300]))).tolist()

    files = [
        [[doc() for _ in range(int(rng.integers(0, 9)))] for _ in range(int(rng.integers(1, 5)))] for _ in range(2)
    ]
    write_dataset(tmp_path, files, dtype="uint32" if trial % 2 else "int32")
    cfg = {"seed": trial, "lanes": 2 + 2 * (trial % 2), "window": 1 + trial % 3, "seq_len": 13 + 7 * trial}
    with plitzer.Loader(tmp_path, **cfg) as loader:  # lockstep: no lane starves, however few documents
        run = [loader.next_batch().documents() for _ in range(30)]
    for step in range(0, 30, 3):
        assert plitzer.explain(tmp_path, step, **cfg).drop("step").equals(run[step].drop("batch_row")), step


def test_explain_across_the_epoch_edge(data: Path, run: list[pl.DataFrame]) -> None:
    n0 = (len(run) - 10) // 2  # steps labelled epoch 0
    for step in (n0 - 1, n0, n0 + 1):
        got = plitzer.explain(data, step, **CFG)
        assert got.drop("step").equals(run[step].drop("batch_row")), step


def test_explain_rank_lanes_and_cli(data: Path, run: list[pl.DataFrame], capsys: pytest.CaptureFixture[str]) -> None:
    step = len(run) - 3  # in the third epoch of the run
    got = plitzer.explain(data, step, rank=1, world=4, **CFG)
    assert got.drop("step").equals(run[step].filter(pl.col("lane").is_in([2, 3])).drop("batch_row"))
    out = _cli(capsys, "explain", data, "--step", step, *_flags(CFG), "--format", "csv")
    assert pl.read_csv(io.StringIO(out)).drop("step").equals(run[step].drop("batch_row"))
    out = _cli(capsys, "explain", data, "--step", 40, "--lane", 6, *_flags(CFG), "--format", "csv")
    assert pl.read_csv(io.StringIO(out)).drop("step").equals(run[40].filter(pl.col("lane") == 6).drop("batch_row"))
    out = _cli(capsys, "explain", data, "--step", 40, *_flags(CFG))
    assert out.startswith(f"step 40: {run[40].height} document pieces in 8 sequences of 96 tokens")


def test_explain_refuses_bad_input(data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(plitzer.ConfigError, match="lane=8 is out of range for lanes=8"):
        plitzer.explain(data, 3, 8, **CFG)
    with pytest.raises(plitzer.ConfigError, match="step=-1"):
        plitzer.explain(data, -1, **CFG)
    assert main(["explain", str(data), "--step", "3", "--lanes", "6", "--world", "4"]) == 2
    assert "lanes=6 is not divisible by world=4" in capsys.readouterr().err


def test_audit_cli_prints_the_plan_numbers(data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = _cli(
        capsys, "audit", data, "--lanes=8", "--window=4", "--world=2", "--seq-len=96", "--format", "json",
        "--windows", "1,4,8", "--out", tmp_path / "audit",
    )  # fmt: skip
    frames = _json_frames(out)
    summary, lengths, _, _, per_rank, amp, epochs = frames
    p = planner.plan(data, lanes=8, window=4, world=2)
    assert summary["tokens"][0] == p.tokens and summary["row_groups"][0] == p.index.height
    assert lengths["documents"][0] == int(p.index["rows"].sum())
    reads = p.reads(0).group_by("rank").agg(pl.len().alias("n"), pl.col("bytes").sum()).sort("rank")
    assert per_rank["row_groups"].to_list() == reads["n"].to_list()
    assert per_rank["bytes"].to_list() == reads["bytes"].to_list()
    assert amp["window"].to_list() == [1, 4, 8]
    assert amp["reads"][1] == p.reads(0).height
    assert epochs["steps"][0] == -(-p.tokens // (8 * 96))
    assert "duplicates: 0 documents" in out
    assert (tmp_path / "audit" / "report.html").exists()


def test_bench_runs_the_baseline_or_says_why(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    import importlib.util

    if importlib.util.find_spec("plitzer.bench.baseline") is not None:
        assert main(["bench", "--help"]) == 0
        assert "usage" in capfd.readouterr().out
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    assert main(["bench"]) == 2
    assert "plitzer.bench.baseline" in capfd.readouterr().err


def test_every_subcommand_has_help_with_examples(capsys: pytest.CaptureFixture[str]) -> None:
    for cmd in ("synth", "index", "plan", "explain", "audit", "demo"):
        with pytest.raises(SystemExit) as done:
            main([cmd, "--help"])
        assert done.value.code == 0
        out = capsys.readouterr().out
        assert "example" in out, cmd
        columns = " ".join(out.split("--columns COLUMNS", 2)[-1].split("--dedupe")[0].split())
        # --columns is what a run packs, except with index --out: what the job index carries.
        assert ("the job index carries" in columns) == (cmd == "index"), (cmd, columns)
    top = subprocess.run([sys.executable, "-m", "plitzer", "--help"], capture_output=True, text=True, check=True)
    assert all(c in top.stdout for c in ("explain", "audit", "bench"))


def test_unknown_arguments_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["plan", "x", "--bogus"])
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err


def test_explain_and_index_on_s3(
    s3: S3Data, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same answers from S3 as from the local copy (the fingerprint ignores location)."""
    from tests.s3_fixtures import KEY, REGION, SECRET

    url, local = s3.url["synth"], s3.local["synth"]
    for step, lane in ((5, None), (300, 3)):
        remote = plitzer.explain(url, step, lane, storage_options=s3.options(), **CFG)
        assert remote.equals(plitzer.explain(local, step, lane, **CFG))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    out = _cli(capsys, "index", url, "--endpoint", s3.server.endpoint, "--region", REGION, "--format", "json")
    assert _json_frames(out)[2]["documents"][0] == len(_lengths(local))


def test_the_version_is_the_changelogs_newest(capsys: pytest.CaptureFixture[str]) -> None:
    """``plitzer --version`` names the release the changelog's newest section describes."""
    import re

    newest = re.search(r"^## (\d+\.\d+\.\d+)", (Path(__file__).parents[2] / "CHANGELOG.md").read_text(), re.M)
    assert newest is not None
    with pytest.raises(SystemExit) as ended:
        main(["--version"])
    assert ended.value.code == 0
    printed = capsys.readouterr().out.split()
    assert printed[0] == "plitzer"
    assert printed[1] == plitzer.__version__
    assert plitzer.__version__.split(".dev")[0] == newest.group(1)


# -- the table of subcommands -----------------------------------------------------


def test_every_setting_a_subcommand_takes_is_passed_on_by_its_name(tmp_path: Path) -> None:
    from plitzer.cli import build_parser
    from plitzer.cli.commands import run_settings

    mix = tmp_path / "mix.toml"
    mix.write_text('dedupe = "url"\n[sources.a]\npath = "a"\n[sources.b]\npath = "b"\n')
    common = ["--seed=3", "--lanes=0:8,5:4", "--window=2", "--world=2", "--seq-len=32", "--column=ids"]
    given = {"seed": 3, "lanes": [(0, 8), (5, 4)], "window": 2, "world": 2, "seq_len": 32, "column": "ids"}
    s3 = ["--endpoint=http://x", "--region=r"]
    cases = {
        ("plan", "d", "--where=a > 1", "--length-column=n", "--columns=m=0", "--exclude=e.csv", *s3): {
            "where": "a > 1",
            "length_column": "n",
            "columns": {"m": 0},
            "exclude": "e.csv",
            "storage_options": {"endpoint": "http://x", "region": "r"},
        },
        ("explain", "d", "--step=4", "--rank=1", "--budget=1000", "--dedupe=tokens"): {
            "rank": 1,
            "budget": 1000,
            "dedupe": "tokens",
        },
        ("locate", "d", "--where=id = 3", "--selection=a > 1", "--length-column=n"): {"length_column": "n"},
        ("locate", "d", "--rank=0"): {"rank": 0},
        ("audit", "--mixture", str(mix), "--columns=m"): {"columns": ["m"], "dedupe": "url"},  # the file's dedupe
    }
    parser = build_parser()
    for argv, want in cases.items():
        args = parser.parse_args([argv[0], *common, *argv[1:]])
        assert run_settings(args, "W" if args.mixture else None) == {
            **given,
            **want,
            **({"weights": "W"} if args.mixture else {}),
        }, argv
