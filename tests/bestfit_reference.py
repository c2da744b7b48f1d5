"""An independent, deliberately naive implementation of SPEC section 15 (best-fit packing), for tests.

Pure Python, straight from the text of the spec: items one document at a time, bins by
scanning every open bin for each item, lanes as lists. No numpy and no code shared with
plitzer or planner (the hash is tests/reference.py's), so that agreement means something.
"""

from __future__ import annotations

from tests.reference import cuts, epoch_windows, key, permutation

Item = tuple[int, int, int, int]  # row group, row, offset in the document, length
Bin = list[Item]


def items_of(docs: list[list[int]], g: int, seq_len: int) -> list[Item]:
    """Rule 1: a row group's items in storage order (a long document every L tokens, an empty one of length 0)."""
    out: list[Item] = []
    for r, d in enumerate(docs):
        if not d:
            out.append((g, r, 0, 0))
        out.extend((g, r, o, min(seq_len, len(d) - o)) for o in range(0, len(d), seq_len))
    return out


def bins_of(docs: list[list[int]], g: int, seq_len: int) -> list[Bin]:
    """Rule 2: best-fit decreasing; each bin's items in storage order."""
    items = items_of(docs, g, seq_len)
    fill: list[int] = []
    content: list[list[int]] = []
    for i in sorted(range(len(items)), key=lambda i: (-items[i][3], i)):
        n = items[i][3]
        fits = [b for b in range(len(fill)) if seq_len - fill[b] >= n]
        if fits:
            b = min(fits, key=lambda b: (seq_len - fill[b], b))
        else:
            b = len(fill)
            fill.append(0)
            content.append([])
        fill[b] += n
        content[b].append(i)
    return [[items[i] for i in sorted(c)] for c in content]


def lane_rows(
    rg_docs: list[list[list[int]]], seed: int, lanes: int, window: int, seq_len: int, epochs: int
) -> list[list[tuple[int, Bin]]]:
    """Rules 3-6: per lane, its rows as (epoch, bin) over ``epochs``."""
    binned = [bins_of(docs, g, seq_len) for g, docs in enumerate(rg_docs)]
    out: list[list[tuple[int, Bin]]] = [[] for _ in range(lanes)]
    run = 0  # bins of the run before the window
    for e in range(epochs):
        for w, group in enumerate(epoch_windows(len(rg_docs), seed, window, e)):
            stream = [b for g in group for b in binned[g]]
            c = cuts(len(stream), lanes, run % lanes)
            for k in range(lanes):
                sl = stream[c[k] : c[k + 1]]
                out[k].extend((e, sl[i]) for i in permutation(len(sl), key(seed, e, w, k, 2)))
            run += len(stream)
    return out


def row(rg_docs: list[list[list[int]]], b: Bin, seq_len: int, pad_id: int) -> tuple[list[int], list[bool], list[int]]:
    """Rule 6-7: a bin as a row: its tokens then padding, the mask, and the segments (padding one of its own)."""
    tokens: list[int] = []
    segs: list[int] = []
    for g, r, o, n in b:
        tokens += rg_docs[g][r][o : o + n]
        if n:
            segs.append(n)
    real = len(tokens)
    if real < seq_len:
        segs.append(seq_len - real)
    return tokens + [pad_id] * (seq_len - real), [True] * real + [False] * (seq_len - real), segs
