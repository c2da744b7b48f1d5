"""Selection (``where=``): the selection pass's rate, and the loader at a 50 % selection.

FineWeb-Edu-shaped synth data (``plitzer.synth``: tokens plus ``score``,
``int_score``, ``language``, ``token_count``), files in the page cache. Reported,
all in one run so that the ratios compare like with like:

1. the selection pass, cold cache, reading the token column's list lengths:
   rows/s and dataset tokens/s;
2. the same pass with ``length_column="token_count"`` (no token decoding);
3. a warm second run (the cache: no data read);
4. the loader's delivered tokens/s over one epoch: unfiltered, and with a predicate
   that keeps about half the tokens (``score >= median``), its pass cached.

    python benchmarks/selection.py                 # 20 M tokens
    python benchmarks/selection.py --tokens 50000000 --lanes 128

Not named select.py: that is a module of the standard library, and a script's folder
comes first on sys.path.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq


def _pass(data: Path, where: str, length_column: str | None) -> tuple[float, int, int]:
    import plitzer
    from plitzer.selection.select import select_index

    os.environ["PLITZER_CACHE"] = tempfile.mkdtemp(prefix="plitzer-select-bench-")
    ix = plitzer.index(data)  # footers only (not timed: the index is not the pass)
    t = time.perf_counter()
    sel = select_index(ix, plitzer.Selection(where=where, length_column=length_column), progress=False)
    return time.perf_counter() - t, int(ix.frame["rows"].sum()), ix.tokens if sel.tokens else 0


def _epoch(data: Path, **kw: object) -> tuple[float, int]:
    import plitzer

    with plitzer.Loader(data, **kw) as loader:  # type: ignore[arg-type]
        t = time.perf_counter()
        n = 0
        for batch in loader:
            n += batch.tokens.size
        return time.perf_counter() - t, n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=20_000_000)
    ap.add_argument("--lanes", type=int, default=64)
    ap.add_argument("--window", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--data", default=None, help="a synth folder to reuse (default: a fresh one)")
    args = ap.parse_args()

    import plitzer.synth

    data = Path(args.data or tempfile.mkdtemp(prefix="plitzer-select-data-"))
    if not any(data.glob("*.parquet")):
        print(f"generating {args.tokens:,} tokens into {data} ...", flush=True)
        plitzer.synth.write(data, tokens=args.tokens, seed=0)
    for p in sorted(data.glob("*.parquet")):
        p.read_bytes()  # page cache
    scores = np.concatenate(
        [pq.read_table(p, columns=["score"])["score"].to_numpy() for p in sorted(data.glob("*.parquet"))]
    )
    half = f"score >= {float(np.median(scores)):.3f}"
    cores = os.cpu_count()
    print(f"machine: {cores} cores (shared: compare the ratios, measured in one run)")

    wall, rows, tokens = _pass(data, half, None)
    wall_len, _, _ = _pass(data, half, "token_count")
    # warm: the same cache as the last pass
    import plitzer
    from plitzer.selection.select import select_index

    ix = plitzer.index(data)
    t = time.perf_counter()
    sel = select_index(ix, plitzer.Selection(where=half, length_column="token_count"), progress=False)
    warm = time.perf_counter() - t
    kept = sel.tokens / ix.tokens
    print(f"dataset: {len(ix.files)} files, {ix.row_groups} row groups, {rows:,} rows, {tokens:,} tokens")
    print(f"predicate: {half!r} keeps {sel.rows_selected:,} rows, {sel.tokens:,} tokens ({kept:.1%})")
    print("selection pass (cold cache, every core):")
    print(
        f"  token lengths decoded : {wall:7.3f} s  {rows / wall / 1e3:9.1f} k rows/s  "
        f"{tokens / wall / 1e6:8.1f} M tok/s"
    )
    print(
        f"  length_column         : {wall_len:7.3f} s  {rows / wall_len / 1e3:9.1f} k rows/s  "
        f"{tokens / wall_len / 1e6:8.1f} M tok/s  ({wall / wall_len:.1f}x faster)"
    )
    print(f"  warm (cached)         : {warm:7.3f} s")

    cfg = {"lanes": args.lanes, "window": args.window, "seq_len": args.seq_len, "seed": 0}
    w_all, n_all = _epoch(data, **cfg)
    w_sel, n_sel = _epoch(data, where=half, length_column="token_count", **cfg)
    r_all, r_sel = n_all / w_all / 1e6, n_sel / w_sel / 1e6
    print(f"loader, one epoch, lanes={args.lanes} window={args.window} seq_len={args.seq_len}:")
    print(f"  unfiltered            : {r_all:8.1f} M tok/s delivered ({n_all:,} tokens in {w_all:.2f} s)")
    print(
        f"  where (keeps {kept:.0%})      : {r_sel:8.1f} M tok/s delivered ({n_sel:,} tokens in {w_sel:.2f} s), "
        f"{r_sel / r_all:.2f}x the unfiltered rate; {r_sel / kept / r_all:.2f}x counting the stored tokens decoded"
    )


if __name__ == "__main__":
    main()
