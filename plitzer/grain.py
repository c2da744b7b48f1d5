"""Grain: plitzer as a ``grain.IterDataset`` whose iterator checkpoints exactly.

``plitzer.grain.Dataset(source, **settings)`` takes the settings of
:class:`plitzer.Loader` and is a Grain ``IterDataset`` of whole steps: each
element is one step of this process's lanes, a dict of NumPy arrays that JAX
(``jax.dlpack.from_dlpack``, or ``jax.device_put`` of the dict) and torch
(``torch.from_numpy``) take without a copy on the CPU:

``tokens``
    ``(lanes // world, seq_len)`` int32 (uint32 for uint32 data): the loader's
    own array, not copied.
``segment_ids``
    ``(lanes // world, seq_len)`` int32, the document pieces of each row
    numbered from 1 (a new id at every document start): the fixed-shape
    boundaries that JAX attention masks take.
``position_ids``
    ``(lanes // world, seq_len)`` int32 positions that restart at 0 at every
    document start (a document cut by a row edge restarts at the row start).
``cu_seqlens``
    int32 cumulative piece lengths over the flattened rows, ``0 .. rows * seq_len``
    (flash-attn varlen, as ``plitzer.Batch.cu_seqlens``; its length varies by step).
``step``, ``epoch``
    int64 scalars: the global step of the element and its epoch label.
``mask`` (``packing="best-fit"`` only)
    ``(lanes // world, seq_len)`` bool, False on each row's padding; ``segment_ids`` are 0
    there (SPEC section 15).
``labels`` (``labels=True`` only)
    ``(lanes // world, seq_len)`` int64, each token's next token in its own document, -100 at a
    document's last token and on padding (SPEC section 16): the loader's array.
each aligned column (``columns=``, SPEC section 13)
    ``(lanes // world, seq_len)`` of the column's dtype, under its own name (``loss_mask``):
    the loader's array, cut as ``tokens``.
``source_ids``, ``source_tokens`` (a mixture only: a dict of named sources, one included)
    ``(lanes // world, seq_len)`` int16, each token's source number (``loader.sources``), -1 on
    padding, and ``(sources,)`` int64, the real tokens per source (SPEC section 20); with
    ``labels=True`` also ``source_targets``, ``(sources,)`` int64, the targets per source.

An element is already a batch: do not add ``.batch()`` (it would stack steps,
with a copy). ``iter(dataset)`` starts at step 0 and gives the rest of the
epoch it stands in, as ``for batch in loader`` does (``num_epochs=None``: no
end, lanes run on across epochs; ``num_epochs=n``: to the end of epoch
``n - 1``); the iterator's
``get_state()`` is a JSON-able dict that carries plitzer's checkpoint of the
next step (``{"checkpoint": base64 str, "step", "epoch", "rank", "world"}``,
what Grain's and Orbax's checkpointing save), and ``set_state()`` resumes
exactly from it, at any number of processes: the checkpoint of one process is
enough, because the lanes run in lockstep (every lane's position follows from
the step), and :func:`merge_states` joins every process's state into one global
checkpoint as ``plitzer.torch`` does.

Rank and world come from the arguments, or from ``jax.process_index()`` and
``jax.process_count()`` when JAX is imported and initialised. The reading and
decoding run in plitzer's own threads: Grain's ``mp_prefetch`` (worker
processes) and thread-sharded prefetch (``multithread_prefetch`` with more than
one thread) are refused with a clear error, because each worker would read the
same steps again or a slice of them. Transformations that keep one element per
step (``map``, ``ThreadPrefetchIterDataset``) keep the exact order; those that
reorder or drop elements (``shuffle``, ``filter``) break it (docs/grain.md).

This is the only module of plitzer that imports grain.

>>> import tempfile, plitzer.synth, plitzer.grain
>>> d = tempfile.mkdtemp(); _ = plitzer.synth.write(d, tokens=20_000, seed=0)
>>> ds = plitzer.grain.Dataset(d, lanes=4, window=2, seq_len=64)
>>> it = iter(ds)
>>> element = next(it)
>>> element["tokens"].shape, int(element["step"]), sorted(element)
((4, 64), 0, ['cu_seqlens', 'epoch', 'position_ids', 'segment_ids', 'step', 'tokens'])
>>> state = it.get_state()
>>> again = iter(plitzer.grain.Dataset(d, lanes=4, window=2, seq_len=64, rank=1, world=2))
>>> again.set_state(state)
>>> bool((next(again)["tokens"] == next(it)["tokens"][2:]).all())
True
"""

from __future__ import annotations

import base64
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any, Literal, Unpack

import grain
import numpy as np

from planner.mixing.sources import Stage
from planner.parameters import document
from plitzer.adapt import checkpoint_entry, jax_rank_world
from plitzer.errors import CheckpointError, ConfigError
from plitzer.loader import Loader
from plitzer.readpath.batch import Batch
from plitzer.state import checkpoint as ckpt
from plitzer.state import live
from plitzer.state.settings import Keywords, LoaderSettings, Source

__all__ = ["Dataset", "DatasetIterator", "checkpoint_bytes", "element_of", "merge_states"]

Element = dict[str, Any]

_WORKERS = (
    "plitzer.grain.Dataset cannot run in Grain's worker processes (mp_prefetch) or in thread shards "
    "(multithread_prefetch with more than one thread): each worker would read the same steps again, "
    "or a slice of them, so the order and the checkpoint would no longer match what was trained. "
    "plitzer already reads and decodes in its own threads (threads=...): use the dataset without "
    "mp_prefetch, or with grain.experimental.ThreadPrefetchIterDataset to overlap with training"
)


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def element_of(batch: Batch, *, boundaries: bool = True, sources: bool = False) -> Element:
    """A loader batch as a Grain element (the tokens are the batch's memory, not a copy).

    Without ``boundaries`` the element has no ``segment_ids``, ``position_ids``
    and ``cu_seqlens`` (they cost about 20 ns per token here: docs/grain.md). With
    ``sources`` (a mixture's iterators) it has ``source_ids`` and ``source_tokens`` (and
    ``source_targets`` with labels).
    """
    if not boundaries:
        out = {"tokens": batch.tokens.numpy(), "step": np.int64(batch.step), "epoch": np.int64(batch.epoch)}
        if batch.padded:
            out["mask"] = batch.mask
        return _with_columns(out, batch, sources)
    positions = batch.position_ids
    # A piece starts where its position is 0 (empty documents take no position), so the
    # running count of starts along a row numbers the pieces from 1.
    segments = np.cumsum(positions == 0, axis=1, dtype=np.int32)
    if batch.padded:  # best-fit: padding is segment 0, and the element carries the mask
        mask = batch.mask
        segments *= mask
    out = {
        "tokens": batch.tokens.numpy(),
        "segment_ids": segments,
        "position_ids": positions,
        "cu_seqlens": batch.cu_seqlens,
        "step": np.int64(batch.step),
        "epoch": np.int64(batch.epoch),
    }
    if batch.padded:
        out["mask"] = mask
    return _with_columns(out, batch, sources)


def _with_columns(element: Element, batch: Batch, sources: bool) -> Element:
    """The labels and the aligned columns as element keys of their own names (the batch's memory, not a copy).

    A balanced step (``balance=True``, SPEC section 18) also gives ``lanes`` (each row's lane) and
    ``cost`` (the rank's cost a microbatch); ``sources``, the per-source signals (SPEC section 20).
    """
    if batch.cost is not None:
        element["lanes"] = batch.lanes
        element["cost"] = batch.cost
    if batch.labels is not None:
        element["labels"] = batch.labels.numpy()
    if sources:
        element["source_ids"] = batch.source_ids
        element["source_tokens"] = batch.source_tokens
        if batch.labels is not None:
            element["source_targets"] = batch.source_targets
    for n, c in batch.columns.items():
        if n in element:
            msg = (
                f"columns=: the aligned column {n!r} has the name of an element key of plitzer.grain "
                f"({', '.join(sorted(element))}); rename the column in the data"
            )
            if n == "labels":
                msg += (
                    ", or leave out labels=True (plitzer.Batch keeps batch.columns['labels'] apart from batch.labels)"
                )
            raise ConfigError(msg)
        element[n] = c.numpy()
    return element


@document(exclude=("rank", "world"))
class Dataset(grain.IterDataset):  # type: ignore[misc]
    """The loader of one process as a Grain ``IterDataset``: one element per step.

    Parameters
    ----------
    <source>
    <settings>
    rank, world : int, optional
        This process's data rank and the number of data ranks. Default: JAX's
        ``process_index()`` and ``process_count()`` when JAX is imported and
        initialised, else 0 and 1. An explicit value wins.
    num_epochs : "current", int or None
        Where an iterator ends. ``"current"`` (default): at the end of the epoch
        it stands in when it starts or after ``set_state`` (the rest of the
        epoch, as ``for batch in loader``). An int ``n``: at the end of epoch
        label ``n - 1``, wherever it starts (``num_epochs=3``: a run of three
        epochs, also across resumes). ``None``: never; lanes run on across
        epochs and the training loop counts its steps.
    boundaries : bool
        Give ``segment_ids``, ``position_ids`` and ``cu_seqlens`` in every element
        (default). ``False`` leaves them out, for a model that does not mask
        at document edges: they are computed per step from the packer's
        bookkeeping and cost about as much as the loading itself.
    group : Collective, optional
        With ``balance=True`` at world > 1: the data-parallel processes' group
        (:class:`plitzer.state.groups.Collective`: ``rank``, ``world``, ``broadcast``,
        ``all_gather``, and optionally ``all_to_all``) that each step's rows are dealt over,
        from the iterator's read-ahead thread, one iterator at a time (SPEC section 18).

    Notes
    -----
    The settings are checked here; the loader is built (its index read) by
    ``iter(dataset)``, once per iterator: each iterator starts at step 0 and
    ``set_state`` moves it.
    """

    def __init__(
        self,
        source: Source,
        *,
        num_epochs: int | Literal["current"] | None = "current",
        boundaries: bool = True,
        group: Any = None,
        **settings: Unpack[Keywords],
    ) -> None:
        super().__init__()
        kw: dict[str, Any] = dict(settings)
        rank, world = kw.pop("rank", None), kw.pop("world", None)
        if rank is None or world is None:
            got = jax_rank_world()
            if got is not None:
                rank = got[0] if rank is None else rank
                world = got[1] if world is None else world
        if num_epochs is not None and num_epochs != "current" and not _positive_int(num_epochs):
            msg = (
                f"num_epochs={num_epochs!r}: give a positive int (end after that many epochs), "
                "'current' (the rest of the epoch the iterator starts in) or None (no end)"
            )
            raise ConfigError(msg)
        self._source = source
        self._group = group
        self._settings = LoaderSettings.of(
            caller="plitzer.grain.Dataset",
            own=("num_epochs", "boundaries", "group"),
            rank=0 if rank is None else rank,
            world=1 if world is None else world,
            **kw,
        )
        self._num_epochs = num_epochs
        self._boundaries = bool(boundaries)
        self._iterators: weakref.WeakSet[DatasetIterator] = weakref.WeakSet()
        # The dataset's run is that of its settings (layout stages included, live ones too) and of
        # these weight stages, taken from a run (None: the settings' own, until a loader says them).
        self._weights: tuple[Stage, ...] | None = None

    @property
    def settings(self) -> LoaderSettings:
        return self._settings

    @property
    def rank(self) -> int:
        return self._settings.rank

    @property
    def world(self) -> int:
        return self._settings.world

    def __iter__(self) -> DatasetIterator:
        it = DatasetIterator(self._loader(), num_epochs=self._num_epochs, boundaries=self._boundaries)
        self._iterators.add(it)
        return it

    def _loader(self) -> Loader:
        """A loader of the dataset's run, at step 0: its settings, and its weight stages where they changed."""
        loader = Loader.from_settings(self._source, self._settings, group=self._group)
        if self._weights is None:
            self._weights = loader.run.stages  # the settings' stages, as the run says them
        elif loader.run.stages != self._weights:  # taken as a resume takes a checkpoint's: no call replayed
            loader.take_stages(live.Reconciled(checkpoint={}, loader={}, stages=list(self._weights), added=[]))
        return loader

    def _change(
        self, change: Callable[[Loader | DatasetIterator, int | None], int], at_step: int | None
    ) -> tuple[Loader, int]:
        """Make a live change in every open iterator: the loader that took it first, and its step.

        The most advanced open iterator (or, none being open, a loader of the dataset's run
        at step 0, closed after) takes it first, so an ``at_step`` left out is the earliest
        it allows; every other iterator takes it at the same step. The caller records the
        change in the dataset's run (its settings, its weight stages) for iterators made later.
        """
        its = sorted((it for it in self._iterators if not it.closed), key=lambda it: -it.loader.step)
        probe = None if its else self._loader()
        try:
            first = its[0].loader if its else probe
            assert first is not None
            at = change(its[0] if its else first, at_step)
            for it in its[1:]:
                change(it, at)
        finally:
            if probe is not None:
                probe.close()
        return first, at

    def set_weights(self, weights: Mapping[str, Any] | None, at_step: int | None = None) -> int:
        """Append a stage to the mixture, in every iterator of this dataset and in those made later.

        As :meth:`plitzer.Loader.set_weights`, on the iterators' loaders: ``at_step``
        defaults to the earliest step the most advanced open iterator allows (step 0's
        when none is open); returns the stage's step. Every process must make the same
        call at the same step: Grain has no collective to check it (docs/design.md,
        "Live stages").
        """
        changed, at = self._change(lambda x, step: x.set_weights(weights, step), at_step)
        assert self._weights is not None and changed.run.stages is not None  # a mixture's loader has said them
        self._weights = (*self._weights, changed.run.stages[-1])  # the stage as the run has it, parsed once
        return at

    def set_layout(self, lanes: int | None = None, seq_len: int | None = None, at_step: int | None = None) -> int:
        """Append a layout stage, in every iterator of this dataset and in those made later.

        As :meth:`plitzer.Loader.set_layout`, on the iterators' loaders: ``at_step``
        defaults to the earliest step the most advanced open iterator allows (the next
        batch's; step 1 when none is open); returns the stage's step. From that step the
        elements have the new shape (a jitted step sees a new shape and compiles once
        more; docs/grain.md). Every process must make the same call at the same step:
        Grain has no collective to check it.
        """
        _, at = self._change(lambda x, step: x.set_layout(lanes, seq_len, step), at_step)
        s = self._settings  # the stage in the dataset's layout (lanes and seq_len left out are those in force there)
        self._settings = replace(
            s, layout=s.stages.with_stage(live.layout_stage(s.stages, lanes, seq_len, at, at, s.world))
        )
        return at

    def mp_prefetch(self, *args: Any, **kwargs: Any) -> Any:
        """Refused at once: Grain's worker processes would each read the same steps again.

        Overridden so that the refusal comes before Grain reads its absl flags (in a
        plain script, without ``absl.app.run``, those fail first with
        ``UnparsedFlagAccessError``). ``dataset.map(f).mp_prefetch()`` reaches Grain's
        own method, whose flag check comes first: docs/grain.md says what to do.
        """
        raise ConfigError(_WORKERS)

    def set_slice(self, sl: slice, sequential_slice: bool = False) -> None:
        """Refused: Grain slices a source for its worker processes and thread shards."""
        msg = f"{_WORKERS} (Grain asked for the slice {sl})"
        raise ConfigError(msg)

    def __reduce__(self) -> Any:
        # Grain pickles the pipeline (cloudpickle) to start mp_prefetch's worker processes.
        raise ConfigError(_WORKERS)

    def __str__(self) -> str:
        s = self._settings
        return (
            f"plitzer.grain.Dataset(lanes={s.lanes}, seq_len={s.seq_len}, window={s.window}, "
            f"rank={s.rank}, world={s.world})"
        )


class DatasetIterator(grain.DatasetIterator):  # type: ignore[misc]
    """One process's steps, from a :class:`plitzer.Loader`; ``get_state`` / ``set_state`` checkpoint it."""

    def __init__(
        self, loader: Loader, *, num_epochs: int | Literal["current"] | None = "current", boundaries: bool = True
    ) -> None:
        super().__init__()
        self._loader = loader
        self._num_epochs = num_epochs
        self._end: int | None = None  # the first epoch label not given (None: no end)
        self._place()
        self._boundaries = boundaries
        self._state: tuple[int, dict[str, Any]] | None = None

    @property
    def loader(self) -> Loader:
        """The underlying :class:`plitzer.Loader` (settings, plan, held_bytes, reads)."""
        return self._loader

    def __next__(self) -> Element:
        self._assert_not_closed()
        if (self._end is not None and self._loader.epoch >= self._end) or self._loader.ended:  # or a finite run's end
            raise StopIteration
        return element_of(self._loader.next_batch(), boundaries=self._boundaries, sources=self._loader.index.mixed)

    def get_state(self) -> dict[str, Any]:
        """``{"checkpoint": str, "step": int, "epoch": int, "rank": int, "world": int}`` of the next step.

        ``checkpoint`` is this process's plitzer checkpoint (its lanes), base64
        text so that the dict is JSON (Orbax's Grain handler writes it as JSON).
        Taking it is local (no collective): Grain's prefetch takes one per
        element. Repeated calls at the same step reuse the first.
        """
        loader = self._loader
        if self._state is None or self._state[0] != loader.step:
            s = loader.settings
            part = loader.checkpoint()
            self._state = (
                loader.step,
                {
                    "checkpoint": base64.b64encode(part).decode("ascii"),
                    "step": loader.step,
                    "epoch": loader.epoch,
                    "rank": s.rank,
                    "world": s.world,
                },
            )
        return dict(self._state[1])

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Resume from a ``get_state()`` of any process, at any number of processes.

        A state that covers this process's lanes (its own, a merged one from
        :func:`merge_states`, or any at world 1) resumes through
        ``Loader.resume``; a state of another process resumes at its step with
        ``Loader.seek`` (the lanes run in lockstep, so the step alone places
        every lane), once its settings and dataset are checked against this
        loader's. Either way a mismatch is refused with every differing field.
        """
        part = checkpoint_bytes(state)
        loader = self._loader
        st = ckpt.decode(part)
        fit = loader.fit(st, "Grain state")
        lanes = set(st.positions[:, 0].tolist())
        if lanes.issuperset(loader.lanes_after(fit, st.step)):
            loader.resume(part)
        else:
            loader.take_stages(fit)
            loader.seek(st.step)
        self._state = None
        self._place()

    def set_weights(self, weights: Mapping[str, Any] | None, at_step: int | None = None) -> int:
        """Append a stage to the mixture (:meth:`plitzer.Loader.set_weights`); the step it starts at."""
        self._assert_not_closed()
        self._state = None
        return self._loader.set_weights(weights, at_step)

    def set_layout(self, lanes: int | None = None, seq_len: int | None = None, at_step: int | None = None) -> int:
        """Append a layout stage (:meth:`plitzer.Loader.set_layout`); the step it starts at."""
        self._assert_not_closed()
        self._state = None
        return self._loader.set_layout(lanes, seq_len, at_step)

    @property
    def closed(self) -> bool:
        return bool(self._closed)

    def _place(self) -> None:
        n = self._num_epochs
        self._end = None if n is None else self._loader.epoch + 1 if n == "current" else int(n)

    def close(self) -> None:
        """Stop the loader's reader threads and free its buffers."""
        if not self._closed:
            self._loader.close()
        super().close()

    def __reduce__(self) -> Any:
        raise ConfigError(_WORKERS)

    def __str__(self) -> str:
        s = self._loader.settings
        return f"plitzer.grain.DatasetIterator(step={self._loader.step}, rank={s.rank}, world={s.world})"


def checkpoint_bytes(state: Mapping[str, Any] | bytes | str) -> bytes:
    """The plitzer checkpoint inside a Grain state (or the bytes, or their base64 text)."""
    entry = checkpoint_entry(state, "a plitzer.grain state")
    if isinstance(entry, (bytes, bytearray, memoryview)):
        return bytes(entry)
    if isinstance(entry, str):
        try:
            return base64.b64decode(entry.encode("ascii"), validate=True)
        except ValueError as e:
            msg = f"the 'checkpoint' of a plitzer.grain state is base64 text; this one is not ({e})"
            raise CheckpointError(msg) from e
    msg = f"set_state() takes what get_state() returned, got {type(entry).__name__}"
    raise CheckpointError(msg)


def merge_states(states: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """One global state from every process's ``get_state()`` at the same step (``plitzer.merge``).

    The result resumes any process at any world size through ``Loader.resume``;
    parts that disagree (step, settings, overlapping or missing lanes) are refused.
    """
    given = list(states)
    merged = ckpt.merge(checkpoint_bytes(s) for s in given)
    epochs = sorted({int(s["epoch"]) for s in given if "epoch" in s})
    out: dict[str, Any] = {
        "checkpoint": base64.b64encode(merged).decode("ascii"),
        "step": ckpt.decode(merged).step,
        "rank": 0,
        "world": 1,
    }
    if len(epochs) == 1:
        out["epoch"] = epochs[0]
    return out
