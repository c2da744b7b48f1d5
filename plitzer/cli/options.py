"""What the ``plitzer`` subcommands share: the source and settings options, their parsers, table printing."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl

from planner.errors import ConfigError
from planner.parameters import by_name
from plitzer.tools.mixfile import read_mixture

__all__ = [
    "add_setting",
    "add_settings",
    "add_source",
    "columns_arg",
    "columns_of",
    "print_frame",
    "selection_of",
    "source_arg",
    "source_of",
    "sources_table",
    "stages_arg",
    "storage_options_of",
]


def print_frame(df: pl.DataFrame, fmt: str, out: str | None, title: str | None = None) -> None:
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


def source_arg(values: list[str]) -> str | list[str]:
    return values[0] if len(values) == 1 else values


def sources_table(p: Any) -> pl.DataFrame:
    from planner.mixing.mixture import MixturePlan

    if isinstance(p, MixturePlan):
        return p.sources()
    msg = "--table sources: this plan has one source (give --mixture FILE for a mixture)"
    raise ConfigError(msg)


def source_of(args: argparse.Namespace) -> tuple[Any, Any]:
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
    return source_arg(args.data), None


def columns_of(args: argparse.Namespace) -> Any:
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


def storage_options_of(args: argparse.Namespace) -> dict[str, Any] | None:
    opts = {k: getattr(args, k) for k in ("endpoint", "region") if getattr(args, k, None)}
    return opts or None


def add_source(p: argparse.ArgumentParser) -> None:
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
    add_setting(p, "column")
    p.add_argument("--endpoint", default=None, help="S3 endpoint URL (or the Hub's, for hf://; else HF_ENDPOINT)")
    p.add_argument("--region", default=None, help="S3 region")
    add_setting(p, "where")
    add_setting(p, "length_column")
    add_setting(p, "columns", type=columns_arg)
    add_setting(p, "dedupe")
    add_setting(p, "exclude")


def columns_arg(text: str) -> list[str] | dict[str, Any]:
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


def selection_of(args: argparse.Namespace) -> dict[str, Any]:
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


def stages_arg(text: str) -> int | list[tuple[int, int]]:
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
    "lanes": stages_arg,
    "window": int,
    "seq_len": stages_arg,
    "budget": int,
    "rank": int,
    "world": int,
}
"""How each setting given on the command line is read (the rest are strings)."""


def add_setting(p: argparse.ArgumentParser, name: str, **kw: Any) -> None:
    """The option of setting ``name``: flag, default and help from :data:`planner.parameters.PARAMETERS`."""
    param = by_name(name)
    opts: dict[str, Any] = {"default": param.default, "help": param.help}
    if name in _TYPES:
        opts["type"] = _TYPES[name]
    opts.update(kw)
    p.add_argument(param.flag, **opts)


def add_settings(p: argparse.ArgumentParser, *, seq_len: bool = False) -> None:
    for name in ("seed", "lanes", "window", "world", *(("seq_len",) if seq_len else ())):
        add_setting(p, name)
