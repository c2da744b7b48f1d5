"""Source -> index -> plan, in one place: what :func:`planner.plan` and every plitzer entry point call.

A source is a path, an ``s3://`` URL, a list of them, an index already built, or a
dict of named sources (a mixture, :mod:`planner.mixture`). :func:`open_index` turns
it into its :class:`~planner.rowgroups.RowGroupIndex`, :func:`make_plan` turns an
index into its :class:`~planner.plan.Plan`; each mistake is a ConfigError raised
here and nowhere else (docs/design.md, "One index protocol, one builder, one dispatch").

This module is the top of planner: it imports the modules it dispatches to, and none
of them imports it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from planner.dataset import Index, ensure_index
from planner.errors import ConfigError
from planner.layout import Layout
from planner.mixture import MixtureIndex, MixturePlan, mixture_index
from planner.plan import Plan, PlanSettings
from planner.rowgroups import RowGroupIndex
from planner.sources import SourceSpec, Weights, parse_stages

__all__ = ["PathSource", "Selector", "Source", "make_plan", "open_index", "plan", "set_selector"]

PathSource = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]
"""A path, an ``s3://`` URL, or a list of them."""

Source = RowGroupIndex | PathSource | Mapping[str, Any]
"""What every entry point takes: a path source, an index, or a dict of named sources."""

Selector = Callable[[Index, SourceSpec], Index]
"""The selection pass (``where=``): an index in, the index of the rows its spec's predicate keeps out.

It reads data, so it is the runtime's (``plitzer.select``), set here when plitzer is
imported, as the chunk counter is; planner itself reads metadata only.
"""

_selector: Selector | None = None


def set_selector(select: Selector) -> None:
    """Make ``select`` the selection pass of :func:`plan` (``plitzer.select`` calls this on import)."""
    global _selector  # noqa: PLW0603  # one process-wide default, as planner.footer's chunk counter
    _selector = select


def _default_selector() -> Selector:
    if _selector is None:
        msg = "where= needs the runtime's selection pass, which reads data: import plitzer first"
        raise ConfigError(msg)
    return _selector


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
    text: Callable[[PathSource], Index] | None = None,
    where: str | None = None,
    length_column: str | None = None,
    select: Selector | None = None,
    text_source: Callable[[SourceSpec], Index] | None = None,
) -> RowGroupIndex:
    """The index of ``source``: a mixture's for a dict, the given one for an index, else a dataset's.

    ``weights`` belong to named sources only. ``text`` indexes a text source (plitzer
    passes its tokenizer's ``text_index`` here); it takes a path source only.
    ``where`` (and ``length_column``) select rows by a DuckDB predicate through
    ``select`` (default: the runtime's pass, :func:`set_selector`); a mixture's sources
    may each have their own, and ``where`` here is the default of those without.
    ``text_source`` indexes a mixture's text source (one whose dict has a ``tokenizer``).
    """
    if length_column is not None and where is None and not isinstance(source, Mapping):
        msg = f"length_column={length_column!r} without where=; the length column serves a selection"
        raise ConfigError(msg)
    if isinstance(source, (Mapping, MixtureIndex)):
        if text is not None:
            msg = (
                "tokenizer= with a mixture: give each text source its own, e.g. {'web': {'path': 'data/web', "
                "'tokenizer': 'tok.json', 'text_column': 'text'}, 'code': 'data/code'}"
            )
            raise ConfigError(msg)
        if isinstance(source, MixtureIndex) and where is not None:
            msg = "where= with a mixture's index: give each source its where in the dict of named sources"
            raise ConfigError(msg)
        return mixture_index(
            source,
            column=column,
            storage_options=storage_options,
            where=where,
            length_column=length_column,
            select=select if select is not None else (_selector if _selector is not None else None),
            text=text_source,
        )
    if weights is not None:
        msg = "weights= needs named sources: pass a dict such as {'web': 'data/web', 'code': 'data/code'}"
        raise ConfigError(msg)
    if isinstance(source, Index):
        if text is not None:
            msg = "tokenizer= needs the text source, not an Index; pass the path (or a plitzer.text.text_index)"
            raise ConfigError(msg)
        ix = ensure_index(source, column=column)
    else:
        paths = _paths(source)
        if text is not None:  # text in (plitzer.text): tokenized as read, counted once
            if where is not None:
                msg = "where= with tokenizer=: tokenize first (plitzer tokenize SRC DST), then select on the tokens"
                raise ConfigError(msg)
            return text(paths)
        ix = ensure_index(paths, column=column, storage_options=storage_options)
    if where is None:
        return ix
    spec = SourceSpec(name="", path=ix.source, column=ix.column, where=where, length_column=length_column)
    return (select or _default_selector())(ix, spec)


def make_plan(
    index: RowGroupIndex,
    settings: PlanSettings,
    *,
    weights: Weights = None,
    seq_len: int | None = None,
    layout: Layout | None = None,
) -> Plan:
    """The plan of ``index``: a mixture's (weights in stages) or one source's.

    ``layout``: layout stages (:mod:`planner.layout`), which place a weight stage's
    step in the run's tokens; by default one stage of ``settings.lanes`` and ``seq_len``.
    """
    if layout is None and seq_len is not None:
        layout = Layout.of(lanes=settings.lanes, seq_len=seq_len)
    if isinstance(index, MixtureIndex):
        stages = parse_stages(weights, index.names, [ix.tokens for ix in index.parts])
        out: Plan = MixturePlan(index, settings, stages, seq_len=seq_len, layout=layout)
    else:
        out = Plan(index, settings)
    out.layout = layout
    return out


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
    seq_len: Any = None,
    where: str | None = None,
    length_column: str | None = None,
) -> Plan:
    """The plan of ``source`` (a path, URL, list, an :class:`~planner.dataset.Index`, or a dict of named sources).

    A dict of named sources is a mixture (:mod:`planner.mixture`): ``weights`` are its
    shares of tokens, a dict or stages ``[(step, dict), ...]`` (stages need ``seq_len``
    to place their steps); without weights each source weighs its tokens.

    ``where`` (a DuckDB predicate over the dataset's columns, SPEC section 10) plans
    the rows it keeps; the selection pass that counts them is the runtime's (import
    plitzer), and ``length_column`` names a column that holds each row's token count.

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
    layout = None
    if seq_len is None and isinstance(lanes, (list, tuple)):
        msg = "lanes in stages start at global steps: give seq_len= too, to place them (tokens per step)"
        raise ConfigError(msg)
    if seq_len is not None:
        layout = Layout.of(lanes=lanes, seq_len=seq_len)
        lanes, seq_len = layout.first.lanes, layout.first.seq_len
        for st in layout.stages[1:]:
            if isinstance(world, int) and world > 0 and st.lanes % world:
                msg = (
                    f"lanes={st.lanes} (the layout stage from step {st.start}) is not divisible by world={world}; "
                    f"every rank must own the same number of lanes in every stage: use lanes a multiple of {world}"
                )
                raise ConfigError(msg)
    settings = PlanSettings(seed=seed, lanes=lanes, window=window, world=world)
    ix = open_index(
        source,
        column=column,
        storage_options=storage_options,
        weights=weights,
        where=where,
        length_column=length_column,
    )
    return make_plan(ix, settings, weights=weights, seq_len=seq_len, layout=layout)
