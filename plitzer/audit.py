"""Dataset and plan health in one report: tables, pictures, and one HTML page.

Every number here comes from the same places the loader uses: the row-group index
(footers), the plan's tables, and document lengths (one cached pass over the
token column, see :mod:`plitzer.explain`). The pieces are plain functions that
return Polars frames, so a notebook can call them one by one:

- :func:`length_histogram`, :func:`length_summary`: the document-length distribution.
- :func:`duplicates`: documents with the same content hash (and length).
- :func:`lane_balance`: tokens each lane receives in an epoch (within one of each other).
- :func:`lockstep`: per step, the windows the lanes sit in, the windows the step
  uses, and how far apart the lanes' token counts are (never more than one).
- :func:`read_amplification`: reads per row group versus window, with the bound
  ``1 + (world - 1) / window`` of SPEC section 4.
- :func:`epochs_covered`: how many epochs a number of steps covers.

:func:`audit` runs them all and returns a :class:`Report`, whose ``write`` puts an
HTML page with PNG pictures (matplotlib, Agg, no display needed) in a file or a
folder.

>>> import plitzer.synth, tempfile
>>> d = tempfile.mkdtemp(); _ = plitzer.synth.write(d, tokens=30_000, seed=0, docs_per_row_group=40)
>>> r = audit(d, lanes=4, window=2, world=2, seq_len=64)
>>> r.tables["summary"]["tokens"][0] == plitzer.index(d).tokens
True
"""

from __future__ import annotations

import base64
import html
import io
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl
from numpy.typing import NDArray

from planner.dataset import Index, ensure_index
from planner.plan import Plan, PlanSettings
from plitzer.explain import _documents, document_table

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "Report",
    "audit",
    "duplicates",
    "epochs_covered",
    "lane_balance",
    "lockstep",
    "length_histogram",
    "length_summary",
    "read_amplification",
    "reads_per_rank",
]

I64 = NDArray[np.int64]
Source = Index | str | os.PathLike[str] | Sequence[str | os.PathLike[str]]


# -- tables ---------------------------------------------------------------------------


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
    tok = plan.lanes(epoch).group_by("lane").agg((pl.col("token_end") - pl.col("token_start")).sum()).sort("lane")
    t = tok["token_end"].to_numpy().astype(np.int64)
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
    total = plan.tokens
    b = s.lanes
    per_step = b * seq_len
    if steps is None:
        steps = max(1, -(-total // per_step))
    run_needed = steps * per_step
    ends: list[I64] = []  # run tokens through each unit
    spreads: list[I64] = []
    got = np.zeros(b, np.int64)
    before = 0
    epoch = 0
    while before < run_needed + b:
        lanes = plan.lanes(epoch)
        share = (lanes["token_end"] - lanes["token_start"]).to_numpy().astype(np.int64).reshape(-1, b)
        cum = got[None, :] + np.cumsum(share, axis=0)
        spreads.append(cum.max(axis=1) - cum.min(axis=1))
        ends.append(before + np.cumsum(share.sum(axis=1)))
        got = cum[-1]
        before += total
        epoch += 1
    run_end = np.concatenate(ends)
    spread = np.concatenate(spreads)
    t = np.arange(steps, dtype=np.int64)
    slow = np.searchsorted(run_end, t * per_step, side="right")
    fast = np.searchsorted(run_end, t * per_step + b - 1, side="right")
    last = np.searchsorted(run_end, (t + 1) * per_step - 1, side="right")
    return pl.DataFrame(
        {
            "step": t,
            "epoch": t * per_step // max(total, 1),
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
    bytes_read, bytes_amplification. ``nominal_bound`` is SPEC section 4's
    ``1 + (world-1)/window``; ``bound`` is ``1 + windows * (world-1) / row_groups``,
    the same bound counted per window, which a short last window makes slightly larger.
    """
    ix = source.dataset if isinstance(source, Plan) else ensure_index(source)
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


def epochs_covered(tokens: int, lanes: int, seq_len: int, steps: int) -> pl.DataFrame:
    """What ``steps`` steps cover: tokens, epochs (fraction), and the last step's epoch label.

    >>> epochs_covered(tokens=1000, lanes=2, seq_len=100, steps=12)["epochs"][0]
    2.4
    """
    per_step = lanes * seq_len
    return pl.DataFrame(
        {
            "steps": [steps],
            "tokens": [steps * per_step],
            "epochs": [steps * per_step / tokens],
            "complete_epochs": [steps * per_step // tokens],
            "last_step_epoch": [max(0, steps - 1) * per_step // tokens],
            "steps_per_epoch": [tokens / per_step],
        }
    )


def epoch_starts(tokens: int, lanes: int, seq_len: int, epochs: int) -> pl.DataFrame:
    """epoch, first_step, steps: the steps labelled with each epoch (SPEC section 3, point 8)."""
    per_step = lanes * seq_len
    e = np.arange(epochs + 1, dtype=np.int64)
    first = -(-e * tokens // per_step)
    return pl.DataFrame({"epoch": e[:-1], "first_step": first[:-1], "steps": np.diff(first)})


# -- pictures -------------------------------------------------------------------------


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


def plot_lengths(lengths: I64, ax: Axes | None = None) -> Figure:
    """Histogram of document lengths, on log-spaced bins."""
    fig, ax = _axes(ax)
    n = np.asarray(lengths, dtype=np.int64)
    n = n[n > 0]
    top = max(2, int(n.max()) if len(n) else 2)
    bins = np.unique(np.geomspace(1, top + 1, 60).astype(np.int64))
    ax.hist(n, bins=bins.tolist(), color="#4477aa")
    ax.set_xscale("log")
    ax.set_xlabel("document length (tokens)")
    ax.set_ylabel("documents")
    if len(n):
        ax.axvline(float(np.median(n)), color="#cc6677", linestyle="--", label=f"median {int(np.median(n))}")
        ax.legend()
    ax.set_title("document lengths")
    return fig


def plot_tokens_per_file(index: pl.DataFrame, ax: Axes | None = None) -> Figure:
    """Tokens per file (bars)."""
    fig, ax = _axes(ax)
    per = index.group_by("file_index", maintain_order=True).agg(pl.col("tokens").sum())
    ax.bar(per["file_index"].to_numpy(), per["tokens"].to_numpy(), color="#4477aa")
    ax.set_xlabel("file (index)")
    ax.set_ylabel("tokens")
    ax.set_title("tokens per file")
    return fig


def plot_tokens_per_row_group(index: pl.DataFrame, ax: Axes | None = None) -> Figure:
    """Tokens of every row group, in index order."""
    fig, ax = _axes(ax)
    ax.bar(np.arange(index.height), index["tokens"].to_numpy(), width=1.0, color="#228833")
    ax.set_xlabel("row group (index order)")
    ax.set_ylabel("tokens")
    ax.set_title("tokens per row group")
    return fig


def plot_lane_balance(balance: pl.DataFrame, ax: Axes | None = None) -> Figure:
    """Each lane's tokens in an epoch, relative to the mean."""
    fig, ax = _axes(ax)
    ax.bar(balance["lane"].to_numpy(), 100 * balance["vs_mean"].to_numpy(), width=1.0, color="#ee7733")
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xlabel("lane")
    ax.set_ylabel("tokens vs mean (%)")
    ax.set_title("lane balance over one epoch")
    return fig


def plot_lockstep(steps: pl.DataFrame, ax: Axes | None = None) -> Figure:
    """Windows in use per step, and the lanes' token spread (at most one: lockstep)."""
    from matplotlib.ticker import MaxNLocator

    fig, ax = _axes(ax)
    x = steps["step"].to_numpy()
    ax.step(x, steps["windows_in_use"].to_numpy(), where="post", color="#aa3377", label="windows in use")
    ax.step(x, steps["token_spread"].to_numpy(), where="post", color="#4477aa", label="token spread between lanes")
    ax.set_xlabel("step")
    ax.set_ylabel("windows / tokens")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper right", fontsize="small")
    ax.set_title("lanes in lockstep")
    return fig


def plot_reads_per_rank(reads: pl.DataFrame, ax: Axes | None = None) -> Figure:
    """Bytes each rank reads in an epoch."""
    fig, ax = _axes(ax)
    ax.bar(reads["rank"].to_numpy(), reads["bytes"].to_numpy() / 2**20, color="#4477aa")
    ax.set_xlabel("rank")
    ax.set_ylabel("MiB read per epoch")
    ax.set_title("reads per rank")
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
    ax.set_xlabel("window (row groups)")
    ax.set_ylabel("reads per row group")
    ax.set_title("read amplification versus window")
    ax.legend()
    return fig


# -- the report -----------------------------------------------------------------------


@dataclass
class Report:
    """An audit's tables (Polars frames) and figures (matplotlib), ready to write."""

    title: str
    tables: dict[str, pl.DataFrame]
    figures: dict[str, Figure]
    notes: dict[str, str] = field(default_factory=dict)

    def png(self, name: str) -> bytes:
        buf = io.BytesIO()
        self.figures[name].savefig(buf, format="png", dpi=96)
        return buf.getvalue()

    def html(self, images: Mapping[str, str] | None = None) -> str:
        """The page; ``images`` maps figure names to URLs (default: embedded PNGs)."""
        parts = [
            "<!doctype html><html><head><meta charset='utf-8'>",
            f"<title>{html.escape(self.title)}</title>",
            "<style>body{font-family:sans-serif;max-width:1000px;margin:2em auto}"
            "table{border-collapse:collapse;margin:0.5em 0}td,th{border:1px solid #ccc;padding:2px 8px;"
            "text-align:right}th{background:#eee}img{max-width:100%}</style></head><body>",
            f"<h1>{html.escape(self.title)}</h1>",
        ]
        for section, (tables, figures) in _SECTIONS.items():
            if not any(t in self.tables for t in tables) and not any(f in self.figures for f in figures):
                continue
            parts.append(f"<h2>{html.escape(section)}</h2>")
            if section in self.notes:
                parts.append(f"<p>{html.escape(self.notes[section])}</p>")
            for f in figures:
                if f in self.figures:
                    src = (images or {}).get(f) or "data:image/png;base64," + base64.b64encode(self.png(f)).decode()
                    parts.append(f"<p><img alt='{html.escape(f)}' src='{html.escape(src)}'></p>")
            parts.extend(_html_table(self.tables[t], t) for t in tables if t in self.tables)
        parts.append("</body></html>")
        return "\n".join(parts)

    def write(self, out: str | os.PathLike[str]) -> Path:
        """Write the report: ``*.html`` is one self-contained page; otherwise ``out`` is a
        folder that receives ``report.html`` and one PNG per figure. Returns the page's path."""
        path = Path(out)
        if path.suffix.lower() in {".html", ".htm"}:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(self.html(), encoding="utf-8")
            return path
        path.mkdir(parents=True, exist_ok=True)
        links = {}
        for name in self.figures:
            (path / f"{name}.png").write_bytes(self.png(name))
            links[name] = f"{name}.png"
        page = path / "report.html"
        page.write_text(self.html(links), encoding="utf-8")
        return page


_SECTIONS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "Dataset": (("summary", "settings"), ()),
    "Document lengths": (("length_summary", "length_histogram"), ("lengths",)),
    "Tokens per file and row group": (("tokens_per_file",), ("tokens_per_file", "tokens_per_row_group")),
    "Lane balance and lockstep": (("lane_balance_summary", "lockstep_summary"), ("lane_balance", "lockstep")),
    "Reads": (("reads_per_rank", "read_amplification"), ("reads_per_rank", "read_amplification")),
    "Duplicate documents": (("duplicates",), ()),
    "Epochs": (("epochs_covered", "epoch_starts"), ()),
}


def _html_table(df: pl.DataFrame, caption: str, limit: int = 50) -> str:
    def cell(v: object) -> str:
        if isinstance(v, float):
            return f"{v:,.4g}"
        if isinstance(v, int) and not isinstance(v, bool):
            return f"{v:,}"
        return html.escape("" if v is None else str(v))

    head = "".join(f"<th>{html.escape(c)}</th>" for c in df.columns)
    body = "".join("<tr>" + "".join(f"<td>{cell(v)}</td>" for v in row) + "</tr>" for row in df.head(limit).iter_rows())
    more = f"<p>... {df.height - limit:,} more rows</p>" if df.height > limit else ""
    return f"<table><caption>{html.escape(caption)}</caption><tr>{head}</tr>{body}</table>{more}"


def audit(
    source: Source,
    *,
    seed: int = 0,
    lanes: int = 512,
    window: int = 64,
    world: int = 1,
    seq_len: int = 2048,
    steps: int | None = None,
    windows: Sequence[int] | None = None,
    column: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    progress: bool | None = None,
) -> Report:
    """Audit a dataset and its plan for the given settings.

    ``steps`` (default: one epoch) is the run length for the epoch table; ``windows``
    the window sizes compared for read amplification. Reads every row group's token
    column once (lengths and hashes, cached); the rest is footers and plan tables.
    """
    ix = ensure_index(source, column=column, storage_options=storage_options)
    plan = Plan(ix, PlanSettings(seed=seed, lanes=lanes, window=window, world=world))
    lengths = _documents(ix, progress=progress)[0]
    f = ix.frame
    total = ix.tokens
    per_epoch = -(-total // (lanes * seq_len))
    steps = per_epoch if steps is None else steps

    tables: dict[str, pl.DataFrame] = {}
    figures: dict[str, Figure] = {}
    notes: dict[str, str] = {}
    tables["summary"] = pl.DataFrame(
        {
            "files": [len(ix.files)],
            "row_groups": [f.height],
            "documents": [int(f["rows"].sum())],
            "tokens": [total],
            "token_bytes": [int(f["byte_length"].sum())],
            "column": [ix.column],
            "dtype": [ix.dtype],
            "fingerprint": [ix.fingerprint[:16]],
        }
    )
    tables["settings"] = pl.DataFrame(
        {
            "seed": [seed],
            "lanes": [lanes],
            "window": [window],
            "world": [world],
            "seq_len": [seq_len],
            "windows_per_epoch": [plan.windows],
            "steps_per_epoch": [per_epoch],
        }
    )
    tables["length_summary"] = length_summary(lengths)
    tables["length_histogram"] = length_histogram(lengths)
    figures["lengths"] = plot_lengths(lengths)
    tables["tokens_per_file"] = (
        f.group_by("file_index", "file", maintain_order=True)
        .agg(pl.len().alias("row_groups"), pl.col("rows").sum().alias("documents"), pl.col("tokens").sum())
        .sort("file_index")
    )
    figures["tokens_per_file"] = plot_tokens_per_file(f)
    figures["tokens_per_row_group"] = plot_tokens_per_row_group(f)

    balance = lane_balance(plan, 0)
    drift = lockstep(plan, seq_len, steps=min(steps, 20 * per_epoch))
    tables["lane_balance_summary"] = balance.select(
        pl.col("tokens").min().alias("min_tokens"),
        pl.col("tokens").mean().alias("mean_tokens"),
        pl.col("tokens").max().alias("max_tokens"),
        pl.col("vs_mean").abs().max().alias("max_abs_vs_mean"),
        pl.col("lane").get(pl.col("tokens").arg_max()).alias("richest_lane"),
        pl.col("lane").get(pl.col("tokens").arg_min()).alias("poorest_lane"),
    )
    tables["lockstep_summary"] = drift.select(
        pl.len().alias("steps"),
        pl.col("windows_apart").max().alias("max_windows_apart"),
        pl.col("windows_in_use").max().alias("max_windows_in_use"),
        pl.col("token_spread").max().alias("max_token_spread"),
        (pl.col("token_spread").max() <= 1).alias("lockstep"),
    )
    figures["lane_balance"] = plot_lane_balance(balance)
    figures["lockstep"] = plot_lockstep(drift)
    notes["Lane balance and lockstep"] = (
        "Tokens each lane receives in epoch 0 (within one of each other), and per step the "
        "windows the step reads from (what the loader holds, besides prefetch) and the spread "
        "of tokens received between any two lanes, which the lockstep rule keeps at most 1."
    )

    rpr = reads_per_rank(plan, 0)
    amp = read_amplification(ix, lanes=lanes, world=world, windows=windows, seed=seed)
    tables["reads_per_rank"] = rpr
    tables["read_amplification"] = amp
    figures["reads_per_rank"] = plot_reads_per_rank(rpr)
    figures["read_amplification"] = plot_amplification(amp)

    dup = duplicates(ix)
    tables["duplicates"] = dup
    groups = int(dup["group"].n_unique()) if dup.height else 0
    kept = int(dup.group_by("group").agg(pl.col("length").first())["length"].sum()) if dup.height else 0
    notes["Duplicate documents"] = (
        f"{dup.height:,} documents in {groups:,} groups of identical documents: "
        f"{dup.height - groups:,} redundant copies, {int(dup['length'].sum()) - kept:,} redundant tokens."
    )
    tables["epochs_covered"] = epochs_covered(total, lanes, seq_len, steps)
    tables["epoch_starts"] = epoch_starts(total, lanes, seq_len, min(50, steps * lanes * seq_len // total + 1))
    return Report(title=f"plitzer audit: {ix.source}", tables=tables, figures=figures, notes=notes)
