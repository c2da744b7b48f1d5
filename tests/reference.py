"""An independent, deliberately naive implementation of SPEC section 3, for tests.

Pure Python, one document at a time, straight from the text of the spec: no
numpy, no shared code with plitzer, so that agreement means something.
"""

from __future__ import annotations

M = (1 << 64) - 1


def mix(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & M
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M
    return x ^ (x >> 31)


def key(*parts: int) -> int:
    h = 0
    for p in parts:
        h = mix(h ^ (p & M))
    return h


def permutation(n: int, k: int) -> list[int]:
    return sorted(range(n), key=lambda i: (mix(k ^ i), i))


def epoch_windows(n_row_groups: int, seed: int, window: int, epoch: int) -> list[list[int]]:
    p = permutation(n_row_groups, key(seed, epoch, 1))
    return [p[i : i + window] for i in range(0, n_row_groups, window)]


def lane_slices(rg_docs: list[list[list[int]]], group: list[int], lanes: int) -> list[list[tuple[int, int]]]:
    """Per lane, its slice as (row group, row) in stream order."""
    docs = [(g, r) for g in group for r in range(len(rg_docs[g]))]
    total = sum(len(rg_docs[g][r]) for g, r in docs)
    cuts = [k * total // lanes for k in range(lanes)]
    out: list[list[tuple[int, int]]] = [[] for _ in range(lanes)]
    s = 0
    for g, r in docs:
        k = max(k for k in range(lanes) if cuts[k] <= s)
        out[k].append((g, r))
        s += len(rg_docs[g][r])
    return out


def lane_streams(
    rg_docs: list[list[list[int]]], seed: int, lanes: int, window: int, epochs: int
) -> list[list[tuple[int, int, int, int, int]]]:
    """Per lane, its token stream as (token, epoch, row group, row, offset) over ``epochs``."""
    streams: list[list[tuple[int, int, int, int, int]]] = [[] for _ in range(lanes)]
    for e in range(epochs):
        for w, group in enumerate(epoch_windows(len(rg_docs), seed, window, e)):
            for k, sl in enumerate(lane_slices(rg_docs, group, lanes)):
                for i in permutation(len(sl), key(seed, e, w, k, 2)):
                    g, r = sl[i]
                    for o, t in enumerate(rg_docs[g][r]):
                        streams[k].append((t, e, g, r, o))
    return streams
