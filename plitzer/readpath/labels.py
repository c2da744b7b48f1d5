"""Labels: each token's next token in its own source document (SPEC section 16), made from the step's tokens.

``labels=True`` gives ``batch.labels``, ``(rows, seq_len)`` int64: what
``torch.nn.functional.cross_entropy(logits.view(-1, V), labels.view(-1), ignore_index=-100)``
takes. Every row is a run of sub-pieces (pieces cut where rows end), each a stretch of one
document's tokens, so the label of any token but a sub-piece's last is the token after it in the
same row: the step's labels are its tokens shifted by one, widened to int64 in the step's
output (:func:`step_labels`), and only the label of each sub-piece's last token is kept apart.
That one is the token that follows in its document, wherever a lane cut, a row end or a
best-fit item split left it (another row, another lane, another rank), or ``-100`` where the
document ends: the packer reads it from the decoded row group, where the document lies whole
(:func:`end_labels`), and keeps it beside the sub-piece's row, length and document
(``PackedUnit.labels``, 8 bytes a sub-piece instead of 16 a token). Padding (best-fit's
sub-pieces of document -1, a finite run's rows that end early) is ``-100``. A document a
selection dropped is not in the decoded row group, so no label points into it.

A worked example: a row group of documents ``[5 6 7]`` and ``[8 9]`` has values
``5 6 7 8 9``. Under concat with ``seq_len = 2`` and one lane the rows are ``[5 6] [7 8] [9 ..]``;
their sub-pieces ``[5 6] | [7] [8] | [9] ..`` end with labels ``7 | -100 9 | -100``, so the
rows' labels are ``[6 7] [-100 9] [-100 ..]``.

docs/design.md, "Labels".
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from planner.arraytypes import I64
from plitzer.readpath.packed import PackedUnit, StepCopies
from plitzer.readpath.read import numpy_view

__all__ = ["IGNORE_INDEX", "LABEL_DTYPE", "assemble_labels", "end_labels", "step_labels", "unit_labels"]

IGNORE_INDEX = -100
"""PyTorch's ``ignore_index`` of ``cross_entropy``: the label of a document's last token and of padding."""

LABEL_DTYPE = np.dtype(np.int64)
"""The labels' dtype in a batch."""


def end_labels(arrays: list[pa.Array], chunk: I64, last: I64) -> I64:
    """The label of each sub-piece's last token: value ``last`` of decoded chunk ``chunk``.

    The next value of the chunk when it is still inside the same document (the chunk's
    offsets say where each document ends), else -100. One ``searchsorted`` and one gather
    a chunk over the sub-pieces, not the tokens: a loop over a unit's row groups.
    """
    out = np.full(len(chunk), IGNORE_INDEX, np.int64)
    by = np.argsort(chunk, kind="stable")
    bounds = np.searchsorted(chunk[by], np.arange(len(arrays) + 1), side="left")
    for c, arr in enumerate(arrays):
        sel = by[bounds[c] : bounds[c + 1]]
        if not len(sel):
            continue
        offsets = numpy_view(arr.offsets)
        at = last[sel]
        inside = at + 1 < offsets[np.searchsorted(offsets, at, side="right")]  # the end of at's document
        out[sel[inside]] = numpy_view(arr.values)[at[inside] + 1]
    return out


def _new(rows: int, seq_len: int) -> NDArray[np.int64]:
    # From Arrow's pool, whose freed pages the next step reuses (plitzer.readpath.allocators): a
    # fresh NumPy array of a step's size is page-faulted anew each time (MEASURED.md: 4.4 against
    # 0.4 ns a token).
    buf = pa.allocate_buffer(rows * seq_len * LABEL_DTYPE.itemsize)
    return np.frombuffer(buf, LABEL_DTYPE).reshape(rows, seq_len)


def step_labels(
    tokens: NDArray[Any], dest: I64, length: I64, doc: I64, ends: I64, *, short: bool = False
) -> NDArray[np.int64]:
    """A step's labels from its ``(rows, seq_len)`` tokens and its sub-pieces.

    Sub-piece ``i`` holds ``length[i]`` tokens of document ``doc[i]`` (-1: padding) from flat
    position ``dest[i]`` on, and its last token's label is ``ends[i]``. ``short``: rows may end
    before ``seq_len`` (a finite run's last step), -100 after their last token.
    """
    rows, seq_len = tokens.shape
    out = _new(rows, seq_len)
    flat = out.reshape(-1)
    flat[:-1] = tokens.reshape(-1)[1:]  # one widening copy: every label but the sub-pieces' last
    real = length > 0
    flat[(dest + length - 1)[real]] = ends[real]
    pad = np.flatnonzero(real & (doc < 0))
    if len(pad):  # best-fit's padding: a few sub-pieces a step
        ln = length[pad]
        cum = np.cumsum(ln) - ln
        flat[np.repeat(dest[pad] - cum, ln) + np.arange(int(ln.sum()))] = IGNORE_INDEX
    if short:
        fill = np.bincount(dest[real] // seq_len, weights=length[real], minlength=rows)
        out[np.arange(seq_len) >= fill[:, None]] = IGNORE_INDEX
    return out


def unit_labels(u: PackedUnit, t: int, tokens: NDArray[Any]) -> NDArray[np.int64] | None:
    """Step ``t``'s labels, its ``tokens`` a view of the unit's block (``u.t0 <= t < u.t1``); None without labels.

    Its rows are whole in the unit and its sub-pieces in row order, so they lie end to end.
    """
    if u.labels is None:
        return None
    a, b = u.steps.of(t)
    length = u.length[a:b]
    return step_labels(tokens, np.cumsum(length) - length, length, u.doc[a:b], u.labels[a:b])


def assemble_labels(
    units: list[PackedUnit], step: int, tokens: NDArray[Any], pad: bool | None = None
) -> NDArray[np.int64] | None:
    """Step ``step``'s labels from its ``tokens``, assembled from the windows it straddles; None without labels.

    ``pad``: a finite run's last step (SPEC section 17), whose rows may end early (``units``
    may then be none): True when the run has labels, each row -100 after its last token.
    """
    if any(u.labels is None for u in units) or (pad is None and not units) or pad is False:
        return None
    copies = StepCopies.of(units, step, tokens.shape[1])
    parts = [(u, *u.steps.of(step)) for u in units]

    def cat(name: str) -> I64:  # in StepCopies' order: each unit's sub-pieces of the step, unit after unit
        return np.concatenate([getattr(u, name)[a:b] for u, a, b in parts if a < b] or [np.zeros(0, np.int64)])

    return step_labels(tokens, copies.dest, cat("length"), cat("doc"), cat("labels"), short=pad is not None)
