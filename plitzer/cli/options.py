"""What the ``plitzer`` subcommands share: their options' groups (source, run settings, output), parsers, printing.

An option is an :class:`Arg`, one ``add_argument`` call kept as data; :func:`setting`
makes the option of a run setting from :data:`planner.parameters.PARAMETERS` (flag,
default, help). :mod:`plitzer.cli.table` lists each subcommand's.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from planner.errors import ConfigError
from planner.parameters import PLAN_PARAMETERS, by_name
from plitzer.tools.mixfile import read_mixture

__all__ = [
    "ADDRESS",
    "DATA_HELP",
    "DESTS",
    "FORMAT",
    "OUT",
    "RUN",
    "SEQ_LEN_PLAN",
    "SOURCE",
    "Arg",
    "arg",
    "columns_arg",
    "columns_of",
    "formats",
    "mixture_defaults",
    "print_frame",
    "setting",
    "source_arg",
    "source_of",
    "sources_table",
    "bool_arg",
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


def mixture_defaults(args: argparse.Namespace) -> None:
    """Take a mixture file's own settings (``dedupe``, ``exclude``, ``packing``, ``pad_id``) where the command
    line gives none."""
    if getattr(args, "mixture", None):
        from plitzer.tools.mixfile import mixture_settings

        for k, v in mixture_settings(args.mixture).items():
            if getattr(args, k, None) in (None, by_name(k).default):  # not given (or given as the default)
                setattr(args, k, v)


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


def bool_arg(text: str) -> bool:
    """``true`` or ``false`` (also yes/no, 1/0, on/off), any case."""
    got = {"true": True, "yes": True, "1": True, "on": True, "false": False, "no": False, "0": False, "off": False}
    if text.strip().lower() not in got:
        msg = f"{text!r}: give true or false (e.g. --shuffle false)"
        raise argparse.ArgumentTypeError(msg)
    return got[text.strip().lower()]


_READERS: dict[str, Callable[[str], Any]] = {
    "bool": bool_arg,
    "int": int,
    "int or layout stages": stages_arg,
    "list or dict": columns_arg,
}
"""How a setting given on the command line is read, by its parameter's ``kind`` (the rest are strings)."""


@dataclass(frozen=True, slots=True)
class Arg:
    """One option of a subcommand: the flags (or the positional's name) and keywords of its ``add_argument``."""

    flags: tuple[str, ...]
    kw: Mapping[str, Any]
    setting: str | None = None
    """The run setting (a PARAMETERS name) the option gives, passed on by ``run_settings``."""

    def add_to(self, p: argparse.ArgumentParser) -> None:
        p.add_argument(*self.flags, **self.kw)


def arg(*flags: str, **kw: Any) -> Arg:
    """A subcommand's own option: ``add_argument(*flags, **kw)``."""
    return Arg(flags, kw)


DESTS = {"format": "data_format"}
"""Settings whose option is stored under another name (``--format`` is a table's output format)."""


def setting(name: str, **kw: Any) -> Arg:
    """The option of run setting ``name``: flag, default and help from :data:`planner.parameters.PARAMETERS`.

    ``kw``: what a subcommand sets otherwise (its own default or help).
    """
    param = by_name(name)
    opts: dict[str, Any] = {"default": param.default, "help": param.help}
    read = _READERS.get(param.kind.removesuffix(", optional"))
    if read is not None:
        opts["type"] = read
    return Arg((param.flag,), {**opts, **kw}, name)


def formats(*choices: str) -> Arg:
    """``--format``, one of ``choices`` (the first, ``table``, by default)."""
    return arg("--format", choices=list(choices), default=choices[0])


DATA_HELP = (
    "Parquet: a folder or .parquet file; Arrow IPC: a Hugging Face datasets save_to_disk folder, a folder of "
    ".arrow files or one; Megatron indexed dataset: its prefix (data/x_text_document for .bin + .idx), its .idx "
    "or .bin, or a folder of pairs; OLMo numpy token files: a .npy file or a folder of them, with --data-format "
    "numpy --eos-id ID --dtype uint16|uint32|...; or a URL: s3://bucket/prefix, gs://, az://, "
    "hf://datasets/ORG/NAME/PATH, https:// (several allowed; in a store, a Megatron pair is named by its .idx or "
    ".bin URL, numpy files by a prefix or a .npy URL, an Arrow IPC file by its .arrow URL)"
)
"""The data positional's help: every kind of source a command reads (``plitzer.sources``)."""

SEQ_LEN_PLAN = (
    "tokens per sequence (L; default 2048, with --packing best-fit required: the bins are made for it), "
    "or layout stages STEP:L,STEP:L,... (e.g. 0:2048,90000:8192)"
)
"""``plan``'s --seq-len help: it has no default under best-fit, as ``plitzer.plan`` has none."""

FORMAT: tuple[Arg, ...] = (
    setting("format", dest=DESTS["format"], choices=["numpy"]),
    setting("eos_id"),
    setting("dtype", choices=["uint8", "uint16", "uint32", "uint64"]),
    setting("row_group_tokens"),
)
"""A source's format where its files cannot say it (SPEC section 21): ``--data-format numpy``, its EOS id and dtype,
and ``--row-group-tokens`` where the kind cuts its own row groups (Megatron, numpy)."""

SOURCE: tuple[Arg, ...] = (
    arg(
        "data",
        nargs="*",
        help=DATA_HELP,
    ),
    arg(
        "--mixture",
        default=None,
        metavar="FILE",
        help="a mixture file (TOML): [sources.NAME] tables with path, column, weight; or [[stages]] "
        "tables with step and weights = {NAME = w}",
    ),
    setting("column"),
    *FORMAT,
    arg("--endpoint", default=None, help="S3 endpoint URL (or the Hub's, for hf://; else HF_ENDPOINT)"),
    arg("--region", default=None, help="S3 region"),
    setting("where"),
    setting("length_column"),
    setting("columns"),
    setting("dedupe"),
    setting("exclude"),
)
"""The data (paths or ``--mixture``), its store and the selection: the source of a run."""

RUN: tuple[Arg, ...] = tuple(
    setting(n)
    for n in PLAN_PARAMETERS
    if n not in {o.setting for o in SOURCE} and n not in ("storage_options", "weights")  # --endpoint, --mixture
)
"""The rest of the settings that decide a plan (:data:`planner.parameters.PLAN_PARAMETERS`): order and layout."""

OUT = arg("--out", default=None, help="write to this file instead of printing")
ADDRESS = arg("--address", default=None, help="with --engine ray: the cluster (default: start a local one)")
