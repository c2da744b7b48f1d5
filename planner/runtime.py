"""The runtime's passes: the defaults of planner's public entry points, as installed.

planner reads metadata only; what reads data (the ``where=`` selection, ``dedupe=``, best-fit's
bins, the count of a row group whose footer has no statistics, the document lengths of
``plan.pieces``, the index of a source of token files planner does not read: Arrow IPC, Megatron,
numpy) is plitzer's, and so is the check of ``columns=`` against the sources (the rules of aligned
columns are the runtime's); everything inside planner takes it as an argument, which plitzer's entry
points pass. ``planner.plan`` and ``planner.index`` are public functions that SPEC sections 2 and 6
make work as plitzer's (``plitzer.plan`` is ``planner.plan``), so where a caller gives no pass,
their default is the one installed under the entry-point group ``planner.passes`` (pyproject.toml:
plitzer's). What a call does depends on what is installed, never on what this process happened to
import: no registry, no module look-up; a pass that is not installed gets the error that says what
to pass."""

from __future__ import annotations

from functools import cache
from typing import Any

__all__ = ["BINS", "COLUMNS", "COUNT", "DEDUPE", "FILES", "GROUP", "LENGTHS", "SELECT", "runtime_pass"]

GROUP = "planner.passes"
COUNT = "count"
SELECT = "select"
DEDUPE = "dedupe"
LENGTHS = "lengths"
BINS = "bins"
COLUMNS = "columns"
FILES = "files"


def runtime_pass(given: Any, name: str) -> Any:
    """``given``, else the pass installed as ``name`` in :data:`GROUP` (loaded once), else None."""
    if given is not None:
        return given
    return _installed(name)


@cache
def _installed(name: str) -> Any:
    from importlib.metadata import entry_points

    for ep in entry_points(group=GROUP, name=name):
        found = ep.load()
        if callable(found):
            return found
    return None
