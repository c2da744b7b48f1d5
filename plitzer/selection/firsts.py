"""Phase 2 of the deduplication pass: the first occurrence of every key, in source order.

A document is dropped iff an earlier one in source order has its key. :func:`first_occurrences`
finds them bucket by bucket (equal keys share a bucket); :func:`resolve` runs it over every
chunk's keys in one process; :func:`resolve_shared` over a job's ranks, each resolving only
the keys it owns (:func:`owner`), with ``world + 3`` all-gathers; :func:`resolve_spilled`
over keys that one process spilled into bucket files (:class:`Spill`, past
:data:`SPILL_KEYS`). All three give the same :class:`Resolved`; :mod:`plitzer.selection.result`
turns it into the cached result (docs/design.md, "Deduplication and exclusion"). Phase 1 is
:mod:`plitzer.selection.keying`; what phase 2 holds of it, :mod:`plitzer.selection.held`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from planner.arraytypes import I64
from planner.catalog.datasetindex import Index
from plitzer.selection.held import Held
from plitzer.selection.keying import Hashed
from plitzer.selection.keys import Keys

__all__ = [
    "BUCKET_ROWS",
    "META",
    "SPILL_KEYS",
    "Exchange",
    "Resolved",
    "Rows",
    "Spill",
    "first_occurrences",
    "owner",
    "resolve",
    "resolve_shared",
    "resolve_spilled",
]


Exchange = Callable[[Any], list[Any]]
"""All-gather: share this rank's value (chunk number -> arrays, or the error its phase 1 raised),
get every rank's, in rank order.

Collective: every rank calls it the same number of times, in the same order (the pass
calls it ``world + 3`` times: :func:`resolve_shared`)."""


# -- phase 2: first occurrences ------------------------------------------------------


@dataclass(frozen=True)
class Rows:
    """Some stream rows of every row group of a part: row group ``g``'s are ``pos[starts[g]:starts[g + 1]]``.

    Two arrays for the whole part, not one a row group (about 110 B of header each, more than
    the index's row on small row groups): docs/design.md, "Bytes a row group".
    """

    counts: I64
    """Each row group's number of them."""
    pos: I64
    """Their stream positions, row group after row group, ascending in each."""

    @cached_property
    def starts(self) -> I64:
        return np.concatenate([[0], np.cumsum(self.counts)]).astype(np.int64)

    def of(self, rg: int) -> I64:
        return self.pos[int(self.starts[rg]) : int(self.starts[rg + 1])]

    @classmethod
    def gathered(cls, counts: Sequence[I64], pos: Sequence[I64]) -> Rows:
        """From consecutive row groups' pieces (chunks' counts and positions, in order)."""
        return cls(_cat(counts, np.int64), _cat(pos, np.int64))


def _cat(arrays: Sequence[np.ndarray], dtype: Any) -> NDArray[Any]:
    return np.concatenate([np.zeros(0, dtype), *arrays]).astype(dtype, copy=False)


@dataclass(frozen=True)
class Resolved:
    """Per part: each row group's dropped duplicates' and excluded rows' stream positions."""

    dup: list[Rows]
    excl: list[Rows]
    duplicates: list[I64]  # per part: (rg, stream position, kept part, kept rg, kept stream position)

    def gone(self, p: int, rg: int) -> I64:
        """Row group ``rg`` of part ``p``: the stream positions of its dropped rows, ascending."""
        return np.union1d(self.dup[p].of(rg), self.excl[p].of(rg)).astype(np.int64)


BUCKET_ROWS = 1 << 22
"""Keys resolved at a time: a key's bucket (its hash modulo the buckets) holds every copy of it."""


def first_occurrences(keys: Keys, bucket_rows: int = BUCKET_ROWS) -> tuple[I64, I64]:
    """Rows (positions in ``keys``, in source order) whose key an earlier row has, and that first row.

    Bucket by bucket (equal keys share a bucket): a sort of the bucket's keys puts each
    key's copies together, and the smallest position of each run (the first in source order)
    is kept. Memory beyond ``keys``: a bucket's (about 40 bytes a row of it) and 2 bytes a row.
    """
    n = len(keys)
    buckets = max(1, -(-n // max(1, bucket_rows)))
    of = (keys[:, 0] % np.uint64(buckets)).astype(np.uint16 if buckets < 1 << 16 else np.uint32)
    drops, kepts = [], []
    for b in range(buckets):
        idx = None if buckets == 1 else np.flatnonzero(of == b).astype(np.int64)  # None: every row (no copy)
        if (n if idx is None else len(idx)) < 2:
            continue
        k0, k1 = (keys[:, 0], keys[:, 1]) if idx is None else (keys[idx, 0], keys[idx, 1])
        order = np.argsort(k0)  # by the first lane (fast); ties in any order
        s0, s1 = k0[order], k1[order]
        same0 = s0[1:] == s0[:-1]
        if (same0 & (s1[1:] != s1[:-1])).any():  # equal first lanes, other second ones (about 2**-64 a pair)
            order = np.lexsort((k1, k0))
            s0, s1 = k0[order], k1[order]
            same0 = s0[1:] == s0[:-1]
        del k0, k1
        new = np.ones(len(order), bool)
        new[1:] = ~(same0 & (s1[1:] == s1[:-1]))
        del s0, s1, same0
        if new.all():
            continue
        first = np.minimum.reduceat(order, np.flatnonzero(new))  # each key's first row (source order)
        keep = first[np.cumsum(new) - 1]
        del first, new
        gone = np.flatnonzero(order != keep)
        drops.append(order[gone] if idx is None else idx[order[gone]])
        del order
        kepts.append(keep[gone] if idx is None else idx[keep[gone]])
        del keep, gone
    if not drops:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    d, k2 = (drops[0], kepts[0]) if len(drops) == 1 else (np.concatenate(drops), np.concatenate(kepts))
    del drops, kepts
    at = np.argsort(d, kind="stable")
    return d[at], k2[at]


def resolve(parts: Sequence[Index], chunks: list[tuple[int, int, int]], done: dict[int, Hashed] | Held) -> Resolved:
    """The dropped rows of every row group; each chunk's keys are moved out of ``done`` (one copy at a time)."""
    lay = _Layout.of(parts, chunks, done)
    total = int(lay.starts[-1])
    if isinstance(done, Held) and done.in_order():  # the store's keys are every key in source order: no copy
        rows = lay.duplicates_of(None, done.hashes.buf[:total], done.pos.buf[:total])
        done.drop_keys()
        return lay.resolved([rows])
    keys = np.empty((total, 2), np.uint64)
    pos = np.empty(total, np.int64)
    for c in range(len(chunks)):  # chunks are in source order: so are their keys
        h = done[c]
        at, k = int(lay.base[c]), h["keys"].reshape(-1, 2)
        keys[at : at + len(k)] = k
        pos[at : at + len(k)] = h["pos"]
        done[c] = {n: v for n, v in h.items() if n != "keys"}  # never mutated: another rank's may be this one
        del h, k
    if isinstance(done, Held):
        done.drop_keys()
    rows = lay.duplicates_of(None, keys, pos)
    del keys, pos
    return lay.resolved([rows])


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

    row_groups: list[int]
    excl: list[Rows]
    starts: I64
    part_of: I64
    local_of: I64
    base: I64

    @classmethod
    def of(cls, parts: Sequence[Index], chunks: list[tuple[int, int, int]], meta: Mapping[int, Hashed]) -> _Layout:
        xs: list[list[I64]] = [[] for _ in parts]
        excls: list[list[I64]] = [[] for _ in parts]
        rg_m, rg_part, rg_local = [], [], []
        for c, (p, a, _b) in enumerate(chunks):  # a part's chunks are its row groups in order
            m = meta[c]["m"]
            xs[p].append(meta[c]["x"])
            excls[p].append(meta[c]["excl"])
            rg_m.append(m)
            rg_part.append(np.full(len(m), p, np.int64))
            rg_local.append(np.arange(a, a + len(m), dtype=np.int64))
        m_all = np.concatenate([np.zeros(0, np.int64), *rg_m]).astype(np.int64)
        starts = np.concatenate([[0], np.cumsum(m_all)]).astype(np.int64)
        first_rg = np.concatenate([[0], np.cumsum([len(m) for m in rg_m])]).astype(np.int64)
        return cls(
            row_groups=[ix.row_groups for ix in parts],
            excl=[Rows.gathered(x, e) for x, e in zip(xs, excls, strict=True)],
            starts=starts,
            part_of=np.concatenate([np.zeros(0, np.int64), *rg_part]),
            local_of=np.concatenate([np.zeros(0, np.int64), *rg_local]),
            base=starts[first_rg[:-1]],
        )

    def duplicates_of(self, g: I64 | None, keys: Keys, pos: NDArray[np.integer[Any]]) -> I64:
        """Rows (global number dropped, part, rg, position, kept part, rg, position) of the keys given in
        source order (``g`` ascending; None: every key, in order): every copy of each of their keys among them."""
        drop, kept = first_occurrences(keys)
        out = np.empty((len(drop), 7), np.int64)  # filled a column at a time: no list of seven arrays
        out[:, 0] = drop if g is None else g[drop]
        at = np.searchsorted(self.starts, out[:, 0], side="right") - 1
        out[:, 1], out[:, 2], out[:, 3] = self.part_of[at], self.local_of[at], pos[drop]
        del drop
        at = np.searchsorted(self.starts, kept if g is None else g[kept], side="right") - 1
        out[:, 4], out[:, 5], out[:, 6] = self.part_of[at], self.local_of[at], pos[kept]
        return out

    def resolved(self, tables: list[I64]) -> Resolved:
        """The :class:`Resolved` of every group of keys' :meth:`duplicates_of` rows, in any order.

        ``tables`` is emptied as they are merged: at most two copies of the rows are held at once.
        """
        if len(tables) == 1 and bool((np.diff(tables[0][:, 0]) > 0).all()):  # in source order already
            table = tables.pop()[:, 1:]
        else:
            order = np.argsort(np.concatenate([np.zeros(0, np.int64), *(t[:, 0] for t in tables)]), kind="stable")
            rows = np.concatenate([np.zeros((0, 6), np.int64), *(t[:, 1:] for t in tables)])
            tables.clear()
            table = np.take(rows, order, axis=0)  # source order of the dropped rows
            del rows, order
        dup, duplicates = [], []
        for p, n in enumerate(self.row_groups):  # the rows are in source order: by part, row group, position
            mine = table if len(self.row_groups) == 1 else table[table[:, 0] == p]  # one part: no copy
            # Views of the table, not copies: a copy of the rows beside them was the pass's peak.
            dup.append(Rows(np.bincount(mine[:, 1], minlength=n).astype(np.int64), mine[:, 2]))
            duplicates.append(mine[:, 1:])
        return Resolved(dup, self.excl, duplicates)


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
