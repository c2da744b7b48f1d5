"""The audit's pictures: one matplotlib Figure per table, no pyplot, no display.

Each ``plot_*`` draws on ``ax`` when given, else on a new bare Figure (rendered
with Agg by ``savefig``). Axes are labelled with what a reader knows: file names,
row-group numbers, lanes, ranks and steps as whole numbers, never fractional
positions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl
from numpy.typing import NDArray

from plitzer.audit.tables import I64

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from planner.order.layout import Layout

__all__ = [
    "plot_amplification",
    "plot_lane_balance",
    "plot_layout",
    "plot_lengths",
    "plot_lockstep",
    "plot_mixture",
    "plot_padding",
    "plot_padding_per_source",
    "plot_reads_per_rank",
    "plot_step_balance",
    "plot_tokens_per_file",
    "plot_tokens_per_row_group",
]


def _figure(width: float = 7.0, height: float = 3.6) -> tuple[Figure, Axes]:
    # A bare Figure (no pyplot): nothing global changes, no display is needed, and
    # savefig renders with Agg.
    try:
        from matplotlib.figure import Figure
    except ImportError as e:
        msg = "the audit's pictures need matplotlib: pip install 'plitzer[bench]' (or matplotlib)"
        raise ImportError(msg) from e

    fig = Figure(figsize=(width, height), layout="constrained")
    return fig, fig.add_subplot()


def _axes(ax: Axes | None) -> tuple[Figure, Axes]:
    if ax is None:
        return _figure()
    from matplotlib.figure import Figure

    fig = ax.get_figure(root=True)
    assert isinstance(fig, Figure)
    return fig, ax


def _whole(ax: Axes) -> None:
    """Ticks on the x axis at whole numbers only (lanes, ranks, steps)."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _label(ax: Axes, at: NDArray[np.int64], names: list[str], most: int = 24) -> None:
    """Ticks at ``at`` named ``names``: every one when few, else every k-th (then at most ``most``)."""
    step = max(1, -(-len(at) // most))
    tilt = len(at) > 4 and max(map(len, names)) > 3  # long names side by side overlap
    ax.set_xticks(
        at[::step].tolist(),
        names[::step],
        rotation=45 if tilt else 0,
        ha="right" if tilt else "center",
        fontsize="small",
    )


def _names(ax: Axes, x: str, y: str, title: str) -> None:
    """Name the axes and the picture."""
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    ax.set_title(title)


def plot_lengths(lengths: I64, ax: Axes | None = None) -> Figure:
    """Histogram of document lengths, on log-spaced bins."""
    fig, ax = _axes(ax)
    n = np.asarray(lengths, dtype=np.int64)
    n = n[n > 0]
    top = max(2, int(n.max()) if len(n) else 2)
    bins = np.unique(np.geomspace(1, top + 1, 60).astype(np.int64))
    ax.hist(n, bins=bins.tolist(), color="#4477aa")
    ax.set_xscale("log")
    _names(ax, "document length (tokens)", "documents", "document lengths")
    if len(n):
        ax.axvline(float(np.median(n)), color="#cc6677", linestyle="--", label=f"median {int(np.median(n))}")
        # A fixed place: loc="best" searches the bars for the emptiest corner, and matplotlib
        # warns when that search takes over a second (a busy machine, many documents).
        ax.legend(loc="upper right", fontsize="small")
    return fig


def plot_tokens_per_file(index: pl.DataFrame, ax: Axes | None = None) -> Figure:
    """Tokens per file (bars), each bar labelled with its file's name."""
    fig, ax = _axes(ax)
    per = index.group_by("file_index", "file", maintain_order=True).agg(pl.col("tokens").sum())
    x = np.arange(per.height)
    ax.bar(x, per["tokens"].to_numpy(), color="#4477aa")
    _label(ax, x, per["file"].to_list())
    _names(ax, "file", "tokens", "tokens per file")
    return fig


def plot_tokens_per_row_group(index: pl.DataFrame, ax: Axes | None = None) -> Figure:
    """Tokens of every row group, in index order: ticks are row-group numbers, lines part files."""
    fig, ax = _axes(ax)
    ax.bar(np.arange(index.height), index["tokens"].to_numpy(), width=1.0, color="#228833")
    _label(ax, np.arange(index.height), [str(g) for g in index["row_group"].to_list()])
    starts = (
        index.with_row_index("at")
        .group_by("file_index", maintain_order=True)
        .agg(pl.col("at").first(), pl.col("file").first())
    )
    named = starts.height <= 12  # beyond that the names would overlap
    for at, name in starts.select("at", "file").iter_rows():
        ax.axvline(at - 0.5, color="gray", linewidth=0.5)
        if named:
            ax.text(at - 0.4, 0.98, name, transform=ax.get_xaxis_transform(), va="top", fontsize="x-small")
    _names(ax, "row group in its file (files in order, each from its line)", "tokens", "tokens per row group")
    return fig


def plot_lane_balance(balance: pl.DataFrame, ax: Axes | None = None) -> Figure:
    """Each lane's tokens in an epoch, relative to the mean."""
    fig, ax = _axes(ax)
    ax.bar(balance["lane"].to_numpy(), 100 * balance["vs_mean"].to_numpy(), width=1.0, color="#ee7733")
    ax.axhline(0, color="black", linewidth=0.8)
    _whole(ax)
    _names(ax, "lane", "tokens vs mean (%)", "lane balance over one epoch")
    return fig


def _two_steps(ax: Axes, x: Any, first: tuple[Any, str], second: tuple[Any, str]) -> None:
    """Two step lines over ``x``, each (values, label), in the report's two colours."""
    for (y, label), color in ((first, "#aa3377"), (second, "#4477aa")):
        ax.step(x, y, where="post", color=color, label=label)


def plot_lockstep(steps: pl.DataFrame, ax: Axes | None = None) -> Figure:
    """Windows in use per step, and the lanes' token spread (at most one: lockstep)."""
    from matplotlib.ticker import MaxNLocator

    fig, ax = _axes(ax)
    x = steps["step"].to_numpy()
    _two_steps(
        ax,
        x,
        (steps["windows_in_use"].to_numpy(), "windows in use"),
        (steps["token_spread"].to_numpy(), "token spread between lanes"),
    )
    _whole(ax)
    _names(ax, "step", "windows / tokens", "lanes in lockstep")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper right", fontsize="small")
    return fig


def plot_layout(layout: Layout, steps: int, ax: Axes | None = None) -> Figure:
    """Tokens per step (global batch) and sequence length over the run's layout stages."""
    fig, ax = _axes(ax)
    starts = [s.start for s in layout.stages] + [steps]
    x = np.array(starts, dtype=np.int64)
    tokens = [s.per_step for s in layout.stages]
    seq = [s.seq_len for s in layout.stages]
    _two_steps(ax, x, ([*tokens, tokens[-1]], "tokens per step"), ([*seq, seq[-1]], "sequence length"))
    ax.set_yscale("log")
    _names(ax, "step", "tokens", "layout stages: tokens per step and sequence length")
    ax.set_xlim(0, steps)
    ax.legend(loc="lower right", fontsize="small")
    return fig


def plot_reads_per_rank(reads: pl.DataFrame, ax: Axes | None = None) -> Figure:
    """Bytes each rank reads in an epoch."""
    fig, ax = _axes(ax)
    ax.bar(reads["rank"].to_numpy(), reads["bytes"].to_numpy() / 2**20, color="#4477aa")
    _whole(ax)
    _names(ax, "rank", "MiB read per epoch", "reads per rank")
    return fig


def plot_amplification(amp: pl.DataFrame, ax: Axes | None = None) -> Figure:
    """Read amplification versus window, with the bound 1 + (world-1)/window."""
    fig, ax = _axes(ax)
    w = amp["window"].to_numpy()
    ax.plot(w, amp["amplification"].to_numpy(), marker="o", label="measured (row groups)")
    ax.plot(w, amp["bytes_amplification"].to_numpy(), marker=".", linestyle=":", label="measured (bytes)")
    ax.plot(w, amp["bound"].to_numpy(), linestyle="--", color="gray", label="bound: world-1 extra reads per window")
    ax.plot(w, amp["nominal_bound"].to_numpy(), linestyle=":", color="gray", label="1 + (world-1)/W")
    ax.set_xscale("log", base=2)
    _names(ax, "window (row groups)", "reads per row group", "read amplification versus window")
    ax.legend(loc="upper right", fontsize="small")  # the curves fall with the window
    return fig


def plot_mixture(shares: pl.DataFrame, ax: Axes | None = None) -> Figure:
    """Each source's delivered share of tokens per step (solid) against its target (dashed)."""
    fig, ax = _axes(ax)
    for i, (name, g) in enumerate(shares.sort("window").group_by("source", maintain_order=True)):
        color = f"C{i}"
        x = g["step"].to_numpy()
        ax.step(x, 100 * g["delivered_share"].to_numpy(), where="post", color=color, label=f"{name[0]}")
        ax.step(x, 100 * g["target_share"].to_numpy(), where="post", color=color, linestyle="--", linewidth=0.8)
    _names(ax, "step", "share of tokens (%)", "mixture: delivered (solid) against target (dashed)")
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper right", fontsize="small")
    return fig


def plot_padding(per_window: pl.DataFrame, ax: Axes | None = None) -> Figure:
    """Best-fit's padding per window of an epoch, against its floor (whole row groups' ``ceil(T_g / L)`` bins)."""
    fig, ax = _axes(ax)
    x = per_window["window_index"].to_numpy()
    ax.plot(x, 100 * per_window["padding_fraction"].to_numpy(), color="#ee7733", label="padding")
    ax.plot(x, 100 * per_window["floor_fraction"].to_numpy(), color="black", linestyle="--", label="floor")
    ax.legend(loc="upper right")
    _whole(ax)
    _names(ax, "window", "padding (% of row tokens)", "best-fit padding per window, epoch 0")
    return fig


def plot_padding_per_source(per_source: pl.DataFrame, ax: Axes | None = None) -> Figure:
    """Best-fit's padding of each source of a mixture, against its floor (bars, epoch 0)."""
    fig, ax = _axes(ax)
    names = per_source["source"].to_list()
    x = np.arange(len(names))
    ax.bar(x - 0.2, 100 * per_source["padding_fraction"].to_numpy(), width=0.4, color="#ee7733", label="padding")
    ax.bar(x + 0.2, 100 * per_source["floor_fraction"].to_numpy(), width=0.4, color="#999999", label="floor")
    ax.set_xticks(x, names)
    ax.legend(loc="upper right")
    _names(ax, "source", "padding (% of row tokens)", "best-fit padding per source, epoch 0")
    return fig


def plot_step_balance(balance: pl.DataFrame, ax: Axes | None = None) -> Figure:
    """Each sampled step's slowest rank against the mean rank (attention cost), as assigned and balanced."""
    fig, ax = _axes(ax)
    x = balance["step"].to_numpy()
    ax.plot(x, balance["assigned"].to_numpy(), ".", color="#cc6677", label="as assigned (a block of lanes a rank)")
    ax.plot(x, balance["balanced"].to_numpy(), ".", color="#4477aa", label="balanced (rows dealt by cost)")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_ylim(bottom=min(0.95, ax.get_ylim()[0]))
    ax.legend(loc="upper right", fontsize="small")
    _whole(ax)
    _names(ax, "step", "slowest rank / mean rank", "attention work per step: imbalance between ranks")
    return fig
