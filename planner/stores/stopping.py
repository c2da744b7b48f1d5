"""Stopping a storage's requests: a wait is never longer than its owner's life.

The pause between attempts is a wait on an event, not a sleep (docs/reliability.md,
"Stopping during an outage"). A thread that reads for a scanner runs its requests
inside :func:`stop_on` (the scanner's event, set by ``close()``), and
:func:`stop_every_request` (run as the interpreter ends) sets every such event and a
global one; a request whose event is set makes no further attempt and raises
:class:`~planner.errors.StoppedError` at once. An attempt in flight stops too, whatever
the store does (a store that accepts and never answers included): an attempt on an
event loop (S3, GCS, Azure) runs through :func:`on_loop`, which cancels its task, and a
blocking socket read (HTTP) runs inside :func:`interruptible`, whose socket :func:`stop`
shuts down. The deadline of a run that goes on is untouched.

The retry loop (:mod:`planner.stores.retry`) waits between attempts with :func:`pause`
and asks :func:`stop_event` before each attempt.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from planner.errors import StoppedError

__all__ = ["STOPPED", "interruptible", "on_loop", "pause", "stop", "stop_event", "stop_every_request", "stop_on"]


STOPPED = "its loader was closed, or the interpreter is ending"
"""Why a stopped request ends (the end of its StoppedError's message)."""


class _Stops:
    """The events that end waiting requests: one per :func:`stop_on` block, and the process's."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.active: set[threading.Event] = set()
        self.everything = threading.Event()  # set as the interpreter ends
        self.local = threading.local()
        self.sockets: dict[socket.socket, threading.Event] = {}  # in a blocking read: its thread's event


_STOPS = _Stops()


@contextlib.contextmanager
def stop_on(event: threading.Event) -> Iterator[None]:
    """Inside the block, this thread's requests stop waiting (StoppedError) once ``event`` is set.

    >>> from planner.stores.retry import Retrier, Transient
    >>> ev = threading.Event()
    >>> r = Retrier(attempts=None, backoff=10.0, concurrency=1, transient=lambda e: True,
    ...             throttled=lambda e: False, hint="", patience=60.0)
    >>> def away():
    ...     ev.set()  # closed while the attempt is in flight: no pause, no further attempt
    ...     raise Transient("connection refused")
    >>> with stop_on(ev):  # doctest: +ELLIPSIS
    ...     r.run("reading x", away)
    Traceback (most recent call last):
    planner.errors.StoppedError: reading x: stopped during a request to the store (connection refused): its loader ...
    """
    s = _STOPS
    outer = getattr(s.local, "event", None)
    with s.lock:
        s.active.add(event)
        if s.everything.is_set():
            event.set()
    s.local.event = event
    try:
        yield
    finally:
        s.local.event = outer
        with s.lock:
            s.active.discard(event)


def stop(event: threading.Event) -> None:
    """Set ``event``: the requests of the threads inside ``stop_on(event)`` stop, in flight too.

    Their pauses end, and the sockets they block on (:func:`interruptible`) are shut down,
    so a read from a store that never answers ends now rather than at its read timeout.
    """
    s = _STOPS
    with s.lock:
        event.set()
        socks = [k for k, ev in s.sockets.items() if ev is event]
    for sock in socks:
        _shut(sock)


def stop_every_request() -> None:
    """End every wait between attempts and every blocking read, now and from now on: the interpreter is ending."""
    s = _STOPS
    with s.lock:
        s.everything.set()
        for ev in s.active:
            ev.set()
        socks = list(s.sockets)
    for sock in socks:
        _shut(sock)


def _shut(sock: socket.socket) -> None:
    # shutdown, not close: it wakes a recv (or poll) blocked in another thread, which close does not on Linux.
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


@contextlib.contextmanager
def interruptible(sock: socket.socket | None) -> Iterator[None]:
    """Inside the block, stopping this thread's requests shuts ``sock`` down (its blocking read fails at once)."""
    if sock is None:
        yield
        return
    s = _STOPS
    ev = stop_event()
    with s.lock:
        s.sockets[sock] = ev
        stopped = ev.is_set()
    if stopped:
        _shut(sock)
    try:
        yield
    finally:
        with s.lock:
            s.sockets.pop(sock, None)


def on_loop(loop: asyncio.AbstractEventLoop, make: Callable[..., Any], *args: Any) -> Any:
    """``await make(*args)`` on ``loop`` (another thread's), from this thread; stoppable in flight.

    fsspec's ``sync`` waits for the coroutine whatever happens; this waits in slices of
    0.1 s, and once this thread's requests are stopped it cancels the task (aiohttp then
    closes its connection) and raises :class:`~planner.errors.StoppedError`.
    """
    fut = asyncio.run_coroutine_threadsafe(make(*args), loop)
    stop_ev = stop_event()
    try:
        while True:
            try:
                return fut.result(timeout=0.1)
            except concurrent.futures.TimeoutError:
                if stop_ev.is_set():
                    msg = f"stopped during a request to the store: {STOPPED}"
                    raise StoppedError(msg) from None
    finally:
        fut.cancel()  # a no-op once done; else (stopped, Ctrl-C) the task ends on the loop


def stop_event() -> threading.Event:
    """The event that stops this thread's requests: its :func:`stop_on` block's, else the process's."""
    got = getattr(_STOPS.local, "event", None)
    return got if got is not None else _STOPS.everything


def pause(seconds: float) -> None:
    """Wait ``seconds`` between attempts, or less when this thread's requests are stopped.

    The main thread waits in slices: a signal (Ctrl-C) that the kernel hands to another
    thread does not wake a wait, so a listing waiting for the store in the main thread
    would otherwise take its KeyboardInterrupt only at the end of the pause.
    """
    stop = stop_event()
    if threading.current_thread() is not threading.main_thread():
        stop.wait(seconds)
        return
    end = time.monotonic() + seconds
    while not stop.is_set() and (left := end - time.monotonic()) > 0:
        stop.wait(min(left, 0.1))
