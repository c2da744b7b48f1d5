"""One settings object for every entry point: Loader, torch.Dataset, grain.Dataset, explain, locate, audit, the CLI.

The parameters are defined once, in :data:`planner.parameters.PARAMETERS` (name,
default, documentation, command-line help). Each entry point takes them as keywords
(:class:`Keywords`), builds one :class:`LoaderSettings` from them (:meth:`LoaderSettings.of`;
the runtime's checks are here, each naming the field and the fix), and opens its
source through :func:`plitzer.sources.index_of` and its plan through :func:`make_plan`, so a parameter
added there (a mixture's ``weights``, a text source's ``tokenizer``) reaches all of
them at once, documented (docs/design.md, "One definition of the parameters").

>>> s = LoaderSettings.of(lanes=8, window=2, seq_len=16)
>>> s.plan, s.lanes, s.seq_len
(PlanSettings(seed=0, lanes=8, window=2, world=1, traversal=Traversal(shuffle=True, epochs=None)), 8, 16)
>>> LoaderSettings.of(seq_len=0)
Traceback (most recent call last):
...
planner.errors.ConfigError: seq_len=0 must be >= 1; seq_len is the tokens per sequence, e.g. 2048
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypedDict, Unpack

import numpy as np

from planner import api
from planner.api import Source
from planner.balance import check_microbatches
from planner.catalog.rowgroups import RowGroupIndex
from planner.errors import ConfigError
from planner.mixing.sources import Weights
from planner.order.epoch import PlanSettings, Traversal, check_int
from planner.order.layout import Layout
from planner.order.plan import Plan
from planner.parameters import PARAMETERS, POSITIONAL, FileFormat, Selection, TextSettings, take, unknown_keyword
from planner.rules import CONCAT, TOKEN, Rule, check_packing, check_pad_id, rule_named
from planner.stores.storage import revisions
from plitzer.state.checkpoint import DATASET_FIELDS, SETTING_FIELDS

__all__ = [
    "Keywords",
    "KeywordsLessWhere",
    "KeywordsOfLocate",
    "LoaderSettings",
    "Source",
    "Stages",
    "bind",
    "checkpoint_config",
    "default_threads",
    "keywords",
    "make_plan",
    "signature",
]

Stages = Sequence[tuple[int, int]]
"""Layout stages of ``lanes`` or ``seq_len``: ``[(global step, value), ...]`` from step 0 (docs/design.md)."""


class KeywordsOfLocate(TypedDict, total=False):
    """:class:`Keywords` but ``where`` and ``epochs`` (``plitzer.locate``'s own name documents and epochs searched)."""

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
    shuffle: bool
    threads: int | None
    text_column: str
    tokenizer: Any
    add_eos: bool
    add_bos: bool
    length_column: str | None
    dedupe: str | None
    exclude: str | os.PathLike[str] | None
    index: str | None
    columns: Sequence[str] | Mapping[str, Any] | None
    labels: bool
    balance: bool
    microbatches: int
    packing: str
    pad_id: int
    format: str | None
    eos_id: int | None
    dtype: str | None
    row_group_tokens: int | None


class KeywordsLessWhere(KeywordsOfLocate, total=False):
    """:class:`Keywords` but ``where``."""

    epochs: int | None


class Keywords(KeywordsLessWhere, total=False):
    """The keywords every entry point takes: the names of :data:`planner.parameters.PARAMETERS`.

    Written out for type checkers (``**settings: Unpack[Keywords]``); the documentation and
    the defaults are the parameters' (a test checks that the two list the same names).
    """

    where: str | None


_NAMES = frozenset(p.name for p in PARAMETERS)


def keywords(given: Mapping[str, Any], caller: str, own: Sequence[str] = ()) -> dict[str, Any]:
    """Every parameter of :data:`~planner.parameters.PARAMETERS`: ``given``'s value, else its default.

    A name that is not a parameter is a TypeError, as Python's own for ``caller``, with the
    closest name among the parameters and ``caller``'s ``own`` keywords suggested
    (``Loader() got an unexpected keyword argument 'seqlen'; did you mean seq_len?``).
    """
    unknown = [k for k in given if k not in _NAMES]
    if unknown:
        raise unknown_keyword(caller, unknown[0], [*own, *(p.name for p in PARAMETERS)])
    return {p.name: given.get(p.name, p.default) for p in PARAMETERS}


def bind(
    caller: str, args: Sequence[Any], given: Mapping[str, Any], positional: Sequence[str] = POSITIONAL
) -> dict[str, Any]:
    """The keywords of a call that also takes the first ``positional`` parameters by position."""
    if len(args) > len(positional):
        msg = f"{caller}() takes at most {len(positional) + 1} positional arguments ({len(args) + 1} given)"
        raise TypeError(msg)
    out = dict(given)
    for name, value in zip(positional, args, strict=False):
        if name in out:
            msg = f"{caller}() got multiple values for argument {name!r}"
            raise TypeError(msg)
        out[name] = value
    return out


def signature(*, before: Sequence[str] = (), names: Sequence[str] | None = None) -> inspect.Signature:
    """The signature of an entry point that takes the parameters (``POSITIONAL`` ones by position too).

    ``before``: the names of its own leading arguments (``self``, ``source``), positional or keyword.
    """
    params = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in before]
    for p in PARAMETERS:
        if names is not None and p.name not in names:
            continue
        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD if p.name in POSITIONAL else inspect.Parameter.KEYWORD_ONLY
        params.append(inspect.Parameter(p.name, kind, default=p.default))
    return inspect.Signature(params)


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
    text: TextSettings = field(default_factory=TextSettings)
    selection: Selection = field(default_factory=Selection)
    layout: Layout | None = None  # layout stages (planner.order.layout); None: one stage of plan.lanes and seq_len
    index: str | None = None
    """A job index (``plitzer index DATA --out PATH``) to read instead of the footers."""
    columns: Sequence[str] | Mapping[str, Any] | None = None
    """Aligned columns (``plitzer.readpath.aligned``): names, or name -> fill value."""
    labels: bool = False
    """``batch.labels`` (``plitzer.readpath.labels``): part of the batch, not of the checkpoint's configuration."""
    balance: bool = False
    """Steps dealt by cost (SPEC section 18, ``plitzer.readpath.balance``): not configuration."""
    microbatches: int = 1
    """With ``balance``: the microbatches a rank's rows are dealt into (SPEC section 18)."""
    packing: str = CONCAT
    """The packing rule's name (:mod:`planner.rules`)."""
    pad_id: int = 0
    """The token of a best-fit row's padding."""
    file_format: FileFormat = field(default_factory=FileFormat)
    """The source's format where its files cannot say it (``format="numpy"``, ``eos_id``, ``dtype``: SPEC 21)."""

    def __post_init__(self) -> None:
        check_int("seq_len", self.seq_len, 1, "seq_len is the tokens per sequence, e.g. 2048")
        check_packing(self.packing)
        check_pad_id(self.pad_id)  # its sign here; its dtype's range when the data is open (make_plan)
        if self.layout is None:
            object.__setattr__(self, "layout", Layout.of(lanes=self.plan.lanes, seq_len=self.seq_len))
        api.check_layout(self.stages.stages, self.plan.world)
        check_int("budget", self.budget, 1, "budget is bytes of decoded tokens to hold, e.g. 8 << 30")
        check_int("rank", self.rank, 0, "rank is this process's index, 0..world-1")
        if self.rank >= self.plan.world:
            world = self.plan.world
            msg = f"rank={self.rank} is out of range for world={world}; use a rank in 0..{world - 1}"
            raise ConfigError(msg)
        if self.threads is not None:
            check_int("threads", self.threads, 1, "threads decode row groups in parallel")
        if not isinstance(self.labels, (bool, np.bool_)):
            msg = f"labels={self.labels!r} must be True or False (True: batch.labels, each token's next token)"
            raise ConfigError(msg)
        object.__setattr__(self, "labels", bool(self.labels))
        if not isinstance(self.balance, (bool, np.bool_)):
            msg = f"balance={self.balance!r} must be True or False (True: each step's rows dealt to ranks by cost)"
            raise ConfigError(msg)
        object.__setattr__(self, "balance", bool(self.balance))
        for stage in self.stages.stages:
            check_microbatches(self.microbatches, stage.lanes, self.plan.world, self.balance)
        if self.columns is not None:
            from plitzer.readpath.aligned import parse_columns

            parse_columns(self.columns)  # checked here: names and fills

    @classmethod
    def of(
        cls, *, caller: str = "LoaderSettings.of", own: Sequence[str] = (), **settings: Unpack[Keywords]
    ) -> LoaderSettings:
        """The settings of these keywords, each checked (``lanes`` and ``seq_len`` may be layout stages).

        Every keyword is one of :data:`planner.parameters.PARAMETERS`, with its default there;
        another is a TypeError naming ``caller`` (the entry point: ``Loader``,
        ``plitzer.torch.Dataset``, ...) and the closest of the parameters and its ``own`` keywords.
        """
        kw = keywords(settings, caller, own)
        layout = Layout.of(lanes=kw.pop("lanes"), seq_len=kw.pop("seq_len"))
        kw["index"] = None if kw["index"] is None else os.fspath(kw["index"])
        kw["columns"] = _columns(kw["columns"])
        return cls(
            plan=PlanSettings(
                lanes=layout.first.lanes, traversal=Traversal(**take(Traversal, kw)), **take(PlanSettings, kw)
            ),
            seq_len=layout.first.seq_len,
            text=TextSettings(**take(TextSettings, kw)),
            selection=Selection(**take(Selection, kw)),
            file_format=FileFormat(**take(FileFormat, kw)),
            layout=layout,
            **kw,  # the loader's own: budget, rank, threads and what is read
        )

    def without_dedupe(self) -> LoaderSettings:
        """These settings less deduplication and exclusion (what a job's shared pass starts from)."""
        return replace(self, selection=replace(self.selection, dedupe=None, exclude=None))

    @property
    def stages(self) -> Layout:
        """The layout stages (one when ``lanes`` and ``seq_len`` are ints)."""
        assert self.layout is not None  # set in __post_init__
        return self.layout

    @property
    def rule(self) -> Rule:
        """The packing rule (:mod:`planner.rules`)."""
        return rule_named(self.packing)

    @property
    def units_per_row(self) -> int:
        """The rule's units a lane's row of the first layout stage consumes: ``seq_len`` tokens, or one bin."""
        return self.rule.units_per_row(self.seq_len)

    @property
    def unit_layout(self) -> Layout:
        """The layout stages in the rule's units: what the plan and the run count steps in.

        Under concat a row is ``seq_len`` tokens; under best-fit one bin, whatever ``seq_len``
        (a change of ``seq_len`` would bin the rest again: refused, docs/design.md).
        """
        return self.stages.in_units(self.rule.units_per_row)

    def with_unit_layout(self, units: Layout) -> LoaderSettings:
        """These settings under the run's layout ``units`` (in the rule's units): rows back in tokens."""
        return replace(self, layout=units if self.rule.unit == TOKEN else units.in_tokens(self.seq_len))

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


def make_plan(index: RowGroupIndex, settings: LoaderSettings) -> Plan:
    """The plan the loader runs from (and that ``plan.sql`` shows) for these settings."""
    rule, layout = settings.rule, settings.unit_layout
    check_pad_id(settings.pad_id, index.dtype, index.column, index.source)  # before any pass: the batches hold it
    if settings.columns is not None:  # checked against every source, as the loader checks them
        from plitzer.readpath.aligned import resolve

        resolve(index, settings.columns)
    if rule.needs_counts:  # best-fit: the plan cuts bins, counted by the bins pass at seq_len (plitzer.bestfit)
        from plitzer.bestfit.counts import BinSpec, bin_index

        spec = BinSpec(settings.seq_len, rule.name, settings.selection.length_column)
        index = bin_index(index, spec, threads=settings.threads, split=(settings.rank, settings.world))
    per_row = settings.units_per_row
    packing = (rule.name, int(settings.pad_id), settings.seq_len)
    p = api.make_plan(index, settings.plan, weights=settings.weights, seq_len=per_row, layout=layout, packing=packing)
    p.columns = api.columns_of(settings.columns)
    return p


def checkpoint_config(plan: Plan, settings: LoaderSettings) -> dict[str, Any]:
    """The configuration a checkpoint records (SPEC section 7), assembled here and nowhere else.

    The settings that fix the order (seed, lanes, seq_len, window, the layout stages), the
    index's column, dtype and fingerprint, the fields its kind adds
    (:meth:`~planner.catalog.rowgroups.RowGroupIndex.config_fields`: a selection's predicate, a
    text index's tokenizer, a mixture's sources; the defaults where it adds none), the
    plan's weight stages, and the Hub revisions of its files.
    """
    from plitzer.selection.select import SELECT_DEFAULTS
    from plitzer.text.source import TEXT_DEFAULTS

    s, ix = settings, plan.dataset
    return {
        **{k: getattr(s, k) for k in SETTING_FIELDS},
        **({"layout": s.stages.as_config()} if s.stages.staged else {}),
        **{k: getattr(ix, k) for k in DATASET_FIELDS},
        **TEXT_DEFAULTS,
        **SELECT_DEFAULTS,
        **ix.config_fields(),
        **plan.stage_config(),
        "revisions": revisions((ix.storage(f), ix.file(f)) for f in range(len(ix.files))),
        **({"columns": _columns_config(s.columns)} if s.columns else {}),
        # Under concat, absent: its checkpoints stay byte-identical to those before rules existed.
        **({"packing": s.packing, "pad_id": int(s.pad_id)} if s.rule.name != CONCAT else {}),
        # Storage order and a finite run (SPEC section 17; a finite run pads its end with pad_id), only where set.
        **({"shuffle": False} if not s.plan.shuffle else {}),
        **({"epochs": s.plan.epochs, "pad_id": int(s.pad_id)} if s.plan.epochs is not None else {}),
    }


def _columns(value: Any) -> Any:
    """``columns=`` kept as given (a tuple for a list: settings are frozen); None for none."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        return dict(value) or None
    if isinstance(value, str):
        return value or None
    if isinstance(value, Sequence):
        return tuple(value) or None
    return value  # refused by LoaderSettings' check, naming it


def _columns_config(value: Any) -> list[list[Any]]:
    from plitzer.readpath.aligned import columns_config

    return columns_config(value)


def default_threads(index: RowGroupIndex) -> int:
    """The CPUs, or more where the storage asks for it (S3: threads mostly wait on GETs)."""
    want = {index.storage(i).concurrency for i in range(len(index.files))}
    return max(os.cpu_count() or 2, *want)
