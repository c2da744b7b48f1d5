"""The run's parameters, defined once: name, default, documentation and command-line help.

Every entry point that takes a run's settings (``plitzer.Loader``,
``plitzer.torch.Dataset``, ``plitzer.grain.Dataset``, ``plitzer.explain``,
``plitzer.locate``, :func:`planner.plan` and the CLI) documents and accepts the
parameters of :data:`PARAMETERS`: its docstring's parameter section is rendered
from here (:func:`document`), ``plitzer.state.settings.Keywords`` lists the same names
(a test checks both), and the CLI's options take their help text from here. A
parameter added here reaches every one of them; one missing anywhere fails
``tests/planning/test_settings_parameters.py``. The planner's own (:data:`PLAN_PARAMETERS`) are
those :func:`planner.plan` takes, which decide the plan tables. A leaf: it imports nothing of planner.

>>> print(render(["seed"]))
seed : int, default 0
    Seed of the order: the same seed, data and settings give the same batches on
    every machine (SPEC section 3).
"""

from __future__ import annotations

import inspect
import os
import textwrap
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, TypeVar

__all__ = [
    "DEFAULT_TEXT",
    "FileFormat",
    "MARKER",
    "PARAMETERS",
    "PLAN_PARAMETERS",
    "POSITIONAL",
    "Parameter",
    "Selection",
    "TextSettings",
    "by_name",
    "check_keywords",
    "document",
    "keywords_of",
    "names_of",
    "render",
    "take",
    "unknown_keyword",
]

from planner.keywords import check_keywords, unknown_keyword

F = TypeVar("F", bound=Callable[..., Any])

MARKER = "<settings>"
"""The line of a docstring that :func:`document` replaces with the rendered parameters."""

SOURCE_MARKER = "<source>"
"""A docstring's optional line that :func:`document` replaces with :data:`SOURCE_ENTRY`."""

SOURCE_ENTRY = """source : str, PathLike, list, dict of named sources, or planner.Index
    As for :class:`plitzer.Loader` (a dict of named sources is a mixture)."""
"""The ``source`` entry of the runtime's entry points that take a loader's source."""


@dataclass(frozen=True, slots=True)
class Parameter:
    """One setting of a run.

    ``kind`` is its type as the docs show it, ``doc`` its documentation (the body of
    a NumPy-style parameter entry), ``help`` the CLI's one-line help (None: not a
    command-line option).
    """

    name: str
    default: Any
    kind: str
    doc: str
    help: str | None = None
    shown: str | None = None  # the default as the docs write it, where repr() would not read well
    positional: bool = False  # plitzer.Loader also takes it by position, after the source (SPEC section 5)
    plan: bool = False  # planner.plan takes it: it decides the plan tables
    option: str | None = None  # its command-line option where not the name's (--format: a table's output)

    @property
    def flag(self) -> str:
        """The command-line option: ``--seq-len`` for ``seq_len``."""
        return self.option or "--" + self.name.replace("_", "-")

    def render(self, default: Any = ...) -> str:
        """This parameter as a NumPy-style docstring entry (``default``: the entry point's, where it differs)."""
        if default is ...:
            default = self.default
        shown = self.shown if default == self.default and self.shown else None if default is None else repr(default)
        kind = self.kind if shown is not None or "optional" in self.kind else f"{self.kind}, optional"
        default = "" if shown is None else f", default {shown}"
        body = textwrap.fill(" ".join(self.doc.split()), width=84, initial_indent="    ", subsequent_indent="    ")
        return f"{self.name} : {kind}{default}\n{body}"


_FORMAT_DOC = '``"numpy"``: OLMo numpy token files (give ``eos_id``, ``dtype``); default: found from the files.'
_FORMAT_HELP = "numpy: OLMo numpy token files (with --eos-id, --dtype); default: found from the files"
_EOS_DOC = 'With ``format="numpy"``: the token id that ends each document (SPEC section 21).'
_EOS_HELP = "with --data-format numpy: the token id that ends each document"
_DTYPE_DOC = 'With ``format="numpy"``: the files\' token dtype, ``uint8``, ``uint16``, ``uint32`` or ``uint64``.'
_DTYPE_HELP = "with --data-format numpy: the files' token dtype (uint8, uint16, uint32, uint64)"
_CUT_DOC = (
    "Megatron and numpy sources: a row group is a run of whole documents ending at the first document end at or "
    "after this many tokens (an int >= 1; default 2**20 = 1,048,576). Parquet and Arrow IPC row groups are the "
    "files' own: giving it for them is a ConfigError."
)
_CUT_HELP = "Megatron, numpy: a row group ends at the first document end at or after this many tokens (default 2**20)"

PARAMETERS: tuple[Parameter, ...] = (
    Parameter(
        "seed",
        0,
        "int",
        "Seed of the order: the same seed, data and settings give the same batches on every machine (SPEC section 3).",
        "seed of the order",
        positional=True,
        plan=True,
    ),
    Parameter(
        "lanes",
        512,
        "int or layout stages",
        "Sequences per global batch (B); must be divisible by ``world``. Or layout stages "
        '``[(global step, lanes), ...]`` from step 0 (SPEC section 12, docs/design.md "Layout stages"; '
        "``set_layout`` adds one live).",
        "sequences per global batch (B), or layout stages STEP:B,STEP:B,... (e.g. 0:512,90000:128)",
        positional=True,
        plan=True,
    ),
    Parameter(
        "window",
        64,
        "int",
        "Row groups shuffled together (W): a window's documents are cut into the lanes and shuffled "
        "within each lane's slice; the loader holds the window in use and the next.",
        "row groups shuffled together (W)",
        positional=True,
        plan=True,
    ),
    Parameter(
        "seq_len",
        2048,
        "int or layout stages",
        "Tokens per sequence (L). Or layout stages ``[(global step, seq_len), ...]`` from step 0, as for ``lanes``.",
        "tokens per sequence (L), or layout stages STEP:L,STEP:L,... (e.g. 0:2048,90000:8192)",
        positional=True,
        plan=True,
    ),
    Parameter(
        "budget",
        8 << 30,
        "int",
        "Bytes of decoded token data held (4 per token and 8 per document, prefetched and queued); "
        "one that cannot hold the windows a step can touch is a ConfigError naming the bytes needed "
        '(docs/design.md, "The budget").',
        "bytes of decoded tokens the loader may hold",
        "8 << 30",
        positional=True,
    ),
    Parameter(
        "rank",
        0,
        "int",
        "This process's rank, ``0 .. world - 1``: it owns lanes "
        "``[rank * lanes / world, (rank + 1) * lanes / world)``.",
        "this rank (with --world: only this rank's lanes)",
        positional=True,
    ),
    Parameter(
        "world",
        1,
        "int",
        "Number of ranks (GPUs); must divide ``lanes``. The global batch is the same at any world size.",
        "number of ranks (GPUs)",
        positional=True,
        plan=True,
    ),
    Parameter(
        "column",
        None,
        "str, optional",
        "Token column (default: the one integer-list column named ``input_ids``, ``tokens`` or "
        "``token_ids``, else the one integer-list column).",
        "token column (default: the one integer-list column named input_ids, tokens or token_ids, else the only "
        "integer-list column)",
        positional=True,
        plan=True,
    ),
    Parameter(
        "storage_options",
        None,
        "dict, optional",
        "S3 settings (``endpoint``, ``region``, ``key``, ``secret``); for ``gs://`` and ``az://``, "
        "keyword arguments of ``gcsfs.GCSFileSystem`` / ``adlfs.AzureBlobFileSystem`` (docs/storage.md).",
        positional=True,
        plan=True,
    ),
    Parameter(
        "weights",
        None,
        "dict or stages, optional",
        "A mixture's shares of tokens (the source is a dict of named sources): a dict, or stages "
        "``[(global step, dict), ...]`` from step 0; default: each source weighs its tokens (SPEC section 8).",
        plan=True,
    ),
    Parameter(
        "shuffle",
        True,
        "bool",
        "``False``: storage order (row groups in index order, slices unshuffled; windows, lanes, cuts, bins "
        'unchanged), for evaluation passes (SPEC section 17, docs/usage.md "Evaluation passes").',
        "false: storage order (row groups in index order, slices unshuffled), for evaluation passes",
        plan=True,
    ),
    Parameter(
        "epochs",
        None,
        "int, optional",
        "The run's epochs (SPEC section 17): lanes end there, padded (``pad_id``, ``batch.mask`` False); "
        "``len(loader)`` is its steps, iterating stops at its last (the next ``iter()`` starts again).",
        "the run's length in epochs (a finite run, padded at its end; default: no end)",
        plan=True,
    ),
    Parameter(
        "threads",
        None,
        "int, optional",
        "Reader and decoding threads (default: the number of CPUs; on S3 at least "
        '``storage_options["concurrency"]``, 16, since its threads mostly wait on GETs).',
    ),
    Parameter(
        "text_column",
        "text",
        "str",
        'With ``tokenizer``: the column of text that is tokenized as it is read (docs/design.md, "Text in").',
    ),
    Parameter(
        "tokenizer",
        None,
        "str, PathLike, tokenizers.Tokenizer or callable, optional",
        "Text in: a SentencePiece ``.model`` file, a ``tokenizers`` JSON file or ``tokenizers.Tokenizer``, "
        "or a callable from a list of strings to lists of ids (:func:`plitzer.text.source.load_tokenizer`). "
        "The batches are those of the same data tokenized first (``plitzer tokenize``).",
    ),
    Parameter("add_eos", True, "bool", "With ``tokenizer``: end each document with the tokenizer's EOS id."),
    Parameter("add_bos", False, "bool", "With ``tokenizer``: start each document with the tokenizer's BOS id."),
    Parameter(
        "where",
        None,
        "str, optional",
        'Selection (docs/usage.md, "Selecting rows"): a DuckDB SQL boolean expression over the '
        "dataset's columns; the stream holds only the rows for which it is true, every row group "
        "keeping its place (SPEC section 10). A mixture's sources may each have their own "
        '(``{"web": {"path": ..., "where": ...}}``).',
        "only the rows for which this DuckDB SQL condition over the dataset's columns is true, "
        "e.g. \"int_score >= 3 and language = 'en'\"",
        plan=True,
    ),
    Parameter(
        "length_column",
        None,
        "str, optional",
        "With ``where``, ``dedupe`` or ``exclude``: an integer column holding each row's token count, so "
        "the selection passes need not decode the tokens (checked against the footer's count).",
        "with --where, --dedupe or --exclude: an integer column holding each row's token count (the "
        "selection passes then do not decode the tokens)",
        plan=True,
    ),
    Parameter(
        "dedupe",
        None,
        "str, optional",
        'Deduplication (docs/usage.md, "Deduplication and exclusion"): ``"tokens"`` keeps a document '
        "only if no earlier one (in source order: a mixture's sources as given, files, row groups, "
        "rows) has the same token list; a column name, the same non-null value. A selection: every "
        "row group keeps its place (SPEC section 14).",
        "keep each document only if no earlier one has the same key: 'tokens' (equal token lists) "
        "or a column, e.g. url",
        plan=True,
    ),
    Parameter(
        "exclude",
        None,
        "str or PathLike, optional",
        "An exclusion table (Parquet or CSV, local or on any store) whose columns are dataset columns: "
        "a row whose values equal some row of it is dropped (a decontamination list of urls or ids; "
        "SPEC section 14).",
        "drop the rows this Parquet or CSV table lists (its columns are dataset columns, e.g. url)",
        plan=True,
    ),
    Parameter(
        "index",
        None,
        "str or PathLike, optional",
        "A job index (``plitzer index DATA --out PATH_OR_URL``): read that one object instead of every "
        "footer. The source is still listed once; a file added, removed or changed since the job index "
        'was written is a ``StaleIndexError`` naming it (docs/design.md, "One index per job").',
    ),
    Parameter(
        "columns",
        None,
        "list or dict, optional",
        "Aligned columns (SPEC section 13): list columns of one value per token (a loss mask, weights, "
        "labels), packed with exactly the tokens' cuts into ``batch.columns[name]``. A list of names "
        "(every source must have each), or a dict name -> fill value for the sources (and text sources) "
        'that lack it, e.g. ``{"loss_mask": 0}``. Part of the checkpoint\'s configuration.',
        "aligned per-token columns packed with the tokens, NAME,NAME or NAME=FILL,... (e.g. loss_mask=0)",
        plan=True,
    ),
    Parameter(
        "labels",
        False,
        "bool",
        'Give ``batch.labels`` (docs/usage.md, "Labels"; SPEC section 16): ``(lanes / world, seq_len)`` int64, '
        "each token's next token in its own source document, -100 (PyTorch's ``ignore_index``) at a "
        "document's last token and on padding, right across row ends, lane cuts and best-fit's splits. Part "
        "of the batch, not of the configuration: no token, order or checkpoint changes.",
    ),
    Parameter(
        "balance",
        False,
        "bool",
        "Deal each step's rows to the data-parallel ranks by attention cost (docs/usage.md, \"Balanced steps and "
        "model-parallel groups\"; SPEC section 18): a row's cost is the sum of its segments' squared lengths, the "
        "costliest row goes to the least-loaded rank with room. The global batch is unchanged; ``batch.lanes`` "
        "names each row's lane and ``batch.cost`` the rank's cost a microbatch. At world > 1 it needs a group "
        "(``Loader.in_group``, ``plitzer.torch.Dataset(group=)``). Not configuration: no checkpoint byte changes.",
    ),
    Parameter(
        "microbatches",
        1,
        "int",
        "With ``balance=True``: the microbatches a rank's rows are dealt into by cost, the same way (SPEC section "
        "18); must divide ``lanes / world`` in every layout stage. ``batch.cost`` has one entry a microbatch.",
    ),
    Parameter(
        "packing",
        "concat",
        "str",
        'The packing rule (docs/usage.md, "Whole documents"): ``"concat"`` runs documents on from row to '
        'row, no padding (SPEC sections 3-4); ``"best-fit"`` keeps every document of at most ``seq_len`` '
        "tokens whole in one row, best-fit decreasing within each row group, rows padded with ``pad_id`` and "
        "``batch.mask`` False on the padding (SPEC section 15). Part of the checkpoint's configuration.",
        "packing rule: concat (documents run on, no padding) or best-fit (each document whole in one row, padded)",
        plan=True,
    ),
    Parameter(
        "pad_id",
        0,
        "int",
        'With ``packing="best-fit"`` or ``epochs``: the token id that fills a row after its bin\'s documents '
        "or the run's end (``batch.mask`` is False there). Part of the checkpoint's configuration there.",
        "with --packing best-fit or --epochs: the token id of the padding",
        plan=True,
    ),
    # SPEC section 21: a source's format where its files cannot say it (FileFormat)
    Parameter("format", None, "str, optional", _FORMAT_DOC, _FORMAT_HELP, plan=True, option="--data-format"),
    Parameter("eos_id", None, "int, optional", _EOS_DOC, _EOS_HELP, plan=True),
    Parameter("dtype", None, "str, optional", _DTYPE_DOC, _DTYPE_HELP, plan=True),
    Parameter("row_group_tokens", None, "int, optional", _CUT_DOC, _CUT_HELP, plan=True),
)
"""Every setting of a run, in the order of ``plitzer.Loader``'s signature."""

POSITIONAL: tuple[str, ...] = tuple(p.name for p in PARAMETERS if p.positional)
"""The settings ``plitzer.Loader`` also takes by position, after the source (SPEC section 5)."""

PLAN_PARAMETERS: tuple[str, ...] = tuple(p.name for p in PARAMETERS if p.plan)
"""The settings :func:`planner.plan` takes: those that decide the plan tables."""

_BY_NAME = {p.name: p for p in PARAMETERS}


def by_name(name: str) -> Parameter:
    """The parameter called ``name``."""
    return _BY_NAME[name]


def _default(name: str) -> Any:
    return _BY_NAME[name].default


@dataclass(frozen=True, slots=True)
class TextSettings:
    """Text in (SPEC section 9): the tokenizer, the text column and the BOS/EOS policy, as given.

    One value wherever a text source is opened, counted or checked (``plitzer.text``), the
    defaults those of :data:`PARAMETERS`. ``tokenizer`` None: the source is token data.
    """

    tokenizer: Any = None
    text_column: str = _default("text_column")
    add_eos: bool = _default("add_eos")
    add_bos: bool = _default("add_bos")

    @classmethod
    def of(cls, given: Mapping[str, Any]) -> TextSettings:
        """The text settings among ``given`` (a run's keywords, a mixture source's dict); the rest default."""
        return cls(**{k: given[k] for k in names_of(cls) if k in given})


DEFAULT_TEXT = TextSettings()
"""The text settings' defaults, for the functions that take them one by one (``plitzer.text.source.text_index``)."""


@dataclass(frozen=True, slots=True, init=False)
class Selection:
    """Which documents are in the stream: a predicate (SPEC section 10), deduplication and exclusion (section 14).

    The defaults (None) select every row. ``exclude`` may be given as any path
    (``os.PathLike``); it is kept as a ``str``, what checkpoints and messages hold.
    """

    where: str | None
    length_column: str | None
    dedupe: str | None
    exclude: str | None

    def __init__(
        self,
        where: str | None = None,
        length_column: str | None = None,
        dedupe: str | None = None,
        exclude: str | os.PathLike[str] | None = None,
    ) -> None:
        object.__setattr__(self, "where", where)
        object.__setattr__(self, "length_column", length_column)
        object.__setattr__(self, "dedupe", dedupe)
        object.__setattr__(self, "exclude", None if exclude is None else os.fspath(exclude))


@dataclass(frozen=True, slots=True)
class FileFormat:
    """A source's format where its files cannot say it (SPEC section 21): ``"numpy"``, its EOS id and dtype, and
    the tokens of a row group where the kind cuts its own (Megatron, numpy; None: 2**20)."""

    format: str | None = None
    eos_id: int | None = None
    dtype: str | None = None
    row_group_tokens: int | None = None


def names_of(group: Any) -> tuple[str, ...]:
    """The field names of a group of settings (a dataclass: :class:`TextSettings`, :class:`Selection`, ...)."""
    return tuple(f.name for f in fields(group))


def take(group: Any, given: dict[str, Any]) -> dict[str, Any]:
    """The keywords of ``group``'s fields, removed from ``given`` (the rest stay for the next group)."""
    return {k: given.pop(k) for k in names_of(group) if k in given}


def keywords_of(value: Any) -> dict[str, Any]:
    """A group's fields as keywords, the values as they are (no copy, unlike ``dataclasses.asdict``)."""
    return {k: getattr(value, k) for k in names_of(value)}


def render(names: Iterable[str], defaults: Mapping[str, Any] | None = None) -> str:
    """The NumPy-style entries of the parameters ``names`` (in :data:`PARAMETERS` order).

    ``defaults``: an entry point's own defaults, where they differ from the parameters'.
    """
    wanted = set(names)
    given = defaults or {}
    return "\n".join(p.render(given.get(p.name, ...)) for p in PARAMETERS if p.name in wanted)


def document(names: Sequence[str] | None = None, *, exclude: Iterable[str] = (), doc: str = "") -> Callable[[F], F]:
    """Replace the :data:`MARKER` line of the decorated object's docstring with the parameters' entries.

    ``names``: the parameters (default: all of :data:`PARAMETERS`), less ``exclude`` (those the entry point documents
    itself); the entries take the marker line's indentation. A :data:`SOURCE_MARKER` line becomes :data:`SOURCE_ENTRY`,
    likewise indented. ``doc``: the docstring, where the def's own would pass 60 lines.
    """
    skip = set(exclude)
    chosen = [p.name for p in PARAMETERS if (names is None or p.name in names) and p.name not in skip]

    def wrap(obj: F) -> F:
        text = doc or obj.__doc__ or ""
        lines = text.splitlines()
        at = [i for i, line in enumerate(lines) if line.strip() == MARKER]
        if len(at) != 1:
            msg = f"{obj.__qualname__}'s docstring needs one {MARKER!r} line for its parameters, has {len(at)}"
            raise RuntimeError(msg)
        line = lines[at[0]]
        pad = line[: len(line) - len(line.lstrip())]
        lines = [textwrap.indent(SOURCE_ENTRY, pad) if x.strip() == SOURCE_MARKER else x for x in lines]
        try:
            own: Mapping[str, inspect.Parameter] = inspect.signature(obj).parameters
        except (TypeError, ValueError):
            own = {}
        defaults = {n: own[n].default for n in chosen if n in own and own[n].default is not inspect.Parameter.empty}
        block = textwrap.indent(render(chosen, defaults), pad)
        obj.__doc__ = "\n".join([*lines[: at[0]], block, *lines[at[0] + 1 :]]) + ("\n" if text.endswith("\n") else "")
        return obj

    return wrap
