"""The audit report: every table and picture for one dataset and plan, as one HTML page."""

from __future__ import annotations

import base64
import html
import io
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Unpack

import polars as pl

from planner.catalog.rowgroups import RowGroupIndex
from planner.mixing.mixture import MixturePlan
from planner.order.layout import Layout
from planner.order.plan import Plan
from planner.order.runsteps import run_steps
from planner.parameters import keywords_of
from plitzer.audit import pictures as pic
from plitzer.audit import tables as tab
from plitzer.audit.tables import Source
from plitzer.selection.select import select_config
from plitzer.sources import index_of
from plitzer.state.settings import Keywords, LoaderSettings, make_plan
from plitzer.tools.explain import document_pass

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from plitzer.audit.tables import I64

    _Sections = tuple[dict[str, pl.DataFrame], dict[str, Figure], dict[str, str]]

__all__ = ["Report", "audit"]


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
    "Selection": (("selection", "selection_per_source"), ()),
    "Duplicate documents": (("duplicates", "deduplication"), ()),
    "Padding (best-fit)": (
        ("padding", "padding_per_window", "padding_per_source"),
        ("padding", "padding_per_source"),
    ),
    "Balanced steps": (("step_balance_summary", "step_balance"), ("step_balance",)),
    "Epochs": (("epochs_covered", "epoch_starts"), ()),
    "Layout stages": (("layout",), ("layout",)),
}


def _layout_section(plan: Plan, layout: Layout, steps: int, out: _Sections) -> None:
    """The layout stages: the table and a picture of tokens per step and sequence length over the run."""
    tables, figures, notes = out
    tables["layout"] = plan.layout_table()
    figures["layout"] = pic.plot_layout(layout, max(steps, layout.stages[-1].start + 1))
    notes["Layout stages"] = (
        "Lanes and sequence length from each stage's step on (SPEC section 12): at a stage's first step "
        "the window in use is cut again into the new lanes (recut_window_index), later windows as usual. "
        "The lane balance and lockstep pictures above are those of the first stage's layout."
    )


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


def _columns_shown(plan: Plan) -> str:
    return ", ".join(n + ("" if f is None else f" (fill {f!r})") for n, f in plan.columns)


def _dataset_section(ix: RowGroupIndex, plan: Plan, cfg: LoaderSettings, lengths: I64, out: _Sections) -> None:
    """Summary, settings, document lengths and tokens per file and row group."""
    tables, figures, _ = out
    f = ix.frame
    per_epoch = Layout.one(cfg.lanes, cfg.units_per_row).step_at_run(plan.epoch_tokens)
    tables["summary"] = pl.DataFrame(
        {
            "files": [len(ix.files)],
            "row_groups": [f.height],
            "documents": [int(f["rows"].sum())],
            "tokens": [ix.tokens],
            "token_bytes": [int(f["byte_length"].sum())],
            "column": [ix.column],
            "dtype": [ix.dtype],
            "fingerprint": [ix.fingerprint[:16]],
        }
    )
    tables["settings"] = pl.DataFrame(
        {
            **{k: [v] for k, v in keywords_of(cfg.plan).items()},  # seed, lanes, window, world
            "seq_len": [cfg.seq_len],
            "windows_per_epoch": [plan.windows],
            "steps_per_epoch": [per_epoch],
            # The aligned columns the run carries (SPEC section 13), where it names some.
            **({"columns": [_columns_shown(plan)]} if plan.columns else {}),
        }
    )
    tables["length_summary"] = tab.length_summary(lengths)
    tables["length_histogram"] = tab.length_histogram(lengths)
    figures["lengths"] = pic.plot_lengths(lengths)
    tables["tokens_per_file"] = (
        f.group_by("file_index", "file", maintain_order=True)
        .agg(pl.len().alias("row_groups"), pl.col("rows").sum().alias("documents"), pl.col("tokens").sum())
        .sort("file_index")
    )
    figures["tokens_per_file"] = pic.plot_tokens_per_file(f)
    figures["tokens_per_row_group"] = pic.plot_tokens_per_row_group(f)


def _lanes_section(plan: Plan, seq_len: int, steps: int, per_epoch: int, out: _Sections) -> None:
    """Lane balance in epoch 0 and lockstep over the run."""
    tables, figures, notes = out
    balance = tab.lane_balance(plan, 0)
    drift = tab.lockstep(plan, seq_len, steps=min(steps, 20 * per_epoch))
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
    figures["lane_balance"] = pic.plot_lane_balance(balance)
    figures["lockstep"] = pic.plot_lockstep(drift)
    notes["Lane balance and lockstep"] = (
        "Tokens each lane receives in epoch 0 (within one of each other), and per step the "
        "windows the step reads from (what the loader holds, besides prefetch) and the spread "
        "of tokens received between any two lanes, which the lockstep rule keeps at most 1."
    )


def _mixture_section(plan: MixturePlan, seq_len: int, epochs: int, out: _Sections) -> None:
    """Each source's share per stage, and its repetitions."""
    tables, figures, notes = out
    shares = tab.mixture_shares(plan, seq_len, epochs)
    tables["mixture_shares"] = shares
    tables["source_repetitions"] = tab.source_repetitions(plan, epochs)
    tables["sources"] = plan.sources()
    figures["mixture"] = pic.plot_mixture(shares)
    notes["Mixture"] = (
        "Per source, its share of the run's tokens within each stage, window after window, "
        "against its target (dashed); and how many times each source has been repeated "
        "(source epochs begun) by the end of each mixture epoch."
    )


def _reads_section(plan: Plan, cfg: LoaderSettings, windows: Sequence[int] | None, out: _Sections) -> None:
    """Reads per rank, and read amplification versus window."""
    tables, figures, _ = out
    rpr = tab.reads_per_rank(plan, 0)
    amp = tab.read_amplification(plan, lanes=cfg.lanes, world=cfg.world, windows=windows, seed=cfg.seed)
    tables["reads_per_rank"] = rpr
    tables["read_amplification"] = amp
    figures["reads_per_rank"] = pic.plot_reads_per_rank(rpr)
    figures["read_amplification"] = pic.plot_amplification(amp)


def _selection_section(ix: RowGroupIndex, out: _Sections) -> None:
    """Kept against total rows and tokens, per file and per source (``where=``, plitzer.selection.select)."""
    tables, _, notes = out
    f = ix.frame
    keys = ["source", "file_index", "file"] if "source" in f.columns else ["file_index", "file"]
    counts = [pl.col(c).sum() for c in ("rows", "rows_selected", "tokens", "tokens_selected")]
    share = (pl.col("tokens_selected") / pl.col("tokens")).alias("kept_share")
    tables["selection"] = f.group_by(keys, maintain_order=True).agg(counts).with_columns(share).sort("file_index")
    if "source" in f.columns:
        tables["selection_per_source"] = (
            f.group_by("source", maintain_order=True).agg(counts).with_columns(share).sort("source")
        )
    cfg = select_config(ix)
    kept, total = int(f["tokens_selected"].sum()), int(f["tokens"].sum())
    emptied = int((f["rows_selected"] == 0).sum())
    notes["Selection"] = (
        f"where={cfg['where']!r}: {kept:,} of {total:,} tokens kept ({kept / max(1, total):.1%}); {emptied:,} "
        "row groups keep no row (they stay in the order, give no token and are never read)."
    )


def _duplicates_section(ix: RowGroupIndex, out: _Sections) -> None:
    from plitzer.selection.dropped import base_of, dedupe_table

    tables, _, notes = out
    base = base_of(ix)  # under dedupe=/exclude=: the documents before it, so the note says what it dropped
    dup = tab.duplicates(base)
    tables["duplicates"] = dup
    groups = int(dup["group"].n_unique()) if dup.height else 0
    kept = int(dup.group_by("group").agg(pl.col("length").first())["length"].sum()) if dup.height else 0
    extra = int(dup["length"].sum()) - kept
    note = (
        f"{dup.height:,} documents in {groups:,} groups of identical documents: "
        f"{dup.height - groups:,} redundant copies, {extra:,} redundant tokens. "
    )
    if base is ix:
        note += (
            f"dedupe='tokens' would drop those {dup.height - groups:,} later copies ({extra:,} tokens), each "
            "group keeping its first document in source order."
        )
    else:
        table = dedupe_table(ix)
        tables["deduplication"] = table
        cfg = ix.config_fields()
        how = ", ".join(f"{k}={cfg[k]!r}" for k in ("dedupe", "exclude") if cfg.get(k))
        note += (
            f"Under {how} the run dropped {int(table['rows_duplicate'].sum()):,} duplicates and "
            f"{int(table['rows_excluded'].sum()):,} excluded documents "
            f"({int(table['tokens'].sum()) - int(table['tokens_kept'].sum()):,} tokens): table deduplication."
        )
    notes["Duplicate documents"] = note


_AUDIT_OWN = ("steps", "windows", "progress")  # its own keywords, besides the run's parameters


def _padding_section(plan: Plan, out: _Sections) -> None:
    """Best-fit's padding: in all, per window (a picture) and per source, against the floor."""
    tables, figures, notes = out
    per_window = tab.padding(plan, 0)
    tables["padding"] = per_window.select(
        pl.col("bins").sum(),
        pl.col("tokens").sum(),
        pl.col("padding").sum(),
        (pl.col("padding").sum() / (pl.col("bins").sum() * plan.packing[2]).clip(1)).alias("padding_fraction"),
        pl.col("floor_bins").sum(),
        (
            (pl.col("floor_bins").sum() * plan.packing[2] - pl.col("tokens").sum())
            / (pl.col("floor_bins").sum() * plan.packing[2]).clip(1)
        ).alias("floor_fraction"),
    )
    tables["padding_per_window"] = per_window
    if isinstance(plan, MixturePlan):
        tables["padding_per_source"] = tab.padding(plan, 0, by="source")
        figures["padding_per_source"] = pic.plot_padding_per_source(tables["padding_per_source"])
    figures["padding"] = pic.plot_padding(per_window)
    notes["Padding (best-fit)"] = (
        "Under packing='best-fit' every document of at most seq_len tokens is whole in one row, and "
        "each row (a bin) ends in padding: the share of padding tokens per window of epoch 0, against "
        "the floor of whole row groups (ceil(tokens / seq_len) bins each: bins never cross a row group)."
    )


BALANCE_STEPS = 64
"""The most steps whose imbalance the audit draws: every step audited, else stretches of 8 spread over them."""


def _balance_section(plan: Plan, steps: int, out: _Sections) -> None:
    """Balanced steps (SPEC section 18): each sampled step's slowest rank over the mean rank, both ways."""
    tables, figures, notes = out
    end = run_steps(plan, plan.layout) if plan.layout is not None else None  # a finite run's steps
    sample = tab.step_sample(steps if end is None else min(steps, end), BALANCE_STEPS)
    balance = tab.step_balance(plan, sample)
    tables["step_balance"] = balance
    tables["step_balance_summary"] = pl.concat(
        balance.select(
            pl.lit(c).alias("rows"),
            pl.len().alias("steps"),
            pl.col(c).median().alias("median"),
            pl.col(c).quantile(0.95, "linear").alias("p95"),
            pl.col(c).max().alias("max"),
        )
        for c in ("assigned", "balanced")
    )
    figures["step_balance"] = pic.plot_step_balance(balance)
    notes["Balanced steps"] = (
        "Under document masking a row's attention work is the sum of n * n over its documents (its "
        "doc_lengths), so ranks holding long documents are slower. Per step, the slowest of the "
        f"{plan.settings.world} ranks' work over the mean rank's: with each rank its block of lanes "
        "(assigned) and with the step's rows dealt by cost (balanced, balance=True). "
        f"{balance.height} steps in {len(sample)} stretches, from plan.costs (document lengths only)."
    )


def audit(
    source: Source,
    *,
    steps: int | None = None,
    windows: Sequence[int] | None = None,
    progress: bool | None = None,
    **settings: Unpack[Keywords],
) -> Report:
    """Audit a dataset and its plan for the given settings.

    ``steps`` (default: one epoch) is the run length for the epoch table; ``windows``
    the window sizes compared for read amplification. Reads every row group's token
    column once (lengths and hashes, cached); the rest is footers and plan tables.
    """
    cfg = LoaderSettings.of(caller="plitzer.audit", own=_AUDIT_OWN, **settings)
    # The order's arithmetic counts the rule's units (tokens; best-fit's bins, one a row): so do these tables.
    lanes, seq_len = cfg.lanes, cfg.units_per_row
    ix = index_of(source, cfg)
    plan = make_plan(ix, cfg)
    lengths = document_pass(ix, progress=progress)[0]
    total = plan.epoch_tokens
    layout = cfg.unit_layout  # the run's layout stages (one stage when lanes and seq_len are ints)
    one = Layout.one(lanes, seq_len)  # the first stage's alone: the steps of the lanes and mixture sections
    per_epoch = one.step_at_run(total)
    steps = per_epoch if steps is None else steps

    out: _Sections = ({}, {}, {})
    _dataset_section(ix, plan, cfg, lengths, out)
    # Lane balance, lockstep and reads are drawn for one layout: the first stage's.
    first = make_plan(ix, replace(cfg, layout=one)) if cfg.stages.staged else plan
    _lanes_section(first, seq_len, steps, per_epoch, out)
    if isinstance(plan, MixturePlan):
        _mixture_section(plan, seq_len, max(1, min(20, one.run_at(steps) // total + 1)), out)
    _reads_section(first, cfg, windows, out)
    if "tokens_selected" in ix.frame.columns:
        _selection_section(ix, out)
    _duplicates_section(ix, out)
    if plan.bins is not None:  # the plan cuts bins: their padding
        _padding_section(plan, out)
    if cfg.world > 1 and plan.layout is not None and not plan.layout.changes_tokens:
        _balance_section(plan, steps, out)
    tables, figures, notes = out
    covered = layout.run_at(steps) // total + 1
    tables["epochs_covered"] = tab.epochs_covered(total, lanes, seq_len, steps, layout=layout)
    tables["epoch_starts"] = tab.epoch_starts(total, lanes, seq_len, min(50, covered), layout=layout)
    if layout.staged:
        _layout_section(plan, layout, steps, out)
    return Report(title=f"plitzer audit: {ix.source}", tables=tables, figures=figures, notes=notes)
