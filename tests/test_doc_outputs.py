"""Documented outputs are what the code gives: column lists shown in README.md and docs/ are asserted.

Two forms are checked wherever they appear in a fenced Python block:

* ``print(X.columns)`` followed by a ``# [...]`` comment line: the list printed;
* ``plan.<table>(0)  # a, b, c`` (and ``batch.documents()``): the table's columns, in order.

A doc line that names a column the code does not give (``window`` for ``window_index``
in docs/usage.md, 0.4) fails here, with the file and line.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import planner
import plitzer
from tests.conftest import SynthDataset

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_TABLE = re.compile(r"^\s*plan\.(row_groups|lanes|reads)\(0\)\s+#\s*([a-z_]+(?:,\s*[a-z_]+)+)\s*$")


def _blocks(text: str) -> list[tuple[int, list[str]]]:
    out, lines, start, inside = [], text.splitlines(), 0, False
    for i, line in enumerate(lines):
        if line.strip().startswith("```"):
            if inside:
                out.append((start, lines[start:i]))
            inside, start = not inside, i + 1
    return out


def _documented() -> list[tuple[str, str, list[str]]]:
    """(where, what, columns) of every documented column list."""
    found = []
    for path in DOCS:
        for start, block in _blocks(path.read_text()):
            for j, line in enumerate(block):
                where = f"{path.relative_to(ROOT)}:{start + j + 1}"
                m = _TABLE.match(line)
                if m:
                    found.append((where, m.group(1), [c.strip() for c in m.group(2).split(",")]))
                if re.search(r"print\(docs\.columns\)", line) and j + 1 < len(block):
                    nxt = block[j + 1].strip()
                    if nxt.startswith("# ["):
                        found.append((where, "documents", list(ast.literal_eval(nxt[2:]))))
    return found


@pytest.fixture(scope="module")
def actual(synth_dataset: SynthDataset) -> dict[str, list[str]]:
    d = synth_dataset(tokens=20_000, seed=5, docs_per_row_group=20, row_groups_per_file=2, mean_length=100)
    plan = planner.plan(d, seed=0, lanes=4, window=2, world=2)
    with plitzer.Loader(d, lanes=4, window=2, seq_len=32) as ld:
        documents = ld.next_batch().documents().columns
    return {
        "row_groups": plan.row_groups(0).columns,
        "lanes": plan.lanes(0).columns,
        "reads": plan.reads(0).columns,
        "documents": documents,
    }


def test_the_docs_show_column_lists_to_check() -> None:
    kinds = {what for _, what, _ in _documented()}
    assert {"documents", "row_groups", "lanes", "reads"} <= kinds, kinds


@pytest.mark.parametrize(("where", "what", "columns"), _documented(), ids=lambda x: x if isinstance(x, str) else "")
def test_documented_columns_are_the_code_s(
    where: str, what: str, columns: list[str], actual: dict[str, list[str]]
) -> None:
    assert columns == actual[what], f"{where}: the doc shows {columns}, the code gives {actual[what]}"


def test_sql_sums_of_integers_are_integers(synth_dataset: SynthDataset) -> None:
    """DuckDB's sum of BIGINT is a HUGEINT (decimal(38, 0) in Polars): plan.sql gives Int64, as the docs show."""
    import polars as pl

    d = synth_dataset(tokens=20_000, seed=5, docs_per_row_group=20, row_groups_per_file=2, mean_length=100)
    plan = planner.plan(d, seed=0, lanes=4, window=2, world=2)
    got = plan.sql(
        "select rank, sum(bytes) as bytes, sum(tokens) as t "
        "from reads join row_groups using (file, row_group) group by rank"
    )
    assert got.schema["bytes"] == pl.Int64 and got.schema["t"] == pl.Int64, got.schema
    assert int(got["bytes"].sum()) == int(plan.reads(0)["bytes"].sum())
