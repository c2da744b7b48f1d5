"""The ``plitzer`` command line: synth, index, plan, demo.

Each subcommand has ``--help`` with examples. Tables print with rich on a
terminal and as plain text otherwise (or CSV/JSON/Parquet with ``--format``).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl

__all__ = ["main"]

_EXAMPLES = {
    "synth": "example: plitzer synth data/sample --tokens 20000000",
    "plan": (
        "examples:\n"
        "  plitzer plan data/sample --lanes 512 --window 64 --world 8\n"
        '  plitzer plan data/sample --world 8 --sql "select rank, count(*) n, sum(bytes) b from reads group by rank"\n'
        "  plitzer plan data/sample --table reads --epoch 1 --format csv --out reads.csv"
    ),
    "demo": "example: plitzer demo --dir data/demo --tokens 20000000",
    "index": "example: plitzer index data/sample",
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


def _storage_options(args: argparse.Namespace) -> dict[str, Any] | None:
    opts = {k: getattr(args, k) for k in ("endpoint", "region") if getattr(args, k, None)}
    return opts or None


def _add_source(p: argparse.ArgumentParser) -> None:
    p.add_argument("data", nargs="+", help="folder, .parquet file or s3://bucket/prefix (several allowed)")
    p.add_argument("--column", default=None, help="token column (default: the one list<int32|uint32> column)")
    p.add_argument("--endpoint", default=None, help="S3 endpoint URL")
    p.add_argument("--region", default=None, help="S3 region")


def _add_settings(p: argparse.ArgumentParser, *, seq_len: bool = False) -> None:
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lanes", type=int, default=512, help="sequences per global batch (B)")
    p.add_argument("--window", type=int, default=64, help="row groups shuffled together (W)")
    p.add_argument("--world", type=int, default=1, help="number of ranks (GPUs)")
    if seq_len:
        p.add_argument("--seq-len", type=int, default=2048, help="tokens per sequence (L)")


def cmd_synth(args: argparse.Namespace) -> int:
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


def cmd_index(args: argparse.Namespace) -> int:
    import planner

    ix = planner.index(_source(args.data), column=args.column, storage_options=_storage_options(args), progress=True)
    f = ix.frame
    summary = pl.DataFrame(
        {
            "files": [f["file"].n_unique()],
            "row_groups": [f.height],
            "documents": [int(f["rows"].sum())],
            "tokens": [int(f["tokens"].sum())],
            "empty_documents": [int(f["empty_docs"].sum())],
            "column": [ix.column],
            "dtype": [ix.dtype],
            "fingerprint": [ix.fingerprint[:16]],
        }
    )
    _print_frame(summary, args.format, None, title="index")
    per_rg = f.select(
        pl.col("tokens").min().alias("min"),
        pl.col("tokens").quantile(0.5).cast(pl.Int64).alias("median"),
        pl.col("tokens").mean().cast(pl.Int64).alias("mean"),
        pl.col("tokens").max().alias("max"),
    )
    _print_frame(per_rg, args.format, None, title="tokens per row group")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    import planner

    p = planner.plan(
        _source(args.data),
        seed=args.seed,
        lanes=args.lanes,
        window=args.window,
        world=args.world,
        column=args.column,
        storage_options=_storage_options(args),
    )
    if args.sql:
        _print_frame(p.sql(args.sql, epochs=[args.epoch]), args.format, args.out)
        return 0
    if args.table:
        tables = {
            "index": lambda: p.index,
            "row_groups": lambda: p.row_groups(args.epoch),
            "lanes": lambda: p.lanes(args.epoch),
            "reads": lambda: p.reads(args.epoch),
        }
        _print_frame(tables[args.table](), args.format, args.out, title=f"{args.table}, epoch {args.epoch}")
        return 0
    reads = p.reads(args.epoch)
    per_rank = (
        reads.group_by("rank").agg(pl.len().alias("row_groups"), pl.col("bytes").sum().alias("bytes")).sort("rank")
    )
    g = p.index.height
    amplification = reads.height / max(1, int((p.index["rows"] > 0).sum()))
    print(
        f"{p!r}\nepoch {args.epoch}: {p.windows} windows, {reads.height} reads for {g} row groups "
        f"(read amplification {amplification:.4f}; bound 1 + (world-1)/W = "
        f"{1 + (args.world - 1) / args.window:.4f})"
    )
    _print_frame(per_rank, args.format, args.out, title="reads per rank")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from plitzer.demo import run

    return run(Path(args.dir), tokens=args.tokens, seq_len=args.seq_len, lanes=args.lanes, window=args.window)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="plitzer",
        description="Deterministic, resumable loader for pre-tokenized Parquet: plans, audits, demo.",
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
    p.set_defaults(func=cmd_synth)

    p = sub.add_parser(
        "index", help="build or refresh the cached index", epilog=_EXAMPLES["index"], formatter_class=fmt
    )
    _add_source(p)
    p.add_argument("--format", choices=["table", "csv", "json"], default="table")
    p.set_defaults(func=cmd_index)

    p = sub.add_parser("plan", help="the plan tables, or SQL over them", epilog=_EXAMPLES["plan"], formatter_class=fmt)
    _add_source(p)
    _add_settings(p)
    p.add_argument("--epoch", type=int, default=0)
    p.add_argument("--sql", default=None, help="DuckDB SQL over index, row_groups, lanes, reads")
    p.add_argument("--table", choices=["index", "row_groups", "lanes", "reads"], default=None)
    p.add_argument("--format", choices=["table", "csv", "json", "parquet"], default="table")
    p.add_argument("--out", default=None, help="write to this file instead of printing")
    p.set_defaults(func=cmd_plan)

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
    from planner.errors import PlitzerError

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
    except PlitzerError as e:
        print(f"plitzer: error: {e}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    raise SystemExit(main())
