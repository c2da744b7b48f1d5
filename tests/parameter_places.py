"""The places in the code that list five or more of the run's parameter names (a test helper and a script).

A place is a call (its keyword names), a function's signature, a dict (its string
keys), a class (the names its body assigns) or a list, tuple or set of strings. Each
that names at least :data:`AT_LEAST` of :data:`planner.parameters.PARAMETERS` restates
the table, and must be kept in step with it by hand: ``tests/planning/test_settings_parameters.py``
holds their number down. Run it to see them::

    python tests/parameter_places.py [DIR ...]   # default: planner plitzer
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from planner.parameters import PARAMETERS

AT_LEAST = 5
NAMES = frozenset(p.name for p in PARAMETERS)
ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True, slots=True)
class Place:
    path: str  # relative to the repository
    line: int
    what: str  # "call f", "def f", "class C", "dict", "list"
    scope: str  # the enclosing function or class, dotted ("" at module level)
    names: tuple[str, ...]

    @property
    def key(self) -> str:
        """Where it is, without the line number: ``path:scope:what``."""
        return f"{self.path}:{self.scope}:{self.what}"

    def __str__(self) -> str:
        where = f"{self.path}:{self.line} {self.scope or '<module>'}"
        return f"{where}: {self.what} ({len(self.names)}: {', '.join(self.names)})"


def _callee(node: ast.expr) -> str:
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return "?"


def _listed(node: ast.AST) -> tuple[str, set[str]] | None:
    """What ``node`` is and the names it lists, for the kinds of place counted."""
    if isinstance(node, ast.Call):
        return f"call {_callee(node.func)}", {k.arg for k in node.keywords if k.arg}
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        a = node.args
        return f"def {node.name}", {x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)}
    if isinstance(node, ast.ClassDef):
        own: set[str] = set()
        for s in node.body:
            if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name):
                own.add(s.target.id)
            elif isinstance(s, ast.Assign):
                own |= {t.id for t in s.targets if isinstance(t, ast.Name)}
        return f"class {node.name}", own
    if isinstance(node, ast.Dict):
        return "dict", {k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return "list", {e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    return None


def _walk(node: ast.AST, scope: tuple[str, ...]) -> Iterator[tuple[ast.AST, tuple[str, ...]]]:
    yield node, scope
    inner = (*scope, node.name) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) else scope
    for child in ast.iter_child_nodes(node):
        yield from _walk(child, inner)


def places_in(path: Path) -> list[Place]:
    """The places of one file."""
    rel = path.resolve().relative_to(ROOT).as_posix()
    out = []
    for node, scope in _walk(ast.parse(path.read_text(), str(path)), ()):
        got = _listed(node)
        if got is None:
            continue
        what, names = got
        hit = names & NAMES
        if len(hit) >= AT_LEAST:
            line = getattr(node, "lineno", 0)
            out.append(Place(rel, line, what, ".".join(scope), tuple(sorted(hit))))
    return out


def places(dirs: Iterable[str] = ("planner", "plitzer")) -> list[Place]:
    """Every place of the packages ``dirs`` (relative to the repository), in file and line order."""
    out: list[Place] = []
    for d in dirs:
        for path in sorted((ROOT / d).rglob("*.py")):
            out.extend(places_in(path))
    return sorted(out, key=lambda p: (p.path, p.line))


if __name__ == "__main__":
    found = places(sys.argv[1:] or ("planner", "plitzer"))
    for p in found:
        print(p)
    print(f"{len(found)} places list {AT_LEAST} or more parameter names")
