"""Every command that README.md, docs/ and the examples' docstrings show runs here.

The commands are found in the text itself: shell blocks, inline code that starts
with a program (``python``, ``plitzer``, ``torchrun``, ``pip``, ...) and the indented
command lines of ``docs/examples/*.py`` docstrings. Each must have a rule in
:data:`RULES`, so a command added to the docs without one fails
:func:`test_every_documented_command_has_a_rule`. The rules:

* ``run``: run as written, as a new user would, from a scratch folder that holds
  what earlier commands of the docs made (``plitzer demo``'s ``data/demo``,
  ``plitzer synth``'s ``data/sample`` and ``data/text``);
* ``scaled``: run with the sizes the rule gives (a 200 M-token dataset becomes a
  200 k one; benchmarks get small sizes and write their figures to the scratch
  folder, never over docs/figures; the baseline harness without ``--setup``, which
  would build its peers' virtual environments from the network: a peer that is
  not installed is a row saying so);
* ``help``: a synopsis (``plitzer plan DATA --lanes ...``): its ``--help`` runs;
* ``ci``: what .ci/run runs itself (the tests, lint, types), checked to be there;
* ``install``: a ``pip install``: no network in tests, so the extras it names are
  checked against pyproject.toml (an old release's pin is checked to name one);
* ``trainers``: a trainer's own command with plitzer as its data (docs/trainers/): the
  trainers are not installed here; tests/trainers/ runs each from its own command line or
  config on CPU, and .ci/run runs those in a venv with the trainers.
"""

from __future__ import annotations

import fcntl
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.net import free_port

ROOT = Path(__file__).resolve().parents[2]
PROGRAMS = ("python ", "plitzer ", "torchrun ", "pip ", ".venv/bin/python ", "ruff ", "mypy ")
BARE = ("mypy", "plitzer")  # commands of one word


def documented_commands() -> list[tuple[str, str]]:
    """(file, command) for every command the docs show, continuation lines joined."""
    out: list[tuple[str, str]] = []
    for f in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "docs").glob("*/*.md"))]:
        text = f.read_text()
        for m in re.finditer(r"```(?:sh|bash|console)\n(.*?)```", text, re.S):
            for raw in m.group(1).replace("\\\n", " ").splitlines():
                line = "" if raw.strip().startswith("#") else raw.split(" #")[0]
                out.extend((f.name, " ".join(p.split())) for p in line.split("&&") if p.strip())
        prose = re.sub(r"```.*?```", "", text, flags=re.S)
        indented = [raw for raw in prose.splitlines() if raw.startswith("    ") and raw.strip().startswith(PROGRAMS)]
        out.extend((f.name, " ".join(raw.split(" #")[0].split())) for raw in indented)  # indented code blocks
        for m in re.finditer(r"`([^`\n]+)`", prose):
            c = " ".join(m.group(1).split())
            if c.startswith(PROGRAMS) or c in BARE:
                out.append((f.name, c))
    for f in sorted((ROOT / "docs" / "examples").glob("*.py")):
        doc = f.read_text().split('"""')[1]
        lines = [line for line in doc.splitlines() if line.startswith("    ") and line.strip().startswith(PROGRAMS)]
        out.extend((f"examples/{f.name}", " ".join(line.split("#")[0].split())) for line in lines)
    return out


@dataclass(frozen=True)
class Rule:
    kind: str  # run, scaled, help, ci, install
    argv: str = ""  # what runs (scaled, help); empty: the command as written


R, CI, INSTALL, TRAINERS = Rule("run"), Rule("ci"), Rule("install"), Rule("trainers")


def scaled(argv: str) -> Rule:
    return Rule("scaled", argv)


def synopsis(argv: str) -> Rule:
    return Rule("help", argv)


OUT = "--out {scratch}/fig.png"
RULES: dict[str, Rule] = {
    # installs and what CI runs itself
    'pip install "plitzer==0.1.*"': INSTALL,
    'pip install "plitzer[audit]"': INSTALL,
    'pip install "plitzer[s3]"': INSTALL,
    'pip install "plitzer[text]"': INSTALL,
    'pip install "plitzer[torch]"': INSTALL,
    'pip install "plitzer[azure]"': INSTALL,
    'pip install "plitzer[gcs]"': INSTALL,
    'pip install "plitzer[hf]"': INSTALL,
    'pip install "plitzer[http]"': INSTALL,
    'pip install "plitzer[grain]"': INSTALL,
    'pip install "plitzer[torchtitan]"': INSTALL,
    'pip install "plitzer[olmo-core]"': INSTALL,
    'pip install "plitzer[litgpt]"': INSTALL,
    # the trainers' commands (docs/trainers/): tests/trainers/ runs each trainer so, on CPU
    "torchrun --nproc-per-node 8 -m torchtitan.train --module plitzer.integrations.torchtitan --config llama3_8b "
    "--dataloader.source s3://bucket/fineweb-edu --dataloader.window 64 --validator.enable "
    "--validator.dataloader.source s3://bucket/fineweb-edu-val": TRAINERS,
    "torchrun --nproc-per-node 8 -m torchtitan.train --module plitzer.integrations.torchtitan --config llama3_8b "
    "--dataloader.mixture mix.toml --training.disable_cuda_graphs --metrics.enable_wandb": TRAINERS,
    "torchrun --nproc-per-node 8 -m torchtitan.train --module plitzer.integrations.torchtitan --config llama3_8b "
    "--dataloader.mixture mix.toml --dataloader.steer 500 --training.disable_cuda_graphs --validator.enable "
    "--validator.dataloader.source s3://bucket/fineweb-edu-val": TRAINERS,
    "litgpt pretrain --config pretrain.yaml --devices 8 --resume auto": TRAINERS,
    "litgpt pretrain --config laptop.yaml --devices 1": TRAINERS,  # test_litgpt.py's model, 1 and 2 devices
    "python docs/examples/olmo_core_laptop.py": TRAINERS,  # tests/trainers/test_laptop.py runs it
    # torchtitan on a laptop: tests/trainers/test_laptop.py runs it as the page writes it
    "python -m plitzer.integrations.torchtitan_cpu --module plitzer.integrations.torchtitan --config llama3_debugmodel "
    "--dataloader.source data/small --training.local_batch_size 2 --training.seq_len 128 --training.steps 10": TRAINERS,
    'pip install -c .ci/constraints.txt -e ".[baseline]"': INSTALL,
    'pip install -c .ci/constraints.txt -e ".[dev]"': CI,
    "pip install -e .": INSTALL,
    "pip install plitzer": INSTALL,
    "mypy": CI,
    "ruff check .": CI,
    "ruff format --check .": CI,
    "python -m pytest -n auto": CI,
    "python -m pytest -n auto -m e2e": CI,
    "python -m pytest tests/sources/test_damaged.py tests/state/test_reliability.py tests/readpath/test_extremes.py "
    "tests/planning/test_index.py tests/stores/test_s3.py tests/lifecycle/test_shutdown.py "
    "tests/stores/test_outage_endings.py tests/cli/test_cli_errors.py "
    'tests/lifecycle/test_soak.py -m "e2e or not e2e"': CI,
    # the CLI, in the order the docs use it: the commands that write data first
    "plitzer demo": R,
    "python -c \"import pyarrow as pa, pyarrow.parquet as pq; pq.write_table(pa.table({'id': "
    "list(range(0, 40000, 50))}), 'x.parquet')\"": scaled(  # braces doubled: the argv is a format string
        "python -c \"import pyarrow as pa, pyarrow.parquet as pq; pq.write_table(pa.table({{'id': "
        "list(range(0, 40000, 50))}}), 'x.parquet')\""
    ),
    # The table first, in the same process: another worker may run the command that writes it.
    "plitzer index data/fineweb-34M-200docs --exclude x.parquet": scaled(
        "python -c \"import subprocess, pyarrow as pa, pyarrow.parquet as pq; pq.write_table(pa.table({{'id': "
        "[3, 17]}}), 'x1.parquet'); subprocess.run(['plitzer', 'index', 'data/sample', '--exclude', 'x1.parquet'], "
        'check=True)"'
    ),
    "plitzer index data/fineweb-34M-200docs --exclude x.parquet --length-column token_count": scaled(
        "python -c \"import subprocess, pyarrow as pa, pyarrow.parquet as pq; pq.write_table(pa.table({{'id': "
        "[3, 17]}}), 'x2.parquet'); subprocess.run(['plitzer', 'index', 'data/sample', '--exclude', 'x2.parquet', "
        "'--length-column', 'token_count'], check=True)\""
    ),
    "plitzer synth data/sample --tokens 300000": R,
    "plitzer synth data/small --tokens 200000 --vocab 2000": R,
    "plitzer synth --text data/text --tokens 200000000": scaled("plitzer synth --text data/text --tokens 200000"),
    "plitzer synth data/synth-300M --tokens 300000000": scaled("plitzer synth data/synth-300M --tokens 2000000"),
    "plitzer --version": R,
    "plitzer index data/demo": R,
    "plitzer index data/sample": R,
    "plitzer plan data/demo --lanes 64 --window 8 --world 4 --sql "
    '"select rank, count(*) n, sum(bytes) b from reads group by rank order by rank"': R,
    'plitzer plan data/demo --world 4 --sql "select rank, sum(bytes) from reads group by rank"': R,
    "plitzer plan data/sample --lanes 16 --window 4 --world 4": R,
    "plitzer plan data/sample --shuffle false --epochs 1 --lanes 8 --seq-len 512 --table steps": R,
    "plitzer plan data/sample --lanes 16 --window 4 --world 4 --table reads --epoch 1 --format csv --out reads.csv": R,
    'plitzer plan data/sample --world 4 --lanes 16 --sql "select rank, count(*) n from reads group by rank"': R,
    "plitzer explain data/demo --lanes 64 --window 8 --seq-len 2048 --step 40 --lane 3": R,
    "plitzer explain data/sample --step 3 --lanes 16 --window 4 --seq-len 512 [--lane 5] [--format csv]": scaled(
        "plitzer explain data/sample --step 3 --lanes 16 --window 4 --seq-len 512 --lane 5 --format csv"
    ),
    'plitzer locate data/sample --where "id in (7, 123)" --lanes 16 --window 4 --seq-len 512 --epochs 0:2': R,
    'plitzer locate DATA --where "..." [--epochs a:b] [--steps N] [--format csv]': synopsis("plitzer locate"),
    'plitzer locate DATA --where "..."': synopsis("plitzer locate"),
    "plitzer index DATA --out URL": scaled("plitzer index data/sample --out {scratch}/job-index.parquet"),
    "plitzer index DATA --out JOB": scaled("plitzer index data/sample --out {scratch}/job-index.parquet"),
    "python benchmarks/locate.py --part mixture --repeats 3": scaled(
        "python benchmarks/locate.py --part mixture --repeats 1 --steps 1000,100000"
    ),
    "python benchmarks/locate.py": scaled(
        "python benchmarks/locate.py --row-groups 2000 --data-row-groups 40 --counts 1,10 --lanes 64 --window 8"
    ),
    "plitzer audit data/demo --lanes 64 --window 8 --world 4 --out report.html": R,
    "plitzer audit data/sample --lanes 16 --window 4 --world 4 --seq-len 512 --out audit.html": R,
    "python -m plitzer": synopsis("python -m plitzer"),
    "plitzer": synopsis("plitzer"),
    "plitzer audit": synopsis("plitzer audit"),
    "plitzer audit DATA ... --out report.html": synopsis("plitzer audit"),
    "plitzer bench ...": synopsis("plitzer bench"),
    "plitzer explain DATA --step K [--lane J] ...": synopsis("plitzer explain"),
    "plitzer index": synopsis("plitzer index"),
    "plitzer index DATA [--no-lengths]": scaled("plitzer index data/sample --no-lengths"),
    "plitzer index DATA --packing best-fit --seq-len L": scaled(
        "plitzer index data/sample --packing best-fit --seq-len 2048 --no-lengths"
    ),
    "plitzer audit DATA --packing best-fit --seq-len L": scaled(
        "plitzer audit data/sample --packing best-fit --seq-len 2048 --lanes 8 --window 4 --out {scratch}/bf.html"
    ),
    "python benchmarks/throughput.py --packing best-fit --data data/text --column input_ids --threads 2 --lanes 64 "
    "--window 8 --repeat 5 --epochs 2": scaled(
        "python benchmarks/throughput.py --packing best-fit --data data/sample --threads 2 --lanes 8 --window 2 "
        "--repeat 1 --epochs 1 --padding-lengths 2048"
    ),
    "python benchmarks/throughput.py --packing best-fit": scaled(
        "python benchmarks/throughput.py --packing best-fit --tokens 1000000 --threads 2 --lanes 16 --repeat 1 "
        "--epochs 1 --padding-lengths 2048"
    ),
    "plitzer index DATA --no-lengths --out JOB": scaled(
        "plitzer index data/sample --no-lengths --out {scratch}/job-index.parquet"
    ),
    'plitzer index DATA --where "..."': scaled("plitzer index data/sample --where 'int_score >= 3' --no-lengths"),
    "plitzer index DATA --where ... --engine ray": synopsis("plitzer index"),
    "plitzer index DATA --dedupe tokens": scaled("plitzer index data/sample --dedupe tokens --no-lengths"),
    "plitzer plan": synopsis("plitzer plan"),
    "plitzer plan DATA --lanes --window --world [--epoch] [--table] [--sql] [--format] [--out]": synopsis(
        "plitzer plan"
    ),
    "plitzer synth": synopsis("plitzer synth"),
    "plitzer synth --text": synopsis("plitzer synth"),
    "plitzer synth DIR --tokens N": scaled("plitzer synth data/n --tokens 1000"),
    "plitzer checkpoint FILE... [--out F]": synopsis("plitzer checkpoint --help"),
    "plitzer tokenize": synopsis("plitzer tokenize"),
    "plitzer tokenize SRC DST": synopsis("plitzer tokenize"),
    "plitzer tokenize --engine ray": synopsis("plitzer tokenize"),
    # A tokenizer file is the user's; tests/text/test_text.py runs tokenize with real ones.
    "plitzer tokenize data/raw data/tokens --tokenizer tokenizer.model [--text-column text] [--engine ray]": synopsis(
        "plitzer tokenize"
    ),
    "python -m plitzer.bench.baseline": synopsis("python -m plitzer.bench.baseline"),
    "python -m plitzer.bench.baseline --help": R,
    # The harness on the docs' own data folders: tests/lifecycle/test_bench.py runs it end to end
    # (baseline.main, plitzer and every installed peer: rows, resume); here, that the command starts.
    "python -m plitzer.bench.baseline data/text --loaders plitzer,mosaic,hf,hf-stream --batch 64 --workers 2 --setup": (
        synopsis("python -m plitzer.bench.baseline")
    ),
    "python -m plitzer.bench.baseline data/text --loaders plitzer,litdata,grain,mosaic,hf,hf-stream --batch 64 "
    "--workers 2 --setup": synopsis("python -m plitzer.bench.baseline"),
    "python -m plitzer.bench.baseline data/synth-300M --loaders plitzer,mosaic,hf,hf-stream --batch 64 --workers 2 "
    "--setup": synopsis("python -m plitzer.bench.baseline"),
    # the examples, as their docstrings give them (torchrun where they use torchrun)
    "python docs/examples/train_tiny.py": R,  # trains, checkpoints model and data, resumes: the output is checked
    "python docs/examples/train_tiny.py DATA_DIR": scaled("python docs/examples/train_tiny.py data/sample"),
    "torchrun --nproc-per-node 2 docs/examples/train_tiny.py": R,
    "python docs/examples/loss_mixing.py": R,
    "python docs/examples/sft_mask.py": R,
    "python docs/examples/whole_documents.py": R,
    # benchmarks and offline checks, at small sizes
    "python tests/fuzz_parquet.py BASE WORK N SEED": scaled(
        "python tests/fuzz_parquet.py data/sample/part-00000.parquet {scratch}/fuzz 20 2"
    ),
    "python benchmarks/selection.py --tokens 60000000": scaled("python benchmarks/selection.py --tokens 300000"),
    "python benchmarks/dedupe_pass.py": scaled(
        "python benchmarks/dedupe_pass.py --docs 20000 --sim 100000 --rows 1000"
    ),
    "python benchmarks/dedupe_pass.py --docs 5000000 --mean-length 4 --rows 50000 --sim 1000000 --ranks 4": scaled(
        "python benchmarks/dedupe_pass.py --docs 20000 --mean-length 4 --rows 1000 --sim 100000 --ranks 2"
    ),
    "python benchmarks/dedupe_pass.py --docs 5000000 --mean-length 4 --rows 50000 --sim 1000000 --ranks 0 "
    "--spill-keys 1000000": scaled(
        "python benchmarks/dedupe_pass.py --docs 20000 --mean-length 4 --rows 1000 --sim 100000 --spill-keys 5000 "
        "--spilled 100000"
    ),
    "python benchmarks/drift.py": scaled("python benchmarks/drift.py --max-windows 200 --new-rule-windows 200"),
    "python benchmarks/balance.py": scaled(
        "python benchmarks/balance.py --text-tokens 300000 --row-group-tokens 50000 --fineweb-tokens 400000 "
        "--steps 4 --configs 2048:16:4,1024:8:2"
    ),
    # Gloo processes and an S3 server each (26-28 s of CPU at their smallest): their paths are the
    # tests' (tests/readpath/test_balance_gloo.py, tests/state/test_replicas.py); here, that they start.
    "python benchmarks/balance.py --exchange": synopsis("python benchmarks/balance.py --help"),
    "python benchmarks/replicas.py --tokens 4000000 --repeat 2": synopsis("python benchmarks/replicas.py --help"),
    "python benchmarks/memory.py": scaled(
        f"python benchmarks/memory.py --tokens 2000000 --limit 0.5 --budgets floor,512 --lanes 8 --window 4 "
        f"--seq-len 256 {OUT}"
    ),
    "python benchmarks/memory.py --data data/synth-300M": scaled(
        f"python benchmarks/memory.py --data data/synth-300M --limit 0.5 --budgets floor --lanes 8 --window 4 "
        f"--seq-len 256 {OUT}"
    ),
    "python benchmarks/layout.py --tokens 20000000 --lanes 64 --seq-len 2048 --factor 4 --window 4": scaled(
        "python benchmarks/layout.py --tokens 1000000 --lanes 8 --seq-len 256 --factor 4 --window 2 --repeat 1 "
        "--data {scratch}/layout"
    ),
    "python benchmarks/live_mixing.py --tokens 20000000 --lanes 64 --every 50": scaled(
        "python benchmarks/live_mixing.py --tokens 1000000 --lanes 16 --seq-len 256 --every 5 --repeat 1 "
        "--row-groups 300 --epochs 3 --data {scratch}/mix"
    ),
    "python benchmarks/mixture.py --tokens 20000000 --row-groups 30000 --epochs 100": scaled(
        "python benchmarks/mixture.py --tokens 1000000 --row-groups 300 --epochs 3 --repeat 1 --data {scratch}/mix",
    ),
    # The --shapes runs at 20 row groups a file (at 200 each took 43-45 s of a worker): the two
    # two-rank commands scale to one run.
    "python benchmarks/cluster.py --shapes": scaled(
        "python benchmarks/cluster.py --shapes --shapes-row-groups 20 --per-file 10 --ranks 2 --rank-files 4"
    ),
    "python benchmarks/cluster.py --shapes --shapes-row-groups 800 --rank-files 300 --ranks 2": scaled(
        "python benchmarks/cluster.py --shapes --shapes-row-groups 20 --per-file 10 --ranks 2 --rank-files 4"
    ),
    "python benchmarks/cluster.py --shapes --packing best-fit --shapes-row-groups 120000 --ranks 1": scaled(
        "python benchmarks/cluster.py --shapes --packing best-fit --shapes-row-groups 20 --per-file 10 --ranks 1"
    ),
    # the same run at 10^6 row groups (its scaled run is the line above's): the options it names exist
    "python benchmarks/cluster.py --shapes --packing best-fit --shapes-row-groups 1000000 --ranks 1": synopsis(
        "python benchmarks/cluster.py --help"
    ),
    "python benchmarks/cluster.py --shapes --index-only --rounds 3": scaled(
        "python benchmarks/cluster.py --shapes --index-only --shapes-row-groups 20 --per-file 10 --rounds 1"
    ),
    "python benchmarks/plan_scale.py": scaled("python benchmarks/plan_scale.py --row-groups 2000 --files 10"),
    "python benchmarks/seek_far.py": R,
    "python benchmarks/cluster.py": scaled(
        "python benchmarks/cluster.py --row-groups 2000 --files 200 --world 16 --from-world 8 --window 4"
    ),
    "python benchmarks/cluster.py --real --files 2000 --ranks 8 --latency-ms 30": scaled(
        "python benchmarks/cluster.py --real --files 20 --ranks 2 --latency-ms 5 --window 1 --seq-len 128 --repeat 1"
    ),
    "python benchmarks/resume.py": scaled(
        f"python benchmarks/resume.py --tokens 2000000 --fractions 0,0.5 --repeat 1 {OUT}"
    ),
    "python benchmarks/resume.py --data data/synth-300M": scaled(
        f"python benchmarks/resume.py --data data/synth-300M --fractions 0,0.5 --repeat 1 {OUT}"
    ),
    "python benchmarks/s3.py": scaled("python benchmarks/s3.py --tokens 400000 --lanes 8 --seq-len 256"),
    "python benchmarks/s3.py --latency-ms 30 --pace-mbps 100": scaled(
        "python benchmarks/s3.py --latency-ms 30 --pace-mbps 100 --tokens 400000 --lanes 8 --seq-len 256 "
        "--cold-files 20"
    ),
    "python benchmarks/s3.py --store hf --latency-ms 30 --pace-mbps 100": scaled(
        "python benchmarks/s3.py --store hf --latency-ms 30 --pace-mbps 100 --tokens 400000 --lanes 8 --seq-len 256"
    ),
    "python benchmarks/scaling.py": scaled(f"python benchmarks/scaling.py --sizes 1,2 --lanes 8 {OUT}"),
    "python benchmarks/scaling.py --sizes 50,150,300": scaled(
        f"python benchmarks/scaling.py --sizes 1,2 --lanes 8 {OUT}"
    ),
    "python benchmarks/scan_paths.py --tokens 60000000": scaled(
        "python benchmarks/scan_paths.py --tokens 1000000 --repeat 1"
    ),
    "python benchmarks/sweep.py": scaled(f"python benchmarks/sweep.py --tokens 2000000 --limit 0.3 {OUT}"),
    "python benchmarks/sweep.py --data data/synth-300M": scaled(
        f"python benchmarks/sweep.py --data data/synth-300M --limit 0.3 {OUT}"
    ),
    "python benchmarks/throughput.py --tokens 30000000 --threads 2": scaled(
        "python benchmarks/throughput.py --tokens 1000000 --threads 2 --lanes 16 --epochs 1"
    ),
    "python benchmarks/throughput.py --columns --tokens 4000000 --docs-per-row-group 200 --threads 2 --lanes 16 "
    "--window 4 --epochs 2 --repeat 3": scaled(
        "python benchmarks/throughput.py --columns --tokens 1000000 --threads 2 --lanes 16 --repeat 1 --epochs 1"
    ),
    "python benchmarks/throughput.py --tokens 34560000 --docs-per-row-group 200 --threads 2 --lanes 64 --seq-len 2048 "
    "--window 8 --epochs 2 --repeat 3": scaled(
        "python benchmarks/throughput.py --tokens 1000000 --threads 2 --lanes 16 --repeat 1 --epochs 1"
    ),
    "python benchmarks/throughput.py --parts --tokens 34560000 --docs-per-row-group 200 --threads 2 --repeat 5": scaled(
        "python benchmarks/throughput.py --parts --tokens 1000000 --docs-per-row-group 200 --threads 2 --lanes 16 "
        "--repeat 1"
    ),
    "python benchmarks/throughput.py --data data/text40 --column input_ids --threads 2 --lanes 64 --seq-len 2048 "
    "--window 8 --epochs 2 --repeat 3": scaled(
        "python benchmarks/throughput.py --data data/sample --lanes 16 --window 4 --repeat 1 --epochs 1"
    ),
    "plitzer synth --text data/text40 --tokens 40000000 --row-group-tokens 1000000": scaled(
        "plitzer synth --text data/text --tokens 200000"
    ),
    "python benchmarks/throughput.py --tokens 38000000 --threads 2": scaled(
        "python benchmarks/throughput.py --tokens 1000000 --threads 2 --lanes 16 --repeat 1 --epochs 1"
    ),
    "python benchmarks/throughput.py --data data/text --column input_ids --lanes 128 --window 16 --budget 4294967296": (
        scaled("python benchmarks/throughput.py --data data/sample --lanes 16 --window 4 --repeat 1 --epochs 1")
    ),
    "python benchmarks/throughput.py --tokens 38000000 --lanes 64 --seq-len 2048 --lanes-sweep 64,512,4096": scaled(
        "python benchmarks/throughput.py --tokens 1000000 --lanes 8 --seq-len 256 --lanes-sweep 8,64"
    ),
    "python benchmarks/throughput.py --tokens 34560000 --docs-per-row-group 200 --threads 2": scaled(
        "python benchmarks/throughput.py --tokens 1000000 --docs-per-row-group 200 --threads 2 --lanes 16 --repeat 1 "
        "--epochs 1"
    ),
    "python benchmarks/throughput.py --tokens 60000000": scaled(
        "python benchmarks/throughput.py --tokens 1000000 --lanes 16 --epochs 1"
    ),
    "python benchmarks/throughput.py --widths --tokens 20000000": scaled(
        "python benchmarks/throughput.py --widths --tokens 1000000 --lanes 16 --epochs 1"
    ),
    "python benchmarks/labels.py --tokens 16000000 --docs-per-row-group 200 --threads 2 --repeat 7 --epochs 2": scaled(
        "python benchmarks/labels.py --tokens 1000000 --threads 2 --repeat 1 --epochs 1"
    ),
    "python benchmarks/labels.py --packing best-fit --tokens 16000000 --docs-per-row-group 200 --threads 2 "
    "--repeat 7 --epochs 2": scaled(
        "python benchmarks/labels.py --packing best-fit --tokens 1000000 --threads 2 --repeat 1 --epochs 1"
    ),
    # labels at the trainers' shape on real text (docs/benchmarks.md): the same flags on the sample
    "python benchmarks/labels.py --data data/balance-text-64000000-1000000 --threads 2 --lanes 128 --seq-len 2048 "
    "--window 16 --epochs 3 --repeat 5": scaled(
        "python benchmarks/labels.py --data data/sample --threads 2 --lanes 8 --seq-len 256 --window 2 --epochs 1 "
        "--repeat 1"
    ),
    "python benchmarks/labels.py --data data/balance-text-64000000-1000000 --threads 2 --lanes 128 --seq-len 2048 "
    "--window 16 --epochs 2 --repeat 9": scaled(
        "python benchmarks/labels.py --data data/sample --threads 2 --lanes 8 --seq-len 256 --window 2 --epochs 1 "
        "--repeat 1"
    ),
    "python benchmarks/labels.py --packing best-fit --data data/balance-text-64000000-1000000 --threads 2 "
    "--lanes 128 --seq-len 2048 --window 16 --epochs 2 --repeat 7": scaled(
        "python benchmarks/labels.py --packing best-fit --data data/sample --threads 2 --lanes 8 --seq-len 256 "
        "--window 2 --epochs 1 --repeat 1"
    ),
    "python benchmarks/labels.py --parts --data data/balance-text-64000000-1000000 --threads 2 --lanes 128 "
    "--seq-len 2048 --window 16 --epochs 3": scaled(
        "python benchmarks/labels.py --parts --data data/sample --threads 2 --lanes 8 --seq-len 256 --window 2 "
        "--epochs 1"
    ),
    "python benchmarks/labels.py --parts --tokens 8000000 --threads 2": scaled(
        "python benchmarks/labels.py --parts --tokens 1000000 --threads 2 --epochs 1"
    ),
    "python benchmarks/tokenize_text.py --mb 20": scaled("python benchmarks/tokenize_text.py --mb 0.5"),
    "python tests/exit_stress.py --processes 2000 --jobs 2 --s3 0.25": scaled(
        "python tests/exit_stress.py --processes 4 --jobs 2 --s3 0.25"
    ),
    "python benchmarks/soak.py --steps 100000 --every 1000 --s3 --plot docs/figures/soak.png": scaled(
        "python benchmarks/soak.py --steps 3000 --every 500 --plot {scratch}/soak.png"
    ),
}


def test_every_documented_command_has_a_rule() -> None:
    found = documented_commands()
    assert len(found) > 40, found
    missing = sorted({c for _, c in found if c not in RULES})
    assert not missing, f"documented commands without a rule in tests/docs/test_docs_commands.py: {missing}"
    stale = sorted(set(RULES) - {c for _, c in found})
    assert not stale, f"rules for commands the docs no longer show: {stale}"


def test_installs_name_real_extras_and_ci_runs_the_rest() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = set(project["optional-dependencies"])
    ci = (ROOT / ".ci" / "run").read_text()
    for command, rule in RULES.items():
        if rule.kind == "install":
            for spec in re.findall(r"plitzer\[([a-z,-]+)\]|\"\.\[([a-z,-]+)\]\"", command):
                for extra in filter(None, ",".join(spec).split(",")):
                    assert extra in extras, (command, extra)
            assert project["name"] == "plitzer" or "-e ." in command
        elif rule.kind == "ci":
            assert command.removeprefix("pip install ").split(" tests/")[0] in ci, command
        elif rule.kind == "trainers":
            trainer = next((t for t in ("torchtitan", "olmo_core", "litgpt") if t in command), command.split()[0])
            assert (ROOT / "tests" / "trainers" / f"test_{trainer}.py").exists() and "tests/trainers" in ci, command


def _user_folder(d: Path) -> Path:
    """A new user's folder: the checkout's docs/, benchmarks/ and tests/ beside their data."""
    d.mkdir(parents=True, exist_ok=True)
    for sub in ("docs", "benchmarks", "tests"):
        (d / sub).symlink_to(ROOT / sub)
    return d


def _shared_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The data the docs make first (``_FIRST``), made once for the whole run, by the first
    worker that asks under a lock (each of the workers made it again before: ~15 s each).

    ``PLITZER_TESTS_DOCS_DATA`` names a folder that runs share: .ci/run's two runs (the README's
    test command and the e2e suites, which run the heaviest commands) make it once between them.
    """
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # shared by every worker of this run
    if os.environ.get("PLITZER_TESTS_DOCS_DATA"):
        root = Path(os.environ["PLITZER_TESTS_DOCS_DATA"])
        root.mkdir(parents=True, exist_ok=True)
    made = root / "docs-data"
    with (root / "docs-data.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (made / ".made").exists():
            shutil.rmtree(made, ignore_errors=True)
            _user_folder(made)
            for first in _FIRST:
                r = _run(_argv(first, RULES[first], made), made)
                assert r.returncode == 0, f"{first!r}: {r.stdout}{r.stderr}"
            (made / ".made").touch()
    return made / "data"


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new user's folder holding what the docs' first commands made (``plitzer demo``'s
    ``data/demo``, ``plitzer synth``'s ``data/sample`` and ``data/text``): links to the run's
    one copy, which no command writes to (new data folders are the worker's own)."""
    d = _user_folder(tmp_path_factory.mktemp("new-user"))
    data = _shared_data(tmp_path_factory)
    (d / "data").mkdir()
    for made in data.iterdir():
        (d / "data" / made.name).symlink_to(made, target_is_directory=True)
    return d


def _run(argv: str, scratch: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    bindir = Path(sys.executable).parent
    env = {
        **os.environ,
        "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(ROOT)) if p),
        "PLITZER_BENCH_DATA": str(scratch / "bench-data"),
        "PLITZER_CACHE": str(scratch / "cache"),
        "MPLBACKEND": "Agg",
        "PET_MASTER_PORT": str(free_port()),  # torchrun's --master-port, the command unchanged
    }
    args = shlex.split(argv)
    if args[0] == "python":
        args[0] = sys.executable
    return subprocess.run(args, cwd=scratch, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def _argv(command: str, rule: Rule, scratch: Path) -> str:
    text = rule.argv or command
    if rule.kind == "help":
        text += " --help"
    return text.format(scratch=scratch)


# Data-making commands first: the others read what they wrote.
_FIRST = [
    c
    for c in RULES
    if c.startswith(("plitzer demo", "plitzer synth data/sample", "plitzer synth --text", "plitzer synth data/synth"))
]
_RUNNABLE = _FIRST + [c for c, r in RULES.items() if r.kind in ("run", "scaled", "help") and c not in _FIRST]
# Commands that scale to the same command line run once, under the first one's name.
_RUNNABLE = [
    c
    for i, c in enumerate(_RUNNABLE)
    if all(_argv(c, RULES[c], Path()) != _argv(d, RULES[d], Path()) for d in _RUNNABLE[:i])
]


# The heaviest runs are end-to-end: `python -m pytest -m e2e` runs them (CI), the README's test
# command leaves them out. Each is a larger shape of a command that runs here too, or a process
# of its own whose paths other tests take: the real-shapes cluster runs (gloo ranks, generated
# FineWeb-shaped files: 40 and 22 s; tests/planning/test_cluster_scale.py and
# tests/sources/test_real_shapes.py), two torchrun ranks of train_tiny (22 s; the one-process
# example runs here, tests/state/test_distributed.py kills and resumes such ranks), the exit
# stress's command line (31 s; CI's own step runs the stress at full size), and, at 8-12 s each,
# benchmarks at their smallest (memory, simulated store latency, the dedupe pass, tokenizing)
# and the examples that mask or pack whole documents (tests/readpath, tests/selection and
# tests/text take each path).
HEAVY = (
    "python benchmarks/cluster.py --shapes",
    "python benchmarks/cluster.py --real",
    "python benchmarks/dedupe_pass.py",
    "python benchmarks/memory.py",
    "python benchmarks/s3.py --latency-ms",
    "python benchmarks/tokenize_text.py",
    "python docs/examples/train_tiny.py DATA_DIR",
    "python docs/examples/whole_documents.py",
    "python docs/examples/sft_mask.py",
    "torchrun --nproc-per-node 2 docs/examples/train_tiny.py",
    "python tests/exit_stress.py",
)
_PARAMS = [pytest.param(c, marks=pytest.mark.e2e) if c.startswith(HEAVY) else c for c in _RUNNABLE]


# All marked slow (the checkout's CI run has them; the wheel's three runs in parallel
# skip them): 60 fresh processes, a few minutes on 2 cores.
@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("command", _PARAMS, ids=[re.sub(r"[^\w.=-]+", "_", c)[:90] for c in _RUNNABLE])
def test_documented_command_runs(command: str, scratch: Path, tmp_path: Path) -> None:
    if command in _FIRST:  # a command that makes data runs in an empty folder, as a new user's first
        scratch = _user_folder(tmp_path / "new-user")
    rule = RULES[command]
    if any(w in command for w in ("train_tiny", "torchrun", "plitzer.bench.baseline", "cluster.py --real")):
        pytest.importorskip("torch")  # the torch extra (the wheel's runs without torch skip these)
    r = _run(_argv(command, rule, scratch), scratch)
    assert r.returncode == 0, f"{command!r} failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    if "train_tiny" in command:
        assert "ok: the resumed run equals the uninterrupted one" in r.stdout, r.stdout + r.stderr
    if "loss_mixing" in command:
        assert "ok: two runs with the same losses are identical" in r.stdout, r.stdout + r.stderr
    if command.startswith("torchrun"):
        assert r.stdout.count("ok: the resumed run equals") == 1, r.stdout  # printed by rank 0, both ranks agree
