"""Clean shutdown: every live reader pool is stopped and joined before the interpreter ends.

A run can end without anyone calling ``close()``: the script ends, raises, calls
``sys.exit``, or gets Ctrl-C. The reader threads must then be stopped while the
interpreter still works, because a native thread that touches Python once the
interpreter has begun finalizing is killed by ``pthread_exit`` inside C++ frames,
and the process aborts with ``terminate called without an active exception``
(SIGABRT; docs/reliability.md, "How a run ends"). Two things keep that from
happening:

* no Arrow thread ever runs Python code: decoding reads the column chunk in the
  reader thread that asked for it (``plitzer.readpath.read.decode_column``: ``pre_buffer``
  would hand the read, and the last reference to the Python file object, to
  Arrow's I/O pool, which nothing joins);
* the reader threads, which are Python threads, are stopped and joined by
  :func:`close_all` at the first step of interpreter shutdown, from
  ``threading``'s exit hooks: before ``concurrent.futures`` drains the work queued
  in the pools (every window read ahead, which made an interrupted run finish
  its prefetch before exiting) and before ``atexit`` and finalization.

Objects register themselves with :func:`register` (the read pool does, at
construction); the registry holds them weakly, so a loader that is dropped is
still collected (its finalizer closes it). ``close()`` must be idempotent and may
be called from any thread.

Written by hand because no library does it: the standard library's own hook (the
one ``concurrent.futures`` uses) joins a pool only after running all its queued
work, and pyarrow and Polars expose no shutdown of their thread pools.
"""

from __future__ import annotations

import concurrent.futures.thread  # noqa: F401  (its exit hook must be registered before ours)
import contextlib
import os
import threading
import weakref
from typing import Protocol

from planner.stores.stopping import stop_every_request

__all__ = ["Closable", "close_all", "live", "register"]


class Closable(Protocol):
    def close(self) -> None: ...


class _Registry:
    """The live objects, and whether the exit hook is installed."""

    def __init__(self) -> None:
        self.live: weakref.WeakSet[Closable] = weakref.WeakSet()
        self.lock = threading.Lock()
        self.hooked = False


_REGISTRY = _Registry()


def register(obj: Closable) -> None:
    """Close ``obj`` at interpreter shutdown if it is still alive then."""
    r = _REGISTRY
    with r.lock:
        r.live.add(obj)
        if not r.hooked:
            _install()
            r.hooked = True


def live() -> list[Closable]:
    """The registered objects still alive (closed or not)."""
    r = _REGISTRY
    with r.lock:
        return list(r.live)


def close_all() -> None:
    """Close every registered object still alive; never raises.

    A second Ctrl-C while the threads are being joined must not leave them running
    into finalization, so a KeyboardInterrupt here is held and the closing goes on.
    """
    for obj in live():
        while True:
            try:
                with contextlib.suppress(Exception):  # shutting down: nothing can be reported
                    obj.close()
            except KeyboardInterrupt:
                continue  # the join was interrupted: close again (close() is idempotent)
            break


def _at_exit() -> None:
    """The interpreter ends: every request waiting for a store gives up (a footer fetch
    or listing in a pool of its own too), then every live object is closed and joined."""
    stop_every_request()
    close_all()


def _install() -> None:
    # threading._register_atexit is what concurrent.futures uses: its hooks run at
    # the start of threading._shutdown, in reverse order of registration, so ours
    # (registered after concurrent.futures.thread's, imported above) runs first,
    # while the interpreter is whole. Where it is missing (another Python), atexit
    # still runs before finalization, after the pools have drained.
    hook = getattr(threading, "_register_atexit", None)
    if hook is not None:
        try:
            hook(_at_exit)
        except RuntimeError:  # the interpreter is already shutting down
            pass
        else:
            return
    import atexit

    atexit.register(_at_exit)


def _after_fork() -> None:
    # The child has none of the parent's threads; its copies of the objects refuse
    # use (Loader._check_fork) and must not be joined at its exit.
    r = _REGISTRY
    r.live = weakref.WeakSet()
    r.lock = threading.Lock()  # another thread may have held it at the fork


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)
