"""Every ``plitzer`` subcommand as one entry of :data:`COMMANDS`: its help, examples and options.

An entry lists its options in the order ``--help`` shows them: the shared groups of
:mod:`plitzer.cli.options` (:data:`SOURCE`, :data:`RUN`, ...), the run's settings by
their :data:`planner.parameters.PARAMETERS` name (:func:`setting`), and its own
options (:func:`arg`). Adding an option to a subcommand is one line of its entry;
:func:`plitzer.cli.parser.build_parser` builds every subparser from here, and
:func:`plitzer.cli.commands.run_settings` passes the settings an entry names on.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from plitzer.cli.options import ADDRESS, DATA_HELP, FORMAT, OUT, RUN, SEQ_LEN_PLAN, SOURCE, Arg, arg, formats, setting

INDEX_COLUMNS = (
    "with --out: the dataset columns the job index carries besides the token column, NAME,NAME "
    "(what the ranks' where=, length_column=, columns= and dedupe= then read from it instead of the files)"
)

__all__ = ["COMMANDS", "Command", "setting_names"]


@dataclass(frozen=True, slots=True)
class Command:
    """One subcommand: ``plitzer NAME``, run by ``plitzer.cli.commands.cmd_NAME``."""

    name: str
    help: str
    options: tuple[Arg, ...]
    epilog: str
    description: str | None = None
    add_help: bool = True
    defaults: Mapping[str, Any] = field(default_factory=dict)


_COMMANDS = (
    Command(
        "synth",
        "write FineWeb-Edu-shaped sample data",
        (
            arg("out", help="output folder"),
            arg("--tokens", type=int, default=20_000_000),
            arg("--seed", type=int, default=0),
            arg("--docs-per-row-group", type=int, default=1000),
            arg("--row-groups-per-file", type=int, default=16),
            arg("--mean-length", type=float, default=1000.0),
            arg("--column", default="tokens", help="the token column's name (default: tokens; e.g. input_ids)"),
            arg("--vocab", type=int, default=50257, help="token ids below this (a small model's vocabulary)"),
            arg(
                "--text",
                action="store_true",
                help="real text instead: installed packages' sources and docs, tokenized (plitzer[text] and "
                "mistral-common)",
            ),
            arg("--tokenizer", default=None, help="with --text: a .model or tokenizer.json (default: mistral's)"),
            arg("--row-group-tokens", type=int, default=4_500_000, help="with --text: tokens per row group"),
        ),
        "examples:\n  plitzer synth data/sample --tokens 20000000\n"
        "  plitzer synth data/code --tokens 2000000 --seed 1 --column input_ids   # the README's mixture source\n"
        "  plitzer synth --text data/text --tokens 200000000   # real text, a real tokenizer",
    ),
    Command(
        "index",
        "build or refresh the cached index",
        (
            # --columns means other here: what the job index carries, not what a run packs.
            *(o if o.setting != "columns" else setting("columns", help=INDEX_COLUMNS) for o in SOURCE),
            formats("table", "csv", "json"),
            arg(
                "--no-lengths",
                action="store_true",
                help="skip the document-length distribution (it reads the token column once; then it is cached)",
            ),
            arg(
                "--engine",
                choices=["local", "ray"],
                default="local",
                help="with --where, --dedupe or --exclude: run the pass on this machine's cores, or as Ray tasks",
            ),
            ADDRESS,
            arg(
                "--out",
                default=None,
                metavar="PATH_OR_URL",
                help="also write the job index there (a local path or s3://, gs://, az:// URL): every rank of a job "
                "then reads that one object instead of every footer (Loader(..., index=PATH_OR_URL))",
            ),
            arg(
                "--tokenizer",
                default=None,
                help="with --out: the data is text; count it with this tokenizer (.model or tokenizer.json) and "
                "write the counts into the job index (Loader(..., tokenizer=SAME, index=PATH_OR_URL) skips the "
                "counting pass)",
            ),
            arg("--text-column", default="text", help="with --tokenizer: the column of text (default: text)"),
            setting(
                "packing", help="best-fit: also run the bins pass at --seq-len (cached; with --engine ray, as tasks)"
            ),
            setting("seq_len", default=None, help="with --packing best-fit: the tokens of a row the bins are made for"),
        ),
        "examples:\n"
        "  plitzer index data/sample\n"
        "  plitzer index data/sample --packing best-fit --seq-len 2048      # best-fit's bins pass, cached\n"
        "  plitzer index s3://bucket/prefix --endpoint http://localhost:9000 --no-lengths\n"
        "  plitzer index data/fineweb-edu --where \"int_score >= 3 and language = 'en'\" --length-column token_count\n"
        '  plitzer index s3://bucket/fineweb-edu --where "int_score >= 3" --engine ray --address auto\n'
        "  plitzer index s3://bucket/fineweb-edu --out s3://bucket/fineweb-edu.index   # a job index\n"
        "  plitzer index data/raw --tokenizer tokenizer.json --out data/raw.index      # a text source's\n"
        "  plitzer index --mixture mix.toml --out s3://bucket/indexes                 # one a source",
    ),
    Command(
        "plan",
        "the plan tables, or SQL over them",
        (
            *SOURCE,
            # --seq-len: 2048 by default under concat; under best-fit given, as plitzer.plan asks (cmd_plan).
            *(o if o.setting != "seq_len" else setting("seq_len", default=None, help=SEQ_LEN_PLAN) for o in RUN),
            arg("--epoch", type=int, default=0),
            arg(
                "--sql",
                default=None,
                help="DuckDB SQL over index, row_groups, lanes, reads (and a mixture's sources, stages)",
            ),
            arg(
                "--external-access",
                action="store_true",
                help="let --sql read files and URLs (read_parquet of the dataset); off by default",
            ),
            arg(
                "--table", choices=["index", "row_groups", "lanes", "reads", "sources", "layout", "steps"], default=None
            ),
            formats("table", "csv", "json", "parquet"),
            OUT,
        ),
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
        "or stages instead of weights: [[stages]] step = 0, weights = {web = 3, code = 1}",
    ),
    Command(
        "explain",
        "the source documents of every sequence of one step, without replaying the run",
        (
            *SOURCE,
            arg("--step", type=int, required=True, help="global step K (from 0)"),
            arg("--lane", type=int, default=None, help="only this lane (row of the global batch)"),
            *RUN,
            setting("rank"),
            setting("budget"),
            formats("table", "csv", "json", "parquet"),
            OUT,
        ),
        "examples:\n"
        "  plitzer explain data/sample --step 1200 --lanes 64 --window 8 --seq-len 2048\n"
        "  plitzer explain data/sample --step 1200 --lane 7 --lanes 64 --window 8 --format csv",
        "Which documents (file, row group, row, token span, epoch) each sequence of step K holds. "
        "Computed from document lengths (one cached pass) and the plan, reading only the windows "
        "that step needs.",
    ),
    Command(
        "locate",
        "when the run saw these documents: every step, lane and offset, without replaying it",
        (
            arg("data", nargs="*", help=DATA_HELP),
            arg("--mixture", default=None, metavar="FILE", help="a mixture file (TOML), as for plan"),
            setting("column"),
            *FORMAT,
            arg("--endpoint", default=None, help="S3 endpoint URL"),
            arg("--region", default=None, help="S3 region"),
            arg("--where", default=None, help="the documents: a DuckDB SQL condition over the dataset's columns"),
            arg("--row", action="append", metavar="FILE:ROW", help="a document by place (FILE:ROW_GROUP:ROW too)"),
            arg("--epochs", default=None, help="epochs to search, 'a:b' (b excluded) or one (default: 0)"),
            arg("--steps", default=None, help="only these steps: N (the first N) or 'a:b'"),
            arg("--selection", default=None, help="the run's own where= (rows it trains on)"),
            setting("dedupe"),
            setting("exclude"),
            setting("length_column", help="an integer column of each row's token count"),
            setting("columns"),
            *(o for o in RUN if o.setting != "epochs"),  # --epochs: the epochs searched (the run's end moves no piece)
            setting("rank", default=None),
            formats("table", "csv", "json", "parquet"),
            OUT,
        ),
        "examples:\n"
        "  plitzer locate data/sample --where \"url = 'https://example.com/a'\" --epochs 0:3 --lanes 64 --window 8\n"
        '  plitzer locate data/sample --where "id in (3, 17)" --steps 120000 --lanes 512 --format csv\n'
        "  plitzer locate data/sample --row part-00003.parquet:1234 --epochs 0 --world 8 --format json",
        "Every piece (step, rank, lane, start, length, token offset) of the documents --where (or --row) "
        "names, from the plan and the token lengths of the row groups that share their lanes.",
    ),
    Command(
        "audit",
        "dataset and plan health: one HTML report with pictures",
        (
            *SOURCE,
            *RUN,
            arg("--steps", type=int, default=None, help="run length in steps for the epoch table (default: 1 epoch)"),
            arg("--windows", default=None, help="window sizes to compare, e.g. 1,4,16,64 (default: powers of 2)"),
            formats("table", "csv", "json"),
            arg(
                "--out",
                default="plitzer-audit.html",
                help="report.html (one self-contained page) or a folder (report.html and PNGs)",
            ),
        ),
        "examples:\n"
        "  plitzer audit data/sample --lanes 64 --window 8 --world 4 --out audit.html\n"
        "  plitzer audit data/sample --lanes 512 --window 64 --world 8 --steps 100000 --out audit/",
        "Document lengths, tokens per file and row group, lane balance and lockstep, reads per rank "
        "and read amplification versus window, duplicate documents, and the epochs a number of "
        "steps covers; printed as tables and written as an HTML report with PNG pictures.",
    ),
    Command(
        "tokenize",
        "write pre-tokenized Parquet from text Parquet (resumable; every core, or a Ray cluster)",
        (
            arg("src", help="text Parquet: a folder (searched recursively) or one file"),
            arg("dst", help="output folder"),
            arg("--tokenizer", required=True, help="SentencePiece .model or tokenizers JSON file"),
            arg("--text-column", default="text"),
            arg("--column", default="input_ids", help="name of the token column written"),
            arg("--no-eos", action="store_true", help="do not end each document with EOS"),
            arg("--bos", action="store_true", help="start each document with BOS"),
            arg("--row-group-tokens", type=int, default=1 << 20, help="split larger input row groups (0: never)"),
            arg("--engine", choices=["local", "ray"], default="local"),
            ADDRESS,
            arg("--jobs", type=int, default=None, help="local processes (default: one per core)"),
        ),
        "examples:\n"
        "  plitzer tokenize data/raw data/tokens --tokenizer tokenizer.model\n"
        "  plitzer tokenize data/raw data/tokens --tokenizer tokenizer.json --text-column content --engine ray",
        "Tokenize the text column of every *.parquet below SRC into DST (same relative paths): "
        "list<int32> token column, zstd, page checksums, row groups of at most about "
        "--row-group-tokens tokens. Complete files are skipped on a rerun.",
    ),
    Command(
        "checkpoint",
        "what checkpoint files hold; every rank's part merged into one",
        (
            arg("files", nargs="+", metavar="FILE", help="checkpoint files (save_checkpoint's), one per rank or one"),
            arg("--out", default=None, help="write the merged checkpoint to this file"),
            formats("table", "csv", "json"),
        ),
        "examples:\n"
        "  plitzer checkpoint run/step-1000.ckpt\n"
        "  plitzer checkpoint run/rank-*.ckpt --out run/step-1000.ckpt   # every rank's part, merged",
        "Reads and checks each file (a truncated, foreign or hostile file is refused, naming it), merges "
        "several into one global checkpoint (the parts of one run's ranks), and prints its step, lanes "
        "and configuration; --out writes the merged checkpoint.",
    ),
    Command(
        "bench",
        "run the baseline benchmark (python -m plitzer.bench.baseline)",
        (),
        "examples:\n"
        "  plitzer bench --help          (the baseline benchmark's own options)\n"
        "  plitzer bench --loaders plitzer --time-limit 60",
        add_help=False,
        defaults={"args": []},
    ),
    Command(
        "demo",
        "generate a sample dataset, load it, checkpoint, resume at another world size",
        (
            arg("--dir", default=os.path.join("data", "demo"), help="where the sample dataset goes"),
            arg("--tokens", type=int, default=20_000_000),
            arg("--lanes", type=int, default=64),
            arg("--window", type=int, default=8),
            arg("--seq-len", type=int, default=2048),
        ),
        "example: plitzer demo --dir data/demo --tokens 20000000",
    ),
)

COMMANDS: dict[str, Command] = {c.name: c for c in _COMMANDS}
"""Every subcommand by name, in the order ``plitzer --help`` lists them."""


def setting_names(command: str) -> tuple[str, ...]:
    """The run's settings (PARAMETERS names) that ``command`` takes as options."""
    return tuple(o.setting for o in COMMANDS[command].options if o.setting is not None)
