"""Realistic benchmark data anyone can regenerate: real text, a real tokenizer, real shards.

Synthetic Zipf ids decode about three times faster per token than tokenized text (their
dictionary pages are small), so a benchmark on them flatters every loader. This writes
pre-tokenized Parquet from text found on this machine: the sources and documentation of
installed packages (``.py``, ``.md``, ``.rst``, ``.txt`` files under site-packages, in
sorted order, so the same machine gives the same data), tokenized with a real LLM
tokenizer (by default the SentencePiece model that ``mistral-common`` ships, no
download), each document followed by EOS. Lengths are long-tailed as real documents
are (a licence, a README, a module of thousands of lines). Shards are shaped like
real ones: ``input_ids`` as ``list<int32>``, zstd, page checksums, large row groups
(``row_group_tokens``, 4.5 M by default, as in the real-text table of docs/benchmarks.md).

When the machine holds less text than ``tokens`` asks for, the text is taken again from
the start (each pass is a new document order, so windows differ) and the count of
passes is reported.

    plitzer synth --text data/text --tokens 200000000
"""

from __future__ import annotations

import importlib.util
import os
import sysconfig
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from planner.errors import ConfigError
from planner.threads import map_ahead

__all__ = ["default_tokenizer", "find_text", "write_text"]

_SUFFIXES = (".py", ".md", ".rst", ".txt")


def _walk(root: Path) -> Iterator[Path]:
    """Every path under ``root`` in ``sorted(root.rglob("*"))``'s order, found lazily.

    Paths compare part by part, so that order is a depth-first walk with each folder's
    entries sorted by name (a folder's contents right after it); walking lazily yields
    the first file at once instead of after a stat of every file under site-packages
    (seconds, most of a small ``plitzer synth --text``). As rglob, it does not descend
    into linked folders.
    """
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except OSError:
        return
    for e in entries:
        p = Path(e.path)
        yield p
        try:
            descend = e.is_dir() and not e.is_symlink()
        except OSError:
            continue
        if descend:
            yield from _walk(p)


def _text_files(roots: list[Path] | None) -> Iterator[tuple[Path, str]]:
    for root in roots or [Path(sysconfig.get_paths()["purelib"])]:
        for p in _walk(root):
            if p.suffix not in _SUFFIXES or not p.is_file():
                continue
            try:
                text = p.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            if text.strip():
                yield p, text


def find_text(roots: list[Path] | None = None) -> Iterator[str]:
    """Every readable, non-empty text file under ``roots`` (default: site-packages), in sorted order."""
    for _, text in _text_files(roots):
        yield text


def _remembering(files: Iterator[tuple[Path, str]], seen: list[Path]) -> Iterator[str]:
    for p, text in files:
        seen.append(p)
        yield text


def _batches(texts: Iterable[str], size: int) -> Iterator[list[str]]:
    batch: list[str] = []
    for t in texts:
        batch.append(t)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def default_tokenizer() -> str:
    """mistral-common's SentencePiece model file (a real 32k-vocabulary LLM tokenizer)."""
    spec = importlib.util.find_spec("mistral_common")
    if spec is None or not spec.submodule_search_locations:
        msg = "no tokenizer given and mistral-common is not installed: pass tokenizer= (a .model or tokenizer.json)"
        raise ConfigError(msg)
    data = Path(next(iter(spec.submodule_search_locations))) / "data"
    models = sorted(data.glob("*.model.v7")) or sorted(data.glob("*.model*"))
    if not models:
        msg = f"no SentencePiece model under {data}; pass tokenizer= (a .model or tokenizer.json)"
        raise ConfigError(msg)
    return str(models[-1])


def _pass_texts(roots: list[Path] | None, seen: list[Path], n: int) -> Iterator[str]:
    """Pass ``n``'s texts: the files found on the first (remembered in ``seen``), then ``seen`` in a new order."""
    if n == 1:
        return _remembering(_text_files(roots), seen)
    order = np.random.default_rng(n).permutation(len(seen))  # a new order for each pass
    return (seen[i].read_text(encoding="utf-8") for i in order)


class _Shards:
    """Documents into zstd shards under ``folder``: a row group every ``row_group_tokens``, files of ``per_file``."""

    def __init__(self, folder: Path, dtype: pa.DataType, row_group_tokens: int, per_file: int) -> None:
        self.folder, self.dtype = folder, dtype
        self.schema = pa.schema([("input_ids", pa.list_(dtype))])
        self.row_group_tokens, self.per_file = row_group_tokens, per_file
        self.files: list[Path] = []
        self.rows: list[np.ndarray] = []
        self.in_group = 0
        self.writer: pq.ParquetWriter | None = None
        self.groups_in_file = 0

    def add(self, arr: np.ndarray) -> None:
        """One document, a row of the row group held, which is written once it holds ``row_group_tokens``."""
        self.rows.append(arr)
        self.in_group += len(arr)
        if self.in_group >= self.row_group_tokens:
            self.flush()

    def flush(self) -> None:
        """Write the rows held as one row group (in a new file where none is open; a full file closed)."""
        if not self.rows:
            return
        if self.writer is None:
            path = self.folder / f"part-{len(self.files):05d}.parquet"
            self.files.append(path)
            self.writer = pq.ParquetWriter(path, self.schema, compression="zstd", write_page_checksum=True)
        lengths = np.array([len(r) for r in self.rows], dtype=np.int32)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        values = pa.array(np.concatenate(self.rows).astype(self.dtype.to_pandas_dtype()), self.dtype)
        self.writer.write_table(pa.table({"input_ids": pa.ListArray.from_arrays(pa.array(offsets), values)}))
        self.rows, self.in_group = [], 0
        self.groups_in_file += 1
        if self.groups_in_file >= self.per_file:
            self.writer.close()
            self.writer, self.groups_in_file = None, 0

    def close(self) -> None:
        """Write the rows held and close the last file."""
        self.flush()
        if self.writer is not None:
            self.writer.close()


def write_text(
    out: str | os.PathLike[str],
    tokens: int,
    *,
    tokenizer: Any = None,
    row_group_tokens: int = 4_500_000,
    row_groups_per_file: int = 8,
    threads: int | None = None,
    roots: list[Path] | None = None,
    progress: bool | None = None,
) -> tuple[list[Path], int]:
    """Write at least ``tokens`` tokens of real text to ``out``; returns (files, passes over the text)."""
    from tqdm import tqdm

    from planner.progress import progress_enabled
    from plitzer.text.source import encode_texts
    from plitzer.text.tokenizer import load_tokenizer

    tok = load_tokenizer(tokenizer if tokenizer is not None else default_tokenizer())
    eos = tok.eos_id
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    shards = _Shards(
        folder, pa.uint32() if tok.dtype == "uint32" else pa.int32(), row_group_tokens, row_groups_per_file
    )
    written, passes = 0, 0
    bar = tqdm(
        total=tokens, unit="tok", unit_scale=True, disable=not progress_enabled(progress, tokens), desc="synth --text"
    )
    n_threads = threads or os.cpu_count() or 2
    with ThreadPoolExecutor(n_threads) as pool:
        seen: list[Path] = []  # the first pass's files, read again in a new order by later passes
        while written < tokens:
            passes += 1
            texts = _pass_texts(roots, seen, passes)
            for ids in map_ahead(pool, lambda b: encode_texts(tok, b), _batches(texts, 64), 2 * n_threads):
                for doc in ids:
                    arr = np.asarray(doc + ([eos] if eos is not None else []), dtype=np.int64)
                    shards.add(arr)
                    written += len(arr)
                    bar.update(len(arr))
                if written >= tokens:
                    break
            if passes == 1 and not seen:
                msg = "no text files found under site-packages; pass roots= with folders of text"
                raise ConfigError(msg)
        shards.close()
    bar.close()
    return shards.files, passes
