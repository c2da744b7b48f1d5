"""A ``where=`` predicate is one expression over the dataset's columns, and reads nothing else.

Predicates come from configuration others write (mixture files, audit tools): each
way out of "one boolean expression" is refused with a SelectionError that names what
is not allowed, before any data is read; every predicate the docs show is accepted;
and the connections that evaluate predicates (and ``plan.sql``, unless asked) have
DuckDB's external access off.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import planner
import plitzer
from plitzer.errors import SelectionError
from plitzer.selection.predicate import connect, normalize
from tests.conftest import SynthDataset, tokens_of

REPO = Path(__file__).resolve().parents[2]
CFG = {"seed": 3, "lanes": 4, "window": 3, "seq_len": 32}


@pytest.fixture(scope="module")
def data(synth_dataset: SynthDataset) -> Path:
    return synth_dataset(tokens=20_000, seed=5, docs_per_row_group=20, row_groups_per_file=3, mean_length=120)


ESCAPES = [
    # the wrapping escaped by an unbalanced parenthesis: every row selected
    ("score >= 3) or (1=1", r"is not a DuckDB SQL expression \(syntax error"),
    ("score >= 3)) or ((1=1", r"is not a DuckDB SQL expression \(syntax error"),
    # subqueries, and files read through them
    ("(select count(*) from read_text('/etc/hostname')) > 0", "a subquery is not allowed"),
    ("exists (select 1)", "a subquery is not allowed"),
    ("int_score in (select 3)", "a subquery is not allowed"),
    ("score > (select max(score) from read_parquet('/tmp/*.parquet'))", "a subquery is not allowed"),
    # table functions as calls: files and URLs
    ("read_text('/etc/hostname') is not null", r"read_text\(\) \(a table function\) is not allowed"),
    ("read_csv('/etc/passwd') is not null", r"read_csv\(\) \(a table function\) is not allowed"),
    ("read_parquet('s3://bucket/x.parquet') is null", r"read_parquet\(\) \(a table function\) is not allowed"),
    ("glob('/etc/*') is null", r"glob\(\) \(a table function\) is not allowed"),
    ("read_blob('http://127.0.0.1:1/x') is null", r"read_blob\(\) \(a table function\) is not allowed"),
    # a query's clauses after the expression
    ("score > 1 from read_text('/etc/hostname')", "FROM is not allowed"),
    ("score > 1 limit 5", "LIMIT, OFFSET, ORDER BY or DISTINCT is not allowed"),
    ("score > 1 union select true", "a query .*SET OPERATION.* is not allowed"),
    ("score > 1 where true", "WHERE is not allowed"),
    ("score > 1, int_score > 2", "a list of 2 expressions is not allowed"),
    ("score > 1 as keep", r"an alias \(AS keep\) is not allowed"),
    # comments and several statements
    ("score > 1 -- and int_score > 3", r"a comment \(at character 10\) is not allowed"),
    ("score > 1 /* and int_score > 3 */", "a comment .* is not allowed"),
    ("score > 1; select * from read_text('/etc/hostname')", "a statement separator ';' is not allowed"),
    ("score > 1;", "a statement separator ';' is not allowed"),
    # the session, the clock, nondeterminism, aggregates, windows
    ("current_setting('threads') > 1", r"current_setting\(\) .* is not allowed"),
    ("random() < 0.5", r"random\(\) \(not deterministic\) is not allowed"),
    ("now() > '2020-01-01'", r"now\(\) .* is not allowed"),
    ("count(*) > 1", r"count_star\(\) \(an aggregate\) is not allowed"),
    ("sum(score) over () > 1", r"a window function \(OVER\) is not allowed"),
    ("columns(*) is not null", r"\* or COLUMNS\(\.\.\.\) is not allowed"),
    ("system.main.lower(language) = 'en'", r"a qualified function name \(system\.main\.lower\) is not allowed"),
    ("$1", "a prepared-statement parameter is not allowed"),
]


@pytest.mark.parametrize(("where", "match"), ESCAPES)
def test_escapes_are_refused_before_any_read(where: str, match: str) -> None:
    with pytest.raises(SelectionError, match=match) as e:
        normalize(where)
    assert e.value.predicate == where
    assert "write one boolean expression over the dataset's columns" in str(e.value)


@pytest.mark.parametrize(("where", "match"), ESCAPES[:3] + ESCAPES[6:8] + ESCAPES[17:20])
def test_escapes_are_refused_by_the_loader(data: Path, where: str, match: str) -> None:
    with pytest.raises(SelectionError, match=match):
        plitzer.Loader(data, where=where, **CFG)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("where", "column"),
    [
        ("quality >= 3", "quality"),
        ("len(tokens) > 3", "tokens"),  # the token column
        ("t2.score > 1", "t2"),
        ("current_date > '2020-01-01'", None),  # a clock read as a column name
        ("list_filter([1, 2], lambda x: x > score) = [2] and nope", "nope"),
    ],
)
def test_columns_outside_the_dataset_are_refused(data: Path, where: str, column: str | None) -> None:
    with pytest.raises(SelectionError) as e:
        plitzer.Loader(data, where=where, **CFG)  # type: ignore[arg-type]
    text = str(e.value)
    if column is None:
        assert "reads the clock, the session or the environment" in text
    else:
        assert e.value.column == column
        assert "available columns: id, score, int_score, language, token_count" in text


def _doc_predicates() -> list[str]:
    """Every ``where=`` / ``--where`` predicate in README.md and docs/ (quoted)."""
    found: set[str] = set()
    texts = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    for path in texts:
        text = path.read_text()
        for m in re.finditer(r"""(?:where=|--where |"where": )(["'])(.+?)\1""", text):
            if m.group(2) not in ("...",):
                found.add(m.group(2))
        for m in re.finditer(r'^where = "(.+)"$', text, re.MULTILINE):
            found.add(m.group(1))
    return sorted(found)


def test_every_predicate_the_docs_show_is_accepted() -> None:
    shown = _doc_predicates()
    assert "int_score >= 3 and language = 'en'" in shown and len(shown) >= 4, shown
    columns = ["int_score", "language", "score", "token_count"]
    for where in shown:
        assert normalize(where, columns)


@pytest.mark.parametrize(
    "where",
    [
        "int_score >= 3 and language = 'en'",
        "language in ('en', 'de') and not (score < 1.5)",
        "score between 1 and 3.5 or int_score is null",
        "language like 'e%' and lower(language) = 'en'",
        "case when int_score > 2 then score > 2 else false end",
        "cast(int_score as double) > 2.5 and int_score::bigint % 2 = 0",
        "hash(id) % 4 != 0 and len(language) = 2",
        "list_contains(['en', 'fr'], language)",
        "list_filter([1, 2, 3], lambda x: x > int_score) = [3]",
        "regexp_matches(language, '^(en|de)$') and starts_with(language, 'e')",
    ],
)
def test_expressions_a_user_writes_select_as_duckdb_does(data: Path, where: str) -> None:
    """Accepted predicates select what DuckDB's WHERE does over the same rows (a reference run)."""
    import duckdb
    import pyarrow.parquet as pq

    ix = plitzer.index(data)
    sel = plitzer.selection.select.select_index(ix, where)
    want = []
    con = duckdb.connect()
    for f in sorted(data.glob("*.parquet")):
        pf = pq.ParquetFile(f)
        for g in range(pf.num_row_groups):
            con.register("t", pf.read_row_group(g))
            want.append(int(con.sql(f"select count(*) from t where {where}").fetchall()[0][0]))
            con.unregister("t")
    con.close()
    assert sel.frame["rows_selected"].to_list() == want


def test_evaluation_has_no_external_access(tmp_path: Path) -> None:
    import duckdb
    import pyarrow as pa

    secret = tmp_path / "secret.txt"
    secret.write_text("x")
    con = connect(threads=1)
    try:
        con.register("t", pa.table({"a": [1, 2, 3]}))  # Arrow handed over: read as usual
        assert con.sql("select (a > 1) as keep from t").fetchall() == [(False,), (True,), (True,)]
        for query in (f"select * from read_text('{secret}')", f"select * from glob('{tmp_path}/*')"):
            with pytest.raises(duckdb.PermissionException):
                con.sql(query).fetchall()
        with pytest.raises(duckdb.Error):  # and it cannot be turned back on
            con.execute("set enable_external_access = true")
    finally:
        con.close()


def test_selection_still_reads_the_dataset_with_external_access_off(data: Path) -> None:
    """The pass hands DuckDB Arrow columns: the batches equal the same selection's as before."""
    with plitzer.Loader(data, where="int_score >= 2", **CFG) as ld:  # type: ignore[arg-type]
        got = [tokens_of(ld.next_batch()).copy() for _ in range(3)]
        assert ld.index.tokens < planner.index(data).tokens
    with plitzer.Loader(data, where="INT_SCORE   >=   2", **CFG) as again:  # type: ignore[arg-type]
        for want in got:
            np.testing.assert_array_equal(tokens_of(again.next_batch()), want)


def test_plan_sql_runs_without_external_access_unless_asked(data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from planner.errors import ConfigError
    from plitzer.cli import main

    p = planner.plan(data, lanes=4, window=2, world=2)
    assert p.sql("select count(*) as n from row_groups")["n"][0] == p.index.height
    query = f"select count(*) as n from read_parquet('{data}/*.parquet')"
    for q in (query, "select * from read_text('/etc/hostname')"):
        with pytest.raises(ConfigError, match=r"external access off: .*external_access=True"):
            p.sql(q)
    assert p.sql(query, external_access=True)["n"][0] == p.index["rows"].sum()
    # The CLI: an error naming the flag, then the flag.
    argv = ["plan", str(data), "--lanes", "4", "--window", "2", "--world", "2", "--sql", query, "--format", "csv"]
    assert main(argv) == 2
    assert "--external-access" in capsys.readouterr().err
    assert main([*argv, "--external-access"]) == 0
    assert capsys.readouterr().out.split() == ["n", str(p.index["rows"].sum())]


def test_a_mixture_files_predicates_are_checked_the_same(data: Path) -> None:
    sources = {"a": {"path": str(data), "where": "int_score >= 2; select 1"}, "b": str(data)}
    with pytest.raises(SelectionError, match="a statement separator ';' is not allowed"):
        plitzer.Loader(sources, weights={"a": 1, "b": 1}, **CFG)  # type: ignore[arg-type]
