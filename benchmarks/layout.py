"""What a layout change costs: the step at the change, the bytes read again, the throughput after it.

One epoch of FineWeb-Edu-shaped synth data read twice, alternating, best of ``--repeat``:

* staged: ``--lanes`` rows of ``--seq-len`` tokens, then from step ``--at`` (a fraction of the
  epoch) ``lanes / factor`` rows of ``seq_len * factor`` (the same tokens a step: a
  long-context extension at a constant global batch);
* plain: the first layout throughout, the same steps (so the same windows).

Printed: the median step time before and after the change and the time of the step at the
change (it waits for the window cut again: read again whole, packed for the new lanes), the
bytes each run read and their difference (read again because of the change), tokens/s
before and after, and each against the faster of pyarrow's two raw decodes of the same
token columns on the same threads (``pq.read_table`` per file, and ``read_row_group`` per
row group with cached footers: ``benchmarks/throughput.py``'s reference).

    python benchmarks/layout.py --tokens 20000000 --lanes 64 --seq-len 2048 --factor 4
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from _common import dataset, timed
from throughput import Decoders

import plitzer


def run(d: object, steps: int, cfg: dict[str, object]) -> tuple[list[float], int, int]:
    """Per-step wall times, bytes read and tokens of ``steps`` steps."""
    times, tokens = [], 0
    with plitzer.Loader(d, **cfg) as ld:  # type: ignore[arg-type]
        for _ in range(steps):
            t0 = time.perf_counter()
            b = ld.next_batch()
            times.append(time.perf_counter() - t0)
            tokens += b.tokens.size
        read = ld.stats.bytes_read
    return times, read, tokens


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=20_000_000)
    p.add_argument("--lanes", type=int, default=64)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--factor", type=int, default=4, help="seq_len times this, lanes divided by it, at the change")
    p.add_argument("--at", type=float, default=0.5, help="the change, as a fraction of the epoch's steps")
    p.add_argument("--window", type=int, default=8)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--data", default=None)
    a = p.parse_args()
    d = dataset(a.tokens, a.data)
    b, n, f = a.lanes, a.seq_len, a.factor
    if b % f:
        p.error(f"--lanes {b} is not divisible by --factor {f}")
    ix = plitzer.index(d)
    total = int(ix.frame["tokens"].sum())
    steps = max(2, total // (b * n))
    at = max(1, min(steps - 1, int(steps * a.at)))
    base = {"window": a.window, "threads": a.threads, "seed": 0}
    staged = {**base, "lanes": [(0, b), (at, b // f)], "seq_len": [(0, n), (at, n * f)]}
    plain = {**base, "lanes": b, "seq_len": n}
    best: dict[str, tuple[list[float], int, int]] = {}
    for _ in range(a.repeat):
        for name, cfg in (("staged", staged), ("plain", plain)):
            got = run(d, steps, cfg)
            if name not in best or sum(got[0]) < sum(best[name][0]):
                best[name] = got
    st, sr, tok = best["staged"]
    pt, pr, _ = best["plain"]
    dec = Decoders(d, ix.column, a.threads or os.cpu_count() or 1)
    decode_rate = 0.0
    for fn in (dec.read_table, dec.row_groups):  # the faster of the two is the reference
        with timed() as t:
            decoded = fn()
        decode_rate = max(decode_rate, decoded / t.wall / 1e6)
    per_step = b * n
    # Steps are views of packed windows, so a step's time is mostly its wait for a window:
    # rates are tokens over the summed step times (waits included) of each side.
    before, after = sum(st[:at]), sum(st[at + 1 :]) or st[at]
    print(f"{steps} steps of {per_step:,} tokens ({b} x {n}, then {b // f} x {n * f} from step {at}), {total:,} tokens")
    other = max(st[:at] + st[at + 1 :])
    print(
        f"step time: at the change {st[at] * 1e3:.1f} ms; the slowest other step {other * 1e3:.1f} ms; "
        f"median {statistics.median(st) * 1e3:.3f} ms (plain run: slowest {max(pt) * 1e3:.1f} ms)"
    )
    print(
        f"bytes read: staged {sr:,}, plain {pr:,}, read again {sr - pr:,} ({(sr - pr) / max(pr, 1):.1%} of the epoch)"
    )
    rate_before, rate_after = at * per_step / before / 1e6, (steps - at - 1) * per_step / after / 1e6
    rate_plain = steps * per_step / sum(pt) / 1e6
    print(
        f"tokens/s: before the change {rate_before:.1f} M, after {rate_after:.1f} M, plain {rate_plain:.1f} M; "
        f"fastest raw decode {decode_rate:.1f} M"
    )
    print(
        f"against the decode: before {rate_before / decode_rate:.2f}x, after {rate_after / decode_rate:.2f}x, "
        f"plain {rate_plain / decode_rate:.2f}x"
    )
    assert tok == steps * per_step


if __name__ == "__main__":
    main()
