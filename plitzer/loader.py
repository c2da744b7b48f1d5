"""The Loader: one rank's view of the global batch, step by step, resumable.

Lanes run in lockstep: the cuts deal the run's tokens to lanes like cards (token ``i`` of the run goes to
lane ``i mod B``, docs/design.md "The order"), so lane ``k``'s token ``P`` is run token ``P*B + k``, and at
step ``t`` every lane takes its tokens ``[t*L, (t+1)*L)``. The step alone says where every lane is: there
are no per-lane cursors. The read pool (``plitzer.readpath.scan``) packs each window step-major, so a step
that lies wholly inside one window is a view of that window's block (no copy, no per-lane work); a step
that straddles windows is assembled from their ends by one gather (``plitzer.readpath.packed.assemble``;
both :mod:`plitzer.readpath.steps`). Units that every lane has left are released; the schedule
(``plitzer.readpath.schedule``) starts the next ones ahead, within ``budget``.

The loader holds two things: the run value (:class:`planner.run.Run`, immutable, in
:class:`plitzer.state.resume.Now`, swapped in one place, :meth:`Loader._set_run`) and a cursor (the next
step, and what a resume left: :class:`plitzer.state.resume.Cursor`). Every question about a step (the
units it needs, where each lane is, the epoch label ``floor(X(t) / T)``, the layout stage) is asked of the
run; the plan, the settings' layout stages and the checkpoint config are derived from it, and the schedule
and the batch assembly are given it with each call. ``checkpoint`` derives each lane's position from the
step when it is called, and the positions do not depend on the number of ranks. The live changes
(:meth:`Loader.set_weights`, :meth:`Loader.set_layout`) are :class:`plitzer.state.live.LiveChanges`'
methods, mixed in, beside their checks; construction and its checks are :mod:`plitzer.state.build`, the checks a
resume makes :mod:`plitzer.state.resume`.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from collections.abc import Iterator
from dataclasses import replace
from typing import Any, Unpack

from planner.balance import check_microbatches
from planner.errors import ConfigError, UsageError
from planner.mixing.mixture import MixturePlan
from planner.order.epoch import check_int
from planner.order.layout import Layout
from planner.order.plan import Plan
from planner.parameters import document
from planner.run import Run
from plitzer.readpath import balance
from plitzer.readpath.ahead import Ahead
from plitzer.readpath.batch import Batch
from plitzer.readpath.cost import budget_floor
from plitzer.readpath.packed import PackedUnit
from plitzer.readpath.scan import Stats
from plitzer.readpath.steps import Steps
from plitzer.state import checkpoint as ckpt
from plitzer.state import live, resume
from plitzer.state.build import check_layout, open_plan, parts
from plitzer.state.dealt import DealtSteps
from plitzer.state.groups import balancer_of
from plitzer.state.settings import Keywords, LoaderSettings, Source, bind, signature
from plitzer.state.share import job_source
from plitzer.state.steering import Slot

__all__ = ["Loader", "LoaderSettings", "budget_floor", "open_plan"]


@document()
class Loader(live.LiveChanges, DealtSteps):
    """Deterministic, resumable batches of full sequences for one rank.

    In a job of several processes that has initialised ``torch.distributed``, a loader
    whose ``rank`` and ``world`` are its process's shares the listing, the footers and
    the counting and selection passes with the other ranks instead of doing them on each
    (docs/design.md, "One index per job"), so every rank then builds its loader (a
    collective call); :meth:`in_group` names the group (another process group, a
    launcher's own collective, or none).

    Parameters
    ----------
    source : str, PathLike, list, dict of named sources, or planner.Index
        Local folder or file, ``s3://bucket/prefix``, ``gs://bucket/prefix``,
        ``az://container/prefix`` (or ``abfs://``), or a list of these; a dict of
        named sources is a mixture (SPEC section 8).
    <settings>

    The settings after ``source`` are keywords (``seed`` .. ``storage_options`` may also
    be given by position, in this order); each is defined once, with its documentation,
    in :data:`planner.parameters.PARAMETERS`.

    Examples
    --------
    >>> import plitzer, plitzer.synth, tempfile, numpy as np
    >>> d = tempfile.mkdtemp(); _ = plitzer.synth.write(d, tokens=100_000, seed=0)
    >>> loader = plitzer.Loader(d, seed=0, lanes=8, window=4, seq_len=128)
    >>> batch = next(iter(loader))
    >>> np.from_dlpack(batch.tokens).shape, batch.step, loader.step
    ((8, 128), 0, 1)
    >>> state = loader.checkpoint()
    >>> other = plitzer.Loader(d, seed=0, lanes=8, window=4, seq_len=128, world=2, rank=1)
    >>> other.resume(state)
    >>> np.array_equal(next(iter(other)).tokens[:], next(iter(loader)).tokens[4:])
    True
    """

    def __init__(self, source: Source, *args: Any, **settings: Unpack[Keywords]) -> None:
        cfg = LoaderSettings.of(caller="Loader", **bind("Loader", args, settings))
        if cfg.balance and cfg.world > 1:
            raise ConfigError(balance.NEEDS_GROUP.format(world=cfg.world))
        self._build(open_plan(job_source(source, cfg), cfg), cfg)

    @classmethod
    def in_group(cls, group: Any, source: Source, *args: Any, **settings: Unpack[Keywords]) -> Loader:
        """A Loader whose listing, footers and passes are shared over ``group``.

        ``group``: a ``torch.distributed`` ProcessGroup, or any object with ``rank``,
        ``world``, ``broadcast(value)`` (rank 0's value on every rank) and
        ``all_gather(value)`` (every rank's, in rank order):
        :class:`plitzer.state.share.Collective`, for JAX, Ray or MPI launchers. Collective:
        every process of the group calls it at the same point. None: nothing is shared
        (not even over an initialised ``torch.distributed``). The other arguments are
        :class:`Loader`'s.
        """
        cfg = LoaderSettings.of(caller="Loader.in_group", **bind("Loader.in_group", args, settings))
        return cls.from_plan(open_plan(job_source(source, cfg, group), cfg), cfg, group=group)

    @classmethod
    def from_settings(cls, source: Source, settings: LoaderSettings, group: Any = None) -> Loader:
        """A Loader of already-built settings (what torch.Dataset, explain and the CLI use)."""
        return cls.from_plan(open_plan(source, settings), settings, group=group)

    @classmethod
    def from_plan(cls, plan: Plan, settings: LoaderSettings, group: Any = None) -> Loader:
        """A Loader that runs ``plan`` (no I/O: the footers are in the plan's index).

        ``plan`` must have been made for ``settings`` (:func:`open_plan`); no thread
        starts before the first batch. ``group``: the group a ``balance=True`` loader deals
        its steps over (SPEC section 18; a process group or a Collective; collective then).
        """
        loader = cls.__new__(cls)
        loader._build(plan, settings, group)
        return loader

    def _build(self, plan: Plan, settings: LoaderSettings, group: Any = None) -> None:
        got = parts(plan, settings)  # checked (plitzer.state.build)
        self.index = plan.dataset  # the source's, whatever the run's stages
        self.tokens = plan.dataset.tokens  # the stream's tokens, plan.tokens (its bins, best-fit: plan.bins)
        self.epoch_tokens = plan.epoch_tokens  # T, in the rule's units (a live stage never changes the first)
        # The run in force, and the settings and config derived from it (states encoded later read them).
        self._now = resume.Now(got.run, settings)
        self._cursor = resume.Cursor()  # the next step, and what a resume left
        self._schedule = got.schedule  # which units are read, over the read pool
        self._locate = got.locate
        self._totals = got.totals  # loader.stats' per-source totals (SPEC section 20)
        after = functools.partial(resume.state_after, self._now)  # holds the run's holder, not the loader
        self._steps = Steps(got.schedule, got.locate, after, got.totals.sources)  # the batches, the unit in use
        self._pid = os.getpid()
        self._lock = threading.RLock()
        # Balanced steps (SPEC section 18): the deal, and at world > 1 its exchange a step ahead.
        self._balancer = balancer_of(settings, group)
        self._ahead: Ahead[Batch] | None = None
        if self._balancer is not None and self._balancer.exchange is not None:
            self._ahead = Ahead(self._dealt, balance.DEAL_AHEAD, self._may_deal)
            self._balancer.stats.consumer_wait = 0.0
        self._place(0)

    def _set_run(self, run: Run, unit: int) -> None:
        """Run ``run`` from now on, which differs from the last from ``unit`` on: the one place it is swapped.

        The schedule drops what it read ahead from ``unit`` on; the plan, the settings and the config
        later states record follow the run (a weight or layout stage added live, or a checkpoint's).
        """
        self._now.set(run)
        self._steps.forget(unit)
        self._schedule.changed(run, unit)

    # -- what the run says -------------------------------------------------------

    @property
    def _run(self) -> Run:
        return self._now.run

    @property
    def _step(self) -> int:
        return self._cursor.step

    @property
    def settings(self) -> LoaderSettings:
        """The settings of the run in force (its layout stages, live ones included)."""
        return self._now.settings

    @property
    def plan(self) -> Plan:
        """The run's plan (a mixture's live stage is a new plan value)."""
        return self._now.run.plan

    # -- live changes ------------------------------------------------------------

    @property
    def layout(self) -> Layout:
        """The layout stages of the run (one when ``lanes`` and ``seq_len`` are ints), rows in tokens.

        The run counts steps in its packing rule's units (``self.run.layout``: one a row under best-fit).
        """
        return self.settings.stages

    # -- state -----------------------------------------------------------------

    @property
    def config(self) -> dict[str, Any]:
        """The settings that fix the order, as a checkpoint records them."""
        return dict(self._now.config)

    @property
    def step(self) -> int:
        """Global step of the next batch."""
        return self._step

    @property
    def run(self) -> Run:
        """The run value in force (:class:`planner.run.Run`): every step question, answered without replaying."""
        return self._run

    @property
    def epoch(self) -> int:
        """Epoch label of the next batch."""
        return self._run.epoch_of(self._step)

    def __len__(self) -> int:
        """A finite run's steps (``epochs``, SPEC section 17); without ``epochs``, the batches left in this epoch."""
        steps = self._run.steps
        return self._run.epoch_end(self.epoch) - self._step if steps is None else steps

    def steps_in_epoch(self, epoch: int) -> int:
        """The steps labelled ``epoch``, to size a run in epochs (:meth:`planner.run.Run.steps_in_epoch`)."""
        return self._run.steps_in_epoch(epoch)

    @property
    def ended(self) -> bool:
        """Whether a finite run (``epochs``) has given its last step: the next ``iter()`` starts it again."""
        steps = self._run.steps
        return steps is not None and self._step >= steps

    @property
    def rank_lanes(self) -> range:
        """This rank's lanes in the layout stage of the next batch."""
        return self._run.lanes_at(self._step)

    @property
    def seq_len(self) -> int:
        """Tokens per row in the layout stage of the next batch."""
        return self.layout.at(self._step).seq_len

    @property
    def lanes(self) -> int:
        """Lanes (rows of the global batch) in the layout stage of the next batch."""
        return self._run.at(self._step)[1].lanes

    @property
    def stages(self) -> list[tuple[int, dict[str, int]]]:
        """A mixture's weight stages ``[(start_step, {name: weight}), ...]``, live ones too, as ``weights=`` takes.

        A Loader built with ``weights=`` these (of a steered run's checkpoint: ``plitzer.mixing``)
        gives that run's batches step for step. A lone source has none: ``[]``.
        """
        return [(int(start), dict(w)) for start, w in self._now.config.get("stages", [])]

    @property
    def steering(self) -> Slot:
        """Where a steering controller (:class:`plitzer.mixing.Online`) keeps the state checkpoints carry."""
        return self._now.steering

    @property
    def sources(self) -> list[str]:
        """The source names in source-number order (``batch.source_ids``): a mixture's as given, a path's ``[""]``."""
        return list(self._totals.sources.names)

    @property
    def stats(self) -> Stats:
        """Bytes held (and by batches the caller still holds), peak, units in flight, reads, waits, retries.

        The batches handed out: real tokens per source (and targets, with ``labels=True``) and padding.
        With ``balance=True`` also the running imbalance (the slowest rank's cost over the mean, dealt
        and as section 4 assigns the rows), the rows and bytes this rank sent, and the exchange's time.
        """
        balanced = {} if self._balancer is None else self._balancer.stats.figures()
        return replace(self._schedule.stats, **self._totals.figures(), **balanced)

    @property
    def held_bytes(self) -> int:
        """Decoded bytes held now (prefetched and queued)."""
        return self._schedule.held_bytes

    @property
    def peak_bytes(self) -> int:
        """Most decoded bytes held at once since construction."""
        return self._schedule.peak_bytes

    @property
    def reads(self) -> int:
        """Row groups read so far (one ranged read each)."""
        return self._schedule.rows_read

    def _place(self, step: int) -> None:
        """Make ``step`` the next step: forget the units in use, start over from the footers."""
        self._cursor.place(step)
        self._steps.forget()
        self._schedule.reset(self._run, step)

    def _get(self, unit: int) -> PackedUnit:
        """The packed ``unit``, checking the positions a resume left to check there."""
        run, checks = self._run, self._cursor.checks
        u = self._schedule.get(run, unit)
        check = checks.get(unit)
        if check is not None:
            resume.check_unit(u, check, self._step, self._schedule.rank_lanes(run).start)
            del checks[unit]
        return u

    def checkpoint(self) -> bytes:
        """This rank's state: its lanes' positions before the next batch."""
        self._check_fork()
        with self._lock:
            rows = self._cursor.resumed
            if rows is None:
                rows = self._run.checkpoint_rows(self._step, lambda u: self._get(u).slices)
            return ckpt.encode(ckpt.State(self._now.config, self._step, rows, self._now.steering.state()))

    # -- seek and resume ---------------------------------------------------------

    def seek(self, step: int) -> None:
        """Jump to global step ``step``, as if every step before it had been taken.

        No checkpoint is needed and nothing is replayed: lane ``k``'s next token is
        run token ``X(step) + ((k - X_i) mod B_i)``, with ``X`` the run's tokens before a
        step and ``X_i``, ``B_i`` where the layout stage in force began and its lanes
        (the cuts deal tokens like cards), so its window and the offset in its slice
        follow from the windows' token counts. Only the windows those positions need
        are read.
        """
        self._check_fork()
        step = check_int("step", step, 0, "steps count from 0")
        if self._run.steps is not None and step > self._run.steps:
            msg = f"step={step} is past this run's end (epochs=): seek a step in 0..{self._run.steps}"
            raise ConfigError(msg)
        self._settle()
        with self._lock:
            self._place(step)

    def resume(self, state: bytes) -> None:
        """Continue from a checkpoint taken at any world size.

        ``state`` is a merged global checkpoint, or any part that covers this
        rank's lanes. A checkpoint of other settings or another dataset is
        refused with every differing field.
        """
        self._check_fork()
        st = ckpt.decode(state)
        fit = self.fit(st)
        rows = resume.rank_rows(st, self.lanes_after(fit, st.step), self.settings.rank)
        self._settle()
        with self._lock:
            old = self._run
            self.take_stages(fit)
            try:
                checks = resume.check_positions(self._run, st.step, rows)
            except BaseException:
                # A refused resume leaves the loader as it was: its own stages back.
                if fit.layout:
                    self._set_run(*self._run.with_layout(old.layout))
                if fit.stages and old.stages is not None:
                    self._set_run(*self._run.with_stages(old.stages))
                raise
            self._place(st.step)
            self._cursor.place(st.step, rows, checks)
        self._now.steering.resumed(None if st.steering is None else dict(st.steering), st.step)

    def fit(self, st: ckpt.State, what: str = "checkpoint") -> live.Reconciled:
        """How checkpoint ``st`` lines up with this loader; a mismatch is refused with every differing field.

        Stages the checkpoint has after this loader's (added live by the run that wrote
        it) and sources it lacks that weigh 0 up to its step are accepted (:mod:`plitzer.state.live`).
        """
        names = self.plan.names if isinstance(self.plan, MixturePlan) else []
        return resume.fit(st, self.config, names, what)

    def lanes_after(self, fit: live.Reconciled, step: int) -> range:
        """This rank's lanes at ``step`` once checkpoint ``fit`` is taken (its layout stages, where it brings them)."""
        return resume.lanes_after(fit, self.layout, self.settings.world, self.settings.rank, step)

    def take_stages(self, fit: live.Reconciled) -> None:
        """Run the stages a checkpoint brought (its live ones); place the loader (seek or resume) next.

        The schedule is told (what it read ahead from the first changed window on is
        read again), so the loader is consistent after this call on its own.
        """
        self._settle()
        with self._lock:
            if fit.layout:
                layout = Layout.from_config(fit.layout)
                check_layout(self.plan, self.settings, layout, layout.stages, rebin=self._run.rebin)
                s = self.settings
                for stage in layout.stages:
                    check_microbatches(s.microbatches, stage.lanes, s.world, s.balance)
                self._set_run(*self._run.with_layout(layout.in_units(self.settings.rule.units_per_row)))
            if fit.stages:
                self._set_run(*self._run.with_stages(fit.stages))

    # -- iteration ---------------------------------------------------------------

    def __iter__(self) -> Iterator[Batch]:
        """The rest of the current epoch; the next loop gives the next epoch.

        A finite run (``epochs``) stops at its last step; the ``iter()`` after that starts it
        again from step 0, so an evaluation pass repeats the same batches.
        """
        if self.ended:
            self.seek(0)
        return self._epoch(self.epoch)

    def _epoch(self, epoch: int) -> Iterator[Batch]:
        while self.epoch == epoch and not self.ended:
            yield self.next_batch()

    def next_batch(self) -> Batch:
        """The batch of the next step, whatever its epoch.

        A step is all or nothing: if it is interrupted (KeyboardInterrupt, a storage
        error), the step does not advance, so ``checkpoint()`` still describes the
        batch that was not delivered and a retry resumes cleanly.
        """
        self._check_fork()
        if self._ahead is not None:
            return self._next_dealt()
        with self._lock:
            return self._next_batch()

    def _check_end(self) -> None:
        if self.ended:
            msg = f"this run (epochs=) ended at step {self._step}: iter(loader) or seek(0) starts it again"
            raise UsageError(msg)

    def _next_batch(self) -> Batch:
        self._check_end()
        batch = self._steps.take(self._run, self._step, self._get)  # plitzer.readpath.steps
        if self._balancer is not None:  # world 1: the rank's own rows in microbatches
            batch = self._balancer.balance(batch)
        self._cursor.step = batch.step + 1
        self._cursor.resumed = None
        self._totals.add(batch)
        return batch

    # -- lifecycle ---------------------------------------------------------------

    def _check_fork(self) -> None:
        if os.getpid() != self._pid:
            msg = (
                "this Loader was created in another process and its reader threads did not "
                "survive fork(); create the Loader in the process that uses it (with PyTorch: "
                "num_workers=0)"
            )
            raise UsageError(msg)

    def close(self) -> None:
        """Stop the reader threads and free every buffer."""
        ahead = getattr(self, "_ahead", None)
        if ahead is not None:
            ahead.settle(timeout=balance.CLOSE_WAIT_S)
        self._schedule.close()
        self._steps.forget()

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # At interpreter exit the threading machinery may already be torn down; the
        # process is ending anyway, so there is nothing to stop.
        if sys.is_finalizing():
            return
        schedule = getattr(self, "_schedule", None)
        if schedule is not None and getattr(self, "_pid", None) == os.getpid():
            schedule.close()

    def __repr__(self) -> str:
        s = self.settings
        return (
            f"Loader(step={self._step}, epoch={self.epoch}, lanes={self.lanes}, seq_len={self.seq_len}, "
            f"window={s.window}, rank={s.rank}, world={s.world}, tokens={self.tokens:,})"
        )


Loader.__init__.__signature__ = signature(before=("self", "source"))  # type: ignore[attr-defined]  # help() and IDEs
