"""pytest's set-up for the whole checkout: the trainers' adapters are collected only where their trainer is.

``--doctest-modules`` imports every module of plitzer; ``plitzer.integrations.torchtitan``,
``.olmo_core`` and ``.litgpt`` import their trainer at the top, which the checkout's venv
does not install (.ci/run tests them in a venv of their own: tests/trainers/).
"""

from __future__ import annotations

import importlib.util

collect_ignore = [
    f"plitzer/integrations/{module}.py"
    for module in ("torchtitan", "olmo_core", "litgpt")
    if importlib.util.find_spec(module) is None
]
