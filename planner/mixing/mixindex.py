"""A mixture's index: its named sources' indexes side by side, one frame and one run of files.

A mixture is a few named sources, each a dataset as :func:`planner.index` takes it
(with its own column, storage options and selection). :func:`mixture_index` indexes
each (footers only, cached) and :class:`MixtureIndex` puts them side by side: row-group
ids and file numbers run over all sources, and every lookup by file or row group is
routed to the source that holds it. It is a :class:`planner.catalog.rowgroups.RowGroupIndex`
like one source's; :mod:`planner.mixing.mixture` plans it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import polars as pl
import pyarrow.parquet as pq
from numpy.typing import NDArray

from planner.catalog import jobindex
from planner.catalog.column import TokenDtype
from planner.catalog.dataset import ensure_index
from planner.catalog.datasetindex import Index
from planner.catalog.rowgroups import Capabilities, FrameTotals, with_selected
from planner.errors import ConfigError
from planner.mixing.sources import Opening, SourceSpec, source_specs
from planner.parameters import Selection
from planner.stores.storage import FileStat, Storage

__all__ = ["MIXTURE", "MixtureIndex", "is_mixture", "mixture_index"]

MIXTURE = Capabilities("mixture", selectable=False, other_columns=True, column_runs=False)
"""A mixture's: a pass that reads data asks each of its sources (``parts``)."""


def is_mixture(source: object) -> bool:
    """A dict of named sources (or an index built from one)."""
    return isinstance(source, (Mapping, MixtureIndex))


class MixtureIndex(FrameTotals):
    """The sources' indexes side by side: one frame, one run of files.

    ``frame`` is the sources' frames one after the other (sources in name order),
    with ``source`` and ``source_index`` columns and ``file_index`` numbered over
    all files; row-group ids (rows of the frame) are global. :meth:`part` maps a
    global row group to its source's index and row.
    """

    def __init__(self, specs: Sequence[SourceSpec], parts: Sequence[Index], given: Sequence[str] | None = None) -> None:
        self.specs = list(specs)
        self.parts = list(parts)
        self.names = [s.name for s in specs]
        self.given = [n for n in (given or ()) if n in self.names] or list(self.names)
        """The sources in the order the user gave them (the dict's): deduplication's source order."""
        dtypes = {ix.dtype for ix in parts}
        if len(dtypes) > 1:
            each = ", ".join(f"{n}: {ix.dtype}" for n, ix in zip(self.names, parts, strict=True))
            msg = (
                f"sources deliver different token dtypes ({each}); a batch has one dtype: use sources whose "
                "columns all fit int32, or all need uint32"
            )
            raise ConfigError(msg)
        for n, ix in zip(self.names, parts, strict=True):
            if ix.tokens == 0:
                msg = f"source {n!r} ({ix.source}) has no tokens; remove it from the mixture"
                raise ConfigError(msg)
        self.dtype: TokenDtype = parts[0].dtype
        files = np.array([len(ix.files) for ix in parts], dtype=np.int64)
        rgs = np.array([ix.row_groups for ix in parts], dtype=np.int64)
        self._file_base = np.concatenate([[0], np.cumsum(files)])
        self.rg_base = np.concatenate([[0], np.cumsum(rgs)])  # each source's first row group, and the end
        frames = []
        selected = any("tokens_selected" in ix.frame.columns for ix in parts)
        for i, (n, ix) in enumerate(zip(self.names, parts, strict=True)):
            frames.append(
                (with_selected(ix.frame) if selected else ix.frame).with_columns(
                    (pl.col("file_index") + int(self._file_base[i])).alias("file_index"),
                    pl.lit(n).alias("source"),
                    pl.lit(i, pl.Int64).alias("source_index"),
                    pl.int_range(pl.len(), dtype=pl.Int64).alias("source_row_group"),
                )
            )
        self.frame = pl.concat(frames, how="vertical_relaxed")
        self.column = ",".join(f"{n}={ix.column}" for n, ix in zip(self.names, parts, strict=True))
        h = hashlib.sha256()
        for n, ix in zip(self.names, parts, strict=True):
            h.update(f"{n}\t{ix.fingerprint}\n".encode())
        self.fingerprint = h.hexdigest()
        self.source = "{" + ", ".join(f"{n!r}: {ix.source!r}" for n, ix in zip(self.names, parts, strict=True)) + "}"

    def __repr__(self) -> str:
        return f"MixtureIndex({len(self.parts)} sources, {self.row_groups} row groups, {self.tokens:,} tokens)"

    @property
    def files(self) -> list[FileStat]:
        return [f for ix in self.parts for f in ix.files]

    def _file(self, file_index: int) -> tuple[Index, int]:
        i = int(np.searchsorted(self._file_base, file_index, side="right")) - 1
        return self.parts[i], file_index - int(self._file_base[i])

    @property
    def capabilities(self) -> Capabilities:
        """A mixture's: each pass asks its sources' own (``parts``)."""
        return MIXTURE

    @property
    def mixed(self) -> bool:
        return True

    def unwrapped(self) -> MixtureIndex:
        """The mixture of its sources' indexes before deduplication (itself where none was deduplicated)."""
        base = [p.unwrapped() for p in self.parts]
        if all(b is p for b, p in zip(base, self.parts, strict=True)):
            return self
        return MixtureIndex(self.specs, base, given=self.given)

    def part(self, row_group: int) -> tuple[Index, int]:
        """The row-group index of the source holding global row group ``row_group``, and its row there."""
        i = int(np.searchsorted(self.rg_base, row_group, side="right")) - 1
        return self.parts[i], row_group - int(self.rg_base[i])

    def selected_rows(self, row_group: int) -> NDArray[np.int64] | None:
        """The rows of global ``row_group`` its source's selection keeps (None: every row)."""
        sub, local = self.part(row_group)
        return sub.selected_rows(local)

    def config_fields(self) -> dict[str, Any]:
        """The checkpoint fields of a mixture: its sources (name, fingerprint), and their selections by name."""
        each = [(n, p.config_fields()) for n, p in zip(self.names, self.parts, strict=True)]
        out: dict[str, Any] = {"sources": [[n, p.fingerprint] for n, p in zip(self.names, self.parts, strict=True)]}
        where = [[n, c["where"]] for n, c in each if "where" in c]
        lengths = [[n, c["length_column"]] for n, c in each if c.get("length_column")]
        if where:
            out["where"] = where
        if lengths:
            out["length_column"] = lengths
        for k in ("dedupe", "exclude"):  # the whole mixture's (plitzer.selection.dedupe)
            if each and each[0][1].get(k):
                out[k] = each[0][1][k]
        return out

    def source_of(self, row_group: int) -> str:
        return self.names[int(np.searchsorted(self.rg_base, row_group, side="right")) - 1]

    def storage(self, file_index: int) -> Storage:
        ix, fi = self._file(file_index)
        return ix.storage(fi)

    def file(self, file_index: int) -> FileStat:
        ix, fi = self._file(file_index)
        return ix.file(fi)

    def metadata(self, file_index: int) -> pq.FileMetaData:
        ix, fi = self._file(file_index)
        return ix.metadata(fi)

    def location(self, file_index: int, row_group: int | None = None) -> str:
        ix, fi = self._file(file_index)
        return ix.location(fi, row_group)

    def sources_table(self) -> pl.DataFrame:
        """name, path, column, fingerprint, tokens, row_groups, files: one row per source."""
        return pl.DataFrame(
            {
                "name": self.names,
                "path": [s.path if isinstance(s.path, str) else ",".join(s.path) for s in self.specs],
                "column": [ix.column for ix in self.parts],
                "fingerprint": [ix.fingerprint for ix in self.parts],
                "tokens": [ix.tokens for ix in self.parts],
                "row_groups": [ix.row_groups for ix in self.parts],
                "files": [len(ix.files) for ix in self.parts],
            }
        )


def mixture_index(
    sources: Mapping[str, Any] | MixtureIndex,
    *,
    column: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    selection: Selection | None = None,
    opening: Opening | None = None,
    opened: Mapping[str, Index] | None = None,
) -> MixtureIndex:
    """Index every source of a dict of named sources (footers only, cached).

    A source with a ``where`` (its own, else ``selection``'s) is selected by
    ``opening.select`` (the runtime's selection pass, ``plitzer.selection.select``), and a text
    source (one with a ``tokenizer``) is indexed by ``opening.text_source`` (its counting pass
    tokenizes); ``opening.count`` counts a row group whose footer has no statistics:
    plitzer gives them (:class:`~planner.mixing.sources.Opening`), planner runs none, and
    without them such a source is a ConfigError. ``opened``: sources' indexes opened already,
    by name (a job's ranks shared their listing and footers, and a text source's count:
    ``plitzer.state.share``), taken instead of listing them again; a selection still runs on
    them (from the cache the ranks' shared pass filled).
    """
    if isinstance(sources, MixtureIndex):
        return sources
    specs = source_specs(sources, column=column, storage_options=storage_options, selection=selection)
    passes = Opening() if opening is None else opening
    select, text, count = passes.select, passes.text_source, passes.count
    parts = []
    for s in specs:
        if opened is not None and s.name in opened:
            ix = opened[s.name]
            parts.append(ix if s.selection.where is None or select is None or s.text is not None else select(ix, s))
            continue
        if s.text is not None:
            if text is None:
                msg = (
                    f"source {s.name!r} is text (tokenizer=): its token counts come from a tokenizing pass, "
                    "which planner does not run; plan it through plitzer (plitzer.Loader(...).plan)"
                )
                raise ConfigError(msg)
            parts.append(text(s))
            continue
        if s.index is not None:  # its job index: one listing, one object, no footer
            ix = jobindex.load(s.index, s.path, column=s.column, storage_options=s.storage_options)
        else:
            found = None if passes.files is None else passes.files(s)  # a kind of token files planner does not read
            ix = found or ensure_index(s.path, column=s.column, storage_options=s.storage_options, count=count)
        if s.selection.where is not None:
            if select is None:
                msg = f"source {s.name!r}: where= needs the runtime's selection pass; import plitzer first"
                raise ConfigError(msg)
            ix = select(ix, s)
        parts.append(ix)
    return MixtureIndex(specs, parts, given=[str(n) for n in sources])
