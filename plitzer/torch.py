"""PyTorch: an ``IterableDataset`` of whole steps, with one global checkpoint.

``plitzer.torch.Dataset`` takes the settings of :class:`plitzer.Loader`, reads
``rank`` and ``world`` from ``torch.distributed`` when it is initialised, and
yields one :class:`Batch` per step: this rank's rows of the global batch as a
torch tensor (shared with the loader through DLPack, no copy) and the document
boundaries for varlen attention as tensors. Use it with
``DataLoader(dataset, batch_size=None, num_workers=0)``: the reading and
decoding already run in plitzer's own threads, so worker processes are refused.

``dataset.state_dict()``, called on every rank, gathers every rank's part and
returns one global checkpoint, the same on every rank, that
``load_state_dict()`` resumes on any number of ranks. ``state_dict(after=batch)``
is the checkpoint right after a given batch, for loops that prefetch.

>>> import tempfile, plitzer.synth, plitzer.torch
>>> d = tempfile.mkdtemp(); _ = plitzer.synth.write(d, tokens=20_000, seed=0)
>>> ds = plitzer.torch.Dataset(d, lanes=4, window=2, seq_len=64)
>>> batch = next(iter(ds))
>>> batch.tokens.shape, batch.step, int(batch.cu_seqlens[-1]), ds.step
(torch.Size([4, 64]), 0, 256, 1)
>>> state = ds.state_dict()
>>> again = plitzer.torch.Dataset(d, lanes=4, window=2, seq_len=64, rank=1, world=2)
>>> again.load_state_dict(state)
>>> bool((next(iter(again)).tokens == next(iter(ds)).tokens[2:]).all())
True
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Unpack

import polars as pl
import torch
import torch.distributed as dist
from torch.utils.data import IterableDataset, get_worker_info
from torch.utils.data._utils.collate import default_collate_fn_map
from torch.utils.dlpack import from_dlpack

from planner.parameters import document
from plitzer import adapt
from plitzer.adapt import refuse_collate, same_layout_call, same_weights_call
from plitzer.errors import CheckpointError, ConfigError
from plitzer.loader import Loader
from plitzer.readpath.batch import Batch as PlitzerBatch
from plitzer.state import checkpoint as ckpt
from plitzer.state import replica
from plitzer.state.groups import TorchGroup, groups_of_mesh, torch_ready
from plitzer.state.settings import Keywords, LoaderSettings, Source
from plitzer.state.share import share_source

__all__ = ["Batch", "Dataset"]

_TRUE = torch.ones((), dtype=torch.bool)
"""The one value every concat batch's mask is a broadcast view of (no memory a step)."""


@dataclass(frozen=True, eq=False, slots=True)
class Batch:
    """One step for this rank, as tensors.

    Attributes
    ----------
    tokens : torch.Tensor
        ``(lanes // world, seq_len)``, int32 (uint32 for uint32 data; cast it with
        ``.long()`` for ``nn.Embedding``). It shares memory with the loader's array
        (DLPack), so no copy is made.
    position_ids : torch.Tensor
        ``(lanes // world, seq_len)`` int32 positions that restart at 0 at every
        document start (a document cut by a row edge restarts at the row start).
    cu_seqlens : torch.Tensor
        int32 cumulative lengths of the document pieces over the flattened batch,
        ``0 .. rows * seq_len``; no piece crosses a row edge (flash-attn varlen).
    max_seqlen : int
        Length of the longest piece.
    doc_lengths : tuple of torch.Tensor
        Per row, the int64 lengths of its document pieces in order (each sums to
        ``seq_len``): views of ``piece_lengths``, split when read.
    piece_lengths : torch.Tensor
        int64 lengths of every piece, row after row (``diff(cu_seqlens)``).
    pieces_per_row : torch.Tensor
        int64 number of pieces in each row.
    step : int
        Global step of this batch (from 0 over the whole run).
    epoch : int
        Epoch label of this batch.
    lanes, cost : torch.Tensor
        ``(rows,)`` int64: each row's global lane; with ``balance=True`` (SPEC section 18) the deal's,
        and ``cost`` ``(microbatches,)`` int64, the rank's cost a microbatch (else None). On the host.
    state_after : bytes
        This rank's checkpoint part right after this batch: resuming from it gives the batch
        that follows. Encoded when read. ``Dataset.state_dict(after=batch)`` gathers it.
    source : plitzer.Batch
        The loader's batch (NumPy and Arrow views, ``documents()``).
    columns : dict of str to torch.Tensor
        The aligned columns (``columns=``, SPEC section 13): each shaped like ``tokens``, of
        the column's dtype (``torch.bool`` for a bool mask), shared through DLPack.
    mask : torch.Tensor
        ``(lanes // world, seq_len)`` bool: True on real tokens, False on a best-fit row's
        padding (SPEC section 15). Under ``packing="concat"`` all True, as a broadcast view
        of one value (no memory a step).
    labels : torch.Tensor or None
        With ``labels=True`` (SPEC section 16): ``(lanes // world, seq_len)`` int64, each token's
        next token in its own document, -100 at a document's last token and on padding: what
        ``cross_entropy(logits.view(-1, V), labels.view(-1), ignore_index=-100)`` takes. None without.
    source_ids, source_tokens, source_targets : torch.Tensor
        ``(lanes // world, seq_len)`` int16, each token's source number (``loader.sources``), -1 on padding
        (SPEC section 20), made when first read where ``tokens`` are (``to``, ``pin_memory`` carry it then);
        ``(sources,)`` int64 on the host: real tokens per source, and with ``labels=True`` targets (else None).
    """

    tokens: torch.Tensor
    position_ids: torch.Tensor
    cu_seqlens: torch.Tensor
    max_seqlen: int
    piece_lengths: torch.Tensor
    pieces_per_row: torch.Tensor
    step: int
    epoch: int
    lanes: torch.Tensor
    source: PlitzerBatch
    columns: dict[str, torch.Tensor] = field(default_factory=dict)
    mask: torch.Tensor = field(default_factory=lambda: torch.ones((), dtype=torch.bool))
    labels: torch.Tensor | None = None
    cost: torch.Tensor | None = None
    _owner: Callable[[], Dataset | None] | None = field(default=None, repr=False, compare=False)
    """A weak reference to the Dataset that gave this batch (to give refused steps back)."""
    _source_ids: torch.Tensor | None = field(default=None, repr=False, compare=False)  # source_ids, once read

    @property
    def source_ids(self) -> torch.Tensor:
        got = self._source_ids
        if got is None:  # made once, where the tokens are (a frozen batch caches it)
            got = adapt.carried_like(torch.from_numpy(self.source.source_ids), self.tokens)
            object.__setattr__(self, "_source_ids", got)
        return got

    @property
    def source_tokens(self) -> torch.Tensor:
        return torch.from_numpy(self.source.source_tokens)

    @property
    def source_targets(self) -> torch.Tensor | None:
        got = self.source.source_targets
        return None if got is None else torch.from_numpy(got)

    @property
    def doc_lengths(self) -> tuple[torch.Tensor, ...]:
        return tuple(torch.split(self.piece_lengths, self.pieces_per_row.tolist()))

    @property
    def state_after(self) -> bytes:
        return self.source.state_after()

    @classmethod
    def from_plitzer(cls, batch: PlitzerBatch, owner: Callable[[], Dataset | None] | None = None) -> Batch:
        """Wrap a loader batch: tokens through DLPack, boundaries from NumPy (no copy)."""
        return cls(
            tokens=from_dlpack(batch.tokens),
            position_ids=torch.from_numpy(batch.position_ids),
            cu_seqlens=torch.from_numpy(batch.cu_seqlens),
            max_seqlen=batch.max_seqlen,
            piece_lengths=torch.from_numpy(batch.piece_lengths),
            pieces_per_row=torch.from_numpy(batch.pieces_per_row),
            step=batch.step,
            epoch=batch.epoch,
            lanes=torch.from_numpy(batch.lanes),
            source=batch,
            columns={n: from_dlpack(c) for n, c in batch.columns.items()},
            mask=(torch.from_numpy(batch.mask) if batch.padded else _TRUE.expand(tuple(batch.tokens.shape))),
            labels=None if batch.labels is None else from_dlpack(batch.labels),
            cost=None if batch.cost is None else torch.from_numpy(batch.cost),
            _owner=owner,
        )

    def documents(self) -> pl.DataFrame:
        """The source (file, row group, row, token offset) of every piece of every row."""
        return self.source.documents()

    def to(self, device: torch.device | str | int, *, non_blocking: bool = False) -> Batch:
        """The same batch with every tensor on ``device`` (``lanes``, ``cost`` and the per-source counts stay)."""
        return adapt.map_tensors(self, lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> Batch:
        """A copy with every tensor in pinned (page-locked) host memory.

        ``DataLoader(pin_memory=True)`` calls this. It needs an accelerator:
        without one torch raises, as it does for a tensor.
        """
        return adapt.map_tensors(self, lambda t: t.contiguous().pin_memory())  # a concat mask is a broadcast view

    def __repr__(self) -> str:
        return (
            f"plitzer.torch.Batch(step={self.step}, epoch={self.epoch}, tokens={tuple(self.tokens.shape)} "
            f"{self.tokens.dtype}, lanes={self.lanes.tolist()}, pieces={len(self.cu_seqlens) - 1})"
        )


def _can_pin() -> bool:
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None:
        return bool(accelerator.is_available())
    return torch.cuda.is_available()


@document(exclude=("rank", "world"))
class Dataset(IterableDataset[Batch]):
    """The loader of one rank as a PyTorch ``IterableDataset``: one item per step.

    Parameters
    ----------
    <source>
    <settings>
    rank, world : int, optional
        This rank and the number of ranks. Default: ``torch.distributed``'s rank
        and world size in ``group`` when it is initialised, else 0 and 1. An
        explicit value wins (for example the data-parallel rank under tensor
        parallelism).
    pin_memory : bool
        Yield tensors in pinned memory (one copy per step). Without an
        accelerator this warns once and yields ordinary tensors.
    replicas : torch.distributed.ProcessGroup, optional
        This rank's model-parallel peers (tensor, context, pipeline): the group's rank 0 reads,
        packs and balances, and sends each step to the others, which read nothing (SPEC section
        19); ``group`` is then the data-parallel group. Not configuration.
    mesh, dp : DeviceMesh and str or tuple of str, optional
        ``group`` and ``replicas`` from a ``DeviceMesh``: ``dp`` names its data-parallel
        dimensions (e.g. ``("dp_replicate", "dp_shard")``), the others are the replica's.
    group : torch.distributed.ProcessGroup, optional
        The group to read rank and world from, gather checkpoints and (``balance=True``, on a gloo
        group of the loader's own) deal steps over (default: the whole world). Ranks of the group that
        share a data rank (tensor or pipeline parallel replicas) must be at the same position.

    Iteration
    ---------
    ``for batch in dataset`` (or a ``DataLoader(dataset, batch_size=None,
    num_workers=0)`` over it) yields the rest of the current epoch; the next loop
    gives the next epoch, so ``while dataset.epoch < 3: for batch in loader: ...``
    runs three epochs, also right after ``load_state_dict``. There is no
    ``set_epoch``: the epoch is part of the position.

    ``len(dataset)`` is a finite run's steps (``epochs``; the loop after its last step starts it
    again); a run without end has none on purpose: DataLoader (and torchdata's
    StatefulDataLoader, which carries its count of yielded items across a resume) warns when
    an IterableDataset yields more than its length. ``steps_in_epoch(e)``: any epoch's steps.

    State
    -----
    ``state_dict()`` is ``{"checkpoint": bytes, "step": int, "epoch": int}`` for
    the next batch this dataset gives. It is collective when ``world > 1``:
    call it on every rank at the same step. ``load_state_dict`` takes that dict,
    the bytes, or the bytes as a uint8 tensor, on any world size.
    """

    def __init__(
        self,
        source: Source,
        *,
        pin_memory: bool = False,
        group: dist.ProcessGroup | None = None,
        replicas: dist.ProcessGroup | None = None,
        mesh: Any = None,
        dp: str | Sequence[str] | None = None,
        **settings: Unpack[Keywords],
    ) -> None:
        super().__init__()
        if mesh is not None or dp is not None:  # SPEC section 19: the groups from the trainer's mesh
            group, replicas = groups_of_mesh(mesh, dp, group, replicas)
        self._group = group
        kw: dict[str, Any] = dict(settings)
        rank, world = kw.pop("rank", None), kw.pop("world", None)
        if torch_ready():
            rank = dist.get_rank(group) if rank is None else rank
            world = dist.get_world_size(group) if world is None else world
        elif group is not None:
            msg = "group= was given but torch.distributed is not initialised; call init_process_group first"
            raise ConfigError(msg)
        cfg = LoaderSettings.of(
            caller="plitzer.torch.Dataset",
            own=("pin_memory", "group", "replicas", "mesh", "dp"),
            rank=0 if rank is None else rank,
            world=1 if world is None else world,
            **kw,
        )
        link = replica.Link(replicas) if replicas is not None and dist.get_world_size(replicas) > 1 else None
        self._loader: Loader | replica.Reader | replica.Follower
        if link is not None and link.rank > 0:  # a replica's other rank: its reader sends each step
            self._loader = replica.Follower(link, cfg)
        else:
            shared = TorchGroup(group) if torch_ready() and dist.get_world_size(group) > 1 else None
            if shared is not None:
                source = share_source(source, cfg, shared)
            # balance=True deals each step over the group (on a gloo group of the loader's own).
            loader = Loader.from_settings(source, cfg, group=shared)
            self._loader = loader if link is None else replica.Reader(link, loader)
        self._pin = bool(pin_memory)
        if self._pin and not _can_pin():
            warnings.warn(adapt.NOT_PINNED, UserWarning, stacklevel=2)
            self._pin = False

    # -- the loader's view --------------------------------------------------------

    @property
    def loader(self) -> Any:
        """The underlying :class:`plitzer.Loader` (settings, plan, held_bytes, reads).

        With ``replicas=``: on the reader, its loader as :class:`plitzer.state.replica.Reader`
        (the loader's attributes); elsewhere a :class:`~plitzer.state.replica.Follower`, which
        answers a loader's position questions from what the reader sent.
        """
        return self._loader

    @property
    def rank(self) -> int:
        return self._loader.settings.rank

    @property
    def world(self) -> int:
        return self._loader.settings.world

    @property
    def epoch(self) -> int:
        """Epoch label of the next batch."""
        return self._loader.epoch

    @property
    def step(self) -> int:
        """Global step of the next batch."""
        return self._loader.step

    # -- iteration ---------------------------------------------------------------

    def __iter__(self) -> Iterator[Batch]:
        """The rest of the current epoch; the next loop gives the next epoch."""
        info = get_worker_info()
        if info is not None:
            raise ConfigError(adapt.in_worker(info.id, info.num_workers, self._loader.settings.threads))
        if self._loader.ended:  # a finite run, given whole: again from step 0
            self._loader.seek(0)
        return self._epoch(self._loader.epoch)

    def _epoch(self, epoch: int) -> Iterator[Batch]:
        loader = self._loader
        while loader.epoch == epoch and not loader.ended:
            yield self.next_batch()

    def __len__(self) -> int:
        """A finite run's steps (``epochs``); a run without end has none (TypeError)."""
        return adapt.run_length(self._loader.run.steps)

    def steps_in_epoch(self, epoch: int) -> int:
        """The steps whose epoch label is ``epoch`` (:meth:`plitzer.Loader.steps_in_epoch`)."""
        return self._loader.steps_in_epoch(epoch)

    def next_batch(self) -> Batch:
        """The batch of the next step, whatever its epoch."""
        b = self._loader.next_batch()
        out = Batch.from_plitzer(b, weakref.ref(self))
        return out.pin_memory() if self._pin else out

    def _give_back(self, steps: Sequence[int]) -> None:
        """Take back ``steps`` when they are the last steps this dataset gave, in order: seek to the first.

        A collate refused them (``DataLoader(dataset)`` with a batch_size), so the next
        batch, and ``state_dict()``, are those of the first refused step again.
        """
        first = steps[0]
        if list(steps) == list(range(first, first + len(steps))) and self.step == first + len(steps):
            self._loader.seek(first)

    # -- state -------------------------------------------------------------------

    def state_dict(self, *, after: Batch | None = None) -> dict[str, Any]:
        """One global checkpoint: ``{"checkpoint": bytes, "step": int, "epoch": int}``.

        Without ``after``: the position of the next batch this dataset gives.
        With ``after=batch``: the position right after ``batch`` (a batch this
        dataset yielded), whatever was fetched since: use it when the training
        loop prefetches. Collective when ``world > 1``: every rank calls it at
        the same step; all get the same result.
        """
        if after is None:
            part = self._loader.checkpoint()
        elif isinstance(after, Batch):
            part = after.state_after
        else:
            msg = f"state_dict(after=...) takes a plitzer.torch.Batch this dataset yielded, got {type(after).__name__}"
            raise ConfigError(msg)
        state = self._gather(part)
        step = ckpt.decode(state).step
        return {
            "checkpoint": state,
            "step": step,
            "epoch": self._loader.run.epoch_of(step),
        }

    def set_weights(self, weights: Mapping[str, Any] | None, at_step: int | None = None) -> int:
        """Append a stage to the mixture (:meth:`plitzer.Loader.set_weights`); the step it starts at.

        Collective when ``world > 1``: every rank calls it at the same step with the
        same weights and ``at_step``. One small all-gather (the step, ``at_step`` and a
        hash of the weights: six int64 per process) checks that; a mismatch is a
        ConfigError on every rank naming what each rank asked for, and no rank changes
        its mixture.
        """
        if self.world > 1 and torch_ready():
            same_weights_call(self.step, weights, at_step, self._all_gather_ints)
        return self._loader.set_weights(weights, at_step)

    def set_layout(self, lanes: int | None = None, seq_len: int | None = None, at_step: int | None = None) -> int:
        """Append a layout stage (:meth:`plitzer.Loader.set_layout`); the step it starts at.

        From that step the batches are ``(lanes // world, seq_len)`` (docs/torch.md, "Layout
        stages"). Collective when ``world > 1``, as :meth:`set_weights`: one all-gather of
        ``[step, lanes, seq_len, at_step]`` checks that every rank makes the same call at the
        same step; a mismatch is a ConfigError on every rank naming each rank's call, and no
        rank changes its layout.
        """
        if self.world > 1 and torch_ready():
            same_layout_call(self.step, lanes, seq_len, at_step, self._all_gather_ints)
        return self._loader.set_layout(lanes, seq_len, at_step)

    def _all_gather_ints(self, values: list[int]) -> list[tuple[int, ...]]:
        """Every rank's ``values`` (int64, the same length on each), in rank order."""
        return TorchGroup(self._group).ints_of_all(values)

    def load_state_dict(self, state: Mapping[str, Any] | bytes | bytearray | memoryview | torch.Tensor) -> None:
        """Resume from a ``state_dict()`` (or its bytes) taken at any world size."""
        self._loader.resume(_checkpoint_bytes(state))

    def _gather(self, part: bytes) -> bytes:
        world = self.world
        if world == 1:
            return part
        if not torch_ready():
            raise ConfigError(adapt.no_gather(world))
        return TorchGroup(self._group).merge_parts(part, self.rank, world)

    # -- lifecycle ---------------------------------------------------------------

    def close(self) -> None:
        """Stop the reader threads and free every buffer."""
        self._loader.close()

    def __enter__(self) -> Dataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> object:
        raise ConfigError(adapt.NOT_COPIED)

    def __repr__(self) -> str:
        s = self._loader.settings
        return (
            f"plitzer.torch.Dataset(step={self.step}, epoch={self.epoch}, lanes={s.lanes}, seq_len={s.seq_len}, "
            f"window={s.window}, rank={s.rank}, world={s.world})"
        )


def _checkpoint_bytes(state: object) -> bytes:
    state = adapt.checkpoint_entry(state, "a plitzer.torch state dict")
    if isinstance(state, torch.Tensor):
        if state.dtype != torch.uint8 or state.dim() != 1:
            msg = f"a checkpoint tensor is 1-D uint8, got {state.dim()}-D {state.dtype}"
            raise CheckpointError(msg)
        return bytes(state.detach().cpu().numpy())
    if isinstance(state, (bytes, bytearray, memoryview)):
        return bytes(state)
    msg = f"load_state_dict() takes what state_dict() returned (or its bytes), got {type(state).__name__}"
    raise CheckpointError(msg)


def _refuse_collate(batch: Sequence[Batch], *, collate_fn_map: Any = None) -> Any:
    """Give the steps of ``batch`` back to the dataset that gave them, then refuse to collate them.

    A DataLoader with a batch_size (its default is 1) takes that many steps from the
    Dataset before its collate sees one, so the refusal would come a step late; giving
    them back leaves the Dataset where it was before that DataLoader started.
    """
    owners: dict[int, tuple[Dataset, list[int]]] = {}
    for b in batch:
        ds = b._owner() if isinstance(b, Batch) and b._owner is not None else None
        if ds is not None:
            owners.setdefault(id(ds), (ds, []))[1].append(b.step)
    for ds, steps in owners.values():
        ds._give_back(steps)
    return refuse_collate(batch, collate_fn_map=collate_fn_map)


# torch's default_collate dispatches on the element's type: a plitzer Batch is one
# whole step and must not be collated (docs/torch.md, "A batch size is refused too").
default_collate_fn_map[Batch] = _refuse_collate
