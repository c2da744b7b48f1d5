"""Storage per file: a list source that mixes local disk and S3 reads each file through its own.

``Index.storage(f)`` is the storage that listed file ``f``; Polars scans, DuckDB's
``read_parquet`` and the loader's reader threads take their options from it, not
from the first file's.
"""

from __future__ import annotations

import os

import pytest

import planner
from planner.s3 import S3Storage
from planner.storage import LocalStorage
from plitzer.settings import default_threads
from tests.s3_fixtures import S3Data, s3

__all__ = ["s3"]  # the fixture, imported for pytest

SETTINGS = {"lanes": 8, "window": 3, "world": 2}


def test_local_storage_needs_no_options(tmp_path: os.PathLike[str]) -> None:
    st = LocalStorage(tmp_path)
    assert st.polars_options() == {} and st.duckdb_filesystem() is None
    assert st.concurrency == (os.cpu_count() or 2)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("s3_first", [False, True])
def test_a_list_source_mixing_disk_and_s3_scans_each_file_with_its_own_storage(s3: S3Data, s3_first: bool) -> None:
    local, remote = s3.local["synth"], s3.url["synth"]
    mixed = [remote, local] if s3_first else [local, remote]
    both = planner.plan(mixed, storage_options=s3.options(), **SETTINGS)
    disk = planner.plan([local, local], **SETTINGS)
    assert both.dataset.fingerprint == disk.dataset.fingerprint
    kinds = {type(both.dataset.storage(f)) for f in range(len(both.dataset.files))}
    assert kinds == {LocalStorage, S3Storage}
    for rank in (0, 1):
        assert both.scan(0, rank=rank).collect().equals(disk.scan(0, rank=rank).collect())
    # DuckDB reaches the S3 objects whichever source comes first.
    got = both.sql(f"select count(*) as n from read_parquet('{remote}/*.parquet')")
    assert 2 * got["n"][0] == both.index["rows"].sum()
    # The loader's reader threads: as many as the S3 storage asks for, even when it is not first.
    assert default_threads(both.dataset) == max(os.cpu_count() or 2, 16)
