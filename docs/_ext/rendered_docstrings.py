"""A griffe extension for the documentation site: docstrings that are rendered at import.

The entry points' parameter sections are written once, in ``planner.parameters``, and put
into each docstring by ``planner.parameters.document`` when the module is imported (the
docstring's source holds a ``<settings>`` line). The site reads the source statically, so
for those objects it takes the docstring from the imported object instead.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

import griffe

MARKER = "<settings>"


class RenderedDocstrings(griffe.Extension):
    """Replace a docstring holding the marker by the imported object's (rendered) docstring."""

    def on_instance(self, *, node: Any, obj: griffe.Object, agent: Any, **kwargs: Any) -> None:
        if obj.docstring is None or MARKER not in obj.docstring.value:
            return
        target: Any = importlib.import_module(obj.module.path)
        for part in obj.path.removeprefix(obj.module.path + ".").split("."):
            target = getattr(target, part)
        obj.docstring.value = inspect.cleandoc(target.__doc__ or "")
