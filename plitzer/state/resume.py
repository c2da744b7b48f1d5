"""Checkpoints in and out: what a state records, and the checks a resume makes.

A state is the config and the step, and each lane's position before it: lanes run in
lockstep, so the positions follow from the step (:meth:`planner.run.Run.checkpoint_rows`).
On resume, a checkpoint is lined up with the loader (:func:`fit`, with the live stages it
brings, :mod:`plitzer.state.live`; every field that differs named by :func:`diff_config`
and :func:`diff_revisions`), and its positions are checked against where its step puts
the lanes (:func:`check_positions`); a position inside a slice is checked once its
window is packed (:func:`check_unit`). Every refusal names the field or the lane.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from planner.arraytypes import I64
from planner.errors import CheckpointError
from planner.order.layout import Layout
from planner.run import Run
from plitzer.readpath.packed import PackedUnit, Slices
from plitzer.state import checkpoint as ckpt
from plitzer.state import live
from plitzer.state.build import make_config
from plitzer.state.checkpoint import CONFIG_FIELDS, OPTIONAL, layout_of
from plitzer.state.settings import LoaderSettings
from plitzer.state.steering import Slot

__all__ = [
    "Checks",
    "Cursor",
    "Now",
    "check_positions",
    "check_unit",
    "diff_config",
    "diff_revisions",
    "fit",
    "lanes_after",
    "rank_rows",
    "state_after",
]

Checks = dict[int, tuple[I64, I64, I64, I64]]  # per unit: rank lanes, pieces, offsets, the offsets wanted


class Now:
    """The run in force and what follows from it: the loader's one holder of the run.

    :class:`planner.run.Run` is immutable; a live stage or a checkpoint's stages give a new
    one, which :meth:`set` puts in force (the one place, called by
    :meth:`plitzer.Loader._set_run`). The settings (their layout stages the run's, in tokens)
    and the checkpoint config are derived from it there, never kept apart. A batch's
    :meth:`~plitzer.readpath.batch.Batch.state_after` reads them when called (a stage added
    after the batch starts after it, so the state records it): batches hold this, not the loader.
    """

    __slots__ = ("_base", "_first", "config", "run", "settings", "steering")

    def __init__(self, run: Run, settings: LoaderSettings) -> None:
        self._base, self._first = settings, run.layout  # the settings the loader was built with, and their layout
        self.steering = Slot()  # a steering controller's state rides in every state encoded (SPEC section 20)
        self.set(run)

    def set(self, run: Run) -> None:
        """Put ``run`` in force: the settings and the config follow it."""
        self.run = run
        self.settings = self._base if run.layout is self._first else self._base.with_unit_layout(run.layout)
        self.config = make_config(self.settings, run)


@dataclass(slots=True)
class Cursor:
    """Where a loader is: the next step, and what a resume left until it is passed.

    ``resumed``: the checkpoint's rows for this rank, the state until the next batch;
    ``checks``: positions inside slices still to check, per unit (:func:`check_unit`).
    """

    step: int = 0
    resumed: I64 | None = None
    checks: Checks = field(default_factory=dict)

    def place(self, step: int, resumed: I64 | None = None, checks: Checks | None = None) -> None:
        """``step`` is the next step (after a seek, a resume: its rows and checks)."""
        self.step, self.resumed, self.checks = step, resumed, {} if checks is None else checks


def state_after(now: Now, step: int, units: dict[int, Slices]) -> Callable[[], bytes]:
    """The checkpoint right after step ``step``, encoded when called.

    Lanes inside a slice after the step are in windows the step took tokens from, whose
    slices ``units`` holds (small tables: not the tokens).
    """

    def encode() -> bytes:  # holds the run value and small tables, not the loader
        rows = now.run.checkpoint_rows(step + 1, units.__getitem__)
        return ckpt.encode(ckpt.State(now.config, step + 1, rows, now.steering.state()))

    return encode


def fit(st: ckpt.State, config: Mapping[str, Any], names: list[str], what: str = "checkpoint") -> live.Reconciled:
    """How checkpoint ``st`` lines up with a loader of ``config``; a mismatch is refused with every differing field.

    Stages the checkpoint has after the loader's (added live by the run that wrote it)
    and sources it lacks that weigh 0 up to its step are accepted (:mod:`plitzer.state.live`).
    """
    got = live.reconcile(st.config, config, st.step, names)
    diffs = diff_config(got.checkpoint, got.loader, step=st.step)
    diffs += diff_revisions(got.checkpoint, got.loader)
    if diffs:
        msg = f"{what} does not match this loader: " + "; ".join(diffs)
        raise CheckpointError(msg)
    return got


def _diff_layout(a: Mapping[str, Any], b: Mapping[str, Any], step: int | None) -> list[str]:
    """The layout stages that differ (up to ``step`` when given), field by field."""
    la, lb = layout_of(a), layout_of(b)
    if step is not None:
        la, lb = [r for r in la if r[0] <= step], [r for r in lb if r[0] <= step]
    if la == lb:
        return []
    if len(la) == len(lb) == 1:  # no layout stages: the fields as they are named
        return [
            f"{k}: checkpoint {x!r}, loader {y!r}"
            for k, x, y in zip(("lanes", "seq_len"), la[0][1:], lb[0][1:], strict=True)
            if x != y
        ]
    upto = "" if step is None else f" up to step {step}"
    out = []
    for i, (x, y) in enumerate(zip(la, lb, strict=False)):
        for j, k in enumerate(("start step", "lanes", "seq_len")):
            if x[j] != y[j]:
                out.append(f"layout stage {i} {k}: checkpoint {x[j]}, loader {y[j]}")
    for name, extra in (("checkpoint", la[len(lb) :]), ("loader", lb[len(la) :])):
        if extra:
            out.append(f"layout stages{upto} only the {name} has: {extra!r} ([start step, lanes, seq_len])")
    return out


def diff_config(checkpoint: Mapping[str, Any], current: Mapping[str, Any], *, step: int | None = None) -> list[str]:
    """Every differing configuration field, with both values.

    With ``step`` (a resume at that step), a mixture's stages that start after it
    may differ: only the stages in effect up to ``step`` must agree. So may layout
    stages (``layout``, ``lanes`` and ``seq_len``): those up to ``step`` are compared,
    stage by stage and field by field.
    """
    a, b = {**OPTIONAL, **checkpoint}, {**OPTIONAL, **current}
    out = []
    for k in CONFIG_FIELDS:
        if k == "lanes":
            out += _diff_layout(a, b, step)
        elif k not in ("stages", "revisions", "seq_len", "layout") and a[k] != b[k]:
            out.append(f"{k}: checkpoint {a[k]!r}, loader {b[k]!r}")
    sa, sb = a["stages"], b["stages"]
    if step is not None:
        sa = [x for x in sa if x[0] <= step]
        sb = [x for x in sb if x[0] <= step]
        if sa != sb:
            out.append(
                f"stages up to step {step}: checkpoint {sa!r}, loader {sb!r} (only stages that start after the "
                "checkpoint's step may change)"
            )
    elif sa != sb:
        out.append(f"stages: checkpoint {sa!r}, loader {sb!r}")
    return out


def diff_revisions(checkpoint: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """Hub sources whose branch moved to a commit whose files differ from the checkpoint's.

    A source is matched by its URL without revision; one on one side only (a copy on
    disk, another store) is not compared: the fingerprint says whether it is the same
    dataset. The same files (every file's content hash equal) at another commit are the
    same bytes, so they are accepted (docs/design.md, "Hub revisions in checkpoints").
    """
    theirs = {src: (commit, files) for src, commit, files in checkpoint.get("revisions", [])}
    out = []
    for src, commit, files in current.get("revisions", []):
        if src in theirs and theirs[src][1] != files:
            was = theirs[src][0]
            out.append(
                f"revision of {src}: checkpoint commit {was}, loader commit {commit} (the branch moved and the "
                f"files changed); resume with {_pinned(src, was)} to read what the run began with"
            )
    return out


def _pinned(src: str, commit: str) -> str:
    """``hf://datasets/ORG/NAME/PATH`` at ``commit``: ``hf://datasets/ORG/NAME@COMMIT/PATH``."""
    head, _, rest = src.partition("://")
    parts = rest.split("/")
    n = 3 if parts[0] in ("datasets", "spaces") else 2
    return f"{head}://{'/'.join(parts[:n])}@{commit}" + ("/" + "/".join(parts[n:]) if parts[n:] else "")


def lanes_after(fitted: live.Reconciled, layout: Layout, world: int, rank: int, step: int) -> range:
    """The rank's lanes at ``step`` once checkpoint ``fitted`` is taken (its layout stages, where it brings them)."""
    runs = Layout.from_config(fitted.layout) if fitted.layout else layout
    per = runs.at(step).lanes // world
    return range(rank * per, (rank + 1) * per)


def rank_rows(st: ckpt.State, lanes: range, rank: int) -> I64:
    """The rows of checkpoint ``st`` for ``lanes``; refused when some are missing."""
    mine = np.arange(lanes.start, lanes.stop)
    have = st.positions[:, 0]
    idx = np.searchsorted(have, mine)
    ok = (idx < len(have)) & (have[np.minimum(idx, len(have) - 1)] == mine)
    if not ok.all():
        missing = mine[~ok]
        msg = (
            f"checkpoint lacks lanes {missing[:10].tolist()} of rank {rank}; "
            "resume from plitzer.merge(parts of every rank)"
        )
        raise CheckpointError(msg)
    rows: I64 = st.positions[idx]
    return rows


def check_positions(run: Run, step: int, rows: I64) -> Checks:
    """Refuse positions that are not where ``step`` puts the lanes; what needs the pieces, later.

    Lanes run in lockstep, so a checkpoint's positions follow from its step. A position
    at a slice's start (piece 0, offset 0) is checked from the footers; one inside a
    slice must be in the lane's window, and its piece and offset are checked when that
    window is packed (:func:`check_unit`).
    """
    plan = run.plan
    stage = run.stage_of(step)
    per_row = run.segment(stage)[1].units_per_row
    for _, e, w, _, _ in rows.tolist():
        nw = plan.windows_in(e)
        if w >= nw:
            msg = f"checkpoint position window {w} is out of range: epoch {e} of the dataset has {nw} windows"
            raise CheckpointError(msg)
    want = run.positions(step)
    at_start = (rows[:, 3] == 0) & (rows[:, 4] == 0)
    later: dict[int, list[int]] = {}
    for i in range(len(rows)):
        e, w = int(rows[i, 1]), int(rows[i, 2])
        unit = plan.unit(e, w)
        if at_start[i]:
            if int(run.lane_base(unit, stage)[i]) != step * per_row:
                _refuse(rows[i], step, want[i])
        elif (e, w) != (int(want[i, 1]), int(want[i, 2])):
            _refuse(rows[i], step, want[i])
        else:
            later.setdefault(unit, []).append(i)
    checks: Checks = {}
    for unit, sel in later.items():
        ix = np.array(sel, np.int64)
        checks[unit] = (ix, rows[ix, 3], rows[ix, 4], want[ix, 4])
    return checks


def _refuse(row: I64, step: int, want: I64) -> None:
    msg = (
        f"checkpoint position of lane {int(row[0])} (epoch {int(row[1])}, window {int(row[2])}, piece "
        f"{int(row[3])}, offset {int(row[4])}) is not where step {step} puts it (epoch {int(want[1])}, "
        f"window {int(want[2])}, token {int(want[4])} of its slice): the checkpoint does not belong to "
        "this dataset or settings"
    )
    raise CheckpointError(msg)


def check_unit(u: PackedUnit, check: tuple[I64, I64, I64, I64], step: int, first_lane: int) -> None:
    """Refuse a resumed position inside ``u``'s slices that is not where ``step`` puts its lane."""
    lanes, pieces, offsets, want = check
    got = u.slices.offsets(lanes, pieces, offsets)
    bad = np.flatnonzero(got != want)
    if not len(bad):
        return
    i = int(bad[0])
    lane, where = int(lanes[i]), f"(piece {int(pieces[i])}, offset {int(offsets[i])})"
    sl = u.slices
    n = int(sl.lane_piece[lane + 1] - sl.lane_piece[lane])
    size = int(sl.lane_start[lane + 1] - sl.lane_start[lane])
    problem = (
        f"is past its slice of {n} pieces ({size} tokens)"
        if got[i] < 0
        else f"is not where step {step} puts it (token {int(want[i])} of its slice)"
    )
    msg = (
        f"checkpoint position of lane {first_lane + lane} {where} in epoch {u.epoch} "
        f"window {u.window} {problem}: the checkpoint does not belong to this dataset or settings"
    )
    raise CheckpointError(msg)
