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


def staged_rows(
    rg_docs: list[list[list[int]]], seed: int, window: int, seq_len: int, lanes: tuple[int, int], at: int, epochs: int
) -> list[list[tuple[int, Bin]]]:
    """Rule 9 (a lanes change at step ``at``, L unchanged): per step, every lane's (epoch, bin).

    Before ``at`` the run is :func:`lane_rows`'s with ``lanes[0]``; the rest of the window
    begun (each old lane's unconsumed bins, lane 0's first) is cut into ``lanes[1]`` with
    ``z = at * lanes[0] mod lanes[1]`` and no shuffle; later windows are cut into ``lanes[1]``
    as usual, ``z`` counting the run's bins before them.
    """
    b0, b1 = lanes
    binned = [bins_of(docs, g, seq_len) for g, docs in enumerate(rg_docs)]
    windows = [
        (e, w, [b for g in group for b in binned[g]])
        for e in range(epochs)
        for w, group in enumerate(epoch_windows(len(rg_docs), seed, window, e))
    ]
    x = at * b0
    old: list[list[tuple[int, Bin]]] = [[] for _ in range(b0)]
    run = 0
    i = 0
    while i < len(windows) and run < x:
        e, w, stream = windows[i]
        c = cuts(len(stream), b0, run % b0)
        for k in range(b0):
            sl = stream[c[k] : c[k + 1]]
            old[k].extend((e, sl[j]) for j in permutation(len(sl), key(seed, e, w, k, 2)))
        run += len(stream)
        i += 1
    rest = [r for k in range(b0) for r in old[k][at:]]
    new: list[list[tuple[int, Bin]]] = [[] for _ in range(b1)]
    c = cuts(len(rest), b1, x % b1)
    for k in range(b1):
        new[k].extend(rest[c[k] : c[k + 1]])
    for e, w, stream in windows[i:]:
        c = cuts(len(stream), b1, run % b1)
        for k in range(b1):
            sl = stream[c[k] : c[k + 1]]
            new[k].extend((e, sl[j]) for j in permutation(len(sl), key(seed, e, w, k, 2)))
        run += len(stream)
    steps = min(len(new[k]) for k in range(b1)) + at
    return [[old[k][t] for k in range(b0)] if t < at else [new[k][t - at] for k in range(b1)] for t in range(steps)]


def mixture_rows(
    rg_docs: list[list[list[list[int]]]],
    names: list[str],
    weights: list[int],
    seed: int,
    lanes: int,
    window: int,
    seq_len: int,
    steps: int,
) -> list[list[tuple[int, Bin]]]:
    """Per lane, its rows (source, bin) over ``steps`` steps of a mixture under best-fit.

    Rule 3 with section 8: the interleave of tests/reference.py over each row group's bins
    (the units; a row one unit), then rules 4-6 over each window's bins.
    """
    from tests.reference import mixture_windows

    binned = [[bins_of(docs, g, seq_len) for g, docs in enumerate(src)] for src in rg_docs]
    counts = [[len(b) for b in src] for src in binned]
    total = sum(map(sum, counts))
    wins = mixture_windows(counts, names, [(0, weights)], seed, lanes, window, 1, (steps + 2) * lanes + total)
    rows: list[list[tuple[int, Bin]]] = [[] for _ in range(lanes)]
    first_of_epoch: dict[int, int] = {}
    for u, (win, start) in enumerate(wins):
        e = start // total
        first_of_epoch.setdefault(e, u)
        w = u - first_of_epoch[e]
        stream = [(s, b) for s, rg, _ in win for b in binned[s][rg]]
        c = cuts(len(stream), lanes, start % lanes)
        for k in range(lanes):
            sl = stream[c[k] : c[k + 1]]
            rows[k].extend(sl[i] for i in permutation(len(sl), key(seed, e, w, k, 2)))
        if min(len(x) for x in rows) >= steps:
            break
    return rows


def layout_rows(
    rg_docs: list[list[list[int]]], seed: int, window: int, stages: list[tuple[int, int, int]], steps: int
) -> tuple[list[list[Bin]], list[int]]:
    """Rule 9 in general (``seq_len`` changes too): per step, every lane's bin, and each step's epoch label.

    ``stages``: ``(first step, lanes, L)`` from step 0. Windows are dealt to the lanes when a
    lane runs dry, each one's bins at the ``L`` in force. At a change before step ``t`` the
    lanes have consumed ``x`` units: the window holding unit ``x`` strictly inside it gives
    its unconsumed bins (lane 0's first, each lane's in packed order); at another ``L`` their
    items, in that order (one longer than the new ``L`` split every ``L`` tokens), are binned
    again by best-fit decreasing as one group; the rest is cut into the new lanes with
    ``z = x mod B'``, no shuffle. Windows dealt past ``x`` are dealt again. A step's epoch
    label is the epoch of the window holding the run's unit ``x`` before it.
    """
    wins: list[tuple[int, int, list[int]]] = []

    def win(i: int) -> tuple[int, int, list[int]]:
        while len(wins) <= i:
            e = wins[-1][0] + 1 if wins else 0
            wins.extend((e, w, g) for w, g in enumerate(epoch_windows(len(rg_docs), seed, window, e)))
        return wins[i]

    queues: list[list[tuple[Bin, int]]] = []
    span: dict[int, list[int]] = {}  # window -> [first unit, end]
    state = {"next": 0, "run": 0}

    def deal(lanes: int, seq_len: int) -> None:
        i = state["next"]
        e, w, group = win(i)
        stream = [b for g in group for b in bins_of(rg_docs[g], g, seq_len)]
        c = cuts(len(stream), lanes, state["run"] % lanes)
        for k in range(lanes):
            sl = stream[c[k] : c[k + 1]]
            queues[k].extend((sl[j], i) for j in permutation(len(sl), key(seed, e, w, k, 2)))
        span[i] = [state["run"], state["run"] + len(stream)]
        state["run"] += len(stream)
        state["next"] = i + 1

    out: list[list[Bin]] = []
    labels: list[int] = []
    x = 0
    lanes, seq_len = stages[0][1], stages[0][2]
    queues = [[] for _ in range(lanes)]
    for t in range(steps):
        change = [s for s in stages[1:] if s[0] == t]
        if change:
            _, new_lanes, new_len = change[0]
            begun = [i for i, (a, b) in span.items() if a < x < b]
            rest = [bn for k in range(lanes) for bn, i in queues[k] if begun and i == begun[0]]
            later = [i for i, (a, _) in span.items() if a >= x]
            if later:
                state["next"] = min(later)
                for i in later:
                    del span[i]
            if new_len != seq_len:
                items = [
                    (g, r, o + j, min(new_len, n - j))
                    for bn in rest
                    for g, r, o, n in bn
                    for j in range(0, n or 1, new_len)
                ]
                rest = _best_fit(items, new_len)
            lanes, seq_len = new_lanes, new_len
            c = cuts(len(rest), lanes, x % lanes)
            queues = [[(bn, begun[0]) for bn in rest[c[k] : c[k + 1]]] for k in range(lanes)]
            state["run"] = x + len(rest)
            if begun:
                span[begun[0]][1] = state["run"]
        while any(not q for q in queues):
            deal(lanes, seq_len)
        out.append([q.pop(0)[0] for q in queues])
        labels.append(x)
        x += lanes
    at = [next(win(i)[0] for i, (a, b) in span.items() if a <= u < b) for u in labels]
    return out, at


def _best_fit(items: list[Item], seq_len: int) -> list[Bin]:
    """Rule 2 over a list of items (one group): bins in order of opening, each one's items in the list's order."""
    fill: list[int] = []
    content: list[list[int]] = []
    for i in sorted(range(len(items)), key=lambda i: (-items[i][3], i)):
        n = items[i][3]
        fits = [b for b in range(len(fill)) if seq_len - fill[b] >= n]
        b = min(fits, key=lambda b: (seq_len - fill[b], b)) if fits else len(fill)
        if b == len(fill):
            fill.append(0)
            content.append([])
        fill[b] += n
        content[b].append(i)
    return [[items[i] for i in sorted(c)] for c in content]
