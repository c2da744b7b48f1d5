"""Write the audit notebooks (without outputs): ``python notebooks/make_notebooks.py``.

The notebooks are generated so that their text stays reviewable here; the stored
``.ipynb`` files carry no outputs (tests/docs/test_notebooks.py checks both that and
that they run top to bottom and draw their pictures).
"""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).parent

SETUP = """\
%matplotlib inline
import tempfile
from pathlib import Path

import duckdb
import matplotlib.pyplot as plt
import numpy as np
import polars as pl
import pyarrow.parquet as pq

import plitzer
from plitzer import audit
from plitzer.tools.explain import document_lengths, document_table

pl.Config.set_tbl_rows(12)
data = Path(tempfile.mkdtemp(prefix="plitzer-notebook-"))
plitzer.synth.write(data, tokens=200_000, seed=0, docs_per_row_group=50, row_groups_per_file=4, mean_length=200)
"""

PLAN = [
    new_markdown_cell(
        "# Plan audit\n\n"
        "The plan of a dataset is a few small tables: the row-group order of each epoch, its windows, "
        "each lane's token range in each window, and the row groups each rank reads. This notebook "
        "builds the plan of a generated dataset (200,000 tokens, 20 row groups) for 16 lanes, "
        "windows of 4 row groups and 4 ranks, and asks it questions in SQL: which rank reads which "
        "row groups, how balanced the lanes are, and what read amplification costs."
    ),
    new_code_cell(
        SETUP + "\nsettings = dict(seed=0, lanes=16, window=4, world=4)\nplan = plitzer.plan(data, **settings)\nplan"
    ),
    new_markdown_cell("## The tables\n\nThe index: one row per row group, from the Parquet footers alone."),
    new_code_cell("plan.index"),
    new_markdown_cell(
        "Epoch 0's row-group order, cut into windows; `token_start` is where each row group begins in "
        "its window's stream, and `first_rank`..`last_rank` the ranks that read it."
    ),
    new_code_cell("plan.row_groups(0)"),
    new_code_cell("plan.lanes(0).head(16)"),
    new_code_cell("plan.reads(0)"),
    new_markdown_cell(
        "## Which rank reads which row groups\n\n"
        "A rank reads, per window, only the row groups whose token range meets its lanes' cut range."
    ),
    new_code_cell(
        'plan.sql("""\n'
        "    select rank, count(*) as row_groups, sum(bytes) as bytes,\n"
        "           string_agg(file || '#' || row_group, ', ' order by window_index, file, row_group) as reads\n"
        "    from reads group by rank order by rank\n"
        '""")'
    ),
    new_code_cell(
        "# The read matrix: a dot where a rank reads the row group at that position of epoch 0.\n"
        'hits = plan.sql("""\n'
        "    select r.rank, g.position from reads r\n"
        "    join row_groups g using (epoch, window_index, file, row_group)\n"
        '""")\n'
        "matrix = np.zeros((settings['world'], plan.index.height))\n"
        'matrix[hits["rank"].to_numpy(), hits["position"].to_numpy()] = 1\n'
        "fig, ax = plt.subplots(figsize=(9, 2.6))\n"
        'ax.imshow(matrix, aspect="auto", interpolation="nearest", cmap="Blues")\n'
        "for w in range(settings['window'], plan.index.height, settings['window']):\n"
        '    ax.axvline(w - 0.5, color="gray", linewidth=0.8)\n'
        'ax.set(xlabel="position in epoch 0 (gray lines: windows)", ylabel="rank", title="who reads what")\n'
        "ax.set_xticks(range(plan.index.height))\n"
        "ax.set_yticks(range(settings['world']))\n"
        "plt.show()"
    ),
    new_markdown_cell(
        "## How balanced are the lanes\n\nThe cut ranges are equal by construction (within one token per window):"
    ),
    new_code_cell(
        'plan.sql("""\n'
        "    select min(t) as min_tokens, max(t) as max_tokens from (\n"
        "        select lane, sum(token_end - token_start) as t from lanes group by lane)\n"
        '""")'
    ),
    new_markdown_cell(
        "A lane receives exactly the tokens of its cut range (a document that crosses a cut is split "
        "there and goes on in the next lane), and the cuts hand out the run's tokens round-robin, so "
        "over any run every lane has within one token of every other: the lanes run in lockstep, and "
        "a step reads from the window in use and at most the next."
    ),
    new_code_cell(
        "balance = audit.lane_balance(plan, epoch=0)\n"
        "steps = audit.lockstep(plan, seq_len=256, steps=3 * 50)\n"
        "fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.4))\n"
        "audit.plot_lane_balance(balance, ax=a)\n"
        "audit.plot_lockstep(steps, ax=b)\n"
        "plt.show()\n"
        'assert steps["token_spread"].max() <= 1\n'
        "balance.describe()"
    ),
    new_markdown_cell(
        "## Read amplification\n\n"
        "Over all ranks, a row group is read once, or twice where a rank boundary cuts it: at most "
        "`world - 1` extra reads per window, so at most `1 + (world - 1) * windows / G` (about "
        "`1 + (world - 1) / window`; a short last window adds a little)."
    ),
    new_code_cell(
        'plan.sql("""\n'
        "    select count(*) as reads,\n"
        "           (select count(*) from index where rows > 0) as row_groups,\n"
        "           count(*) / (select count(*) from index where rows > 0) as amplification\n"
        "    from reads\n"
        '""")'
    ),
    new_code_cell(
        "amp = audit.read_amplification(plan, lanes=settings['lanes'], world=settings['world'])\n"
        "fig, ax = plt.subplots(figsize=(7, 3.4))\n"
        "audit.plot_amplification(amp, ax=ax)\n"
        "plt.show()\n"
        "amp"
    ),
    new_markdown_cell("The same question over three epochs (each epoch has its own order):"),
    new_code_cell(
        'plan.sql("""\n'
        "    select epoch, rank, count(*) as row_groups, sum(bytes) as bytes\n"
        "    from reads group by epoch, rank order by epoch, rank\n"
        '""", epochs=[0, 1, 2]).pivot(on="epoch", index="rank", values="row_groups")'
    ),
    new_markdown_cell(
        "## A rank's rows, lazily\n\n`plan.scan` is a Polars LazyFrame of exactly the rows a rank reads."
    ),
    new_code_cell(
        "rows = plan.scan(0, rank=1).select('window_index', 'file', 'row_group', 'row', pl.col('tokens').list.len())\n"
        "rows.collect().group_by('window_index', 'file', 'row_group', maintain_order=True).agg(pl.len().alias('rows'))"
    ),
    new_markdown_cell(
        "## A mixture: target against delivered\n\n"
        "Several named sources with token shares, here in two stages (from step 0, then from step 150). "
        "The plan gains `source` and `source_epoch` columns and two tables, `sources` and `stages`; "
        "each source's share stays within one of its row groups of its weight, window after window."
    ),
    new_code_cell(
        "plitzer.synth.write(data / 'code', tokens=60_000, seed=1, docs_per_row_group=30, mean_length=80)\n"
        "sources = {'web': str(data), 'code': str(data / 'code')}\n"
        "stages = [(0, {'web': 1, 'code': 1}), (150, {'web': 3, 'code': 1})]\n"
        "mix = plitzer.plan(sources, weights=stages, seq_len=128, lanes=16, window=4, world=4)\n"
        'mix.sql("select * from stages")'
    ),
    new_code_cell(
        "shares = audit.mixture_shares(mix, seq_len=128, epochs=3)\n"
        "fig, ax = plt.subplots(figsize=(8, 3.4))\n"
        "audit.plot_mixture(shares, ax=ax)\n"
        "plt.show()\n"
        "# delivered share minus target, at the end of each stage\n"
        "shares.group_by('stage', 'source').agg(pl.all().sort_by('window').last())"
        ".with_columns((pl.col('delivered_share') - pl.col('target_share')).alias('error'))"
        ".select('stage', 'source', 'target_share', 'delivered_share', 'error').sort('stage', 'source')"
    ),
    new_markdown_cell("How often each source is used: source epochs begun by the end of each mixture epoch."),
    new_code_cell(
        "reps = audit.source_repetitions(mix, epochs=3)\n"
        "fig, ax = plt.subplots(figsize=(7, 3))\n"
        "for name, g in reps.group_by('source', maintain_order=True):\n"
        "    ax.plot(g['epoch'], g['repetitions'], marker='o', label=name[0])\n"
        "ax.set(xlabel='mixture epoch', ylabel='row groups read / row groups', title='repetitions per source')\n"
        "ax.legend()\n"
        "plt.show()\n"
        "reps"
    ),
]

DATA = [
    new_markdown_cell(
        "# Data audit\n\n"
        "Document lengths, duplicates, tokens per source file, what a given step held, and a proof "
        "that an epoch covers every document exactly once, by SQL over the batches' provenance. The "
        "dataset is generated (200,000 tokens), plus one file that copies 12 documents, so that "
        "there are duplicates to find."
    ),
    new_code_cell(
        SETUP + "copied = pq.read_table(data / 'part-00000.parquet').slice(5, 12)\n"
        "pq.write_table(copied, data / 'part-copies.parquet')\n"
        "sorted(p.name for p in data.glob('*.parquet'))"
    ),
    new_markdown_cell(
        "## Document lengths\n\n"
        "One row per document, with its length and a 64-bit content hash (one pass over the token "
        "column, cached under `PLITZER_CACHE`)."
    ),
    new_code_cell("docs = document_table(data)\ndocs"),
    new_code_cell(
        "fig, ax = plt.subplots(figsize=(7, 3.4))\n"
        'audit.plot_lengths(docs["length"].to_numpy(), ax=ax)\n'
        "plt.show()\n"
        'audit.length_summary(docs["length"].to_numpy())'
    ),
    new_code_cell('audit.length_histogram(docs["length"].to_numpy())'),
    new_markdown_cell("## Duplicates\n\nDocuments with the same length and content hash, in DuckDB:"),
    new_code_cell(
        'duckdb.sql("""\n'
        "    select hash, any_value(length) as length, count(*) as copies,\n"
        "           string_agg(file || '#' || row_group || ':' || row, ', ') as where_\n"
        "    from docs where length > 0 group by hash having count(*) > 1 order by min(doc)\n"
        '""").pl()'
    ),
    new_markdown_cell("or with `plitzer.audit.duplicates`, one row per copy:"),
    new_code_cell("dups = audit.duplicates(data)\nassert dups['group'].n_unique() == 12\ndups.head(6)"),
    new_markdown_cell("## Tokens per source file"),
    new_code_cell(
        'per_file = duckdb.sql("""\n'
        "    select file, count(distinct row_group) as row_groups, count(*) as documents, sum(length) as tokens\n"
        "    from docs group by file order by file\n"
        '""").pl()\n'
        "fig, ax = plt.subplots(figsize=(7, 3.2))\n"
        'ax.barh(per_file["file"], per_file["tokens"], color="#4477aa")\n'
        'ax.set(xlabel="tokens", title="tokens per source file")\n'
        "ax.invert_yaxis()\n"
        "plt.show()\n"
        "per_file"
    ),
    new_markdown_cell(
        "## What step K held\n\n"
        "`plitzer.explain` finds each lane's position at step K from document lengths and reads only "
        "the windows that step needs; nothing is replayed."
    ),
    new_code_cell(
        "cfg = dict(seed=0, lanes=8, window=4, seq_len=256)\nstep = 60\nheld = plitzer.explain(data, step, **cfg)\nheld"
    ),
    new_code_cell(
        "# Each row of the global batch, as its document pieces (colour: source file).\n"
        "files = sorted(held['file'].unique())\n"
        "colours = plt.cm.tab10(np.linspace(0, 1, 10))\n"
        "fig, ax = plt.subplots(figsize=(9, 3.2))\n"
        "for r in held.iter_rows(named=True):\n"
        "    c = colours[files.index(r['file']) % 10]\n"
        "    ax.barh(r['lane'], r['length'], left=r['start'], color=c, edgecolor='white')\n"
        "    if r['length'] > 25:\n"
        "        ax.text(r['start'] + 3, r['lane'], f\"{r['row_group']}:{r['row']}\", va='center', fontsize=7)\n"
        "ax.set(xlabel='token in the sequence', ylabel='lane', title=f'step {step}: documents per sequence')\n"
        "handles = [plt.Rectangle((0, 0), 1, 1, color=colours[i % 10]) for i in range(len(files))]\n"
        "ax.legend(handles, files, fontsize=7, loc='upper left', bbox_to_anchor=(1.0, 1.0))\n"
        "ax.invert_yaxis()\n"
        "plt.show()"
    ),
    new_markdown_cell("The same step in a real run agrees:"),
    new_code_cell(
        "with plitzer.Loader(data, **cfg) as loader:\n"
        "    for _ in range(step):\n"
        "        loader.next_batch()\n"
        "    real = loader.next_batch().documents()\n"
        'assert real.drop("batch_row").equals(held.drop("step"))'
    ),
    new_markdown_cell(
        "## Every document exactly once per epoch\n\n"
        "Collect the provenance of every batch until every lane has moved past epoch 0 (a step or "
        "so past the epoch's label), then check in SQL that the pieces of epoch 0 tile every "
        "document of the dataset exactly once: in one lane or split across neighbouring lanes, each "
        "piece starting where the previous one ended, from offset 0 to the document's length, no "
        "token missing or repeated."
    ),
    new_code_cell(
        "frames = []\n"
        "with plitzer.Loader(data, **cfg) as loader:\n"
        "    while True:\n"
        "        frame = loader.next_batch().documents()\n"
        "        frames.append(frame)\n"
        '        if frame.group_by("lane").agg(pl.col("epoch").min())["epoch"].min() > 0:\n'
        "            break\n"
        "pieces = pl.concat(frames)\n"
        "len(frames), pieces.height"
    ),
    new_code_cell(
        'proof = duckdb.sql("""\n'
        "    with ordered as (\n"
        "        select *, lag(token_offset + length, 1, 0) over (\n"
        "            partition by file, row_group, row order by token_offset) as previous_end\n"
        "        from pieces where epoch = 0),\n"
        "    per_doc as (\n"
        "        select file, row_group, row, count(distinct lane) as lanes, sum(length) as tokens,\n"
        "               min(token_offset) as first, max(token_offset + length) as last,\n"
        "               count(*) filter (where token_offset <> previous_end) as gaps\n"
        "        from ordered group by file, row_group, row)\n"
        "    select (select count(*) from docs where length > 0) as documents,\n"
        "           count(p.file) as seen,\n"
        "           count(*) filter (where p.gaps = 0 and p.tokens = d.length\n"
        "                            and p.first = 0 and p.last = d.length) as exactly_once\n"
        "    from docs d left join per_doc p using (file, row_group, row)\n"
        "    where d.length > 0\n"
        '""").pl()\n'
        'assert proof["documents"][0] == proof["seen"][0] == proof["exactly_once"][0]\n'
        "proof"
    ),
    new_code_cell(
        "# Tokens of epoch 0 per lane: the lanes' epoch-0 streams together hold the dataset.\n"
        'per_lane = pieces.filter(pl.col("epoch") == 0).group_by("lane").agg(pl.col("length").sum()).sort("lane")\n'
        'assert per_lane["length"].sum() == docs["length"].sum()\n'
        "fig, ax = plt.subplots(figsize=(7, 3))\n"
        'ax.bar(per_lane["lane"], per_lane["length"], color="#ee7733")\n'
        'ax.set(xlabel="lane", ylabel="tokens", title="epoch 0 tokens per lane")\n'
        "plt.show()"
    ),
    new_markdown_cell(
        "## When the model saw these documents\n\n"
        "The reverse question, for memorization studies and contamination audits: `plitzer.locate` "
        "gives every step, lane and offset that held the documents a predicate selects, without "
        "replaying the run (the plan, and the token lengths of the row groups that share their lanes). "
        "Over three epochs, for one document in a hundred:"
    ),
    new_code_cell(
        'seen = plitzer.locate(data, "id % 100 = 7", epochs="0:3", **cfg)\n'
        'keys = ["file", "row_group", "row"]\n'
        "# epoch 0 agrees with the batches collected above, piece for piece\n"
        'mine = seen.filter(pl.col("epoch") == 0).drop("step", "rank")\n'
        'real = pieces.filter(pl.col("epoch") == 0).join(mine.select(keys).unique(), on=keys, how="semi")\n'
        "assert mine.sort(mine.columns).equals(real.select(mine.columns).sort(mine.columns))\n"
        "seen.group_by(keys).agg(\n"
        '    pl.col("step").min().alias("first_step"),\n'
        '    pl.col("step").n_unique().alias("steps"),\n'
        '    pl.col("length").sum().alias("tokens"),\n'
        ').sort("first_step")'
    ),
    new_code_cell(
        'order = seen.group_by(keys).agg(pl.col("step").min().alias("first")).sort("first").with_row_index("doc")\n'
        "shown = seen.join(order, on=keys)\n"
        "fig, ax = plt.subplots(figsize=(8, 3.5))\n"
        'for e, colour in zip(range(3), ["#0077bb", "#ee7733", "#009988"]):\n'
        '    part = shown.filter(pl.col("epoch") == e)\n'
        '    ax.scatter(part["step"], part["doc"], s=4 + part["length"] / 8, color=colour, label=f"epoch {e}")\n'
        'ax.set(xlabel="step", ylabel="document (by first step)", title="when each document was seen")\n'
        "ax.legend(loc='lower right')\n"
        "plt.show()"
    ),
]


def write(name: str, cells: list[object]) -> None:
    nb = new_notebook(cells=cells)
    for i, cell in enumerate(nb.cells):
        cell.id = f"{Path(name).stem}-{i:02d}"  # stable ids: regenerating changes nothing
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    nbformat.validate(nb)
    nbformat.write(nb, HERE / name)


if __name__ == "__main__":
    write("plan_audit.ipynb", PLAN)
    write("data_audit.ipynb", DATA)
