"""The runtime's passes, where plitzer is loaded: the defaults of planner's two public entry points.

planner reads metadata only; what reads data (the ``where=`` selection, ``dedupe=``, the
count of a row group whose footer has no statistics) is plitzer's, and everything inside
planner takes it as an argument, which plitzer's entry points pass. ``planner.plan`` and
``planner.index`` are public functions that SPEC sections 2 and 6 make work as plitzer's
(``plitzer.plan`` is ``planner.plan``), so where a caller gives no pass, their default is
plitzer's, found in ``sys.modules`` where plitzer is loaded already: nothing imported,
nothing registered, and a process without plitzer gets the error that says what to pass.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["runtime_pass"]

COUNT = ("plitzer.readpath.read", "count_chunk")
SELECT = ("plitzer.selection.select", "select_spec")
DEDUPE = ("plitzer.selection.dedupe", "dedupe_index")


def runtime_pass(given: Any, where: tuple[str, str]) -> Any:
    """``given``, else plitzer's pass ``where`` (module, name) where plitzer is loaded, else None."""
    if given is not None:
        return given
    found = getattr(sys.modules.get(where[0]), where[1], None)
    return found if callable(found) else None
