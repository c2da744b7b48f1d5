"""Selection (SPEC section 10): ``where=`` streams exactly the rows a DuckDB predicate keeps.

The reference is the same dataset filtered first and written out row group by row
group (an emptied row group is written as an empty one, so every row group keeps
its place): for random predicates the batches are equal, byte for byte, step for
step, and resuming at another world size is exact. Also: the pass is cached (a
second run reads no data), ranks split it, a changed predicate is refused naming
both, bad predicates are ConfigErrors that list the columns, the tables carry the
selected counts, and S3 sources give the same batches.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, reject, settings
from hypothesis import strategies as st

import planner
import plitzer
import plitzer.errors
import plitzer.selection.select as sel
from planner.errors import CheckpointError, ConfigError, DataError
from plitzer.selection.evaluate import Runs
from tests.conftest import SynthDataset, tokens_of
from tests.s3_fixtures import S3Data, s3

__all__ = ["s3"]  # the fixture, imported for pytest

DOCS = 20  # documents per row group: ``id // DOCS`` numbers the row groups
CFG = {"seed": 3, "lanes": 4, "window": 3, "seq_len": 32}
# Each example writes a filtered copy and runs several loaders (about 0.4 s): a fifth of
# the profile's budget, at least the fast profile's 15 (ci: 30, thorough: 100).
EXAMPLES = settings(max_examples=max(15, settings.default.max_examples // 5))


@pytest.fixture(scope="module")
def data(synth_dataset: SynthDataset) -> Path:
    return synth_dataset(tokens=60_000, seed=5, docs_per_row_group=DOCS, row_groups_per_file=3, mean_length=120)


def filtered_copy(src: Path, dst: Path, where: str) -> Path:
    """``src`` with the rows ``where`` leaves out removed, every row group kept (maybe empty)."""
    dst.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect()
    for f in sorted(src.glob("*.parquet")):
        pf = pq.ParquetFile(f)
        with pq.ParquetWriter(dst / f.name, pf.schema_arrow) as w:
            for g in range(pf.num_row_groups):
                t = pf.read_row_group(g)
                con.register("t", t.append_column("__i", pa.array(np.arange(t.num_rows))))
                kept = con.sql(f"select * exclude (__i) from t where {where} order by __i").to_arrow_table()
                w.write_table(kept.cast(pf.schema_arrow))
                con.unregister("t")
    con.close()
    return dst


def _atom() -> st.SearchStrategy[str]:
    langs = st.lists(st.sampled_from(["en", "de", "fr", "es", "zh"]), min_size=1, max_size=3, unique=True)
    return st.one_of(
        st.integers(0, 4).map(lambda k: f"int_score >= {k}"),
        langs.map(lambda xs: "language in (" + ", ".join(f"'{x}'" for x in xs) + ")"),
        st.tuples(st.integers(2, 5), st.integers(0, 4)).map(lambda mr: f"id % {mr[0]} != {mr[1] % mr[0]}"),
        # whole row groups left out: their place stays, they give no token
        st.tuples(st.integers(2, 4), st.integers(0, 3)).map(lambda mr: f"(id // {DOCS}) % {mr[0]} != {mr[1] % mr[0]}"),
        st.floats(0.5, 4.5).map(lambda x: f"score < {x:.2f}"),
    )


predicates = st.recursive(
    _atom(),
    lambda inner: st.one_of(
        st.tuples(inner, inner).map(lambda ab: f"({ab[0]}) and ({ab[1]})"),
        st.tuples(inner, inner).map(lambda ab: f"({ab[0]}) or ({ab[1]})"),
        inner.map(lambda a: f"not ({a})"),
    ),
    max_leaves=3,
)


def _loader(source: object, **kw: object) -> plitzer.Loader:
    try:
        return plitzer.Loader(source, **{**CFG, **kw})  # type: ignore[arg-type]
    except ConfigError as e:
        if "selects no" in str(e) or "exceeds the dataset" in str(e):
            reject()  # nothing (or too little) to train on: not this property's case
        raise


def _ids(path: Path) -> dict[tuple[str, int], np.ndarray]:
    out = {}
    for f in sorted(path.glob("*.parquet")):
        pf = pq.ParquetFile(f)
        for g in range(pf.num_row_groups):
            out[(f.name, g)] = pf.read_row_group(g, columns=["id"]).column(0).to_numpy()
    return out


@EXAMPLES
@given(where=predicates)
def test_batches_equal_those_of_the_filtered_copy(
    data: Path, tmp_path_factory: pytest.TempPathFactory, where: str
) -> None:
    copy = filtered_copy(data, tmp_path_factory.mktemp("filtered"), where)
    with _loader(data, where=where) as a:
        with plitzer.Loader(copy, **CFG) as b:  # type: ignore[arg-type]
            assert a.tokens == b.tokens
            assert a.plan.index["tokens_selected"].to_list() == b.plan.index["tokens"].to_list()
            assert len(a) == len(b)
            steps = min(len(a) + 3, 60)  # across the epoch's end
            for t in range(steps):
                x, y = a.next_batch(), b.next_batch()
                assert tokens_of(x).tobytes() == tokens_of(y).tobytes(), f"step {t}"
            # Documents name the rows of the original files: the same documents (by id).
            ids_a, ids_b = _ids(data), _ids(copy)
            da, db = x.documents(), y.documents()
            got = [ids_a[(f, g)][r] for f, g, r in da.select("file", "row_group", "row").iter_rows()]
            want = [ids_b[(f, g)][r] for f, g, r in db.select("file", "row_group", "row").iter_rows()]
            assert got == want


@EXAMPLES
@given(
    where=predicates,
    step=st.integers(0, 80),
    worlds=st.tuples(st.sampled_from([1, 2, 4]), st.sampled_from([1, 2, 4])),
)
def test_resume_at_another_world_size_is_exact(data: Path, where: str, step: int, worlds: tuple[int, int]) -> None:
    before, after = worlds
    with _loader(data, where=where) as whole:
        whole.seek(step)
        want = [tokens_of(whole.next_batch()).copy() for _ in range(3)]
    parts = []
    for r in range(before):
        with _loader(data, where=where, world=before, rank=r) as x:
            x.seek(step)
            parts.append(x.checkpoint())
    state = plitzer.merge(parts)
    rows: list[list[np.ndarray]] = []
    for r in range(after):
        with _loader(data, where=where, world=after, rank=r) as y:
            y.resume(state)
            rows.append([tokens_of(y.next_batch()).copy() for _ in range(3)])
    for i in range(3):
        assert np.concatenate([r[i] for r in rows]).tobytes() == want[i].tobytes()


def test_a_checkpoint_under_another_predicate_is_refused_naming_both(data: Path) -> None:
    with plitzer.Loader(data, where="int_score >= 2", **CFG) as a:  # type: ignore[arg-type]
        a.next_batch()
        state = a.checkpoint()
        assert a.config["where"] == "(int_score >= 2)"
    a_where, b_where = "(int_score >= 2)", "(\"language\" = 'en')"
    with (
        plitzer.Loader(data, where="language = 'en'", **CFG) as b,  # type: ignore[arg-type]
        pytest.raises(CheckpointError, match=re.escape(f"where: checkpoint {a_where!r}, loader {b_where!r}")),
    ):
        b.resume(state)
    with plitzer.Loader(data, **CFG) as c, pytest.raises(CheckpointError, match="where: checkpoint"):  # type: ignore[arg-type]
        c.resume(state)
    # The same predicate spelled otherwise is the same selection.
    with plitzer.Loader(data, where="int_score   >=   2", **CFG) as e:  # type: ignore[arg-type]
        e.resume(state)
        assert e.step == 1


def test_length_column_is_part_of_the_identity_and_gives_the_same_batches(data: Path) -> None:
    where = "int_score >= 3"
    with (
        plitzer.Loader(data, where=where, **CFG) as a,  # type: ignore[arg-type]
        plitzer.Loader(data, where=where, length_column="token_count", **CFG) as b,  # type: ignore[arg-type]
    ):
        assert a.plan.index.equals(b.plan.index)
        assert a.index.fingerprint != b.index.fingerprint
        assert b.config["length_column"] == "token_count"
        for _ in range(5):
            assert tokens_of(a.next_batch()).tobytes() == tokens_of(b.next_batch()).tobytes()
        with pytest.raises(CheckpointError, match="length_column: checkpoint '', loader 'token_count'"):
            b.resume(a.checkpoint())


def test_a_wrong_length_column_is_a_data_error(data: Path) -> None:
    with pytest.raises(DataError, match=r"length_column='id' sums to .* tokens, but the token column"):
        plitzer.Loader(data, where="int_score >= 3", length_column="id", **CFG)  # type: ignore[arg-type]


def test_the_pass_is_cached_and_reads_only_the_named_columns(
    data: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PLITZER_CACHE", str(tmp_path / "cache"))
    read: list[str] = []
    real = sel.SelectionPass._column

    def column(self: sel.SelectionPass, rg: int, name: str, runs: Runs | None = None) -> pa.Array:
        read.append(name)
        return real(self, rg, name, runs)

    monkeypatch.setattr(sel.SelectionPass, "_column", column)
    with plitzer.Loader(data, where="language = 'de' or int_score = 4", length_column="token_count", **CFG):  # type: ignore[arg-type]
        pass
    assert set(read) == {"language", "int_score", "token_count"}
    calls = []
    monkeypatch.setattr(sel.SelectionPass, "evaluate_many", lambda self, rgs: calls.extend(rgs))
    with plitzer.Loader(data, where="language='de' OR int_score=4", length_column="token_count", **CFG) as again:  # type: ignore[arg-type]
        again.next_batch()
    assert calls == []  # no second pass: the cache holds it, keyed by the normalized predicate
    assert list((tmp_path / "cache" / "select").glob("*.npz"))


def test_ranks_split_the_pass_and_never_wait(data: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Rank 1 of 2 starts at the second half; alone, it goes on round the rest (no deadlock)."""
    monkeypatch.setenv("PLITZER_CACHE", str(tmp_path / "cache"))
    order: list[int] = []
    real = sel.SelectionPass.evaluate_many
    monkeypatch.setattr(sel.SelectionPass, "evaluate_many", lambda self, rgs: (order.extend(rgs), real(self, rgs))[1])
    ix = plitzer.index(data)
    one = sel.select_index(ix, "int_score >= 1", rank=1, world=2, threads=1)
    chunks = sel.chunks_of(ix)
    first = chunks[len(chunks) // 2][0]
    assert order[0] == first
    assert sorted(order) == list(range(ix.row_groups))
    order.clear()
    two = sel.select_index(ix, "int_score >= 1", rank=0, world=2)
    assert order == []  # its share was written to the cache folder by rank 1
    assert one.fingerprint == two.fingerprint

    # With an exchange (torch.distributed's all_gather_object), each rank does its share only.
    monkeypatch.setenv("PLITZER_CACHE", str(tmp_path / "other"))
    got: list[sel.Part] = []

    def exchange(part: sel.Part) -> list[sel.Part]:
        got.append(part)
        return [part, sel.run_pass(sel.SelectionPass(ix, sel.normalize("int_score >= 1"), ["int_score"], None), chunks,
                               [c for c in range(len(chunks)) if c * 2 // len(chunks) == 1], shared=False,
                               threads=1, progress=False)]  # fmt: skip

    order.clear()
    three = sel.select_index(ix, "int_score >= 1", rank=0, world=2, exchange=exchange)
    assert set(got[0]) == {c for c in range(len(chunks)) if c * 2 // len(chunks) == 0}
    assert three.fingerprint == one.fingerprint


@pytest.mark.parametrize(
    ("where", "match"),
    [
        ("quality >= 3", r"quality.*available columns: id, score, int_score, language, token_count"),
        ("score + 1", r"is double, not boolean"),
        ("int_score > 99", r"selects no token"),
        ("len(tokens) > 3", r"token column 'tokens' cannot be selected on.*available columns"),
        ("score >=", r"is not a DuckDB SQL expression"),
        ("score > 1 limit 5", r"is not a DuckDB SQL expression"),
        ("", r"must be a DuckDB SQL boolean expression"),
    ],
)
def test_bad_predicates_are_config_errors_that_list_the_columns(data: Path, where: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        plitzer.Loader(data, where=where, **CFG)  # type: ignore[arg-type]


def test_bad_length_columns_are_config_errors(data: Path) -> None:
    with pytest.raises(ConfigError, match=r"length_column='nope' is not a column.*available columns"):
        plitzer.Loader(data, where="score > 1", length_column="nope", **CFG)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="is string, not an integer"):
        plitzer.Loader(data, where="score > 1", length_column="language", **CFG)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="without where="):
        plitzer.Loader(data, length_column="token_count", **CFG)  # type: ignore[arg-type]


def test_the_pass_takes_the_selection_value_or_its_predicate(data: Path) -> None:
    """A str is the predicate alone; a Selection without one is refused naming the fix; dedupe= is not read."""
    ix = plitzer.index(data)
    alone = sel.select_index(ix, "score >= 3")
    assert sel.select_index(ix, plitzer.Selection(where="score >= 3", dedupe="tokens")).frame.equals(alone.frame)
    for none in (plitzer.Selection(), plitzer.Selection(length_column="token_count", dedupe="url")):
        with pytest.raises(ConfigError, match=r"no predicate to select by; give its where="):
            sel.select_index(ix, none)


def test_tables_carry_the_selected_counts(data: Path) -> None:
    where = f"(id // {DOCS}) % 3 != 0 and int_score >= 2"
    p = plitzer.plan(data, where=where, seed=3, lanes=4, window=3, world=2)
    ix = p.index
    assert {"rows_selected", "tokens_selected"} <= set(ix.columns)
    assert p.tokens == int(ix["tokens_selected"].sum()) < int(ix["tokens"].sum())
    rg = p.row_groups(0)
    assert rg.columns[-2:] == ["rows_selected", "tokens_selected"]
    emptied = rg.filter(rg["rows_selected"] == 0)
    assert emptied.height >= ix.height // 3 - 1
    assert emptied["first_rank"].null_count() == emptied.height  # never read
    reads = p.reads(0).join(emptied.select("file", "row_group"), on=["file", "row_group"])
    assert reads.height == 0
    got = p.sql(
        "select file, sum(tokens_selected) as kept, sum(tokens) as total from index group by file order by file"
    )
    assert int(got["kept"].sum()) == p.tokens
    assert plitzer.plan(data, where=where, seed=3, lanes=4, window=3, world=2).index.equals(ix)
    # Unselected plans keep the tables of SPEC section 6.
    assert "tokens_selected" not in planner.plan(data, lanes=4, window=3).row_groups(0).columns


def test_a_mixture_selects_each_source_by_its_own_predicate(data: Path, tmp_path: Path) -> None:
    other = plitzer.synth.write(tmp_path / "code", tokens=30_000, seed=9, docs_per_row_group=DOCS, mean_length=90)
    code = other[0].parent
    wa, wb = "language = 'en'", "int_score <= 2"
    sources = {"web": {"path": str(data), "where": wa}, "code": {"path": str(code), "where": wb}}
    copies = {
        "web": str(filtered_copy(data, tmp_path / "fa", wa)),
        "code": str(filtered_copy(code, tmp_path / "fb", wb)),
    }
    weights = {"web": 2, "code": 1}
    with (
        plitzer.Loader(sources, weights=weights, **CFG) as a,  # type: ignore[arg-type]
        plitzer.Loader(copies, weights=weights, **CFG) as b,  # type: ignore[arg-type]
    ):
        assert a.config["where"] == [["code", "(int_score <= 2)"], ["web", "(\"language\" = 'en')"]]
        for t in range(40):
            assert tokens_of(a.next_batch()).tobytes() == tokens_of(b.next_batch()).tobytes(), f"step {t}"


def test_explain_and_audit_take_where(data: Path) -> None:
    where = "int_score >= 3"
    with plitzer.Loader(data, where=where, **CFG) as loader:  # type: ignore[arg-type]
        loader.seek(7)
        want = loader.next_batch().documents()
    got = plitzer.explain(data, 7, where=where, **CFG)  # type: ignore[arg-type]
    assert got.select(want.columns[1:]).equals(want.select(want.columns[1:]))
    from plitzer.audit import audit

    r = audit(data, where=where, steps=20, **CFG)  # type: ignore[arg-type]
    per_file = r.tables["selection"]
    assert {"file", "tokens", "tokens_selected", "kept_share"} <= set(per_file.columns)
    assert int(per_file["tokens_selected"].sum()) == plitzer.plan(data, where=where).tokens
    assert "Selection" in r.notes


@pytest.mark.timeout(120)
def test_s3_sources_select_the_same_rows(s3: S3Data) -> None:
    where = "int_score >= 2 and language != 'zh'"
    cfg = {"seed": 7, "lanes": 8, "window": 3, "seq_len": 96}
    with (
        plitzer.Loader(s3.local["synth"], where=where, **cfg) as disk,  # type: ignore[arg-type]
        plitzer.Loader(s3.url["synth"], where=where, storage_options=s3.options(), **cfg) as remote,  # type: ignore[arg-type]
    ):
        assert remote.index.fingerprint == disk.index.fingerprint
        for t in range(len(disk)):
            assert tokens_of(disk.next_batch()).tobytes() == tokens_of(remote.next_batch()).tobytes(), f"step {t}"


def test_torch_dataset_takes_where(data: Path) -> None:
    pytest.importorskip("torch")
    import plitzer.torch as pt

    ds = pt.Dataset(data, where="int_score >= 3", **CFG)  # type: ignore[arg-type]
    with plitzer.Loader(data, where="int_score >= 3", **CFG) as ref:  # type: ignore[arg-type]
        first = next(iter(ds))
        assert first.tokens.numpy().tobytes() == tokens_of(ref.next_batch()).tobytes()


_: Callable[..., object] = filtered_copy


def test_cli_index_and_plan_take_where(data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from plitzer.cli import main

    where = "int_score >= 3 and language = 'en'"
    assert main(["index", str(data), "--where", where, "--length-column", "token_count", "--no-lengths"]) == 0
    assert "tokens_selected" in capsys.readouterr().out
    sql = "select sum(tokens_selected) as kept from index"
    assert (
        main(["plan", str(data), "--where", where, "--lanes", "4", "--window", "3", "--sql", sql, "--format", "csv"])
        == 0
    )
    kept = int(capsys.readouterr().out.splitlines()[1])
    assert kept == plitzer.plan(data, where=where, lanes=4, window=3).tokens


@pytest.mark.ray
@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_pass_runs_on_ray_ahead_of_the_job(data: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from tests.share_fixtures import ray_with_caches

    with ray_with_caches(tmp_path, monkeypatch):
        ix = plitzer.index(data)
        assert sel.select_on_ray(ix, "language = 'de'", source=str(data)) == len(sel.chunks_of(ix))
    calls: list[int] = []
    monkeypatch.setattr(sel.SelectionPass, "evaluate_many", lambda self, rgs: calls.extend(rgs))
    got = sel.select_index(ix, "language = 'de'")
    assert calls == []  # the Ray tasks' parts are in this cache folder
    monkeypatch.undo()
    monkeypatch.setenv("PLITZER_CACHE", str(tmp_path / "fresh"))
    assert sel.select_index(plitzer.index(data), "language = 'de'").frame.equals(got.frame)


def test_scan_yields_the_selected_rows_a_rank_reads(data: Path) -> None:
    where = "language = 'en' and int_score >= 2"
    p = plitzer.plan(data, where=where, seed=3, lanes=4, window=3, world=2)
    for rank in range(2):
        df = p.scan(0, rank=rank).collect()
        reads = p.reads(0).filter(pl.col("rank") == rank).join(p.index, on=["file", "row_group"])
        assert df.height == reads["rows_selected"].sum()
        assert df["tokens"].list.len().sum() == reads["tokens_selected"].sum()
        # The rows are the original files' rows that the predicate keeps.
        con = duckdb.connect()
        for (f, g), part in df.group_by(["file", "row_group"], maintain_order=True):
            t = pq.ParquetFile(data / str(f)).read_row_group(int(g))  # type: ignore[call-overload]
            con.register("t", t.append_column("__i", pa.array(np.arange(t.num_rows))))
            want = con.sql(f"select __i from t where {where} order by __i").fetchnumpy()["__i"]
            assert part["row"].to_list() == want.tolist()
            con.unregister("t")


def test_selection_errors_carry_the_predicate_the_column_and_the_columns(data: Path) -> None:
    with pytest.raises(plitzer.errors.SelectionError) as e:
        plitzer.Loader(data, where="quality >= 3 and language = 'en'", **CFG)  # type: ignore[arg-type]
    assert e.value.column == "quality"
    assert e.value.predicate == "((quality >= 3) AND (\"language\" = 'en'))"
    assert e.value.available == ("id", "score", "int_score", "language", "token_count")
    assert isinstance(e.value, ConfigError) and isinstance(e.value, ValueError)
    import pickle

    again = pickle.loads(pickle.dumps(e.value))
    assert (again.column, again.available, str(again)) == (e.value.column, e.value.available, str(e.value))


_DIST_WORKER = """
import json, os, sys
import numpy as np
import torch.distributed as dist
import plitzer.selection.select as sel
import plitzer.torch

rank, world, port, data, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
done = []
real = sel.SelectionPass.evaluate_many
sel.SelectionPass.evaluate_many = lambda self, rgs: (done.extend(rgs), real(self, rgs))[1]
ds = plitzer.torch.Dataset(data, where="int_score >= 2", seed=3, lanes=4, window=3, seq_len=32, threads=1)
batch = next(iter(ds))
json.dump({"evaluated": done, "tokens": batch.tokens.numpy().tolist()}, open(out, "w"))
dist.destroy_process_group()
"""


@pytest.mark.timeout(180)
def test_torch_distributed_ranks_each_run_their_share_of_the_pass(data: Path, tmp_path: Path) -> None:
    """Each rank (its own cache folder) evaluates its 1/world of the pass; all_gather_object shares the rest."""
    pytest.importorskip("torch")
    from tests.share_fixtures import gloo_ranks

    got = gloo_ranks(_DIST_WORKER, data, tmp_path)
    ix = plitzer.index(data)
    chunks = sel.chunks_of(ix)
    for r in range(2):
        share = [rg for c, (a, b) in enumerate(chunks) if c * 2 // len(chunks) == r for rg in range(a, b)]
        assert sorted(got[r]["evaluated"]) == share
    with plitzer.Loader(data, where="int_score >= 2", **CFG) as ref:  # type: ignore[arg-type]
        want = tokens_of(ref.next_batch())
    assert np.concatenate([np.array(g["tokens"]) for g in got]).tolist() == want.tolist()


def test_a_predicate_that_keeps_every_row_gives_the_unselected_batches(data: Path) -> None:
    with (
        plitzer.Loader(data, where="true", **CFG) as a,  # type: ignore[arg-type]
        plitzer.Loader(data, where="id is not null", length_column="token_count", **CFG) as b,  # type: ignore[arg-type]
        plitzer.Loader(data, **CFG) as c,  # type: ignore[arg-type]
    ):
        assert a.tokens == b.tokens == c.tokens
        assert a.index.fingerprint != c.index.fingerprint  # the selection is part of the identity
        for _ in range(len(c) + 2):
            want = tokens_of(c.next_batch()).tobytes()
            assert tokens_of(a.next_batch()).tobytes() == want == tokens_of(b.next_batch()).tobytes()


def test_cli_explain_and_audit_take_where(data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from plitzer.cli import main

    where = "int_score >= 3"
    cfg = ["--lanes", "4", "--window", "3", "--seq-len", "32", "--seed", "3"]
    out = tmp_path / "step.csv"
    assert (
        main(["explain", str(data), "--step", "5", "--where", where, *cfg, "--format", "csv", "--out", str(out)]) == 0
    )
    with plitzer.Loader(data, where=where, **CFG) as loader:  # type: ignore[arg-type]
        loader.seek(5)
        want = loader.next_batch().documents()
    got = pl.read_csv(out)
    assert got["row"].to_list() == want["row"].to_list()
    page = tmp_path / "audit.html"
    assert main(["audit", str(data), "--where", where, *cfg, "--steps", "10", "--out", str(page)]) == 0
    assert "selection" in page.read_text().lower()
    capsys.readouterr()


def test_the_pass_parses_each_footer_once_and_keeps_none(
    data: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Two predicate columns and a length column: one parse a file, no footer held after the pass."""
    from planner.catalog import footer

    monkeypatch.setenv("PLITZER_CACHE", str(tmp_path / "cache"))
    ix = plitzer.index(data)
    parsed: list[str] = []
    real = footer.parse

    def counted(raw: bytes, where: str, **kw: bool) -> pq.FileMetaData:
        parsed.append(where)
        return real(raw, where, **kw)

    monkeypatch.setattr(footer, "parse", counted)
    got = sel.select_index(
        ix, plitzer.Selection(where="language = 'de' or int_score = 4", length_column="token_count"), threads=2
    )
    files = [f.location for f in ix.files]
    assert sorted(set(parsed)) == sorted(files)  # every file's footer, for its columns' chunks
    assert len(parsed) <= len(files) + 1  # once each (the first file's once more, for the schema)
    assert len(ix._footers) <= 1 and not ix._chunks  # nothing of the pass kept
    want = filtered_copy(data, tmp_path / "want", "language = 'de' or int_score = 4")
    assert got.tokens == plitzer.index(want).tokens


def test_a_predicate_on_a_struct_field_reads_it_through_the_whole_footer(tmp_path: Path) -> None:
    """A column of many leaves has no chunks of its own to decode: its row groups go through the footer."""
    rng = np.random.default_rng(4)
    for f in range(2):
        n = 60
        lens = rng.integers(0, 9, n)
        toks = pa.array([list(range(k)) for k in lens.tolist()], pa.list_(pa.int32()))
        meta = pa.StructArray.from_arrays([pa.array(rng.integers(0, 5, n)), pa.array(["a", "b", "c"] * 20)],
                                          names=["score", "tag"])  # fmt: skip
        lang = pa.array(rng.choice(["en", "de"], n).tolist()).dictionary_encode()
        pq.write_table(pa.table({"tokens": toks, "meta": meta, "lang": lang}), tmp_path / f"{f}.parquet",
                       row_group_size=20)  # fmt: skip
    where = "meta.score >= 3 and lang = 'en'"
    got = sel.select_index(plitzer.index(tmp_path), where, threads=2)
    con = duckdb.connect()
    want = []
    for f in sorted(tmp_path.glob("*.parquet")):
        pf = pq.ParquetFile(f)
        for g in range(pf.num_row_groups):
            con.register("t", pf.read_row_group(g))
            want.append(con.sql(f"select count(*), coalesce(sum(len(tokens)), 0) from t where {where}").fetchall()[0])
            con.unregister("t")
    assert list(zip(got.frame["rows_selected"], got.frame["tokens_selected"], strict=True)) == want
