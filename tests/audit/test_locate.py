"""locate (when did the model see this document) against real runs: the same pieces, nothing missing, nothing extra."""

from __future__ import annotations

import io
import json
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import planner
import plitzer
from planner.errors import ConfigError, SelectionError
from plitzer.tools.explain import document_lengths
from tests.s3_fixtures import S3Data, s3  # noqa: F401  # the fixture
from tests.share_fixtures import char_tokenizer

# -- datasets whose tokens say which document and offset they are ---------------------------


def token_of(doc_id: int, offset: int) -> int:
    return (doc_id * 131 + offset * 7) % 30_011


def write_docs(root: Path, files: Sequence[Sequence[Sequence[int | None]]], *, first_id: int = 0) -> int:
    """Files of row groups of documents given by length (None: a null list); ``id`` numbers them."""
    root.mkdir(parents=True, exist_ok=True)
    doc = first_id
    for f, groups in enumerate(files):
        tables = []
        for group in groups:
            ids, lists = [], []
            for n in group:
                ids.append(doc)
                lists.append(None if n is None else [token_of(doc, i) for i in range(n)])
                doc += 1
            tables.append(pa.table({"id": pa.array(ids, pa.int64()), "tokens": pa.array(lists, pa.list_(pa.int32()))}))
        with pq.ParquetWriter(root / f"part-{f:03d}.parquet", tables[0].schema) as w:
            for t in tables:
                w.write_table(t)
    return doc


def id_table(root: Path, source: str | None = None) -> pl.DataFrame:
    """file, row_group, row, id, tokens of every document of a folder (and its source's name)."""
    parts = []
    for path in sorted(root.glob("*.parquet")):
        pf = pq.ParquetFile(path)
        for g in range(pf.num_row_groups):
            t = pl.from_arrow(pf.read_row_group(g, columns=["id", "tokens"]))
            assert isinstance(t, pl.DataFrame)
            parts.append(
                t.with_columns(
                    pl.lit(path.name).alias("file"),
                    pl.lit(g, pl.Int64).alias("row_group"),
                    pl.int_range(pl.len(), dtype=pl.Int64).alias("row"),
                )
            )
    out = pl.concat(parts)
    return out.with_columns(pl.lit(source).alias("source")) if source is not None else out


def run_documents(source: Any, steps: int, world: int, **cfg: Any) -> tuple[pl.DataFrame, dict[tuple[int, int], Any]]:
    """Every rank's batches of the first ``steps`` steps: their documents (with step and rank) and tokens."""
    rows, tokens = [], {}
    for rank in range(world):
        with plitzer.Loader(source, rank=rank, world=world, **cfg) as ld:
            for _ in range(steps):
                b = ld.next_batch()
                tokens[(b.step, rank)] = np.array(b.tokens)
                rows.append(
                    b.documents().with_columns(
                        pl.lit(b.step, pl.Int64).alias("step"), pl.lit(rank, pl.Int64).alias("rank")
                    )
                )
    return pl.concat(rows), tokens


def expected(run: pl.DataFrame, ids: pl.DataFrame, wanted: list[int], columns: list[str]) -> pl.DataFrame:
    keys = ["file", "row_group", "row", *(["source"] if "source" in run.columns else [])]
    got = run.join(ids.select(*keys, "id"), on=keys).filter(pl.col("id").is_in(wanted))
    return got.select(columns).sort("step", "lane", "start")


def check_tokens(got: pl.DataFrame, tokens: dict[tuple[int, int], Any], ids: pl.DataFrame, per: int) -> None:
    """Every located piece holds the document's own tokens at that step, row and offset."""
    keys = ["file", "row_group", "row", *(["source"] if "source" in got.columns else [])]
    joined = got.join(ids.select(*keys, "id"), on=keys)
    assert joined.height == got.height
    for r in joined.iter_rows(named=True):
        row = tokens[(r["step"], r["rank"])][r["lane"] - r["rank"] * per]
        have = row[r["start"] : r["start"] + r["length"]]
        want = [token_of(r["id"], r["token_offset"] + i) for i in range(r["length"])]
        assert have.tolist() == want, r


# Each example writes a dataset and runs every rank's loader: the profile's count, at most these.
SINGLE = min(settings().max_examples, 60)
MIXED = min(settings().max_examples, 25)

# -- one source: worlds, selections, empty and null documents ------------------------------

lengths = st.one_of(st.integers(0, 30), st.none(), st.integers(0, 3))
groups = st.lists(st.lists(lengths, min_size=0, max_size=6), min_size=1, max_size=4)


@given(
    files=st.lists(groups, min_size=1, max_size=2),
    lanes_world=st.sampled_from([(1, 1), (2, 1), (2, 2), (4, 1), (4, 2), (4, 4), (8, 2), (8, 4)]),
    window=st.integers(1, 3),
    seq_len=st.integers(3, 24),
    seed=st.integers(0, 2**64 - 1),
    select=st.booleans(),
    by_rows=st.booleans(),
    pick=st.integers(1, 2**32),
)
@settings(max_examples=SINGLE)
def test_locate_equals_the_run(
    files: list[list[list[int | None]]],
    lanes_world: tuple[int, int],
    window: int,
    seq_len: int,
    seed: int,
    select: bool,
    by_rows: bool,
    pick: int,
) -> None:
    lanes, world = lanes_world
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        n_docs = write_docs(root, files)
        ids = id_table(root)
        selection = "id % 3 <> 1" if select else None
        stream = ids.filter(pl.col("id") % 3 != 1) if select else ids
        total = int(stream["tokens"].list.len().fill_null(0).sum())
        assume(total >= lanes)
        steps = -(-(5 * total // 2) // (lanes * seq_len))
        assume(steps <= 300)
        cfg: dict[str, Any] = {"seed": seed, "lanes": lanes, "window": window, "seq_len": seq_len}
        if selection is not None:
            cfg["where"] = selection
        run, tokens = run_documents(root, steps, world, **cfg)
        wanted = [i for i in range(n_docs) if (pick >> (i % 32)) & 1]
        cfg.pop("where", None)
        if by_rows:
            sub = ids.filter(pl.col("id").is_in(wanted))
            got = plitzer.locate(root, rows=sub.select("file", "row_group", "row"), steps=steps, selection=selection,
                                 world=world, **cfg)  # fmt: skip
        else:
            where = f"id in ({', '.join(map(str, wanted))})" if wanted else "false"
            got = plitzer.locate(root, where, steps=steps, selection=selection, world=world, **cfg)
        want = expected(run, ids, wanted, got.columns)
        assert got.equals(want), (got, want)
        check_tokens(got, tokens, ids, lanes // world)


def test_columns_are_those_of_documents(synth_dataset: Any) -> None:
    d = synth_dataset(30_000, seed=2, docs_per_row_group=40, mean_length=100)
    cfg = {"seed": 1, "lanes": 4, "window": 2, "seq_len": 32}
    got = plitzer.locate(d, "id < 5", steps=100, **cfg)
    with plitzer.Loader(d, **cfg) as ld:
        docs = ld.next_batch().documents()
    assert got.columns == ["step", "rank", *[c for c in docs.columns if c != "batch_row"]]
    assert got.drop("step", "rank").schema == docs.drop("batch_row").schema
    assert got.height > 0


# -- mixtures: stages, live stages, a source's own selection -----------------------------------


@given(
    sizes=st.tuples(st.integers(3, 12), st.integers(3, 12)),
    lens=st.tuples(st.integers(1, 25), st.integers(1, 25)),
    world=st.sampled_from([1, 2]),
    window=st.integers(1, 3),
    seq_len=st.integers(4, 20),
    seed=st.integers(0, 1000),
    weights=st.tuples(st.integers(0, 4), st.integers(1, 4), st.integers(1, 4), st.integers(0, 4)),
    stage_at=st.integers(1, 30),
    live=st.booleans(),
    select=st.booleans(),
)
@settings(max_examples=MIXED)
def test_locate_in_a_mixture_equals_the_run(
    sizes: tuple[int, int],
    lens: tuple[int, int],
    world: int,
    window: int,
    seq_len: int,
    seed: int,
    weights: tuple[int, int, int, int],
    stage_at: int,
    live: bool,
    select: bool,
) -> None:
    lanes = 4
    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        a = [[[int(x) for x in rng.integers(0, lens[0] + 1, 3)] for _ in range(sizes[0])]]
        b = [[[int(x) for x in rng.integers(0, lens[1] + 1, 2)] for _ in range(sizes[1])]]
        n_a = write_docs(root / "a", a)
        n_b = write_docs(root / "b", b, first_id=n_a)
        ids = pl.concat([id_table(root / "a", "a"), id_table(root / "b", "b")])
        assume(all(ids.filter(pl.col("source") == s)["tokens"].list.len().fill_null(0).sum() >= 1 for s in "ab"))
        first = {"a": weights[0], "b": weights[1]}
        later = {"a": weights[2], "b": weights[3]}
        sources: dict[str, Any] = {"a": str(root / "a"), "b": {"path": str(root / "b"), "where": "id % 2 = 0"}}
        if not select:
            sources["b"] = str(root / "b")
        cfg: dict[str, Any] = {"seed": seed, "lanes": lanes, "window": window, "seq_len": seq_len}
        steps = 60
        rows, tokens = [], {}
        stages: Any = [(0, first), (stage_at, later)] if not live else first
        final = None
        for rank in range(world):
            try:
                ld = plitzer.Loader(sources, weights=stages, rank=rank, world=world, **cfg)
            except ConfigError:
                assume(False)
            with ld:
                for t in range(steps):
                    if live and t == stage_at:
                        ld.set_weights(later)
                    batch = ld.next_batch()
                    tokens[(batch.step, rank)] = np.array(batch.tokens)
                    rows.append(batch.documents().with_columns(pl.lit(batch.step, pl.Int64).alias("step"),
                                                               pl.lit(rank, pl.Int64).alias("rank")))  # fmt: skip
                final = ld.config["stages"]
        run = pl.concat(rows)
        wanted = [i for i in range(n_a + n_b) if i % 5 in (0, 3)]
        got = plitzer.locate(sources, "id % 5 in (0, 3)", weights=[(s, w) for s, w in final], steps=steps,
                             world=world, **cfg)  # fmt: skip
        want = expected(run, ids, wanted, got.columns)
        assert got.equals(want), (got, want)
        check_tokens(got, tokens, ids, lanes // world)


# -- the epochs asked for, one rank, the run's step range -------------------------------------


def test_epochs_and_rank_filter(synth_dataset: Any) -> None:
    d = synth_dataset(30_000, seed=2, docs_per_row_group=40, mean_length=100)
    cfg = {"seed": 5, "lanes": 4, "window": 2, "seq_len": 32}
    every = plitzer.locate(d, "id % 50 = 0", epochs="0:3", **cfg)
    assert sorted(every["epoch"].unique().to_list()) == [0, 1, 2]
    one = plitzer.locate(d, "id % 50 = 0", epochs=1, **cfg)
    assert one.equals(every.filter(pl.col("epoch") == 1))
    ranked = plitzer.locate(d, "id % 50 = 0", epochs=[1], world=2, rank=1, **cfg)
    assert ranked.equals(one.with_columns((pl.col("lane") // 2).alias("rank")).filter(pl.col("rank") == 1))
    # every document of the dataset is seen exactly once per epoch: its tokens, in full
    per_doc = one.group_by("file", "row_group", "row").agg(pl.col("length").sum())
    ids = pl.read_parquet(d).with_row_index("i").filter(pl.col("id") % 50 == 0)
    assert per_doc.height == ids.filter(pl.col("tokens").list.len() > 0).height
    assert per_doc["length"].sum() == ids["tokens"].list.len().sum()


def test_length_column_gives_the_same_answer(synth_dataset: Any) -> None:
    d = synth_dataset(30_000, seed=2, docs_per_row_group=40, mean_length=100)
    cfg = {"seed": 5, "lanes": 4, "window": 2, "seq_len": 32}
    a = plitzer.locate(d, "id % 97 = 3", epochs=[0, 1], **cfg)
    b = plitzer.locate(d, "id % 97 = 3", epochs=[0, 1], length_column="token_count", **cfg)
    assert a.height > 0 and a.equals(b)
    sel = plitzer.locate(d, "id % 97 = 3", epochs=[0], selection="int_score >= 2", length_column="token_count", **cfg)
    plain = plitzer.locate(d, "id % 97 = 3", epochs=[0], selection="int_score >= 2", **cfg)
    assert sel.equals(plain)


# -- errors -----------------------------------------------------------------------------------


def test_errors_name_the_value_and_the_fix(synth_dataset: Any) -> None:
    d = synth_dataset(30_000, seed=2, docs_per_row_group=40, mean_length=100)
    cfg = {"lanes": 4, "window": 2, "seq_len": 32}
    with pytest.raises(SelectionError, match=r"nope.*available columns: id, score") as e:
        plitzer.locate(d, "nope = 1", **cfg)
    assert e.value.column == "nope"
    with pytest.raises(ConfigError, match=r"row 999999 is outside 'part-00000.parquet', which has \d+ rows"):
        plitzer.locate(d, rows=[("part-00000.parquet", 999_999)], **cfg)
    with pytest.raises(ConfigError, match=r"row group 99 is outside 'part-00000.parquet'"):
        plitzer.locate(d, rows=[("part-00000.parquet", 99, 0)], **cfg)
    with pytest.raises(ConfigError, match=r"file 'nothere.parquet' is not a file of .*as batch.documents\(\) does"):
        plitzer.locate(d, rows=[("nothere.parquet", 0)], **cfg)
    with pytest.raises(ConfigError, match=r"where= .* or rows="):
        plitzer.locate(d, **cfg)
    with pytest.raises(ConfigError, match="epochs"):
        plitzer.locate(d, "id = 1", epochs="a:b", **cfg)
    with pytest.raises(ConfigError, match="steps"):
        plitzer.locate(d, "id = 1", steps=-1, **cfg)


def test_a_mixture_searches_the_sources_that_have_the_columns(tmp_path: Path) -> None:
    write_docs(tmp_path / "a", [[[5, 6, 7], [3, 0, 9]]])
    pq.write_table(pa.table({"tokens": pa.array([[1, 2, 3]] * 12, pa.list_(pa.int32()))}), tmp_path / "b.parquet",
                   row_group_size=4)  # fmt: skip
    sources = {"a": str(tmp_path / "a"), "b": str(tmp_path / "b.parquet")}
    cfg = {"lanes": 2, "window": 1, "seq_len": 4}
    got = plitzer.locate(sources, "id = 2", **cfg)
    assert set(got["source"].to_list()) == {"a"} and got["length"].sum() == 7
    with pytest.raises(SelectionError, match="binds to none of the mixture's sources"):
        plitzer.locate(sources, "url = 'x'", **cfg)


# -- text and S3 sources -------------------------------------------------------------------


def test_text_source_and_its_text_column(tmp_path: Path) -> None:

    rng = np.random.default_rng(3)
    words = ["alpha", "beta", "gamma", "delta", "Ω", ""]
    texts = [" ".join(words[int(i)] for i in rng.integers(0, len(words), int(rng.integers(0, 8)))) for _ in range(90)]
    pq.write_table(pa.table({"text": texts, "n": list(range(90))}), tmp_path / "t.parquet", row_group_size=9)
    tok = char_tokenizer()
    cfg: dict[str, Any] = {"seed": 2, "lanes": 4, "window": 2, "seq_len": 16, "tokenizer": tok, "text_column": "text"}
    with plitzer.Loader(tmp_path, **cfg) as ld:
        steps = 2 * ld.tokens // (4 * 16)
        run = pl.concat(
            [
                b.documents().with_columns(pl.lit(b.step, pl.Int64).alias("step"))
                for b in (ld.next_batch() for _ in range(steps))
            ]
        )
    got = plitzer.locate(tmp_path, "text like '%Ω%'", steps=steps, **cfg)
    rows = [i for i, t in enumerate(texts) if "Ω" in t]
    want = run.with_columns(((pl.col("row_group") * 9) + pl.col("row")).alias("n")).filter(pl.col("n").is_in(rows))
    assert got.height > 0
    assert got.drop("rank").equals(want.select(got.drop("rank").columns).sort("step", "lane", "start"))


def test_text_source_in_a_mixture(tmp_path: Path, synth_dataset: Any) -> None:

    texts = [("Ω " * (i % 7)) + "x" * (i % 5) for i in range(60)]
    pq.write_table(pa.table({"text": texts}), tmp_path / "t.parquet", row_group_size=6)
    tok = char_tokenizer()
    code = synth_dataset(8_000, seed=3, docs_per_row_group=10, mean_length=40, vocab=997)
    sources = {"prose": {"path": str(tmp_path), "tokenizer": tok, "text_column": "text"}, "code": str(code)}
    cfg: dict[str, Any] = {"seed": 3, "lanes": 4, "window": 2, "seq_len": 16, "weights": {"prose": 1, "code": 1}}
    steps = 80
    with plitzer.Loader(sources, **cfg) as ld:
        run = pl.concat(
            [
                b.documents().with_columns(pl.lit(b.step, pl.Int64).alias("step"))
                for b in (ld.next_batch() for _ in range(steps))
            ]
        )
    got = plitzer.locate(sources, "text like 'Ω Ω Ω%'", steps=steps, **cfg)  # the code source has no text column
    rows = {(i // 6, i % 6) for i, t in enumerate(texts) if t.startswith("Ω Ω Ω")}
    want = run.filter(pl.col("source") == "prose").filter(
        pl.struct("row_group", "row").map_elements(
            lambda r: (r["row_group"], r["row"]) in rows, return_dtype=pl.Boolean
        )
    )
    assert got.height > 0 and set(got["source"].to_list()) == {"prose"}
    assert got.drop("rank").equals(want.select(got.drop("rank").columns).sort("step", "lane", "start"))


def test_s3_equals_local(s3: S3Data) -> None:  # noqa: F811
    cfg = {"seed": 1, "lanes": 8, "window": 2, "seq_len": 64}
    local = plitzer.locate(s3.local["synth"], "id % 211 = 5", epochs=[0, 1], **cfg)
    remote = plitzer.locate(s3.url["synth"], "id % 211 = 5", epochs=[0, 1], storage_options=s3.options(), **cfg)
    assert local.height > 0 and local.equals(remote)


# -- the bulk form: plan.pieces and plan.sql ---------------------------------------------------


@pytest.mark.parametrize(
    ("mixture", "world", "where"),
    [(False, 1, None), (False, 2, "int_score >= 2"), (True, 2, None), (True, 4, "int_score <> 2")],
)
def test_plan_pieces_equal_the_run_and_locate(synth_dataset: Any, mixture: bool, world: int, where: str | None) -> None:
    a = synth_dataset(20_000, seed=2, docs_per_row_group=30, mean_length=150)
    b = synth_dataset(12_000, seed=3, docs_per_row_group=20, mean_length=90)
    cfg: dict[str, Any] = {"seed": 4, "lanes": 8, "window": 2, "seq_len": 48}
    source: Any = a
    if mixture:
        source = {"a": str(a), "b": {"path": str(b), "where": where} if where else str(b)}
        cfg["weights"] = [(0, {"a": 2, "b": 1}), (40, {"a": 1, "b": 3})]
    elif where:
        cfg["where"] = where
    with plitzer.Loader(source, world=world, **cfg) as ld:
        plan = ld.plan
        per_step = cfg["lanes"] * cfg["seq_len"]
        last = (plan.run_before(2) - 1) // per_step + 1  # every step that takes tokens of epochs 0 and 1
    run, _ = run_documents(source, last, world, **cfg)
    for epoch in (0, 1):
        got = plan.pieces(epoch, seq_len=cfg["seq_len"]).collect()
        want = run.filter(pl.col("epoch") == epoch).select(got.columns).sort("step", "lane", "start")
        assert got.sort("step", "lane", "start").equals(want)
        assert got["length"].sum() == plan.epoch(epoch).window_tokens.sum()
    selection = cfg.pop("where", None)
    located = plitzer.locate(source, "true", epochs=[0, 1], world=world, selection=selection, **cfg)
    bulk = pl.concat([plan.pieces(e, seq_len=cfg["seq_len"]).collect() for e in (0, 1)])
    assert located.equals(bulk.select(located.columns).sort("step", "lane", "start"))
    # a lazy frame: the first rows come from the first windows, without the rest of the epoch
    head = plan.pieces(0, seq_len=cfg["seq_len"]).filter(pl.col("length") > 3).head(5).collect()
    assert head.height == 5 and head["window_index"].max() == 0


def test_plan_sql_over_pieces(synth_dataset: Any) -> None:
    d = synth_dataset(20_000, seed=2, docs_per_row_group=30, mean_length=150)
    p = planner.plan(d, seed=1, lanes=8, window=2, world=2)
    per = p.sql("select step, sum(length) as tokens from pieces group by step order by step", epochs=[0, 1], seq_len=32)
    frame = pl.concat([p.pieces(e, seq_len=32).collect() for e in (0, 1)])
    want = frame.group_by("step").agg(pl.col("length").sum().alias("tokens")).sort("step")
    assert per.with_columns(pl.col("tokens").cast(pl.Int64)).equals(want)
    inner = per["tokens"].to_list()[1:-1]  # the steps wholly inside the two epochs are full
    assert set(inner) == {8 * 32}
    # "every step that held a document of this list", one query
    steps = p.sql(
        "select distinct step from pieces where file = 'part-00000.parquet' and row_group = 0 and row in (3, 4) "
        "order by step",
        epochs=[0],
        seq_len=32,
    )
    located = plitzer.locate(d, rows=[("part-00000.parquet", 3), ("part-00000.parquet", 4)], seed=1, lanes=8,
                             window=2, seq_len=32)  # fmt: skip
    assert steps["step"].to_list() == sorted(set(located["step"].to_list()))
    # lengths given as an array: planner alone, no pass
    lengths = document_lengths(d)
    assert p.pieces(0, seq_len=32, lengths=lengths).collect().equals(frame.filter(pl.col("epoch") == 0))
    with pytest.raises(ConfigError, match="seq_len"):
        p.pieces(0)
    with pytest.raises(ConfigError, match="lengths= holds 3 documents"):
        p.pieces(0, seq_len=32, lengths=np.arange(3))


def test_a_fresh_mixture_plan_knows_where_a_later_epoch_starts(synth_dataset: Any) -> None:
    a = synth_dataset(20_000, seed=2, docs_per_row_group=30, mean_length=150)
    b = synth_dataset(12_000, seed=3, docs_per_row_group=20, mean_length=90)
    make = lambda: plitzer.plan({"a": str(a), "b": str(b)}, lanes=8, window=2)  # noqa: E731
    fresh, walked = make(), make()
    for e in range(4):
        walked.epoch(e)
    assert [fresh.run_before(e) for e in (3, 1)] == [walked.run_before(e) for e in (3, 1)]


# -- the command line -------------------------------------------------------------------------


def test_cli_locate(synth_dataset: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from plitzer.cli import main

    d = synth_dataset(30_000, seed=2, docs_per_row_group=40, mean_length=100)
    args = ["--lanes", "4", "--window", "2", "--seq-len", "32", "--seed", "5"]
    want = plitzer.locate(d, "id in (3, 77)", epochs="0:3", lanes=4, window=2, seq_len=32, seed=5)
    assert main(["locate", str(d), "--where", "id in (3, 77)", "--epochs", "0:3", *args, "--format", "csv"]) == 0
    got = pl.read_csv(io.StringIO(capsys.readouterr().out), schema=want.schema)
    assert got.equals(want)
    assert main(["locate", str(d), "--row", "part-00000.parquet:3", "--row", "part-00000.parquet:1:37", *args]) == 0
    out = capsys.readouterr().out
    by_rows = plitzer.locate(d, "id in (3, 77)", lanes=4, window=2, seq_len=32, seed=5)
    assert f"{by_rows.height} pieces of 2 documents" in out
    assert main(["locate", str(d), "--where", "id = 1", "--steps", "0:40", "--format", "json", *args]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows and all(0 <= r["step"] < 40 for r in rows)
    assert main(["locate", str(d), "--where", "nope = 1", *args]) == 2
    assert "nope" in capsys.readouterr().err
    assert main(["locate", str(d), "--row", "part-00000.parquet", *args]) == 2
    assert "FILE:ROW" in capsys.readouterr().err


@pytest.mark.parametrize("where", [None, "int_score >= 2"])
def test_one_source_positions_are_the_plans(synth_dataset: Any, where: str | None) -> None:
    from planner.lookup.pieces import OneSource
    from planner.order.epoch import row_group_counts

    d = synth_dataset(30_000, seed=2, docs_per_row_group=40, mean_length=100)
    plan = plitzer.plan(d, seed=7, lanes=8, window=3, world=2, where=where)
    view = OneSource(plan, row_group_counts(plan.dataset)[0])
    for e in (0, 1, 5, 1000):
        a, b = plan.epoch(e), view.epoch(e)
        for name in ("order", "window", "token_start", "window_tokens", "window_z"):
            assert np.array_equal(getattr(a, name), getattr(b, name)), (e, name)


# -- layout stages: lanes and seq_len that change at steps (SPEC section 12) -------------------

STAGED = min(settings().max_examples, 30)


def layout_keywords(config: dict[str, Any]) -> dict[str, Any]:
    """``lanes=`` and ``seq_len=`` stages from a loader's config (after its live ``set_layout`` calls)."""
    layout = config.get("layout")
    if layout is None:
        return {"lanes": config["lanes"], "seq_len": config["seq_len"]}
    return {"lanes": [(s, b) for s, b, _ in layout], "seq_len": [(s, n) for s, _, n in layout]}


def staged_run(
    source: Any, steps: int, world: int, changes: list[tuple[int, int, int]], live: bool, **cfg: Any
) -> tuple[pl.DataFrame, dict[tuple[int, int], Any], dict[str, Any]]:
    """Every rank's batches under layout stages ``changes`` (step, lanes, seq_len): given, or live calls."""
    rows, tokens, config = [], {}, {}
    first = (cfg.pop("lanes"), cfg.pop("seq_len"))
    layout: dict[str, Any] = {"lanes": first[0], "seq_len": first[1]}
    if not live:
        layout = {
            "lanes": [(0, first[0]), *((s, b) for s, b, _ in changes)],
            "seq_len": [(0, first[1]), *((s, n) for s, _, n in changes)],
        }
    for rank in range(world):
        with plitzer.Loader(source, rank=rank, world=world, **layout, **cfg) as ld:
            for t in range(steps):
                for s, b, n in changes if live else ():
                    if s == t:
                        ld.set_layout(lanes=b, seq_len=n)
                batch = ld.next_batch()
                tokens[(batch.step, rank)] = np.array(batch.tokens)
                rows.append(batch.documents().with_columns(pl.lit(batch.step, pl.Int64).alias("step"),
                                                           pl.lit(rank, pl.Int64).alias("rank")))  # fmt: skip
            config = ld.config
    return pl.concat(rows), tokens, config


def check_staged_tokens(got: pl.DataFrame, tokens: dict[tuple[int, int], Any], ids: pl.DataFrame) -> None:
    """As :func:`check_tokens`, each step's rows counted in the lanes of its layout stage (a rank's rows)."""
    for (step,), part in got.partition_by("step", as_dict=True).items():
        check_tokens(part, tokens, ids, tokens[(step, int(part["rank"][0]))].shape[0])


# Changes (step, lanes a rank, seq_len) at steps 1 to 6 apart: often two inside one window.
changes_st = st.lists(st.tuples(st.integers(1, 6), st.integers(1, 3), st.integers(3, 20)), min_size=1, max_size=3).map(
    lambda cs: [(sum(c[0] for c in cs[: i + 1]), b, n) for i, (_, b, n) in enumerate(cs)]
)


@given(
    files=st.lists(groups, min_size=1, max_size=2),
    world=st.integers(1, 3),
    per=st.integers(1, 3),
    window=st.integers(1, 3),
    seq_len=st.integers(3, 20),
    changes=changes_st,
    live=st.booleans(),
    seed=st.integers(0, 2**64 - 1),
    pick=st.integers(1, 2**32),
)
@settings(max_examples=STAGED)
def test_locate_under_layout_stages_equals_the_run(
    files: list[list[list[int | None]]],
    world: int,
    per: int,
    window: int,
    seq_len: int,
    changes: list[tuple[int, int, int]],
    live: bool,
    seed: int,
    pick: int,
) -> None:
    changes = sorted((s, b * world, n) for s, b, n in changes)
    lanes = per * world
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        n_docs = write_docs(root, files)
        ids = id_table(root)
        total = int(ids["tokens"].list.len().fill_null(0).sum())
        assume(total >= max(lanes, *(b for _, b, _ in changes)))
        steps = 20
        cfg: dict[str, Any] = {"seed": seed, "lanes": lanes, "window": window, "seq_len": seq_len}
        run, tokens, config = staged_run(root, steps, world, changes, live, **cfg)
        wanted = [i for i in range(n_docs) if (pick >> (i % 32)) & 1]
        rows = ids.filter(pl.col("id").is_in(wanted)).select("file", "row_group", "row")  # no predicate: fast
        got = plitzer.locate(root, rows=rows, steps=steps, world=world, seed=seed, window=window,
                             **layout_keywords(config))  # fmt: skip
        want = expected(run, ids, wanted, got.columns)
        assert got.equals(want), (got, want)
        check_staged_tokens(got, tokens, ids)


@given(
    sizes=st.tuples(st.integers(3, 10), st.integers(3, 10)),
    lens=st.tuples(st.integers(1, 25), st.integers(1, 25)),
    world=st.integers(1, 2),
    window=st.integers(1, 3),
    seq_len=st.integers(4, 16),
    changes=changes_st,
    weights=st.tuples(st.integers(0, 3), st.integers(1, 3), st.integers(1, 3), st.integers(0, 3)),
    stage_at=st.integers(1, 20),
    live=st.booleans(),
    seed=st.integers(0, 1000),
)
@settings(max_examples=STAGED // 2)
def test_locate_in_a_mixture_under_layout_stages_equals_the_run(
    sizes: tuple[int, int],
    lens: tuple[int, int],
    world: int,
    window: int,
    seq_len: int,
    changes: list[tuple[int, int, int]],
    weights: tuple[int, int, int, int],
    stage_at: int,
    live: bool,
    seed: int,
) -> None:
    changes = sorted((s, b * world, n) for s, b, n in changes)
    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        a = [[[int(x) for x in rng.integers(0, lens[0] + 1, 3)] for _ in range(sizes[0])]]
        b = [[[int(x) for x in rng.integers(0, lens[1] + 1, 2)] for _ in range(sizes[1])]]
        n_a = write_docs(root / "a", a)
        n_b = write_docs(root / "b", b, first_id=n_a)
        ids = pl.concat([id_table(root / "a", "a"), id_table(root / "b", "b")])
        assume(all(ids.filter(pl.col("source") == s)["tokens"].list.len().fill_null(0).sum() >= 1 for s in "ab"))
        sources = {"a": str(root / "a"), "b": str(root / "b")}
        stages = [(0, {"a": weights[0], "b": weights[1]}), (stage_at, {"a": weights[2], "b": weights[3]})]
        cfg: dict[str, Any] = {"seed": seed, "lanes": 2 * world, "window": window, "seq_len": seq_len}
        steps = 20
        try:
            run, tokens, config = staged_run(sources, steps, world, changes, live, weights=stages, **cfg)
        except ConfigError:
            assume(False)  # lanes the data cannot hold
        wanted = [i for i in range(n_a + n_b) if i % 5 in (0, 3)]
        rows = ids.filter(pl.col("id").is_in(wanted)).select("source", "file", "row_group", "row")
        got = plitzer.locate(sources, rows=rows, weights=config["stages"], steps=steps, world=world, seed=seed,
                             window=window, **layout_keywords(config))  # fmt: skip
        want = expected(run, ids, wanted, got.columns)
        assert got.equals(want), (got, want)
        check_staged_tokens(got, tokens, ids)


def test_two_changes_inside_one_window(tmp_path: Path) -> None:
    write_docs(tmp_path, [[[40, 3, 17, 25, 0, 31], [12, 22, 9], [30, 30, 5, 1]], [[19, 28, 7, 33, 2], [26, 14]]])
    ids = id_table(tmp_path)
    cfg: dict[str, Any] = {
        "seed": 2,
        "window": 3,
        "lanes": [(0, 4), (3, 2), (5, 6)],
        "seq_len": [(0, 8), (3, 5), (5, 3)],
    }
    table = planner.plan(tmp_path, **cfg).layout_table()
    assert table.select("recut_epoch", "recut_window_index").rows()[1:] == [(0, 0), (0, 0)]  # the same window
    run, tokens = run_documents(tmp_path, 30, 2, **cfg)
    got = plitzer.locate(tmp_path, "true", steps=30, world=2, **cfg)
    assert got.equals(run.select(got.columns).sort("step", "lane", "start"))
    check_staged_tokens(got, tokens, ids)


def test_a_stage_that_repeats_the_layout_changes_no_answer(synth_dataset: Any) -> None:
    d = synth_dataset(30_000, seed=2, docs_per_row_group=40, mean_length=100)
    cfg = {"seed": 3, "window": 2, "world": 2}
    plain = plitzer.locate(d, "id % 40 = 7", epochs="0:2", lanes=4, seq_len=32, **cfg)
    same = plitzer.locate(d, "id % 40 = 7", epochs="0:2", lanes=[(0, 4), (37, 4)], seq_len=[(0, 32), (37, 32)], **cfg)
    assert plain.height > 0 and plain.equals(same)
    # a real change: every document's tokens are still seen once per epoch, in full
    moved = plitzer.locate(d, "id % 40 = 7", epochs="0:2", lanes=[(0, 4), (37, 2)], seq_len=[(0, 32), (37, 128)], **cfg)
    assert not moved.equals(plain)
    totals = lambda f: f.group_by("epoch", "file", "row_group", "row").agg(pl.col("length").sum()).sort(pl.all())  # noqa: E731
    assert totals(moved).equals(totals(plain))
    late = moved.filter(pl.col("step") >= 37)
    assert late["lane"].max() < 2 and (late["start"] + late["length"]).max() <= 128
    # ranks count each stage's lanes: 2 a rank before the change, 1 after
    per = pl.when(pl.col("step") >= 37).then(1).otherwise(2)
    assert moved["rank"].to_list() == moved.select(pl.col("lane") // per)["lane"].to_list()
    one = plitzer.locate(d, "id % 40 = 7", epochs="0:2", lanes=[(0, 4), (37, 2)], seq_len=[(0, 32), (37, 128)],
                         rank=1, **cfg)  # fmt: skip
    assert one.height > 0 and one.equals(moved.filter(pl.col("rank") == 1))


def test_plan_pieces_under_layout_stages_equal_the_run(synth_dataset: Any) -> None:
    d = synth_dataset(20_000, seed=2, docs_per_row_group=30, mean_length=150)
    cfg: dict[str, Any] = {"seed": 4, "window": 2, "lanes": [(0, 8), (9, 4), (30, 6)], "seq_len": [(0, 48), (9, 80)]}
    with plitzer.Loader(d, world=2, **cfg) as ld:
        plan = ld.plan
        last = plan.layout.step_at_run(plan.run_before(2)) + 1
    run, _ = run_documents(d, last, 2, **cfg)
    bulk = []
    for epoch in (0, 1):
        got = plan.pieces(epoch).collect()
        want = run.filter(pl.col("epoch") == epoch).select(got.columns).sort("step", "lane", "start")
        assert got.sort("step", "lane", "start").equals(want)
        bulk.append(got)
    located = plitzer.locate(d, "true", epochs=[0, 1], world=2, **cfg)
    assert located.equals(pl.concat(bulk).select(located.columns).sort("step", "lane", "start"))
    per_step = plan.sql("select step, sum(length) as n from pieces group by step order by step", epochs=[0])
    shape = plan.steps(0).join(per_step.with_columns(pl.col("n").cast(pl.Int64)), on="step")
    inner = shape.filter(pl.col("step") > shape["step"].min(), pl.col("step") < shape["step"].max())
    assert inner.height > 20 and inner["n"].to_list() == inner["tokens"].to_list()
    with pytest.raises(ConfigError, match="layout stages"):
        plan.pieces(0, seq_len=64)


def test_cli_locate_with_layout_stages(synth_dataset: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from plitzer.cli import main

    d = synth_dataset(30_000, seed=2, docs_per_row_group=40, mean_length=100)
    args = ["--lanes", "0:4,40:2", "--seq-len", "0:32,40:96", "--window", "2", "--seed", "5", "--world", "2"]
    want = plitzer.locate(d, "id in (3, 77)", epochs="0:3", lanes=[(0, 4), (40, 2)], seq_len=[(0, 32), (40, 96)],
                          window=2, seed=5, world=2)  # fmt: skip
    assert want["step"].min() < 40 < want["step"].max()
    assert main(["locate", str(d), "--where", "id in (3, 77)", "--epochs", "0:3", *args, "--format", "csv"]) == 0
    got = pl.read_csv(io.StringIO(capsys.readouterr().out), schema=want.schema)
    assert got.equals(want)
