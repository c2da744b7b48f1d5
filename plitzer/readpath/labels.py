"""Labels: each token's next token in its own source document (SPEC section 16), packed with the tokens.

``labels=True`` gives ``batch.labels``, ``(rows, seq_len)`` int64: what
``torch.nn.functional.cross_entropy(logits.view(-1, V), labels.view(-1), ignore_index=-100)``
takes. A document lies whole in one row group, so the label of the token at value position ``i``
of a decoded row group is the value at ``i + 1`` when that is still inside the same document,
else :data:`IGNORE_INDEX`. Each row group's labels are therefore one array of the token
column's value positions (:func:`label_chunks`: a shifted copy, ``-100`` at every document's
last token), and the packer gathers it through the very lists, sub-pieces and layout it
gathers the tokens by (:func:`plitzer.readpath.pack.finish_unit`, best-fit's
:func:`plitzer.readpath.bins.pack_bins`): the label of a piece's last token is the token that
follows it in its document wherever a lane cut, a row end or a best-fit item split left that
token (another row, another lane, another rank), with no communication between them. Padding
(best-fit's) is filled with ``-100``. A document a selection dropped is not in the decoded row
group, so no label points into it.

A worked example: a row group of documents ``[5 6 7]`` and ``[8 9]`` has values
``5 6 7 8 9`` and labels ``6 7 -100 9 -100``. Under concat with ``seq_len = 2`` and one lane
the rows are ``[5 6] [7 8] [9 ..]`` and their labels ``[6 7] [-100 9] [-100 ..]``.

docs/design.md, "Labels".
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from plitzer.readpath.aligned import aligned_chunks, storage_dtype
from plitzer.readpath.packed import ColumnBlock, PackedUnit, StepCopies, arrow_ints, edge_values
from plitzer.readpath.read import numpy_view

__all__ = [
    "IGNORE_INDEX",
    "LABEL_BYTES",
    "LABEL_DTYPE",
    "LABEL_FILL",
    "LABEL_STORAGE",
    "assemble_labels",
    "empty_labels",
    "label_chunks",
    "label_values",
    "unit_labels",
]

IGNORE_INDEX = -100
"""PyTorch's ``ignore_index`` of ``cross_entropy``: the label of a document's last token and of padding."""

LABEL_DTYPE = np.dtype(np.int64)
"""The labels' dtype in a batch."""

LABEL_STORAGE = storage_dtype(LABEL_DTYPE)
"""What the packer gathers them as (the aligned columns' unsigned integer of their width)."""

LABEL_FILL = np.array(IGNORE_INDEX, LABEL_DTYPE).view(LABEL_STORAGE).item()
"""The padding's label in :data:`LABEL_STORAGE` (best-fit's rows)."""

LABEL_BYTES = LABEL_DTYPE.itemsize
"""Bytes a token the labels add, decoded and again packed (the budget counts them as an aligned column's)."""


def label_values(arr: pa.Array) -> NDArray[np.int64]:
    """The labels of a decoded token chunk at its value positions: the next value, -100 at each document's end.

    ``arr`` is a list chunk whose documents' values are contiguous (the packer's chunks,
    :func:`plitzer.readpath.pieces.unit_documents`); values outside its documents get labels
    no piece reads.
    """
    values = numpy_view(arr.values)
    # In Arrow's pool, whose freed pages the next window reuses (plitzer.readpath.allocators): a fresh
    # NumPy array of a row group's size is page-faulted anew each time (2.6 against 1.4-1.8 ns a token, measured).
    out = np.frombuffer(pa.allocate_buffer(len(values) * LABEL_BYTES), LABEL_DTYPE)
    out[:-1] = values[1:]
    out[-1:] = IGNORE_INDEX
    if len(arr):
        offsets = numpy_view(arr.offsets)
        ends = offsets[1:][offsets[1:] > offsets[:-1]]  # each non-empty document's end
        out[ends - 1] = IGNORE_INDEX
    return out


def label_chunks(arrays: list[pa.Array]) -> list[pa.Array]:
    """The labels of the packer's token chunks as list arrays over the same value positions (as an aligned column's)."""
    return aligned_chunks(arrays, [label_values(a) for a in arrays], LABEL_DTYPE)


def unit_labels(u: PackedUnit, t: int) -> NDArray[np.int64] | None:
    """Step ``t``'s labels as a view of the unit's block (``u.t0 <= t < u.t1``); None without labels."""
    return None if u.labels is None else u.labels.block[t - u.t0].view(LABEL_DTYPE)


def assemble_labels(
    units: list[PackedUnit], step: int, rows: int, seq_len: int, pad: bool | None = None
) -> NDArray[np.int64] | None:
    """Step ``step``'s labels from the windows it straddles, copied as its tokens are; None without labels.

    ``pad``: a finite run's last step (SPEC section 17), whose rows may end early (``units``
    may then be none): True when the run has labels, each row -100 after its last token.
    """
    blocks = [u.labels for u in units]
    if any(b is None for b in blocks) or (pad is None and not units) or pad is False:
        return None
    copies = StepCopies.of(units, step, seq_len)
    edges = [edge_values(b.edges, LABEL_STORAGE) for b in blocks if b is not None]
    if pad is None:
        return copies.copy(edges, np.empty((rows, seq_len), LABEL_STORAGE)).view(LABEL_DTYPE)
    return copies.copy(edges, np.full((rows, seq_len), LABEL_FILL, LABEL_STORAGE), full=False).view(LABEL_DTYPE)


def empty_labels(nl: int, seq_len: int) -> ColumnBlock:
    """The labels of a unit with nothing read: no step, no edge."""
    z = np.zeros(0, LABEL_STORAGE)
    return ColumnBlock(None, z.reshape(0, nl, seq_len), arrow_ints(z, pa.uint64()), LABEL_DTYPE)
