"""``plitzer.plan``: :func:`planner.plan` with the runtime's passes given explicitly.

planner reads metadata only, so the passes that read data (the ``where=`` selection,
``dedupe=`` and ``exclude=``) are plitzer's, and are passed to planner, never looked up:
``plitzer.plan(...)`` is ``planner.plan(..., selector=plitzer.selector, deduper=plitzer.deduper)``.
"""

from __future__ import annotations

import functools
from typing import Any

import planner
from planner.order.plan import Plan
from plitzer.selection.dedupe import dedupe_index
from plitzer.selection.select import select_spec

__all__ = ["plan"]


@functools.wraps(planner.plan)
def plan(*args: Any, **kwargs: Any) -> Plan:
    kwargs.setdefault("selector", select_spec)
    kwargs.setdefault("deduper", dedupe_index)
    return planner.plan(*args, **kwargs)
