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
it owns and the ranks exchange the duplicates (:func:`resolve_shared`), so no rank holds
every key. Then each row group with a dropped row is read once more for its token
lengths (its kept tokens), where phase 1 did not keep them. The result is cached whole, keyed
by every file's identity, the sources' selections and the key (and table digest), so
a second run reads no data.
"""

from __future__ import annotations

import functools
import hashlib
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import polars as pl
import pyarrow as pa
from numpy.typing import NDArray

from planner.arraytypes import I64
from planner.catalog.datasetindex import Index
from planner.catalog.rowgroups import Capabilities, RowGroupIndex, stream_counts, with_selected
from planner.errors import ConfigError, DataError
from planner.mixing.mixindex import MixtureIndex
from planner.parameters import Selection
from planner.stores.cache import cache_dir, digest
from plitzer.readpath.read import read_chunk
from plitzer.selection import firsts
from plitzer.selection.exclude import Exclusion, load_exclusion
from plitzer.selection.firsts import Exchange, Resolved, Spill, resolve, resolve_shared, resolve_spilled
from plitzer.selection.held import CachedLengths, Held
from plitzer.selection.keying import (
    KeyPass,
    arrow_schema,
    check_key,
    chunk_path,
    key_chunks,
    length_columns,
    load_arrays,
    run_chunks,
    save_arrays,
    source_identity,
)
from plitzer.selection.result import Counted, dropped_tokens, result_arrays
from plitzer.selection.rowbits import RowBits
from plitzer.selection.select import kept_rows

__all__ = ["DEDUPE_DEFAULTS", "DedupedIndex", "Duplicates", "dedupe_index"]

U8 = NDArray[np.uint8]
_FORMAT = "2"  # the whole result's cache entries (each chunk's: plitzer.selection.keying)

DEDUPE_DEFAULTS: dict[str, Any] = {"dedupe": "", "exclude": ""}
"""The checkpoint fields of a source neither deduplicated nor excluded from."""


# -- the index of the rows kept ----------------------------------------------------


@dataclass(frozen=True)
class Duplicates:
    """Where a part's table of dropped duplicates is: the pass's cached result (``path``, array ``name``), or
    ``held`` in memory where the cache could not keep it.

    Only ``locate`` and the audit ask which document was kept for a dropped one; a corpus of
    10^9 documents with 10 % copies would otherwise hold 4 GB of it in every process.
    """

    path: Any = None
    name: str = ""
    held: I64 | None = None

    def load(self) -> I64:
        if self.held is not None:
            return self.held
        got = load_arrays(self.path, [self.name])
        if got is None:
            msg = (
                f"the deduplication pass's result {self.path} is no longer in the cache (PLITZER_CACHE cleared "
                "meanwhile?): build the plan or loader again, which runs the pass again, to ask which document "
                "was kept"
            )
            raise DataError(msg)
        return np.asarray(got[self.name], np.int64).reshape(-1, 5)


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
    bits: RowBits = field(default_factory=lambda: RowBits.of([]), repr=False)
    dropped: Duplicates = field(default_factory=lambda: Duplicates(held=np.zeros((0, 5), np.int64)), repr=False)
    order: list[str] = field(default_factory=list)
    """The sources' names in source order (a mixture's; ``[""]`` for one dataset): ``duplicates``' kept part."""
    length_column: str = ""
    """The column the pass took the dropped rows' token counts from (``length_column=``), if any."""

    @property
    def capabilities(self) -> Capabilities:
        assert self.base is not None
        c = self.base.capabilities
        return Capabilities("deduplication", other_columns=c.other_columns, tokenizes=c.tokenizes, deduplicated=True)

    def unwrapped(self) -> Index:
        """The index the pass was made over."""
        return self if self.base is None else self.base

    def config_fields(self) -> dict[str, Any]:
        assert self.base is not None
        out = dict(self.base.config_fields())
        if self.dedupe:
            out["dedupe"] = self.dedupe
        if self.exclude:
            out["exclude"] = self.exclude
        return out

    @functools.cached_property
    def duplicates(self) -> I64:
        """Each dropped duplicate as ``(row group, row, kept source position, kept row group, kept row)``.

        Read from the pass's cache entry when first asked (locate, the audit), not held by every
        loader: 40 bytes a dropped row (:class:`Duplicates`).
        """
        return self.dropped.load()

    def length_source(self, given: str | None) -> str | None:
        assert self.base is not None
        fn = getattr(self.base, "length_source", None)
        return fn(given) if fn is not None else given

    def selected_rows(self, row_group: int) -> I64:
        return self.bits.rows(row_group, int(self.frame["rows"][row_group]))

    def stream_positions(self, rg: int) -> I64:
        """The kept rows' positions among ``base``'s stream rows of ``rg``."""
        assert self.base is not None
        kept = self.selected_rows(rg)
        stream = self.base.selected_rows(rg)
        return kept if stream is None else np.searchsorted(stream, kept).astype(np.int64)

    def read_tokens(self, rg: int) -> pa.Array:
        assert self.base is not None
        arr = read_chunk(self.base, rg)
        return kept_rows(self, rg, arr, self.stream_positions, self.length_column, ("kept", "deduplication", "dedupe"))


# -- the whole pass ------------------------------------------------------------------


def _parts_of(ix: RowGroupIndex, order: Sequence[str] | None) -> tuple[list[Index], list[int]]:
    """The sources' indexes in source order, and each one's position in ``ix``'s own (name) order."""
    if ix.mixed:
        names = list(ix.names)
        given = [n for n in (order or cast("MixtureIndex", ix).given) if n in names]
        given += [n for n in names if n not in given]
        at = [names.index(n) for n in given]
        return [ix.parts[i] for i in at], at
    return [cast("Index", ix)], [0]


def _result_path(parts: Sequence[Index], key: str, excl: str, cols: str, lengths: Sequence[str | None]) -> Any:
    files = []
    for ix in parts:
        files.append(source_identity(ix))
        files.extend(f"{f.location}\t{f.size}\t{f.version}" for f in ix.files)
    lc = [f"length_columns={lengths}"] if any(lengths) else []  # none: the entries of 0.5 before them
    k = digest(_FORMAT, key, excl, cols, len(parts), *files, *lc)
    return cache_dir() / "dedupe" / f"{k}.npz"


def dedupe_index(
    ix: RowGroupIndex,
    selection: Selection | str,
    *,
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
    selection : planner.parameters.Selection or str
        Its ``dedupe`` (optional): ``"tokens"`` (equal token lists) or a column (equal
        non-null values); its ``exclude`` (optional): a Parquet or CSV table whose columns
        are dataset columns (local or any store). A str is the key alone
        (``Selection(dedupe=that)``). Its ``where`` and ``length_column`` are the
        selection pass's (:func:`plitzer.selection.select.select_index`), not read here.
    rank, world, exchange
        This rank's share of phase 1, and how the ranks share it (see the module).

    Examples
    --------
    >>> import plitzer, tempfile, pyarrow as pa, pyarrow.parquet as pq
    >>> d = tempfile.mkdtemp()
    >>> docs = pa.array([[1, 2], [3], [1, 2], [4, 5, 6]], pa.list_(pa.int32()))
    >>> pq.write_table(pa.table({"tokens": docs}), f"{d}/a.parquet")
    >>> dd = dedupe_index(plitzer.index(d), "tokens")
    >>> dd.frame.select("rows", "rows_kept", "rows_duplicate", "tokens_selected").row(0)
    (4, 3, 1, 6)
    """
    sel = selection if isinstance(selection, Selection) else Selection(dedupe=selection)
    dedupe, exclude = _check_dedupe(sel.dedupe), sel.exclude
    if not dedupe and exclude is None:
        return ix
    key = dedupe or ""
    parts, at = _parts_of(ix, order)
    names = [ix.names[i] for i in at]
    _check_parts(parts, names, key)
    table, exclusions, excl_digest, cols = _exclusions(exclude, storage_options, parts)
    lengths = length_columns(ix, parts, at, sel.length_column, key)
    result = _result_path(parts, key, excl_digest, cols, lengths)
    dropped = [Duplicates(result, f"dups{p}") for p in range(len(parts))]
    cached = load_arrays(result, [f"{n}{p}" for p in range(len(parts)) for n in _RESULT])
    if cached is None:
        ps = KeyPass(parts=parts, key=key, exclusions=exclusions, length_columns=lengths)
        run = _Run.of(ps, excl_digest, cols, threads or os.cpu_count() or 2, progress, rank, world)
        res, counted = _in_job(run, exchange) if exchange is not None and world > 1 else _alone(run)
        cached = result_arrays(parts, res, counted)
        dropped = _saved(result, cached, dropped)
    out = [_build(part, cached, p, key, table, names, lengths[p], dropped[p]) for p, part in enumerate(parts)]
    return _deduped(ix, out, at, key, exclude)


def _saved(result: Path, arrays: dict[str, np.ndarray], dropped: list[Duplicates]) -> list[Duplicates]:
    """Keep the pass's ``arrays`` at ``result``; where the cache cannot, the parts' dropped tables held in memory."""
    save_arrays(result, arrays, compress=True)
    if result.exists():
        return dropped
    return [Duplicates(held=np.asarray(arrays[f"dups{p}"], np.int64).reshape(-1, 5)) for p in range(len(dropped))]


def _deduped(ix: RowGroupIndex, out: list[DedupedIndex], at: list[int], key: str, exclude: Any) -> RowGroupIndex:
    """The deduplicated parts in ``ix``'s place: the one part, or a mixture of them (each keeps a token)."""
    if not ix.mixed:
        return _nonempty(out[0], key, exclude, "")
    mix = cast("MixtureIndex", ix)
    by_pos = dict(zip(at, out, strict=True))
    new_parts = [_nonempty(by_pos[i], key, exclude, mix.names[i]) for i in range(len(mix.parts))]
    return MixtureIndex(mix.specs, new_parts, given=mix.given)


_RESULT = ("rg_dup", "rg_excl", "pos_dup", "pos_excl", "tok", "empty")
"""The arrays of each part in the pass's result read to build it (its table of duplicates is read when asked)."""


def _check_dedupe(dedupe: Any) -> str | None:
    """``dedupe=`` as given, refused unless unset or a non-empty name."""
    if dedupe is not None and (not isinstance(dedupe, str) or not dedupe):
        msg = f"dedupe={dedupe!r} must be 'tokens' (equal token lists) or the name of a column (e.g. 'url')"
        raise ConfigError(msg)
    return dedupe


def _exclusions(
    exclude: Any, storage_options: Mapping[str, Any] | None, parts: Sequence[Index]
) -> tuple[Exclusion | None, list[Exclusion | None], str, str]:
    """The ``exclude=`` table (None: none), as each part's types, its digest and its columns (both "" for none)."""
    table = load_exclusion(exclude, storage_options) if exclude is not None else None
    exclusions = [None if table is None else table.check(arrow_schema(p), p.source, _token_column(p)) for p in parts]
    excl_digest = table.digest if table is not None else ""
    cols = ",".join(table.columns) if table is not None else ""
    return table, exclusions, excl_digest, cols


def _check_parts(parts: Sequence[Index], names: Sequence[str], key: str) -> None:
    """Refuse a part deduplicated already, or one the key cannot be read from (``check_key``)."""
    for part, name in zip(parts, names, strict=True):
        if part.capabilities.deduplicated:
            msg = "the index is deduplicated already; pass the dataset's own index (or its path)"
            raise ConfigError(msg)
        if key:
            check_key(part, key, name)


@dataclass(frozen=True)
class _Run:
    """The pass as this rank runs it: phase 1's keying, its chunks and their cache entries, threads, rank."""

    ps: KeyPass
    chunks: list[tuple[int, int, int]]
    paths: list[Path]
    workers: int
    progress: bool | None
    rank: int
    world: int

    @classmethod
    def of(cls, ps: KeyPass, excl: str, cols: str, workers: int, progress: bool | None, rank: int, world: int) -> _Run:
        """The run of ``ps``: its chunks, each with its cache entry (keyed by the table's digest and columns)."""
        chunks = key_chunks(ps.parts)
        lengths = ps.length_columns
        paths = [chunk_path(ps.parts[p], (p, a, b), ps.key, excl, cols, lengths[p]) for p, a, b in chunks]
        return cls(ps, chunks, paths, workers, progress, rank, world)


def _in_job(run: _Run, exchange: Exchange) -> tuple[Resolved, Counted]:
    """Phase 1 on this rank's share of the chunks, phase 2 and the dropped tokens shared over ``exchange``."""
    parts, chunks, rank, world, n = run.ps.parts, run.chunks, run.rank, run.world, len(run.chunks)
    mine = [c for c in range(n) if c * world // n == rank]
    try:
        done = run_chunks(run.ps, chunks, mine, run.paths, shared=False, threads=run.workers, progress=run.progress)
    except Exception as e:  # sent to every rank, raised there: no rank waits in the next exchange
        resolve_shared(parts, chunks, e, exchange, rank, world)
        raise
    res = resolve_shared(parts, chunks, done, exchange, rank, world)
    # Each rank counts the dropped tokens of its own chunks' row groups; one more exchange shares them.
    counted = dropped_tokens(parts, chunks, res, run.workers, done.get, mine)
    del done
    shared = exchange({rank: {"t": _counted_rows(counted)}})
    for part in shared:
        for h in part.values():
            p_, rg_, t_, e_ = np.asarray(h["t"], np.int64).reshape(-1, 4).T
            for p in np.unique(p_).tolist():
                of = p_ == p
                counted[p][0][rg_[of]], counted[p][1][rg_[of]] = t_[of], e_[of]
    return res, counted


def _alone(run: _Run) -> tuple[Resolved, Counted]:
    """Phases 1 and 2 in this process (other ranks, if any, share its chunks' cache), in memory or spilled."""
    parts, chunks, n = run.ps.parts, run.chunks, len(run.chunks)
    start = run.rank * n // run.world if run.world > 1 else 0
    seq = [(start + i) % n for i in range(n)]
    rows = sum(int(stream_counts(ix.frame)[1].sum()) for ix in parts)
    shared = run.world > 1
    if rows <= firsts.SPILL_KEYS:  # read when called: a test or benchmark lowers it
        held = Held(n, sum(ix.row_groups for ix in parts), rows)  # a few arrays, not a dict of arrays a chunk
        run_chunks(
            run.ps, chunks, seq, run.paths, shared=shared, threads=run.workers, progress=run.progress, keep=held.keep
        )
        res = resolve(parts, chunks, held)
        return res, dropped_tokens(parts, chunks, res, run.workers, held.get, None)
    # More keys than memory should hold: spilled by bucket, resolved one bucket at a time.
    with tempfile.TemporaryDirectory(prefix="plitzer-dedupe-") as tmp:
        spill = Spill(Path(tmp), -(-rows // firsts.SPILL_KEYS) * 4)
        meta = run_chunks(
            run.ps, chunks, seq, run.paths, shared=shared, threads=run.workers, progress=run.progress, keep=spill.keep
        )
        res = resolve_spilled(parts, chunks, meta, spill)
    return res, dropped_tokens(parts, chunks, res, run.workers, CachedLengths(run.paths), None)


def _counted_rows(counted: Counted) -> I64:
    """``(part, row group, tokens, empty documents)`` of each row group whose dropped rows this rank counted."""
    rows = []
    for p, (tok, empty) in enumerate(counted):
        rgs = np.flatnonzero((tok != 0) | (empty != 0))
        rows.append(np.stack([np.full(len(rgs), p, np.int64), rgs, tok[rgs], empty[rgs]], axis=1))
    return np.concatenate([np.zeros((0, 4), np.int64), *rows]).astype(np.int64)


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


def _build(
    base: Index,
    cached: Mapping[str, np.ndarray],
    p: int,
    key: str,
    table: Exclusion | None,
    names: list[str],
    length_column: str | None,
    dropped: Duplicates,
) -> DedupedIndex:
    f = with_selected(base.frame)
    nd, nx = cached[f"rg_dup{p}"], cached[f"rg_excl{p}"]
    dups, excls = cached[f"pos_dup{p}"], cached[f"pos_excl{p}"]
    od, ox = np.concatenate([[0], np.cumsum(nd)]), np.concatenate([[0], np.cumsum(nx)])
    rows = f["rows"].to_numpy().astype(np.int64)
    # Written into one array (RowBits), not a list of one array a row group (about 130 B each).
    bits = RowBits.packed(np.zeros(int(((rows + 7) // 8).sum()), np.uint8), rows)
    for rg in range(base.row_groups):
        stream = base.selected_rows(rg)
        keep_stream = np.arange(int(rows[rg]), dtype=np.int64) if stream is None else stream
        gone = np.concatenate([dups[od[rg] : od[rg + 1]], excls[ox[rg] : ox[rg + 1]]]).astype(np.int64)
        mask = np.zeros(int(rows[rg]), bool)
        mask[keep_stream] = True
        if len(gone):
            mask[keep_stream[gone]] = False
        bits[rg][:] = np.packbits(mask)
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
    return DedupedIndex.over(
        base,
        frame=frame,
        fingerprint=h.hexdigest(),
        base=base,
        dedupe=key,
        exclude=excl,
        exclude_path="" if table is None else table.path,
        bits=bits,
        dropped=dropped,
        order=list(names),
        length_column=length_column or "",
    )
