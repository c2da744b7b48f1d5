"""Realistic synthetic pretraining data: FineWeb-Edu-shaped, pre-tokenized Parquet.

Document lengths are lognormal (mean about ``mean_length`` tokens, long right
tail), token ids are Zipf-like over a GPT-2-sized vocabulary (id ``k`` has
probability about proportional to ``1/(k+1)``), about 1,000 documents per row
group, zstd. Tests, the demo and the benchmarks all use it, so the same bytes can
be regenerated anywhere from ``(tokens, seed)``.

Beside the tokens each document has FineWeb-Edu's metadata, for selections
(``where=``, :mod:`plitzer.selection.select`): ``score`` (an educational score in [0, 5)),
``int_score`` (it rounded), ``language`` (``en`` for about 70 % of documents, else
``de``, ``fr``, ``es`` or ``zh``) and ``token_count`` (the document's tokens). They
come from their own random stream, so the tokens are those of ``(tokens, seed)``
with or without them (``metadata=False`` leaves them out).

The token column is ``tokens`` (``column=`` names it otherwise, e.g. ``input_ids`` as most
tokenized corpora and ``plitzer tokenize`` name it); the loader finds either without
``column=``. The name is kept from earlier releases: checkpoints record the column, and the
benchmarks' recorded commands and many documented queries name it (docs/design.md, "The
sample data's token column").

>>> import tempfile, pyarrow.parquet as pq
>>> paths = write(tempfile.mkdtemp(), tokens=30_000, seed=0, docs_per_row_group=10)
>>> t = pq.read_table(paths[0])
>>> t.column_names
['id', 'tokens', 'score', 'int_score', 'language', 'token_count']
>>> pq.read_table(write(tempfile.mkdtemp(), tokens=30_000, column="input_ids")[0]).column_names[1]
'input_ids'
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

__all__ = ["FINEWEB_COLUMNS", "write", "write_fineweb_shaped"]

_LANGUAGES = ("en", "de", "fr", "es", "zh")
_SHARES = (0.7, 0.1, 0.08, 0.07, 0.05)
_METADATA = ("score", "int_score", "language", "token_count")


def write(
    out: str | os.PathLike[str],
    tokens: int,
    *,
    seed: int = 0,
    mean_length: float = 1000.0,
    sigma: float = 1.0,
    vocab: int = 50257,
    docs_per_row_group: int = 1000,
    row_groups_per_file: int = 16,
    dtype: str = "int32",
    compression: str = "zstd",
    metadata: bool = True,
    column: str = "tokens",
) -> list[Path]:
    """Write at least ``tokens`` tokens as Parquet files into folder ``out``, in token column ``column``.

    Returns the written paths (``part-00000.parquet``, ...). The tokens are those of
    ``(tokens, seed)`` whatever the column's name.
    """
    _check(tokens, column)
    rng = np.random.default_rng(seed)
    meta = np.random.default_rng([seed, 27])  # its own stream: the tokens do not depend on it
    outdir = Path(out)
    outdir.mkdir(parents=True, exist_ok=True)
    mu = np.log(mean_length) - sigma * sigma / 2
    log_vocab = np.log(vocab)
    written = 0
    doc_id = 0
    paths: list[Path] = []
    while written < tokens:
        n_docs = docs_per_row_group * row_groups_per_file
        lengths = np.maximum(1, rng.lognormal(mu, sigma, n_docs).astype(np.int64))
        # Stop at the requested size: trim the last file to the documents needed.
        cum = np.cumsum(lengths)
        need = tokens - written
        if cum[-1] > need:
            n_docs = int(np.searchsorted(cum, need, side="left")) + 1
            lengths = lengths[:n_docs]
        total = int(lengths.sum())
        ids = np.exp(rng.random(total) * log_vocab).astype(np.int64) - 1
        values = pa.array(np.clip(ids, 0, vocab - 1).astype(dtype))
        offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
        columns: dict[str, pa.Array] = {
            "id": pa.array(np.arange(doc_id, doc_id + n_docs, dtype=np.int64)),
            column: pa.ListArray.from_arrays(offsets, values),
        }
        if metadata:
            columns.update(_metadata(meta, lengths))
        table = pa.table(columns)
        path = outdir / f"part-{len(paths):05d}.parquet"
        pq.write_table(table, path, row_group_size=docs_per_row_group, compression=compression)
        paths.append(path)
        written += total
        doc_id += n_docs
    return paths


def _check(tokens: int, column: str) -> None:
    if tokens < 1:
        msg = f"tokens={tokens} must be >= 1"
        raise ValueError(msg)
    if column in ("id", *_METADATA):
        msg = f"column={column!r} is one of the metadata columns; name the token column otherwise (e.g. input_ids)"
        raise ValueError(msg)


def _metadata(meta: np.random.Generator, lengths: np.ndarray) -> dict[str, pa.Array]:
    """FineWeb-Edu's metadata of documents of ``lengths`` tokens, from ``meta``'s own stream."""
    n_docs = len(lengths)
    score = np.round(meta.beta(2.0, 3.0, n_docs) * 5, 3)
    return {
        "score": pa.array(score),
        "int_score": pa.array(np.round(score).astype(np.int64)),
        "language": pa.array(np.array(_LANGUAGES)[meta.choice(len(_LANGUAGES), n_docs, p=_SHARES)]),
        "token_count": pa.array(lengths.astype(np.int64)),
    }


FINEWEB_COLUMNS = (
    "text",
    "id",
    "dump",
    "url",
    "file_path",
    "language",
    "language_score",
    "token_count",
    "score",
    "int_score",
    "input_ids",
)
"""FineWeb-Edu's columns once tokenized, in its order: :func:`write_fineweb_shaped` writes them."""


def write_fineweb_shaped(
    out: str | os.PathLike[str],
    files: int,
    *,
    row_groups_per_file: int = 400,
    rows_per_row_group: int = 2,
    distinct: int = 1,
    seed: int = 0,
) -> list[Path]:
    """Files shaped like FineWeb-Edu's: its eleven columns, hundreds of row groups a file.

    The rows are tiny (``rows_per_row_group`` documents of 1-40 tokens a row group), the
    footers of real size (about 1.4 KB a row group: statistics of every column of every
    row group), which is what indexing and a rank's memory cost. ``distinct`` files are
    written and copied until there are ``files`` (a footer's cost does not depend on its
    values), under ``CC-MAIN-2024-10/`` as ``000_00000.parquet``, ....

    >>> import tempfile, pyarrow.parquet as pq
    >>> paths = write_fineweb_shaped(tempfile.mkdtemp(), 2, row_groups_per_file=3)
    >>> md = pq.read_metadata(paths[1])
    >>> md.num_columns, md.num_row_groups
    (11, 3)
    """
    import shutil

    folder = Path(out) / "CC-MAIN-2024-10"
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"{i // 1000:03d}_{i:05d}.parquet" for i in range(files)]
    n = row_groups_per_file * rows_per_row_group
    for k in range(min(distinct, files)):
        rng = np.random.default_rng([seed, k])
        lengths = rng.integers(1, 40, n)
        ids = rng.integers(0, 32000, int(lengths.sum())).astype(np.int32)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        docs = range(k * n, (k + 1) * n)
        table = pa.table(
            {
                "text": pa.array([f"document {d} of a crawl, " * 3 for d in docs]),
                "id": pa.array([f"<urn:uuid:{seed:08x}-{d:012x}>" for d in docs]),
                "dump": pa.array(["CC-MAIN-2024-10"] * n),
                "url": pa.array([f"https://example{d % 97}.org/page/{d}" for d in docs]),
                "file_path": pa.array(
                    [f"s3://commoncrawl/crawl-data/CC-MAIN-2024-10/segments/{d}.warc.gz" for d in docs]
                ),
                "language": pa.array(["en"] * n),
                "language_score": pa.array(rng.random(n)),
                "token_count": pa.array(lengths.astype(np.int64)),
                "score": pa.array(np.round(rng.random(n) * 5, 3)),
                "int_score": pa.array(rng.integers(0, 6, n)),
                "input_ids": pa.ListArray.from_arrays(pa.array(offsets), pa.array(ids)),
            }
        )
        pq.write_table(table, paths[k], row_group_size=rows_per_row_group, compression="zstd")
    for i in range(distinct, files):
        shutil.copyfile(paths[i % distinct], paths[i])
    return paths
