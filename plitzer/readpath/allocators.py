"""Allocator settings for recycled window buffers, applied when plitzer is imported.

The loader decodes and packs a window (hundreds of MiB on real data) and frees the
one before it, over and over. With their defaults, Polars' jemalloc (which holds
the packed copies) and pyarrow's mimalloc (the decoded row groups) give freed pages
back to the kernel within milliseconds, so every window's buffers are
page-faulted afresh. On 200 M tokens of real text (``benchmarks/throughput.py``
and the baseline harness) that cost 3.8 ns/token of kernel time, a sixth of the
loader's CPU; keeping freed pages for a few seconds, so that the next window
reuses them, brought it to 1.0 ns/token (docs/design.md, "Page faults").

Both allocators read these variables when their library loads, so they are set
here, before plitzer imports Polars or pyarrow, and only as defaults: a value
already in the environment wins, ``PLITZER_ALLOCATOR=default`` leaves both
alone, and a library loaded before plitzer keeps its settings (``applied`` says
which took effect). The cost: up to a few seconds' worth of freed buffers stays
resident, about one window in a loader running flat out.

Written here rather than left to users because no library exposes it: Polars has
no allocator API, and pyarrow's ``jemalloc_set_decay_ms`` covers only its jemalloc
pool, which is not the default one.
"""

from __future__ import annotations

import os
import sys

__all__ = ["DECAY_MS", "applied"]

DECAY_MS = 5000  # longer than a window lasts when the loader runs flat out (under 1 s measured)

_SETTINGS = {
    # Polars' jemalloc is built with the ``_rjem_`` prefix, so it reads _RJEM_MALLOC_CONF.
    "polars": ("_RJEM_MALLOC_CONF", f"dirty_decay_ms:{DECAY_MS},muzzy_decay_ms:{DECAY_MS}"),
    # pyarrow's default memory pool is mimalloc, which reads MIMALLOC_* at load.
    "pyarrow": ("MIMALLOC_PURGE_DELAY", str(DECAY_MS)),
}

applied: dict[str, bool] = {}


def _apply() -> None:
    if os.environ.get("PLITZER_ALLOCATOR", "") == "default":
        applied.update(dict.fromkeys(_SETTINGS, False))
        return
    for module, (name, value) in _SETTINGS.items():
        if module in sys.modules or name in os.environ:
            applied[module] = False
            continue
        os.environ[name] = value
        applied[module] = True


_apply()
