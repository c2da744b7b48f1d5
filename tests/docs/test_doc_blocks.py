"""Every Python block of the README and the docs runs as pasted: its imports are its own.

A reader copies one block, not the page: a block that uses ``plitzer`` (or ``np``,
``torch``, ...) imported only by an earlier block fails with a ``NameError`` where it
lands. In the guides variables may come from the page's earlier blocks (a block that goes
on with the ``loader`` of the one before reads as a continuation), imports may not; the
README's blocks are each whole, every name they use their own (the first page read, a
block at a time). The guides' blocks also run end to end where they need only local data:
docs/usage.md's in tests/audit/test_audit.py, docs/grain.md's in tests/integrations/test_first_hour.py, and
the README's that read the sample datasets below, each alone in a fresh namespace.
"""

from __future__ import annotations

import ast
import builtins
import re
from pathlib import Path

import pytest

import plitzer
import plitzer.synth

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def blocks(page: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page.read_text(), re.DOTALL)


def _bound(tree: ast.AST) -> tuple[set[str], set[str]]:
    """Names a block binds by import, and by anything else (assignment, def, for, with, ...)."""
    imported: set[str] = set()
    other: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported |= {a.asname or a.name for a in node.names}
        elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            other.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            other.add(node.name)
        elif isinstance(node, ast.arg):
            other.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            other.add(node.name)
    return imported, other


# The modules the pages use, by the names they import them as: a block that uses one imports it.
MODULES = {"plitzer", "planner", "np", "pl", "pa", "pq", "torch", "dist", "os", "sys", "json", "jax", "grain", "duckdb"}


def missing_imports(page: Path) -> list[str]:
    """``block i: name`` for every module a block uses without importing it (an earlier block's import does not count).

    Other free names are the reader's own (``model``, ``rank``) or an earlier block's
    variables (a continuation).
    """
    out = []
    for i, code in enumerate(blocks(page)):
        tree = ast.parse(code)
        imported, other = _bound(tree)
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        out += [f"block {i}: {n}" for n in sorted((used & MODULES) - imported - other - set(dir(builtins)))]
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_block_imports_what_it_uses(page: Path) -> None:
    for code in blocks(page):
        compile(code, str(page), "exec")  # every block is Python
    assert missing_imports(page) == []


def test_the_check_finds_a_block_that_lacks_its_import(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "```python\nimport plitzer\nloader = plitzer.Loader('d')\n```\n"
        "```python\nbatch = loader.next_batch()\n```\n"  # a continuation: fine
        "```python\nplan = plitzer.plan('d')\n```\n"  # plitzer imported only above: not fine
    )
    assert missing_imports(page) == ["block 2: plitzer"]


def free_names(page: Path) -> list[str]:
    """``block i: name`` for every name a block uses without binding it (an import, an assignment, ...)."""
    out = []
    for i, code in enumerate(blocks(page)):
        tree = ast.parse(code)
        imported, other = _bound(tree)
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        out += [f"block {i}: {n}" for n in sorted(used - imported - other - set(dir(builtins)))]
    return out


def test_every_readme_block_binds_what_it_uses() -> None:
    """No README block goes on with an earlier block's variables (0.6's mixture blocks used ``sources``)."""
    assert free_names(ROOT / "README.md") == []


def test_the_check_finds_a_block_that_goes_on_from_another(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "```python\nimport plitzer\nloader = plitzer.Loader('d')\n```\n"
        "```python\nfor batch in loader:\n    print(batch)\n```\n"
    )
    assert free_names(page) == ["block 1: loader"]


def _readme(name: str) -> str:
    """The README's block that holds ``name``."""
    found = [b for b in blocks(ROOT / "README.md") if name in b]
    assert len(found) == 1, (name, len(found))
    return found[0]


def test_the_readme_blocks_on_local_data_run_as_pasted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's blocks that read local folders, each alone, on sample data of the shapes they name."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    monkeypatch.chdir(tmp_path)
    plitzer.synth.write("data/demo", tokens=2_000_000, seed=0)
    plitzer.synth.write("data/sample", tokens=300_000, seed=1)
    rng = np.random.default_rng(0)
    for name, mask in (("chat", True), ("pretrain", False)):
        docs = [rng.integers(0, 1000, int(n)).tolist() for n in rng.integers(5, 200, 400)]
        cols = {"tokens": pa.array(docs, pa.list_(pa.int32()))}
        if mask:
            cols["prompt_mask"] = pa.array([[j < len(d) // 3 for j in range(len(d))] for d in docs])
        Path(f"data/{name}").mkdir(parents=True)
        pq.write_table(pa.table(cols), f"data/{name}/part-0.parquet", row_group_size=50)
    for code in (
        _readme("import planner  "),
        _readme("seq_len=[(0, 2048)"),
        _readme("plitzer.locate("),
        _readme("prompt_mask"),
    ):
        exec(compile(code, "README.md", "exec"), {})
    exec(compile(_readme('packing="best-fit"'), "README.md", "exec"), {})


def test_the_readme_mixture_blocks_run_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Mixtures section's blocks, each alone in a fresh namespace, on two sources as it names them.

    ``data/code`` holds ``input_ids`` (``plitzer synth --column input_ids``), ``data/web``
    synth's own ``tokens``: the loader finds either column by itself.
    """
    monkeypatch.chdir(tmp_path)
    plitzer.synth.write("data/web", tokens=120_000, seed=2, docs_per_row_group=40, mean_length=300)
    plitzer.synth.write("data/code", tokens=40_000, seed=3, docs_per_row_group=40, mean_length=300, column="input_ids")
    mixture = [
        _readme("(20_000, {"),  # the sources, and stages
        _readme("any_value(s.target_share)"),  # the plan's delivered shares
        _readme("loader.set_weights("),  # a live stage
        _readme("plitzer.mixing.Online("),  # steered from the losses
    ]
    for code in mixture:
        exec(compile(code, "README.md", "exec"), {})
