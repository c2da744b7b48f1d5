"""A steering controller's state in a checkpoint: where it is kept, how it is written, how it is checked.

A controller (:class:`plitzer.mixing.Online`, SPEC section 20 item 2) registers with its
loader's :class:`Slot` (``loader.steering``); every state the loader encodes
(``loader.checkpoint()``, ``batch.state_after()``) then carries the controller's state under
the document's ``steering`` key, and a resume hands the checkpoint's back (to a controller
already registered, or kept until one is). A loader without a controller writes no
``steering`` key: its checkpoints are byte for byte what they were before steering existed.

The document (canonical JSON, docs/design.md "Steering a mixture")::

    {"rule": "exp3(alpha=0.9)", "every": 500, "next": 1500,
     "sums": ["0x1.8p+1", ...], "counts": [12, ...], "state": {...}}

``next`` is the first step the controller has not observed; ``sums`` and ``counts`` the
losses observed since its last change (per source, in source-number order); ``state`` the
rule's own. Floats are written as ``float.hex`` strings, so that every float resumes bit for
bit in any language, and a rule's state is built of ints, floats, lists and dicts with string
keys only (:func:`pack`, :func:`unpack`): every string in it is a float.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from planner.errors import CheckpointError, UsageError

__all__ = ["FIELDS", "Controller", "Slot", "check", "pack", "unpack"]

FIELDS = ("counts", "every", "next", "rule", "state", "sums")
"""The keys of a checkpoint's ``steering`` document."""

_MAX_ITEMS = 1 << 16  # numbers in a rule's state: a checkpoint stays small
_MAX_DEPTH = 8


def _fail(why: str) -> CheckpointError:
    return CheckpointError(f"not a valid plitzer checkpoint: steering {why}")


def pack(value: Any) -> Any:
    """A rule's state as the checkpoint writes it: floats as ``float.hex`` strings, tuples as lists."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        msg = f"a steering rule's state is built of ints, floats, lists and dicts; got {value!r}"
        raise TypeError(msg)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value).hex()
    if isinstance(value, Mapping):
        return {str(k): pack(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [pack(v) for v in value]
    msg = f"a steering rule's state is built of ints, floats, lists and dicts; got {type(value).__name__}"
    raise TypeError(msg)


def unpack(value: Any) -> Any:
    """The inverse of :func:`pack`: every string is a float, bit for bit."""
    if isinstance(value, str):
        return float.fromhex(value)
    if isinstance(value, dict):
        return {k: unpack(v) for k, v in value.items()}
    if isinstance(value, list):
        return [unpack(v) for v in value]
    return value


def _count(value: Any, depth: int) -> int:
    """The numbers in a packed state, checked: ints, hex floats, lists, dicts of those."""
    if depth > _MAX_DEPTH:
        msg = f"state is nested deeper than {_MAX_DEPTH}"
        raise _fail(msg)
    if isinstance(value, bool) or not isinstance(value, (int, str, list, dict)):
        msg = f"state holds {value!r}; expected ints, hex floats, lists and dicts"
        raise _fail(msg)
    if isinstance(value, str):
        try:
            float.fromhex(value)
        except ValueError as e:
            msg = f"state holds {value!r}, not a hex float"
            raise _fail(msg) from e
        return 1
    if isinstance(value, int):
        return 1
    items = value.values() if isinstance(value, dict) else value
    return sum(_count(v, depth + 1) for v in items)


def check(doc: object, step: int) -> dict[str, Any]:
    """A checkpoint's ``steering`` document at ``step``, every field type- and range-checked."""
    if not isinstance(doc, dict) or set(doc) != set(FIELDS):
        msg = f"must have exactly {list(FIELDS)}"
        raise _fail(msg)
    if not isinstance(doc["rule"], str) or not doc["rule"]:
        msg = f"rule is {doc['rule']!r}, expected its name"
        raise _fail(msg)
    for k, low in (("every", 1), ("next", 0)):
        v = doc[k]
        if isinstance(v, bool) or not isinstance(v, int) or not low <= v < 2**63:
            msg = f"{k} is {v!r}, expected an integer >= {low}"
            raise _fail(msg)
    if doc["next"] > step:
        msg = (
            f"has observed step {doc['next'] - 1}, past the checkpoint's step {step}: take the "
            "checkpoint after the batch whose losses were observed last"
        )
        raise _fail(msg)
    sums, counts = doc["sums"], doc["counts"]
    if not (isinstance(sums, list) and isinstance(counts, list) and len(sums) == len(counts) >= 1):
        msg = "sums and counts must list one entry per source"
        raise _fail(msg)
    if any(isinstance(c, bool) or not isinstance(c, int) or c < 0 for c in counts):
        msg = f"counts are {counts!r}, expected integers >= 0"
        raise _fail(msg)
    if any(not isinstance(s, str) for s in sums) or _count(sums, 1) != len(sums):
        msg = "sums must be hex floats"
        raise _fail(msg)
    if _count(doc["state"], 0) > _MAX_ITEMS:
        msg = f"state holds more than {_MAX_ITEMS} numbers"
        raise _fail(msg)
    return doc


class Controller(Protocol):
    """What a loader asks of its steering controller: its state, and to take a checkpoint's."""

    def snapshot(self) -> dict[str, Any]:
        """The controller's state as a checkpoint records it (:func:`check` holds it)."""
        ...

    def restore(self, doc: dict[str, Any] | None, step: int) -> None:
        """Continue from ``doc`` (None: the checkpoint had no controller), the loader now at ``step``."""
        ...


class Slot:
    """Where a loader keeps its controller (one at most) and a resumed controller state not yet taken.

    ``state()`` is what the loader's next state records: the registered controller's, else
    the one the last resume brought (nothing was observed since), else None (no
    ``steering`` key).
    """

    __slots__ = ("_controller", "_pending")

    def __init__(self) -> None:
        self._controller: Controller | None = None
        self._pending: dict[str, Any] | None = None

    def register(self, controller: Controller) -> dict[str, Any] | None:
        """Register ``controller``; the resumed state it continues from, if a resume brought one."""
        if self._controller is not None:
            msg = "this loader already has a steering controller: one controller steers a mixture"
            raise UsageError(msg)
        self._controller, pending, self._pending = controller, self._pending, None
        return pending

    def state(self) -> dict[str, Any] | None:
        """The state the loader's next checkpoint records (None: no controller, none resumed)."""
        return self._controller.snapshot() if self._controller is not None else self._pending

    def resumed(self, doc: dict[str, Any] | None, step: int) -> None:
        """A resume to ``step`` brought ``doc`` (None: the checkpoint has none): hand it over, or keep it."""
        if self._controller is not None:
            self._controller.restore(doc, step)
        else:
            self._pending = doc
