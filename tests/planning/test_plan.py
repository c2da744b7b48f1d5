"""The planner's invariants (SPEC sections 3, 4 and 6), as properties."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import given
from hypothesis import strategies as st

import planner
from planner.hashing import key, mix, mix_array, permutation
from planner.lanes import window_offsets
from tests import reference
from tests.conftest import SynthDataset


@given(st.integers(0, 2**64 - 1))
def test_mix_matches_the_reference_and_vectorizes(x: int) -> None:
    assert mix(x) == reference.mix(x)
    assert int(mix_array(np.array([x], dtype=np.uint64))[0]) == reference.mix(x)


@given(st.integers(0, 300), st.integers(0, 2**64 - 1))
def test_permutation_matches_the_reference(n: int, k: int) -> None:
    assert permutation(n, k).tolist() == reference.permutation(n, k)


def test_known_values() -> None:
    # Pinned numbers, so that any port (Rust, C++, JS) can check itself.
    assert mix(0) == 0xE220A8397B1DCDAF
    assert key(0, 0, 1) == reference.key(0, 0, 1)
    assert permutation(5, key(0, 0, 1)).tolist() == [2, 1, 3, 4, 0]


def _index(tokens: list[int], rows: list[int] | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    t = np.array(tokens, dtype=np.int64)
    r = np.array(rows if rows is not None else [max(1, x // 3) for x in tokens], dtype=np.int64)
    return t, r, np.zeros_like(t)


row_group_docs = st.lists(st.lists(st.integers(0, 50), min_size=0, max_size=5), min_size=1, max_size=30)
settings = st.tuples(
    st.integers(0, 2**64 - 1), st.sampled_from([1, 2, 4, 6, 8, 12]), st.integers(1, 6), st.integers(0, 3)
)


@given(rgs=row_group_docs, s=settings, data=st.data())
def test_epoch_plan_invariants(rgs: list[list[int]], s: tuple[int, int, int, int], data: st.DataObject) -> None:
    seed, lanes, window, epoch = s
    world = data.draw(st.sampled_from([w for w in (1, 2, 3, 4, 6) if lanes % w == 0]))
    tokens = np.array([sum(d) for d in rgs], dtype=np.int64)
    rows = np.array([len(d) for d in rgs], dtype=np.int64)
    empty = np.array([sum(1 for x in d if x == 0) for d in rgs], dtype=np.int64)
    ps = planner.PlanSettings(seed=seed, lanes=lanes, window=window, world=world)
    ep = planner.plan_epoch(tokens, rows, empty, ps, epoch)
    g = len(rgs)
    # Every row group exactly once; windows are consecutive runs of W.
    assert sorted(ep.order.tolist()) == list(range(g))
    assert ep.order.tolist() == reference.permutation(g, reference.key(seed, epoch, 1))
    assert ep.window.tolist() == [i // window for i in range(g)]
    nw = -(-g // window)
    per = lanes // world
    reads_total = 0
    run = epoch * int(tokens.sum())
    docs = [[[0] * n for n in d] for d in rgs]
    for w in range(nw):
        group = ep.order[w * window : (w + 1) * window].tolist()
        cuts = ep.cuts(w, lanes)
        assert cuts.tolist() == reference.cuts(int(tokens[group].sum()), lanes, run % lanes)
        assert int(ep.window_z[w]) == run % lanes
        # Pieces by the naive model: together, in lane order, they tile the window's
        # stream, document after document; lanes get q or q + 1 tokens.
        slices = reference.lane_slices(docs, group, lanes, run % lanes)
        stream = [(gg, r, o) for gg in group for r, n in enumerate(rgs[gg]) for o in range(n)]
        tiled = [(gg, r, o + i) for sl in slices for gg, r, o, n in sl for i in range(n)]
        assert tiled == stream
        shares = [sum(n for *_, n in sl) for sl in slices]
        assert max(shares) - min(shares) <= 1
        for rank in range(world):
            need = {gg for k in range(rank * per, (rank + 1) * per) for gg, *_ in slices[k]}
            got = ep.order[ep.reads_of(w, rank)].tolist()
            assert need <= set(got), (w, rank, need, got)
            if not empty[group].any():
                assert need == set(got), (w, rank, need, got)  # exactly what the rank needs
            assert got == [x for x in group if x in set(got)]  # stream order
            reads_total += len(got)
        run += int(tokens[group].sum())
    assert reads_total <= int((rows > 0).sum()) + (world - 1) * nw


@given(total=st.integers(0, 400), lanes=st.integers(1, 40), z=st.integers(0, 10**6), data=st.data())
def test_lane_of_inverts_the_cuts(total: int, lanes: int, z: int, data: st.DataObject) -> None:
    """The closed-form lane of a position is max{k < B : c_k <= x} over the naive cuts."""
    z %= lanes
    cuts = reference.cuts(total, lanes, z)
    q, r = divmod(total, lanes)
    np.testing.assert_array_equal(planner.cut_at(np.arange(lanes + 1), q, r, z, lanes), cuts)
    xs = np.arange(total + 1)
    want = [max(k for k in range(lanes) if cuts[k] <= x) for x in xs.tolist()]
    np.testing.assert_array_equal(planner.lane_of(xs, q, r, z, lanes), want)


def test_worked_example_of_the_spec() -> None:
    """SPEC section 3 rule 4: B = 4, T_w = 10, z = 3 gives cuts 0, 3, 5, 7, 10."""
    assert reference.cuts(10, 4, 3) == [0, 3, 5, 7, 10]
    assert planner.cut_at(np.arange(5), 2, 2, 3, 4).tolist() == [0, 3, 5, 7, 10]
    assert window_offsets(np.array([10, 5]), 0, 15, 4).tolist() == [0, 2]
    assert window_offsets(np.array([10, 5]), 1, 15, 4).tolist() == [3, 1]


def test_reads_amplification_bound_on_realistic_data() -> None:
    rng = np.random.default_rng(0)
    tokens = rng.integers(500_000, 1_500_000, 2000)
    rows = tokens // 1000
    for world, window in [(8, 64), (8, 512), (4, 16)]:
        ep = planner.plan_epoch(
            tokens, rows, np.zeros_like(rows), planner.PlanSettings(lanes=512, window=window, world=world), 0
        )
        amp = len(ep.read_position) / len(tokens)
        nw = -(-len(tokens) // window)
        assert amp <= 1 + (world - 1) * nw / len(tokens) + 1e-9  # 1 + (world-1)/W when W divides G


def test_seeds_and_epochs_change_the_order_and_nothing_else_does() -> None:
    t, r, e = _index(list(range(1, 65)))
    ps = planner.PlanSettings(seed=1, lanes=8, window=4)
    a = planner.plan_epoch(t, r, e, ps, 0).order
    assert np.array_equal(a, planner.plan_epoch(t, r, e, ps, 0).order)
    assert not np.array_equal(a, planner.plan_epoch(t, r, e, ps, 1).order)
    other = planner.PlanSettings(seed=2, lanes=8, window=4)
    assert not np.array_equal(a, planner.plan_epoch(t, r, e, other, 0).order)
    code = (
        "import numpy as np, planner;"
        "t=np.arange(1,65);r=np.maximum(1,t//3);"
        "print(planner.plan_epoch(t,r,np.zeros_like(t),planner.PlanSettings(seed=1,lanes=8,window=4),0).order.tolist())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == str(a.tolist())


@pytest.fixture(scope="module")
def data(synth_dataset: SynthDataset) -> Path:
    d = synth_dataset(tokens=200_000, seed=1, docs_per_row_group=30, row_groups_per_file=5, mean_length=120)
    return d


def test_tables_have_the_spec_columns(data: Path) -> None:
    p = planner.plan(data, seed=0, lanes=8, window=4, world=2)
    assert p.row_groups(0).columns == [
        "epoch", "window_index", "position", "file", "row_group", "rows", "tokens", "token_start",
        "first_rank", "last_rank",
    ]  # fmt: skip
    assert p.lanes(1).columns == ["epoch", "window_index", "lane", "rank", "token_start", "token_end"]
    assert p.reads(2).columns == ["epoch", "window_index", "rank", "file", "row_group", "bytes"]
    assert p.index.height == p.row_groups(0).height
    lanes = p.lanes(0)
    assert lanes.height == p.windows * 8
    rg = p.row_groups(0)
    # token_end of the last lane is the window's tokens.
    t_w = rg.group_by("window_index").agg(pl.col("tokens").sum()).sort("window_index")["tokens"]
    assert lanes.filter(pl.col("lane") == 7).sort("window_index")["token_end"].to_list() == t_w.to_list()


def test_sql_over_the_tables(data: Path) -> None:
    p = planner.plan(data, seed=0, lanes=8, window=4, world=2)
    got = p.sql("select rank, count(*) as n from reads group by rank order by rank", epochs=[0, 1])
    want = pl.concat([p.reads(0), p.reads(1)]).group_by("rank").len().sort("rank")
    assert got["n"].to_list() == want["len"].to_list()
    joined = p.sql("select sum(i.tokens) as t from row_groups r join index i using (file, row_group) where r.epoch = 0")
    assert int(joined["t"][0]) == p.tokens
    assert planner.plan is __import__("plitzer").plan


def test_scan_yields_exactly_the_rows_a_rank_reads(data: Path) -> None:
    p = planner.plan(data, seed=3, lanes=8, window=4, world=2)
    for rank in range(2):
        lf = p.scan(1, rank=rank)
        assert isinstance(lf, pl.LazyFrame)
        df = lf.collect()
        reads = p.reads(1).filter(pl.col("rank") == rank)
        want = reads.join(p.index, on=["file", "row_group"])["rows"].sum()
        assert df.height == want
        tok = df["tokens"].list.len().sum()
        assert tok == reads.join(p.index, on=["file", "row_group"])["tokens"].sum()


def test_bad_settings_are_config_errors() -> None:
    with pytest.raises(planner.ConfigError, match="lanes=10 is not divisible by world=4"):
        planner.PlanSettings(lanes=10, world=4)
    with pytest.raises(ValueError, match="window=0"):
        planner.PlanSettings(window=0)


def test_every_column_is_bare_sql_and_every_documented_query_runs(data: Path) -> None:
    """No plan table has a column that needs quoting in DuckDB (``window`` is a keyword),
    and every ``plan.sql`` query and ``--sql`` of the README, docs/usage.md and the
    notebooks runs against a real plan."""
    import re

    p = planner.plan(data, lanes=8, window=2, world=2)
    for table in ("index", "row_groups", "lanes", "reads"):
        cols = p.sql(f"select * from {table} limit 0").columns
        assert "window" not in cols
        p.sql(f"select {', '.join(cols)} from {table}")  # every column, unquoted
    import json

    root = Path(__file__).parents[2]
    texts = [(root / f).read_text() for f in ("README.md", "docs/usage.md")]
    for nb in sorted((root / "notebooks").glob("*.ipynb")):
        cells = json.loads(nb.read_text())["cells"]
        texts += ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    queries = []
    for text in texts:
        queries += re.findall(r'plan\.sql\(\s*"""(.*?)"""', text, re.DOTALL)
        queries += re.findall(r'--sql "([^"]+)"', text)
    assert len(queries) >= 6
    # Queries about sources run against a mixture of two copies of the data.
    mixture = planner.plan({"code": data, "web": data}, weights={"code": 1, "web": 3}, lanes=8, window=2, world=2)
    for q in queries:
        (mixture if "source" in q else p).sql(q, epochs=[0, 1])


def _sft(root: Path) -> Path:
    """Row groups of short documents: under best-fit a few bins each, under concat a token stream."""
    from tests.conftest import write_dataset

    rng = np.random.default_rng(5)
    write_dataset(root, [[[[1] * int(n) for n in rng.integers(1, 60, 25)] for _ in range(8)]])
    return root


@pytest.mark.parametrize("packing", ["concat", "best-fit"])
def test_the_plan_speaks_tokens_under_either_rule(tmp_path: Path, packing: str) -> None:
    # Issue 70 item 5: best-fit's plan gave bins for tokens (seq_len=1, plan.tokens the bin count).
    import plitzer

    d, cfg = _sft(tmp_path), {"lanes": 4, "window": 2, "seq_len": 64, "packing": packing}
    p = plitzer.plan(d, **cfg)
    with plitzer.Loader(d, **cfg) as loader:
        assert p.tokens == loader.tokens == int(p.index["tokens"].sum())
        assert p.steps(0)["seq_len"][0] == loader.seq_len == 64
    per_window = p.sql("""
        select window_index, sum(tokens) as tokens, count(*) as row_groups
        from row_groups group by window_index order by window_index
    """)
    assert per_window["tokens"].sum() == p.tokens  # docs/usage.md's identity
    steps, layout = p.steps(0), p.layout_table()
    assert (steps["tokens"] == steps["lanes"] * steps["seq_len"]).all()
    assert (steps["token_start"].diff().drop_nulls() == steps["tokens"][:-1]).all()
    assert layout.select("lanes", "seq_len", "tokens_per_step", "start_token").rows() == [(4, 64, 256, 0)]
    bins = p.sql("select sum(bins) as n from row_groups")["n"][0] if packing == "best-fit" else None
    assert p.bins == bins and p.units == (p.tokens if bins is None else bins)
    assert f"{p.tokens:,} tokens" in repr(p) and ("bins" in repr(p)) == (bins is not None)
    if bins is not None:  # the bins in columns of their own: a step's are its lanes' rows
        assert (steps["bins"] == steps["lanes"]).all() and (steps["token_start"] == steps["bin_start"] * 64).all()
        assert layout.select("bins_per_step", "start_bin").rows() == [(4, 0)]
        assert steps.height == p.steps_in_epoch(0) and p.epoch_tokens == bins
    else:
        assert "bins" not in steps.columns and "bins_per_step" not in layout.columns


def test_a_finite_best_fit_run_ends_on_its_real_bins(tmp_path: Path) -> None:
    import plitzer

    p = plitzer.plan(_sft(tmp_path), lanes=4, window=2, seq_len=64, packing="best-fit", epochs=1)
    steps = p.steps(0)
    assert int(steps["bins"].sum()) == p.bins and (steps["tokens"] == steps["bins"] * 64).all()
    assert int(steps["tokens"].sum()) == p.bins * 64 >= p.tokens  # slots: the real tokens and their padding
