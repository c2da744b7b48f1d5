"""The ``plitzer`` subcommands: one ``cmd_*`` function each, called with the parsed arguments; 0 on success."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl

from planner.catalog.rowgroups import stream_counts
from planner.errors import ConfigError
from planner.order.layout import Layout
from planner.parameters import Selection, by_name
from planner.progress import terminal_progress
from planner.rules import rule_named
from plitzer.cli.options import (
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
    given = {name: getattr(args, name) for name in setting_names(args.command)}
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
    )
    size = sum(p.stat().st_size for p in paths)
    print(f"wrote {len(paths)} files ({size / 2**20:.1f} MiB) with at least {args.tokens:,} tokens to {args.out}")
    return 0


def _index_text(args: argparse.Namespace, source: Any) -> int:
    """``plitzer index DATA --tokenizer T --out URL``: a text source's job index (its counting pass's result)."""
    if args.out is None or args.where is not None or args.engine == "ray":
        msg = "--tokenizer writes a text source's job index: give --out PATH_OR_URL (and no --where or --engine)"
        raise ConfigError(msg)
    from plitzer.text.job import write_text_index

    info = write_text_index(
        source,
        args.out,
        tokenizer=args.tokenizer,
        text_column=args.text_column,
        storage_options=storage_options_of(args),
        progress=terminal_progress(),
    )
    print(
        f"job index: {info.out} ({info.files:,} files, {info.row_groups:,} row groups, {info.bytes:,} bytes; "
        f"the token counts of text column {args.text_column!r} under {args.tokenizer})"
    )
    return 0


def _carried_of(args: argparse.Namespace) -> list[str]:
    """``plitzer index ... --out JOB --columns a,b``: the columns the job index carries besides the token column."""
    value = getattr(args, "columns", None)
    if not value:
        return []
    if isinstance(value, dict):
        msg = (
            f"--columns {','.join(value)}: with plitzer index it names the columns the job index carries (for "
            "where=, length_column=, columns= and dedupe=), without fill values: give the names alone"
        )
        raise ConfigError(msg)
    if args.out is None or args.tokenizer is not None:
        msg = (
            "--columns with plitzer index names the columns a job index carries: give --out PATH_OR_URL "
            "(a text source's job index carries only its counts)"
        )
        raise ConfigError(msg)
    return [str(c) for c in value]


def _index_mixture(args: argparse.Namespace, sources: dict[str, Any]) -> int:
    """``plitzer index --mixture FILE --out PREFIX``: each source's job index, ``PREFIX/NAME.index``."""
    from planner.catalog import jobindex
    from planner.mixing.sources import source_specs
    from plitzer.readpath.read import count_chunk
    from plitzer.text.job import write_text_index

    prefix = str(args.out).rstrip("/")
    for spec in source_specs(sources, column=args.column, storage_options=storage_options_of(args)):
        out = f"{prefix}/{spec.name}.index"
        if spec.text is not None and _carried_of(args):
            msg = f"--columns: source {spec.name!r} is text; its job index carries only its counts: drop --columns"
            raise ConfigError(msg)
        if spec.text is not None:
            info = write_text_index(
                spec.path,
                out,
                tokenizer=spec.text["tokenizer"],
                text_column=spec.text.get("text_column", "text"),
                storage_options=spec.storage_options,
                out_options=storage_options_of(args),
                progress=terminal_progress(),
            )
        else:
            info = jobindex.write(
                spec.path,
                out,
                count=count_chunk,
                column=spec.column,
                storage_options=spec.storage_options,
                out_options=storage_options_of(args),
                progress=terminal_progress(),
                columns=_carried_of(args),
            )
        print(f"job index: {out} ({info.files:,} files, {info.row_groups:,} row groups, {info.bytes:,} bytes)")
    print(f'give each source its job index: index = "{prefix}/NAME.index" in its [sources.NAME] table')
    return 0


def _bins_pass(args: argparse.Namespace, ix: Any, source: Any) -> Any:
    """``plitzer index --packing best-fit --seq-len L``: best-fit's bins pass, cached (on Ray with --engine ray)."""
    from plitzer.state.bins import BinSpec, bin_index, bins_on_ray

    if not isinstance(args.seq_len, int):
        msg = "--packing best-fit bins documents at one sequence length: give --seq-len L (e.g. 2048)"
        raise ConfigError(msg)
    spec = BinSpec(args.seq_len, args.packing, args.length_column)
    if args.engine == "ray" and args.where is None and args.dedupe is None and args.exclude is None:
        opts = storage_options_of(args)
        bins_on_ray(ix, spec, source=source, storage_options=opts, address=args.address)
    return bin_index(ix, spec, progress=terminal_progress())


def cmd_index(args: argparse.Namespace) -> int:

    source, _ = source_of(args)
    carried = _carried_of(args)  # before any pass: a bad --columns is refused at once
    if isinstance(source, dict):
        if args.out is not None and args.tokenizer is None and args.where is None:
            return _index_mixture(args, source)
        msg = (
            "index reads one dataset; for a mixture, --out FOLDER_OR_PREFIX writes one job index per source "
            "(or use `plitzer plan --mixture FILE --table sources`)"
        )
        raise ConfigError(msg)
    if args.tokenizer is not None:
        return _index_text(args, source)
    from planner import index

    if carried:
        from planner.catalog.carried import carry
        from planner.catalog.files import list_files
        from plitzer.readpath.read import count_chunk

        entries, src = list_files(source, storage_options_of(args))
        ix = carry(entries, src, args.column, carried, progress=terminal_progress(), count=count_chunk)
    else:
        ix = index(source, column=args.column, storage_options=storage_options_of(args), progress=terminal_progress())
    if args.out is not None:
        from planner.catalog import jobindex

        data = jobindex.encode(ix, columns=carried)
        jobindex.write_object(args.out, data, storage_options_of(args))
        also = f"; carries {', '.join(carried)}" if carried else ""
        print(
            f"job index: {args.out} ({len(ix.files):,} files, {ix.row_groups:,} row groups, {len(data):,} bytes{also})"
        )
    selection = Selection(where=args.where, length_column=args.length_column, dedupe=args.dedupe, exclude=args.exclude)
    if args.where is not None:
        from plitzer.selection.select import select_index, select_on_ray

        if args.engine == "ray":
            select_on_ray(ix, selection, source=source, storage_options=storage_options_of(args), address=args.address)
        ix = select_index(ix, selection, progress=terminal_progress())
    elif (
        args.length_column is not None
        and args.dedupe is None
        and args.exclude is None
        and not rule_named(args.packing).pads
    ):
        msg = "--length-column serves a pass: give --where, --dedupe, --exclude or --packing best-fit --seq-len L"
        raise ConfigError(msg)
    elif args.engine == "ray" and args.dedupe is None and args.exclude is None and not rule_named(args.packing).pads:
        msg = "--engine ray runs a pass: give --where, --dedupe, --exclude or --packing best-fit --seq-len L"
        raise ConfigError(msg)
    if args.dedupe is not None or args.exclude is not None:
        from plitzer.selection.dedupe import dedupe_index
        from plitzer.selection.keying import dedupe_on_ray

        if args.engine == "ray" and args.where is None:
            dedupe_on_ray(ix, selection, source=source, storage_options=storage_options_of(args), address=args.address)
        ix = dedupe_index(  # type: ignore[assignment]  # a DedupedIndex: an Index
            ix, selection, storage_options=storage_options_of(args), progress=terminal_progress()
        )
    if rule_named(args.packing).pads:  # best-fit: its bins pass
        ix = _bins_pass(args, ix, source)
    f = ix.frame
    columns: dict[str, list[Any]] = {
        "files": [len(ix.files)],
        "row_groups": [f.height],
        "documents": [int(f["rows"].sum())],
        "tokens": [int(f["tokens"].sum())],
        "empty_documents": [int(f["empty_docs"].sum())],
    }
    if "tokens_selected" in f.columns:
        columns["documents_selected"] = [int(f["rows_selected"].sum())]
        columns["tokens_selected"] = [int(f["tokens_selected"].sum())]
        columns["row_groups_emptied"] = [int((f["rows_selected"] == 0).sum())]
    if "bins" in f.columns:  # best-fit's (plitzer.state.bins)
        columns["bins"] = [int(f["bins"].sum())]
        columns["padding_fraction"] = [1 - int(stream_counts(f)[0].sum()) / max(1, int(f["bins"].sum()) * args.seq_len)]
    if "rows_duplicate" in f.columns:
        columns["documents_duplicate"] = [int(f["rows_duplicate"].sum())]
        columns["documents_excluded"] = [int(f["rows_excluded"].sum())]
    columns.update({"column": [ix.column], "dtype": [ix.dtype], "fingerprint": [ix.fingerprint[:16]]})
    print_frame(pl.DataFrame(columns), args.format, None, title="index")
    from planner.stores.hf import HFStorage

    pinned = {st.pinned for st in map(ix.storage, range(len(ix.files))) if isinstance(st, HFStorage)}
    for url in sorted(pinned):  # what a later run passes to read these very files
        print(f"at its commit: {url}", file=sys.stderr)
    per_rg = f.select(
        pl.col("tokens").min().alias("min"),
        pl.col("tokens").quantile(0.5).cast(pl.Int64).alias("median"),
        pl.col("tokens").mean().cast(pl.Int64).alias("mean"),
        pl.col("tokens").max().alias("max"),
    )
    print_frame(per_rg, args.format, None, title="tokens per row group")
    if args.no_lengths:
        return 0
    from plitzer.audit import length_histogram, length_summary
    from plitzer.tools.explain import document_lengths

    # One pass over the token column (cached next to the index); --no-lengths skips it.
    lengths = document_lengths(ix, progress=terminal_progress())
    print_frame(length_summary(lengths), args.format, None, title="document lengths (tokens)")
    print_frame(length_histogram(lengths), args.format, None, title="document length distribution")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from planner import plan

    source, weights = source_of(args)
    p = plan(source, **run_settings(args, weights))
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
