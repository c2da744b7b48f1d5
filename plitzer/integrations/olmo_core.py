"""OLMo-core: plitzer as its data loader (docs/trainers/olmo-core.md).

- :class:`PlitzerDataLoaderConfig` (registered as ``"plitzer"``): OLMo-core's
  ``global_batch_size`` (tokens) and ``sequence_length`` give plitzer's ``lanes =
  global_batch_size / sequence_length`` and ``seq_len``; every other plitzer setting is a
  field. ``build(mesh=...)`` (or ``dp_process_group=``) takes the data-parallel rank and degree
  from the mesh's ``dp`` dimensions, as OLMo-core's own loaders do.
- :class:`PlitzerDataLoader` (a ``TextDataLoaderBase``): batches ``{"input_ids", "labels"}``,
  int64, with plitzer's labels (``-100`` at a document's last token and on padding; rows stay
  ``sequence_length`` tokens), and with ``generate_doc_lengths=True`` OLMo-core's
  document-masking inputs ``doc_lens`` (each row's document lengths, padded with 0) and
  ``max_doc_lens``. OLMo-core's epochs (from 1) are plitzer's (from 0) plus one;
  ``total_batches`` is the steps of the current epoch (plitzer's epochs differ by a step or
  so). Its ``state_dict`` is plitzer's global checkpoint, kept in OLMo-core's trainer state,
  and resumes on any data-parallel degree.
- :class:`PlitzerEvaluatorCallbackConfig`: an in-loop evaluation on a plitzer source, read in
  storage order, one pass (``shuffle=False, epochs=1``), the same batches every time.
- :class:`PlitzerMetricsCallbackConfig`: per-source figures as the trainer's metrics, and steering (SPEC 20).

This is the only module of plitzer that imports OLMo-core.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from olmo_core.data.collator import DataCollator
from olmo_core.data.data_loader import DataLoaderConfig, TextDataLoaderBase
from olmo_core.distributed.parallel import get_dp_process_group
from olmo_core.distributed.utils import get_rank, get_world_size
from olmo_core.eval.lm_evaluator import LMEvaluator
from olmo_core.nn.lm_head import LMHead, LMLossImplementation
from olmo_core.train.callbacks.callback import Callback, CallbackConfig
from olmo_core.train.callbacks.evaluator_callback import EvaluatorCallback
from olmo_core.train.common import ReduceType
from torch.distributed.device_mesh import DeviceMesh

import plitzer.torch
from planner.errors import ConfigError
from plitzer.integrations.feed import Feed, metric_names
from plitzer.integrations.settings import Settings
from plitzer.integrations.shared import VALIDATION, labels_of, open_dataset, resume
from plitzer.readpath.labels import IGNORE_INDEX

__all__ = [
    "PlitzerDataLoader",
    "PlitzerDataLoaderConfig",
    "PlitzerEvaluatorCallbackConfig",
    "PlitzerLMEvaluator",
    "PlitzerMetricsCallback",
    "PlitzerMetricsCallbackConfig",
    "batch_of",
]


def batch_of(batch: plitzer.torch.Batch, *, doc_lengths: bool = False, labels: bool = True) -> dict[str, Any]:
    """OLMo-core's batch of a plitzer batch: ``input_ids`` and ``labels`` (int64), ``doc_lens`` and ``max_doc_lens``."""
    out: dict[str, Any] = {"input_ids": batch.tokens.long()}
    if labels:
        out["labels"] = labels_of(batch)
    if doc_lengths:
        lens = torch.nn.utils.rnn.pad_sequence(list(batch.doc_lengths), batch_first=True)
        out["doc_lens"] = lens
        out["max_doc_lens"] = lens.max(dim=1).values.tolist()
    return out


class PlitzerDataLoader(TextDataLoaderBase):
    """A plitzer.torch.Dataset as OLMo-core's data loader (build it with :class:`PlitzerDataLoaderConfig`).

    ``restart``: every epoch (``reshuffle``) starts at its first step, whatever was read of it:
    an evaluation's loader, which gives the same batches every time. ``tokens_processed`` and
    the trainer's tokens seen are the run's real tokens (:class:`plitzer.integrations.feed.Feed`:
    no padding under best-fit, every layout stage's own size). ``steer``: the feed's steering
    controller, which :class:`PlitzerMetricsCallback` feeds (a run without it is refused).
    """

    _epoch: int | None  # OLMo-core's epoch (from 1), set by reshuffle

    def __init__(
        self,
        dataset: plitzer.torch.Dataset,
        *,
        generate_doc_lengths: bool = False,
        restart: bool = False,
        labels: bool = True,
        work_dir: str | None = None,
        collator: DataCollator | None = None,
        steer: int = 0,
        rule: str = "exp3",
    ) -> None:
        loader = dataset.loader
        super().__init__(
            collator=collator or DataCollator(pad_token_id=int(loader.settings.pad_id)),
            work_dir=work_dir or tempfile.gettempdir(),
            global_batch_size=loader.lanes * loader.seq_len,
            dp_world_size=dataset.world,
            dp_rank=dataset.rank,
        )
        self.dataset = dataset
        self.feed = Feed(dataset, restart=restart, steer=steer, rule=rule)
        self.generate_doc_lengths = generate_doc_lengths
        self.restart = restart
        self.labels = labels
        self.last: plitzer.torch.Batch | None = None  # the batch handed out last (the metrics callback's)
        self._last_tokens: int | None = None
        self.metrics: PlitzerMetricsCallback | None = None  # the callback that reads and steers it
        self.max_sequence_length: int | None = None  # the train module's (the callback sets it)

    @property
    def total_batches(self) -> int | None:
        """The steps of the current epoch (None before ``reshuffle``)."""
        return None if self._epoch is None else self.batches_in_epoch(self._epoch)

    def batches_in_epoch(self, epoch: int) -> int:
        """The steps of OLMo-core's epoch ``epoch`` (from 1): plitzer's ``epoch - 1``."""
        return self.feed.steps_in_epoch(epoch - 1)

    def __len__(self) -> int:
        return int(self.total_batches or 0)

    def reshuffle(self, epoch: int | None = None, **kwargs: Any) -> None:
        """Start OLMo-core's ``epoch`` (from 1): where the dataset is if inside it, else at its first step."""
        del kwargs
        epoch = (self._epoch or 0) + 1 if epoch is None else epoch
        if epoch < 1:
            msg = f"reshuffle(epoch={epoch}): OLMo-core counts epochs from 1"
            raise ConfigError(msg)
        resumed = self._epoch == epoch and not self.restart  # load_state_dict set the epoch's tokens
        self._epoch = epoch
        self.batches_processed = self.feed.start_epoch(epoch - 1)
        if not resumed:
            first = self.dataset.step - self.batches_processed
            self.tokens_processed = 0 if self.feed.pads else self.feed.slots(first, self.dataset.step)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """The local batches (OLMo-core's ``DataLoaderBase.__iter__``: not its text loader's fixed-size count)."""
        for batch in self._iter_batches():
            self.batches_processed += 1
            yield batch

    def _iter_batches(self) -> Iterable[dict[str, Any]]:
        """Each step's batch; its real tokens are counted (``tokens_processed``, the trainer's tokens seen)."""
        if self.feed.mixer is not None and self.metrics is None:
            msg = (
                f"steer={self.feed.mixer.every}: the per-source losses that steer the mixture come from plitzer's "
                'metrics callback: add .with_callback("plitzer", PlitzerMetricsCallbackConfig()) to the TrainerConfig'
            )
            raise ConfigError(msg)
        for batch in self.feed:
            rows, seq_len = batch.tokens.shape
            if rows * seq_len != self.rank_batch_size:
                raise ConfigError(_fixed_size(self.rank_batch_size, rows, seq_len, batch.step))
            self._last_tokens = self.feed.step_tokens(batch)
            self.tokens_processed += self._last_tokens
            self.last = batch
            yield self._batch(batch)

    def _batch(self, batch: plitzer.torch.Batch) -> dict[str, Any]:
        return batch_of(batch, doc_lengths=self.generate_doc_lengths, labels=self.labels)

    def global_num_tokens_in_batch(self, batch: dict[str, Any]) -> int | None:
        """The real tokens of the global batch handed out last (no padding): the trainer's tokens seen."""
        del batch
        return self._last_tokens

    def set_layout(self, lanes: int | None = None, seq_len: int | None = None, at_step: int | None = None) -> int:
        """A layout stage that keeps OLMo-core's tokens a step (``global_batch_size``): half the rows, twice as long.

        OLMo-core fixes the tokens of a step when it builds its train module; another size is
        refused here, before any rank changes its layout.
        """
        last = self.dataset.loader.layout.stages[-1]
        b, n = last.lanes if lanes is None else lanes, last.seq_len if seq_len is None else seq_len
        if b * n != self.global_batch_size:
            raise ConfigError(_fixed_size(self.global_batch_size, b, n, at_step, per="global"))
        _check_length(n, self.max_sequence_length, "a layout stage's sequence_length")
        return self.dataset.set_layout(lanes, seq_len, at_step)

    def state_dict(self) -> dict[str, Any]:
        """plitzer's global checkpoint (collective over the data-parallel group), OLMo-core's epoch, tokens seen."""
        ck = self.dataset.state_dict()["checkpoint"]
        return {"plitzer": ck, "epoch": self._epoch, "tokens_processed": self.tokens_processed}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`, taken on any data-parallel degree."""
        L = self.dataset.loader.seq_len
        resume(self.dataset, state_dict["plitzer"], batch="global_batch_size", seq_len="sequence_length", unit=L)
        self._epoch = state_dict.get("epoch")
        if self._epoch is not None:
            first = self.feed.epoch_start(self._epoch - 1)
            self.batches_processed = self.dataset.step - first
            slots = self.feed.slots(first, self.dataset.step)
            self.tokens_processed = int(state_dict.get("tokens_processed", slots))

    def get_mock_batch(self) -> dict[str, Any]:
        """A batch of the right shape (token 0 everywhere; one document a row): the trainer's dry run."""
        rows, seq_len = self.rank_batch_size // self.dataset.loader.seq_len, self.dataset.loader.seq_len
        out: dict[str, Any] = {"input_ids": torch.zeros((rows, seq_len), dtype=torch.int64)}
        if self.labels:
            out["labels"] = torch.zeros((rows, seq_len), dtype=torch.int64)
        if self.generate_doc_lengths:
            out["doc_lens"] = torch.full((rows, 1), seq_len, dtype=torch.int64)
            out["max_doc_lens"] = [seq_len] * rows
        return out


def _fixed_size(want: int, rows: int, seq_len: int, step: int | None, per: str = "rank") -> str:
    at = "" if step is None else f" at step {step}"
    return (
        f"OLMo-core fixes the tokens of a step when it builds the trainer ({want:,d} a {per}), and a layout stage"
        f"{at} gives {rows} sequences of {seq_len} tokens ({rows * seq_len:,d}): change sequence_length with "
        "global_batch_size so that their product stays the same (e.g. half the sequences, twice as long), "
        "or start a new run for another size"
    )


def _check_length(seq_len: int, limit: int | None, what: str) -> None:
    """Refuse sequences longer than the train module's ``max_sequence_length`` (None: not known)."""
    if limit is not None and seq_len > limit:
        msg = (
            f"{what} is {seq_len} tokens and the train module's max_sequence_length is {limit}: give the data "
            f"loader sequence_length <= {limit}, or build the train module with max_sequence_length >= {seq_len}"
        )
        raise ConfigError(msg)


def _dp_group(mesh: DeviceMesh | None, group: dist.ProcessGroup | None) -> dist.ProcessGroup | None:
    return get_dp_process_group(mesh) if group is None and mesh is not None else group


def _lanes(global_batch_size: int, sequence_length: int, world: int) -> int:
    lanes, rest = divmod(global_batch_size, sequence_length)
    if rest or lanes < 1 or lanes % world:
        msg = (
            f"global_batch_size={global_batch_size} tokens is not a multiple of sequence_length={sequence_length} "
            f"times the data-parallel degree {world}: plitzer's lanes are global_batch_size / sequence_length "
            "sequences, dealt evenly to the ranks"
        )
        raise ConfigError(msg)
    return lanes


@DataLoaderConfig.register("plitzer")
@dataclass(kw_only=True)
class PlitzerDataLoaderConfig(DataLoaderConfig, Settings):
    """plitzer's data loader config for OLMo-core: global_batch_size (tokens) and sequence_length, the data
    (source, or mixture: a mixture file), generate_doc_lengths (doc_lens and max_doc_lens for document
    masking), and every plitzer parameter but lanes, seq_len, rank and world, which these and the mesh give."""

    global_batch_size: int = 0
    """Tokens a global step: plitzer's lanes are global_batch_size / sequence_length."""
    sequence_length: int = 0
    """Tokens a sequence (plitzer's seq_len); at most the model's."""
    generate_doc_lengths: bool = False
    """Give doc_lens and max_doc_lens (intra-document masking)."""
    work_dir: str | None = None
    """OLMo-core's work folder (default: the system's temporary folder)."""

    def build(
        self, *, mesh: DeviceMesh | None = None, dp_process_group: dist.ProcessGroup | None = None
    ) -> PlitzerDataLoader:
        """The data loader of this config for this data-parallel rank (``mesh``'s ``dp`` dimensions, or the group)."""
        group = _dp_group(mesh, dp_process_group)
        world, rank = get_world_size(group), get_rank(group)
        dataset = open_dataset(
            self,
            lanes=_lanes(self.global_batch_size, self.sequence_length, world),
            seq_len=self.sequence_length,
            rank=rank,
            world=world,
            group=group,
        )
        return PlitzerDataLoader(
            dataset,
            generate_doc_lengths=self.generate_doc_lengths,
            work_dir=self.work_dir,
            steer=self.steer,
            rule=self.steer_rule,
        )


class PlitzerLMEvaluator(LMEvaluator):
    """OLMo-core's LM evaluator (cross-entropy and perplexity) over a plitzer loader, scored on plitzer's labels.

    OLMo-core's evaluator callback makes its labels by shifting ``input_ids`` within a row; this
    evaluator keeps the losses where plitzer's label agrees (not at a document's last token nor
    on padding), which leaves out only each row's last token, whose target another row holds.
    """

    def __init__(self, *, name: str, batches: PlitzerDataLoader, device: torch.device | None = None) -> None:
        super().__init__(name=name, batches=batches, labels=[name], device=device, deterministic=True)
        self._name = name
        self._labels: torch.Tensor | None = None

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for batch in super().__iter__():
            self._labels = batch.pop("plitzer_labels")
            yield batch

    def update_metrics(self, batch: dict[str, Any], ce_loss: torch.Tensor | None, logits: torch.Tensor | None) -> None:
        if ce_loss is None or self._labels is None:
            return
        keep = self._labels != IGNORE_INDEX
        keep[:, -1] = False
        self.metrics[self._name].update(ce_loss[keep.to(ce_loss.device)])


class _EvalLoader(PlitzerDataLoader):
    """An evaluation's loader: plitzer's labels under a key the model is not given."""

    def _batch(self, batch: plitzer.torch.Batch) -> dict[str, Any]:
        out = batch_of(batch, doc_lengths=self.generate_doc_lengths, labels=False)
        out["plitzer_labels"] = labels_of(batch)
        return out


@dataclass(kw_only=True)
class PlitzerEvaluatorCallbackConfig(CallbackConfig, Settings):
    """An in-loop evaluation on plitzer data for OLMo-core's trainer: name (the metrics' prefix), the data (source
    or mixture), lanes and sequence_length (0: the training loader's), the evaluator callback's own settings,
    and every plitzer parameter, shuffle=False and epochs=1 by default (SPEC section 17)."""

    name: str = "plitzer"
    """The metrics' prefix."""
    lanes: int = 0
    """Sequences a global step (0: the training loader's)."""
    sequence_length: int = 0
    """Tokens a sequence (0: the training loader's)."""
    generate_doc_lengths: bool = False
    """Give doc_lens and max_doc_lens (intra-document masking)."""
    eval_interval: int | None = 1000
    eval_on_startup: bool = False
    eval_on_finish: bool = False
    log_interval: int = 5
    enabled: bool = True
    shuffle: bool = VALIDATION["shuffle"]
    """Storage order (SPEC section 17): the same batches at every evaluation."""
    epochs: int | None = VALIDATION["epochs"]
    """One pass."""

    def build(self, trainer: Any) -> Callback | None:
        """The evaluator callback: this config's data, as many sequences a step as the training loader's."""
        if not self.enabled:
            return None
        if self.steer:
            msg = f"{self.name}: steer={self.steer} on an evaluation; steering is the training data loader's setting"
            raise ConfigError(msg)
        train = trainer.data_loader
        group = trainer.dp_process_group
        world, rank = get_world_size(group), get_rank(group)
        seq_len = self.sequence_length or train.dataset.loader.seq_len
        lanes = self.lanes or train.dataset.loader.lanes
        limit = getattr(trainer.train_module, "max_sequence_length", None)
        _check_length(seq_len, limit, f"the evaluation {self.name}'s sequence_length")
        dataset = open_dataset(self, lanes=lanes, seq_len=seq_len, rank=rank, world=world, group=group)
        loader = _EvalLoader(dataset, generate_doc_lengths=self.generate_doc_lengths, restart=True, labels=False)
        return EvaluatorCallback(
            evaluators=[PlitzerLMEvaluator(name=self.name, batches=loader, device=trainer.device)],
            eval_interval=self.eval_interval,
            eval_on_startup=self.eval_on_startup,
            eval_on_finish=self.eval_on_finish,
            log_interval=self.log_interval,
        )


class PlitzerMetricsCallback(Callback):
    """plitzer's figures through OLMo-core's metrics each step, and the steering controller fed (SPEC section 20).

    Records ``plitzer/tokens/NAME`` and ``plitzer/targets/NAME`` (real tokens and targets of
    each source; summed over the ranks), ``plitzer/padding`` (summed), ``plitzer/wait_s`` (the
    consumer's wait, the slowest rank's) and, with ``losses``, ``plitzer/loss/NAME`` (each
    source's mean cross-entropy on its targets in the step). OLMo-core's train module asks its
    LM head for a summed loss and no logits; a forward hook on the head's output projection
    takes the logits it makes anyway and computes each token's loss again, without gradient
    (docs/trainers/olmo-core.md, "Metrics and steering"). With the loader's ``steer``, each step's
    per-source sums and counts, all-reduced over the data-parallel group, go to the controller
    before the checkpointer saves. Sequences over the train module's ``max_sequence_length`` are refused.
    """

    priority: ClassVar[int] = 2  # before the checkpointer (1): its checkpoint holds the step's observation

    def __init__(self, *, losses: bool = True) -> None:
        self.losses = losses
        self.loader: PlitzerDataLoader | None = None
        self._on = False  # between pre_step and post_train_batch: the step's forward passes
        self._labels: torch.Tensor | None = None  # the micro-batch's labels, as the LM head takes them
        self._parts: list[torch.Tensor] = []  # the step's micro-batches' per-token losses, in order
        self._hooked = False

    def pre_train(self) -> None:
        """Check the sequence length against the train module's; hook the LM head (``losses`` or ``steer``)."""
        loader = self.trainer.data_loader
        if not isinstance(loader, PlitzerDataLoader):
            msg = f"PlitzerMetricsCallback reads plitzer's data loader (PlitzerDataLoaderConfig), not {type(loader)}"
            raise ConfigError(msg)
        limit = getattr(self.trainer.train_module, "max_sequence_length", None)
        for stage in loader.dataset.loader.layout.stages:
            _check_length(int(stage.seq_len), limit, "the data loader's sequence_length")
        self.loader, loader.max_sequence_length, loader.metrics = loader, limit, self
        if self._hooked or not (self.losses or loader.feed.mixer):
            return
        head, why = _lm_head(self.trainer.train_module.model)
        if head is None and loader.feed.mixer is not None:
            msg = f"steer={loader.feed.mixer.every} needs per-token losses, and {why}: see docs/steering.md"
            raise ConfigError(msg)
        if head is None:
            self.losses = False
            return
        head.register_forward_pre_hook(self._take_labels, with_kwargs=True)
        head.w_out.register_forward_hook(self._token_losses)  # inert outside a training step's forward passes
        self._hooked = True

    def _take_labels(self, module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        self._labels = kwargs.get("labels") if self._on else None

    def _token_losses(self, module: Any, args: Any, logits: torch.Tensor) -> None:
        labels, self._labels = self._labels, None
        if labels is not None:
            with torch.no_grad():
                flat = logits.detach().reshape(-1, logits.shape[-1]).float()
                loss = torch.nn.functional.cross_entropy(flat, labels.reshape(-1), reduction="none")
            self._parts.append(loss.view(labels.shape))

    def pre_step(self, batch: dict[str, Any]) -> None:
        self._on, self._parts = True, []

    def post_train_batch(self) -> None:
        """Record this rank's figures of the step (OLMo-core reduces them); feed the controller."""
        self._on, loader = False, self.loader
        assert loader is not None  # pre_train set it
        feed, batch = loader.feed, loader.last
        for name, value in feed.metrics().items():
            self.trainer.record_metric(name, value, ReduceType.max if name == "plitzer/wait_s" else ReduceType.sum)
        if batch is None or not (self.losses or feed.mixer):
            return
        sums, counts = self._source_losses(feed, batch)
        if self.losses:
            for n, s in zip(metric_names(feed.dataset.loader.sources), sums.tolist(), strict=True):
                self.trainer.record_metric(f"plitzer/loss_sum/{n}", s, ReduceType.sum)
        if feed.mixer is not None:
            both = torch.stack([sums, counts.to(sums.device, torch.float64)])
            group = self.trainer.dp_process_group
            if dist.is_initialized() and get_world_size(group) > 1:
                dist.all_reduce(both, group=group)  # equal on every rank
            feed.observe(batch.step, both[0], both[1])

    def _source_losses(self, feed: Feed, batch: plitzer.torch.Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's per-source loss sums and target counts of the step (0 where the trainer skipped it)."""
        parts, self._parts = self._parts, []
        if not parts:
            k = len(feed.dataset.loader.sources)
            return torch.zeros(k, dtype=torch.float64), torch.zeros(k, dtype=torch.int64)
        losses = torch.cat(parts)
        if losses.shape != batch.tokens.shape:
            msg = f"the LM head's per-token losses, {tuple(losses.shape)}, are not the rows {tuple(batch.tokens.shape)}"
            raise ConfigError(msg)
        return feed.source_losses(batch, losses)

    def pre_log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        """Each source's mean loss: its summed loss over its targets, both summed over the ranks."""
        del step
        for key in [k for k in metrics if k.startswith("plitzer/loss_sum/")]:
            name = key.removeprefix("plitzer/loss_sum/")
            total, targets = metrics.pop(key), metrics.get(f"plitzer/targets/{name}", 0.0)
            if targets > 0:
                metrics[f"plitzer/loss/{name}"] = total / targets


def _lm_head(model: torch.nn.Module) -> tuple[LMHead | None, str]:
    """The model's LM head where a hook can take its logits, else why not."""
    heads = [m for m in model.modules() if isinstance(m, LMHead)]
    if len(heads) != 1 or type(heads[0]) is not LMHead:
        return None, f"the model's LM heads are {[type(h).__name__ for h in heads]} (plitzer hooks one LMHead)"
    head = heads[0]
    if head.loss_implementation != LMLossImplementation.default:
        return None, f"the LM head's loss_implementation={head.loss_implementation} makes no logits (use 'default')"
    if head.tp_enabled or head.cp_enabled:
        return None, "the LM head is tensor- or context-parallel (each rank holds part of the logits or sequence)"
    return head, ""


@dataclass(kw_only=True)
class PlitzerMetricsCallbackConfig(CallbackConfig):
    """plitzer's per-source metrics and steering for OLMo-core's trainer (:class:`PlitzerMetricsCallback`):
    ``.with_callback("plitzer", PlitzerMetricsCallbackConfig())``."""

    losses: bool = True
    """Per-source losses (a hook on the LM head's logits: one more cross-entropy a step, without gradient)."""
    enabled: bool = True

    def build(self, trainer: Any) -> Callback | None:
        """The callback (None when not enabled: then a loader with steer is refused at its first batch)."""
        del trainer
        return PlitzerMetricsCallback(losses=self.losses) if self.enabled else None
