"""Balanced steps (SPEC section 18): a row's attention cost and the deal of a step's rows to ranks.

Under document masking a row's attention work is the sum of ``n * n`` over its segments
(``doc_lengths``: pieces under concat, items under best-fit, a row's padding one segment
of its own); every row holds ``L`` tokens, so the work that is linear in tokens is the
same in every row and is left out. :func:`deal` gives step ``t``'s ``B`` rows (row ``k``
is lane ``k``'s) to ``world`` ranks and each rank's rows to ``microbatches`` microbatches:

1. rows by cost, highest first (ties: lower lane first);
2. each to the rank with the least cost so far among those holding fewer than
   ``B / world`` rows (ties: lower rank);
3. then each rank's rows, the same way, into its microbatches of ``B / (world * M)`` rows
   (ties: lower microbatch);
4. a rank's batch is its microbatches in order, each one's rows in lane order.

The deal is a function of the step's costs, ``world`` and ``microbatches`` alone, so every
rank computes the same deal from the gathered costs, and a resume at another world deals
the same global batch again (docs/design.md, "Balanced steps"). Written here, in planner,
because the runtime (``plitzer.readpath.balance``) and the plan (``Plan.costs``) deal alike.

Worked example (docs/design.md has it at length): costs ``[9, 1, 4, 4]``, world 2, one
microbatch: by cost the rows are 0 (9), 2 (4), 3 (4), 1 (1); row 0 to rank 0, row 2 to rank
1 (least cost), row 3 to rank 1 (4 < 9), row 1 to rank 0 (rank 1 is full): rank 0 holds
lanes ``[0, 1]`` at cost 10, rank 1 ``[2, 3]`` at cost 8.

>>> d = deal([9, 1, 4, 4], world=2)
>>> d.lanes_of(0).tolist(), d.lanes_of(1).tolist(), d.rank_cost.tolist()
([0, 1], [2, 3], [10, 8])
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from planner.arraytypes import I64
from planner.errors import ConfigError

__all__ = ["Deal", "check_microbatches", "deal", "row_costs"]


def row_costs(rows: I64, lengths: I64, n_rows: int) -> I64:
    """Each of ``n_rows`` rows' cost: the sum of its segments' squared lengths.

    ``rows`` and ``lengths``: one entry a segment (the row it is in, its tokens), as a
    batch's pieces give them.

    >>> row_costs(np.array([0, 0, 1]), np.array([3, 1, 4]), 2).tolist()
    [10, 16]
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    return np.bincount(np.asarray(rows, dtype=np.int64), weights=lengths * lengths, minlength=n_rows).astype(np.int64)


def _greedy(costs: I64, order: I64, bins: int, room: int) -> I64:
    """Each of ``order``'s rows given to the least-loaded of ``bins`` bins with room (ties: lower bin).

    Costs are exact integers: the heap's keys are (load, bin), so the tie rule is the heap's order.
    """
    out = np.empty(len(costs), dtype=np.int64)
    # A heap of the bins with room: the least load first, then the lowest bin. Written here (not
    # a library's): no well-kept library deals greedily under a capacity, and it is 20 lines.
    heap = [(0, b) for b in range(bins)]
    held = [0] * bins
    for row in order.tolist():
        load, b = heapq.heappop(heap)
        out[row] = b
        held[b] += 1
        if held[b] < room:
            heapq.heappush(heap, (load + int(costs[row]), b))
    return out


@dataclass(frozen=True, slots=True)
class Deal:
    """Step ``t``'s deal: each lane's rank and microbatch, and each rank's rows in batch order.

    ``rank`` and ``microbatch``: per lane; ``order``: the lanes in delivery order, rank 0's
    rows first (each rank's microbatches in order, rows in lane order within one);
    ``rank_cost`` per rank and ``cost`` per (rank, microbatch).
    """

    rank: I64
    microbatch: I64
    order: I64
    rank_cost: I64
    cost: I64  # (world, microbatches)

    @property
    def world(self) -> int:
        return len(self.rank_cost)

    def lanes_of(self, rank: int) -> I64:
        """The lanes of ``rank``'s batch, in its row order."""
        rows = len(self.order) // self.world
        out: I64 = self.order[rank * rows : (rank + 1) * rows]
        return out


def deal(costs: Sequence[int] | I64, world: int, microbatches: int = 1) -> Deal:
    """Deal a step's rows (``costs[k]``: lane ``k``'s row) to ``world`` ranks and ``microbatches`` each."""
    c = np.asarray(costs, dtype=np.int64)
    b = len(c)
    if world < 1 or b % world:
        msg = f"world={world} must divide the step's {b} rows"
        raise ConfigError(msg)
    per_rank = b // world
    if microbatches < 1 or per_rank % microbatches:
        msg = f"microbatches={microbatches} must divide the {per_rank} rows a rank holds (lanes / world)"
        raise ConfigError(msg)
    by_cost = np.lexsort((np.arange(b), -c))  # highest cost first; ties: lower lane
    rank = _greedy(c, by_cost, world, per_rank)
    micro = np.zeros(b, dtype=np.int64)
    if microbatches > 1:
        room = per_rank // microbatches
        for r in range(world):
            mine = by_cost[rank[by_cost] == r]  # the rank's rows, still by cost
            sub = _greedy(c, mine, microbatches, room)
            micro[mine] = sub[mine]
    # Delivery order: rank, then microbatch, then lane.
    order = np.lexsort((np.arange(b), micro, rank)).astype(np.int64)
    rank_cost = np.bincount(rank, weights=c, minlength=world).astype(np.int64)
    cost = np.bincount(rank * microbatches + micro, weights=c, minlength=world * microbatches).astype(np.int64)
    return Deal(rank, micro, order, rank_cost, cost.reshape(world, microbatches))


def check_microbatches(microbatches: object, lanes: int, world: int, balance: bool, start: int | None = None) -> int:
    """``microbatches`` must divide ``lanes / world``, and needs ``balance``: a ConfigError naming the fix.

    ``start``: the step the layout stage of ``lanes`` starts at, named in the message where given.
    Returns ``microbatches`` as an int.
    """
    if isinstance(microbatches, bool) or not isinstance(microbatches, (int, np.integer)) or microbatches < 1:
        msg = f"microbatches={microbatches!r} must be an integer >= 1 (the microbatches a rank's batch is dealt into)"
        raise ConfigError(msg)
    if microbatches > 1 and not balance:
        msg = (
            f"microbatches={microbatches} deals a rank's rows by cost and needs balance=True "
            "(without it a rank's rows are its own lanes in order): pass balance=True, or microbatches=1"
        )
        raise ConfigError(msg)
    per_rank = lanes // world
    if per_rank % microbatches:
        ok = [m for m in range(1, per_rank + 1) if per_rank % m == 0]
        msg = (
            f"microbatches={microbatches} must divide the {per_rank} rows a rank holds "
            f"(lanes={lanes} / world={world}{'' if start is None else f', from step {start}'}); use one of {ok}"
        )
        raise ConfigError(msg)
    return int(microbatches)
