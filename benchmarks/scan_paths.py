"""Candidate ways to decode a rank's row groups, measured in one run.

Each path decodes the token column of every row group of the same files, with
the same number of threads, from the page cache. The loader's hot path is the
fastest per-row-group path (whole-file reads are not an option: a rank reads
only its planned row groups).

    python benchmarks/scan_paths.py --tokens 60000000 --threads 2
"""

from __future__ import annotations

import argparse
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from _common import dataset, timed, token_count, warm_page_cache


def per_row_group(d: Path) -> list[tuple[Path, int, int, int]]:
    out = []
    for p in sorted(d.glob("*.parquet")):
        md = pq.read_metadata(p)
        offset = 0
        for g in range(md.num_row_groups):
            n = md.row_group(g).num_rows
            out.append((p, g, offset, n))
            offset += n
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=60_000_000)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    d = dataset(args.tokens)
    warm_page_cache(d)
    tokens = token_count(d)
    rgs = per_row_group(d)
    metas = {p: pq.read_metadata(p) for p, *_ in rgs}

    import duckdb
    import polars as pl

    import planner
    from plitzer.readpath.read import read_chunk

    ix = planner.index(d)

    def pyarrow_cached_footer(item: tuple[Path, int, int, int]) -> int:
        p, g, _, _ = item
        pf = pq.ParquetFile(p, metadata=metas[p], pre_buffer=True)
        return len(pf.read_row_group(g, columns=["tokens"], use_threads=False).column(0).chunk(0).values)

    def plitzer_ranged(i: int) -> int:
        return len(read_chunk(ix, i).values)

    def polars_slice(item: tuple[Path, int, int, int]) -> int:
        p, _, off, n = item
        s = pl.scan_parquet(p).select("tokens").slice(off, n).collect()["tokens"]
        return int(s.list.len().sum())

    def duckdb_row_group(item: tuple[Path, int, int, int]) -> int:
        p, _, off, n = item
        con = duckdb.connect()
        t = con.sql(
            f"select tokens from read_parquet('{p}', file_row_number=true) "
            f"where file_row_number >= {off} and file_row_number < {off + n}"
        ).arrow()
        con.close()
        table = t.read_all() if hasattr(t, "read_all") else t
        return sum(len(c.values) for c in table.column(0).chunks)

    def whole_files() -> int:
        n = 0
        for p in sorted(d.glob("*.parquet")):
            col = pq.read_table(p, columns=["tokens"]).column(0)
            n += sum(len(c.values) for c in col.chunks)
        return n

    paths = {
        "pyarrow read_row_group, cached footer (per row group)": lambda pool: sum(pool.map(pyarrow_cached_footer, rgs)),
        "plitzer: one ranged read + cached footer (per row group)": lambda pool: sum(
            pool.map(plitzer_ranged, range(len(rgs)))
        ),
        "polars scan_parquet().slice() (per row group)": lambda pool: sum(pool.map(polars_slice, rgs)),
        "duckdb read_parquet + file_row_number (per row group)": lambda pool: sum(pool.map(duckdb_row_group, rgs)),
        "pyarrow read_table, whole files (not per row group)": lambda pool: whole_files(),
    }
    print(f"{tokens:,} tokens, {len(rgs)} row groups, {args.threads} threads; best of {args.repeat}")
    print(f"{'path':<60} {'Mtok/s':>8} {'cores':>6} {'CPU ns/tok':>11}")
    results = {}
    for name, fn in paths.items():
        best = None
        for _ in range(args.repeat):
            with ThreadPoolExecutor(args.threads) as pool, timed() as t:
                got = fn(pool)
            assert got == tokens, (name, got, tokens)
            if best is None or t.wall < best.wall:
                best = t
        assert best is not None
        results[name] = best
        print(f"{name:<60} {best.rate(tokens):8.1f} {best.cores():6.2f} {best.ns_per_token(tokens):11.1f}")
    base = results["pyarrow read_row_group, cached footer (per row group)"]
    mine = results["plitzer: one ranged read + cached footer (per row group)"]
    print(f"plitzer's path / pyarrow per row group: {base.wall / mine.wall:.2f}x")
    _ = pa


if __name__ == "__main__":
    main()
