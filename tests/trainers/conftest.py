"""The trainers' workers and configs are run by the tests (in their own processes), never imported by pytest.

They patch torch and the trainers for a CPU run at import (tests/trainers/titan_worker.py).
"""

from __future__ import annotations

collect_ignore_glob = ["*_worker.py", "titan_configs.py"]
