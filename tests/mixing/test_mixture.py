"""Mixtures (SPEC section 8): shares, source epochs, worlds, resume, stages, errors."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import planner
import plitzer
from planner.mixing.sources import parse_stages
from tests.conftest import docs_by_row_group, numbered_dataset, tokens_of
from tests.reference import lane_streams, mixture_lane_streams
from tests.s3_fixtures import S3Data, s3

__all__ = ["s3"]  # the fixture, imported for pytest

NAMES = ["code", "math", "web", "wiki"]
source_lengths = st.lists(  # one source: files of row groups of document lengths
    st.lists(st.lists(st.integers(1, 60), min_size=1, max_size=5), min_size=1, max_size=4), min_size=1, max_size=2
)


@st.composite
def mixtures(draw: st.DrawFn) -> tuple[list, list[tuple[int, dict[str, int]]], dict[str, int]]:
    n = draw(st.integers(1, 4))
    lengths = [draw(source_lengths) for _ in range(n)]
    names = NAMES[:n]
    stages = []
    for i in range(draw(st.integers(1, 3))):
        w = [draw(st.integers(0, 4)) for _ in names]
        if not any(w):
            w[draw(st.integers(0, n - 1))] = 1
        stages.append((0 if i == 0 else stages[-1][0] + draw(st.integers(1, 12)), dict(zip(names, w, strict=True))))
    cfg = {
        "seed": draw(st.integers(0, 2**64 - 1)),
        "lanes": draw(st.sampled_from([1, 2, 4])),
        "window": draw(st.integers(1, 4)),
        "seq_len": draw(st.integers(4, 32)),
    }
    return lengths, stages, cfg


def _write(root: Path, lengths: list) -> tuple[dict[str, str], list]:
    sources, docs = {}, []
    for name, src in zip(NAMES, lengths, strict=False):
        files = numbered_dataset(root / name, src)
        sources[name] = str(root / name)
        docs.append(docs_by_row_group(files))
    return sources, docs


def _run(loader: plitzer.Loader, steps: int) -> list[np.ndarray]:
    return [tokens_of(loader.next_batch()).copy() for _ in range(steps)]


@given(mix=mixtures())
def test_matches_the_reference_and_every_world(tmp_path_factory: pytest.TempPathFactory, mix) -> None:
    """Every batch equals the naive model of the interleave; world 1, 2, 4 give the same global batch."""
    lengths, stages, cfg = mix
    total = sum(n for src in lengths for f in src for rg in f for n in rg)
    assume(total >= cfg["lanes"])
    root = tmp_path_factory.mktemp("mix")
    sources, docs = _write(root, lengths)
    names = sorted(sources)
    steps = 25
    ints = [(st.start, list(st.weights)) for st in parse_stages(stages, names, [1] * len(names))]
    epochs = steps * cfg["seq_len"] * cfg["lanes"] // total + 2
    if len(names) == 1:  # a mixture of one is section 3
        want = [[t for t, *_ in x] for x in lane_streams(docs[0], cfg["seed"], cfg["lanes"], cfg["window"], epochs)]
    else:
        want = mixture_lane_streams(docs, names, ints, cfg["seed"], cfg["lanes"], cfg["window"], cfg["seq_len"], steps)
    with plitzer.Loader(sources, weights=stages, budget=1 << 30, **cfg) as ld:
        got = _run(ld, steps)
    L = cfg["seq_len"]
    for t, batch in enumerate(got):
        expect = np.array([s[t * L : (t + 1) * L] for s in want])
        np.testing.assert_array_equal(batch, expect, err_msg=f"step {t}")
    worlds = [w for w in (2, 4) if cfg["lanes"] % w == 0]
    for world in worlds:
        parts = []
        for rank in range(world):
            with plitzer.Loader(sources, weights=stages, rank=rank, world=world, **cfg) as ld:
                parts.append(_run(ld, 8))
        for t in range(8):
            np.testing.assert_array_equal(np.concatenate([p[t] for p in parts]), got[t])


def _share_bounds(plan: planner.mixing.mixture.MixturePlan, epochs: int) -> None:
    """Within each stage, after every window: each source's tokens against its weight's
    share, within the bounds docs/design.md derives (behind by less than one of its row
    groups plus one token; ahead by less than its share of one largest row group of
    every source, plus one token)."""
    rg = pl.concat([plan.row_groups(e) for e in range(epochs)])
    names = plan.names
    tok = rg["tokens"].to_numpy()
    src = np.searchsorted(np.array(names), rg["source"].to_numpy())
    w = plan.settings.window
    n_win = len(tok) // w
    starts = plan.window_starts(n_win)
    max_rg = [int(p.frame["tokens"].max()) for p in plan.mixture.parts]
    per_step = plan.settings.lanes * (plan.seq_len or 0)
    for i, stage in enumerate(plan.stages):
        lo = stage.start * per_step
        hi = plan.stages[i + 1].start * per_step if i + 1 < len(plan.stages) else math.inf
        wins = [u for u in range(n_win) if lo <= starts[u] < hi]
        active = [s for s in range(len(names)) if stage.weights[s] > 0]
        total_w = sum(stage.weights)
        big = sum(max_rg[s] for s in active)
        got = np.zeros(len(names), np.int64)
        for u in wins:
            sl = slice(u * w, (u + 1) * w)
            got += np.bincount(src[sl], weights=tok[sl], minlength=len(names)).astype(np.int64)
            d = int(got.sum())
            for s in range(len(names)):
                if stage.weights[s] == 0:
                    assert got[s] == 0
                    continue
                dev = got[s] - stage.weights[s] * d / total_w
                assert dev > -(max_rg[s] + 1) - 1e-9, (i, u, s, dev)
                assert dev < stage.weights[s] / total_w * (1 + big) + 1e-9, (i, u, s, dev)


@given(mix=mixtures())
def test_shares_within_one_row_group_and_source_epochs_whole(tmp_path_factory, mix) -> None:
    lengths, stages, cfg = mix
    root = tmp_path_factory.mktemp("mix")
    sources, _ = _write(root, lengths)
    ix = planner.mixing.mixture.mixture_index(sources)
    p = planner.mixing.mixture.MixturePlan(
        ix,
        planner.PlanSettings(seed=cfg["seed"], lanes=cfg["lanes"], window=cfg["window"]),
        parse_stages(stages, ix.names, [x.tokens for x in ix.parts]),
        seq_len=cfg["seq_len"],
    )
    if len(ix.names) > 1:
        _share_bounds(p, 4)
    # Within each source epoch, every row group of the source at most once, and
    # every completed source epoch holds all of them.
    rg = pl.concat([p.row_groups(e) for e in range(4)])
    per = rg.group_by("source", "source_epoch").agg(pl.len().alias("n"), pl.col("file").n_unique().alias("f"))
    keys = rg.group_by("source", "source_epoch", "file", "row_group").len()
    assert keys["len"].max() == 1
    sizes = dict(zip(ix.names, [x.row_groups for x in ix.parts], strict=True))
    last = rg.group_by("source").agg(pl.col("source_epoch").max().alias("m"))
    done = per.join(last, on="source").filter(pl.col("source_epoch") < pl.col("m"))
    for row in done.iter_rows(named=True):
        assert row["n"] == sizes[row["source"]]


@pytest.fixture(scope="module")
def three(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("three")
    for i, (name, tokens) in enumerate([("books", 40_000), ("code", 90_000), ("web", 200_000)]):
        plitzer.synth.write(root / name, tokens=tokens, seed=i, docs_per_row_group=30, row_groups_per_file=3)
    return {n: str(root / n) for n in ("books", "code", "web")}


CFG = {"seed": 4, "lanes": 8, "window": 3, "seq_len": 64}
STAGES = [(0, {"books": 1, "code": 1, "web": 2}), (60, {"books": 0, "code": 3, "web": 1})]


def test_resume_in_another_world_and_across_a_future_stage_change(three: dict[str, str]) -> None:
    with plitzer.Loader(three, weights=STAGES, **CFG) as ref:
        full = _run(ref, 120)
    # Resume at random steps in another world size: the same global batches.
    rng = np.random.default_rng(0)
    for k in sorted(rng.choice(110, 4, replace=False).tolist()):
        with plitzer.Loader(three, weights=STAGES, **CFG) as a:
            _run(a, k)
            state = a.checkpoint()
        parts = []
        for rank in range(2):
            with plitzer.Loader(three, weights=STAGES, world=2, rank=rank, **CFG) as b:
                b.resume(state)
                parts.append(_run(b, 5))
        for t in range(5):
            np.testing.assert_array_equal(np.concatenate([p[t] for p in parts]), full[k + t])
    # A resume at step 40 that changes only the future stage (starts at 60 -> 80, other
    # weights): the run goes on exactly as one with the new schedule from the start.
    changed = [STAGES[0], (80, {"books": 2, "code": 0, "web": 1})]
    with plitzer.Loader(three, weights=STAGES, **CFG) as a:
        _run(a, 40)
        state = a.checkpoint()
    with plitzer.Loader(three, weights=changed, **CFG) as b:
        b.resume(state)
        resumed = _run(b, 80)
    with plitzer.Loader(three, weights=changed, **CFG) as c:
        straight = _run(c, 120)
    for t in range(80):
        np.testing.assert_array_equal(resumed[t], straight[40 + t], err_msg=f"step {40 + t}")
    # Changing a stage already begun, or the sources, is refused field by field.
    with plitzer.Loader(three, weights=[(0, {"books": 1, "code": 1, "web": 3})], **CFG) as d:
        with pytest.raises(plitzer.CheckpointError, match="stages up to step 40"):
            d.resume(state)
    with plitzer.Loader({"code": three["code"], "web": three["web"]}, **CFG) as e:
        with pytest.raises(plitzer.CheckpointError, match="sources: checkpoint"):
            e.resume(state)


def test_stage_change_repeats_and_skips_nothing(three: dict[str, str]) -> None:
    """Across a stage change each source goes on where it stopped (its source epochs in
    order, no row group twice within one), and a source weighted 0 is not read."""
    with plitzer.Loader(three, weights=STAGES, **CFG) as ld:
        p = ld.plan
        rg = pl.concat([p.row_groups(e) for e in range(3)])
        starts = p.window_starts(rg.height // CFG["window"])
    for name, g in rg.group_by("source"):
        seq = g.select("source_epoch", "file", "row_group").rows()
        epochs = [e for e, *_ in seq]
        assert epochs == sorted(epochs)
        for e in set(epochs):
            items = [(f, r) for ep, f, r in seq if ep == e]
            assert len(items) == len(set(items)), name
    window_start = np.repeat(starts, CFG["window"])
    books = rg.with_columns(pl.Series("start", window_start)).filter(pl.col("source") == "books")
    boundary = 60 * CFG["lanes"] * CFG["seq_len"]
    assert books.height > 0 and books["start"].max() < boundary  # weight 0 from step 60 on
    assert (window_start >= boundary).sum() > 0


def test_one_source_without_weights_is_section_3(three: dict[str, str]) -> None:
    with plitzer.Loader(three["code"], **CFG) as plain, plitzer.Loader({"code": three["code"]}, **CFG) as mixed:
        for _ in range(30):
            a, b = plain.next_batch(), mixed.next_batch()
            np.testing.assert_array_equal(tokens_of(a), tokens_of(b))
        docs = b.documents()
        assert set(docs["source"].to_list()) == {"code"}
        assert docs.drop("source").equals(a.documents())


def test_plan_tables_and_sql_carry_the_sources(three: dict[str, str]) -> None:
    p = plitzer.plan(three, weights={"books": 1, "code": 1, "web": 2}, lanes=8, window=3, world=2)
    assert {"source", "source_epoch"} <= set(p.row_groups(0).columns)
    assert {"source", "source_epoch"} <= set(p.reads(0).columns)
    assert "source" in p.index.columns
    src = p.sql("select name, tokens, row_groups from sources order by name")
    assert src["name"].to_list() == ["books", "code", "web"]
    share = p.sql(
        """
        select r.source, sum(r.tokens) / (select sum(tokens) from row_groups) as delivered, s.target_share
        from row_groups r join stages s on r.source = s.source
        group by r.source, s.target_share order by r.source
        """,
        epochs=[0, 1, 2],
    )
    for row in share.iter_rows(named=True):
        assert abs(row["delivered"] - row["target_share"]) < 0.05, row


def test_bad_weights_are_config_errors(three: dict[str, str]) -> None:
    cases = [
        ({"books": 1, "code": 1, "web": 1, "news": 1}, "unknown source 'news'"),
        ({"books": 1, "code": -1, "web": 1}, "weights must be >= 0"),
        ({"books": 0, "code": 0, "web": 0}, "every weight is 0"),
        ({"books": 1, "code": 1}, "no weight for source 'web'"),
        ([(0, {"books": 1, "code": 1, "web": 1}), (0, {"books": 1, "code": 1, "web": 1})], "is not after"),
        ([(5, {"books": 1, "code": 1, "web": 1})], "must start at step 0"),
        ({"books": "x", "code": 1, "web": 1}, "a weight is a number"),
    ]
    for weights, text in cases:
        with pytest.raises(plitzer.ConfigError, match=text):
            plitzer.Loader(three, weights=weights, **CFG)
    with pytest.raises(plitzer.ConfigError, match="weights= needs named sources"):
        plitzer.Loader(three["web"], weights={"web": 1}, **CFG)


def test_empty_source_and_dtype_mismatch_are_config_errors(tmp_path: Path, three: dict[str, str]) -> None:
    from tests.conftest import write_dataset

    write_dataset(tmp_path / "empty", [[[[], []]]])
    with pytest.raises(plitzer.ConfigError, match=r"source 'empty' .* has no tokens"):
        plitzer.Loader({"empty": str(tmp_path / "empty"), "web": three["web"]}, **CFG)
    write_dataset(tmp_path / "u32", [[[[1, 2, 3] * 50]]], dtype="uint32")
    with pytest.raises(plitzer.ConfigError, match="different token dtypes"):
        plitzer.Loader({"u32": str(tmp_path / "u32"), "web": three["web"]}, **CFG)


def test_s3_and_local_sources_in_one_mixture(s3: S3Data, three: dict[str, str]) -> None:
    """A source on S3 (with its own storage options) beside local ones: the same batches
    as the same mixture all on disk."""
    url, local = s3.url["synth"], str(s3.local["synth"])
    weights = {"books": 1, "remote": 2, "web": 1}
    on_disk = {"books": three["books"], "remote": local, "web": three["web"]}
    mixed = {"books": three["books"], "remote": {"path": url, "storage_options": s3.options()}, "web": three["web"]}
    with plitzer.Loader(on_disk, weights=weights, **CFG) as a, plitzer.Loader(mixed, weights=weights, **CFG) as b:
        for _ in range(40):
            np.testing.assert_array_equal(tokens_of(a.next_batch()), tokens_of(b.next_batch()))
        assert set(b.next_batch().documents()["source"].to_list()) <= {"books", "remote", "web"}


def test_cli_mixture_file(three: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from plitzer.cli import main

    constant = tmp_path / "mix.toml"
    constant.write_text(
        "".join(
            f'[sources.{n}]\npath = "{p}"\nweight = {w}\n' for (n, p), w in zip(three.items(), (1, 1, 2), strict=True)
        )
    )
    query = "select source, count(*) as n, sum(tokens) as t from row_groups group by source order by source"
    flags = ["--lanes", "8", "--window", "3", "--format", "csv"]
    assert main(["plan", "--mixture", str(constant), "--sql", query, *flags]) == 0
    got = pl.read_csv(capsys.readouterr().out.encode())
    want = plitzer.plan(three, weights={"books": 1, "code": 1, "web": 2}, lanes=8, window=3).sql(query)
    assert got["source"].to_list() == want["source"].to_list() and got["n"].to_list() == want["n"].to_list()
    staged = tmp_path / "stages.toml"
    staged.write_text(
        "".join(f'[sources.{n}]\npath = "{p}"\n' for n, p in three.items())
        + "[[stages]]\nstep = 0\nweights = { books = 1, code = 1, web = 1 }\n"
        + "[[stages]]\nstep = 50\nweights = { books = 0, code = 1, web = 3 }\n"
    )
    assert main(["plan", "--mixture", str(staged), "--seq-len", "64", "--table", "sources", *flags]) == 0
    assert pl.read_csv(capsys.readouterr().out.encode())["name"].to_list() == ["books", "code", "web"]
    bad = tmp_path / "bad.toml"
    bad.write_text('[sources.web]\npath = "x"\nweight = 1\n[sources.code]\npath = "y"\n')
    assert main(["plan", "--mixture", str(bad), *flags]) != 0
    assert "no weight for source 'code'" in capsys.readouterr().err
