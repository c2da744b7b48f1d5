"""Documented outputs are what the code gives: column lists and values shown in README.md and docs/ are asserted.

Three forms are checked wherever they appear in a fenced Python block:

* ``print(X.columns)`` followed by a ``# [...]`` comment line: the list printed;
* ``plan.<table>(0)  # a, b, c`` (and ``batch.documents()``): the table's columns, in order;
* ``print(X)  # <a Python literal>...``: the block runs as pasted, in a fresh folder, and
  ``X`` must equal the literal (``print(loader.config["columns"])  # [['prompt_mask', 0]]``).

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

ROOT = Path(__file__).resolve().parents[2]
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


_VALUE = re.compile(r"^\s*print\((.+)\)\s+#\s*(.+)$")


def _literal(comment: str) -> tuple[bool, object]:
    """The Python literal a comment opens with (``[['a', 0]]: in every checkpoint`` gives the list), if any."""
    for end in range(len(comment), 0, -1):
        try:
            return True, ast.literal_eval(comment[:end])
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            continue
    return False, None


def _valued_blocks() -> list[tuple[str, str, dict[int, object]]]:
    """(where, code, {line: value}) of every Python block with a ``print(x)  # <literal>`` line."""
    out = []
    for path in DOCS:
        text = path.read_text()
        for start, block in _blocks(text):
            if not text.splitlines()[start - 1].strip().startswith("```python"):
                continue
            values = {}
            for j, line in enumerate(block):
                m = _VALUE.match(line)
                if m:
                    ok, value = _literal(m.group(2).strip())
                    if ok and m.group(2).strip()[:1] in "[({'\"0123456789-":
                        values[j + 1] = value
            if values:
                out.append((f"{path.relative_to(ROOT)}:{start + 1}", "\n".join(block), values))
    return out


def test_the_docs_show_values_to_check() -> None:
    assert _valued_blocks(), "no documented print(...)  # value line found"


@pytest.mark.parametrize(("where", "code", "values"), _valued_blocks(), ids=lambda x: x if isinstance(x, str) else "")
def test_documented_values_are_the_code_s(
    where: str, code: str, values: dict[int, object], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The block runs as a user would paste it (in a fresh folder), and each such print gives its comment's value."""
    tree = ast.parse(code)
    got: dict[int, object] = {}

    class Check(ast.NodeTransformer):
        def visit_Expr(self, node: ast.Expr) -> ast.AST:
            call = node.value
            if (
                isinstance(call, ast.Call)
                and isinstance(call.func, ast.Name)
                and call.func.id == "print"
                and node.lineno in values
            ):
                record = ast.parse(f"__got[{node.lineno}] = 0").body[0]
                assert isinstance(record, ast.Assign)
                record.value = call.args[0]
                return ast.copy_location(record, node)
            return node

    fixed = ast.fix_missing_locations(Check().visit(tree))
    monkeypatch.chdir(tmp_path)
    exec(compile(fixed, where, "exec"), {"__got": got, "__name__": "__doc__"})
    for line, want in values.items():
        assert line in got, f"{where}, line {line}: the print did not run"
        assert got[line] == want, f"{where}, line {line}: the doc shows {want!r}, the code gives {got[line]!r}"
