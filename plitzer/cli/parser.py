"""The ``plitzer`` command line's parser: every subcommand, its options and its examples.

One ``add_parser`` block a subcommand (:mod:`plitzer.cli.commands` runs them); the run's
parameters take their help, types and defaults from ``planner.parameters`` (:func:`plitzer.cli.options.add_setting`).
A mistake is one ``plitzer: error:`` line and exit status 2 (:class:`_Parser`).
"""

from __future__ import annotations

import argparse
import os
from typing import NoReturn

from plitzer.cli.commands import (
    cmd_audit,
    cmd_bench,
    cmd_checkpoint,
    cmd_demo,
    cmd_explain,
    cmd_index,
    cmd_locate,
    cmd_plan,
    cmd_synth,
    cmd_tokenize,
)
from plitzer.cli.options import add_setting, add_settings, add_source, columns_arg

__all__ = ["build_parser"]

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


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose mistakes are one ``plitzer: error:`` line (not the usage and a second line)."""

    def error(self, message: str) -> NoReturn:
        where = self.prog.removeprefix("plitzer").strip()
        head = f"{where}: " if where else ""
        see = f"plitzer {where} --help" if where else "plitzer --help"
        self.exit(2, f"plitzer: error: {head}{message} (see {see})\n")


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
    add_source(p)
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
    add_source(p)
    add_settings(p, seq_len=True)
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
    add_source(p)
    p.add_argument("--step", type=int, required=True, help="global step K (from 0)")
    p.add_argument("--lane", type=int, default=None, help="only this lane (row of the global batch)")
    add_settings(p, seq_len=True)
    add_setting(p, "rank")
    add_setting(p, "budget")
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
    add_setting(p, "column")
    p.add_argument("--endpoint", default=None, help="S3 endpoint URL")
    p.add_argument("--region", default=None, help="S3 region")
    p.add_argument("--where", default=None, help="the documents: a DuckDB SQL condition over the dataset's columns")
    p.add_argument("--row", action="append", metavar="FILE:ROW", help="a document by place (FILE:ROW_GROUP:ROW too)")
    p.add_argument("--epochs", default=None, help="epochs to search, 'a:b' (b excluded) or one (default: 0)")
    p.add_argument("--steps", default=None, help="only these steps: N (the first N) or 'a:b'")
    p.add_argument("--selection", default=None, help="the run's own where= (rows it trains on)")
    add_setting(p, "dedupe")
    add_setting(p, "exclude")
    add_setting(p, "length_column", help="an integer column of each row's token count")
    add_setting(p, "columns", type=columns_arg)
    add_settings(p, seq_len=True)
    add_setting(p, "rank", default=None)
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
    add_source(p)
    add_settings(p, seq_len=True)
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
