"""The loader's byte budget: what each unit is charged, what is held, the peak and the overruns.

SPEC section 4: ``budget`` caps the bytes of decoded token data held (prefetched and
queued). A unit is charged its estimate when its reads start (:meth:`Budget.charge`),
what it really holds once packed (:meth:`Budget.settle`), and nothing once released
(:meth:`Budget.release`), unless a batch view of its tokens is still alive: then it stays
charged, as the caller's, until the view's memory is gone (:meth:`Budget.free`, run by a
finalizer on any thread). :class:`plitzer.readpath.schedule.Schedule` decides what to start,
:class:`plitzer.readpath.scan.ReadPool` settles and frees what its units hold; this class only counts.

Not thread-safe on its own: every method runs under the read pool's lock (an RLock, since
a finalizer can run inside a locked section).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Budget", "Charge"]


@dataclass(eq=False, slots=True)
class Charge:
    """A unit's bytes against the budget. Kept apart from the unit: a finalizer holds it."""

    nbytes: int
    tracked: bool = False  # uncharged by the finalizer of the unit's token memory
    released: bool = False  # the schedule let go of the unit while views were alive
    freed: bool = False


class Budget:
    """Bytes charged against ``limit``: held now, held only by the caller's views, the peak, the overruns.

    ``overruns`` counts units started past the limit by the loader's own units (the tests
    assert it never happens once the budget holds two windows: :func:`plitzer.readpath.cost.budget_floor`),
    ``caller_overruns`` those started past it only because the caller still holds batch
    views of released units.
    """

    __slots__ = ("caller", "caller_overruns", "held", "limit", "overruns", "peak")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self.caller = 0
        self.peak = 0
        self.overruns = 0
        self.caller_overruns = 0

    def fits(self, nbytes: int) -> bool:
        """Whether a unit of ``nbytes`` can start now without passing the limit."""
        return self.held + nbytes <= self.limit

    def charge(self, nbytes: int) -> Charge:
        """A unit's reads start: charge its estimate (a unit a step needs starts even past the limit: counted)."""
        if self.held + nbytes > self.limit:
            if self.held - self.caller + nbytes > self.limit:
                self.overruns += 1
            else:
                self.caller_overruns += 1
        self._add(nbytes)
        return Charge(nbytes)

    def settle(self, c: Charge, nbytes: int) -> None:
        """The unit is packed: it holds ``nbytes`` now, not its estimate."""
        self._add(nbytes - c.nbytes)
        c.nbytes = nbytes

    def release(self, c: Charge) -> None:
        """The schedule lets go of the unit: uncharge it, unless views of its tokens keep it charged."""
        if c.tracked and not c.freed:
            c.released = True  # charged until its finalizer runs
            self.caller += c.nbytes
        elif not c.tracked:
            self.held -= c.nbytes
            c.nbytes = 0

    def free(self, c: Charge) -> None:
        """The last view of a unit's tokens is gone (any thread, under the read pool's lock)."""
        self.held -= c.nbytes
        if c.released:
            self.caller -= c.nbytes
        c.freed = True
        c.nbytes = 0

    def _add(self, nbytes: int) -> None:
        self.held += nbytes
        self.peak = max(self.peak, self.held)
