"""Phase 1 of the deduplication pass (``dedupe=``, ``exclude=``, SPEC section 14): key every row group.

Per chunk of :data:`~plitzer.selection.evaluate.CHUNK` row groups of a file, split between
ranks: read the key's column only (the token column for ``"tokens"``; the table's columns
for an exclusion), each through a footer made for the chunk alone
(:class:`plitzer.readpath.runs.ColumnRun`: the file's footer parsed once for every column the
pass reads, none kept), key each row with 128 bits (:mod:`plitzer.selection.keys`) and match the
exclusion table. A chunk's state (:data:`Hashed`) is bytes a row group plus 24 bytes a keyed
row, cached per chunk (:func:`chunk_path`), keyed by the file's identity, the source's, the
key and the table's digest; :func:`run_chunks` runs a list of chunks from the cache or on a
thread pool, :func:`dedupe_on_ray` as Ray tasks. Phase 2 is :mod:`plitzer.selection.firsts`,
the whole pass :mod:`plitzer.selection.dedupe`.
"""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from planner.arraytypes import I64
from planner.catalog.datasetindex import Index
from planner.catalog.rowgroups import PARQUET, RowGroupIndex
from planner.errors import ConfigError, DataError, SelectionError
from planner.mixing.mixindex import MixtureIndex
from planner.parameters import Selection
from planner.stores.cache import cache_dir, digest, discard, read_entry, write_entry
from plitzer.readpath.rayrun import run_tasks
from plitzer.readpath.read import list_lengths, read_chunk
from plitzer.readpath.runs import ColumnRun
from plitzer.selection.evaluate import CHUNK, SelectionPass
from plitzer.selection.exclude import Exclusion, load_exclusion
from plitzer.selection.keys import Keys, hash_array, valid_rows
from plitzer.selection.predicate import check_length_column

__all__ = [
    "HASHED",
    "TOKENS",
    "Hashed",
    "KeyPass",
    "arrow_schema",
    "check_key",
    "chunk_path",
    "dedupe_on_ray",
    "key_chunks",
    "length_columns",
    "load_arrays",
    "read_column",
    "run_chunks",
    "save_arrays",
    "source_identity",
    "stream_tokens",
    "token_run",
]

U8 = NDArray[np.uint8]
_FORMAT = "2"  # 2: phase 1 keeps the token lengths of "tokens" keys
TOKENS = "tokens"

Hashed = dict[str, np.ndarray]
"""One chunk's phase 1: ``n`` stream rows, ``m`` rows keyed and ``x`` rows excluded a row group;
``pos`` (the keyed rows' stream positions), ``keys`` (``(sum m, 2)`` uint64), ``excl`` (stream
positions of the excluded rows), concatenated over the chunk's row groups."""


# -- phase 1: keys a row group -------------------------------------------------------


Runs = dict[str, ColumnRun]
"""The columns of one chunk being read, by name (:meth:`KeyPass.hash_chunk`)."""


def read_column(ix: Index, rg: int, column: str, runs: Runs) -> pa.Array:
    """Row group ``rg``'s ``column`` (every stored row): one ranged read of its chunk, through its run.

    Through the job index alone where it carries the column, else the file's footer's chunk numbers.
    """
    arr = runs[column].read(rg)
    if arr is None:
        where = ix.location(int(ix.frame["file_index"][rg]), int(ix.frame["row_group"][rg]))
        msg = f"{where}: no column {column!r}; every file must have the column dedupe= or exclude= reads"
        raise SelectionError(msg, predicate="", column=column)
    return arr


def token_run(ix: Index, first: int, end: int) -> ColumnRun | None:
    """The token column of row groups ``[first, end)`` as one run; None for a text source (tokenized as read).

    A dataset's index, or a selection of one (whose stream rows :func:`stream_tokens` takes).
    """
    return ColumnRun(ix, first, end, ix.column) if ix.capabilities.column_runs else None


def stream_tokens(ix: Index, rg: int, run: ColumnRun | None) -> pa.Array:
    """Row group ``rg``'s stream rows' tokens, as ``read_chunk`` gives them: through ``run`` (:func:`token_run`)."""
    if run is None:
        return read_chunk(ix, rg)  # a text source tokenizes here
    arr = run.tokens(rg)
    stream = ix.selected_rows(rg)
    return arr if stream is None or len(stream) == len(arr) else arr.take(pa.array(stream, pa.int64()))


@dataclass(frozen=True)
class KeyPass:
    parts: list[Index]  # in source order
    key: str  # "" (none), "tokens", or a column
    exclusions: list[Exclusion | None]  # each part's, cast to its types
    length_columns: Sequence[str | None] = ()
    """Each part's column of the rows' token counts (``length_column=``), or none: read beside the key, so that
    phase 2 need not decode the token column for the dropped rows' tokens (a ``"tokens"`` key decodes it anyway)."""

    def length_column(self, p: int) -> str | None:
        """Part ``p``'s length column, where phase 1 reads it (never beside a ``"tokens"`` key)."""
        return self.length_columns[p] if self.length_columns and self.key != TOKENS else None

    def runs(self, p: int, first: int, end: int) -> tuple[Runs, ColumnRun | None]:
        """What phase 1 reads of part ``p``'s rows ``[first, end)``: the exclusion's, key's and length columns; the
        tokens."""
        ix = self.parts[p]
        ex = self.exclusions[p]
        lc = self.length_column(p)
        names = [
            *(ex.columns if ex is not None else ()),
            *([self.key] if self.key not in ("", TOKENS) else []),
            *([lc] if lc is not None else []),
        ]
        runs = {c: ColumnRun(ix, first, end, c, names) for c in dict.fromkeys(names)}
        return runs, token_run(ix, first, end) if self.key == TOKENS else None

    def hash_rg(
        self, p: int, rg: int, runs: tuple[Runs, ColumnRun | None] | None = None
    ) -> tuple[int, I64, Keys, I64, NDArray[np.int32]]:
        """Row group ``rg`` of part ``p``: its stream rows, the keyed rows' positions and keys, the excluded rows,
        and every stream row's token count where it comes cheap: a ``"tokens"`` key decodes them anyway, a length
        column (checked against the footer's count) holds them.

        ``runs``: its chunk's (:meth:`runs`); default: a run of this row group alone."""
        ix = self.parts[p]
        reads, tokens = self.runs(p, rg, rg + 1) if runs is None else runs
        rows = int(ix.frame["rows"][rg])
        stream = ix.selected_rows(rg)
        n = rows if stream is None else len(stream)
        lengths = np.zeros(0, np.int32)
        lc = self.length_column(p)
        if lc is not None and n:
            full = SelectionPass(ix=ix, where="", columns=[], length_column=lc).lengths(rg, reads)
            lengths = (full if stream is None else full[stream]).astype(np.int32)
        excl = np.zeros(n, bool)
        ex = self.exclusions[p]
        if ex is not None and n:
            cols = {}
            for c in ex.columns:
                arr = read_column(ix, rg, c, reads)
                cols[c] = arr if stream is None else arr.take(pa.array(stream, pa.int64()))
            excl = ex.match(cols)
        if not self.key or n == 0:
            return n, np.zeros(0, np.int64), np.zeros((0, 2), np.uint64), np.flatnonzero(excl).astype(np.int64), lengths
        if self.key == TOKENS:
            arr = stream_tokens(ix, rg, tokens)
            ok = np.ones(n, bool)
        else:
            arr = read_column(ix, rg, self.key, reads)
            if stream is not None:
                arr = arr.take(pa.array(stream, pa.int64()))
            ok = valid_rows(arr)
        if len(arr) != n:
            where = ix.location(int(ix.frame["file_index"][rg]), int(ix.frame["row_group"][rg]))
            msg = f"{where}: decoded {len(arr)} rows of the key, expected {n}; the file is damaged"
            raise DataError(msg)
        keys = hash_array(arr, f"dedupe={self.key!r}")
        take = np.flatnonzero(ok & ~excl).astype(np.int64)
        if self.key == TOKENS:
            lengths = list_lengths(arr).astype(np.int32)
        return n, take, keys[take], np.flatnonzero(excl).astype(np.int64), lengths

    def hash_chunk(self, p: int, first: int, end: int) -> Hashed:
        """Phase 1 of part ``p``'s rows ``[first, end)`` (row groups of one file): one run a column."""
        runs = self.runs(p, first, end)
        return _pack([self.hash_rg(p, rg, runs) for rg in range(first, end)])


def _pack(got: Sequence[tuple[int, I64, Keys, I64, NDArray[np.int32]]]) -> Hashed:
    """A chunk's :data:`Hashed` from its row groups' :meth:`KeyPass.hash_rg`."""
    return {
        "n": np.array([g[0] for g in got], np.int64),
        "m": np.array([len(g[1]) for g in got], np.int64),
        "x": np.array([len(g[3]) for g in got], np.int64),
        "pos": np.concatenate([g[1] for g in got]).astype(np.int32) if got else np.zeros(0, np.int32),
        "keys": np.concatenate([g[2] for g in got]).astype(np.uint64) if got else np.zeros((0, 2), np.uint64),
        "excl": np.concatenate([g[3] for g in got]).astype(np.int64) if got else np.zeros(0, np.int64),
        "len": np.concatenate([g[4] for g in got]).astype(np.int32) if got else np.zeros(0, np.int32),
    }


def key_chunks(parts: Sequence[Index]) -> list[tuple[int, int, int]]:
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


def source_identity(ix: Index) -> str:
    """What decides a part's stream rows and keys: its files, its kind's fields, its fingerprint."""
    cfg = json.dumps(ix.config_fields(), sort_keys=True, default=str)
    return f"{ix.fingerprint}\t{ix.column}\t{cfg}"


def chunk_path(
    ix: Index, chunk: tuple[int, int, int], key: str, excl: str, cols: str, length_column: str | None = None
) -> Any:
    """Where phase 1 of ``chunk`` is cached: by the file's identity, the key, the exclusion and the length column."""
    _, a, b = chunk
    fi = int(ix.frame["file_index"][a])
    st = ix.file(fi)
    g0, g1 = int(ix.frame["row_group"][a]), int(ix.frame["row_group"][b - 1])
    lc = [f"length_column={length_column}"] if length_column else []  # none: the entries of 0.5 before it
    k = digest(_FORMAT, st.location, st.size, st.version, source_identity(ix), key, excl, cols, g0, g1, *lc)
    return cache_dir() / "dedupe" / "keys" / f"{k}.npz"


def save_arrays(path: Any, arrays: Mapping[str, np.ndarray], *, compress: bool = False) -> None:
    """Keep ``arrays`` at ``path`` (``np.load`` reads them back, compressed or not).

    ``compress``: for a large entry (a whole pass's result), whose copies on the way to the
    file (the archive, the cache's header and checksum) were the pass's peak uncompressed.
    """
    buf = io.BytesIO()
    (np.savez_compressed if compress else np.savez)(buf, **dict(arrays))  # type: ignore[arg-type]
    write_entry(path, buf.getbuffer())


def load_arrays(path: Any, names: Sequence[str]) -> dict[str, np.ndarray] | None:
    raw = read_entry(path)
    if raw is None:
        return None
    try:
        with np.load(io.BytesIO(raw), allow_pickle=False) as z:
            return {k: np.asarray(z[k]) for k in names}
    except (OSError, ValueError, KeyError) as e:
        discard(path, f"unreadable: {type(e).__name__}")
        return None


HASHED = ("n", "m", "x", "pos", "keys", "excl", "len")


def run_chunks(
    ps: KeyPass,
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

    ``keep(c, h)``: what of chunk ``c``'s phase 1 stays in memory (:meth:`Spill.keep`), as each comes.
    """
    done: dict[int, Hashed] = {}
    for c in order:
        got = load_arrays(paths[c], HASHED)
        if got is not None and len(got["n"]) == chunks[c][2] - chunks[c][1]:
            done[c] = got if keep is None else keep(c, got)
    todo = [c for c in order if c not in done]
    if not todo:
        return done
    lock = threading.Lock()

    def work(c: int) -> tuple[int, Hashed]:
        if shared:
            got = load_arrays(paths[c], HASHED)
            if got is not None:
                return c, got
        p, a, b = chunks[c]
        h = ps.hash_chunk(p, a, b)
        save_arrays(paths[c], h)
        return c, h

    from concurrent.futures import ThreadPoolExecutor

    from tqdm import tqdm

    from planner.progress import progress_enabled
    from planner.threads import map_ahead

    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="plitzer-dedupe") as pool:
        bar = tqdm(
            map_ahead(pool, work, todo),
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


def arrow_schema(ix: Index) -> pa.Schema:
    """The first file's schema: the job index's where it carries it (``--columns``), else the footer's."""
    return ix.schema()


def check_key(ix: Index, key: str, name: str) -> None:
    if key == TOKENS:
        return
    schema = arrow_schema(ix)
    text = ix.config_fields().get("tokenizer")  # a text source: its text column may be the key
    allowed = [n for n in schema.names if text or n != ix.column]
    if key not in allowed:
        where = f"source {name!r} ({ix.source!r})" if name else repr(ix.source)
        msg = (
            f"dedupe={key!r} is not a column of {where}; give 'tokens' (equal token lists) or one of its "
            f"columns: {', '.join(allowed)}"
        )
        raise ConfigError(msg)


def length_columns(
    ix: RowGroupIndex, parts: Sequence[Index], at: Sequence[int], given: str | None, key: str
) -> list[str | None]:
    """Each part's column of its rows' token counts, checked: a ``where=`` selection's own, else ``length_column=``;
    none beside a ``"tokens"`` key (it decodes the token column anyway).

    A mixture's source takes the one its dict gives; a text source has none (its counts come
    from tokenizing it). With one, phase 1 reads it beside the key, and no dropped row's
    token column is decoded to count its tokens.
    """
    if key == TOKENS:
        return [None] * len(parts)
    if ix.mixed:
        specs = cast("MixtureIndex", ix).specs
        wanted = [part.length_source(specs[i].selection.length_column) for part, i in zip(parts, at, strict=True)]
    else:
        wanted = [part.length_source(given) for part in parts]
        if given is not None and wanted[0] is None:
            msg = (
                f"length_column={given!r} with a text source: its token counts come from tokenizing it; "
                "drop length_column="
            )
            raise ConfigError(msg)
    for part, lc in zip(parts, wanted, strict=True):
        if lc is not None:
            check_length_column(part, lc)
    return wanted


# -- Ray --------------------------------------------------------------------------------


def _ray_chunk(
    source: Any,
    column: str,
    storage_options: Mapping[str, Any] | None,
    key: str,
    exclude: Any,
    first: int,
    end: int,
    length_column: str | None = None,
) -> tuple[int, Hashed]:
    """A Ray task: phase 1 of one chunk, on whichever machine runs it."""
    from planner.catalog.dataset import index

    ix = index(source, column=column, storage_options=storage_options)
    table = load_exclusion(exclude, storage_options) if exclude is not None else None
    ex = None if table is None else table.check(arrow_schema(ix), ix.source, ix.column)
    ps = KeyPass(parts=[ix], key=key, exclusions=[ex], length_columns=[length_column])
    return first, ps.hash_chunk(0, first, end)


def dedupe_on_ray(
    ix: Index,
    selection: Selection | str,
    *,
    source: Any,
    storage_options: Mapping[str, Any] | None = None,
    address: str | None = None,
    progress: bool | None = True,
) -> int:
    """Phase 1 of ``ix``'s pass as Ray tasks (one per chunk not cached); returns the chunks run.

    ``plitzer index DATA --dedupe tokens --engine ray``: the keys come back to this
    process, which writes them into its cache; a :func:`dedupe_index` that follows (or a
    job whose ranks share this cache folder) then resolves the first occurrences from it.
    ``selection``: its ``dedupe`` and ``exclude``, as :func:`dedupe_index` takes them (a str
    is the key alone).
    """
    if ix.capabilities.kind != PARQUET.kind:  # each task opens the source again, as Parquet
        msg = (
            f"the Ray engine keys a Parquet dataset of token columns, not a {ix.capabilities.kind} source: run the "
            "pass on this machine (--engine local), or tokenize first"
        )
        raise ConfigError(msg)
    sel = selection if isinstance(selection, Selection) else Selection(dedupe=selection)
    key, exclude = sel.dedupe or "", sel.exclude
    if key:
        check_key(ix, key, "")
    table = load_exclusion(exclude, storage_options) if exclude is not None else None
    excl = table.digest if table is not None else ""
    cols = ",".join(table.columns) if table is not None else ""
    if table is not None:
        table.check(arrow_schema(ix), ix.source, ix.column)
    lc = length_columns(ix, [ix], [0], sel.length_column, key)[0]
    chunks = key_chunks([ix])
    paths = [chunk_path(ix, c, key, excl, cols, lc) for c in chunks]
    todo = [i for i, c in enumerate(chunks) if load_arrays(paths[i], HASHED) is None]
    by_first = {chunks[i][1]: i for i in todo}
    calls = [(source, ix.column, storage_options, key, exclude, chunks[i][1], chunks[i][2], lc) for i in todo]

    def got(result: tuple[int, Hashed]) -> None:
        save_arrays(paths[by_first[result[0]]], result[1])

    return run_tasks(_ray_chunk, calls, got, address=address, progress=progress, desc="keying rows (ray)")
