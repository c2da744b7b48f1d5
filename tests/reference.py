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


def cuts(total: int, lanes: int, z: int) -> list[int]:
    """c_0..c_B of a window of ``total`` tokens whose run offset mod B is ``z`` (rule 4)."""
    q, r = divmod(total, lanes)
    out = [0]
    for k in range(lanes):
        out.append(out[-1] + q + (1 if (k - z) % lanes < r else 0))
    return out


def lane_slices(
    rg_docs: list[list[list[int]]], group: list[int], lanes: int, z: int
) -> list[list[tuple[int, int, int, int]]]:
    """Per lane, its slice as pieces (row group, row, offset in the document, length), in stream order."""
    docs = [(g, r) for g in group for r in range(len(rg_docs[g]))]
    total = sum(len(rg_docs[g][r]) for g, r in docs)
    c = cuts(total, lanes, z)
    out: list[list[tuple[int, int, int, int]]] = [[] for _ in range(lanes)]
    s = 0
    for g, r in docs:
        n = len(rg_docs[g][r])
        if n == 0:
            k = max(k for k in range(lanes) if c[k] <= s)
            out[k].append((g, r, 0, 0))
        for k in range(lanes):
            lo, hi = max(s, c[k]), min(s + n, c[k + 1])
            if lo < hi:
                out[k].append((g, r, lo - s, hi - lo))
        s += n
    return out


def lane_streams(
    rg_docs: list[list[list[int]]], seed: int, lanes: int, window: int, epochs: int
) -> list[list[tuple[int, int, int, int, int]]]:
    """Per lane, its token stream as (token, epoch, row group, row, offset) over ``epochs``."""
    streams: list[list[tuple[int, int, int, int, int]]] = [[] for _ in range(lanes)]
    run = 0  # tokens of the run before the window
    for e in range(epochs):
        for w, group in enumerate(epoch_windows(len(rg_docs), seed, window, e)):
            for k, sl in enumerate(lane_slices(rg_docs, group, lanes, run % lanes)):
                for i in permutation(len(sl), key(seed, e, w, k, 2)):
                    g, r, o, n = sl[i]
                    for x in range(o, o + n):
                        streams[k].append((rg_docs[g][r][x], e, g, r, x))
            run += sum(len(d) for g in group for d in rg_docs[g])
    return streams
