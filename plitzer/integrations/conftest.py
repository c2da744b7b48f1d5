"""pytest (``--doctest-modules``): the trainers' adapters are not imported for doctests (they have none).

``plitzer.integrations.torchtitan``, ``.olmo_core`` and ``.litgpt`` import their trainer at the
top: the checkout's venv installs none of them, and where they are installed their imports
warn (deprecations, optional extras), which the suite's ``filterwarnings = error`` would fail.
tests/trainers/ runs each with its trainer (.ci/run, in a venv of its own).
"""

from __future__ import annotations

collect_ignore = ["torchtitan.py", "olmo_core.py", "litgpt.py"]
