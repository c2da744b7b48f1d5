"""The ``plitzer`` subcommands: one ``cmd_*`` function each, called with the parsed arguments; 0 on success."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl

from planner.errors import ConfigError
from planner.order.layout import Layout
from planner.parameters import by_name
from planner.progress import terminal_progress
from planner.rules import CONCAT, rule_named
from plitzer.cli.indexing import cmd_index
from plitzer.cli.options import (
    DESTS,
    columns_of,
    mixture_defaults,
    print_frame,
    source_of,
    sources_table,
    storage_options_of,
)
from plitzer.cli.table import setting_names

__all__ = [
    "cmd_audit",
    "cmd_bench",
    "cmd_checkpoint",
    "cmd_demo",
    "cmd_explain",
    "cmd_index",
    "cmd_locate",
    "cmd_plan",
    "cmd_synth",
    "cmd_tokenize",
    "rows_arg",
    "run_settings",
]


def run_settings(args: argparse.Namespace, weights: Any) -> dict[str, Any]:
    """The run's settings a command was given, as keywords by their PARAMETERS name.

    Every setting the command's table entry names (:func:`plitzer.cli.table.setting_names`),
    the store's options of ``--endpoint`` and ``--region``, the ``weights`` of its source
    and the aligned columns (``--columns`` or the mixture file's); a mixture file's
    ``dedupe``, ``exclude``, ``packing`` and ``pad_id`` where the command line gives none. A
    setting left at None is not passed (its default is the entry point's), nor one of
    :data:`DEFAULT_NOT_PASSED` at its default (the same as not passing it).
    """
    mixture_defaults(args)
    given = {name: getattr(args, DESTS.get(name, name)) for name in setting_names(args.command)}
    given.update(storage_options=storage_options_of(args), weights=weights, columns=columns_of(args))
    return {
        k: v for k, v in given.items() if v is not None and not (k in DEFAULT_NOT_PASSED and v == by_name(k).default)
    }


DEFAULT_NOT_PASSED = ("packing", "pad_id", "shuffle")
"""Settings that a command passes on only where they differ from their default (0.6's: a run at
them is 0.5's run, and the entry points' signatures then read as they did)."""


def cmd_synth(args: argparse.Namespace) -> int:
    if args.text:
        from plitzer.tools.synth_text import write_text

        files, passes = write_text(
            args.out, args.tokens, tokenizer=args.tokenizer, row_group_tokens=args.row_group_tokens
        )
        size = sum(p.stat().st_size for p in files)
        again = f" (the machine's text taken {passes} times)" if passes > 1 else ""
        print(f"wrote {len(files)} files ({size / 2**20:.1f} MiB) of real text, {args.tokens:,}+ tokens{again}")
        return 0
    from plitzer.synth import write

    paths = write(
        args.out,
        tokens=args.tokens,
        seed=args.seed,
        docs_per_row_group=args.docs_per_row_group,
        row_groups_per_file=args.row_groups_per_file,
        mean_length=args.mean_length,
        column=args.column,
        vocab=args.vocab,
    )
    size = sum(p.stat().st_size for p in paths)
    print(f"wrote {len(paths)} files ({size / 2**20:.1f} MiB) with at least {args.tokens:,} tokens to {args.out}")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from planner import plan

    source, weights = source_of(args)
    settings = run_settings(args, weights)
    if not rule_named(settings.get("packing", CONCAT)).needs_counts:  # concat: 2048 where not given; best-fit: refused
        settings.setdefault("seq_len", by_name("seq_len").default)
    p = plan(source, **settings)
    if args.sql:
        print_frame(p.sql(args.sql, epochs=[args.epoch], external_access=args.external_access), args.format, args.out)
        return 0
    if args.table:
        tables: dict[str, Callable[[], pl.DataFrame]] = {
            "index": lambda: p.index,
            "row_groups": lambda: p.row_groups(args.epoch),
            "lanes": lambda: p.lanes(args.epoch),
            "reads": lambda: p.reads(args.epoch),
            "sources": lambda: sources_table(p),
            "layout": p.layout_table,
            "steps": lambda: p.steps(args.epoch),
        }
        print_frame(tables[args.table](), args.format, args.out, title=f"{args.table}, epoch {args.epoch}")
        return 0
    reads = p.reads(args.epoch)
    per_rank = (
        reads.group_by("rank").agg(pl.len().alias("row_groups"), pl.col("bytes").sum().alias("bytes")).sort("rank")
    )
    g = p.index.height
    nonempty = max(1, int((p.index["rows"] > 0).sum()))
    amplification = reads.height / nonempty
    windows = p.windows_in(args.epoch)
    print(
        f"{p!r}\nepoch {args.epoch}: {windows} windows, {reads.height} reads for {g} row groups "
        f"(read amplification {amplification:.4f}; bound 1 + (world-1) * windows / G = "
        f"{1 + (args.world - 1) * windows / nonempty:.4f}, about 1 + (world-1)/W = "
        f"{1 + (args.world - 1) / args.window:.4f})"
    )
    print_frame(per_rank, args.format, args.out, title="reads per rank")
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    from plitzer.tools.explain import explain

    source, weights = source_of(args)
    docs = explain(source, args.step, args.lane, progress=terminal_progress(), **run_settings(args, weights))
    if args.format == "table" and not args.out:
        rows = docs["lane"].n_unique()
        units = docs.select("epoch", "window_index").unique().sort("epoch", "window_index").rows()
        where = ", ".join(f"epoch {e} window {w}" for e, w in units)
        n = Layout.of(lanes=args.lanes, seq_len=args.seq_len).at(args.step).seq_len
        print(f"step {args.step}: {docs.height} document pieces in {rows} sequences of {n} tokens ({where})")
    print_frame(docs, args.format, args.out, title=f"step {args.step}")
    return 0


def rows_arg(values: list[str] | None) -> list[tuple[Any, ...]] | None:
    """``--row FILE:ROW`` (or ``FILE:ROW_GROUP:ROW``) values as locate's ``rows=``."""
    if not values:
        return None
    out: list[tuple[Any, ...]] = []
    for v in values:
        parts = v.split(":")
        ints = 0
        while ints < min(2, len(parts) - 1) and parts[-1 - ints].strip().isdigit():
            ints += 1
        if ints == 0:
            msg = f"--row {v!r} is not FILE:ROW or FILE:ROW_GROUP:ROW, e.g. part-00000.parquet:17"
            raise ConfigError(msg)
        out.append((":".join(parts[:-ints]), *(int(x) for x in parts[-ints:])))
    return out


def cmd_locate(args: argparse.Namespace) -> int:
    from plitzer.tools.locate import locate

    source, weights = source_of(args)
    steps: Any = args.steps
    if steps is not None and ":" in steps:
        a, _, b = steps.partition(":")
        steps = (int(a), int(b)) if a.strip().isdigit() and b.strip().isdigit() else steps
    elif steps is not None and steps.strip().isdigit():
        steps = int(steps)
    settings = run_settings(args, weights)  # --where names the documents; the run's own is --selection
    docs = locate(
        source,
        args.where,
        rows=rows_arg(args.row),
        epochs=args.epochs,
        steps=steps,
        selection=args.selection,
        progress=terminal_progress(),
        **settings,
    )
    if args.format == "table" and not args.out and "dropped" in docs.columns:
        gone = docs.filter(pl.col("dropped").is_not_null())
        docs = docs.filter(pl.col("dropped").is_null()).drop(
            [c for c in docs.columns if c == "dropped" or c.startswith("kept_")]
        )
        for r in gone.iter_rows(named=True):  # under --dedupe or --exclude: no piece, and why
            src = f"{r['source']}: " if r.get("source") else ""
            why = "dropped as excluded (--exclude)"
            if r["dropped"] == "duplicate":
                ksrc = f"{r['kept_source']}: " if r.get("kept_source") else ""
                kept = f"{ksrc}{r['kept_file']} row group {r['kept_row_group']} row {r['kept_row']}"
                why = f"dropped as a duplicate (--dedupe) of {kept}, which was kept"
            print(f"{src}{r['file']} row group {r['row_group']} row {r['row']}: {why}")
    if args.format == "table" and not args.out:
        keys = [c for c in ("source", "file", "row_group", "row") if c in docs.columns]
        n = docs.select(keys).n_unique() if docs.height else 0
        steps = docs["step"].to_numpy()
        span = f", steps {int(steps.min())}..{int(steps.max())}" if docs.height else ""
        print(f"{docs.height} pieces of {n} documents in {docs['step'].n_unique()} steps{span}")
    print_frame(docs, args.format, args.out, title="pieces")
    return 0


def cmd_audit(args: argparse.Namespace) -> int:
    from plitzer.audit import audit

    if args.steps is not None and args.steps < 1:
        msg = f"--steps {args.steps} must be >= 1: the run length of the epoch table (leave it out for one epoch)"
        raise ConfigError(msg)
    windows = [int(w) for w in args.windows.split(",")] if args.windows else None
    source, weights = source_of(args)
    report = audit(
        source, steps=args.steps, windows=windows, progress=terminal_progress(), **run_settings(args, weights)
    )
    for name in ("summary", "length_summary", "lane_balance_summary", "lockstep_summary", "reads_per_rank"):
        print_frame(report.tables[name], args.format, None, title=name.replace("_", " "))
    print_frame(report.tables["read_amplification"], args.format, None, title="read amplification")
    print_frame(report.tables["epochs_covered"], args.format, None, title="epochs covered")
    if "padding" in report.tables:  # best-fit: the padding against its floor
        print_frame(report.tables["padding"], args.format, None, title="padding (best-fit)")
    dup = report.tables["duplicates"]
    groups = dup["group"].n_unique() if dup.height else 0
    print(f"duplicates: {dup.height} documents in {groups} groups of identical documents")
    page = report.write(args.out)
    print(f"wrote {page}")
    return 0


def cmd_checkpoint(args: argparse.Namespace) -> int:
    from plitzer.tools.checkpoints import describe

    summary, config = describe(args.files, out=args.out)
    print_frame(summary, args.format, None, title="checkpoint")
    print_frame(config, args.format, None, title="configuration")
    if args.out:
        print(f"wrote {args.out}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    import importlib.util
    import subprocess

    try:
        found = importlib.util.find_spec("plitzer.bench.baseline") is not None
    except ImportError:
        found = False
    if not found:
        print(
            "plitzer bench: the baseline benchmark (plitzer.bench.baseline) is not installed in this "
            "version; see benchmarks/ for the other benchmarks",
            file=sys.stderr,
        )
        return 2
    extra = list(args.args)
    if extra[:1] == ["--"]:
        extra = extra[1:]
    if any(a in {"-h", "--help"} for a in extra):
        print("plitzer bench runs `python -m plitzer.bench.baseline` with these arguments; its help:\n", flush=True)
    return subprocess.call([sys.executable, "-m", "plitzer.bench.baseline", *extra])


def cmd_demo(args: argparse.Namespace) -> int:
    from plitzer.tools.demo import run

    return run(Path(args.dir), tokens=args.tokens, seq_len=args.seq_len, lanes=args.lanes, window=args.window)


def cmd_tokenize(args: argparse.Namespace) -> int:
    from plitzer.text.tokenize import tokenize

    r = tokenize(
        args.src,
        args.dst,
        tokenizer=args.tokenizer,
        text_column=args.text_column,
        token_column=args.column,
        add_eos=not args.no_eos,
        add_bos=args.bos,
        row_group_tokens=args.row_group_tokens,
        engine=args.engine,
        jobs=args.jobs,
        address=args.address,
        progress=None,
    )
    rate = r.tokens / r.seconds if r.seconds > 0 else 0.0
    print(
        f"wrote {r.written} files ({r.skipped} already complete): {r.rows:,} documents, {r.tokens:,} tokens "
        f"in {r.seconds:.1f} s ({rate:,.0f} tokens/s)"
    )
    return 0
