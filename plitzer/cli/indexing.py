"""``plitzer index``: a dataset's index, its passes (``--where``, ``--dedupe``, best-fit's bins); job indexes.

:func:`cmd_index` is :mod:`plitzer.cli.commands`'s ``cmd_index`` (it imports it from here).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import polars as pl

from planner.catalog.rowgroups import stream_counts
from planner.errors import ConfigError
from planner.parameters import Selection
from planner.progress import terminal_progress
from planner.rules import rule_named
from plitzer.cli.options import print_frame, source_of, storage_options_of

__all__ = ["cmd_index"]


def cmd_index(args: argparse.Namespace) -> int:
    """``plitzer index``: the source's index (or job indexes), the passes asked for, its tables."""
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
    ix = _passes(args, _dataset_index(args, source, carried), source)
    _print_index(args, ix)
    if not args.no_lengths:
        _print_lengths(args, ix)
    return 0


def _dataset_index(args: argparse.Namespace, source: Any, carried: list[str]) -> Any:
    """The dataset's index (with the ``--columns`` it carries), written as a job index to ``--out`` where given."""
    from planner import index

    if carried:
        from planner.catalog.carried import carry
        from planner.catalog.files import list_files
        from plitzer.readpath.read import count_chunk

        entries, src = list_files(source, storage_options_of(args))
        ix = carry(entries, src, args.column, carried, progress=terminal_progress(), count=count_chunk)
    else:
        from planner.mixing.sources import SourceSpec
        from planner.parameters import FileFormat
        from plitzer.sources import open_files

        spec = SourceSpec(
            name="",
            path=source,
            column=args.column,
            storage_options=storage_options_of(args),
            file_format=FileFormat(args.data_format, args.eos_id, args.dtype, args.row_group_tokens),
        )
        ix = open_files(spec) or index(
            source, column=args.column, storage_options=storage_options_of(args), progress=terminal_progress()
        )
    if args.out is not None:
        from planner.catalog import jobindex

        data = jobindex.encode(ix, columns=carried)
        jobindex.write_object(args.out, data, storage_options_of(args))
        also = f"; carries {', '.join(carried)}" if carried else ""
        print(
            f"job index: {args.out} ({len(ix.files):,} files, {ix.row_groups:,} row groups, {len(data):,} bytes{also})"
        )
    return ix


def _passes(args: argparse.Namespace, ix: Any, source: Any) -> Any:
    """``ix`` through the passes asked for, in order: ``--where``, ``--dedupe``/``--exclude``, best-fit's bins."""
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
        and not rule_named(args.packing).needs_counts
    ):
        msg = "--length-column serves a pass: give --where, --dedupe, --exclude or --packing best-fit --seq-len L"
        raise ConfigError(msg)
    elif (
        args.engine == "ray"
        and args.dedupe is None
        and args.exclude is None
        and not rule_named(args.packing).needs_counts
    ):
        msg = "--engine ray runs a pass: give --where, --dedupe, --exclude or --packing best-fit --seq-len L"
        raise ConfigError(msg)
    if args.dedupe is not None or args.exclude is not None:
        from plitzer.selection.dedupe import dedupe_index
        from plitzer.selection.keying import dedupe_on_ray

        if args.engine == "ray" and args.where is None:
            dedupe_on_ray(ix, selection, source=source, storage_options=storage_options_of(args), address=args.address)
        ix = dedupe_index(ix, selection, storage_options=storage_options_of(args), progress=terminal_progress())
    if rule_named(args.packing).needs_counts:  # best-fit: its bins pass
        ix = _bins_pass(args, ix, source)
    return ix


def _summary(ix: Any, seq_len: Any) -> pl.DataFrame:
    """The index's one-row table: files, row groups, documents, tokens, and what each pass kept, dropped or padded."""
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
    if "bins" in f.columns:  # best-fit's (plitzer.bestfit.counts)
        columns["bins"] = [int(f["bins"].sum())]
        columns["padding_fraction"] = [1 - int(stream_counts(f)[0].sum()) / max(1, int(f["bins"].sum()) * seq_len)]
    if "rows_duplicate" in f.columns:
        columns["documents_duplicate"] = [int(f["rows_duplicate"].sum())]
        columns["documents_excluded"] = [int(f["rows_excluded"].sum())]
    columns.update({"column": [ix.column], "dtype": [ix.dtype], "fingerprint": [ix.fingerprint[:16]]})
    return pl.DataFrame(columns)


def _print_index(args: argparse.Namespace, ix: Any) -> None:
    """Print the index's table, the pinned commits of its Hub files, and its tokens per row group."""
    print_frame(_summary(ix, args.seq_len), args.format, None, title="index")
    from planner.stores.hf import HFStorage

    pinned = {st.pinned for st in map(ix.storage, range(len(ix.files))) if isinstance(st, HFStorage)}
    for url in sorted(pinned):  # what a later run passes to read these very files
        print(f"at its commit: {url}", file=sys.stderr)
    per_rg = ix.frame.select(
        pl.col("tokens").min().alias("min"),
        pl.col("tokens").quantile(0.5).cast(pl.Int64).alias("median"),
        pl.col("tokens").mean().cast(pl.Int64).alias("mean"),
        pl.col("tokens").max().alias("max"),
    )
    print_frame(per_rg, args.format, None, title="tokens per row group")


def _print_lengths(args: argparse.Namespace, ix: Any) -> None:
    """Print the documents' length summary and distribution (one pass over the token column, cached)."""
    from plitzer.audit import length_histogram, length_summary
    from plitzer.tools.explain import document_lengths

    # One pass over the token column (cached next to the index); --no-lengths skips it.
    lengths = document_lengths(ix, progress=terminal_progress())
    print_frame(length_summary(lengths), args.format, None, title="document lengths (tokens)")
    print_frame(length_histogram(lengths), args.format, None, title="document length distribution")


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
    from plitzer.bestfit.counts import BinSpec, bin_index, bins_on_ray

    if not isinstance(args.seq_len, int):
        msg = "--packing best-fit bins documents at one sequence length: give --seq-len L (e.g. 2048)"
        raise ConfigError(msg)
    spec = BinSpec(args.seq_len, args.packing, args.length_column)
    if args.engine == "ray" and args.where is None and args.dedupe is None and args.exclude is None:
        opts = storage_options_of(args)
        bins_on_ray(ix, spec, source=source, storage_options=opts, address=args.address)
    return bin_index(ix, spec, progress=terminal_progress())
