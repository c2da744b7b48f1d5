"""Rules on the source itself, checked by reading it."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("plitzer", "planner")


def _sources() -> list[Path]:
    files = sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))
    assert len(files) > 20, f"found only {len(files)} modules under {PACKAGES} in {ROOT}"
    return files


def test_no_module_reads_a_call_frame() -> None:
    # The adapters refuse DataLoader's batching through the collate path, not by reading
    # the caller's frame (docs/torch.md, "A batch size is refused too").
    found = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in _sources()
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if "_getframe" in line or "currentframe" in line
    ]
    assert found == []


def test_the_command_line_has_no_module_over_500_lines() -> None:
    # A subcommand is an entry of plitzer/cli/table.py, not a block of the parser.
    sizes = {p.name: len(p.read_text().splitlines()) for p in (ROOT / "plitzer" / "cli").glob("*.py")}
    assert "table.py" in sizes, sorted(sizes)
    assert {n: s for n, s in sizes.items() if s > 500} == {}


def test_no_module_over_500_lines() -> None:
    # A module owns one thing (docs/design.md, "The map of the code"); the benchmark
    # harness (plitzer/bench), which runs peers' loaders side by side, is the exception.
    bench = ROOT / "plitzer" / "bench"
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in _sources() if bench not in p.parents}
    assert {n: s for n, s in sizes.items() if s > 500} == {}


def _declared_all(tree: ast.Module) -> set[str] | None:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    return None


def test_a_module_with_all_lists_every_public_function_and_class() -> None:
    # A public name used by another module is part of its module's surface (the rule against
    # importing private names across modules made them public): `__all__` says so, and the
    # API reference and `from m import *` see it.
    missing = {}
    for p in _sources():
        tree = ast.parse(p.read_text())
        declared = _declared_all(tree)
        if declared is None:
            continue
        public = {
            n.name
            for n in tree.body
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and not n.name.startswith("_")
        }
        if public - declared:
            missing[str(p.relative_to(ROOT))] = sorted(public - declared)
    assert missing == {}


def test_no_private_name_is_imported_across_modules() -> None:
    # What another module needs is public in its own (docs/design.md, "The map of the code").
    found = [
        f"{p.relative_to(ROOT)}: from {node.module} import {alias.name}"
        for p in _sources()
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in PACKAGES
        for alias in node.names
        if alias.name.startswith("_") and not alias.name.startswith("__")
    ]
    assert found == []
