"""``plitzer tokenize``: text Parquet in, pre-tokenized Parquet out, once.

For those who convert a corpus once rather than tokenize in the loader. Each input
file ``SRC/rel/path.parquet`` becomes ``DST/rel/path.parquet`` holding one column,
``input_ids`` (``list<int32>``, or ``list<uint32>`` for vocabularies over 2**31
ids): each document's ids, then EOS (``add_eos``, the default; BOS first with
``add_bos``), exactly what the loader gives on the text (``plitzer.text.source``): null
or empty text, invalid UTF-8 and all.

Row groups: an output row group never spans two input row groups, and an input
row group of more than ``row_group_tokens`` tokens (default 1 Mi = 1,048,576) is
split, a row group closing at the first document that brings it to that many. So
a text dataset whose row groups are already that small is written with the same
row groups, and the loader gives exactly the same batches on the output as on the
text; ``row_group_tokens=0`` keeps the input's row groups whatever their size. 1 Mi
tokens is 4 MiB decoded and about 2 MiB on disk with zstd: one ranged read that
S3 serves at full speed, and windows of 64 row groups (256 MiB decoded) that
the default budget holds many times over. Pages carry CRC checksums, which the
loader verifies; the footer carries statistics, so the index counts tokens
from it alone.

Resumable: a file is written to a hidden ``.name.parquet.partial`` beside its
destination and renamed once complete, so a killed run leaves whole files and
partials; the rerun skips every whole file whose recorded source (size and
mtime), tokenizer and settings match, and rewrites the rest. The output is the same
bytes whether or not the run was interrupted.

Object stores: ``src`` and ``dst`` may each be a local path or an ``s3://``,
``gs://`` or ``az://`` URL (``storage_options`` and ``dst_storage_options``, as for
the loader; credentials from each cloud's usual variables otherwise). A remote
source is read through its :class:`planner.stores.storage.Storage`: the footer and each
row group's text column one checked, retried ranged read, pinned to the ETag or
generation it was listed with. A remote output is written to a local temporary
file and uploaded with one PUT once whole (an object store shows an object
whole or not at all, so no partial name is needed); the rerun reads its footer to
see whether it is complete. The record of a remote source holds its ETag or
generation (``source_version``) where a local one holds its mtime.

Engines: ``local`` converts files in a pool of processes (one per core, or as many
as there are files; each tokenizes its file's row groups on the cores left over);
``ray`` runs the same per-file work as Ray tasks, one a file (``ray.init(address=...)``), for
corpora one machine cannot tokenize in time. Local sources and destinations must
then be paths every worker sees (a shared filesystem); object stores need nothing
shared.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from planner.bounded import Bounded
from planner.errors import ConfigError, DataError, StorageError, one_line
from planner.parameters import DEFAULT_TEXT
from planner.stores.backends import open_storages
from planner.stores.storage import FileStat, Storage
from plitzer.readpath.rayrun import run_tasks
from plitzer.readpath.read import list_lengths
from plitzer.text.source import encode_texts, texts_of, tokens_array
from plitzer.text.tokenizer import TextTokenizer, load_tokenizer, rebuild

__all__ = ["ROW_GROUP_TOKENS", "TokenizeResult", "convert_file", "tokenize"]

ROW_GROUP_TOKENS = 1 << 20
_META = b"plitzer.tokenize"


@dataclass(frozen=True)
class TokenizeResult:
    """What a run did: files written and skipped (already complete), rows, tokens, seconds."""

    written: int
    skipped: int
    rows: int
    tokens: int
    text_bytes: int
    seconds: float


@dataclass(frozen=True)
class _Job:
    src: str  # the file's location: a path or a URL
    dst: str
    rel: str
    text_column: str
    token_column: str
    add_bos: bool
    add_eos: bool
    row_group_tokens: int
    threads: int
    size: int = 0
    version: str = ""  # mtime in ns (local), ETag or generation (object stores)
    src_root: str = ""  # the source as given, to reopen its storage in a worker
    dst_root: str = ""
    src_options: Mapping[str, Any] | None = None
    dst_options: Mapping[str, Any] | None = None


def _remote(location: str) -> bool:
    return "://" in location


# Storages opened in this process, by (root, options): a worker reopens each source once.
# A run opens two (its source and its destination); eight keep a few runs' in a process
# that runs many, and one dropped is only opened again.
_STORAGES = Bounded[tuple[str, str], Storage](8)
_STORAGES_LOCK = threading.Lock()


def _storage(root: str, options: Mapping[str, Any] | None) -> Storage:
    key = (root, json.dumps(dict(options or {}), sort_keys=True, default=repr))
    with _STORAGES_LOCK:  # held while opening: one storage a key, even with threads
        got = _STORAGES.get(key)
        if got is None:
            (got,) = open_storages(root, options)
            _STORAGES.put(key, got)
        return got


def _dst_fs(job: _Job) -> Any:
    """The fsspec filesystem of a remote destination (the store's own, with its options)."""
    return _storage(job.dst_root, job.dst_options).duckdb_filesystem()


class _StorageFile(io.RawIOBase):
    """A remote source file as pyarrow reads it: each read one checked, retried ranged read.

    By hand: fsspec's file objects neither pin the ETag or generation nor check
    lengths; the storage's read_range does both (planner.stores.storage).
    """

    def __init__(self, storage: Storage, stat: FileStat) -> None:
        super().__init__()
        self._storage, self._stat, self._pos = storage, stat, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._stat.size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, b: Any) -> int:
        n = max(0, min(len(b), self._stat.size - self._pos))
        if n:
            b[:n] = self._storage.read_range(self._stat, self._pos, n)
            self._pos += n
        return n


def _record(job: _Job, tok: TextTokenizer) -> bytes:
    source: dict[str, Any] = {"source": job.rel, "source_size": job.size}
    if _remote(job.src):
        source["source_version"] = job.version
    else:
        source["source_mtime_ns"] = int(job.version)
    return json.dumps(
        {
            **source,
            "text_column": job.text_column,
            "tokenizer": f"{tok.kind}:{tok.identity}",
            "add_bos": job.add_bos,
            "add_eos": job.add_eos,
            "row_group_tokens": job.row_group_tokens,
        },
        sort_keys=True,
    ).encode()


def _complete(job: _Job, record: bytes) -> bool:
    """Whether ``job.dst`` is a whole output of this very source and settings."""
    try:
        if _remote(job.dst):
            with _dst_fs(job).open(job.dst, "rb") as f:
                meta = pq.read_metadata(f).metadata or {}
        elif not os.path.exists(job.dst):
            return False
        else:
            meta = pq.read_metadata(job.dst).metadata or {}
    except (OSError, pa.ArrowException):  # missing (FileNotFoundError) or not whole
        return False
    return bool(meta.get(_META) == record)


def _splits(lengths: np.ndarray, limit: int) -> Iterator[tuple[int, int]]:
    """Row ranges of at most about ``limit`` tokens: a range closes at the document reaching it."""
    n = len(lengths)
    if limit <= 0 or n == 0:
        yield 0, n
        return
    start, acc = 0, 0
    for i, x in enumerate(lengths.tolist()):
        acc += x
        if acc >= limit:
            yield start, i + 1
            start, acc = i + 1, 0
    if start < n:
        yield start, n


def convert_file(job: _Job, tok: TextTokenizer) -> tuple[int, int, int]:
    """Write one output file (temp name, then rename); (rows, tokens, text bytes)."""
    bos, eos = tok.special(job.add_bos, job.add_eos)
    dtype = tok.dtype
    record = _record(job, tok)
    source: Any = job.src
    if _remote(job.src):
        stat = FileStat(name=job.rel, location=job.src, size=job.size, version=job.version)
        source = _StorageFile(_storage(job.src_root, job.src_options), stat)
    try:
        pf = pq.ParquetFile(source)
        schema_names = pf.schema_arrow.names
    except StorageError:
        raise  # the storage's own message (object, range, attempts, cause)
    except (OSError, pa.ArrowException) as e:
        msg = f"{job.src}: cannot read it as Parquet ({one_line(e)})"
        raise DataError(msg) from e
    if job.text_column not in schema_names:
        msg = f"{job.src}: no text column {job.text_column!r} (columns: {schema_names}); pass --text-column"
        raise ConfigError(msg)
    out_type = pa.list_(pa.uint32() if dtype == "uint32" else pa.int32())
    schema = pa.schema([pa.field(job.token_column, out_type)], metadata={_META: record})
    scratch = None
    if _remote(job.dst):  # written here, uploaded whole below
        scratch = Path(tempfile.mkdtemp(prefix="plitzer-tokenize-"))
        dst = scratch / Path(job.rel).name
    else:
        dst = Path(job.dst)
        dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.partial")
    try:
        out = _write(job, tok, pf, schema, tmp, bos, eos)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, dst)
        if scratch is not None:
            try:
                _dst_fs(job).put_file(str(dst), job.dst)
            except Exception as e:
                msg = f"{job.dst}: upload failed ({one_line(e)}); check dst_storage_options and the credentials"
                raise StorageError(msg) from e
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    return out


def _write(
    job: _Job, tok: TextTokenizer, pf: pq.ParquetFile, schema: pa.Schema, tmp: Path, bos: int | None, eos: int | None
) -> tuple[int, int, int]:
    dtype = tok.dtype
    rows = tokens = text_bytes = 0
    lock = threading.Lock()

    def one(g: int) -> tuple[pa.Array, int]:
        with lock:  # a ParquetFile reads one row group at a time; tokenizing runs in parallel
            col = pf.read_row_group(g, columns=[job.text_column], use_threads=False).column(0)
        arr = col.chunk(0) if col.num_chunks == 1 else pa.concat_arrays(col.chunks)
        where = f"{job.src}, row group {g}"
        return tokens_array(encode_texts(tok, texts_of(arr)), bos=bos, eos=eos, dtype=dtype, where=where), int(
            arr.nbytes
        )

    groups = [g for g in range(pf.num_row_groups) if pf.metadata.row_group(g).num_rows > 0]
    with (
        ThreadPoolExecutor(max_workers=max(1, job.threads)) as pool,
        pq.ParquetWriter(tmp, schema, compression="zstd", write_page_checksum=True, write_statistics=True) as writer,
    ):
        # Row groups are tokenized ahead, up to one per thread, and written in order.
        ahead = max(1, job.threads)
        futures = [pool.submit(one, g) for g in groups[:ahead]]
        for i in range(len(groups)):
            arr, nbytes = futures[i].result()
            if i + ahead < len(groups):
                futures.append(pool.submit(one, groups[i + ahead]))
            futures[i] = None  # type: ignore[call-overload]  # free it once written
            lengths = list_lengths(arr)
            for a, b in _splits(lengths, job.row_group_tokens):
                writer.write_table(
                    pa.table({job.token_column: arr.slice(a, b - a)}, schema=schema), row_group_size=b - a
                )
            rows += len(arr)
            tokens += int(lengths.sum())
            text_bytes += nbytes
    return rows, tokens, text_bytes


# A worker process's tokenizer, by its identity: a run uses one; a Ray worker that served
# an earlier run with another tokenizer rebuilds it rather than use that one's.
_WORKER = Bounded[str, TextTokenizer](1)


def _init_worker(identity: str, spec: Any) -> None:
    # One process per core: the tokenizer's own thread pool would oversubscribe them.
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    _WORKER.put(identity, rebuild(spec))


def _run_job(identity: str, job: _Job) -> tuple[str, int, int, int]:
    tok = _WORKER.get(identity)
    assert tok is not None, "the worker's tokenizer is made first (_init_worker)"
    rows, tokens, nbytes = convert_file(job, tok)
    return job.rel, rows, tokens, nbytes


def _ray_job(identity: str, spec: Any, job: _Job) -> tuple[str, int, int, int]:
    if identity not in _WORKER:
        _init_worker(identity, spec)
    return _run_job(identity, job)


def _list(src: str, options: Mapping[str, Any] | None) -> list[FileStat]:
    if not _remote(src) and not (Path(src).is_file() or Path(src).is_dir()):
        msg = (
            f"SRC {src!r} is neither a file nor a folder; pass the text dataset's path or an s3://, gs:// or az:// URL"
        )
        raise ConfigError(msg)
    return _storage(src, options).list_files()


def _join(root: str, rel: str) -> str:
    return f"{root.rstrip('/')}/{rel}" if _remote(root) else str(Path(root) / rel)


def _run_on_ray(
    todo: list[_Job], tok: TextTokenizer, address: str | None, done: Callable[[tuple[str, int, int, int]], None]
) -> None:
    # One Ray task a file: each converts its file exactly as a local worker does (the
    # tokenizer rebuilt once a Ray worker process), and returns what it wrote.
    calls = [(tok.identity, tok.spec, j) for j in todo]
    run_tasks(_ray_job, calls, done, address=address, progress=False, desc="tokenize (ray)")


def _run_local(
    todo: list[_Job], tok: TextTokenizer, workers: int, done: Callable[[tuple[str, int, int, int]], None]
) -> None:
    if workers == 1:
        for j in todo:
            r_rows, r_tokens, r_bytes = convert_file(j, tok)
            done((j.rel, r_rows, r_tokens, r_bytes))
        return
    import multiprocessing as mp

    with ProcessPoolExecutor(
        max_workers=workers,
        mp_context=mp.get_context("spawn"),
        initializer=_init_worker,
        initargs=(tok.identity, tok.spec),
    ) as pool:
        for r in pool.map(partial(_run_job, tok.identity), todo):
            done(r)


def _check(engine: str, row_group_tokens: Any) -> None:
    """Refuse an unknown engine or a row group size that is not an integer >= 0, naming the fix."""
    if engine not in ("local", "ray"):
        msg = f"engine={engine!r}: use 'local' or 'ray'"
        raise ConfigError(msg)
    if not isinstance(row_group_tokens, int) or row_group_tokens < 0:
        msg = f"row_group_tokens={row_group_tokens!r} must be an integer >= 0 (0 keeps the input's row groups)"
        raise ConfigError(msg)


def _convert(
    todo: list[_Job], tok: TextTokenizer, engine: str, workers: int, address: str | None, progress: bool | None
) -> tuple[int, int, int]:
    """Convert the files of ``todo`` on ``engine``, with a bar of files; (rows, tokens, text bytes) written."""
    from tqdm import tqdm

    from planner.progress import progress_enabled

    rows = tokens = nbytes = 0
    bar = tqdm(total=len(todo), desc="tokenize", unit="file", disable=not progress_enabled(progress, len(todo)))

    def done(r: tuple[str, int, int, int]) -> None:
        nonlocal rows, tokens, nbytes
        rows, tokens, nbytes = rows + r[1], tokens + r[2], nbytes + r[3]
        bar.set_postfix(tokens=f"{tokens:,}", refresh=False)
        bar.update(1)

    try:
        if not todo:
            pass
        elif engine == "ray":
            _run_on_ray(todo, tok, address, done)
        else:
            _run_local(todo, tok, workers, done)
    finally:
        bar.close()
    return rows, tokens, nbytes


def tokenize(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    tokenizer: Any,
    text_column: str = DEFAULT_TEXT.text_column,
    token_column: str = "input_ids",  # noqa: S107  # a column name, not a secret
    add_eos: bool = DEFAULT_TEXT.add_eos,
    add_bos: bool = DEFAULT_TEXT.add_bos,
    row_group_tokens: int = ROW_GROUP_TOKENS,
    engine: str = "local",
    jobs: int | None = None,
    address: str | None = None,
    progress: bool | None = None,
    storage_options: Mapping[str, Any] | None = None,
    dst_storage_options: Mapping[str, Any] | None = None,
) -> TokenizeResult:
    """Tokenize every ``*.parquet`` below ``src`` into the same relative path below the folder ``dst``.

    ``src`` may be one file: it becomes ``dst/<its name>``. Either may be a local
    path or an ``s3://``, ``gs://`` or ``az://`` URL; ``storage_options`` are the
    source's (as for the loader), ``dst_storage_options`` the destination's
    (default: the source's when both are on the same kind of store).

    See the module's documentation for row groups, resuming and engines.
    """
    t0 = time.perf_counter()
    _check(engine, row_group_tokens)
    tok = load_tokenizer(tokenizer)
    tok.special(add_bos, add_eos)
    srcs, dsts = os.fspath(src), os.fspath(dst)
    if dst_storage_options is None and _remote(dsts) and srcs.partition("://")[0] == dsts.partition("://")[0]:
        dst_storage_options = storage_options
    files = _list(srcs, storage_options)
    if not files:
        msg = f"SRC {srcs!r} holds no *.parquet file"
        raise ConfigError(msg)
    base = _Job("", "", "", text_column, token_column, add_bos, add_eos, row_group_tokens, 1, src_root=srcs,
                dst_root=dsts, src_options=storage_options, dst_options=dst_storage_options)  # fmt: skip
    all_jobs = [
        replace(base, src=f.location, dst=_join(dsts, f.name), rel=f.name, size=f.size, version=f.version)
        for f in files
    ]
    todo = [j for j in all_jobs if not _complete(j, _record(j, tok))]
    cores = os.cpu_count() or 2
    workers = max(1, min(jobs or cores, len(todo)))
    todo = [replace(j, threads=max(1, cores // workers)) for j in todo]
    rows, tokens, nbytes = _convert(todo, tok, engine, workers, address, progress)
    return TokenizeResult(
        written=len(todo),
        skipped=len(all_jobs) - len(todo),
        rows=rows,
        tokens=tokens,
        text_bytes=nbytes,
        seconds=time.perf_counter() - t0,
    )
