"""pytest plugin for .ci/run's suites without torch (Python 3.12 and 3.13).

A test that imports torch (or torchdata) inside its body skips when torch is not
installed, as the modules that need torch throughout do with ``pytest.importorskip``.
Any other error still fails. Loaded with ``-p notorch`` only where torch is absent.
"""

from __future__ import annotations

from collections.abc import Generator

import pytest


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    try:
        return (yield)
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] in ("torch", "torchdata"):
            pytest.skip(f"needs {e.name}, which this run does not install")
        raise
