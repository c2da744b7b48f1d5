"""An independent, deliberately naive statement of SPEC section 18's deal, for tests.

Pure Python, straight from the text of the spec: a row's cost from its segments, then the
rows by cost and each one scanned against every rank (then every microbatch). No numpy and
no code shared with plitzer or planner, so that agreement means something.
"""

from __future__ import annotations


def cost_of_row(segments: list[int]) -> int:
    """Rule 1: the sum of n * n over a row's segments."""
    return sum(n * n for n in segments)


def _greedy(rows: list[int], costs: list[int], bins: int, room: int) -> dict[int, int]:
    load = [0] * bins
    held = [0] * bins
    out: dict[int, int] = {}
    for k in rows:
        best = None
        for b in range(bins):
            if held[b] >= room:
                continue
            if best is None or load[b] < load[best]:
                best = b
        assert best is not None
        out[k] = best
        load[best] += costs[k]
        held[best] += 1
    return out


def deal(costs: list[int], world: int, microbatches: int = 1) -> list[list[list[int]]]:
    """Rule 2: per rank, its microbatches, each a list of lanes in lane order."""
    b = len(costs)
    per_rank = b // world
    by_cost = sorted(range(b), key=lambda k: (-costs[k], k))
    rank = _greedy(by_cost, costs, world, per_rank)
    out = []
    for r in range(world):
        mine = [k for k in by_cost if rank[k] == r]
        micro = _greedy(mine, costs, microbatches, per_rank // microbatches)
        out.append([sorted(k for k in mine if micro[k] == m) for m in range(microbatches)])
    return out
