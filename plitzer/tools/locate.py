"""When did the model see this document: every step, lane and offset that held it, without replaying the run.

:func:`plitzer.explain` answers "what did step K hold"; :func:`locate` answers the
reverse. plitzer's order is arithmetic (docs/design.md, "Locating documents"): a row
group's place in each epoch is a permutation of the index, its documents' places in
the window stream follow from the footers' token counts and the documents' lengths,
the lane cuts deal that stream like cards, and each lane's slice is shuffled by a
hash of (seed, epoch, window, lane). So the pieces of a document follow from the
plan and the token lengths of the few row groups that share its lanes
(:mod:`planner.lookup.pieces` does the arithmetic). Reading is limited to the footers, the
predicate's columns (to find the documents), and those row groups' token lengths
(from ``length_column`` where given); no token value is needed. Under layout stages each
stage places the windows it delivers in its own lanes (:mod:`planner.lookup.staged`).

>>> import plitzer, plitzer.synth, polars as pl, tempfile
>>> d = tempfile.mkdtemp(); _ = plitzer.synth.write(d, tokens=60_000, seed=1, docs_per_row_group=50)
>>> cfg = dict(seed=0, lanes=4, window=2, seq_len=64)
>>> seen = plitzer.locate(d, "id = 7", steps=200, **cfg)
>>> with plitzer.Loader(d, **cfg) as ld:
...     run = [ld.next_batch().documents() for _ in range(200)]
>>> want = [b.filter((pl.col("file") == "part-00000.parquet") & (pl.col("row_group") == 0) & (pl.col("row") == 7))
...         for b in run]
>>> sum(w.height for w in want) == seen.height and seen["length"].sum() > 0
True
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Unpack

import numpy as np
import polars as pl

from planner.arraytypes import I64
from planner.catalog.rowgroups import RowGroupIndex, stream_counts
from planner.errors import ConfigError, DataError
from planner.lookup.bins import BinnedLengths, RestWindow, rebinned_rest_pieces, rows_of_bins
from planner.lookup.pieces import Lengths, OneSource, Pieces, epochs_of_steps, lengths_from_array
from planner.lookup.staged import stage_pieces, stage_steps, staged_pieces
from planner.order.epoch import check_int, unit_counts
from planner.order.epoch_order import Permutation
from planner.order.layout import Layout
from planner.order.plan import Plan
from planner.parameters import document
from planner.rules import Binned, rule_named
from planner.run import Run
from plitzer.bestfit.counts import BinSpec, document_lengths
from plitzer.bestfit.rebin import Rebin
from plitzer.loader import open_plan
from plitzer.selection.dropped import base_of, split_targets
from plitzer.selection.select import source_rows
from plitzer.state.settings import KeywordsOfLocate, LoaderSettings
from plitzer.state.settings import Source as AnySource
from plitzer.tools.targets import Rows, part_of, target_documents

__all__ = ["Keywords", "RowLengths", "locate", "locate_in_plan", "parse_epochs", "plan_lengths", "target_documents"]


Keywords = KeywordsOfLocate
"""The run's settings (:class:`plitzer.state.settings.Keywords` less ``where`` and ``epochs``: locate's own name
the documents and the epochs searched; a finite run's pieces are those of the run without end, up to its end)."""


class RowLengths:
    """:data:`planner.lookup.pieces.Lengths` read from the data: each row group's documents' token lengths, once.

    From ``length_column`` where given (a column of each row's token count, checked
    against the footer), else the token column's list lengths (a text source is
    tokenized). Row groups are read in parallel and kept for the call.
    """

    def __init__(self, ix: RowGroupIndex, *, length_column: str | None = None, threads: int | None = None) -> None:
        self.ix = ix
        self.length_column = length_column
        self.threads = threads or os.cpu_count() or 2
        self._tokens, self._rows, _ = (x.to_numpy().astype(np.int64) for x in stream_counts(ix.frame))
        self._memo: dict[int, I64] = {}
        self.reads = 0

    def _read(self, rg: int) -> I64:
        if self._rows[rg] == 0:
            return np.zeros(0, np.int64)
        part, local = part_of(self.ix, rg)
        lengths = document_lengths(part, local, self.length_column)  # a selection's own column, none for text
        if len(lengths) != self._rows[rg] or int(lengths.sum()) != self._tokens[rg]:
            where = part.location(int(part.frame["file_index"][local]), int(part.frame["row_group"][local]))
            msg = (
                f"{where}: read {len(lengths)} documents of {int(lengths.sum())} tokens, but the index says "
                f"{self._rows[rg]} of {self._tokens[rg]}; the file changed since it was indexed: index it again"
            )
            raise DataError(msg)
        return lengths.astype(np.int64, copy=False)

    def __call__(self, rgs: I64) -> list[I64]:
        todo = [g for g in dict.fromkeys(np.asarray(rgs).tolist()) if g not in self._memo]
        if len(todo) > 1 and self.threads > 1:
            workers = min(self.threads, len(todo))
            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="plitzer-lengths") as pool:
                got = list(pool.map(self._read, todo))
        else:
            got = [self._read(g) for g in todo]
        self.reads += len(todo)
        self._memo.update(zip(todo, got, strict=True))
        return [self._memo[g] for g in np.asarray(rgs).tolist()]


# -- which part of the run ------------------------------------------------------------


def _steps(steps: object) -> tuple[int, int] | None:
    if steps is None:
        return None
    if isinstance(steps, range):
        if steps.step != 1:
            msg = f"steps={steps!r} must be a range with step 1 (a stretch of the run)"
            raise ConfigError(msg)
        a, b = steps.start, steps.stop
    elif isinstance(steps, (tuple, list)) and len(steps) == 2:
        a, b = steps
    else:
        b = check_int("steps", steps, 0, "steps=N is the run's first N steps; or give range(start, stop)")
        a = 0
    a = check_int("steps start", a, 0, "steps count from 0")
    b = check_int("steps stop", b, a, "give steps as (start, stop) with stop >= start")
    return a, b


def parse_epochs(epochs: object) -> list[int] | None:
    """``epochs=`` as a sorted list: an int, a range, an iterable of ints, or ``"a:b"`` (b excluded)."""
    if epochs is None:
        return None
    if isinstance(epochs, str):
        a, sep, b = epochs.partition(":")
        try:
            got: Iterable[object] = range(int(a), int(b)) if sep else [int(a)]
        except ValueError:
            msg = f"epochs={epochs!r} is not an epoch or a range 'a:b' of epochs (b excluded), e.g. '0:3'"
            raise ConfigError(msg) from None
        if sep and int(b) <= int(a):
            msg = f"epochs={epochs!r} is an empty range: 'a:b' is epochs a to b-1, so b must be above a (e.g. '0:3')"
            raise ConfigError(msg)
    elif isinstance(epochs, Iterable):
        got = epochs
    else:
        got = [epochs]
    return sorted({check_int("epochs", e, 0, "epochs count from 0") for e in got})


# -- the answer -----------------------------------------------------------------------


def _frame(ix: RowGroupIndex, p: Pieces, rank: I64) -> pl.DataFrame:
    rg = p.row_group
    frame = ix.frame
    cols: dict[str, Any] = {
        "step": p.step,
        "rank": rank,
        "lane": p.lane,
        "start": p.start,
        "length": p.length,
    }
    if "source" in frame.columns:  # a mixture's
        cols["source"] = frame["source"].gather(rg).cast(pl.String)
    cols.update(
        {
            "file": frame["file"].gather(rg).cast(pl.String),
            "row_group": frame["row_group"].gather(rg).cast(pl.Int64),
            "row": source_rows(ix, rg, p.doc),
            "token_offset": p.token_offset,
            "epoch": p.epoch,
            "window_index": p.window,
        }
    )
    return pl.DataFrame(cols)


def locate_in_plan(
    plan: Plan,
    row_groups: I64,
    docs: I64,
    lengths: Lengths,
    seq_len: int,
    *,
    epochs: list[int] | None = None,
    steps: tuple[int, int] | None = None,
    rank: int | None = None,
    layout: Layout | None = None,
    length_column: str | None = None,
) -> pl.DataFrame:
    """The pieces of the given documents in ``plan``'s run, as :func:`locate` returns them.

    ``layout``: the run's layout stages (each stage's lanes and rows, the window cut
    again at a change; ``seq_len`` is then the first stage's); by default one stage of
    the plan's lanes and ``seq_len``. ``rank``: only that rank's lanes.
    """
    layout = layout if layout is not None else Layout.one(plan.settings.lanes, seq_len)
    rule = rule_named(plan.packing[0])
    binned = None
    targets = (row_groups, docs)
    bins = rule.binning
    if bins is not None:  # best-fit: the bins' places are concat's over units (one a bin); the items' are the bins'
        raw, layout = lengths, layout.in_units(bins.units_per_row)
        binned = BinnedLengths(lengths, seq_len, bins)
        lengths, targets = binned, binned.targets(row_groups, docs)
        if layout.changes_tokens:  # each stage in its own bins, a window binned again as the loader bins it
            run = Run(plan, layout, plan.settings.world, 0, Rebin(plan, BinSpec(seq_len, bins.name, length_column)))
            if epochs is None:
                epochs = list(epochs_of_steps(run.labels, layout, steps)) if steps is not None else [0]
            got = Pieces.concat(
                p for e in epochs for p in _across_seq_lens(run, bins, raw, (row_groups, docs), e, steps)
            )
            return _answer(plan, layout, got, rank)
    # One source: its epochs are permutations of the index, laid out without the reads.
    view: Any = OneSource(plan, unit_counts(plan.dataset, rule)[0]) if isinstance(plan.order, Permutation) else plan
    if epochs is None:
        epochs = list(epochs_of_steps(view, layout, steps)) if steps is not None else [0]
    parts = [staged_pieces(view, layout, e, lengths, targets=targets, steps=steps) for e in epochs]
    got = Pieces.concat(parts)
    if binned is not None:
        got = rows_of_bins(got, binned, row_groups, docs)
    return _answer(plan, layout, got, rank)


def _answer(plan: Plan, layout: Layout, got: Pieces, rank: int | None) -> pl.DataFrame:
    """The pieces found, sorted, each with its rank (only ``rank``'s where given), as a frame."""
    got = got.sorted()
    ranks = got.lane // (layout.lanes_at(got.step) // plan.settings.world)
    if rank is not None:
        mine = np.flatnonzero(ranks == rank)
        got, ranks = got.take(mine), ranks[mine]
    return _frame(plan.dataset, got, ranks)


def _across_seq_lens(
    run: Run, rule: Binned, lengths: Lengths, targets: tuple[I64, I64], epoch: int, steps: tuple[int, int] | None
) -> Iterable[Pieces]:
    """The pieces of ``epoch`` under best-fit stages of several ``seq_len``: each stage over its own bins.

    A stage's windows are cut as :func:`planner.lookup.staged.stage_pieces` cuts them, over the
    stage's units (:meth:`planner.run.Run.currency`) and its ``seq_len``'s bins; a window binned
    again at a change is :func:`planner.lookup.bins.rebinned_rest_pieces`'s.
    """
    layout = run.layout
    want = np.unique((np.asarray(targets[0], np.int64) << 32) | np.asarray(targets[1], np.int64))
    for i, st in enumerate(layout.stages):
        cur, g = run.currency(i), run.began(i)
        binned = BinnedLengths(lengths, st.tokens, rule)
        again = g.rest_unit >= 0 and any(rc.tokens != g.base_tokens for rc in g.recuts)
        got = stage_pieces(cur, layout, i, epoch, binned, targets=binned.targets(*targets), steps=steps, rest=not again)
        yield rows_of_bins(got, binned, *targets)
        span = stage_steps(layout, i, steps)
        if not again or span is None or cur.unit_epoch_window(g.rest_unit)[0] != epoch:
            continue
        w = cur.unit_epoch_window(g.rest_unit)[1]
        ep = cur.epoch(epoch)
        at = np.flatnonzero(ep.window == w).astype(np.int64)
        start = cur.run_before(epoch) + int(ep.window_tokens[:w].sum())
        rest = RestWindow(epoch, w, ep.order[at], at, start, g.base_tokens, g.base_lanes, g.changes(), g.begin_step)
        got = rebinned_rest_pieces(rule, lengths, rest, cur.settings.slice_seed)
        hit = np.isin((got.row_group << 32) | got.doc, want) & (got.step >= span[0])
        if span[1] is not None:
            hit &= got.step < span[1]
        yield got.take(np.flatnonzero(hit))


_LOCATE_OWN = ("where", "rows", "epochs", "steps", "selection", "progress")  # besides the run's parameters


# plitzer.locate's docstring, which with its signature would pass the 60 lines of a def (tests/docs/test_structure.py)
_LOCATE_DOC = """Every piece of the documents ``where`` (or ``rows``) names that the run delivers.

    Parameters
    ----------
    <source>
    where : str, optional
        A DuckDB SQL boolean expression over the dataset's columns: the documents to
        locate (``"url = 'https://...'"``, ``"id in (3, 17)"``). On a mixture, every
        source that has the columns it names is searched; on a text source, the text
        column too.
    rows : list of (file, row) or (file, row_group, row), or a polars DataFrame
        The documents by place instead: ``file`` as ``batch.documents()`` names it,
        ``row`` counted in the file (or in ``row_group`` where given). A frame may
        carry ``source`` (a mixture's). A document the run's selection leaves out
        has no piece.
    epochs : int, range, iterable of ints, or "a:b"
        The epochs whose windows to search (the ``epoch`` column, the window's epoch,
        as ``batch.documents()`` has it). Default: epoch 0, or the epochs ``steps`` touch.
    steps : int, range or (start, stop)
        Only pieces of these global steps; an int ``N`` is the run's first N steps
        (``steps=loader.step``: everything the model has seen so far).
    selection : str, optional
        The run's own ``where=`` (its selection, SPEC section 10): ``where`` here names the
        documents to find, so the loader's keyword is spelled ``selection``.
    <settings>

    Returns
    -------
    polars.DataFrame
        One row per piece, in (step, lane, start) order: step, rank, lane, start (in the
        sequence), length, source (mixtures only), file, row_group, row (in the row
        group), token_offset (in the document), epoch, window_index: the rows
        ``batch.documents()`` of those steps give for those documents (with ``step`` and
        ``rank``; ``batch_row`` is ``lane`` less the rank's first lane). Under ``dedupe=`` or
        ``exclude=`` (SPEC section 14) a document they dropped has one row with no piece
        (``step`` null) whose ``dropped`` is ``"duplicate"`` or ``"excluded"``, and for a
        duplicate the document kept in its place (``kept_source``, ``kept_file``,
        ``kept_row_group``, ``kept_row``); ``dropped`` is null on the pieces.

    Nothing is replayed and no token value is read: footers, the predicate's columns,
    and the token lengths of the row groups that share a lane with the documents.
    The settings are the run's, the keywords of :class:`plitzer.Loader` but ``where``
    (spelled ``selection`` here): ``world`` decides the ``rank`` column; ``rank``, when
    given, keeps that rank's lanes only; ``length_column`` also spares decoding the
    token column for the lengths, without ``selection``. Layout stages (``lanes`` and
    ``seq_len`` in stages, SPEC section 12) place each piece in the stage that delivers it,
    the window cut again at a change included, ``rank`` counting that stage's lanes; after
    a loader's live ``set_layout`` calls, pass the stages of ``loader.config["layout"]``
    (``[[start step, lanes, seq_len], ...]``), as live weight stages are passed as
    ``weights=loader.config["stages"]``.
    """


@document(exclude=("where", "epochs"), doc=_LOCATE_DOC)
def locate(
    source: AnySource,
    where: str | None = None,
    *,
    rows: Rows | None = None,
    epochs: object = None,
    steps: object = None,
    selection: str | None = None,
    progress: bool | None = None,
    **settings: Unpack[Keywords],
) -> pl.DataFrame:
    length_column = settings.get("length_column")
    rank_given = "rank" in settings
    if selection is None:
        settings.pop("length_column", None)  # for the lengths only: the loader's length_column serves a selection
    s = LoaderSettings.of(caller="plitzer.locate", own=_LOCATE_OWN, **settings, where=selection)
    span = _steps(steps)
    eps = parse_epochs(epochs)
    plan = open_plan(source, s)
    base = base_of(plan.dataset)  # under dedupe= or exclude=: the documents as they were before it
    rgs, docs = target_documents(base, where, rows, threads=s.threads, progress=progress)
    dropped = None
    if base is not plan.dataset:
        rgs, docs, dropped = split_targets(plan.dataset, rgs, docs)
    lengths = RowLengths(plan.dataset, length_column=length_column, threads=s.threads)
    rank = s.rank if rank_given else None
    out = locate_in_plan(
        plan,
        rgs,
        docs,
        lengths,
        s.seq_len,
        epochs=eps,
        steps=span,
        rank=rank,
        layout=s.stages,
        length_column=s.selection.length_column,
    )
    if dropped is None:
        return out
    # A document dedupe= or exclude= dropped has no piece: one row says so (and which document was kept).
    if "source" not in out.columns:
        dropped = dropped.drop("source", "kept_source")
    return pl.concat([out, dropped], how="diagonal_relaxed")


def plan_lengths(ix: RowGroupIndex) -> Lengths:
    """:meth:`planner.order.plan.Plan.pieces`'s lengths: the cached document pass over the whole dataset.

    Installed as the ``lengths`` pass of ``planner.passes`` (pyproject.toml, :mod:`planner.runtime`).
    """
    from plitzer.tools.explain import document_pass

    rows = stream_counts(ix.frame)[1].to_numpy().astype(np.int64)
    return lengths_from_array(document_pass(ix)[0], rows)
