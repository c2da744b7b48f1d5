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


# -- mixtures (SPEC section 8, planner.mixing.mixture) ---------------------------------------


def source_key(name: str) -> int:
    import hashlib

    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little")


def mixture_windows(
    sources: list[list[int]],
    names: list[str],
    stages: list[tuple[int, list[int]]],
    seed: int,
    lanes: int,
    window: int,
    seq_len: int,
    run_tokens: int,
) -> list[tuple[list[tuple[int, int, int]], int]]:
    """Windows of a mixture's stream until the run passes ``run_tokens``.

    ``sources[s]`` are source s's row groups' token counts; ``stages`` are (start
    step, integer weights). Each window is ([(source, row group, source epoch)], its
    first run token). One item at a time, straight from the text of planner.mixing.mixture.
    """
    n = len(sources)
    consumed = [0] * n
    out: list[tuple[list[tuple[int, int, int]], int]] = []
    run = 0
    stage = 0
    while run <= run_tokens:
        weights = stages[stage][1]
        end = stages[stage + 1][0] * lanes * seq_len if stage + 1 < len(stages) else None
        total = sum(weights)
        items = []
        for s in range(n):
            if weights[s] == 0:
                continue
            g = len(sources[s])
            c = 0
            for j in range(consumed[s], consumed[s] + 3000):
                k = j // g
                rg = permutation(g, key(seed, source_key(names[s]), k, 3))[j % g]
                c += sources[s][rg]
                items.append((c * total // weights[s], s, j, rg, k))
        items.sort()
        pos = 0
        switched = False
        while run <= run_tokens:
            if end is not None and run >= end:
                switched = True
                break
            win = items[pos : pos + window]
            pos += window
            for _, s, _, _, _ in win:
                consumed[s] += 1
            out.append(([(s, rg, k) for _, s, _, rg, k in win], run))
            run += sum(sources[s][rg] for _, s, _, rg, _ in win)
        if switched:
            stage += 1
    return out


def mixture_lane_streams(
    rg_docs: list[list[list[list[int]]]],
    names: list[str],
    stages: list[tuple[int, list[int]]],
    seed: int,
    lanes: int,
    window: int,
    seq_len: int,
    steps: int,
) -> list[list[int]]:
    """Per lane, its tokens over ``steps`` steps of a mixture (``rg_docs[s][g]`` = documents)."""
    tokens = [[sum(len(d) for d in rg) for rg in src] for src in rg_docs]
    # T: the tokens of the sources the first stage weighs (all of them if those hold none).
    total = sum(sum(t) for t, w in zip(tokens, stages[0][1], strict=True) if w) or sum(map(sum, tokens))
    need = (steps + 2) * lanes * seq_len
    wins = mixture_windows(tokens, names, stages, seed, lanes, window, seq_len, need + total)
    flat = [rg for src in rg_docs for rg in src]
    base = [0]
    for src in rg_docs:
        base.append(base[-1] + len(src))
    streams: list[list[int]] = [[] for _ in range(lanes)]
    first_of_epoch: dict[int, int] = {}
    for u, (win, start) in enumerate(wins):
        e = start // total
        first_of_epoch.setdefault(e, u)
        w = u - first_of_epoch[e]
        group = [base[s] + rg for s, rg, _ in win]
        for k, sl in enumerate(lane_slices(flat, group, lanes, start % lanes)):
            for i in permutation(len(sl), key(seed, e, w, k, 2)):
                g, r, o, m = sl[i]
                streams[k].extend(flat[g][r][o : o + m])
        if min(len(x) for x in streams) >= steps * seq_len:
            break
    return streams
