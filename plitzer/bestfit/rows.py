"""Best-fit's rows: a window's bins cut and shuffled as units, then each bin expanded into a padded row.

The rule (:mod:`planner.rules.bestfit`) makes a row group's units its bins. The packer
runs in two steps, so that the lane cuts, the slice shuffles, the lanes a resume
leaves out, the steps before a resume and a window cut again at a layout change are
the concat packer's, unchanged (:func:`plitzer.readpath.pack.pack_unit`,
:func:`plitzer.readpath.recut.pack_rest`):

1. *Units.* The decoded row groups' documents become items and bins
   (the rule's :meth:`~planner.rules.Binned.assign`: best-fit decreasing, one row group at a time), and each row group
   becomes a *unit chunk*: one list a bin, holding the bin's number in the window (its
   one unit). The concat packer packs those chunks with rows of one unit: its block
   says which bin each lane's row of each step is, and its slices are what a
   checkpoint records (the bin's ordinal in the shuffled slice, offset 0).
2. *Rows.* Every bin of the unit's layout (step, lane) becomes its items' sub-pieces, in
   storage order, then one sub-piece of padding up to ``L`` (none where the bin is
   full), and one gather (:func:`plitzer.readpath.pack.gather_layout`: each item a list over
   its row group's values, each padding one over a buffer of ``pad_id``) writes each token
   once, step-major, the block's steps first: a step inside the window is a view of the
   block, a step that straddles two windows is assembled from the edges as under
   concat. Padding is a sub-piece of document -1, so ``doc_lengths``, ``cu_seqlens``
   and ``position_ids`` see it as a segment of its own and ``batch.mask`` is False there.

A worked example, ``L = 4``, one window of one row group, two lanes: documents of 3, 1,
4 and 2 tokens are bins ``{0: [doc 2], 1: [doc 0, doc 1], 2: [doc 3]}``; lanes get 2
and 1 bins (``z = 0``); lane 0's slice, shuffled, might be bins 1, 0, lane 1's bin 2.
Step 0 is ``[d0 d0 d0 d1]`` / ``[d3 d3 p p]``, step 1 ``[d2 d2 d2 d2]`` / lane 1's next
bin, from the next window.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from planner.arraytypes import I64
from planner.catalog.rowgroups import RowGroupIndex
from planner.errors import DataError
from planner.packing import slice_keys
from planner.rules import Binned, Rule
from planner.rules.binned import Items, row_group_bins
from planner.rules.rebin import rest_bins
from plitzer.readpath.aligned import aligned_chunks, storage_dtype
from plitzer.readpath.labels import IGNORE_INDEX, end_labels
from plitzer.readpath.pack import ColumnChunks, chunk_lists, gather_layout
from plitzer.readpath.packed import ColumnBlock, Memory, PackedUnit, StepRange, UnitReads, arrow_ints
from plitzer.readpath.pieces import Documents, unit_documents

__all__ = ["Rows", "pack_bins", "rows_of"]

Packer = Callable[..., PackedUnit]  # pack_unit or pack_rest, called with gather=False


@dataclass(frozen=True, slots=True, eq=False)
class Rows:
    """How a run's rows are made under a rule of bins: the rule, ``seq_len`` (tokens a row), the padding's id and fills.

    ``bins``: each row group's bins (the index's, from the bins pass), which every packed
    row group is checked against. The read pool's ``Packing.rows`` (a
    :class:`plitzer.readpath.scan.RowMaker`): the pool asks it to pack a unit (:meth:`pack`).
    """

    rule: Binned
    seq_len: int
    pad_id: int = 0
    bins: I64 | None = None
    fills: dict[str, Any] | None = None

    def counted(self, index: RowGroupIndex, fills: dict[str, Any] | None) -> Rows:
        """These rows with the bins of each row group of ``index`` (the bins pass's) and the columns' fills."""
        return replace(self, bins=self.rule.counts(index.frame)[0], fills=fills)

    def pack(
        self, chunks: list[pa.Array], reads: UnitReads, columns: ColumnChunks | None, pack: Packer, **labels: bool
    ) -> PackedUnit:
        """A unit's rows: :func:`pack_bins` with these rows."""
        return pack_bins(chunks, reads, columns, self, pack, **labels)


def rows_of(rule: Rule, seq_len: int, pad_id: int) -> Rows | None:
    """How ``rule`` makes rows of ``seq_len`` tokens: its bins, each padded with ``pad_id`` (None under concat)."""
    binning = rule.binning
    return None if binning is None else Rows(binning, seq_len, pad_id)


@dataclass(frozen=True, slots=True)
class _Bins:
    """A unit's bins: each one's items (positions among its non-empty items, in storage order), count and fill."""

    first: I64  # bin j's items are items[first[j]:first[j + 1]]
    items: I64
    count: I64  # bin j holds count[j] items
    fill: I64


@dataclass(frozen=True, slots=True)
class _Layout:
    """The unit's rows as sub-pieces in layout order (each bin's items, then its padding), and their one gather."""

    rep: I64  # each sub-piece's bin (its unit sub-piece), in layout order
    length: I64
    doc: I64  # -1 on the padding
    offset: I64
    steps: StepRange
    list_of: I64  # each sub-piece's list: an item's, or the item count plus its padding's number
    block_at: tuple[int, int, int, int, int]
    item_chunk: I64
    item_value: I64
    item_length: I64
    pad_ends: I64  # the paddings' bounds in their buffer

    def gather(
        self, arrays: list[pa.Array], fill: Any, dt: np.dtype[Any]
    ) -> tuple[Memory | None, NDArray[Any], pa.Array, I64]:
        """Gather the items' values of ``arrays`` and ``fill`` on the padding into the layout (gather_layout's four)."""
        typ = pa.from_numpy_dtype(dt)
        filler = pa.LargeListArray.from_arrays(
            arrow_ints(self.pad_ends, pa.int64()), arrow_ints(np.full(int(self.pad_ends[-1]), fill, dt), typ)
        )
        lists = [*chunk_lists(arrays, self.item_chunk, self.item_value, self.item_length), filler]
        return gather_layout(lists, self.list_of, self.length, dt, self.block_at)


def _unit_chunks(per_chunk: I64) -> list[pa.Array]:
    """Each row group as a unit chunk: one list of one value a bin, the bin's number in the unit."""
    out = []
    start = 0
    for n in per_chunk.tolist():
        offsets = arrow_ints(np.arange(n + 1, dtype=np.int64), pa.int64())
        out.append(pa.LargeListArray.from_arrays(offsets, arrow_ints(np.arange(start, start + n), pa.int64())))
        start += n
    return out


def pack_bins(
    chunks: list[pa.Array],
    reads: UnitReads,
    columns: ColumnChunks | None,
    rows: Rows,
    pack: Packer,
    *,
    labels: bool = False,
) -> PackedUnit:
    """Pack a unit's row groups under best-fit: bins as units by ``pack``, then each bin a padded row.

    ``chunks``: the rank's decoded row groups in stream order (the reads of
    ``reads.place``, whose positions and lane bases count bins); ``pack``: the concat
    packer of the unit (:func:`~plitzer.readpath.pack.pack_unit`, or
    :func:`~plitzer.readpath.recut.pack_rest` for a window cut again). ``labels``: the labels
    (:mod:`plitzer.readpath.labels`) of each item's last token, ``-100`` on the padding.
    A row is the layout stage's tokens (``place.row_tokens``; ``rows.seq_len`` where it has none).
    """
    p = reads.place
    seq_len = p.row_tokens or rows.seq_len
    docs = unit_documents(chunks, np.zeros(len(chunks), np.int64), reads.doc_base)
    rule = rows.rule
    rebinned = p.rest is not None and any(rc.tokens != p.rest[3] for rc in p.rest[2])
    if rebinned:
        units, items, gbin, nbins = _rebinned_units(chunks, reads, rule, docs, pack)
    else:
        items, gbin, per_chunk = row_group_bins(rule, docs.length, docs.chunk, len(chunks), seq_len)
        if rows.bins is not None and len(chunks) and seq_len == rows.seq_len:
            _check_counted(rows.bins[p.row_groups], p.row_groups, per_chunk)
        # 1. Units: the concat packer over one unit a bin (rows of one unit): its tables, nothing gathered.
        bases = np.cumsum(per_chunk) - per_chunk
        units = pack(_unit_chunks(per_chunk), UnitReads(p, bases, 0, np.dtype(np.int64)), None, gather=False)
        nbins = int(per_chunk.sum())
    # 2. Rows: each bin of the layout its items, then its padding.
    lay = _layout(units, _unit_bins(items, gbin, nbins), items, docs, seq_len)
    ends = _end_labels(lay, docs.arrays) if labels else None
    if rebinned:  # a rest binned again: its items come in its order, with consumed items between them
        lay = _tiled(lay)
    memory, block, edges, start = lay.gather(docs.arrays, rows.pad_id, reads.dtype)
    # The unit's own (its place, steps whole in it, slices) stay; the rows are the bins expanded.
    return replace(
        units,
        seq_len=seq_len,
        memory=memory,
        block=block,
        edges=edges,
        steps=lay.steps,
        row=units.row[lay.rep],
        length=lay.length.astype(np.int64, copy=False),
        doc=lay.doc.astype(np.int64, copy=False),
        offset=lay.offset.astype(np.int64, copy=False),
        start=start,
        columns=_columns(lay, docs.arrays, columns, rows.fills, memory),
        labels=ends,
    )


def _end_labels(lay: _Layout, arrays: list[pa.Array]) -> I64:
    """Each sub-piece's last label (:mod:`plitzer.readpath.labels`): an item is one sub-piece, padding -100."""
    n = len(lay.item_length)
    item = np.flatnonzero(lay.list_of < n)
    it = lay.list_of[item]
    out = np.full(len(lay.list_of), IGNORE_INDEX, np.int64)
    out[item] = end_labels(arrays, lay.item_chunk[it], lay.item_value[it] + lay.item_length[it] - 1)
    return out


def _rebinned_units(
    chunks: list[pa.Array], reads: UnitReads, rule: Binned, docs: Documents, pack: Packer
) -> tuple[PackedUnit, Items, I64, int]:
    """A window whose rest was binned again at a ``seq_len`` change (SPEC section 15 rule 9): its units and bins.

    The rest's bins as of its last ``seq_len`` change (:func:`planner.rules.rebin.rest_bins`, the
    run's count of them too) are one unit chunk, cut at that change into its lanes with no
    shuffle and then by the ``lanes`` changes after it, as the concat packer cuts a window again.
    """
    p = reads.place
    assert p.rest is not None
    window_start, b0, recuts, base_tokens = p.rest
    lengths = np.split(docs.length, np.searchsorted(docs.chunk, np.arange(1, len(chunks))))
    keys = slice_keys(p.seed, p.epoch, p.window, np.arange(b0))
    changes = [(rc.lanes, rc.begin, rc.tokens) for rc in recuts]
    rest = rest_bins(rule, lengths, base_tokens, b0, window_start, keys, changes)
    m = rest.count
    place = replace(
        p,
        token_start=np.zeros(1, np.int64),
        window_tokens=m,
        seed=None,
        rest=(rest.begin, rest.lanes, recuts[rest.applied :], 0),
    )
    units = pack(
        _unit_chunks(np.array([m], np.int64)),
        UnitReads(place, np.zeros(1, np.int64), 0, np.dtype(np.int64)),
        None,
        gather=False,
    )
    items = Items(doc=rest.doc, offset=rest.offset, length=rest.length)
    return units, items, rest.bin_of_items(), m


def _tiled(lay: _Layout) -> _Layout:
    """``lay`` with lists that tile their row groups' values, as :func:`~plitzer.readpath.pack.chunk_lists` takes them.

    A window cut again holds only its unconsumed items, in the rest's order: they are
    sorted into storage order (an empty item before one that starts where it does), a
    list is put over each gap between two of a row group (the tokens consumed before the
    change, gathered by no sub-piece), and the sub-pieces' lists numbered again.
    """
    n = len(lay.item_length)
    order = np.lexsort((lay.item_length, lay.item_value, lay.item_chunk))
    c, v, ln = lay.item_chunk[order], lay.item_value[order], lay.item_length[order]
    end = v + ln
    gap = np.flatnonzero((c[1:] == c[:-1]) & (v[1:] > end[:-1]))  # a list over the gap after sorted item gap[i]
    where = np.empty(n, np.int64)
    where[order] = np.arange(n, dtype=np.int64) + np.searchsorted(gap, np.arange(n), side="left")
    list_of = lay.list_of.copy()
    item = list_of < n
    list_of[item] = where[list_of[item]]
    list_of[~item] += len(gap)
    return replace(
        lay,
        list_of=list_of,
        item_chunk=np.insert(c, gap + 1, c[gap]),
        item_value=np.insert(v, gap + 1, end[gap]),
        item_length=np.insert(ln, gap + 1, v[gap + 1] - end[gap]),
    )


def _check_counted(want: I64, row_groups: I64, per_chunk: I64) -> None:
    """Refuse row groups that pack into other bin counts than the bins pass counted (the data changed)."""
    bad = np.flatnonzero(want != per_chunk)
    if len(bad):
        g = int(row_groups[bad[0]])
        msg = (
            f"row group {g} (a row of the index) packs into {int(per_chunk[bad[0]])} bins, but the bins pass "
            f"counted {int(want[bad[0]])}: the data changed since it ran; delete the cache folder's bins "
            "entries (PLITZER_CACHE) and start again"
        )
        raise DataError(msg)


def _unit_bins(items: Items, gbin: I64, nbins: int) -> _Bins:
    """The unit's ``nbins`` bins: their non-empty items in storage order (empty documents give no sub-piece)."""
    live = np.flatnonzero(items.length > 0)
    order = live[np.argsort(gbin[live], kind="stable")]
    count = np.bincount(gbin[live], minlength=nbins).astype(np.int64)
    return _Bins(
        first=np.concatenate([[0], np.cumsum(count)]).astype(np.int64),
        items=order,
        count=count,
        fill=np.bincount(gbin[live], weights=items.length[live], minlength=nbins).astype(np.int64),
    )


def _layout(units: PackedUnit, bins: _Bins, items: Items, docs: Documents, seq_len: int) -> _Layout:
    """Each bin of the units' layout (step, lane) as its items' sub-pieces, then its padding up to ``seq_len``."""
    count = bins.count
    j = units.doc  # the bin of each unit sub-piece, in layout order
    per = count[j] + (bins.fill[j] < seq_len)
    rep = np.repeat(np.arange(len(j), dtype=np.int64), per)
    k = np.arange(len(rep), dtype=np.int64) - (np.cumsum(per) - per)[rep]
    jr = j[rep]
    is_pad = k == count[jr]
    it = bins.items[np.minimum(bins.first[jr] + k, max(len(bins.items) - 1, 0))] if len(bins.items) else rep * 0
    pad_len = np.where(is_pad, seq_len - bins.fill[jr], 0)
    n_items = len(items.length)
    d = items.doc[it] if n_items else rep * 0
    # Every item of the unit is one list over its row group's values (they tile them, in storage
    # order), every padding one list over a buffer of pad values: one gather lays them out.
    pads = np.flatnonzero(is_pad)
    list_of = it.copy()
    list_of[pads] = n_items + np.arange(len(pads), dtype=np.int64)
    bounds = np.concatenate([[0], np.cumsum(per)]).astype(np.int64)[units.steps.bounds]
    t0, t1 = units.t0, units.t1
    steps = StepRange(units.steps.first, bounds)
    first, stop = (steps.of(t0)[0], steps.of(t1 - 1)[1]) if t1 > t0 else (0, 0)
    return _Layout(
        rep=rep,
        length=np.where(is_pad, pad_len, items.length[it] if n_items else 0),
        doc=np.where(is_pad, -1, docs.id[d] if len(docs.id) else 0),
        offset=np.where(is_pad, 0, items.offset[it] if n_items else 0),
        steps=steps,
        list_of=list_of,
        block_at=(first, stop, t1 - t0, units.rows, seq_len),
        item_chunk=docs.chunk[items.doc] if n_items else items.offset,
        item_value=docs.value[items.doc] + items.offset if n_items else items.offset,
        item_length=items.length,
        pad_ends=np.concatenate([[0], np.cumsum(pad_len[pads])]).astype(np.int64),
    )


def _column(lay: _Layout, lists: list[pa.Array], raw: Any, cdt: np.dtype[Any], memory: Memory | None) -> ColumnBlock:
    """One column gathered into the layout, its memory kept alive with the tokens'."""
    c_mem, c_block, c_edges, _ = lay.gather(lists, raw, storage_dtype(cdt))
    if c_mem is not None:
        c_mem.keep_alive(memory)
    return ColumnBlock(c_mem, c_block, c_edges, cdt)


def _columns(
    lay: _Layout,
    arrays: list[pa.Array],
    columns: ColumnChunks | None,
    fills: dict[str, Any] | None,
    memory: Memory | None,
) -> dict[str, ColumnBlock]:
    """The ``columns=`` gathered like the tokens, each one's fill (or 0) on the padding."""
    out = {}
    for name, (values, cdt) in (columns or {}).items():
        fill = (fills or {}).get(name)
        raw = np.array(0 if fill is None else fill, cdt).reshape(1).view(storage_dtype(cdt))[0]
        out[name] = _column(lay, aligned_chunks(arrays, values, cdt), raw, cdt, memory)
    return out
