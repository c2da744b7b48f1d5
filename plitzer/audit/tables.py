"""The audit's tables: plain functions that return Polars frames.

Each takes document lengths, a plan, or a source, and computes one view of the
dataset or plan; :func:`plitzer.audit.audit` gathers them into a report.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import polars as pl

from planner.api import PathSource, open_index
from planner.arraytypes import I64
from planner.catalog.rowgroups import RowGroupIndex
from planner.mixing.mixture import MixturePlan
from planner.order.epoch import PlanSettings
from planner.order.layout import Layout
from planner.order.plan import Plan
from plitzer.sources import opening
from plitzer.tools.explain import document_table

__all__ = [
    "I64",
    "Source",
    "duplicates",
    "epoch_starts",
    "epochs_covered",
    "lane_balance",
    "length_histogram",
    "length_summary",
    "lockstep",
    "mixture_shares",
    "padding",
    "read_amplification",
    "reads_per_rank",
    "source_repetitions",
    "step_balance",
    "step_sample",
]

Source = RowGroupIndex | PathSource


def length_summary(lengths: I64) -> pl.DataFrame:
    """documents, empty, min, p1, p10, median, mean, p90, p99, max of document lengths."""
    n = np.asarray(lengths, dtype=np.int64)
    q = np.percentile(n, [1, 10, 50, 90, 99]).round().astype(np.int64) if len(n) else np.zeros(5, np.int64)
    return pl.DataFrame(
        {
            "documents": [len(n)],
            "empty": [int((n == 0).sum())],
            "min": [int(n.min()) if len(n) else 0],
            "p1": [int(q[0])],
            "p10": [int(q[1])],
            "median": [int(q[2])],
            "mean": [round(float(n.mean()), 1) if len(n) else 0.0],
            "p90": [int(q[3])],
            "p99": [int(q[4])],
            "max": [int(n.max()) if len(n) else 0],
        }
    )


def length_histogram(lengths: I64) -> pl.DataFrame:
    """Documents and tokens per power-of-two length bin: [0, 1), [1, 2), [2, 4), [4, 8), ...

    >>> length_histogram(np.array([0, 1, 2, 3, 9]))["documents"].to_list()
    [1, 1, 2, 0, 1]
    """
    n = np.asarray(lengths, dtype=np.int64)
    b = np.zeros(len(n), np.int64)
    pos = n > 0
    b[pos] = np.floor(np.log2(n[pos])).astype(np.int64) + 1
    top = int(b.max()) + 1 if len(b) else 1
    docs = np.bincount(b, minlength=top)
    toks = np.bincount(b, weights=n, minlength=top).astype(np.int64)
    lo = np.array([0] + [1 << i for i in range(top - 1)], dtype=np.int64)
    hi = np.array([1] + [1 << (i + 1) for i in range(top - 1)], dtype=np.int64)
    total = max(1, int(n.sum()))
    return pl.DataFrame(
        {
            "from": lo,
            "below": hi,
            "documents": docs,
            "tokens": toks,
            "token_share": np.round(toks / total, 4),
        }
    )


def duplicates(
    source: Source, *, column: str | None = None, storage_options: Mapping[str, Any] | None = None
) -> pl.DataFrame:
    """Every copy of every non-empty document that occurs more than once (same length and hash).

    Columns: group (0, 1, ... by first occurrence), copies, length, hash, file,
    row_group, row, doc. The hash is 64 bits, so a false match is about as likely
    as 1 in 2**64 / documents**2.
    """
    docs = document_table(source, column=column, storage_options=storage_options).filter(pl.col("length") > 0)
    dup = docs.filter(pl.len().over("hash", "length") > 1)
    if dup.is_empty():
        return dup.select(
            pl.lit(0, pl.Int64).alias("group"),
            pl.lit(0, pl.Int64).alias("copies"),
            "length",
            "hash",
            "file",
            "row_group",
            "row",
            "doc",
        )
    return (
        dup.with_columns(
            pl.col("doc").min().over("hash", "length").alias("_first"),
            pl.len().over("hash", "length").cast(pl.Int64).alias("copies"),
        )
        .with_columns(pl.col("_first").rank("dense").cast(pl.Int64).sub(1).alias("group"))
        .sort("group", "doc")
        .select("group", "copies", "length", "hash", "file", "row_group", "row", "doc")
    )


def lane_balance(plan: Plan, epoch: int = 0) -> pl.DataFrame:
    """Tokens each lane receives in ``epoch``: lane, rank, tokens, vs_mean (tokens / mean - 1).

    From the plan's cut table alone; the lockstep rule keeps every lane within one
    token of every other over the run, so ``tokens`` differ by at most one.
    """
    s = plan.settings
    a, b = plan.cut_columns  # units: tokens, or best-fit's bins
    tok = plan.lanes(epoch).group_by("lane").agg((pl.col(b) - pl.col(a)).sum()).sort("lane")
    t = tok[b].to_numpy().astype(np.int64)
    mean = max(float(t.mean()), 1e-9)
    lane = np.arange(s.lanes, dtype=np.int64)
    return pl.DataFrame(
        {"lane": lane, "rank": lane // (s.lanes // s.world), "tokens": t, "vs_mean": np.round(t / mean - 1, 6)}
    )


def lockstep(plan: Plan, seq_len: int, steps: int | None = None) -> pl.DataFrame:
    """Per step: where the lanes are, which windows the step uses, and how even they are.

    Columns: step, epoch (label), slowest, fastest (units, ``epoch * windows +
    window``, of the lanes' next tokens), windows_apart, windows_in_use (the units
    the step reads from: what the loader must hold), token_spread (the most and
    fewest tokens any two lanes have received when the slowest lane's window ends,
    from the plan's cut table; the contract says at most 1). ``steps`` defaults to
    one epoch.
    """
    s = plan.settings
    total = plan.epoch_tokens
    b = s.lanes
    layout = Layout.one(b, seq_len)  # the first stage's (the audit draws lockstep for one layout)
    if steps is None:
        steps = max(1, int(layout.steps_at_runs(total)))
    t = np.arange(steps, dtype=np.int64)
    x = layout.runs_at(np.arange(steps + 1, dtype=np.int64))  # X(t): the run's tokens before each step
    run_needed = int(x[-1])
    ends: list[I64] = []  # run tokens through each unit
    spreads: list[I64] = []
    got = np.zeros(b, np.int64)
    before = 0
    epoch = 0
    while before < run_needed + b:
        lanes = plan.lanes(epoch)
        a, e = plan.cut_columns  # units: tokens, or best-fit's bins
        share = (lanes[e] - lanes[a]).to_numpy().astype(np.int64).reshape(-1, b)
        cum = got[None, :] + np.cumsum(share, axis=0)
        spreads.append(cum.max(axis=1) - cum.min(axis=1))
        ends.append(before + np.cumsum(share.sum(axis=1)))
        got = cum[-1]
        before += total
        epoch += 1
    run_end = np.concatenate(ends)
    spread = np.concatenate(spreads)
    slow = np.searchsorted(run_end, x[:-1], side="right")
    fast = np.searchsorted(run_end, x[:-1] + b - 1, side="right")
    last = np.searchsorted(run_end, x[1:] - 1, side="right")
    return pl.DataFrame(
        {
            "step": t,
            "epoch": x[:-1] // max(total, 1),
            "slowest": slow,
            "fastest": fast,
            "windows_apart": fast - slow,
            "windows_in_use": last - slow + 1,
            "token_spread": spread[slow],
        }
    )


def reads_per_rank(plan: Plan, epoch: int = 0) -> pl.DataFrame:
    """rank, row_groups, bytes, share (of the dataset's token-column bytes) in ``epoch``."""
    reads = plan.reads(epoch)
    dataset_bytes = max(1, int(plan.index["byte_length"].sum()))
    return (
        pl.DataFrame({"rank": np.arange(plan.settings.world, dtype=np.int64)})
        .join(
            reads.group_by("rank").agg(pl.len().cast(pl.Int64).alias("row_groups"), pl.col("bytes").sum()),
            on="rank",
            how="left",
        )
        .fill_null(0)
        .with_columns((pl.col("bytes") / dataset_bytes).round(4).alias("share"))
        .sort("rank")
    )


def read_amplification(
    source: Source | Plan, *, lanes: int, world: int, windows: Sequence[int] | None = None, seed: int = 0
) -> pl.DataFrame:
    """Reads per non-empty row group over all ranks, for each window size (epoch 0).

    Columns: window, reads, row_groups, amplification, bound, nominal_bound,
    bytes_read, bytes_amplification. ``nominal_bound`` is the design's ("Reads and read amplification")
    ``1 + (world-1)/window``; ``bound`` is ``1 + windows * (world-1) / row_groups``,
    the same bound counted per window, which a short last window makes slightly larger.
    """
    ix = source.dataset if isinstance(source, Plan) else open_index(source, opening=opening())
    g = ix.row_groups
    if windows is None:
        windows = sorted({w for w in (1, 2, 4, 8, 16, 32, 64, 128, 256) if w <= max(1, g)} | {max(1, g)})
    nonempty = max(1, int((ix.frame["rows"] > 0).sum()))
    dataset_bytes = max(1, int(ix.frame["byte_length"].sum()))
    rows = []
    for w in windows:
        p = Plan(ix, PlanSettings(seed=seed, lanes=lanes, window=w, world=world))
        r = p.reads(0)
        b = int(r["bytes"].sum())
        # Each window costs at most world - 1 extra reads, so a short last window counts fully.
        bound = 1 + p.windows * (world - 1) / nonempty
        rows.append((w, r.height, nonempty, r.height / nonempty, bound, 1 + (world - 1) / w, b, b / dataset_bytes))
    return pl.DataFrame(
        rows,
        schema=[
            "window",
            "reads",
            "row_groups",
            "amplification",
            "bound",
            "nominal_bound",
            "bytes_read",
            "bytes_amplification",
        ],
        orient="row",
    )


def epochs_covered(tokens: int, lanes: int, seq_len: int, steps: int, *, layout: Layout | None = None) -> pl.DataFrame:
    """What ``steps`` steps cover: tokens, epochs (fraction), and the last step's epoch label.

    The run's tokens before a step are ``layout.run_at(step)`` (``X(t)``; by default one
    stage of ``lanes`` and ``seq_len``), and ``steps_per_epoch`` is that of the first stage.

    >>> epochs_covered(tokens=1000, lanes=2, seq_len=100, steps=12)["epochs"][0]
    2.4
    """
    layout = layout if layout is not None else Layout.one(lanes, seq_len)
    run, last = (int(x) for x in layout.runs_at([steps, max(0, steps - 1)]))
    return pl.DataFrame(
        {
            "steps": [steps],
            "tokens": [run],
            "epochs": [run / tokens],
            "complete_epochs": [run // tokens],
            "last_step_epoch": [last // tokens],
            "steps_per_epoch": [tokens / layout.first.per_step],
        }
    )


def epoch_starts(tokens: int, lanes: int, seq_len: int, epochs: int, *, layout: Layout | None = None) -> pl.DataFrame:
    """epoch, first_step, steps: the steps labelled with each epoch (docs/glossary.md, "Step").

    ``layout``: the run's layout stages (by default one stage of ``lanes`` and ``seq_len``).
    """
    layout = layout if layout is not None else Layout.one(lanes, seq_len)
    e = np.arange(epochs + 1, dtype=np.int64)
    first = layout.steps_at_runs(e * tokens)
    return pl.DataFrame({"epoch": e[:-1], "first_step": first[:-1], "steps": np.diff(first)})


def mixture_shares(plan: MixturePlan, seq_len: int, epochs: int = 1) -> pl.DataFrame:
    """Per window of a mixture and source: target against delivered share of tokens.

    Columns: window (of the run), step (the first step that reads it), stage,
    source, target_share (its weight / the stage's), delivered_share (its tokens /
    all tokens, from the stage's first window through this one). The contract keeps
    ``delivered - target`` within one row group of the source, in tokens.
    """
    rg = pl.concat([plan.row_groups(e) for e in range(epochs)])
    w = plan.settings.window
    n_win = rg.height // w
    starts = plan.window_starts(n_win)
    lay = plan.layout if plan.layout is not None and plan.layout.staged else Layout.one(plan.settings.lanes, seq_len)
    # A stage's first run token: X(step), the run's tokens before its step (layout stages: planner.order.layout).
    bounds = lay.runs_at([st.start for st in plan.stages])
    stage = np.searchsorted(bounds, starts, side="right") - 1
    names = plan.names
    src = np.searchsorted(np.array(names), rg["source"].to_numpy())[: n_win * w]
    tok = rg["tokens"].to_numpy()[: n_win * w].astype(np.int64)
    per = np.zeros((n_win, len(names)), np.int64)
    np.add.at(per, (np.repeat(np.arange(n_win), w), src), tok)
    out = []
    for s in np.unique(stage).tolist():
        sel = np.flatnonzero(stage == s)
        cum = np.cumsum(per[sel], axis=0)
        total = np.maximum(cum.sum(axis=1, keepdims=True), 1)
        weights = np.array(plan.stages[s].weights, dtype=np.float64)
        for j, name in enumerate(names):
            out.append(
                pl.DataFrame(
                    {
                        "window": sel.astype(np.int64),
                        "step": lay.steps_holding(starts[sel]),
                        "stage": np.full(len(sel), s, np.int64),
                        "source": [name] * len(sel),
                        "target_share": np.full(len(sel), weights[j] / weights.sum()),
                        "delivered_share": cum[:, j] / total[:, 0],
                    }
                )
            )
    return pl.concat(out).sort("window", "source") if out else pl.DataFrame()


def source_repetitions(plan: MixturePlan, epochs: int = 1) -> pl.DataFrame:
    """Per mixture epoch and source: row groups read, source epochs begun, repetitions.

    ``repetitions`` is the source's row groups read so far over its row-group count:
    above 1 a source is being repeated (upsampled), below 1 partly used.
    """
    sizes = dict(zip(plan.names, [p.row_groups for p in plan.mixture.parts], strict=True))
    rg = pl.concat([plan.row_groups(e) for e in range(epochs)])
    per = (
        rg.group_by("epoch", "source")
        .agg(pl.len().alias("row_groups"), pl.col("source_epoch").max().alias("last_source_epoch"))
        .sort("source", "epoch")
        .with_columns(pl.col("row_groups").cum_sum().over("source").alias("read_so_far"))
        .with_columns(
            (pl.col("read_so_far") / pl.col("source").replace_strict(sizes, return_dtype=pl.Float64)).alias(
                "repetitions"
            )
        )
    )
    return per.sort("epoch", "source")


def padding(plan: Plan, epoch: int = 0, by: str = "window_index") -> pl.DataFrame:
    """Best-fit's padding (SPEC section 15) per window of ``epoch`` (or per ``by``: ``"source"``, ``"file"``).

    Columns: ``by``, bins, tokens (real), padding (tokens of ``pad_id``), padding_fraction
    (of the rows' tokens), floor_bins (the fewest bins whole row groups fit in: ``ceil(T_g / L)``
    a row group) and floor_fraction (the padding of those floor bins, of their tokens: the least
    any packing of whole row groups pads). From the plan's table: no data is read.

    A row group of 100 tokens at ``L = 64`` in 3 bins pads ``3 * 64 - 100 = 92`` tokens
    (padding_fraction ``92 / 192``); its floor is 2 bins, padding ``28`` (floor_fraction
    ``28 / 128``, of the floor's own bins).
    """
    _, _, seq_len = plan.packing
    rg = plan.row_groups(epoch)
    tokens = "tokens_selected" if "tokens_selected" in rg.columns else "tokens"
    if by not in rg.columns:  # a mixture's source: from the index
        rg = rg.with_columns(plan.index[by].gather(plan.epoch(epoch).order).alias(by))
    floor_bins = (pl.col(tokens) + seq_len - 1) // seq_len
    return (
        rg.group_by(by, maintain_order=True)
        .agg(
            pl.col("bins").sum(),
            pl.col(tokens).sum().alias("tokens"),
            pl.col("padding").sum(),
            floor_bins.sum().alias("floor_bins"),
        )
        .with_columns(
            padding_fraction=pl.col("padding") / (pl.col("bins") * seq_len).clip(1),
            # The floor's padding over the floor's own rows, not over the bins best-fit made.
            floor_fraction=(pl.col("floor_bins") * seq_len - pl.col("tokens"))
            / (pl.col("floor_bins") * seq_len).clip(1),
        )
        .sort(by)
    )


def step_sample(steps: int, most: int = 64, stretch: int = 8) -> list[tuple[int, int]]:
    """Stretches ``(first, last)`` of consecutive steps among ``steps``: all of them up to ``most``, else
    ``most // stretch`` stretches of ``stretch`` steps spread evenly from the first step to the last.

    >>> step_sample(20), step_sample(1000, most=16)
    ([(0, 19)], [(0, 7), (992, 999)])
    """
    if steps <= most:
        return [(0, steps - 1)] if steps > 0 else []
    starts = np.linspace(0, steps - stretch, most // stretch).astype(np.int64)
    return [(int(a), int(a) + stretch - 1) for a in np.unique(starts)]


def step_balance(plan: Plan, stretches: Sequence[tuple[int, int]]) -> pl.DataFrame:
    """Each step's imbalance: its slowest rank's attention cost over the mean rank's (SPEC section 18).

    Columns: step, assigned (the rows as section 4 assigns them: each rank its block of lanes),
    balanced (dealt by cost, ``balance=True``). From :meth:`planner.order.plan.Plan.costs` of the
    steps of ``stretches`` (``(first, last)`` each): document lengths only.
    """
    parts = [plan.costs(a, b) for a, b in stretches]
    costs = (
        pl.concat(parts) if parts else pl.DataFrame(schema=dict.fromkeys(("step", "assigned", "balanced"), pl.Int64))
    )
    return (
        costs.group_by("step")
        .agg(
            (pl.col("assigned").max() / pl.col("assigned").mean()).alias("assigned"),
            (pl.col("balanced").max() / pl.col("balanced").mean()).alias("balanced"),
        )
        .sort("step")
    )
