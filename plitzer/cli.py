"""The ``plitzer`` command line: synth, index, plan, explain, locate, audit, tokenize, demo, bench.

Each subcommand has ``--help`` with examples. Tables print with rich on a
terminal and as plain text otherwise (or CSV/JSON/Parquet with ``--format``).

Every mistake (a bad option, bad SQL, an unreadable path or file, a plitzer error) is
one ``plitzer: error: ...`` line on stderr and exit status 2, never a traceback;
``--debug`` (anywhere on the line) or ``PLITZER_DEBUG=1`` prints the traceback first,
for a bug report (docs/design.md, "One line for every mistake").
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

import polars as pl

from planner.errors import ConfigError, one_line
from planner.order.layout import Layout
from planner.parameters import by_name
from planner.progress import terminal_progress
from plitzer.tools.mixfile import read_mixture

__all__ = ["main"]

_EXAMPLES = {
    "synth": (
        "examples:\n  plitzer synth data/sample --tokens 20000000\n"
        "  plitzer synth --text data/text --tokens 200000000   # real text, a real tokenizer"
    ),
    "plan": (
        "examples:\n"
        "  plitzer plan data/sample --lanes 512 --window 64 --world 8\n"
        '  plitzer plan data/sample --world 8 --sql "select rank, count(*) n, sum(bytes) b from reads group by rank"\n'
        "  plitzer plan data/sample --table reads --epoch 1 --format csv --out reads.csv\n"
        '  plitzer plan data/sample --where "int_score >= 3" --sql "select file, sum(tokens_selected) t from index '
        'group by file"\n'
        "  plitzer plan --mixture mix.toml --lanes 512 --window 64 --table sources\n"
        "mixture file (TOML), one table per source:\n"
        '  [sources.web]\n  path = "data/web"\n  weight = 3\n'
        '  [sources.code]\n  path = "data/code"\n  column = "input_ids"\n  weight = 1\n'
        "or stages instead of weights: [[stages]] step = 0, weights = {web = 3, code = 1}"
    ),
    "demo": "example: plitzer demo --dir data/demo --tokens 20000000",
    "index": (
        "examples:\n"
        "  plitzer index data/sample\n"
        "  plitzer index s3://bucket/prefix --endpoint http://localhost:9000 --no-lengths\n"
        "  plitzer index data/fineweb-edu --where \"int_score >= 3 and language = 'en'\" --length-column token_count\n"
        '  plitzer index s3://bucket/fineweb-edu --where "int_score >= 3" --engine ray --address auto\n'
        "  plitzer index s3://bucket/fineweb-edu --out s3://bucket/fineweb-edu.index   # a job index\n"
        "  plitzer index data/raw --tokenizer tokenizer.json --out data/raw.index      # a text source's\n"
        "  plitzer index --mixture mix.toml --out s3://bucket/indexes                 # one a source"
    ),
    "explain": (
        "examples:\n"
        "  plitzer explain data/sample --step 1200 --lanes 64 --window 8 --seq-len 2048\n"
        "  plitzer explain data/sample --step 1200 --lane 7 --lanes 64 --window 8 --format csv"
    ),
    "locate": (
        "examples:\n"
        "  plitzer locate data/sample --where \"url = 'https://example.com/a'\" --epochs 0:3 --lanes 64 --window 8\n"
        '  plitzer locate data/sample --where "id in (3, 17)" --steps 120000 --lanes 512 --format csv\n'
        "  plitzer locate data/sample --row part-00003.parquet:1234 --epochs 0 --world 8 --format json"
    ),
    "audit": (
        "examples:\n"
        "  plitzer audit data/sample --lanes 64 --window 8 --world 4 --out audit.html\n"
        "  plitzer audit data/sample --lanes 512 --window 64 --world 8 --steps 100000 --out audit/"
    ),
    "checkpoint": (
        "examples:\n"
        "  plitzer checkpoint run/step-1000.ckpt\n"
        "  plitzer checkpoint run/rank-*.ckpt --out run/step-1000.ckpt   # every rank's part, merged"
    ),
    "tokenize": (
        "examples:\n"
        "  plitzer tokenize data/raw data/tokens --tokenizer tokenizer.model\n"
        "  plitzer tokenize data/raw data/tokens --tokenizer tokenizer.json --text-column content --engine ray"
    ),
    "bench": (
        "examples:\n"
        "  plitzer bench --help          (the baseline benchmark's own options)\n"
        "  plitzer bench --loaders plitzer --time-limit 60"
    ),
}


def _print_frame(df: pl.DataFrame, fmt: str, out: str | None, title: str | None = None) -> None:
    if out:
        path = Path(out)
        if fmt == "parquet" or (fmt == "table" and path.suffix == ".parquet"):
            df.write_parquet(path)
        elif fmt == "json" or (fmt == "table" and path.suffix == ".json"):
            df.write_json(path)
        else:
            df.write_csv(path)
        print(f"wrote {df.height} rows to {path}", file=sys.stderr)
        return
    if fmt == "csv":
        sys.stdout.write(df.write_csv())
    elif fmt == "json":
        sys.stdout.write(df.write_json() + "\n")
    elif fmt == "parquet":
        msg = "--format parquet needs --out PATH"
        raise SystemExit(msg)
    elif sys.stdout.isatty():
        from rich.console import Console
        from rich.table import Table

        table = Table(title=title, show_lines=False)
        for c in df.columns:
            table.add_column(c, justify="right" if df[c].dtype.is_numeric() else "left")
        for row in df.head(200).iter_rows():
            table.add_row(*("" if v is None else f"{v:,}" if isinstance(v, int) else str(v) for v in row))
        Console().print(table)
        if df.height > 200:
            print(f"... {df.height - 200} more rows (use --format csv or --out)")
    else:
        with pl.Config(tbl_rows=200, tbl_cols=-1, tbl_width_chars=200, fmt_str_lengths=60):
            if title:
                print(title)
            print(df)


def _source(values: list[str]) -> str | list[str]:
    return values[0] if len(values) == 1 else values


def _sources_table(p: Any) -> pl.DataFrame:
    from planner.mixing.mixture import MixturePlan

    if isinstance(p, MixturePlan):
        return p.sources()
    msg = "--table sources: this plan has one source (give --mixture FILE for a mixture)"
    raise ConfigError(msg)


def _source_of(args: argparse.Namespace) -> tuple[Any, Any]:
    """The command's source and weights: the data arguments, or a --mixture file."""
    mixture = getattr(args, "mixture", None)
    if mixture:
        if args.data:
            msg = "give the data paths or --mixture FILE, not both"
            raise ConfigError(msg)
        return read_mixture(mixture)
    if not args.data:
        msg = "no data: give a folder, .parquet file or s3:// URL, or --mixture FILE"
        raise ConfigError(msg)
    return _source(args.data), None


def _columns_of(args: argparse.Namespace) -> Any:
    """The aligned columns: ``--columns``, else the mixture file's; both, differing, is refused."""
    flag = getattr(args, "columns", None)
    mixture = getattr(args, "mixture", None)
    if not mixture:
        return flag
    from plitzer.tools.mixfile import mixture_columns

    inner = mixture_columns(mixture)
    if flag is not None and inner is not None and flag != inner:
        msg = f"--columns {flag!r} and the mixture file's columns {inner!r} differ; give one of them"
        raise ConfigError(msg)
    return flag if flag is not None else inner


def _storage_options(args: argparse.Namespace) -> dict[str, Any] | None:
    opts = {k: getattr(args, k) for k in ("endpoint", "region") if getattr(args, k, None)}
    return opts or None


def _add_source(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "data",
        nargs="*",
        help="folder, .parquet file, s3://bucket/prefix, hf://datasets/ORG/NAME/PATH or https:// URL (several allowed)",
    )
    p.add_argument(
        "--mixture",
        default=None,
        metavar="FILE",
        help="a mixture file (TOML): [sources.NAME] tables with path, column, weight; or [[stages]] "
        "tables with step and weights = {NAME = w}",
    )
    _add_setting(p, "column")
    p.add_argument("--endpoint", default=None, help="S3 endpoint URL (or the Hub's, for hf://; else HF_ENDPOINT)")
    p.add_argument("--region", default=None, help="S3 region")
    _add_setting(p, "where")
    _add_setting(p, "length_column")
    _add_setting(p, "columns", type=_columns_arg)
    _add_setting(p, "dedupe")
    _add_setting(p, "exclude")


def _columns_arg(text: str) -> list[str] | dict[str, Any]:
    """``--columns loss_mask,weight`` (names), or ``loss_mask=0,weight=0.5`` (name -> fill value)."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not any("=" in p for p in parts):
        return parts
    out: dict[str, Any] = {}
    for part in parts:
        name, eq, value = part.partition("=")
        if not eq:
            out[name] = None
            continue
        v = value.strip().lower()
        try:
            out[name.strip()] = (
                v == "true" if v in ("true", "false") else int(v) if v.lstrip("-").isdigit() else float(v)
            )
        except ValueError:
            msg = f"--columns {text!r}: the fill of {name!r} is {value!r}, not a bool, int or float (e.g. loss_mask=0)"
            raise argparse.ArgumentTypeError(msg) from None
    return out


def _selection(args: argparse.Namespace) -> dict[str, Any]:
    out = {"where": getattr(args, "where", None), "length_column": getattr(args, "length_column", None)}
    if getattr(args, "mixture", None):  # the mixture file's own (the command line's win)
        from plitzer.tools.mixfile import mixture_settings

        for k, v in mixture_settings(args.mixture).items():
            if getattr(args, k, None) is None:
                setattr(args, k, v)
    for k in ("dedupe", "exclude"):  # given only when set
        if getattr(args, k, None) is not None:
            out[k] = getattr(args, k)
    return out


def _stages_arg(text: str) -> int | list[tuple[int, int]]:
    """``512``, or layout stages ``0:512,90000:128`` (global step:value, from step 0)."""
    try:
        if ":" not in text:
            return int(text)
        pairs = [part.split(":") for part in text.split(",")]
        return [(int(a), int(b)) for a, b in pairs]
    except ValueError:
        msg = (
            f"{text!r}: give an integer, or layout stages STEP:VALUE,STEP:VALUE,... from step 0 (e.g. 0:512,90000:128)"
        )
        raise argparse.ArgumentTypeError(msg) from None


_TYPES: dict[str, Callable[[str], Any]] = {
    "seed": int,
    "lanes": _stages_arg,
    "window": int,
    "seq_len": _stages_arg,
    "budget": int,
    "rank": int,
    "world": int,
}
"""How each setting given on the command line is read (the rest are strings)."""


def _add_setting(p: argparse.ArgumentParser, name: str, **kw: Any) -> None:
    """The option of setting ``name``: flag, default and help from :data:`planner.parameters.PARAMETERS`."""
    param = by_name(name)
    opts: dict[str, Any] = {"default": param.default, "help": param.help}
    if name in _TYPES:
        opts["type"] = _TYPES[name]
    opts.update(kw)
    p.add_argument(param.flag, **opts)


def _add_settings(p: argparse.ArgumentParser, *, seq_len: bool = False) -> None:
    for name in ("seed", "lanes", "window", "world", *(("seq_len",) if seq_len else ())):
        _add_setting(p, name)


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
        storage_options=_storage_options(args),
        progress=terminal_progress(),
    )
    print(
        f"job index: {info.out} ({info.files:,} files, {info.row_groups:,} row groups, {info.bytes:,} bytes; "
        f"the token counts of text column {args.text_column!r} under {args.tokenizer})"
    )
    return 0


def _index_mixture(args: argparse.Namespace, sources: dict[str, Any]) -> int:
    """``plitzer index --mixture FILE --out PREFIX``: each source's job index, ``PREFIX/NAME.index``."""
    from planner.catalog import jobindex
    from planner.mixing.sources import source_specs
    from plitzer.readpath.read import count_chunk
    from plitzer.text.job import write_text_index

    prefix = str(args.out).rstrip("/")
    for spec in source_specs(sources, column=args.column, storage_options=_storage_options(args)):
        out = f"{prefix}/{spec.name}.index"
        if spec.text is not None:
            info = write_text_index(
                spec.path,
                out,
                tokenizer=spec.text["tokenizer"],
                text_column=spec.text.get("text_column", "text"),
                storage_options=spec.storage_options,
                out_options=_storage_options(args),
                progress=terminal_progress(),
            )
        else:
            info = jobindex.write(
                spec.path,
                out,
                count=count_chunk,
                column=spec.column,
                storage_options=spec.storage_options,
                out_options=_storage_options(args),
                progress=terminal_progress(),
            )
        print(f"job index: {out} ({info.files:,} files, {info.row_groups:,} row groups, {info.bytes:,} bytes)")
    print(f'give each source its job index: index = "{prefix}/NAME.index" in its [sources.NAME] table')
    return 0


def cmd_index(args: argparse.Namespace) -> int:

    source, _ = _source_of(args)
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

    ix = index(source, column=args.column, storage_options=_storage_options(args), progress=terminal_progress())
    if args.out is not None:
        from planner.catalog import jobindex

        data = jobindex.encode(ix)
        jobindex.write_object(args.out, data, _storage_options(args))
        print(f"job index: {args.out} ({len(ix.files):,} files, {ix.row_groups:,} row groups, {len(data):,} bytes)")
    if args.where is not None:
        from plitzer.selection.select import select_index, select_on_ray

        if args.engine == "ray":
            select_on_ray(
                ix,
                args.where,
                length_column=args.length_column,
                source=source,
                storage_options=_storage_options(args),
                address=args.address,
            )
        ix = select_index(ix, args.where, length_column=args.length_column, progress=terminal_progress())
    elif (args.engine == "ray" and args.dedupe is None and args.exclude is None) or args.length_column is not None:
        msg = "--engine ray and --length-column run the selection pass: give --where (or --dedupe, --exclude)"
        raise ConfigError(msg)
    if args.dedupe is not None or args.exclude is not None:
        from plitzer.selection.dedupe import dedupe_index
        from plitzer.selection.keying import dedupe_on_ray

        if args.engine == "ray" and args.where is None:
            dedupe_on_ray(
                ix,
                dedupe=args.dedupe,
                exclude=args.exclude,
                source=source,
                storage_options=_storage_options(args),
                address=args.address,
            )
        ix = dedupe_index(  # type: ignore[assignment]  # a DedupedIndex: an Index
            ix,
            dedupe=args.dedupe,
            exclude=args.exclude,
            storage_options=_storage_options(args),
            progress=terminal_progress(),
        )
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
    if "rows_duplicate" in f.columns:
        columns["documents_duplicate"] = [int(f["rows_duplicate"].sum())]
        columns["documents_excluded"] = [int(f["rows_excluded"].sum())]
    columns.update({"column": [ix.column], "dtype": [ix.dtype], "fingerprint": [ix.fingerprint[:16]]})
    _print_frame(pl.DataFrame(columns), args.format, None, title="index")
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
    _print_frame(per_rg, args.format, None, title="tokens per row group")
    if args.no_lengths:
        return 0
    from plitzer.audit import length_histogram, length_summary
    from plitzer.tools.explain import document_lengths

    # One pass over the token column (cached next to the index); --no-lengths skips it.
    lengths = document_lengths(ix, progress=terminal_progress())
    _print_frame(length_summary(lengths), args.format, None, title="document lengths (tokens)")
    _print_frame(length_histogram(lengths), args.format, None, title="document length distribution")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from planner import plan

    source, weights = _source_of(args)
    selection = _selection(args)
    p = plan(
        source,
        seed=args.seed,
        lanes=args.lanes,
        window=args.window,
        world=args.world,
        column=args.column,
        storage_options=_storage_options(args),
        weights=weights,
        seq_len=getattr(args, "seq_len", None),
        columns=_columns_of(args),
        **selection,
    )
    if args.sql:
        _print_frame(p.sql(args.sql, epochs=[args.epoch], external_access=args.external_access), args.format, args.out)
        return 0
    if args.table:
        tables: dict[str, Callable[[], pl.DataFrame]] = {
            "index": lambda: p.index,
            "row_groups": lambda: p.row_groups(args.epoch),
            "lanes": lambda: p.lanes(args.epoch),
            "reads": lambda: p.reads(args.epoch),
            "sources": lambda: _sources_table(p),
            "layout": p.layout_table,
            "steps": lambda: p.steps(args.epoch),
        }
        _print_frame(tables[args.table](), args.format, args.out, title=f"{args.table}, epoch {args.epoch}")
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
    _print_frame(per_rank, args.format, args.out, title="reads per rank")
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    from plitzer.tools.explain import explain

    source, weights = _source_of(args)
    docs = explain(
        source,
        args.step,
        args.lane,
        seed=args.seed,
        lanes=args.lanes,
        window=args.window,
        seq_len=args.seq_len,
        budget=args.budget,
        rank=args.rank,
        world=args.world,
        column=args.column,
        storage_options=_storage_options(args),
        weights=weights,
        progress=terminal_progress(),
        columns=_columns_of(args),
        **_selection(args),
    )
    if args.format == "table" and not args.out:
        rows = docs["lane"].n_unique()
        units = docs.select("epoch", "window_index").unique().sort("epoch", "window_index").rows()
        where = ", ".join(f"epoch {e} window {w}" for e, w in units)
        n = Layout.of(lanes=args.lanes, seq_len=args.seq_len).at(args.step).seq_len
        print(f"step {args.step}: {docs.height} document pieces in {rows} sequences of {n} tokens ({where})")
    _print_frame(docs, args.format, args.out, title=f"step {args.step}")
    return 0


def _rows_arg(values: list[str] | None) -> list[tuple[Any, ...]] | None:
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

    source, weights = _source_of(args)
    steps: Any = args.steps
    if steps is not None and ":" in steps:
        a, _, b = steps.partition(":")
        steps = (int(a), int(b)) if a.strip().isdigit() and b.strip().isdigit() else steps
    elif steps is not None and steps.strip().isdigit():
        steps = int(steps)
    extra: dict[str, Any] = {"rank": args.rank} if args.rank is not None else {}
    if args.length_column:
        extra["length_column"] = args.length_column
    extra.update({k: v for k, v in _selection(args).items() if k in ("dedupe", "exclude")})
    docs = locate(
        source,
        args.where,
        rows=_rows_arg(args.row),
        epochs=args.epochs,
        steps=steps,
        selection=args.selection,
        progress=terminal_progress(),
        seed=args.seed,
        lanes=args.lanes,
        window=args.window,
        seq_len=args.seq_len,
        world=args.world,
        column=args.column,
        storage_options=_storage_options(args),
        weights=weights,
        columns=_columns_of(args),
        **extra,
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
    _print_frame(docs, args.format, args.out, title="pieces")
    return 0


def cmd_audit(args: argparse.Namespace) -> int:
    from plitzer.audit import audit

    if args.steps is not None and args.steps < 1:
        msg = f"--steps {args.steps} must be >= 1: the run length of the epoch table (leave it out for one epoch)"
        raise ConfigError(msg)
    windows = [int(w) for w in args.windows.split(",")] if args.windows else None
    source, weights = _source_of(args)
    report = audit(
        source,
        weights=weights,
        seed=args.seed,
        lanes=args.lanes,
        window=args.window,
        world=args.world,
        seq_len=args.seq_len,
        steps=args.steps,
        windows=windows,
        column=args.column,
        storage_options=_storage_options(args),
        progress=terminal_progress(),
        columns=_columns_of(args),
        **_selection(args),
    )
    for name in ("summary", "length_summary", "lane_balance_summary", "lockstep_summary", "reads_per_rank"):
        _print_frame(report.tables[name], args.format, None, title=name.replace("_", " "))
    _print_frame(report.tables["read_amplification"], args.format, None, title="read amplification")
    _print_frame(report.tables["epochs_covered"], args.format, None, title="epochs covered")
    dup = report.tables["duplicates"]
    groups = dup["group"].n_unique() if dup.height else 0
    print(f"duplicates: {dup.height} documents in {groups} groups of identical documents")
    page = report.write(args.out)
    print(f"wrote {page}")
    return 0


def cmd_checkpoint(args: argparse.Namespace) -> int:
    from plitzer.tools.checkpoints import describe

    summary, config = describe(args.files, out=args.out)
    _print_frame(summary, args.format, None, title="checkpoint")
    _print_frame(config, args.format, None, title="configuration")
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


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose mistakes are one ``plitzer: error:`` line (not the usage and a second line)."""

    def error(self, message: str) -> NoReturn:
        where = self.prog.removeprefix("plitzer").strip()
        head = f"{where}: " if where else ""
        see = f"plitzer {where} --help" if where else "plitzer --help"
        self.exit(2, f"plitzer: error: {head}{message} (see {see})\n")


_SQL_HINT = (
    "the tables are index, row_groups, lanes, reads (and pieces, sources where they apply); "
    "the window column is window_index (docs/usage.md)"
)


def _describe(e: BaseException) -> str:
    """One line for an error a command met: what it is and, where we know, the fix."""
    from planner.errors import PlitzerError

    if isinstance(e, PlitzerError):
        return one_line(e)
    if type(e).__module__.split(".")[0] in ("duckdb", "_duckdb"):
        # The first lines of DuckDB's message (the error and its candidates), without the caret lines.
        lines = [x for x in str(e).splitlines() if x.strip() and not x.startswith("LINE ") and set(x.strip()) != {"^"}]
        return f"--sql: {' '.join(' '.join(lines).split())}; {_SQL_HINT}"
    if isinstance(e, OSError):
        what = f"{e.filename}: " if e.filename else ""
        return f"{what}{e.strerror or one_line(e)}"
    if isinstance(e, (ValueError, KeyError, TypeError, LookupError)):
        return f"{type(e).__name__}: {one_line(e)}"
    return (
        f"{type(e).__name__}: {one_line(e)} (unexpected: run again with --debug or PLITZER_DEBUG=1 for the "
        "traceback, and report it)"
    )


def _debugging(argv: list[str]) -> bool:
    """``--debug`` anywhere before a ``bench`` (which passes its arguments on), or PLITZER_DEBUG set; removed."""
    end = argv.index("bench") if "bench" in argv else len(argv)
    flag = "--debug" in argv[:end]
    while "--debug" in argv[:end]:
        argv.remove("--debug")
        end -= 1
    return flag or os.environ.get("PLITZER_DEBUG", "").strip().lower() not in ("", "0", "false", "no")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="plitzer",
        description="Deterministic, resumable loader for pre-tokenized Parquet: plans, audits, demo.",
    )
    from plitzer import __version__

    parser.add_argument("--version", action="version", version=f"plitzer {__version__}")
    parser.add_argument(
        "--debug", action="store_true", help="print the traceback of an error (also PLITZER_DEBUG=1), for bug reports"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    fmt = argparse.RawDescriptionHelpFormatter

    p = sub.add_parser(
        "synth", help="write FineWeb-Edu-shaped sample data", epilog=_EXAMPLES["synth"], formatter_class=fmt
    )
    p.add_argument("out", help="output folder")
    p.add_argument("--tokens", type=int, default=20_000_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--docs-per-row-group", type=int, default=1000)
    p.add_argument("--row-groups-per-file", type=int, default=16)
    p.add_argument("--mean-length", type=float, default=1000.0)
    p.add_argument(
        "--text",
        action="store_true",
        help="real text instead: installed packages' sources and docs, tokenized (plitzer[text] and mistral-common)",
    )
    p.add_argument("--tokenizer", default=None, help="with --text: a .model or tokenizer.json (default: mistral's)")
    p.add_argument("--row-group-tokens", type=int, default=4_500_000, help="with --text: tokens per row group")
    p.set_defaults(func=cmd_synth)

    p = sub.add_parser(
        "index", help="build or refresh the cached index", epilog=_EXAMPLES["index"], formatter_class=fmt
    )
    _add_source(p)
    p.add_argument("--format", choices=["table", "csv", "json"], default="table")
    p.add_argument(
        "--no-lengths",
        action="store_true",
        help="skip the document-length distribution (it reads the token column once; then it is cached)",
    )
    p.add_argument(
        "--engine",
        choices=["local", "ray"],
        default="local",
        help="with --where, --dedupe or --exclude: run the pass on this machine's cores, or as Ray tasks",
    )
    p.add_argument("--address", default=None, help="with --engine ray: the cluster (default: start a local one)")
    p.add_argument(
        "--out",
        default=None,
        metavar="PATH_OR_URL",
        help="also write the job index there (a local path or s3://, gs://, az:// URL): every rank of a job "
        "then reads that one object instead of every footer (Loader(..., index=PATH_OR_URL))",
    )
    p.add_argument(
        "--tokenizer",
        default=None,
        help="with --out: the data is text; count it with this tokenizer (.model or tokenizer.json) and write "
        "the counts into the job index (Loader(..., tokenizer=SAME, index=PATH_OR_URL) skips the counting pass)",
    )
    p.add_argument("--text-column", default="text", help="with --tokenizer: the column of text (default: text)")
    p.set_defaults(func=cmd_index)

    p = sub.add_parser("plan", help="the plan tables, or SQL over them", epilog=_EXAMPLES["plan"], formatter_class=fmt)
    _add_source(p)
    _add_settings(p, seq_len=True)
    p.add_argument("--epoch", type=int, default=0)
    p.add_argument(
        "--sql", default=None, help="DuckDB SQL over index, row_groups, lanes, reads (and a mixture's sources, stages)"
    )
    p.add_argument(
        "--external-access",
        action="store_true",
        help="let --sql read files and URLs (read_parquet of the dataset); off by default",
    )
    p.add_argument(
        "--table", choices=["index", "row_groups", "lanes", "reads", "sources", "layout", "steps"], default=None
    )
    p.add_argument("--format", choices=["table", "csv", "json", "parquet"], default="table")
    p.add_argument("--out", default=None, help="write to this file instead of printing")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser(
        "explain",
        help="the source documents of every sequence of one step, without replaying the run",
        description=(
            "Which documents (file, row group, row, token span, epoch) each sequence of step K holds. "
            "Computed from document lengths (one cached pass) and the plan, reading only the windows "
            "that step needs."
        ),
        epilog=_EXAMPLES["explain"],
        formatter_class=fmt,
    )
    _add_source(p)
    p.add_argument("--step", type=int, required=True, help="global step K (from 0)")
    p.add_argument("--lane", type=int, default=None, help="only this lane (row of the global batch)")
    _add_settings(p, seq_len=True)
    _add_setting(p, "rank")
    _add_setting(p, "budget")
    p.add_argument("--format", choices=["table", "csv", "json", "parquet"], default="table")
    p.add_argument("--out", default=None, help="write to this file instead of printing")
    p.set_defaults(func=cmd_explain)

    p = sub.add_parser(
        "locate",
        help="when the run saw these documents: every step, lane and offset, without replaying it",
        description=(
            "Every piece (step, rank, lane, start, length, token offset) of the documents --where (or --row) "
            "names, from the plan and the token lengths of the row groups that share their lanes."
        ),
        epilog=_EXAMPLES["locate"],
        formatter_class=fmt,
    )
    p.add_argument("data", nargs="*", help="folder, .parquet file or s3://bucket/prefix (several allowed)")
    p.add_argument("--mixture", default=None, metavar="FILE", help="a mixture file (TOML), as for plan")
    _add_setting(p, "column")
    p.add_argument("--endpoint", default=None, help="S3 endpoint URL")
    p.add_argument("--region", default=None, help="S3 region")
    p.add_argument("--where", default=None, help="the documents: a DuckDB SQL condition over the dataset's columns")
    p.add_argument("--row", action="append", metavar="FILE:ROW", help="a document by place (FILE:ROW_GROUP:ROW too)")
    p.add_argument("--epochs", default=None, help="epochs to search, 'a:b' (b excluded) or one (default: 0)")
    p.add_argument("--steps", default=None, help="only these steps: N (the first N) or 'a:b'")
    p.add_argument("--selection", default=None, help="the run's own where= (rows it trains on)")
    _add_setting(p, "dedupe")
    _add_setting(p, "exclude")
    _add_setting(p, "length_column", help="an integer column of each row's token count")
    _add_setting(p, "columns", type=_columns_arg)
    _add_settings(p, seq_len=True)
    _add_setting(p, "rank", default=None)
    p.add_argument("--format", choices=["table", "csv", "json", "parquet"], default="table")
    p.add_argument("--out", default=None, help="write to this file instead of printing")
    p.set_defaults(func=cmd_locate)

    p = sub.add_parser(
        "audit",
        help="dataset and plan health: one HTML report with pictures",
        description=(
            "Document lengths, tokens per file and row group, lane balance and lockstep, reads per rank "
            "and read amplification versus window, duplicate documents, and the epochs a number of "
            "steps covers; printed as tables and written as an HTML report with PNG pictures."
        ),
        epilog=_EXAMPLES["audit"],
        formatter_class=fmt,
    )
    _add_source(p)
    _add_settings(p, seq_len=True)
    p.add_argument("--steps", type=int, default=None, help="run length in steps for the epoch table (default: 1 epoch)")
    p.add_argument("--windows", default=None, help="window sizes to compare, e.g. 1,4,16,64 (default: powers of 2)")
    p.add_argument("--format", choices=["table", "csv", "json"], default="table")
    p.add_argument(
        "--out",
        default="plitzer-audit.html",
        help="report.html (one self-contained page) or a folder (report.html and PNGs)",
    )
    p.set_defaults(func=cmd_audit)

    p = sub.add_parser(
        "tokenize",
        help="write pre-tokenized Parquet from text Parquet (resumable; every core, or a Ray cluster)",
        description=(
            "Tokenize the text column of every *.parquet below SRC into DST (same relative paths): "
            "list<int32> token column, zstd, page checksums, row groups of at most about "
            "--row-group-tokens tokens. Complete files are skipped on a rerun."
        ),
        epilog=_EXAMPLES["tokenize"],
        formatter_class=fmt,
    )
    p.add_argument("src", help="text Parquet: a folder (searched recursively) or one file")
    p.add_argument("dst", help="output folder")
    p.add_argument("--tokenizer", required=True, help="SentencePiece .model or tokenizers JSON file")
    p.add_argument("--text-column", default="text")
    p.add_argument("--column", default="input_ids", help="name of the token column written")
    p.add_argument("--no-eos", action="store_true", help="do not end each document with EOS")
    p.add_argument("--bos", action="store_true", help="start each document with BOS")
    p.add_argument("--row-group-tokens", type=int, default=1 << 20, help="split larger input row groups (0: never)")
    p.add_argument("--engine", choices=["local", "ray"], default="local")
    p.add_argument("--address", default=None, help="with --engine ray: the cluster (default: start a local one)")
    p.add_argument("--jobs", type=int, default=None, help="local processes (default: one per core)")
    p.set_defaults(func=cmd_tokenize)

    p = sub.add_parser(
        "checkpoint",
        help="what checkpoint files hold; every rank's part merged into one",
        description=(
            "Reads and checks each file (a truncated, foreign or hostile file is refused, naming it), merges "
            "several into one global checkpoint (the parts of one run's ranks), and prints its step, lanes "
            "and configuration; --out writes the merged checkpoint."
        ),
        epilog=_EXAMPLES["checkpoint"],
        formatter_class=fmt,
    )
    p.add_argument("files", nargs="+", metavar="FILE", help="checkpoint files (save_checkpoint's), one per rank or one")
    p.add_argument("--out", default=None, help="write the merged checkpoint to this file")
    p.add_argument("--format", choices=["table", "csv", "json"], default="table")
    p.set_defaults(func=cmd_checkpoint)

    p = sub.add_parser(
        "bench",
        help="run the baseline benchmark (python -m plitzer.bench.baseline)",
        epilog=_EXAMPLES["bench"],
        formatter_class=fmt,
        add_help=False,
    )
    p.set_defaults(func=cmd_bench, args=[])

    p = sub.add_parser(
        "demo",
        help="generate a sample dataset, load it, checkpoint, resume at another world size",
        epilog=_EXAMPLES["demo"],
        formatter_class=fmt,
    )
    p.add_argument("--dir", default=os.path.join("data", "demo"), help="where the sample dataset goes")
    p.add_argument("--tokens", type=int, default=20_000_000)
    p.add_argument("--lanes", type=int, default=64)
    p.add_argument("--window", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=2048)
    p.set_defaults(func=cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    debug = _debugging(args_list)
    parser = build_parser()
    # `bench` passes every argument through (--help included) to plitzer.bench.baseline.
    args, extra = parser.parse_known_args(args_list)
    if args.command == "bench":
        args.args = extra
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        code: int = args.func(args)
        sys.stdout.flush()
    except (KeyboardInterrupt, SystemExit):
        raise
    except BrokenPipeError:
        # The reader went away (`plitzer plan ... | head`): nothing to report, and nothing more to
        # write; stdout goes to devnull so that the interpreter's last flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except Exception as e:
        if debug:
            traceback.print_exc()
        print(f"plitzer: error: {_describe(e)}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    raise SystemExit(main())
