"""plitzer's settings as one dataclass, which each trainer adapter's config class inherits.

Generated from planner.parameters.PARAMETERS by ``python -m plitzer.integrations.shared``
(tests/integrations/test_integrations.py checks it is current): the data (``source`` or ``mixture``),
``replicas``, and every parameter but those a trainer decides (lanes, seq_len, rank, world)
and labels, which the adapters always ask for. Do not edit by hand.
"""

from dataclasses import dataclass

__all__ = ["BaseSettings", "Settings"]


@dataclass(kw_only=True)
class BaseSettings:
    """plitzer's settings in a trainer's config but a text source's ``tokenizer``: the data, then one field a
    parameter (docs/api.md). torchtitan's config inherits this one: it passes its own ``tokenizer`` to every data
    loader's ``build`` and refuses a config field of that name, so plitzer's is ``text_tokenizer`` there."""

    source: str = ""
    """The data: a folder, file or URL; several separated by commas."""

    mixture: str | None = None
    """A mixture file (TOML: sources, weights, settings), in place of source."""

    replicas: bool = False
    """One read a model-parallel group: its lowest rank reads and sends each step (SPEC section 19)."""

    steer: int = 0
    """Steer the mixture every this many global steps from the trainer's per-source loss (plitzer.mixing.Online,
    SPEC section 20; docs/steering.md); 0: off. A mixture, where the trainer gives per-token losses.
    """

    steer_rule: str = "exp3"
    """The steering rule: exp3 (Online Data Mixing, Albalak et al. 2023)."""

    seed: int = 0
    """Seed of the order: the same seed, data and settings give the same batches on every machine (SPEC section
    3).
    """

    window: int = 64
    """Row groups shuffled together (W): a window's documents are cut into the lanes and shuffled within each
    lane's slice; the loader holds the window in use and the next.
    """

    budget: int = 8589934592
    """Bytes of decoded token data held (4 per token and 8 per document, prefetched and queued); one that cannot
    hold the windows a step can touch is a ConfigError naming the bytes needed (docs/design.md, "The budget").
    """

    column: str | None = None
    """Token column (default: the one integer-list column named ``input_ids``, ``tokens`` or ``token_ids``, else
    the one integer-list column).
    """

    storage_options: dict[str, str | int | float | bool] | None = None
    """S3 settings (``endpoint``, ``region``, ``key``, ``secret``); for ``gs://`` and ``az://``, keyword
    arguments of ``gcsfs.GCSFileSystem`` / ``adlfs.AzureBlobFileSystem`` (docs/storage.md).
    """

    weights: dict[str, float] | None = None
    """A mixture's shares of tokens (the source is a dict of named sources): a dict, or stages ``[(global step,
    dict), ...]`` from step 0; default: each source weighs its tokens (SPEC section 8).
    """

    shuffle: bool = True
    """``False``: storage order (row groups in index order, slices unshuffled; windows, lanes, cuts, bins
    unchanged), for evaluation passes (SPEC section 17, docs/usage.md "Evaluation passes").
    """

    epochs: int | None = None
    """The run's epochs (SPEC section 17): lanes end there, padded (``pad_id``, ``batch.mask`` False);
    ``len(loader)`` is its steps, iterating stops at its last (the next ``iter()`` starts again).
    """

    threads: int | None = None
    """Reader and decoding threads (default: the number of CPUs; on S3 at least
    ``storage_options["concurrency"]``, 16, since its threads mostly wait on GETs).
    """

    text_column: str = "text"
    """With ``tokenizer``: the column of text that is tokenized as it is read (docs/design.md, "Text in")."""

    add_eos: bool = True
    """With ``tokenizer``: end each document with the tokenizer's EOS id."""

    add_bos: bool = False
    """With ``tokenizer``: start each document with the tokenizer's BOS id."""

    where: str | None = None
    """Selection (docs/usage.md, "Selecting rows"): a DuckDB SQL boolean expression over the dataset's columns;
    the stream holds only the rows for which it is true, every row group keeping its place (SPEC section 10).
    """

    length_column: str | None = None
    """With ``where``, ``dedupe`` or ``exclude``: an integer column holding each row's token count, so the
    selection passes need not decode the tokens (checked against the footer's count).
    """

    dedupe: str | None = None
    """Deduplication (docs/usage.md, "Deduplication and exclusion"): ``"tokens"`` keeps a document only if no
    earlier one (in source order: a mixture's sources as given, files, row groups, rows) has the same token
    list; a column name, the same non-null value.
    """

    exclude: str | None = None
    """An exclusion table (Parquet or CSV, local or on any store) whose columns are dataset columns: a row whose
    values equal some row of it is dropped (a decontamination list of urls or ids; SPEC section 14).
    """

    index: str | None = None
    """A job index (``plitzer index DATA --out PATH_OR_URL``): read that one object instead of every footer."""

    columns: list[str] | dict[str, bool | int | float] | None = None
    """Aligned columns (SPEC section 13): list columns of one value per token (a loss mask, weights, labels),
    packed with exactly the tokens' cuts into ``batch.columns[name]``.
    """

    balance: bool = False
    """Deal each step's rows to the data-parallel ranks by attention cost (docs/usage.md, "Balanced steps and
    model-parallel groups"; SPEC section 18): a row's cost is the sum of its segments' squared lengths, the
    costliest row goes to the least-loaded rank with room.
    """

    microbatches: int = 1
    """With ``balance=True``: the microbatches a rank's rows are dealt into by cost, the same way (SPEC section
    18); must divide ``lanes / world`` in every layout stage.
    """

    packing: str = "concat"
    """The packing rule (docs/usage.md, "Whole documents"): ``"concat"`` runs documents on from row to row, no
    padding (SPEC sections 3-4); ``"best-fit"`` keeps every document of at most ``seq_len`` tokens whole in
    one row, best-fit decreasing within each row group, rows padded with ``pad_id`` and ``batch.mask`` False
    on the padding (SPEC section 15).
    """

    pad_id: int = 0
    """With ``packing="best-fit"`` or ``epochs``: the token id that fills a row after its bin's documents or the
    run's end (``batch.mask`` is False there).
    """

    format: str | None = None
    """``"numpy"``: OLMo numpy token files (give ``eos_id``, ``dtype``); default: found from the files."""

    eos_id: int | None = None
    """With ``format="numpy"``: the token id that ends each document (SPEC section 21)."""

    dtype: str | None = None
    """With ``format="numpy"``: the files' token dtype, ``uint8``, ``uint16``, ``uint32`` or ``uint64``."""

    row_group_tokens: int | None = None
    """Megatron and numpy sources: a row group is a run of whole documents ending at the first document end at or
    after this many tokens (an int >= 1; default 2**20 = 1,048,576).
    """


@dataclass(kw_only=True)
class Settings(BaseSettings):
    """plitzer's settings in a trainer's config: :class:`BaseSettings` and a text source's ``tokenizer``."""

    tokenizer: str | None = None
    """Text in: a SentencePiece ``.model`` file, a ``tokenizers`` JSON file or ``tokenizers.Tokenizer``, or a
    callable from a list of strings to lists of ids (:func:`plitzer.text.source.load_tokenizer`).
    """
