"""Source -> index -> plan, in one place: what :func:`planner.plan` and every plitzer entry point call.

A source is a path, an ``s3://`` URL, a list of them, an index already built, or a
dict of named sources (a mixture, :mod:`planner.mixing.mixture`). :func:`open_index` turns
it into its :class:`~planner.catalog.rowgroups.RowGroupIndex`, :func:`make_plan` makes an
index's :class:`~planner.order.plan.Plan`. The planner's checks of how the keywords
go together are here (:func:`check_source`, :func:`check_layout`), each a ConfigError
naming the field and the fix; those of one value are its own type's
(:class:`~planner.order.plan.PlanSettings`, :class:`~planner.order.layout.Layout`,
:func:`~planner.mixing.sources.source_specs`, :func:`~planner.mixing.sources.parse_stages`;
docs/design.md, "Where settings are checked").

The selection pass (``where=``) reads data, so planner does not run one of its own:
the caller passes it (``selector=``; :func:`open_index` takes it in its
:class:`~planner.mixing.sources.Opening`), as plitzer does.

This module is the top of planner: it imports the modules it dispatches to, and none
of them imports it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Literal, cast

from planner.catalog.counting import Counting
from planner.catalog.dataset import ensure_index
from planner.catalog.dataset import index as catalog_index
from planner.catalog.datasetindex import Index
from planner.catalog.footer import ChunkCounter
from planner.catalog.rowgroups import RowGroupIndex
from planner.errors import ConfigError
from planner.mixing.mixture import MixtureIndex, MixturePlan, mixture_index
from planner.mixing.sources import Opening, SourceSpec, Weights, parse_stages, with_format
from planner.order.epoch import PlanSettings, Traversal
from planner.order.layout import Layout, LayoutStage
from planner.order.plan import Plan
from planner.parameters import PLAN_PARAMETERS, FileFormat, Selection, check_keywords, document
from planner.rules import UNPADDED, Packed, Rule, check_pad_id, rule_named
from planner.runtime import BINS, COLUMNS, COUNT, DEDUPE, FILES, SELECT, runtime_pass

__all__ = [
    "Deduper",
    "Opening",
    "PathSource",
    "Selector",
    "Source",
    "check_layout",
    "check_source",
    "columns_of",
    "index",
    "make_plan",
    "open_index",
    "plan",
    "source_kind",
]

PathSource = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]
"""A path, an ``s3://`` URL, or a list of them."""

Source = RowGroupIndex | PathSource | Mapping[str, Any]
"""What every entry point takes: a path source, an index, or a dict of named sources."""

Selector = Callable[[Index, SourceSpec], Index]
"""The selection pass (``where=``): an index in, the index of the rows its spec's predicate keeps out.

It reads data, so it is the runtime's (``plitzer.selector``, :func:`plitzer.selection.select.select_spec`),
and the caller passes it (``selector=``): planner itself reads metadata only.
"""

NO_SELECTOR = (
    "where= needs a selection pass, which reads data (planner reads metadata only): pass "
    "selector=plitzer.selector, or call plitzer.plan (this function: it defaults to the installed "
    "pass, plitzer's)"
)


def _selector(given: Selector | None) -> Selector:
    """``given``, else one that refuses with :data:`NO_SELECTOR` (nothing is looked up here)."""
    if given is not None:
        return given

    def refuse(ix: Index, spec: SourceSpec) -> Index:
        name = f"source {spec.name!r}: " if spec.name else ""
        msg = f"{name}{NO_SELECTOR}"
        raise ConfigError(msg)

    return refuse


Deduper = Callable[..., RowGroupIndex]
"""The deduplication and exclusion pass (``dedupe=``, ``exclude=``; SPEC section 14): an index and the run's
:class:`~planner.parameters.Selection` in, the index of the rows it keeps out (``plitzer.deduper``,
:func:`plitzer.selection.dedupe.dedupe_index`). It reads data, so it is the runtime's, and the caller passes
it (``deduper=``)."""

NO_BINNER = (
    "packing='best-fit' needs the bins pass, which reads the documents' lengths: call plitzer.plan "
    "(or pass binner=plitzer.bestfit.counts.plan_bins)"
)
Binner = Callable[..., Any]
"""The bins pass (``plitzer.bestfit.counts.plan_bins``): an index and ``seq_len`` in, the index with its bins out."""

NO_DEDUPER = (
    "dedupe= and exclude= need the deduplication pass, which reads data (planner reads metadata only): "
    "pass deduper=plitzer.deduper, or import plitzer first (plitzer.plan is this function), or use plitzer.Loader"
)


SourceKind = Literal["dict", "mixture index", "index", "paths"]
"""What a source is: a dict of named sources, a mixture's index, another index, or a path source."""


def source_kind(source: object) -> SourceKind:
    """The one place a source's kind is told apart (what :func:`open_index` and the checks dispatch on)."""
    if isinstance(source, Mapping):
        return "dict"
    if isinstance(source, MixtureIndex):
        return "mixture index"
    if isinstance(source, Index):
        return "index"
    return "paths"


def check_source(
    kind: SourceKind,
    *,
    weights: Weights = None,
    text: bool = False,
    where: str | None = None,
    length_column: str | None = None,
    dedupe: bool = False,
) -> None:
    """Refuse keywords that do not go together with a source of ``kind`` (the planner's checks, in one place).

    ``text``: a tokenizer is given (the source is text, counted by tokenizing). ``dedupe``:
    ``dedupe=`` or ``exclude=`` is given, or ``packing="best-fit"`` (passes the length column
    also serves).
    """
    if length_column is not None and where is None and not dedupe and kind != "dict":
        msg = (
            f"length_column={length_column!r} without where=, dedupe= or exclude=, or packing='best-fit'; the length "
            "column serves their passes (it gives the rows' token counts without decoding the token column)"
        )
        raise ConfigError(msg)
    if kind in ("dict", "mixture index"):
        if text:
            msg = (
                "tokenizer= with a mixture: give each text source its own, e.g. {'web': {'path': 'data/web', "
                "'tokenizer': 'tok.json', 'text_column': 'text'}, 'code': 'data/code'}"
            )
            raise ConfigError(msg)
        if kind == "mixture index" and where is not None:
            msg = "where= with a mixture's index: give each source its where in the dict of named sources"
            raise ConfigError(msg)
        return
    if weights is not None:
        msg = "weights= needs named sources: pass a dict such as {'web': 'data/web', 'code': 'data/code'}"
        raise ConfigError(msg)
    if kind == "index":
        if text:
            msg = "tokenizer= needs the text source, not an Index; pass the path (or a plitzer.text.source.text_index)"
            raise ConfigError(msg)
        return
    if text and where is not None:
        msg = "where= with tokenizer=: tokenize first (plitzer tokenize SRC DST), then select on the tokens"
        raise ConfigError(msg)


def check_layout(stages: Iterable[LayoutStage], world: object) -> None:
    """Refuse layout stages whose lanes ``world`` ranks cannot share evenly."""
    if not isinstance(world, int) or isinstance(world, bool) or world < 1:
        return  # PlanSettings names a bad world
    for st in stages:
        if st.lanes % world:
            msg = (
                f"lanes={st.lanes} (the layout stage from step {st.start}) is not divisible by world={world}; "
                f"every rank must own the same number of lanes in every stage: use lanes a multiple of {world}"
            )
            raise ConfigError(msg)


def _paths(source: object) -> PathSource:
    if isinstance(source, (str, os.PathLike, Sequence)):
        return source
    msg = (
        f"source={source!r} is not a path, an s3:// URL, a list of them, an index or a dict of named sources; "
        "pass one of those"
    )
    raise TypeError(msg)


def open_index(
    source: Source,
    *,
    column: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    weights: Weights = None,
    selection: Selection | None = None,
    opening: Opening | None = None,
    opened: Mapping[str, Index] | None = None,
    binned: bool = False,
) -> RowGroupIndex:
    """The index of ``source``: a mixture's for a dict, the given one for an index, else a dataset's.

    ``weights`` belong to named sources only. ``opening`` is what the runtime gives to open
    a source (:class:`~planner.mixing.sources.Opening`, plitzer's ``plitzer.sources.opening``;
    None: nothing): its ``text`` indexes a text source (plitzer passes its tokenizer's
    ``text_index`` here), which takes a path source only; ``selection``'s ``where`` (and
    ``length_column``) select rows by a DuckDB predicate through its ``select``, the
    runtime's selection pass (``plitzer.selector``; without it, see :data:`NO_SELECTOR`); a
    mixture's sources may each have their own, and ``where`` here is the default of those
    without. Its ``text_source`` indexes a mixture's text source (one whose dict has a
    ``tokenizer``) and its ``count`` counts a row group whose footer has no statistics
    (:func:`planner.index`). ``selection``'s ``dedupe`` and ``exclude`` are the caller's next
    pass (``deduper``, :func:`plan`). ``opened``: a mixture's sources opened already, by name
    (:func:`planner.mixing.mixindex.mixture_index`). ``binned``: best-fit's bins pass follows
    (``selection``'s ``length_column`` serves it too).
    """
    kind = source_kind(source)
    given = Opening() if opening is None else opening
    where, length_column = (None, None) if selection is None else (selection.where, selection.length_column)
    passes = binned or (selection is not None and (selection.dedupe is not None or selection.exclude is not None))
    text = given.text is not None
    check_source(kind, weights=weights, text=text, where=where, length_column=length_column, dedupe=passes)
    if kind in ("dict", "mixture index"):
        return mixture_index(
            cast("Mapping[str, Any] | MixtureIndex", source),  # what source_kind found
            column=column,
            storage_options=storage_options,
            selection=selection,
            opening=replace(given, select=_selector(given.select)),
            opened=opened,
        )
    if kind == "index":
        ix = ensure_index(cast("Index", source), column=column)  # what source_kind found
    else:
        paths = _paths(source)
        if given.text is not None:  # text in (plitzer.text.source): tokenized as read, counted once
            return given.text(paths)
        ix = _files(given, paths, column, storage_options) or ensure_index(
            paths, column=column, storage_options=storage_options, count=given.count
        )
    if where is None:
        return ix
    spec = SourceSpec(
        name="", path=ix.source, column=ix.column, selection=Selection(where=where, length_column=length_column)
    )
    return _selector(given.select)(ix, spec)


def index(
    source: PathSource,
    column: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    *,
    progress: bool | None = None,
    threads: int = 32,
    count: ChunkCounter | None = None,
    counting: Counting | None = None,
) -> Index:
    """``planner.index``: a kind of token files through the runtime's dispatcher (its ``files`` pass, as
    installed: Arrow IPC, Megatron), else :func:`planner.catalog.dataset.index` (Parquet; its docstring is this)."""
    if counting is None:
        got = _files(Opening(files=runtime_pass(None, FILES)), source, column, storage_options)
        if got is not None:
            return got
    return catalog_index(
        source, column, storage_options, progress=progress, threads=threads, count=count, counting=counting
    )


index.__doc__ = catalog_index.__doc__


def _files(
    given: Opening, paths: PathSource, column: str | None, storage_options: Mapping[str, Any] | None
) -> Index | None:
    """The index of ``paths`` where the runtime's dispatcher (``given.files``) finds a kind planner does not read."""
    if given.files is None:
        return None
    path: str | list[str] = [os.fspath(p) for p in paths] if isinstance(paths, (list, tuple)) else os.fspath(paths)  # type: ignore[arg-type]
    return given.files(SourceSpec(name="", path=path, column=column, storage_options=storage_options))


def make_plan(
    index: RowGroupIndex,
    settings: PlanSettings,
    *,
    weights: Weights = None,
    seq_len: int | None = None,
    layout: Layout | None = None,
    packing: Packed = UNPADDED,
) -> Plan:
    """The plan of ``index``: a mixture's (weights in stages) or one source's.

    ``layout``: layout stages (:mod:`planner.order.layout`), which place a weight stage's
    step in the run's tokens; by default one stage of ``settings.lanes`` and ``seq_len``.
    ``packing``: the rule's name, ``pad_id`` and tokens a row (``plan.packing``): the rule counts the units.
    """
    if layout is None and seq_len is not None:
        layout = Layout.of(lanes=settings.lanes, seq_len=seq_len)
    if isinstance(index, MixtureIndex):
        stages = parse_stages(weights, index.names, [ix.tokens for ix in index.parts])
        out: Plan = MixturePlan(index, settings, stages, seq_len=seq_len, layout=layout, packing=packing)
    else:
        out = Plan(index, settings, packing=packing)
    out.layout = layout
    return out


# planner.plan's docstring, which with its signature would pass the 60 lines of a def (tests/docs/test_structure.py)
_PLAN_DOC = """The plan of ``source`` (a path, URL, list, an :class:`~planner.Index`, or a dict of named sources).

    A dict of named sources is a mixture (:mod:`planner.mixing.mixture`): ``weights`` are its
    shares of tokens, a dict or stages ``[(step, dict), ...]`` (stages need ``seq_len``
    to place their steps); without weights each source weighs its tokens.

    ``where`` (a DuckDB predicate over the dataset's columns, SPEC section 10) plans
    the rows it keeps; the selection pass that counts them reads data, so it is the
    runtime's: pass ``selector=plitzer.selector``. ``dedupe`` and ``exclude`` (SPEC
    section 14) are the runtime's pass too: ``deduper=plitzer.deduper``; ``count`` counts a
    footer without statistics. ``plitzer.plan`` is this function (SPEC section 6): in a
    process that has imported plitzer, each one not given is plitzer's.

    Parameters
    ----------
    source : str, PathLike, list, planner.Index or dict of named sources
        The dataset (or mixture).
    <settings>
    selector : callable, optional
        The selection pass for ``where`` (``plitzer.selector``): an index and a
        :class:`~planner.mixing.sources.SourceSpec` in, the selected index out.
    deduper : callable, optional
        The pass for ``dedupe`` and ``exclude`` (``plitzer.deduper``): an index in, the
        index of the rows kept out.
    count : callable, optional
        Counts a row group whose footer has no statistics (``plitzer.readpath.read.count_chunk``;
        :func:`planner.index`).
    binner : callable, optional
        The bins pass for ``packing="best-fit"`` (``plitzer.bestfit.counts.plan_bins``): an index
        and ``seq_len`` in, the index with each row group's bins out.

    Examples
    --------
    >>> import planner, tempfile, pyarrow as pa, pyarrow.parquet as pq
    >>> d = tempfile.mkdtemp()
    >>> docs = pa.array([[i % 97] * (20 + i % 50) for i in range(400)], pa.list_(pa.int32()))
    >>> pq.write_table(pa.table({"tokens": docs}), f"{d}/part.parquet", row_group_size=25)
    >>> p = planner.plan(d, seed=0, lanes=8, window=4, world=2)
    >>> sorted(p.reads(0)["rank"].unique().to_list())
    [0, 1]
    """


@check_keywords("plan")
@document(PLAN_PARAMETERS, doc=_PLAN_DOC)
def plan(
    source: Source,
    seed: int = 0,
    lanes: Any = 512,
    window: int = 64,
    world: int = 1,
    *,
    column: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    weights: Any = None,
    shuffle: bool = True,
    epochs: int | None = None,
    seq_len: Any = None,
    where: str | None = None,
    length_column: str | None = None,
    dedupe: str | None = None,
    exclude: str | os.PathLike[str] | None = None,
    columns: Any = None,
    packing: str = "concat",
    pad_id: int = 0,
    format: str | None = None,
    eos_id: int | None = None,
    dtype: str | None = None,
    row_group_tokens: int | None = None,
    selector: Selector | None = None,
    deduper: Deduper | None = None,
    count: ChunkCounter | None = None,
    binner: Binner | None = None,
) -> Plan:
    layout, lanes, seq_len = _layout_of(lanes, seq_len, world)
    traversal = Traversal(shuffle=shuffle, epochs=epochs)
    settings = PlanSettings(seed=seed, lanes=lanes, window=window, world=world, traversal=traversal)
    selector = runtime_pass(selector, SELECT)  # plitzer.plan is this function (SPEC section 6)
    count = runtime_pass(count, COUNT)
    exclude = None if exclude is None else os.fspath(exclude)
    selection = Selection(where=where, length_column=length_column, dedupe=dedupe, exclude=exclude)
    rule = rule_named(packing)
    check_pad_id(pad_id)
    fmt = FileFormat(format=format, eos_id=eos_id, dtype=dtype, row_group_tokens=row_group_tokens)
    ix = open_index(
        source,
        column=column,
        storage_options=storage_options,
        weights=weights,
        selection=selection,
        opening=Opening(select=selector, count=count, files=with_format(runtime_pass(None, FILES), fmt)),
        binned=rule.needs_counts,
    )
    check_pad_id(pad_id, ix.dtype, ix.column, ix.source)  # the batches' dtype: as the loader checks it
    ix = _deduped(ix, source, selection, deduper, storage_options)
    check = runtime_pass(None, COLUMNS) if columns else None
    if check is not None:  # a column the data lacks is refused here as the loader would refuse it
        check(ix, columns)
    tokens_a_row = layout.first.seq_len if layout is not None else 0
    if rule.needs_counts:  # SPEC section 15: the plan cuts bins, which the runtime's pass counts at seq_len
        ix, layout, seq_len = _binned(ix, rule, packing, layout, length_column, binner)
    recorded = (rule.name, int(pad_id), tokens_a_row)
    p = make_plan(ix, settings, weights=weights, seq_len=seq_len, layout=layout, packing=recorded)
    p.columns = columns_of(columns)
    return p


def _layout_of(lanes: Any, seq_len: Any, world: int) -> tuple[Layout | None, Any, Any]:
    """The layout stages of ``lanes`` and ``seq_len`` (None without seq_len), and its first stage's lanes, seq_len."""
    if seq_len is None and isinstance(lanes, (list, tuple)):
        msg = "lanes in stages start at global steps: give seq_len= too, to place them (tokens per step)"
        raise ConfigError(msg)
    if seq_len is None:
        return None, lanes, seq_len
    layout = Layout.of(lanes=lanes, seq_len=seq_len)
    check_layout(layout.stages[1:], world)  # the first stage's lanes: PlanSettings checks them
    return layout, layout.first.lanes, layout.first.seq_len


def _deduped(
    ix: RowGroupIndex,
    source: Source,
    selection: Selection,
    deduper: Deduper | None,
    storage_options: Mapping[str, Any] | None,
) -> RowGroupIndex:
    """``ix`` through the runtime's ``dedupe=`` and ``exclude=`` pass where either is given (SPEC section 14)."""
    if selection.dedupe is None and selection.exclude is None:
        return ix
    deduper = runtime_pass(deduper, DEDUPE)
    if deduper is None:
        raise ConfigError(NO_DEDUPER)
    order = [str(n) for n in source] if isinstance(source, Mapping) else None
    return deduper(ix, selection, storage_options=storage_options, order=order)


def _binned(
    ix: RowGroupIndex, rule: Rule, packing: str, layout: Layout | None, length_column: str | None, binner: Binner | None
) -> tuple[RowGroupIndex, Layout, int]:
    """``ix`` with each row group's bins (the runtime's pass, at seq_len), and the layout and seq_len in bins."""
    if layout is None:
        msg = f"packing={packing!r} bins documents at seq_len: give seq_len= too (the tokens of a row)"
        raise ConfigError(msg)
    if len({s.seq_len for s in layout.stages}) > 1:
        msg = (
            f"plan tables of seq_len stages under packing={packing!r} are not in this release (the rest of a window "
            "is binned again at the change, from its documents' lengths); the Loader runs them. Plan each "
            "seq_len on its own, or change lanes only"
        )
        raise ConfigError(msg)
    binner = runtime_pass(binner, BINS)
    if binner is None:
        raise ConfigError(NO_BINNER)
    ix = binner(ix, layout.first.seq_len, length_column=length_column, packing=rule.name)
    return ix, layout.in_units(rule.units_per_row), rule.units_per_row(layout.first.seq_len)


def columns_of(columns: Any) -> list[list[Any]]:
    """``columns=`` (names, or name -> fill) as a plan shows it: ``[[name, fill or None], ...]`` by name.

    The plan records the aligned columns a run carries (SPEC section 13); the runtime reads
    and checks them (``plitzer.readpath.aligned``), planner reads no data.
    """
    if not columns:
        return []
    if isinstance(columns, str):
        columns = [c.strip() for c in columns.split(",") if c.strip()]
    if isinstance(columns, Mapping):
        return [[str(n), columns[n]] for n in sorted(columns)]
    return [[str(n), None] for n in sorted(columns)]
