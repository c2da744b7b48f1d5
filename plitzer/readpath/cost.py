"""The budget's cost model: the bytes a unit holds while it is read, packed and used.

One module owns these numbers so that the construction-time floor
(:func:`budget_floor`), the schedule's charge for a unit it starts
(:func:`unit_estimate`) and what a packed unit reports it holds
(``plitzer.readpath.packed.PackedUnit.nbytes``) agree. The contract counts decoded token
data as 4 bytes per token and 8 per document; the packed copy a step's rows are
views of is 4 bytes per token more, and its piece table (``PIECE_BYTES`` per
piece) has at most one piece per document, per lane cut inside a document, and per
row boundary (one per ``seq_len`` tokens of a lane) inside a piece:

    decoded   4 * tokens + 8 * documents           (freed once the unit is packed)
    packed    4 * tokens + PIECE_BYTES * pieces + LANE_BYTES * (lanes + 1)
    pieces   <= documents + lanes + tokens // seq_len + lanes, and <= documents + tokens + lanes

Labels (``labels=True``) add ``LABEL_BYTES`` a piece (the label of its last token), nothing a
token: a step's labels are made from its tokens when it is handed out (plitzer.readpath.labels).

>>> decoded_bytes(1000, 10), packed_bytes(1000, 10, lanes=4, seq_len=100)
(4080, 5240)
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "LABEL_BYTES",
    "LANE_BYTES",
    "PIECE_BYTES",
    "budget_floor",
    "decoded_bytes",
    "max_pieces",
    "packed_bytes",
    "unit_estimate",
]

# Per piece of the step-major table (row, length, document, offset: int64) and of the
# shuffled slices (end: int64) that checkpoints read.
PIECE_BYTES = 40
# Per lane: where its slice starts, and its first piece (int64 each).
LANE_BYTES = 16
# Per piece with labels=True: the label of its last token (int64).
LABEL_BYTES = 8


def decoded_bytes(tokens: Any, rows: Any) -> Any:
    """Decoded token data of row groups: 4 bytes per token, 8 per document (docs/design.md, "The budget")."""
    return 4 * tokens + 8 * rows


def max_pieces(tokens: Any, rows: Any, lanes: int, seq_len: int) -> Any:
    """At most this many pieces in a unit of ``tokens`` and ``rows`` for ``lanes`` rank lanes.

    Also at most ``rows + tokens + lanes`` (``rows`` without a token): a piece of a
    document holds a token of it, is an empty document whole, or is the empty share of a
    lane that a window of fewer tokens than lanes leaves empty (one at most a lane). So a
    window that a selection left empty (SPEC section 10: its row groups keep their places,
    hold no row and are never read) costs no piece.
    """
    most = rows + 2 * lanes + 1 + tokens // max(seq_len, 1)
    each = rows + tokens + lanes * (np.asarray(tokens) > 0)
    return np.minimum(most, each) if isinstance(most, np.ndarray) else int(min(most, each))


def packed_bytes(tokens: Any, rows: Any, *, lanes: int, seq_len: int, labels: bool = False) -> Any:
    """An upper bound of what a packed unit holds: its step-major copy and its tables (``labels``: theirs too)."""
    per_piece = PIECE_BYTES + LABEL_BYTES * labels
    return 4 * tokens + per_piece * max_pieces(tokens, rows, lanes, seq_len) + LANE_BYTES * (lanes + 1)


def unit_estimate(
    tokens: Any, rows: Any, *, lanes: int, seq_len: int, column_bytes: int = 0, labels: bool = False
) -> Any:
    """Bytes charged while a unit is read and packed: decoded and packed at once (the gather's peak).

    ``column_bytes``: the aligned columns' bytes per token (plitzer.readpath.aligned), decoded and packed too;
    ``labels``: ``LABEL_BYTES`` a piece.
    """
    extra = 2 * column_bytes * tokens
    packed = packed_bytes(tokens, rows, lanes=lanes, seq_len=seq_len, labels=labels)
    return decoded_bytes(tokens, rows) + packed + extra


def budget_floor(
    tokens: NDArray[Any],
    rows: NDArray[Any],
    *,
    lanes: int,
    window: int,
    seq_len: int,
    ahead: int = 0,
    column_bytes: int = 0,
    labels: bool = False,
) -> tuple[int, int]:
    """Bytes the units of one step can hold at most, and how many units that is.

    With ``ahead``, as many more worst-case windows (prefetch: ``ahead=1`` is what two
    windows in flight need, the one in use being read while the next is decoded).

    At step ``t`` every lane is inside the run's tokens ``[t*L*B - B, (t+1)*L*B)``
    (lockstep), so the units in use are the windows overlapping ``X = (L + 1) * B``
    tokens of the run: the two at its ends, and those wholly inside it, which exist
    only when a window can hold at most ``X`` tokens (with tiny row groups, or the
    short last window of an epoch). Any epoch may put the largest row groups
    together, so the bound takes the largest row groups for each unit, each charged
    :func:`unit_estimate` (all lanes of the dataset: a bound for every rank). Checked
    once at construction, it means no step ever starts a read past the budget.
    ``column_bytes``: the aligned columns' bytes per token, decoded and packed (0 without);
    ``labels``: ``LABEL_BYTES`` a piece more.
    """
    tok = np.asarray(tokens, dtype=np.int64)
    n = np.asarray(rows, dtype=np.int64)
    piece = PIECE_BYTES + LABEL_BYTES * labels
    # Per row group: decoded and packed at once; the per-unit terms are added below.
    est = decoded_bytes(tok, n) + 4 * tok + piece * (n + tok // max(seq_len, 1)) + 2 * column_bytes * tok
    est = np.sort(est)[::-1]
    g, total = len(tok), int(tok.sum())
    if g == 0:
        return 0, 0
    x = (seq_len + 1) * lanes
    per_epoch = -(-g // window)
    epochs = x // max(total, 1) + 2  # epochs an interval of x tokens can touch
    asc = np.sort(tok)
    full = int(asc[:window].sum()) if g >= window else None
    short = g % window
    inside_full = 0
    if full is not None:
        inside_full = x // full if full > 0 else epochs * per_epoch
    inside_short = epochs - 1 if short and int(asc[:short].sum()) <= x else 0
    base = min(2 + inside_full + inside_short, epochs * per_epoch)
    units = base + ahead
    # Windows that hold data: a selection may leave most row groups without a row, and the
    # windows of those alone cost only their lane table, however many a step spans.
    costly = min(2 + _inside_with_data(asc, tok, n, window, x, inside_full), base)
    count = (costly + ahead) * window + inside_short * short
    whole, part = divmod(count, g)
    per_unit = piece * (2 * lanes + 2) + LANE_BYTES * (lanes + 1)
    with_data = min(costly + ahead + inside_short, units)
    lane_table = LANE_BYTES * (lanes + 1)
    need = whole * int(est.sum()) + int(est[:part].sum()) + with_data * per_unit + (units - with_data) * lane_table
    return need, units


def _inside_with_data(
    asc: NDArray[np.int64], tok: NDArray[np.int64], rows: NDArray[np.int64], window: int, x: int, inside: int
) -> int:
    """At most this many windows holding a row lie wholly inside ``x`` tokens of the run (``inside``: any window).

    A window with a row holds a row group with tokens, unless some row group holds only
    empty documents (then ``inside``, every window counted). Such a window holds at least
    the fewest tokens of ``window`` row groups with as many empty ones (no row) as there are.
    ``asc``: the row groups' tokens ``tok``, sorted.
    """
    empty = tok == 0
    if not empty.any() or (rows[empty] > 0).any() or len(tok) < window:
        return inside
    k = int(empty.sum())  # the first k of asc are the empty row groups
    fewest = int(asc[k : k + max(1, window - k)].sum())
    return min(x // fewest, inside)
