"""A batch: one step's sequences for one rank, with their document boundaries.

``batch.tokens`` is a ``(lanes // world, seq_len)`` array that leaves the loader
without a copy through DLPack (``np.from_dlpack``, ``torch.from_dlpack``) and the
Arrow PyCapsule interface (``pyarrow.array(batch.tokens)`` is a FixedSizeList
array of length ``seq_len``). Document boundaries (for varlen attention) and
provenance (which source documents a row holds) are computed only when asked,
from the packer's bookkeeping, never by re-reading data.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
from numpy.typing import NDArray

from plitzer.readpath.packed import Segments
from plitzer.readpath.signals import SourceMap

__all__ = ["Batch", "Located", "Tokens"]

# file, row group, row of each document; and its source's name in a mixture (else None)
Located = tuple[list[str], NDArray[np.int64], NDArray[np.int64], list[str] | None]
Locate = Callable[[NDArray[np.int64]], Located]


class Tokens(np.ndarray):
    """The ``(rows, seq_len)`` token array: a NumPy array that also speaks Arrow.

    It is an ``ndarray`` (every NumPy operation works, and DLPack export for
    ``np.from_dlpack`` and ``torch.from_dlpack`` is NumPy's own, zero-copy), plus the
    Arrow PyCapsule interface: ``pyarrow.array(tokens)`` is a FixedSizeList array of
    length ``seq_len`` over the same memory.

    >>> import numpy as np, pyarrow as pa
    >>> t = np.arange(6, dtype=np.int32).reshape(2, 3).view(Tokens)
    >>> np.from_dlpack(t).shape, pa.array(t).type
    ((2, 3), FixedSizeListType(fixed_size_list<item: int32>[3]))
    >>> type(t + 0).__name__, type(t[0]).__name__, type(t[:1]).__name__, int(t.sum())
    ('ndarray', 'ndarray', 'Tokens', 15)
    """

    def numpy(self) -> NDArray[Any]:
        """The same memory as a plain ``ndarray``."""
        return self.view(np.ndarray)

    # What is computed from the tokens is a plain ndarray: ``t + 1``, ``t.sum(1)``, ``t[0]`` (a
    # row) are not a batch's token array, so they do not claim to be one. Rows of it (``t[:2]``,
    # two-dimensional) stay Tokens and still export to Arrow as a FixedSizeList.
    def __array_wrap__(self, array: NDArray[Any], context: Any = None, return_scalar: bool = False) -> Any:
        out = np.asarray(array).view(np.ndarray)
        return out[()] if return_scalar else out

    def __getitem__(self, key: Any) -> Any:
        got = super().__getitem__(key)
        if isinstance(got, Tokens) and got.ndim != 2:
            return got.view(np.ndarray)
        return got

    def __arrow_c_array__(self, requested_schema: object | None = None) -> tuple[object, object]:
        a = self.view(np.ndarray)
        if a.ndim != 2:  # a row or a slice of rows: plain values
            return pa.array(a.reshape(-1)).__arrow_c_array__(requested_schema)  # type: ignore[no-any-return]
        if not a.flags.c_contiguous:
            a = np.ascontiguousarray(a)
        flat = pa.array(a.reshape(-1))  # a view: NumPy's memory is shared
        return pa.FixedSizeListArray.from_arrays(flat, a.shape[1]).__arrow_c_array__(requested_schema)  # type: ignore[no-any-return]


def _lanes_text(lanes: NDArray[np.int64]) -> str:
    """``2..5`` for consecutive lanes, else the list (a balanced step's)."""
    if len(lanes) and (np.diff(lanes) == 1).all():
        return f"{int(lanes[0])}..{int(lanes[-1])}"
    return str(np.asarray(lanes).tolist())


@dataclass(eq=False)
class Batch:
    """One step's rows for one rank.

    Attributes
    ----------
    tokens : Tokens
        ``(rows, seq_len)`` tokens (int32, or uint32 for uint32 data).
    step : int
        Global step (counted from 0 over the whole run).
    epoch : int
        Epoch label: ``floor(X(step) / dataset_tokens)``, ``X(step)`` the run's tokens before the step.
    lanes : array
        ``(rows,)`` int64: the global lane of each row. Without ``balance`` the rank's own lanes
        in order (section 4); with it, the lanes the deal gave this rank (SPEC section 18).
    cost : array or None
        With ``balance=True``: ``(microbatches,)`` int64, this rank's attention cost (the sum of
        its rows' squared segment lengths) in each microbatch; None without.
    columns : dict of str to array
        The aligned columns named by ``columns=`` (SPEC section 13), each shaped and cut like
        ``tokens``, of the column's own dtype (bool stays bool); empty when none are named.
    mask : array
        ``(rows, seq_len)`` bool, False on a best-fit row's padding (SPEC section 15).
    labels : array or None
        With ``labels=True``: ``(rows, seq_len)`` int64, each token's next token in its own
        source document, -100 at a document's last token and on padding (SPEC section 16);
        None without.
    source_ids, source_tokens, source_targets : array
        Per-source signals (SPEC section 20), computed when read: each token's source number
        (int16, -1 on padding), the real tokens per source, and with ``labels=True`` the
        targets per source (else None). ``sources`` names the source numbers.
    """

    tokens: Tokens
    step: int
    epoch: int
    lanes: NDArray[np.int64]
    _segments: Segments | Callable[[], Segments] = field(repr=False)
    _locate: Locate = field(repr=False)
    _after: Callable[[], bytes] = field(repr=False)
    columns: dict[str, Tokens] = field(default_factory=dict)
    """Aligned columns (SPEC section 13): name -> ``(rows, seq_len)`` array of the column's dtype, cut as the tokens."""
    padded: bool = False
    """Whether the run's rule pads rows (best-fit): ``mask`` can then be False."""
    labels: Tokens | None = None
    """``labels=True`` (SPEC section 16): each token's next in its document, -100 at a document's end and on padding."""
    cost: NDArray[np.int64] | None = None
    """``balance=True`` (SPEC section 18): this rank's cost in each microbatch; None without."""
    _sources: SourceMap = field(default_factory=SourceMap.lone, repr=False)
    """Document numbers to source numbers (SPEC section 20): the loader's, or a follower's from what it received."""

    def __repr__(self) -> str:
        rows, width = self.tokens.shape
        cols = "".join(f", {n}={c.dtype}" for n, c in self.columns.items())
        cols += ", labels=int64" if self.labels is not None else ""
        return (
            f"Batch(step={self.step}, epoch={self.epoch}, lanes={_lanes_text(self.lanes)}, "
            f"tokens={rows}x{width} {self.tokens.dtype}{cols})"
        )

    @property
    def seq_len(self) -> int:
        return int(self.tokens.shape[1])

    def state_after(self) -> bytes:
        """This rank's checkpoint right after this batch (encoded now: it is not kept per step)."""
        return self._after()

    def _segs(self) -> Segments:
        """The pieces in the rows, in row order (from the packer's tables, computed once)."""
        if not isinstance(self._segments, Segments):
            self._segments = self._segments()
        return self._segments

    def _spans(self) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
        """Per piece: row, start in the row, length."""
        segs = self._segs()
        rows, lengths = segs.row, segs.length
        cu = np.cumsum(lengths) - lengths
        return rows, cu - rows * self.seq_len, lengths

    @property
    def mask(self) -> NDArray[np.bool_]:
        """``(rows, seq_len)`` bool: True on real tokens, False on padding (SPEC section 15).

        All True under ``packing="concat"``, which never pads; under ``"best-fit"`` False on
        each row's padding after its bin's documents. Computed when asked, from the pieces
        (padding is a piece of document -1), so a run that never asks pays nothing.
        """
        if not self.padded:
            return np.ones(self.tokens.shape, bool)
        segs = self._segs()
        out: NDArray[np.bool_] = np.repeat(segs.doc >= 0, segs.length).reshape(self.tokens.shape)
        return out

    @property
    def sources(self) -> tuple[str, ...]:
        """The source names, in source-number order (``loader.sources``; a path's one source is ``""``)."""
        return self._sources.names

    @property
    def source_ids(self) -> NDArray[np.int16]:
        """``(rows, seq_len)`` int16: each token's source number (``sources``), -1 on padding (SPEC section 20).

        A lone source's tokens are all 0. Computed when asked, from the pieces (one
        ``searchsorted`` over the sources' first document numbers, one ``repeat``), so a run
        that never asks pays nothing; a per-source loss is one ``bincount`` over it.

        >>> import plitzer, tempfile
        >>> d = tempfile.mkdtemp(); _ = plitzer.synth.write(d, tokens=50_000, seed=4)
        >>> with plitzer.Loader({"web": d}, lanes=4, window=2, seq_len=64) as loader:
        ...     batch = loader.next_batch()
        >>> batch.sources, batch.source_ids.dtype, batch.source_ids.shape, batch.source_tokens.tolist()
        (('web',), dtype('int16'), (4, 64), [256])
        """
        return self._sources.ids(self._segs(), self.tokens.shape)

    @property
    def source_tokens(self) -> NDArray[np.int64]:
        """``(sources,)`` int64: the real tokens (padding aside) of each source in this rank's rows."""
        return self._sources.tokens(self._segs())

    @property
    def source_targets(self) -> NDArray[np.int64] | None:
        """With ``labels=True``: ``(sources,)`` int64, the labels other than -100 of each source; None without."""
        if self.labels is None:
            return None
        return self._sources.targets(self._segs(), self.labels)

    @property
    def piece_lengths(self) -> NDArray[np.int64]:
        """The lengths of every piece, row after row (``diff(cu_seqlens)``)."""
        return self._segs().length

    @property
    def pieces_per_row(self) -> NDArray[np.int64]:
        """How many pieces each row holds."""
        return np.bincount(self._segs().row, minlength=self.tokens.shape[0]).astype(np.int64)

    @property
    def doc_lengths(self) -> list[NDArray[np.int64]]:
        """Per row, the lengths of the pieces it holds, in order (sum = seq_len).

        A piece is a document, or the part of one that a lane cut or a sequence
        boundary left in this row: attention should not cross its edges.
        """
        rows, _, lengths = self._spans()
        cuts = np.searchsorted(rows, np.arange(1, self.tokens.shape[0]))
        return list(np.split(lengths, cuts))

    @property
    def cu_seqlens(self) -> NDArray[np.int32]:
        """Cumulative piece lengths over the flattened batch, from 0 to rows*seq_len (int32)."""
        _, _, lengths = self._spans()
        return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)

    @property
    def max_seqlen(self) -> int:
        _, _, lengths = self._spans()
        return int(lengths.max()) if len(lengths) else 0

    @property
    def position_ids(self) -> NDArray[np.int32]:
        """``(rows, seq_len)`` positions that restart at 0 at every document start."""
        _, _, lengths = self._spans()
        starts = np.cumsum(lengths) - lengths  # each piece's first token in the flattened batch
        # In int32 from the start, in place: a step's positions are one pass over its tokens
        # (50 us for 64 x 2048, where int64 temporaries and a cast took 0.9 ms).
        pos = np.arange(int(lengths.sum()), dtype=np.int32)
        pos -= np.repeat(starts.astype(np.int32), lengths)
        out: NDArray[np.int32] = pos.reshape(self.tokens.shape)
        return out

    def documents(self) -> pl.DataFrame:
        """The source of every piece of every row.

        Columns: batch_row, lane, start (in the row), length, source (a mixture's
        source name; only for mixtures), file, row_group,
        row (in the row group), token_offset (in the document), epoch, window_index
        (the window of the piece's epoch; not ``window``, a keyword in DuckDB); and for each
        aligned column (``columns=``), ``NAME_sum``: the sum of its values over the piece
        (a loss mask's count of the tokens trained on).

        Examples
        --------
        >>> import plitzer, polars as pl, tempfile
        >>> d = tempfile.mkdtemp(); _ = plitzer.synth.write(d, tokens=50_000, seed=4)
        >>> with plitzer.Loader(d, lanes=4, window=2, seq_len=64) as loader:
        ...     docs = loader.next_batch().documents()
        >>> docs.group_by("batch_row").agg(pl.col("length").sum()).sort("batch_row")["length"].to_list()
        [64, 64, 64, 64]
        """
        rows, start, length = self._spans()
        segs = self._segs()
        ids, offset, epoch, window = segs.doc, segs.offset, segs.epoch, segs.window
        real = ids >= 0  # best-fit's padding is a piece of no document: not listed
        if not real.all():
            rows, start, length, ids, offset, epoch, window = (
                a[real] for a in (rows, start, length, ids, offset, epoch, window)
            )
        files, row_group, row, sources = self._locate(ids)
        columns: dict[str, Any] = {
            "batch_row": rows,
            "lane": np.asarray(self.lanes, np.int64)[rows],
            "start": start,
            "length": length,
        }
        if sources is not None:
            columns["source"] = pl.Series(sources, dtype=pl.String)
        columns.update(
            {
                "file": pl.Series(files, dtype=pl.String),
                "row_group": row_group,
                "row": row,
                "token_offset": offset,
                "epoch": epoch,
                "window_index": window,
            }
        )
        # Aligned columns: each piece's sum of the column (a mask's count of tokens trained on).
        ends = rows * self.seq_len + start + length
        for name, values in self.columns.items():
            flat = np.asarray(values).reshape(-1)
            acc = np.float64 if flat.dtype.kind == "f" else np.int64
            cs = np.concatenate([[0], np.cumsum(flat, dtype=acc)])
            columns[f"{name}_sum"] = cs[ends] - cs[ends - length]
        return pl.DataFrame(columns)
