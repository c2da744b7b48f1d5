"""Phase 2 of the deduplication pass: the first occurrence of every key, in source order.

A document is dropped iff an earlier one in source order has its key. :func:`first_occurrences`
finds them bucket by bucket (equal keys share a bucket); :func:`resolve` runs it over every
chunk's keys in one process; :func:`resolve_shared` over a job's ranks, each resolving only
the keys it owns (:func:`owner`), with ``world + 3`` all-gathers; :func:`resolve_spilled`
over keys that one process spilled into bucket files (:class:`Spill`, past
:data:`SPILL_KEYS`). All three give the same :class:`Resolved`; :func:`dropped_tokens` and
:func:`result_arrays` turn it into the cached result (docs/design.md, "Deduplication and
exclusion"). Phase 1 is :mod:`plitzer.selection.keying`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from planner.catalog.dataset import Index
from planner.threads import map_ahead
from plitzer.readpath.read import list_lengths, read_chunk
from plitzer.selection.keying import Hashed, load_arrays
from plitzer.selection.keys import Keys

__all__ = [
    "BUCKET_ROWS",
    "META",
    "SPILL_KEYS",
    "CachedLengths",
    "Exchange",
    "Resolved",
    "Spill",
    "dropped_tokens",
    "first_occurrences",
    "kept_lengths",
    "owner",
    "resolve",
    "resolve_shared",
    "resolve_spilled",
    "result_arrays",
]

I64 = NDArray[np.int64]
U8 = NDArray[np.uint8]

Exchange = Callable[[Any], list[Any]]
"""All-gather: share this rank's value (chunk number -> arrays, or the error its phase 1 raised),
get every rank's, in rank order.

Collective: every rank calls it the same number of times, in the same order (the pass
calls it ``world + 3`` times: :func:`resolve_shared`)."""


# -- phase 2: first occurrences ------------------------------------------------------


@dataclass(frozen=True)
class Resolved:
    """Per part: each row group's dropped duplicates' and excluded rows' stream positions."""

    dup: list[list[I64]]
    excl: list[list[I64]]
    duplicates: list[I64]  # per part: (rg, stream position, kept part, kept rg, kept stream position)


BUCKET_ROWS = 1 << 22
"""Keys resolved at a time: a key's bucket (its hash modulo the buckets) holds every copy of it."""


def first_occurrences(keys: Keys, bucket_rows: int = BUCKET_ROWS) -> tuple[I64, I64]:
    """Rows (indices into ``keys``, in source order) whose key an earlier row has, and that first row.

    Bucket by bucket (equal keys share a bucket): a sort of the bucket's keys puts each
    key's copies together, and the smallest index of each run (the first in source order)
    is kept. Memory beyond ``keys``: a bucket's (about 40 bytes a row of it) and 2 bytes a row.
    """
    n = len(keys)
    buckets = max(1, -(-n // max(1, bucket_rows)))
    of = (keys[:, 0] % np.uint64(buckets)).astype(np.uint16 if buckets < 1 << 16 else np.uint32)
    drops, kepts = [], []
    for b in range(buckets):
        idx = np.arange(n, dtype=np.int64) if buckets == 1 else np.flatnonzero(of == b).astype(np.int64)
        if len(idx) < 2:
            continue
        k0, k1 = keys[idx, 0], keys[idx, 1]
        order = np.argsort(k0)  # by the first lane (fast); ties in any order
        s0, s1 = k0[order], k1[order]
        same0 = s0[1:] == s0[:-1]
        if (same0 & (s1[1:] != s1[:-1])).any():  # equal first lanes, other second ones (about 2**-64 a pair)
            order = np.lexsort((k1, k0))
            s0, s1 = k0[order], k1[order]
            same0 = s0[1:] == s0[:-1]
        del k0, k1
        new = np.ones(len(idx), bool)
        new[1:] = ~(same0 & (s1[1:] == s1[:-1]))
        del s0, s1, same0
        if new.all():
            continue
        starts = np.flatnonzero(new)
        first = np.minimum.reduceat(order, starts)  # each key's first row (source order)
        group = np.cumsum(new) - 1
        keep = first[group]
        gone = np.flatnonzero(order != keep)
        drops.append(idx[order[gone]])
        kepts.append(idx[keep[gone]])
    if not drops:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    d, k2 = np.concatenate(drops), np.concatenate(kepts)
    at = np.argsort(d, kind="stable")
    return d[at], k2[at]


def resolve(parts: Sequence[Index], chunks: list[tuple[int, int, int]], done: dict[int, Hashed]) -> Resolved:
    """The dropped rows of every row group; each chunk's keys are moved out of ``done`` (one copy at a time)."""
    dup: list[list[I64]] = [[np.zeros(0, np.int64)] * ix.row_groups for ix in parts]
    excl: list[list[I64]] = [[np.zeros(0, np.int64)] * ix.row_groups for ix in parts]
    total = sum(int(done[c]["m"].sum()) for c in range(len(chunks)))
    keys = np.empty((total, 2), np.uint64)
    at = 0
    pos_all: list[NDArray[np.int32]] = []
    rg_part: list[int] = []
    rg_local: list[int] = []
    rg_m: list[int] = []
    for c, (p, a, _b) in enumerate(chunks):  # chunks are in source order
        h = done[c]
        m, x = h["m"], h["x"]
        xo = np.concatenate([[0], np.cumsum(x)])
        for i in range(len(x)):
            if x[i]:
                excl[p][a + i] = h["excl"][xo[i] : xo[i + 1]]
        done[c] = {n: v for n, v in h.items() if n != "keys"}  # never mutated: another rank's may be this one
        k = h["keys"].reshape(-1, 2)  # the chunk's keys: copied in, then dropped from ``done``
        keys[at : at + len(k)] = k
        at += len(k)
        pos_all.append(np.asarray(h["pos"], np.int32))
        del k, h
        rg_part.extend([p] * len(m))
        rg_local.extend(range(a, a + len(m)))
        rg_m.extend(m.tolist())
    duplicates: list[I64] = [np.zeros((0, 5), np.int64) for _ in parts]
    drop, kept = first_occurrences(keys)
    del keys
    if len(drop) == 0:
        return Resolved(dup, excl, duplicates)
    pos = np.concatenate(pos_all) if pos_all else np.zeros(0, np.int32)
    starts = np.concatenate([[0], np.cumsum(np.array(rg_m, np.int64))])
    part_of, local_of = np.array(rg_part, np.int64), np.array(rg_local, np.int64)

    def where(i: I64) -> tuple[I64, I64, I64]:
        g = np.searchsorted(starts, i, side="right") - 1
        return part_of[g], local_of[g], pos[i].astype(np.int64)

    dp, dr, dpos = where(drop)
    kp, kr, kpos = where(kept)
    _spread(np.stack([dp, dr, dpos, kp, kr, kpos], axis=1), dup, duplicates)
    return Resolved(dup, excl, duplicates)


META = ("n", "m", "x", "excl")
"""What every rank gets of every chunk's phase 1: its counts a row group and its excluded rows."""


def owner(keys: Keys, world: int) -> I64:
    """The rank that resolves each key: its second 64-bit lane modulo the ranks (equal keys, one owner).

    The second lane, because :func:`first_occurrences` buckets by the first: an owner's
    keys still spread over its buckets.
    """
    return (keys[:, 1] % np.uint64(world)).astype(np.int64)


def _gathered(got: Sequence[Mapping[int, Hashed]]) -> list[tuple[int, Hashed]]:
    """Every rank's values of one exchange, by chunk number (source order)."""
    return sorted((c, h) for part in got for c, h in part.items())


def resolve_shared(
    parts: Sequence[Index],
    chunks: list[tuple[int, int, int]],
    local: dict[int, Hashed] | Exception,
    exchange: Exchange,
    rank: int,
    world: int,
) -> Resolved:
    """:func:`resolve` over ranks that each keyed ``local`` (their chunks), no rank holding every key.

    Each key has an owner rank (:func:`owner`), and every copy of a key goes to it, so
    an owner finds first occurrences over its keys alone. The exchanges, all collective:

    1. every chunk's counts a row group and excluded rows (bytes a row group);
    2. one round an owner: each rank sends the keys of its chunks that the owner resolves,
       with their global numbers (source order) and stream positions; the owner keeps
       them, the others drop them at once (each holds about 1/world of the keys);
    3. each owner's duplicates, as rows (dropped and kept: part, row group, position),
       which every rank puts in source order.

    The result is :func:`resolve`'s, on every rank; a rank's keys are dropped from
    ``local`` as they are sent. Where ``local`` is the error this rank's phase 1 raised,
    the first exchange sends it instead, and every rank raises the first rank's error.
    """
    sent = local if isinstance(local, Exception) else {c: {k: h[k] for k in META} for c, h in local.items()}
    got = exchange(sent)
    for g in got:
        if isinstance(g, BaseException):
            raise g
    assert not isinstance(local, Exception)
    meta = dict(_gathered(got))
    lay = _Layout.of(parts, chunks, meta)
    owners = {c: owner(h["keys"].reshape(-1, 2), world) for c, h in local.items()}
    g_own, k_own, pos_own = np.zeros(0, np.int64), np.zeros((0, 2), np.uint64), np.zeros(0, np.int64)
    for d in range(world):
        send: dict[int, Hashed] = {}
        for c, h in local.items():
            at = np.flatnonzero(owners[c] == d)
            send[c] = {"g": lay.base[c] + at, "keys": h["keys"].reshape(-1, 2)[at], "pos": h["pos"][at]}
        got = exchange(send)
        del send
        if d == rank:
            pieces = [h for _, h in _gathered(got)]  # chunk order: the keys' global order
            g_own = np.concatenate([g_own, *(h["g"] for h in pieces)]).astype(np.int64)
            k_own = np.concatenate([k_own, *(h["keys"] for h in pieces)]).astype(np.uint64)
            pos_own = np.concatenate([pos_own, *(h["pos"] for h in pieces)]).astype(np.int64)
            del pieces
        del got
    for c, h in list(local.items()):
        local[c] = {n: v for n, v in h.items() if n != "keys"}  # never mutated in place: see resolve
    rows = lay.duplicates_of(g_own, k_own, pos_own)
    del g_own, k_own, pos_own
    return lay.resolved([h["t"] for _, h in _gathered(exchange({rank: {"t": rows}}))])


@dataclass(frozen=True)
class _Layout:
    """Where each key of phase 1 sits, from every chunk's counts (bytes a row group): the resolvers' common ground.

    Keys are numbered globally in source order (chunks in order, their keyed rows in
    order); ``starts`` is each row group's first key, ``part_of``/``local_of`` each row
    group's part and row group there, ``base`` each chunk's first key.
    """

    n_parts: int
    dup: list[list[I64]]
    excl: list[list[I64]]
    starts: I64
    part_of: I64
    local_of: I64
    base: I64

    @classmethod
    def of(cls, parts: Sequence[Index], chunks: list[tuple[int, int, int]], meta: Mapping[int, Hashed]) -> _Layout:
        dup: list[list[I64]] = [[np.zeros(0, np.int64)] * ix.row_groups for ix in parts]
        excl: list[list[I64]] = [[np.zeros(0, np.int64)] * ix.row_groups for ix in parts]
        rg_m, rg_part, rg_local = [], [], []
        for c, (p, a, _b) in enumerate(chunks):
            m, x = meta[c]["m"], meta[c]["x"]
            xo = np.concatenate([[0], np.cumsum(x)])
            for i in range(len(x)):
                if x[i]:
                    excl[p][a + i] = meta[c]["excl"][xo[i] : xo[i + 1]]
            rg_m.append(m)
            rg_part.append(np.full(len(m), p, np.int64))
            rg_local.append(np.arange(a, a + len(m), dtype=np.int64))
        m_all = np.concatenate([np.zeros(0, np.int64), *rg_m]).astype(np.int64)
        starts = np.concatenate([[0], np.cumsum(m_all)]).astype(np.int64)
        first_rg = np.concatenate([[0], np.cumsum([len(m) for m in rg_m])]).astype(np.int64)
        return cls(
            n_parts=len(parts),
            dup=dup,
            excl=excl,
            starts=starts,
            part_of=np.concatenate([np.zeros(0, np.int64), *rg_part]),
            local_of=np.concatenate([np.zeros(0, np.int64), *rg_local]),
            base=starts[first_rg[:-1]],
        )

    def duplicates_of(self, g: I64, keys: Keys, pos: I64) -> I64:
        """Rows (global number dropped, part, rg, position, kept part, rg, position) of the keys given in
        source order (``g`` ascending): every copy of each of their keys must be among them."""
        drop, kept = first_occurrences(keys)
        gd, gk = g[drop], g[kept]
        rd = np.searchsorted(self.starts, gd, side="right") - 1
        rk = np.searchsorted(self.starts, gk, side="right") - 1
        cols = [gd, self.part_of[rd], self.local_of[rd], pos[drop], self.part_of[rk], self.local_of[rk], pos[kept]]
        return np.stack([np.asarray(c, np.int64) for c in cols], axis=1)

    def resolved(self, tables: list[I64]) -> Resolved:
        """The :class:`Resolved` of every group of keys' :meth:`duplicates_of` rows, in any order.

        ``tables`` is emptied as they are merged: at most two copies of the rows are held at once.
        """
        order = np.argsort(np.concatenate([np.zeros(0, np.int64), *(t[:, 0] for t in tables)]), kind="stable")
        rows = np.concatenate([np.zeros((0, 6), np.int64), *(t[:, 1:] for t in tables)])
        tables.clear()
        table = np.take(rows, order, axis=0)  # source order of the dropped rows
        del rows, order
        duplicates: list[I64] = [np.zeros((0, 5), np.int64) for _ in range(self.n_parts)]
        _spread(table, self.dup, duplicates)
        return Resolved(self.dup, self.excl, duplicates)


SPILL_KEYS = 1 << 24
"""Keys one process resolves in memory (400 MB of phase 1's state); beyond, they are spilled by bucket."""

_SPILLED = np.dtype([("k0", "<u8"), ("k1", "<u8"), ("c", "<i8"), ("pos", "<i4")])


class Spill:
    """Phase 1's keys out of memory: each chunk's keys, as it comes, appended to one of ``buckets`` files.

    A key's bucket is its second lane modulo the buckets (as :func:`owner`), so every copy of
    a key lands in one file, and one file at a time is resolved: what one process holds is a
    bucket's keys, not the corpus's (:func:`resolve_spilled`). A record is 28 bytes: the
    key, the chunk and row within it, the stream position.
    """

    def __init__(self, folder: Path, buckets: int) -> None:
        self.folder, self.buckets = folder, buckets
        self._lock = threading.Lock()

    def path(self, b: int) -> Path:
        return self.folder / f"bucket-{b:05d}.bin"

    def keep(self, c: int, h: Hashed) -> Hashed:
        """Spill chunk ``c``'s keys; what stays in memory (its counts and excluded rows)."""
        keys = h["keys"].reshape(-1, 2)
        rec = np.empty(len(keys), _SPILLED)
        rec["k0"], rec["k1"], rec["pos"] = keys[:, 0], keys[:, 1], h["pos"]
        rec["c"] = (np.int64(c) << np.int64(32)) | np.arange(len(keys), dtype=np.int64)
        of = owner(keys, self.buckets)
        order = np.argsort(of, kind="stable")
        cuts = np.searchsorted(of[order], np.arange(self.buckets + 1))
        with self._lock:
            for b in range(self.buckets):
                if cuts[b + 1] > cuts[b]:
                    with self.path(b).open("ab") as f:
                        rec[order[cuts[b] : cuts[b + 1]]].tofile(f)
        return {k: h[k] for k in META}

    def bucket(self, b: int, base: I64) -> tuple[I64, Keys, I64]:
        """Bucket ``b``'s keys in source order: global numbers, keys, stream positions."""
        path = self.path(b)
        rec = np.fromfile(path, _SPILLED) if path.exists() else np.empty(0, _SPILLED)
        g = base[rec["c"] >> np.int64(32)] + (rec["c"] & np.int64(0xFFFFFFFF))
        order = np.argsort(g, kind="stable")
        keys = np.stack([rec["k0"][order], rec["k1"][order]], axis=1)
        return g[order], keys, rec["pos"][order].astype(np.int64)


def resolve_spilled(
    parts: Sequence[Index], chunks: list[tuple[int, int, int]], meta: Mapping[int, Hashed], spill: Spill
) -> Resolved:
    """:func:`resolve` from spilled keys, one bucket in memory at a time."""
    lay = _Layout.of(parts, chunks, meta)
    tables: list[I64] = []
    for b in range(spill.buckets):
        g, keys, pos = spill.bucket(b, lay.base)
        tables.append(lay.duplicates_of(g, keys, pos))
        spill.path(b).unlink(missing_ok=True)
        del g, keys, pos
    return lay.resolved(tables)


class _KnownLengths(Protocol):
    """Phase 1's token counts of a row group's stream rows, where it kept them (``"tokens"``)."""

    def get(self, at: tuple[int, int], /) -> NDArray[np.int32] | None: ...


class CachedLengths:
    """``(part, row group) -> stream rows' token counts`` read back from phase 1's cached chunks (``"tokens"``).

    What :func:`kept_lengths` gives from memory, for a pass whose chunks were spilled: a
    row group with a dropped row loads its chunk's entry again (the last few kept), else
    (an entry not cached) the caller reads the token chunk.
    """

    def __init__(self, chunks: list[tuple[int, int, int]], paths: list[Any]) -> None:
        self._of = {(p, rg): c for c, (p, a, b) in enumerate(chunks) for rg in range(a, b)}
        self._chunks, self._paths = chunks, paths
        self._load = lru_cache(maxsize=8)(self._chunk)

    def _chunk(self, c: int) -> dict[int, NDArray[np.int32]]:
        got = load_arrays(self._paths[c], ("n", "len"))
        return {} if got is None else {rg: v for (_, rg), v in kept_lengths(self._chunks, {c: got}).items()}

    def get(self, at: tuple[int, int]) -> NDArray[np.int32] | None:
        c = self._of.get(at)
        return None if c is None else self._load(c).get(at[1])


def _spread(table: I64, dup: list[list[I64]], duplicates: list[I64]) -> None:
    """Rows (dropped part, rg, position, kept part, rg, position), in source order, into each part's lists."""
    for p in range(len(duplicates)):
        mine = table if len(duplicates) == 1 else table[table[:, 0] == p]  # one part: no copy
        duplicates[p] = mine[:, 1:]
        if len(mine):
            rgs, first = np.unique(mine[:, 1], return_index=True)
            ends = np.append(first[1:], len(mine))
            for g, s0, e in zip(rgs.tolist(), first.tolist(), ends.tolist(), strict=True):
                dup[p][g] = np.sort(mine[s0:e, 2])


# -- the cached result ---------------------------------------------------------------


def kept_lengths(
    chunks: list[tuple[int, int, int]], done: Mapping[int, Hashed]
) -> dict[tuple[int, int], NDArray[np.int32]]:
    """(part, row group) -> its stream rows' token counts, where phase 1 kept them (``"tokens"``)."""
    out: dict[tuple[int, int], NDArray[np.int32]] = {}
    for c, h in done.items():  # every chunk, or a rank's own
        p, a, _b = chunks[c]
        lens = h["len"]
        if len(lens) != int(h["n"].sum()):
            continue
        offs = np.concatenate([[0], np.cumsum(h["n"])])
        for i in range(len(h["n"])):
            out[(p, a + i)] = lens[offs[i] : offs[i + 1]]
    return out


def dropped_tokens(
    parts: Sequence[Index],
    res: Resolved,
    threads: int,
    known: _KnownLengths,
    only: set[tuple[int, int]] | None,
) -> dict[tuple[int, int], tuple[int, int]]:
    """(part, row group) -> (tokens, empty documents) of its dropped rows, for each row group with one (in ``only``).

    A row group with a dropped row needs its rows' token counts: phase 1's where it kept
    them (``"tokens"``), else its token chunk is read once more (a column key never decoded it).
    """
    from concurrent.futures import ThreadPoolExecutor

    todo = [
        (p, rg)
        for p, ix in enumerate(parts)
        for rg in range(ix.row_groups)
        if (len(res.dup[p][rg]) or len(res.excl[p][rg])) and (only is None or (p, rg) in only)
    ]

    def dropped(at: tuple[int, int]) -> tuple[int, int]:
        p, rg = at
        have = known.get(at)
        lengths = have.astype(np.int64) if have is not None else list_lengths(read_chunk(parts[p], rg))
        gone = np.union1d(res.dup[p][rg], res.excl[p][rg]).astype(np.int64)
        return int(lengths[gone].sum()), int((lengths[gone] == 0).sum())

    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="plitzer-dedupe") as pool:
        return dict(zip(todo, map_ahead(pool, dropped, todo), strict=True))


def result_arrays(
    parts: Sequence[Index], res: Resolved, counted: Mapping[tuple[int, int], tuple[int, int]]
) -> dict[str, np.ndarray]:
    """The cached result: per part, the dropped rows by row group and the tokens they held (``counted``)."""
    out: dict[str, np.ndarray] = {}
    for p, ix in enumerate(parts):
        dup, excl = res.dup[p], res.excl[p]
        tok = np.zeros(ix.row_groups, np.int64)
        empty = np.zeros(ix.row_groups, np.int64)
        for (q, rg), (t, e) in counted.items():
            if q == p:
                tok[rg], empty[rg] = t, e
        out[f"rg_dup{p}"] = np.array([len(d) for d in dup], np.int64)
        out[f"rg_excl{p}"] = np.array([len(x) for x in excl], np.int64)
        out[f"pos_dup{p}"] = np.concatenate([np.zeros(0, np.int64), *dup]).astype(np.int64)
        out[f"pos_excl{p}"] = np.concatenate([np.zeros(0, np.int64), *excl]).astype(np.int64)
        out[f"tok{p}"] = tok
        out[f"empty{p}"] = empty
        out[f"dups{p}"] = res.duplicates[p].astype(np.int64).reshape(-1, 5)
    return out
