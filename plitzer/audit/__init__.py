"""Dataset and plan health in one report: tables, pictures, and one HTML page.

Every number here comes from the same places the loader uses: the row-group index
(footers), the plan's tables, and document lengths (one cached pass over the
token column, see :mod:`plitzer.explain`). The pieces are plain functions that
return Polars frames, so a notebook can call them one by one:

- :func:`length_histogram`, :func:`length_summary`: the document-length distribution.
- :func:`duplicates`: documents with the same content hash (and length).
- :func:`lane_balance`: tokens each lane receives in an epoch (within one of each other).
- :func:`lockstep`: per step, the windows the lanes sit in, the windows the step
  uses, and how far apart the lanes' token counts are (never more than one).
- :func:`read_amplification`: reads per row group versus window, with the bound
  ``1 + (world - 1) * windows / G``, about ``1 + (world - 1) / window`` (docs/design.md,
  "Reads and read amplification").
- :func:`epochs_covered`: how many epochs a number of steps covers.
- :func:`step_balance`: per step, the slowest rank's attention work over the mean rank's,
  as section 4 assigns the rows and dealt by cost (SPEC section 18, from ``plan.costs``).

:func:`audit` runs them all and returns a :class:`Report`, whose ``write`` puts an
HTML page with PNG pictures (matplotlib, Agg, no display needed) in a file or a
folder. The tables live in :mod:`plitzer.audit.tables`, the pictures in
:mod:`plitzer.audit.pictures`, the report in :mod:`plitzer.audit.report`.

>>> import plitzer.synth, tempfile
>>> d = tempfile.mkdtemp(); _ = plitzer.synth.write(d, tokens=30_000, seed=0, docs_per_row_group=40)
>>> r = audit(d, lanes=4, window=2, world=2, seq_len=64)
>>> r.tables["summary"]["tokens"][0] == plitzer.index(d).tokens
True
"""

from plitzer.audit.pictures import (
    plot_amplification,
    plot_lane_balance,
    plot_lengths,
    plot_lockstep,
    plot_mixture,
    plot_reads_per_rank,
    plot_step_balance,
    plot_tokens_per_file,
    plot_tokens_per_row_group,
)
from plitzer.audit.report import Report, audit
from plitzer.audit.tables import (
    duplicates,
    epoch_starts,
    epochs_covered,
    lane_balance,
    length_histogram,
    length_summary,
    lockstep,
    mixture_shares,
    read_amplification,
    reads_per_rank,
    source_repetitions,
    step_balance,
)

__all__ = [
    "Report",
    "audit",
    "duplicates",
    "epoch_starts",
    "epochs_covered",
    "lane_balance",
    "length_histogram",
    "length_summary",
    "lockstep",
    "mixture_shares",
    "plot_amplification",
    "plot_lane_balance",
    "plot_lengths",
    "plot_lockstep",
    "plot_mixture",
    "plot_reads_per_rank",
    "plot_step_balance",
    "plot_tokens_per_file",
    "plot_tokens_per_row_group",
    "read_amplification",
    "reads_per_rank",
    "source_repetitions",
    "step_balance",
]
