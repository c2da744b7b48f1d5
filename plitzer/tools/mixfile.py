"""Mixture files: a mixture's sources and weights as TOML, for the command line.

One ``[sources.NAME]`` table per source, with ``path`` and optionally ``column``,
``storage_options`` and ``weight``; or ``[[stages]]`` tables, each with ``step`` and
``weights = {NAME = w, ...}``, instead of per-source weights::

    [sources.web]
    path = "s3://bucket/web"
    weight = 3

    [sources.code]
    path = "data/code"
    column = "input_ids"
    weight = 1

Top-level ``dedupe = "tokens"`` (or a column) and ``exclude = "decontam.parquet"`` apply to
the whole mixture (SPEC section 14: a document also in an earlier source, in the file's
order of sources, is dropped from the later one), and so do ``packing = "best-fit"`` and
``pad_id = 0`` (SPEC section 15); :func:`mixture_settings` reads them.

:func:`read_mixture` returns what ``plitzer.Loader(sources, weights=...)`` takes.
"""

from __future__ import annotations

from typing import Any

from planner.errors import ConfigError

__all__ = ["MIXTURE_SETTINGS", "mixture_columns", "mixture_settings", "read_mixture"]

MIXTURE_SETTINGS = ("dedupe", "exclude", "packing", "pad_id")
"""Top-level keys of a mixture file that are settings of the whole mixture."""
_INTS = ("pad_id",)  # those of them that are integers (the rest are strings)


def _load(path: str) -> dict[str, Any]:
    import tomllib

    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as e:
        msg = f"mixture file {path}: {e}; see `plitzer plan --help` for its format"
        raise ConfigError(" ".join(msg.split())) from e


def mixture_settings(path: str) -> dict[str, Any]:
    """The whole mixture's settings a mixture file gives (``dedupe``, ``exclude``, ``packing``, ``pad_id``), checked."""
    doc = _load(path)
    out = {}
    for k in MIXTURE_SETTINGS:
        if k in doc and k in _INTS:
            if isinstance(doc[k], bool) or not isinstance(doc[k], int):
                msg = f"mixture file {path}: {k} = {doc[k]!r} must be an integer (a token id)"
                raise ConfigError(msg)
            out[k] = doc[k]
        elif k in doc:
            if not isinstance(doc[k], str) or not doc[k]:
                msg = f"mixture file {path}: {k} = {doc[k]!r} must be a string (dedupe: 'tokens' or a column)"
                raise ConfigError(msg)
            out[k] = doc[k]
    return out


def read_mixture(path: str) -> tuple[dict[str, Any], Any]:
    """Sources and weights of a mixture file (TOML): one table per source.

    ``[sources.NAME]`` holds ``path`` and optionally ``column``, ``storage_options``,
    ``where`` and ``length_column`` (a selection, :mod:`plitzer.selection.select`) and ``weight``;
    weights in stages are ``[[stages]]`` tables with ``step`` and ``weights = {NAME = w,
    ...}`` instead. Without weights each source weighs its tokens.

        [sources.web]
        path = "data/web"
        weight = 3
        [sources.code]
        path = "data/code"
        column = "input_ids"
        weight = 1
    """
    doc = _load(path)
    unknown = set(doc) - {"sources", "stages", "columns", *MIXTURE_SETTINGS}
    sources = doc.get("sources")
    if unknown or not isinstance(sources, dict) or not sources:
        msg = f"mixture file {path}: needs [sources.NAME] tables (and optionally [[stages]]), found {sorted(doc)}"
        raise ConfigError(msg)
    out: dict[str, Any] = {}
    weights: dict[str, Any] = {}
    for name, table in sources.items():
        if not isinstance(table, dict):
            msg = f"mixture file {path}: sources.{name} must be a table with path = ..."
            raise ConfigError(msg)
        spec = dict(table)
        if "weight" in spec:
            weights[name] = spec.pop("weight")
        out[name] = spec
    stages = doc.get("stages")
    if stages is not None and weights:
        msg = f"mixture file {path}: give weights per source or [[stages]], not both"
        raise ConfigError(msg)
    if stages is not None:
        bad = [s for s in stages if not isinstance(s, dict) or set(s) != {"step", "weights"}]
        if bad:
            msg = f"mixture file {path}: each [[stages]] table has step = N and weights = {{NAME = w, ...}}"
            raise ConfigError(msg)
        return out, [(s["step"], s["weights"]) for s in stages]
    if weights and len(weights) != len(out):
        missing = sorted(set(out) - set(weights))
        msg = (
            f"mixture file {path}: no weight for source {missing[0]!r}; give every source a weight (0 to leave it out)"
        )
        raise ConfigError(msg)
    return out, (weights or None)


def mixture_columns(path: str) -> Any:
    """The aligned columns of a mixture file (SPEC section 13), None where it names none.

    ``columns = ["loss_mask", "weight"]`` (every source has them), or a table of fill values
    for the sources that lack them::

        [columns]
        loss_mask = 0
        weight = 0.0
    """
    import tomllib

    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as e:
        msg = f"mixture file {path}: {e}; see `plitzer plan --help` for its format"
        raise ConfigError(" ".join(msg.split())) from e
    got = doc.get("columns")
    if got is None:
        return None
    ok = (isinstance(got, list) and all(isinstance(n, str) for n in got)) or (
        isinstance(got, dict) and all(isinstance(v, (bool, int, float)) for v in got.values())
    )
    if not ok:
        msg = (
            f'mixture file {path}: columns must be a list of names (columns = ["loss_mask"]) or a table of '
            f"fill values ([columns] loss_mask = 0), not {got!r}"
        )
        raise ConfigError(msg)
    return got
