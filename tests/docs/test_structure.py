"""Rules on the source itself, checked by reading it."""

from __future__ import annotations

import ast
import collections.abc
import inspect
import re
import typing
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
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


INDEX_TYPES = {"Index", "TextIndex", "SelectedIndex", "DedupedIndex", "MixtureIndex", "ArrowIndex", "RowGroupIndex"}
"""The index types: only ``plitzer.sources`` tells them apart; everything else asks the index."""

PLANNER_DISPATCH = {"planner/api.py", "planner/mixing/mixindex.py", "planner/catalog/dataset.py"}
"""planner's own dispatch of what it is given (a path, an index, a mixture): it cannot import plitzer."""


def _type_tests(tree: ast.Module) -> list[int]:
    """Lines that test an index's type: ``isinstance(x, T)`` or ``type(x) is T`` for an index type T."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance":
            kinds = node.args[1] if len(node.args) > 1 else None
            names = kinds.elts if isinstance(kinds, ast.Tuple) else [kinds]
            if any(isinstance(n, ast.Name) and n.id in INDEX_TYPES for n in names):
                lines.append(node.lineno)
        if isinstance(node, ast.Compare) and isinstance(node.left, ast.Call):
            f = node.left.func
            if isinstance(f, ast.Name) and f.id == "type":
                seen = [c for c in node.comparators if isinstance(c, (ast.Name, ast.Tuple))]
                flat = [e for c in seen for e in (c.elts if isinstance(c, ast.Tuple) else [c])]
                if any(isinstance(e, ast.Name) and e.id in INDEX_TYPES for e in flat):
                    lines.append(node.lineno)
    return lines


def test_only_the_sources_package_tests_an_index_type() -> None:
    bad = []
    for path in _sources():
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("plitzer/sources/") or rel in PLANNER_DISPATCH:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        bad += [f"{rel}:{line}" for line in _type_tests(tree)]
    assert not bad, f"ask the index (capabilities, parts, part, unwrapped) instead of testing its type: {bad}"


def test_the_type_test_check_finds_one() -> None:
    tree = ast.parse("isinstance(ix, (Index, int))\ntype(ix) is SelectedIndex\nisinstance(x, str)\n")
    assert _type_tests(tree) == [1, 2]


RULES = "planner/rules/"  # where the rules are written: the one place that may name their classes
PADDING = {  # rule.pads where it means what it says, "rows may end in padding" (batch.mask can be False)
    "plitzer/integrations/feed.py": "a step's real tokens are counted from the mask, not computed",
}
RULE_CLASSES = {"Binned", "BestFit", "Concat"}


def _asks_the_rule_class(tree: ast.AST) -> list[int]:
    """Lines that ask a packing rule's class: ``rule.pads`` (any ``*rule`` or ``rule_named(...)``) or
    ``isinstance(x, Binned)``; the code asks the rule's questions instead (planner.rules.Rule: unit,
    needs_counts, binning)."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "pads":
            v = node.value
            named = isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id == "rule_named"
            if named or (isinstance(v, ast.Name) and v.id.endswith("rule")) or getattr(v, "attr", "") == "rule":
                lines.append(node.lineno)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance":
            kinds = node.args[1] if len(node.args) > 1 else None
            names = kinds.elts if isinstance(kinds, ast.Tuple) else [kinds]
            if any(isinstance(n, ast.Name) and n.id in RULE_CLASSES for n in names):
                lines.append(node.lineno)
    return lines


def test_the_runtime_asks_the_rule_not_its_class() -> None:
    # docs/design.md, "The rule is the only switch (0.7)": what a caller means (the units, a
    # pass that counts them, bins to expand) is a question of planner.rules.Rule.
    bad = []
    for path in _sources():
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(RULES) or rel in PADDING:
            continue
        bad += [f"{rel}:{line}" for line in _asks_the_rule_class(ast.parse(path.read_text(encoding="utf-8")))]
    assert not bad, f"ask the rule (unit, needs_counts, binning) instead of rule.pads or its class: {bad}"


def test_the_rule_class_check_finds_them() -> None:
    text = (
        "s.rule.pads\nrule.pads\nrule_named(n).pads\nisinstance(r, Binned)\nisinstance(r, (int, BestFit))\n"
        "feed.pads\nisinstance(r, int)\nrule.binning\n"
    )
    assert _asks_the_rule_class(ast.parse(text)) == [1, 2, 3, 4, 5]


def test_nothing_registers_a_reader_at_import() -> None:
    """No singledispatch registry: a kind's index reads itself (``read_tokens``), planner's are read as Parquet."""
    found = []
    for path in _sources():
        text = path.read_text(encoding="utf-8")
        if "singledispatch" in text or ".register\n" in text:
            found.append(path.relative_to(ROOT).as_posix())
    assert not found, found


MAX_FUNCTION_LINES = 60


def _long_functions(text: str) -> dict[str, int]:
    """Every function (methods and nested ones too) over MAX_FUNCTION_LINES, def to last line, docstring included."""
    out: dict[str, int] = {}
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            if lines > MAX_FUNCTION_LINES:
                out[node.name] = max(lines, out.get(node.name, 0))
    return out


def test_the_function_length_counts_from_def_to_the_last_line() -> None:
    def module(body_lines: int) -> str:
        body = "".join(f"    x{i} = {i}\n" for i in range(body_lines - 1))
        return (
            f'@decorator\ndef f(\n    a: int,\n) -> None:\n    """Doc."""\n{body}\n\nclass C:\n    def g(self): pass\n'
        )

    assert _long_functions(module(MAX_FUNCTION_LINES - 3)) == {}  # def, signature, docstring and body: 60 lines
    assert _long_functions(module(MAX_FUNCTION_LINES - 2)) == {"f": MAX_FUNCTION_LINES + 1}
    nested = "def outer():\n    def inner():\n" + "        pass\n" * 61
    assert _long_functions(nested) == {"outer": 63, "inner": 62}


def test_no_function_over_60_lines() -> None:
    # A function does one thing, named (docs/design.md, "The map of the code"); the benchmark
    # harness (plitzer/bench), which runs peers' loaders side by side, is the exception.
    bench = ROOT / "plitzer" / "bench"
    long = {
        (p.relative_to(ROOT).as_posix(), name): lines
        for p in _sources()
        if bench not in p.parents
        for name, lines in _long_functions(p.read_text()).items()
    }
    assert long == {}


# -- every in-memory cache is a Bounded ------------------------------------------------------

_CONTAINERS = {"dict", "list", "set", "defaultdict", "OrderedDict", "deque", "Counter", "WeakValueDictionary"}
"""Calls that make a mutable container (a module-level one of these, empty or filled by its module, is a cache)."""

_MUTATORS = {"add", "append", "extend", "insert", "update", "setdefault", "pop", "popitem", "discard", "remove"}

NOT_CACHES = {
    # Each a set of what this process has already warned about (or found unwritable), so a
    # warning is said once: one entry a cache folder, a damaged entry or a job index and
    # column; what it holds is the warnings a user was shown, not values made again.
    "planner/catalog/datasetindex.py:_warned",
    "planner/stores/cache.py:_unwritable",
    "planner/stores/cache.py:_warned",
    # The allocator settings applied at import: one entry an allocator (two), written once.
    "plitzer/readpath/allocators.py:applied",
    # The empty dict Held.keep hands back in place of a chunk it stored (never filled).
    "plitzer/selection/held.py:_KEPT",
}
"""Module-level containers that are not caches, each with why (keep it short: anything else is a Bounded)."""


def _container(value: ast.expr | None) -> bool:
    """Whether ``value`` makes a mutable container: a literal, a comprehension or a call of one of ``_CONTAINERS``."""
    if isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)):
        return True
    if isinstance(value, ast.Call):
        f = value.func
        return (f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else "") in _CONTAINERS
    return False


def _empty(value: ast.expr) -> bool:
    if isinstance(value, (ast.Dict, ast.List, ast.Set)):
        return not (value.keys if isinstance(value, ast.Dict) else value.elts)
    if not isinstance(value, ast.Call):
        return False
    f = value.func
    if (f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else "") == "defaultdict":
        return len(value.args) <= 1  # defaultdict(list): its argument is the factory, not entries
    return not value.args and not value.keywords


def _mutated(tree: ast.Module) -> set[str]:
    """Names this module fills or changes: ``name[k] = v``, ``del name[k]``, ``name.add(...)`` and the like."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, (ast.Store, ast.Del)):
            if isinstance(node.value, ast.Name):
                out.add(node.value.id)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in _MUTATORS
            and isinstance(node.func.value, ast.Name)
        ):
            out.add(node.func.value.id)
    return out


def _module_caches(tree: ast.Module) -> list[str]:
    """Module-level names bound to a mutable container that starts empty or that the module changes."""
    changed = _mutated(tree)
    found = []
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        if not _container(value):
            continue
        names = [t.id for t in targets if isinstance(t, ast.Name) and t.id != "__all__"]
        found += [n for n in names if _empty(value) or n in changed]
    return found


def test_every_module_level_cache_is_a_bounded() -> None:
    # planner/bounded.py is the one policy of the in-memory caches (at most n entries, the
    # least recently used dropped first): a module-level dict, list or set that the module
    # fills grows for as long as the process lives. A constant table (filled where it is
    # written, never changed) is not one; the few that are not caches are NOT_CACHES.
    found = {
        f"{p.relative_to(ROOT).as_posix()}:{name}"
        for p in _sources()
        for name in _module_caches(ast.parse(p.read_text(encoding="utf-8")))
    }
    assert found - NOT_CACHES == set(), (
        f"make each a planner.bounded.Bounded (a size, and why): {sorted(found - NOT_CACHES)}"
    )
    assert NOT_CACHES - found == set(), f"no longer there, drop from NOT_CACHES: {sorted(NOT_CACHES - found)}"


def test_the_cache_check_finds_one() -> None:
    tree = ast.parse(
        "A = {}\nB: dict[int, int] = dict()\nC = {'x': 1}\nD = {'y': 2}\nD['z'] = 3\nE = Bounded(4)\n"
        "F = [1, 2]\ndef f():\n    F.append(3)\nG = defaultdict(list)\nH = (1, 2)\n"
    )
    assert _module_caches(tree) == ["A", "B", "D", "F", "G"]


# -- what the runtime gives planner to open a source is one value ------------------------------


def _callable_type(hint: object) -> bool:
    """Whether ``hint`` is, or holds (a union, an alias), a callable type: ``Callable[...]`` or a callable protocol."""
    if hint is collections.abc.Callable or typing.get_origin(hint) is collections.abc.Callable:
        return True
    if isinstance(hint, type) and getattr(hint, "_is_protocol", False) and "__call__" in vars(hint):
        return True
    return any(_callable_type(a) for a in typing.get_args(hint) if not isinstance(a, list))


def _callable_parameters(fn: Callable[..., object], names: dict[str, object] | None = None) -> list[str]:
    """The parameters of ``fn`` annotated with a callable type (through aliases and unions; ``names``: local ones)."""
    hints = typing.get_type_hints(fn, localns=names)
    return [n for n in inspect.signature(fn).parameters if _callable_type(hints.get(n))]


def test_open_index_takes_its_passes_in_one_value() -> None:
    # planner.api.open_index takes what the runtime gives it to open a source (the selection
    # pass, the count, a text source's index) as one Opening, never as a callback each:
    # plitzer builds that value in one place, plitzer.sources.opening.
    from planner.api import Opening, open_index

    assert _callable_parameters(open_index) == []
    hints = typing.get_type_hints(open_index)
    assert [n for n, h in hints.items() if Opening in typing.get_args(h) or h is Opening] == ["opening"]
    built = [
        f"{p.relative_to(ROOT).as_posix()}:{node.lineno}"
        for p in (ROOT / "plitzer").rglob("*.py")
        if p != ROOT / "plitzer" / "sources" / "__init__.py"
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
        if isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute))
        if (node.func.id if isinstance(node.func, ast.Name) else node.func.attr) == "Opening"
    ]
    assert built == [], f"ask plitzer.sources.opening() instead of building an Opening: {built}"


def test_the_callable_parameter_check_finds_them() -> None:
    from planner.catalog.footer import ChunkCounter
    from planner.mixing.sources import Opening

    def f(a: int, b: Callable[[int], int] | None, c: ChunkCounter | None, d: Opening, e: list[int]) -> None: ...

    assert _callable_parameters(f, {"ChunkCounter": ChunkCounter, "Opening": Opening}) == ["b", "c"]


# -- "index" names one thing a word (docs/glossary.md, "What "index" names") -----------------

INDEX_MISNOMERS = re.compile(
    r"\bvalue index(es)?\b|\bsource index(es)?\b|\bind(ex|ices|exes) into\b|\bjob's index\b", re.I
)
"""Phrases that say "index" for another thing: a position (value position, a position into an
array), a source's row-group index, the row-group index a job's ranks count together."""


def _index_misnomers(text: str) -> list[int]:
    return [n for n, line in enumerate(text.splitlines(), 1) if INDEX_MISNOMERS.search(line)]


def test_index_names_one_thing_a_word() -> None:
    found = {
        f"{p.relative_to(ROOT).as_posix()}:{n}"
        for p in _sources()
        for n in _index_misnomers(p.read_text(encoding="utf-8"))
    }
    assert found == set(), f"say position, row-group index or row groups (docs/glossary.md): {sorted(found)}"


def test_the_index_misnomer_check_finds_them() -> None:
    text = (
        "a value index\nthe source index of\nindexes into the order\nsource_index\nthe job's index\nrow-group index\n"
    )
    assert _index_misnomers(text) == [1, 2, 3, 5]
