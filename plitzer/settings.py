"""One settings object for every entry point: Loader, torch.Dataset, explain, audit, the CLI.

Each entry point takes the same keywords (:class:`Keywords`), builds one
:class:`LoaderSettings` from them (every field checks itself and names the fix), and
opens its source and plan through :func:`open_source` and :func:`make_plan`, so a
keyword added here (a mixture's ``weights``, a text source's ``tokenizer``) reaches
all of them at once.

>>> s = LoaderSettings.of(lanes=8, window=2, seq_len=16)
>>> s.plan, s.lanes, s.seq_len
(PlanSettings(seed=0, lanes=8, window=2, world=1), 8, 16)
>>> LoaderSettings.of(seq_len=0)
Traceback (most recent call last):
...
planner.errors.ConfigError: seq_len=0 must be >= 1; seq_len is the tokens per sequence, e.g. 2048
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

from planner import api
from planner.api import Source, open_index
from planner.dataset import Index
from planner.errors import ConfigError
from planner.layout import Layout
from planner.plan import Plan, PlanSettings, check_int
from planner.rowgroups import RowGroupIndex
from planner.sources import SourceSpec, Weights

__all__ = ["Keywords", "LoaderSettings", "Source", "Stages", "default_threads", "make_plan", "open_source"]

Stages = Sequence[tuple[int, int]]
"""Layout stages of ``lanes`` or ``seq_len``: ``[(global step, value), ...]`` from step 0 (docs/design.md)."""


class Keywords(TypedDict, total=False):
    """The keywords every entry point takes (see :class:`plitzer.Loader` for each)."""

    seed: int
    lanes: int | Stages
    window: int
    seq_len: int | Stages
    budget: int
    rank: int
    world: int
    column: str | None
    storage_options: Mapping[str, Any] | None
    weights: Weights
    threads: int | None
    text_column: str
    tokenizer: Any
    add_eos: bool
    add_bos: bool
    where: str | None
    length_column: str | None
    index: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class LoaderSettings:
    """Every setting of a run: the plan's (seed, lanes, window, world) and the loader's."""

    plan: PlanSettings = field(default_factory=PlanSettings)
    seq_len: int = 2048
    budget: int = 8 << 30
    rank: int = 0
    threads: int | None = None
    column: str | None = None
    storage_options: Mapping[str, Any] | None = None
    weights: Weights = None
    text_column: str = "text"
    tokenizer: Any = None
    add_eos: bool = True
    add_bos: bool = False
    where: str | None = None
    length_column: str | None = None
    layout: Layout | None = None  # layout stages (planner.layout); None: one stage of plan.lanes and seq_len
    index: str | None = None
    """A job index (``plitzer index DATA --out PATH``) to read instead of the footers."""

    def __post_init__(self) -> None:
        check_int("seq_len", self.seq_len, 1, "seq_len is the tokens per sequence, e.g. 2048")
        if self.layout is None:
            object.__setattr__(self, "layout", Layout.of(lanes=self.plan.lanes, seq_len=self.seq_len))
        for st in self.stages.stages:
            if st.lanes % self.plan.world:
                msg = (
                    f"lanes={st.lanes} (the layout stage from step {st.start}) is not divisible by "
                    f"world={self.plan.world}; every rank must own the same number of lanes in every stage: "
                    f"use lanes a multiple of {self.plan.world}"
                )
                raise ConfigError(msg)
        check_int("budget", self.budget, 1, "budget is bytes of decoded tokens to hold, e.g. 8 << 30")
        check_int("rank", self.rank, 0, "rank is this process's index, 0..world-1")
        if self.rank >= self.plan.world:
            world = self.plan.world
            msg = f"rank={self.rank} is out of range for world={world}; use a rank in 0..{world - 1}"
            raise ConfigError(msg)
        if self.threads is not None:
            check_int("threads", self.threads, 1, "threads decode row groups in parallel")

    @classmethod
    def of(
        cls,
        *,
        seed: int = 0,
        lanes: int | Stages = 512,
        window: int = 64,
        world: int = 1,
        seq_len: int | Stages = 2048,
        budget: int = 8 << 30,
        rank: int = 0,
        column: str | None = None,
        storage_options: Mapping[str, Any] | None = None,
        weights: Weights = None,
        threads: int | None = None,
        text_column: str = "text",
        tokenizer: Any = None,
        add_eos: bool = True,
        add_bos: bool = False,
        where: str | None = None,
        length_column: str | None = None,
        index: str | None = None,
    ) -> LoaderSettings:
        """The settings of these keywords, each checked (``lanes`` and ``seq_len`` may be layout stages)."""
        layout = Layout.of(lanes=lanes, seq_len=seq_len)
        first = layout.first
        return cls(
            plan=PlanSettings(seed=seed, lanes=first.lanes, window=window, world=world),
            seq_len=first.seq_len,
            budget=budget,
            rank=rank,
            threads=threads,
            column=column,
            storage_options=storage_options,
            weights=weights,
            text_column=text_column,
            tokenizer=tokenizer,
            add_eos=add_eos,
            add_bos=add_bos,
            where=where,
            length_column=length_column,
            layout=layout,
            index=None if index is None else os.fspath(index),
        )

    @property
    def stages(self) -> Layout:
        """The layout stages (one when ``lanes`` and ``seq_len`` are ints)."""
        assert self.layout is not None  # set in __post_init__
        return self.layout

    @property
    def seed(self) -> int:
        return self.plan.seed

    @property
    def lanes(self) -> int:
        return self.plan.lanes

    @property
    def window(self) -> int:
        return self.plan.window

    @property
    def world(self) -> int:
        return self.plan.world


def open_source(source: Source, settings: LoaderSettings) -> RowGroupIndex:
    """The index of ``source``: token data, text (with a tokenizer), or a mixture (a dict).

    The dispatch and its messages are :func:`planner.api.open_index`'s; this adds
    the text step (``plitzer.text``) when a tokenizer is set, and the selection pass
    (``plitzer.select``, this rank's share of it) where a source has ``where``.
    """
    s = settings
    text = None
    if s.tokenizer is not None:
        from plitzer.text import text_index

        text = functools.partial(
            text_index,
            tokenizer=s.tokenizer,
            text_column=s.text_column,
            add_eos=s.add_eos,
            add_bos=s.add_bos,
            storage_options=s.storage_options,
        )
    from plitzer.select import select_index

    if s.index is not None:
        source = _job_index(source, s)

    def select(ix: Index, spec: SourceSpec) -> Index:
        assert spec.where is not None
        return select_index(
            ix, spec.where, length_column=spec.length_column, rank=s.rank, world=s.world, threads=s.threads
        )

    return open_index(
        source,
        column=s.column,
        storage_options=s.storage_options,
        weights=s.weights,
        text=text,
        where=s.where,
        length_column=s.length_column,
        select=select,
        text_source=_text_source,
    )


def _job_index(source: Source, s: LoaderSettings) -> Index:
    """The index of ``source`` from the job index ``s.index`` (one listing, one read, no footer)."""
    from planner.jobindex import load

    assert s.index is not None
    if isinstance(source, Mapping) or not isinstance(source, (str, os.PathLike, list, tuple)):
        msg = (
            f"index={s.index!r} needs one source (a path, URL or list of them), not {type(source).__name__}; "
            "a mixture's sources are indexed one by one"
        )
        raise ConfigError(msg)
    if s.tokenizer is not None:
        msg = f"index={s.index!r} with tokenizer=: a text source is counted by tokenizing; leave index= out"
        raise ConfigError(msg)
    return load(s.index, source, column=s.column, storage_options=s.storage_options)


def _text_source(spec: SourceSpec) -> Index:
    """A mixture's text source, counted with its own tokenizer (``plitzer.text``)."""
    from plitzer.text import text_index

    t = dict(spec.text or {})
    return text_index(
        spec.path,
        tokenizer=t["tokenizer"],
        text_column=t.get("text_column", "text"),
        add_eos=t.get("add_eos", True),
        add_bos=t.get("add_bos", False),
        storage_options=spec.storage_options,
    )


def make_plan(index: RowGroupIndex, settings: LoaderSettings) -> Plan:
    """The plan the loader runs from (and that ``plan.sql`` shows) for these settings."""
    return api.make_plan(
        index, settings.plan, weights=settings.weights, seq_len=settings.seq_len, layout=settings.stages
    )


def default_threads(index: RowGroupIndex) -> int:
    """The CPUs, or more where the storage asks for it (S3: threads mostly wait on GETs)."""
    want = {index.storage(i).concurrency for i in range(len(index.files))}
    return max(os.cpu_count() or 2, *want)
