"""Windows held at once against run length: the first lane rule (simulated) and lockstep.

Under the first lane rule (a document went whole to the lane in which it started),
lane ``k`` received ``(c_{k+1} + e_{k+1}) - (c_k + e_k)`` tokens of every window, where
``e_k`` is the distance from cut ``c_k`` to the next document start (``e_0 = e_B = 0``).
Lane 0 gained ``e_1`` in every window and lane B-1 lost ``e_{B-1}``, so the lanes
drifted apart linearly with the run, and the loader had to hold every window between
the slowest and the fastest lane. The distance from a point to the next document start
is the *residual* of a renewal process: a uniform fraction of a length-biased document
(for lognormal lengths, lognormal with ``mu + sigma**2``). That is what is simulated
here, for 512 lanes and up to 100,000 windows, without writing any data.

Under the lockstep rule (docs/glossary.md, "Cut") lane ``k`` has received exactly
``ceil((R - k) / B)`` tokens when the run has ``R``, so lanes are within one token at
every window; this is computed here with the planner's own cut arithmetic on the same
window sizes, and the windows in use are those a step's ``(L + 1) * B`` tokens overlap.

    python benchmarks/drift.py --lanes 512 --window 64 --docs-per-row-group 1000
"""

from __future__ import annotations

import argparse
import math

import numpy as np

from planner.lanes import cut_at


def old_rule_spread(
    rng: np.random.Generator, lanes: int, docs: int, marks: list[int], mean: float, sigma: float
) -> tuple[list[int], float]:
    """Tokens between the richest and poorest lane after each mark (windows), and T_w."""
    mu = np.log(mean) - sigma**2 / 2
    window_tokens = docs * mean
    total = np.zeros(lanes, np.float64)
    out = []
    done = 0
    chunk = max(1, 2_000_000 // lanes)
    for n in marks:
        while done < n:
            m = min(chunk, n - done)
            biased = rng.lognormal(mu + sigma**2, sigma, (m, lanes - 1))  # documents covering each cut
            e = np.zeros((m, lanes + 1))
            e[:, 1:lanes] = rng.random((m, lanes - 1)) * biased  # residual to the next start
            total += (np.diff(e, axis=1)).sum(axis=0)  # the shares' deviation from T_w / B
            done += m
        out.append(round(float(total.max() - total.min())))
    return out, window_tokens


def new_rule_spread(rng: np.random.Generator, lanes: int, window_tokens: float, marks: list[int]) -> list[int]:
    """The same, with the lockstep cuts of the planner on window sizes varying by +-10 %."""
    got = np.zeros(lanes, np.int64)
    run = 0
    out = []
    done = 0
    for n in marks:
        sizes = rng.integers(int(window_tokens * 0.9), int(window_tokens * 1.1) + 1, n - done)
        for t in sizes.tolist():  # one vector op per window: cut arithmetic for all lanes
            q, r = divmod(t, lanes)
            got += np.diff(cut_at(np.arange(lanes + 1), q, r, run % lanes, lanes))
            run += t
        done = n
        out.append(int(got.max() - got.min()))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lanes", type=int, default=512)
    ap.add_argument("--window", type=int, default=64, help="row groups per window")
    ap.add_argument("--docs-per-row-group", type=int, default=1000)
    ap.add_argument("--mean", type=float, default=1000.0)
    ap.add_argument("--sigma", type=float, default=1.0)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--max-windows", type=int, default=100_000)
    ap.add_argument("--new-rule-windows", type=int, default=100_000, help="windows computed exactly for the new rule")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    b, w = args.lanes, args.window
    marks = [n for n in (10, 100, 1_000, 10_000, 100_000) if n <= args.max_windows]
    docs = w * args.docs_per_row_group
    spread_old, t_w = old_rule_spread(rng, b, docs, marks, args.mean, args.sigma)
    new_marks = [n for n in marks if n <= args.new_rule_windows]
    spread_new = new_rule_spread(rng, b, t_w, new_marks)
    share = t_w / b  # tokens per lane per window
    window_gib = t_w * 8 / 2**30  # decoded plus packed copy, 8 bytes per token
    step = (args.seq_len + 1) * b
    in_use = 2 + (1 if t_w <= step else 0)
    print(
        f"lanes={b}, window={w} row groups of {args.docs_per_row_group} documents (lognormal mean "
        f"{args.mean:.0f}, sigma {args.sigma}): T_w = {t_w / 1e6:.1f} M tokens, {share:,.0f} per lane, "
        f"about {window_gib:.2f} GiB held per window"
    )
    print(
        f"{'windows run':>12} | {'old: tokens apart':>17} {'windows held':>12} {'GiB held':>9} | "
        f"{'new: tokens apart':>17} {'windows held':>12} {'GiB held':>9}"
    )
    for i, n in enumerate(marks):
        held_old = math.ceil(spread_old[i] / share) + 2
        new = spread_new[i] if i < len(spread_new) else None
        new_txt = f"{new:>17}" if new is not None else f"{'<= 1 (proof)':>17}"
        print(
            f"{n:>12,} | {spread_old[i]:>17,} {held_old:>12,} {held_old * window_gib:>9.1f} | "
            f"{new_txt} {in_use:>12} {in_use * window_gib:>9.1f}"
        )
    print(
        "(held = windows between the slowest and fastest lane, plus the next; add the prefetch. "
        "New rule: every lane has ceil((R - k) / B) tokens after R tokens of the run, so the spread "
        "is at most 1 at any length; columns past --new-rule-windows rely on that identity.)"
    )


if __name__ == "__main__":
    main()
