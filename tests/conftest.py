"""Shared fixtures: a private index cache, hypothesis profiles, generated datasets, dataset writers."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, settings

# Profiles with named budgets: "fast" for a local loop, "ci" (default in .ci/run) thorough.
settings.register_profile("fast", max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile(
    "ci",
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.register_profile("thorough", max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "fast"))


# -- how the suite shares the cores (the README's `python -m pytest -n auto`) ----------------
# The suite is a few long tests (real processes, servers, the peers' harness: 10-130 s
# each, marked slow) among hundreds of short ones. xdist's default hands each worker a
# quarter of the collection up front, so a long test met late runs alone on one core
# while the other idles. Instead: the long tests first, and each worker given the next
# test only as it finishes one (at most two queued), so the short tests fill the cores
# around the long ones and the run ends within a short test of each core's end.


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    if getattr(config.option, "numprocesses", None) and getattr(config.option, "maxschedchunk", 0) is None:
        config.option.maxschedchunk = 1


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable: the files' order otherwise


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    old = os.environ.get("PLITZER_CACHE")
    os.environ["PLITZER_CACHE"] = str(tmp_path_factory.mktemp("plitzer-cache"))
    yield
    if old is None:
        os.environ.pop("PLITZER_CACHE", None)
    else:
        os.environ["PLITZER_CACHE"] = old


SynthDataset = Callable[..., Path]


@pytest.fixture(scope="session")
def synth_dataset(tmp_path_factory: pytest.TempPathFactory) -> SynthDataset:
    """``synth_dataset(tokens, **settings)``: a folder written by ``plitzer.synth.write``.

    Written once per session for each set of arguments, and shared by every module
    that asks for the same one, so tests must not change the files.
    """
    import plitzer.synth

    made: dict[tuple[int, tuple[tuple[str, object], ...]], Path] = {}

    def make(tokens: int, **settings: object) -> Path:
        key = (tokens, tuple(sorted(settings.items())))
        if key not in made:
            d = tmp_path_factory.mktemp("synth")
            plitzer.synth.write(d, tokens, **settings)  # type: ignore[arg-type]
            made[key] = d
        return made[key]

    return make


Docs = Sequence[Sequence[int] | None]  # one row group: documents (None = null list)


def write_dataset(
    root: Path,
    files: Sequence[Sequence[Docs]],
    *,
    dtype: str = "int32",
    large: bool = False,
    statistics: bool = True,
    column: str = "tokens",
) -> list[Path]:
    """Write files of row groups of documents exactly as given (row groups kept).

    ``dtype`` is the integer type of the tokens (any numpy integer name).
    """
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for fi, rgs in enumerate(files):
        path = root / f"f{fi:03d}.parquet"
        typ = (pa.large_list if large else pa.list_)(pa.from_numpy_dtype(np.dtype(dtype)))
        schema = pa.schema([(column, typ), ("n", pa.int64())])
        with pq.ParquetWriter(path, schema, write_statistics=statistics, compression="zstd") as w:
            for docs in rgs:
                arr = pa.array([None if d is None else list(d) for d in docs], type=typ)
                w.write_table(pa.table({column: arr, "n": pa.array(range(len(docs)), pa.int64())}, schema=schema))
        paths.append(path)
    return paths


def numbered_dataset(
    root: Path, lengths: Sequence[Sequence[Sequence[int]]], **kw: object
) -> list[list[list[list[int]]]]:
    """Documents of the given lengths whose tokens number them uniquely; returns the docs."""
    counter = 0
    files = []
    for rgs in lengths:
        frows = []
        for docs in rgs:
            rows = []
            for n in docs:
                rows.append(list(range(counter, counter + n)))
                counter += n
            frows.append(rows)
        files.append(frows)
    write_dataset(root, files, **kw)  # type: ignore[arg-type]
    return files


def docs_by_row_group(files: Sequence[Sequence[Docs]]) -> list[list[list[int]]]:
    """Index order (files, then row groups) of the documents, nulls as empty."""
    return [[list(d) if d is not None else [] for d in rg] for f in files for rg in f]


def tokens_of(batch: object) -> np.ndarray:
    return np.from_dlpack(batch.tokens)  # type: ignore[attr-defined]
