"""Shared pieces of the benchmarks: the dataset they run on and a CPU timer."""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq


def dataset(tokens: int, root: str | None = None) -> Path:
    """FineWeb-Edu-shaped synth data of ``tokens`` tokens, generated once and kept."""
    import plitzer.synth

    base = Path(root or os.environ.get("PLITZER_BENCH_DATA", "data"))
    d = base / f"synth-{tokens // 1_000_000}M"
    if not (d / ".done").exists():
        print(f"generating {tokens:,} tokens into {d} ...", flush=True)
        plitzer.synth.write(d, tokens=tokens, seed=0)
        (d / ".done").write_text("ok")
    return d


def warm_page_cache(d: Path) -> int:
    """Read every file once so that all readers start from the page cache."""
    n = 0
    for p in sorted(d.glob("*.parquet")):
        n += len(p.read_bytes())
    return n


def token_count(d: Path) -> int:
    total = 0
    for p in sorted(d.glob("*.parquet")):
        md = pq.read_metadata(p)
        for g in range(md.num_row_groups):
            total += md.row_group(g).column(1).statistics.num_values
    return total


@dataclass
class Timing:
    wall: float = 0.0
    cpu: float = 0.0
    faults: int = 0  # minor page faults: memory touched for the first time (MEASURED.md: 4.4 ns a token)

    def rate(self, tokens: int) -> float:
        return tokens / self.wall / 1e6

    def ns_per_token(self, tokens: int) -> float:
        return self.cpu / tokens * 1e9

    def cores(self) -> float:
        return self.cpu / self.wall if self.wall else 0.0


@contextmanager
def timed() -> Iterator[Timing]:
    """Wall time, this process's CPU time (all threads) and its minor page faults of a block."""
    t = Timing()
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    w0 = time.perf_counter()
    yield t
    t.wall = time.perf_counter() - w0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    t.cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    t.faults = r1.ru_minflt - r0.ru_minflt


def save_figure(fig: object, out: Path) -> None:
    """Lay out, write and announce a matplotlib figure (every benchmark's last step)."""
    fig.tight_layout()  # type: ignore[attr-defined]
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)  # type: ignore[attr-defined]
    print(f"wrote {out}")
