"""Deduplication and exclusion as a selection (``dedupe=``, ``exclude=``, SPEC section 14).

``Loader(src, dedupe="tokens")`` (or ``dedupe="url"``, any column) keeps a document iff
no earlier document in *source order* has its key: a mixture's sources in the order
given, then files in index order, row groups, rows. ``exclude="decontam.parquet"``
drops every row whose values of the table's columns equal a row of the table
(:mod:`plitzer.selection.exclude`). Both give a :class:`DedupedIndex`: per row group
the rows kept, fed to the stream exactly as a ``where=`` selection's are (every row
group keeps its place; the batches are those of the same data with the dropped rows
removed). The steps, in order, each over the rows the one before kept:

1. the source's own stream rows (a ``where=`` selection's, else every row);
2. exclusion: a row the table lists is dropped (``rows_excluded``);
3. deduplication over the rest: a row whose key an earlier one had is dropped
   (``rows_duplicate``); an excluded row or one left out by ``where=`` never hides a
   later one, and a null column value is never a duplicate.

The pass. Phase 1 (per row group, split between ranks, cached per chunk of
:data:`~plitzer.selection.evaluate.CHUNK` row groups of a file): read the key's column
only (the token column for ``"tokens"``; the table's columns for an exclusion), key each
row with 128 bits (:mod:`plitzer.selection.keys`) and match the exclusion table. Its
state is bytes a row group: the keys (16 bytes a row), the positions of the rows keyed,
the excluded rows' bitmap. Phase 2: the first occurrence of each key in source order,
bucket by bucket (:func:`first_occurrences`); in a job, each rank resolves only the keys
it owns and the ranks exchange the duplicates (:func:`_resolve_shared`), so no rank holds
every key. Then each row group with a dropped row is read once more for its token
lengths (its kept tokens), where phase 1 did not keep them. The result is cached whole, keyed
by every file's identity, the sources' selections and the key (and table digest), so
a second run reads no data.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import polars as pl
import pyarrow as pa
from numpy.typing import NDArray

from planner.catalog.dataset import Index
from planner.catalog.rowgroups import RowGroupIndex, stream_counts, with_selected
from planner.errors import ConfigError, DataError
from planner.mixing.mixindex import MixtureIndex
from planner.stores.cache import cache_dir, digest, discard, read_entry, write_entry
from plitzer.readpath.read import list_lengths, read_chunk, read_decoded
from plitzer.selection.evaluate import CHUNK, leaf_range
from plitzer.selection.exclude import Exclusion, load_exclusion
from plitzer.selection.keys import Keys, hash_array, valid_rows

__all__ = [
    "DEDUPE_DEFAULTS",
    "DedupedIndex",
    "Exchange",
    "Hashed",
    "base_of",
    "dedupe_index",
    "dedupe_table",
    "first_occurrences",
    "dedupe_on_ray",
    "dropped_of",
    "split_targets",
]

I64 = NDArray[np.int64]
U8 = NDArray[np.uint8]
_FORMAT = "2"  # 2: phase 1 keeps the token lengths of "tokens" keys
TOKENS = "tokens"

DEDUPE_DEFAULTS: dict[str, Any] = {"dedupe": "", "exclude": ""}
"""The checkpoint fields of a source neither deduplicated nor excluded from."""

Hashed = dict[str, np.ndarray]
"""One chunk's phase 1: ``n`` stream rows, ``m`` rows keyed and ``x`` rows excluded a row group;
``pos`` (the keyed rows' stream positions), ``keys`` (``(sum m, 2)`` uint64), ``excl`` (stream
positions of the excluded rows), concatenated over the chunk's row groups."""

Exchange = Callable[[Any], list[Any]]
"""All-gather: share this rank's value (chunk number -> arrays, or the error its phase 1 raised),
get every rank's, in rank order.

Collective: every rank calls it the same number of times, in the same order (the pass
calls it ``world + 3`` times: :func:`_resolve_shared`)."""


# -- the index of the rows kept ----------------------------------------------------


@dataclass
class DedupedIndex(Index):
    """An index of the rows left once duplicates and excluded rows are dropped, over ``base``'s rows.

    ``frame`` is ``base``'s (with its selected counts) with ``rows_selected``,
    ``tokens_selected`` and ``empty_docs_selected`` of the rows kept, and
    ``rows_kept``, ``rows_duplicate`` and ``rows_excluded``; ``bits[rg]`` is row group
    ``rg``'s bitmap of kept rows (stored row numbers). ``duplicates`` lists each dropped
    duplicate as ``(row group, row, kept source position, kept row group, kept row)``.
    """

    base: Index | None = None
    dedupe: str = ""
    exclude: str = ""  # the table's sha256
    exclude_path: str = ""
    bits: list[U8] = field(default_factory=list, repr=False)
    duplicates: I64 = field(default_factory=lambda: np.zeros((0, 5), np.int64), repr=False)
    order: list[str] = field(default_factory=list)
    """The sources' names in source order (a mixture's; ``[""]`` for one dataset): ``duplicates``' kept part."""

    def config_fields(self) -> dict[str, Any]:
        assert self.base is not None
        out = dict(self.base.config_fields())
        if self.dedupe:
            out["dedupe"] = self.dedupe
        if self.exclude:
            out["exclude"] = self.exclude
        return out

    def length_source(self, given: str | None) -> str | None:
        assert self.base is not None
        fn = getattr(self.base, "length_source", None)
        return fn(given) if fn is not None else given

    def selected_rows(self, row_group: int) -> I64:
        rows = int(self.frame["rows"][row_group])
        return np.flatnonzero(np.unpackbits(self.bits[row_group], count=rows)).astype(np.int64)

    def stream_positions(self, rg: int) -> I64:
        """The kept rows' positions among ``base``'s stream rows of ``rg``."""
        assert self.base is not None
        kept = self.selected_rows(rg)
        stream = self.base.selected_rows(rg)
        return kept if stream is None else np.searchsorted(stream, kept).astype(np.int64)

    def read_tokens(self, rg: int) -> pa.Array:
        assert self.base is not None
        arr = read_chunk(self.base, rg)
        if int(self.frame["rows_selected"][rg]) != len(arr):
            arr = arr.take(pa.array(self.stream_positions(rg), pa.int64()))
        want = int(self.frame["tokens_selected"][rg])
        got = arr.offsets[-1].as_py() - arr.offsets[0].as_py() if len(arr) else 0
        if got != want:
            row = self.frame.row(rg, named=True)
            where = self.location(row["file_index"], row["row_group"])
            msg = (
                f"{where}: the rows kept hold {got} tokens, but the deduplication pass counted {want}; the file "
                f"changed since the pass: clear {cache_dir() / 'dedupe'} and start again"
            )
            raise DataError(msg, file=self.file(row["file_index"]).location, row_group=row["row_group"])
        return arr


@read_chunk.register
def _read_deduped_chunk(index: DedupedIndex, rg: int) -> pa.Array:
    return index.read_tokens(rg)


# -- phase 1: keys a row group -------------------------------------------------------


def read_column(ix: Index, rg: int, column: str) -> pa.Array:
    """Row group ``rg``'s ``column`` (every stored row): one ranged read of its chunk."""
    row = ix.frame.row(rg, named=True)
    fi, g = row["file_index"], row["row_group"]
    st = ix.file(fi)
    md = ix.metadata(fi)
    where = ix.location(fi, g)
    start, length = leaf_range(md, g, column, st.size, where)
    return read_decoded(
        ix.storage(fi), st, md, row_group=g, column=column, offset=start, length=length, where=where, what=repr(column)
    )


@dataclass(frozen=True)
class _Pass:
    parts: list[Index]  # in source order
    key: str  # "" (none), "tokens", or a column
    exclusions: list[Exclusion | None]  # each part's, cast to its types

    def hash_rg(self, p: int, rg: int) -> tuple[int, I64, Keys, I64, NDArray[np.int32]]:
        """Row group ``rg`` of part ``p``: its stream rows, the keyed rows' positions and keys, the excluded rows,
        and (for ``"tokens"``, which decodes them anyway) every stream row's token count."""
        ix = self.parts[p]
        rows = int(ix.frame["rows"][rg])
        stream = ix.selected_rows(rg)
        n = rows if stream is None else len(stream)
        excl = np.zeros(n, bool)
        ex = self.exclusions[p]
        if ex is not None and n:
            cols = {}
            for c in ex.columns:
                arr = read_column(ix, rg, c)
                cols[c] = arr if stream is None else arr.take(pa.array(stream, pa.int64()))
            excl = ex.match(cols)
        none = np.zeros(0, np.int32)
        if not self.key or n == 0:
            return n, np.zeros(0, np.int64), np.zeros((0, 2), np.uint64), np.flatnonzero(excl).astype(np.int64), none
        if self.key == TOKENS:
            arr = read_chunk(ix, rg)  # the stream rows' tokens (a text source tokenizes here)
            ok = np.ones(n, bool)
        else:
            arr = read_column(ix, rg, self.key)
            if stream is not None:
                arr = arr.take(pa.array(stream, pa.int64()))
            ok = valid_rows(arr)
        if len(arr) != n:
            where = ix.location(int(ix.frame["file_index"][rg]), int(ix.frame["row_group"][rg]))
            msg = f"{where}: decoded {len(arr)} rows of the key, expected {n}; the file is damaged"
            raise DataError(msg)
        keys = hash_array(arr, f"dedupe={self.key!r}")
        take = np.flatnonzero(ok & ~excl).astype(np.int64)
        lengths = list_lengths(arr).astype(np.int32) if self.key == TOKENS else none
        return n, take, keys[take], np.flatnonzero(excl).astype(np.int64), lengths

    def hash_chunk(self, p: int, first: int, end: int) -> Hashed:
        got = [self.hash_rg(p, rg) for rg in range(first, end)]
        return _pack(got)


def _pack(got: Sequence[tuple[int, I64, Keys, I64, NDArray[np.int32]]]) -> Hashed:
    return {
        "n": np.array([g[0] for g in got], np.int64),
        "m": np.array([len(g[1]) for g in got], np.int64),
        "x": np.array([len(g[3]) for g in got], np.int64),
        "pos": np.concatenate([g[1] for g in got]).astype(np.int32) if got else np.zeros(0, np.int32),
        "keys": np.concatenate([g[2] for g in got]).astype(np.uint64) if got else np.zeros((0, 2), np.uint64),
        "excl": np.concatenate([g[3] for g in got]).astype(np.int64) if got else np.zeros(0, np.int64),
        "len": np.concatenate([g[4] for g in got]).astype(np.int32) if got else np.zeros(0, np.int32),
    }


def _chunks(parts: Sequence[Index]) -> list[tuple[int, int, int]]:
    """(part, first row group, end) of every chunk: runs of CHUNK row groups of one file, in source order."""
    out = []
    for p, ix in enumerate(parts):
        fi = ix.frame["file_index"].to_list()
        start = 0
        for i in range(1, len(fi) + 1):
            if i == len(fi) or fi[i] != fi[start] or i - start == CHUNK:
                out.append((p, start, i))
                start = i
    return out


def _identity(ix: Index) -> str:
    """What decides a part's stream rows and keys: its files, its kind's fields, its fingerprint."""
    cfg = json.dumps(ix.config_fields(), sort_keys=True, default=str)
    return f"{ix.fingerprint}\t{ix.column}\t{cfg}"


def _chunk_path(ix: Index, chunk: tuple[int, int, int], key: str, excl: str, cols: str) -> Any:
    _, a, b = chunk
    fi = int(ix.frame["file_index"][a])
    st = ix.file(fi)
    g0, g1 = int(ix.frame["row_group"][a]), int(ix.frame["row_group"][b - 1])
    k = digest(_FORMAT, st.location, st.size, st.version, _identity(ix), key, excl, cols, g0, g1)
    return cache_dir() / "dedupe" / "keys" / f"{k}.npz"


def _save(path: Any, arrays: Mapping[str, np.ndarray]) -> None:
    buf = io.BytesIO()
    np.savez(buf, **dict(arrays))  # type: ignore[arg-type]
    write_entry(path, buf.getvalue())


def _load(path: Any, names: Sequence[str]) -> dict[str, np.ndarray] | None:
    raw = read_entry(path)
    if raw is None:
        return None
    try:
        with np.load(io.BytesIO(raw), allow_pickle=False) as z:
            return {k: np.asarray(z[k]) for k in names}
    except (OSError, ValueError, KeyError) as e:
        discard(path, f"unreadable: {type(e).__name__}")
        return None


_HASHED = ("n", "m", "x", "pos", "keys", "excl", "len")


def _run_chunks(
    ps: _Pass,
    chunks: list[tuple[int, int, int]],
    order: list[int],
    paths: list[Any],
    *,
    shared: bool,
    threads: int,
    progress: bool | None,
    keep: Callable[[int, Hashed], Hashed] | None = None,
) -> dict[int, Hashed]:
    """Phase 1 of ``chunks[order]``: from the cache, else keyed (and written there).

    ``keep(c, h)``: what of chunk ``c``'s phase 1 stays in memory (:meth:`_Spill.keep`), as each comes.
    """
    done: dict[int, Hashed] = {}
    for c in order:
        got = _load(paths[c], _HASHED)
        if got is not None and len(got["n"]) == chunks[c][2] - chunks[c][1]:
            done[c] = got if keep is None else keep(c, got)
    todo = [c for c in order if c not in done]
    if not todo:
        return done
    lock = threading.Lock()

    def work(c: int) -> tuple[int, Hashed]:
        if shared:
            got = _load(paths[c], _HASHED)
            if got is not None:
                return c, got
        p, a, b = chunks[c]
        h = ps.hash_chunk(p, a, b)
        _save(paths[c], h)
        return c, h

    from concurrent.futures import ThreadPoolExecutor

    from tqdm import tqdm

    from planner.progress import progress_enabled

    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="plitzer-dedupe") as pool:
        bar = tqdm(
            pool.map(work, todo),
            total=len(todo),
            desc="keying rows",
            unit="chunk",
            disable=not progress_enabled(progress, len(todo)),
            leave=False,
        )
        for c, h in bar:
            kept = h if keep is None else keep(c, h)
            with lock:
                done[c] = kept
    return done


# -- phase 2: first occurrences ------------------------------------------------------


@dataclass(frozen=True)
class _Resolved:
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


def _resolve(parts: Sequence[Index], chunks: list[tuple[int, int, int]], done: dict[int, Hashed]) -> _Resolved:
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
        return _Resolved(dup, excl, duplicates)
    pos = np.concatenate(pos_all) if pos_all else np.zeros(0, np.int32)
    starts = np.concatenate([[0], np.cumsum(np.array(rg_m, np.int64))])
    part_of, local_of = np.array(rg_part, np.int64), np.array(rg_local, np.int64)

    def where(i: I64) -> tuple[I64, I64, I64]:
        g = np.searchsorted(starts, i, side="right") - 1
        return part_of[g], local_of[g], pos[i].astype(np.int64)

    dp, dr, dpos = where(drop)
    kp, kr, kpos = where(kept)
    _spread(np.stack([dp, dr, dpos, kp, kr, kpos], axis=1), dup, duplicates)
    return _Resolved(dup, excl, duplicates)


META = ("n", "m", "x", "excl")
"""What every rank gets of every chunk's phase 1: its counts a row group and its excluded rows."""


def _owner(keys: Keys, world: int) -> I64:
    """The rank that resolves each key: its second 64-bit lane modulo the ranks (equal keys, one owner).

    The second lane, because :func:`first_occurrences` buckets by the first: an owner's
    keys still spread over its buckets.
    """
    return (keys[:, 1] % np.uint64(world)).astype(np.int64)


def _gathered(got: Sequence[Mapping[int, Hashed]]) -> list[tuple[int, Hashed]]:
    """Every rank's values of one exchange, by chunk number (source order)."""
    return sorted((c, h) for part in got for c, h in part.items())


def _resolve_shared(
    parts: Sequence[Index],
    chunks: list[tuple[int, int, int]],
    local: dict[int, Hashed] | Exception,
    exchange: Exchange,
    rank: int,
    world: int,
) -> _Resolved:
    """:func:`_resolve` over ranks that each keyed ``local`` (their chunks), no rank holding every key.

    Each key has an owner rank (:func:`_owner`), and every copy of a key goes to it, so
    an owner finds first occurrences over its keys alone. The exchanges, all collective:

    1. every chunk's counts a row group and excluded rows (bytes a row group);
    2. one round an owner: each rank sends the keys of its chunks that the owner resolves,
       with their global numbers (source order) and stream positions; the owner keeps
       them, the others drop them at once (each holds about 1/world of the keys);
    3. each owner's duplicates, as rows (dropped and kept: part, row group, position),
       which every rank puts in source order.

    The result is :func:`_resolve`'s, on every rank; a rank's keys are dropped from
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
    owners = {c: _owner(h["keys"].reshape(-1, 2), world) for c, h in local.items()}
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
        local[c] = {n: v for n, v in h.items() if n != "keys"}  # never mutated in place: see _resolve
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

    def resolved(self, tables: Sequence[I64]) -> _Resolved:
        """The :class:`_Resolved` of every group of keys' :meth:`duplicates_of` rows, in any order."""
        table = np.concatenate([np.zeros((0, 7), np.int64), *tables])
        table = table[np.argsort(table[:, 0], kind="stable")][:, 1:]  # source order of the dropped rows
        duplicates: list[I64] = [np.zeros((0, 5), np.int64) for _ in range(self.n_parts)]
        _spread(table, self.dup, duplicates)
        return _Resolved(self.dup, self.excl, duplicates)


SPILL_KEYS = 1 << 24
"""Keys one process resolves in memory (400 MB of phase 1's state); beyond, they are spilled by bucket."""

_SPILLED = np.dtype([("k0", "<u8"), ("k1", "<u8"), ("c", "<i8"), ("pos", "<i4")])


class _Spill:
    """Phase 1's keys out of memory: each chunk's keys, as it comes, appended to one of ``buckets`` files.

    A key's bucket is its second lane modulo the buckets (as :func:`_owner`), so every copy of
    a key lands in one file, and one file at a time is resolved: what one process holds is a
    bucket's keys, not the corpus's (:func:`_resolve_spilled`). A record is 28 bytes: the
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
        of = _owner(keys, self.buckets)
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


def _resolve_spilled(
    parts: Sequence[Index], chunks: list[tuple[int, int, int]], meta: Mapping[int, Hashed], spill: _Spill
) -> _Resolved:
    """:func:`_resolve` from spilled keys, one bucket in memory at a time."""
    lay = _Layout.of(parts, chunks, meta)
    tables = []
    for b in range(spill.buckets):
        g, keys, pos = spill.bucket(b, lay.base)
        tables.append(lay.duplicates_of(g, keys, pos))
        spill.path(b).unlink(missing_ok=True)
        del g, keys, pos
    return lay.resolved(tables)


class _KnownLengths(Protocol):
    """Phase 1's token counts of a row group's stream rows, where it kept them (``"tokens"``)."""

    def get(self, at: tuple[int, int], /) -> NDArray[np.int32] | None: ...


class _CachedLengths:
    """``(part, row group) -> stream rows' token counts`` read back from phase 1's cached chunks (``"tokens"``).

    What :func:`_kept_lengths` gives from memory, for a pass whose chunks were spilled: a
    row group with a dropped row loads its chunk's entry again (the last few kept), else
    (an entry not cached) the caller reads the token chunk.
    """

    def __init__(self, chunks: list[tuple[int, int, int]], paths: list[Any]) -> None:
        self._of = {(p, rg): c for c, (p, a, b) in enumerate(chunks) for rg in range(a, b)}
        self._chunks, self._paths = chunks, paths
        self._load = lru_cache(maxsize=8)(self._chunk)

    def _chunk(self, c: int) -> dict[int, NDArray[np.int32]]:
        got = _load(self._paths[c], ("n", "len"))
        if got is None or len(got["len"]) != int(got["n"].sum()):
            return {}
        offs = np.concatenate([[0], np.cumsum(got["n"])])
        a = self._chunks[c][1]
        return {a + i: got["len"][offs[i] : offs[i + 1]] for i in range(len(got["n"]))}

    def get(self, at: tuple[int, int]) -> NDArray[np.int32] | None:
        c = self._of.get(at)
        return None if c is None else self._load(c).get(at[1])


def _spread(table: I64, dup: list[list[I64]], duplicates: list[I64]) -> None:
    """Rows (dropped part, rg, position, kept part, rg, position), in source order, into each part's lists."""
    for p in range(len(duplicates)):
        mine = table[table[:, 0] == p]
        duplicates[p] = mine[:, 1:]
        if len(mine):
            rgs, first = np.unique(mine[:, 1], return_index=True)
            ends = np.append(first[1:], len(mine))
            for g, s0, e in zip(rgs.tolist(), first.tolist(), ends.tolist(), strict=True):
                dup[p][g] = np.sort(mine[s0:e, 2])


# -- the whole pass ------------------------------------------------------------------


def _parts_of(ix: RowGroupIndex, order: Sequence[str] | None) -> tuple[list[Index], list[int]]:
    """The sources' indexes in source order, and each one's position in ``ix``'s own (name) order."""
    if isinstance(ix, MixtureIndex):
        names = list(ix.names)
        given = [n for n in (order or ix.given) if n in names]
        given += [n for n in names if n not in given]
        at = [names.index(n) for n in given]
        return [ix.parts[i] for i in at], at
    if not isinstance(ix, Index):
        msg = f"dedupe= and exclude= need a dataset's index, not a {type(ix).__name__}"
        raise ConfigError(msg)
    return [ix], [0]


def _schema(ix: Index) -> pa.Schema:
    return ix.metadata(0).schema.to_arrow_schema()


def _check_key(ix: Index, key: str, name: str) -> None:
    if key == TOKENS:
        return
    schema = _schema(ix)
    text = ix.config_fields().get("tokenizer")  # a text source: its text column may be the key
    allowed = [n for n in schema.names if text or n != ix.column]
    if key not in allowed:
        where = f"source {name!r} ({ix.source!r})" if name else repr(ix.source)
        msg = (
            f"dedupe={key!r} is not a column of {where}; give 'tokens' (equal token lists) or one of its "
            f"columns: {', '.join(allowed)}"
        )
        raise ConfigError(msg)


def _result_path(parts: Sequence[Index], key: str, excl: str, cols: str) -> Any:
    files = []
    for ix in parts:
        files.append(_identity(ix))
        files.extend(f"{f.location}\t{f.size}\t{f.version}" for f in ix.files)
    k = digest(_FORMAT, key, excl, cols, len(parts), *files)
    return cache_dir() / "dedupe" / f"{k}.npz"


def dedupe_index(
    ix: RowGroupIndex,
    *,
    dedupe: str | None = None,
    exclude: str | os.PathLike[str] | None = None,
    storage_options: Mapping[str, Any] | None = None,
    order: Sequence[str] | None = None,
    rank: int = 0,
    world: int = 1,
    threads: int | None = None,
    progress: bool | None = None,
    exchange: Exchange | None = None,
) -> RowGroupIndex:
    """``ix`` with duplicates (``dedupe``) and the rows ``exclude`` lists dropped: a selection (SPEC 14).

    Parameters
    ----------
    ix : planner.Index or mixture index
        The dataset (a ``where=`` selection, a text source) or a mixture: a mixture's
        sources are deduplicated together, in ``order`` (names; default: the index's).
    dedupe : str, optional
        ``"tokens"`` (equal token lists) or a column (equal non-null values).
    exclude : str or PathLike, optional
        A Parquet or CSV table whose columns are dataset columns (local or any store).
    rank, world, exchange
        This rank's share of phase 1, and how the ranks share it (see the module).

    Examples
    --------
    >>> import plitzer, tempfile, pyarrow as pa, pyarrow.parquet as pq
    >>> d = tempfile.mkdtemp()
    >>> docs = pa.array([[1, 2], [3], [1, 2], [4, 5, 6]], pa.list_(pa.int32()))
    >>> pq.write_table(pa.table({"tokens": docs}), f"{d}/a.parquet")
    >>> dd = dedupe_index(plitzer.index(d), dedupe="tokens")
    >>> dd.frame.select("rows", "rows_kept", "rows_duplicate", "tokens_selected").row(0)
    (4, 3, 1, 6)
    """
    if dedupe is not None and (not isinstance(dedupe, str) or not dedupe):
        msg = f"dedupe={dedupe!r} must be 'tokens' (equal token lists) or the name of a column (e.g. 'url')"
        raise ConfigError(msg)
    if not dedupe and exclude is None:
        return ix
    key = dedupe or ""
    parts, at = _parts_of(ix, order)
    names = [ix.names[i] for i in at] if isinstance(ix, MixtureIndex) else [""]
    for part, name in zip(parts, names, strict=True):
        if isinstance(part, DedupedIndex):
            msg = "the index is deduplicated already; pass the dataset's own index (or its path)"
            raise ConfigError(msg)
        if key:
            _check_key(part, key, name)
    table = load_exclusion(exclude, storage_options) if exclude is not None else None
    exclusions = [None if table is None else table.check(_schema(p), p.source, _token_column(p)) for p in parts]
    excl_digest = table.digest if table is not None else ""
    cols = ",".join(table.columns) if table is not None else ""
    result = _result_path(parts, key, excl_digest, cols)
    names_out = ["rg_dup", "rg_excl", "pos_dup", "pos_excl", "tok", "empty", "dups"]
    cached = _load(result, [f"{n}{p}" for p in range(len(parts)) for n in names_out])
    if cached is None:
        ps = _Pass(parts=parts, key=key, exclusions=exclusions)
        chunks = _chunks(parts)
        paths = [_chunk_path(parts[p], (p, a, b), key, excl_digest, cols) for p, a, b in chunks]
        n = len(chunks)
        workers = threads or os.cpu_count() or 2
        if exchange is not None and world > 1:
            mine = [c for c in range(n) if c * world // n == rank]
            try:
                done = _run_chunks(ps, chunks, mine, paths, shared=False, threads=workers, progress=progress)
            except Exception as e:  # sent to every rank, raised there: no rank waits in the next exchange
                _resolve_shared(parts, chunks, e, exchange, rank, world)
                raise
            res = _resolve_shared(parts, chunks, done, exchange, rank, world)
            # Each rank counts the dropped tokens of its own chunks' row groups; one more exchange shares them.
            rgs = {(p, rg) for c in mine for p, a, b in [chunks[c]] for rg in range(a, b)}
            counted = _dropped_tokens(parts, res, workers, _kept_lengths(chunks, done), rgs)
            del done
            shared = exchange({rank: {"t": np.array([(*k, *v) for k, v in counted.items()], np.int64).reshape(-1, 4)}})
            counted = {
                (int(r[0]), int(r[1])): (int(r[2]), int(r[3])) for part in shared for h in part.values() for r in h["t"]
            }
        else:
            start = rank * n // world if world > 1 else 0
            seq = [(start + i) % n for i in range(n)]
            rows = sum(int(stream_counts(ix.frame)[1].sum()) for ix in parts)
            if rows <= SPILL_KEYS:
                done = _run_chunks(ps, chunks, seq, paths, shared=world > 1, threads=workers, progress=progress)
                res = _resolve(parts, chunks, done)
                counted = _dropped_tokens(parts, res, workers, _kept_lengths(chunks, done), None)
                del done
            else:  # more keys than memory should hold: spilled by bucket, resolved one bucket at a time
                with tempfile.TemporaryDirectory(prefix="plitzer-dedupe-") as tmp:
                    spill = _Spill(Path(tmp), -(-rows // SPILL_KEYS) * 4)
                    meta = _run_chunks(
                        ps, chunks, seq, paths, shared=world > 1, threads=workers, progress=progress, keep=spill.keep
                    )
                    res = _resolve_spilled(parts, chunks, meta, spill)
                counted = _dropped_tokens(parts, res, workers, _CachedLengths(chunks, paths), None)
        cached = _counts(parts, res, counted)
        _save(result, cached)
    out = [_build(part, cached, p, key, table, names) for p, part in enumerate(parts)]
    if not isinstance(ix, MixtureIndex):
        return _nonempty(out[0], key, exclude, "")
    by_pos = dict(zip(at, out, strict=True))
    new_parts = [_nonempty(by_pos[i], key, exclude, ix.names[i]) for i in range(len(ix.parts))]
    return MixtureIndex(ix.specs, new_parts, given=ix.given)


def _token_column(ix: Index) -> str:
    return "" if ix.config_fields().get("tokenizer") else ix.column


def _nonempty(ix: DedupedIndex, key: str, exclude: Any, name: str) -> DedupedIndex:
    if ix.tokens == 0:
        what = f"source {name!r}" if name else repr(ix.source)
        why = []
        if key:
            why.append(f"dedupe={key!r}")
        if exclude is not None:
            why.append(f"exclude={os.fspath(exclude)!r}")
        msg = (
            f"{what} keeps no token under {' and '.join(why)}: every document of it is a duplicate of an "
            "earlier one or excluded; remove it (or the mixture's other copy), or drop the setting"
        )
        raise ConfigError(msg)
    return ix


def _kept_lengths(
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


def _dropped_tokens(
    parts: Sequence[Index],
    res: _Resolved,
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
        return dict(zip(todo, pool.map(dropped, todo), strict=True))


def _counts(
    parts: Sequence[Index], res: _Resolved, counted: Mapping[tuple[int, int], tuple[int, int]]
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


def _build(
    base: Index, cached: Mapping[str, np.ndarray], p: int, key: str, table: Exclusion | None, names: list[str]
) -> DedupedIndex:
    f = with_selected(base.frame)
    nd, nx = cached[f"rg_dup{p}"], cached[f"rg_excl{p}"]
    dups, excls = cached[f"pos_dup{p}"], cached[f"pos_excl{p}"]
    od, ox = np.concatenate([[0], np.cumsum(nd)]), np.concatenate([[0], np.cumsum(nx)])
    rows = f["rows"].to_numpy()
    bits: list[U8] = []
    for rg in range(base.row_groups):
        stream = base.selected_rows(rg)
        keep_stream = np.arange(int(rows[rg]), dtype=np.int64) if stream is None else stream
        gone = np.concatenate([dups[od[rg] : od[rg + 1]], excls[ox[rg] : ox[rg + 1]]]).astype(np.int64)
        mask = np.zeros(int(rows[rg]), bool)
        mask[keep_stream] = True
        if len(gone):
            mask[keep_stream[gone]] = False
        bits.append(np.packbits(mask))
    sel_rows = f["rows_selected"].to_numpy() - nd - nx
    frame = f.with_columns(
        pl.Series("rows_selected", sel_rows, pl.Int64),
        pl.Series("tokens_selected", f["tokens_selected"].to_numpy() - cached[f"tok{p}"], pl.Int64),
        pl.Series("empty_docs_selected", f["empty_docs_selected"].to_numpy() - cached[f"empty{p}"], pl.Int64),
        pl.Series("rows_kept", sel_rows, pl.Int64),
        pl.Series("rows_duplicate", nd, pl.Int64),
        pl.Series("rows_excluded", nx, pl.Int64),
    )
    h = hashlib.sha256()
    excl = table.digest if table is not None else ""
    h.update(f"{base.fingerprint}\ndedupe\t{key}\texclude={excl}\n".encode())
    h.update(np.ascontiguousarray(frame["rows_selected"].to_numpy()).tobytes())
    h.update(np.ascontiguousarray(frame["tokens_selected"].to_numpy()).tobytes())
    # Duplicates as (row group, stored row, kept part, kept row group, kept stored row) need the
    # base's stream rows to map stream positions back: done lazily by dropped_of.
    return DedupedIndex(
        frame=frame,
        column=base.column,
        dtype=base.dtype,
        fingerprint=h.hexdigest(),
        source=base.source,
        _files=base._files,
        base=base,
        dedupe=key,
        exclude=excl,
        exclude_path="" if table is None else table.path,
        bits=bits,
        duplicates=np.asarray(cached[f"dups{p}"], np.int64).reshape(-1, 5),
        order=list(names),
    )


def _stored(ix: RowGroupIndex, rg: int, pos: int) -> int:
    stream = ix.selected_rows(rg)
    return pos if stream is None else int(stream[pos])


def dropped_of(ix: DedupedIndex, rg: int, row: int) -> tuple[str, tuple[str, int, int] | None] | None:
    """Why stored row ``row`` of row group ``rg`` was dropped: ``("duplicate", (source, row group, row))``
    naming the document kept (its source's name, ``""`` for one dataset; its row group and row there),
    ``("excluded", None)``, or None where it is kept or ``where=`` left it out."""
    assert ix.base is not None
    stream = ix.base.selected_rows(rg)
    if stream is None:
        pos = row
    else:
        i = int(np.searchsorted(stream, row))
        if i >= len(stream) or int(stream[i]) != row:
            return None
        pos = i
    kept = ix.selected_rows(rg)
    j = int(np.searchsorted(kept, row))
    if j < len(kept) and int(kept[j]) == row:
        return None
    d = ix.duplicates
    hit = d[(d[:, 0] == rg) & (d[:, 1] == pos)]
    if len(hit):
        kp, krg, kpos = (int(x) for x in hit[0, 2:])
        return "duplicate", (ix.order[kp] if ix.order else "", krg, kpos)
    return "excluded", None


def base_of(ix: RowGroupIndex) -> RowGroupIndex:
    """The index a deduplication was made over (itself where none was)."""
    if isinstance(ix, DedupedIndex) and ix.base is not None:
        return ix.base
    if isinstance(ix, MixtureIndex) and any(isinstance(p, DedupedIndex) for p in ix.parts):
        return MixtureIndex(ix.specs, [p.base if isinstance(p, DedupedIndex) and p.base is not None else p
                                       for p in ix.parts], given=ix.given)  # fmt: skip
    return ix


def dedupe_table(ix: RowGroupIndex) -> pl.DataFrame:
    """Per source (one row for one dataset): rows, rows_kept, rows_duplicate, rows_excluded, tokens, tokens_kept."""
    f = ix.frame
    base = base_of(ix).frame
    src = f["source"] if "source" in f.columns else pl.Series("source", [""] * f.height)
    before = with_selected(base)["tokens_selected"]
    g = pl.DataFrame(
        {
            "source": src,
            "rows": f["rows"],
            "rows_kept": f["rows_kept"] if "rows_kept" in f.columns else f["rows"],
            "rows_duplicate": f["rows_duplicate"] if "rows_duplicate" in f.columns else pl.zeros(f.height, pl.Int64),
            "rows_excluded": f["rows_excluded"] if "rows_excluded" in f.columns else pl.zeros(f.height, pl.Int64),
            "tokens": before,
            "tokens_kept": f["tokens_selected"],
        }
    )
    return g.group_by("source", maintain_order=True).sum()


def split_targets(ix: RowGroupIndex, rgs: I64, ordinals: I64) -> tuple[I64, I64, pl.DataFrame]:
    """Documents given over :func:`base_of`'s stream: those kept (their ordinals in ``ix``'s stream),
    and a frame of those dropped: source, file, row_group, row, dropped (``duplicate`` or ``excluded``)
    and the kept document's kept_source, kept_file, kept_row_group, kept_row."""
    parts = list(ix.parts) if isinstance(ix, MixtureIndex) else [ix]
    names = list(ix.names) if isinstance(ix, MixtureIndex) else [""]
    starts = np.concatenate([[0], np.cumsum([p.row_groups for p in parts])]).astype(np.int64)
    keep_rg: list[int] = []
    keep_doc: list[int] = []
    rows: list[dict[str, Any]] = []
    for g, o in zip(np.asarray(rgs).tolist(), np.asarray(ordinals).tolist(), strict=True):
        i = int(np.searchsorted(starts, g, side="right")) - 1
        part, local = parts[i], g - int(starts[i])
        if not isinstance(part, DedupedIndex) or part.base is None:
            keep_rg.append(g)
            keep_doc.append(o)
            continue
        pos = part.stream_positions(local)
        j = int(np.searchsorted(pos, o))
        if j < len(pos) and int(pos[j]) == o:
            keep_rg.append(g)
            keep_doc.append(j)
            continue
        row = _stored(part.base, local, o)
        why = dropped_of(part, local, row)
        assert why is not None
        entry: dict[str, Any] = {
            "source": names[i] or None,
            "file": part.frame["file"][local],
            "row_group": int(part.frame["row_group"][local]),
            "row": row,
            "dropped": why[0],
            "kept_source": None,
            "kept_file": None,
            "kept_row_group": None,
            "kept_row": None,
        }
        if why[1] is not None:
            kname, krg, kpos = why[1]
            kpart = parts[names.index(kname)] if kname else part
            kbase = kpart.base if isinstance(kpart, DedupedIndex) and kpart.base is not None else kpart
            entry.update(
                kept_source=kname or None,
                kept_file=kpart.frame["file"][krg],
                kept_row_group=int(kpart.frame["row_group"][krg]),
                kept_row=_stored(kbase, krg, kpos),
            )
        rows.append(entry)
    schema = {
        "source": pl.String, "file": pl.String, "row_group": pl.Int64, "row": pl.Int64, "dropped": pl.String,
        "kept_source": pl.String, "kept_file": pl.String, "kept_row_group": pl.Int64, "kept_row": pl.Int64,
    }  # fmt: skip
    return np.array(keep_rg, np.int64), np.array(keep_doc, np.int64), pl.DataFrame(rows, schema=schema)


# -- Ray --------------------------------------------------------------------------------


def _ray_chunk(
    source: Any,
    column: str,
    storage_options: Mapping[str, Any] | None,
    key: str,
    exclude: Any,
    first: int,
    end: int,
) -> tuple[int, Hashed]:
    """A Ray task: phase 1 of one chunk, on whichever machine runs it."""
    from planner.catalog.dataset import index

    ix = index(source, column=column, storage_options=storage_options)
    table = load_exclusion(exclude, storage_options) if exclude is not None else None
    ex = None if table is None else table.check(_schema(ix), ix.source, ix.column)
    return first, _Pass(parts=[ix], key=key, exclusions=[ex]).hash_chunk(0, first, end)


def dedupe_on_ray(
    ix: Index,
    *,
    dedupe: str | None = None,
    exclude: Any = None,
    source: Any,
    storage_options: Mapping[str, Any] | None = None,
    address: str | None = None,
    progress: bool | None = True,
) -> int:
    """Phase 1 of ``ix``'s pass as Ray tasks (one per chunk not cached); returns the chunks run.

    ``plitzer index DATA --dedupe tokens --engine ray``: the keys come back to this
    process, which writes them into its cache; a :func:`dedupe_index` that follows (or a
    job whose ranks share this cache folder) then resolves the first occurrences from it.
    """
    if type(ix) is not Index:
        msg = (
            f"the Ray engine keys a dataset of token columns, not a {type(ix).__name__}: run the pass on this "
            "machine (--engine local), or tokenize first"
        )
        raise ConfigError(msg)
    import ray

    key = dedupe or ""
    if key:
        _check_key(ix, key, "")
    table = load_exclusion(exclude, storage_options) if exclude is not None else None
    excl = table.digest if table is not None else ""
    cols = ",".join(table.columns) if table is not None else ""
    if table is not None:
        table.check(_schema(ix), ix.source, ix.column)
    chunks = _chunks([ix])
    paths = [_chunk_path(ix, c, key, excl, cols) for c in chunks]
    todo = [i for i, c in enumerate(chunks) if _load(paths[i], _HASHED) is None]
    if not todo:
        return 0
    if not ray.is_initialized():
        ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
    task = ray.remote(_ray_chunk)
    by_first = {chunks[i][1]: i for i in todo}
    refs = [task.remote(source, ix.column, storage_options, key, exclude, chunks[i][1], chunks[i][2]) for i in todo]
    from tqdm import tqdm

    from planner.progress import progress_enabled

    hide = not progress_enabled(progress, len(refs))
    with tqdm(total=len(refs), desc="keying rows (ray)", unit="chunk", disable=hide, leave=False) as bar:
        while refs:
            ready, refs = ray.wait(refs, num_returns=1)
            first, h = ray.get(ready[0])
            _save(paths[by_first[first]], h)
            bar.update(1)
    return len(todo)
