"""A pass's pieces as Ray tasks: the one loop that submits them, waits, and hands results back.

Every ``--engine ray`` pass runs through :func:`run_tasks`: the selection pass
(``plitzer.selection.select``), deduplication's keys (``plitzer.selection.keying``),
best-fit's bins (``plitzer.bestfit.counts``) and ``plitzer tokenize``
(``plitzer.text.tokenize``). Each task reads its piece where it runs and returns a
small value; this process receives the values as tasks finish (in the order they
finish) and writes them into its cache, so a pass that follows on this machine, or a
job whose ranks share the cache folder, finds the work done.

Ray is imported here, inside the function: plitzer does not need it otherwise
(``pip install 'plitzer[ray]'``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

__all__ = ["run_tasks"]

R = TypeVar("R")


def run_tasks(
    fn: Callable[..., R],
    calls: Sequence[tuple[Any, ...]],
    got: Callable[[R], None],
    *,
    address: str | None = None,
    progress: bool | None = True,
    desc: str = "ray",
) -> int:
    """Run ``fn(*call)`` as one Ray task a call; ``got(result)`` here as each ends; returns the tasks run.

    Ray is started (``ray.init(address=address)``) unless it already runs; nothing is
    started when ``calls`` is empty. A task's error is raised here, as ``ray.get``
    raises it. ``progress``: a bar of tasks finished (``planner.progress`` decides
    whether it shows), ``desc`` its label.
    """
    if not calls:
        return 0
    import ray
    from tqdm import tqdm

    from planner.progress import progress_enabled

    if not ray.is_initialized():
        ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
    task = ray.remote(fn)
    refs = [task.remote(*call) for call in calls]
    hide = not progress_enabled(progress, len(refs))
    with tqdm(total=len(refs), desc=desc, unit="chunk", disable=hide, leave=False) as bar:
        while refs:
            ready, refs = ray.wait(refs, num_returns=1)
            got(ray.get(ready[0]))
            bar.update(1)
    return len(calls)
