"""torchtitan: plitzer as its data loader (docs/trainers/torchtitan.md).

Every torchtitan config, fed by plitzer, is a function of this module: ``--module
plitzer.integrations.torchtitan --config llama3_debugmodel`` is torchtitan's
``llama3_debugmodel`` with :func:`with_plitzer` applied, so every plitzer setting is a
``--dataloader.*`` option of torchtitan's command line::

    torchrun --nproc-per-node 8 -m torchtitan.train --module plitzer.integrations.torchtitan \\
        --config llama3_8b --dataloader.source s3://bucket/fineweb-edu --dataloader.window 64

- :class:`PlitzerDataLoader` (a ``BaseDataLoader``): ``lanes = local_batch_size *
  dp_world_size`` and ``rank = dp_rank`` (torchtitan's ``batch`` mesh), ``seq_len`` the
  trainer's. Its items are torchtitan's ``({"input": tokens, "positions": position_ids},
  labels)``, int64, with plitzer's labels (``-100`` at each document's last token and on
  padding; rows stay ``seq_len`` tokens) and per-document positions, which torchtitan turns
  into its block-causal masks (flex and varlen attention). It is ``Stateful``: torchtitan's
  checkpointer puts plitzer's global checkpoint into its DCP checkpoint, and a resume on
  another data-parallel degree continues the same global batches.
- :class:`NullTokenizer`: torchtitan builds a tokenizer in every run; for pre-tokenized data
  this one needs no files (plitzer's ``tokenizer=`` reads text sources).
- The validator's loader is a plitzer loader of ``--validator.dataloader.source``, in storage
  order and one pass (SPEC section 17), built afresh at every evaluation.
- :class:`PlitzerMetricsProcessor` (``config.metrics``) logs plitzer's figures through
  torchtitan's own metrics at its log steps (SPEC section 20 item 3): per-source tokens and
  targets, padding and the wait, summed (the wait: maxed) over the data-parallel ranks, and
  per-source loss, which :class:`PlitzerLoss` (``config.loss``: torchtitan's cross-entropy,
  with its per-token losses kept) gives on the data-parallel path; ``--dataloader.steer N``
  steers the mixture from it (:class:`plitzer.mixing.Online`).

This is the only module of plitzer that imports torchtitan.
"""

from __future__ import annotations

import importlib
import pkgutil
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from typing import Any, ClassVar

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torchtitan.models
from torch.distributed.tensor import DTensor
from torchtitan.components.dataloader import BaseDataLoader
from torchtitan.components.loss import IGNORE_INDEX, CrossEntropyLoss
from torchtitan.components.metrics import MetricsProcessor
from torchtitan.components.tokenizer import BaseTokenizer
from torchtitan.tools import utils as titan_utils
from torchtitan.trainer import Trainer

import plitzer.torch
from planner.errors import ConfigError
from plitzer.integrations.feed import Feed, metric_names
from plitzer.integrations.settings import BaseSettings
from plitzer.integrations.shared import VALIDATION, labels_of, lanes_of, open_dataset, resume

__all__ = ["NullTokenizer", "PlitzerDataLoader", "PlitzerLoss", "PlitzerMetricsProcessor", "batch_of", "with_plitzer"]


def batch_of(batch: plitzer.torch.Batch) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """torchtitan's item of a plitzer batch: ``({"input": tokens, "positions": position_ids}, labels)``, int64."""
    return {"input": batch.tokens.long(), "positions": batch.position_ids.long()}, labels_of(batch)


class PlitzerDataLoader(BaseDataLoader):
    """plitzer as torchtitan's data loader: one item per micro-batch, this data-parallel rank's rows.

    ``config.build(dp_world_size=, dp_rank=, tokenizer=, seq_len=, local_batch_size=)``, as the
    trainer and the validator call it. ``state_dict()`` is collective over the default process
    group (DCP calls it on every rank) and is the same on every rank.
    """

    @dataclass(kw_only=True, slots=True)
    class Config(BaseDataLoader.Config, BaseSettings):
        """plitzer's settings as torchtitan config fields (--dataloader.NAME): the data (source, or mixture: a
        mixture file), infinite (False: one pass, the validator's) and every plitzer parameter but lanes,
        seq_len, rank and world, which the trainer decides."""

        infinite: bool = True
        """Every epoch, one after the other (False: one pass, the validator's)."""
        text_tokenizer: str | None = None
        """A text source's tokenizer (plitzer's ``tokenizer``: torchtitan passes its own to every loader)."""

    def __init__(
        self,
        config: Any,
        *,
        dp_world_size: int,
        dp_rank: int,
        seq_len: int,
        local_batch_size: int,
        tokenizer: BaseTokenizer | None = None,
        **kwargs: Any,
    ) -> None:
        del tokenizer, kwargs  # plitzer reads tokens (a text source's tokenizer is a setting)
        self.config = config
        self.dataset = open_dataset(
            config,
            lanes=lanes_of(local_batch_size, dp_world_size, "training.local_batch_size"),
            seq_len=seq_len,
            rank=dp_rank,
            world=dp_world_size,
        )
        self.ledger: _Ledger | None = None
        self.counted = torch.zeros(2 * len(self.dataset.loader.sources) + 1, dtype=torch.int64)
        metrics = PlitzerMetricsProcessor.current()
        # The trainer's loader is the first built after its metrics processor (the validator's come later).
        steer = config.steer if metrics is None or metrics.loader is None else 0
        why = "config.metrics is not plitzer's (with_plitzer sets it)" if metrics is None else metrics.why_no_loss()
        if steer and why:
            msg = f"--dataloader.steer {steer} steers from per-source losses, which this run has not: {why}"
            raise ConfigError(msg)
        self.feed = Feed(self.dataset, steer=steer, rule=config.steer_rule)
        if metrics is not None and metrics.loader is None:
            self.ledger = metrics.attach(self, per_source_loss=not why)

    def __iter__(self) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]:
        """Every step from the dataset's position on; with ``infinite=False`` the rest of its epoch only.

        With per-source losses, each batch handed out waits in the ledger for the loss's
        per-token losses, and the steps whose losses are in are steered from (collective)
        when the trainer asks for the next item, before it is read.
        """
        while True:
            for batch in self.feed:
                real, targets = batch.source_tokens, batch.source_targets
                targets = torch.zeros_like(real) if targets is None else targets
                self.counted += torch.cat([real, targets, (batch.tokens.numel() - real.sum()).reshape(1)])
                if self.ledger is not None:
                    self.ledger.handed(batch)
                yield batch_of(batch)
                if self.ledger is not None:
                    self.ledger.steer()
            if not self.config.infinite:
                return

    def __len__(self) -> int:
        """The run's steps, when it is finite (``epochs``)."""
        return len(self.dataset)  # type: ignore[arg-type]

    def state_dict(self) -> dict[str, Any]:
        """plitzer's global checkpoint (``plitzer.torch.Dataset.state_dict``): collective, the same on every rank.

        The steps trained so far are steered from first, so the controller's state in it is
        the one a run that goes on has (a resume continues steering exactly).
        """
        if self.ledger is not None:
            self.ledger.steer()
        return self.dataset.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict` taken at any data-parallel degree (an empty state: nothing saved)."""
        if state_dict:
            resume(self.dataset, state_dict, batch="training.local_batch_size", seq_len="training.seq_len")

    def close(self) -> None:
        self.dataset.close()


class _Ledger:
    """The training loader's per-source losses: batches handed out, their per-token losses, the sums.

    The trainer takes its items in order and computes their losses in that order (a step's
    gradient-accumulation microbatches one after the other, a chunked loss's chunks along the
    sequence); each loss call's per-token losses are the next columns of the oldest batch
    whose losses are not all in. A batch complete, its per-source sums and target counts
    (``Feed.source_losses``: one bincount) are kept on the device: added up for the next log
    step, or, with ``steer``, kept by step until :meth:`steer` reduces them (one all-reduce)
    and gives each step's means to the controller in order.
    """

    def __init__(self, feed: Feed, reduce: Callable[[torch.Tensor], None]) -> None:
        self.feed, self.reduce = feed, reduce
        self.k = len(feed.dataset.loader.sources)
        self.out: deque[tuple[plitzer.torch.Batch, list[torch.Tensor]]] = deque()  # handed, losses not all in
        self.steps: list[tuple[int, torch.Tensor]] = []  # with steer: each step's [sums, counts], not reduced
        self.mine: torch.Tensor | None = None  # without steer: this rank's [sums, counts] since the last log
        self.reduced = torch.zeros(2 * self.k, dtype=torch.float64)  # with steer: reduced, since the last log
        self.off = ""  # why per-source losses stopped (a loss this ledger cannot read)

    def handed(self, batch: plitzer.torch.Batch) -> None:
        if not self.off:
            self.out.append((batch, []))

    def add(self, losses: torch.Tensor, labels: torch.Tensor) -> None:
        """A loss call's per-token ``losses`` (rows x columns, detached) of ``labels``: the next columns handed out."""
        if self.off:
            return
        if not self.out:
            self.stop(f"a training loss of labels {tuple(labels.shape)} came with no batch handed out")
            return
        batch, parts = self.out[0]
        width, rows = sum(p.shape[1] for p in parts), batch.tokens.shape[0]
        if labels.dim() != 2 or labels.shape[0] != rows or width + labels.shape[1] > batch.tokens.shape[1]:
            shape = tuple(batch.tokens.shape)
            self.stop(f"the loss's labels {tuple(labels.shape)} are not the next columns of the batch {shape}")
            return
        parts.append(losses)
        if width + labels.shape[1] < batch.tokens.shape[1]:
            return
        self.out.popleft()
        sums, counts = self.feed.source_losses(batch, torch.cat(parts, dim=1))
        both = torch.cat([sums, counts.double()])
        if self.feed.mixer is not None:
            self.steps.append((int(batch.step), both))
        else:
            self.mine = both if self.mine is None else self.mine + both

    def stop(self, why: str) -> None:
        """No per-source losses from here on (every rank stops alike: the same config, the same calls)."""
        self.off, self.mine = why, None
        self.out.clear()
        if self.feed.mixer is not None:
            msg = f"--dataloader.steer steers from per-source losses, which this run has not: {why}"
            raise ConfigError(msg)

    def steer(self) -> None:
        """The steps whose losses are in, reduced (one all-reduce), to the controller in order. Collective."""
        if not self.steps:
            return
        both = torch.stack([b for _, b in self.steps])
        self.reduce(both)
        both = both.cpu()
        for (step, _), row in zip(self.steps, both, strict=True):
            self.feed.observe(step, row[: self.k], row[self.k :])
        self.reduced += both.sum(dim=0)
        self.steps.clear()

    def take(self) -> tuple[torch.Tensor | None, torch.Tensor]:
        """This rank's sums and counts since the last call (to reduce), and those already reduced."""
        self.steer()
        mine, reduced = self.mine, self.reduced
        self.mine, self.reduced = None, torch.zeros_like(self.reduced)
        if mine is None and not self.off and self.feed.mixer is None:
            mine = torch.zeros(2 * self.k, dtype=torch.float64)
        return mine, reduced


class PlitzerMetricsProcessor(MetricsProcessor):
    """torchtitan's metrics processor, and plitzer's figures in its ``extra_metrics`` at each log step.

    ``plitzer/tokens/NAME``, ``plitzer/targets/NAME`` (a source's real tokens and targets),
    ``plitzer/padding`` (summed over the data-parallel ranks), ``plitzer/wait_s`` (the
    consumer's wait for batches: the slowest rank's) since the last log step, and
    ``plitzer/loss/NAME`` (a source's mean loss on its targets since then) where the run
    has per-source losses (:meth:`why_no_loss`). One all-gather over the data-parallel group
    at a log step (torchtitan calls ``log`` on every rank). The training loader finds it
    (the one built last: a class attribute's weak reference).
    """

    @dataclass(kw_only=True, slots=True)
    class Config(MetricsProcessor.Config):
        """torchtitan's metrics settings (--metrics.*), with plitzer's figures logged."""

    _built: ClassVar[weakref.ref[PlitzerMetricsProcessor] | None] = None

    def __init__(self, config: Any, *, parallel_dims: Any, config_dict: dict[str, Any] | None = None, **kw: Any):
        super().__init__(config, parallel_dims=parallel_dims, config_dict=config_dict, **kw)
        self.loader: PlitzerDataLoader | None = None  # the trainer's
        self.waited = 0.0  # its consumer's wait at the last log step
        self.ledger: _Ledger | None = None
        self.loss_given = False  # PlitzerLoss built for this trainer (it is built after this)
        self.why = _why_no_loss(parallel_dims, config_dict or {})
        self.group = parallel_dims.get_mesh("batch").get_group() if parallel_dims.dp_enabled else None
        self.device = torch.device(titan_utils.device_type)
        PlitzerMetricsProcessor._built = weakref.ref(self)

    @classmethod
    def current(cls) -> PlitzerMetricsProcessor | None:
        """The processor built last, while it lives."""
        return None if cls._built is None else cls._built()

    def why_no_loss(self) -> str:
        """Why the run has no per-source losses ("" where it has them)."""
        return self.why or (
            "" if self.loss_given else "config.loss is not plitzer's (PlitzerLoss, as with_plitzer sets)"
        )

    def attach(self, loader: PlitzerDataLoader, *, per_source_loss: bool) -> _Ledger | None:
        """The trainer's loader; its ledger of per-source losses where the run has them."""
        self.loader, self.waited = loader, 0.0
        self.ledger = _Ledger(loader.feed, self._sum) if per_source_loss else None
        return self.ledger

    def _sum(self, t: torch.Tensor) -> None:
        if self.group is not None:
            dist.all_reduce(t, group=self.group)

    def log(
        self,
        step: int,
        global_avg_loss: float,
        global_max_loss: float,
        grad_norm: float,
        extra_metrics: dict[str, Any] | None = None,
    ) -> None:
        extra = dict(extra_metrics or {})
        if self.loader is not None:
            extra |= self.figures()
        super().log(step, global_avg_loss, global_max_loss, grad_norm, extra_metrics=extra)

    def figures(self) -> dict[str, float]:
        """plitzer's figures since the last call, over the data-parallel ranks (collective: one all-gather).

        Counted from the batches the loader handed out (a replica's follower too); the wait
        is the loader's (``stats.wait_seconds``).
        """
        assert self.loader is not None
        loader = self.loader
        names = metric_names(loader.dataset.loader.sources)
        keys = [f"plitzer/tokens/{n}" for n in names] + [f"plitzer/targets/{n}" for n in names] + ["plitzer/padding"]
        waited = float(loader.dataset.loader.stats.wait_seconds)
        row = torch.cat([loader.counted.double(), torch.tensor([waited - self.waited], dtype=torch.float64)])
        loader.counted.zero_()
        self.waited = waited
        losses, reduced = self.ledger.take() if self.ledger is not None else (None, None)
        if losses is not None:
            row = torch.cat([row, losses.cpu()])
        rows = row.unsqueeze(0)
        if self.group is not None:
            parts = [torch.empty_like(row, device=self.device) for _ in range(dist.get_world_size(self.group))]
            dist.all_gather(parts, row.to(self.device), group=self.group)
            rows = torch.stack(parts).cpu()
        total = rows.sum(dim=0)
        out = dict(zip(keys, total.tolist(), strict=False)) | {"plitzer/wait_s": float(rows[:, len(keys)].max())}
        if reduced is not None:
            both = reduced + (total[len(keys) + 1 :] if losses is not None else 0)
            k = len(names)
            out |= {f"plitzer/loss/{n}": float(s / c) for n, s, c in zip(names, both[:k], both[k:], strict=True) if c}
        return out


def _why_no_loss(parallel_dims: Any, config: dict[str, Any]) -> str:
    """Why a run of these parallel dimensions and this config has no per-source losses ("" where it has them)."""
    training, parallelism = config.get("training", {}), config.get("parallelism", {})
    graphs = not training.get("disable_cuda_graphs", True) and titan_utils.device_type == "cuda"
    reasons = [
        (parallel_dims.tp_enabled, "tensor parallel (the loss is parallel over the vocabulary)"),
        (parallel_dims.cp_enabled, "context parallel (each rank holds part of each row)"),
        (parallel_dims.pp_enabled, "pipeline parallel (the last stage's loss takes microbatches of its own)"),
        (parallelism.get("spmd_backend") == "full_dtensor", "the full_dtensor backend (the labels are DTensors)"),
        (graphs and torch.version.hip is None, "CUDA graphs replay the loss (--training.disable_cuda_graphs)"),
    ]
    return "; ".join(why for on, why in reasons if on)


class PlitzerLoss(CrossEntropyLoss):
    """torchtitan's cross-entropy (sum over the targets, over ``global_valid_tokens``), its per-token losses kept.

    Where the training loader keeps a ledger (:class:`PlitzerMetricsProcessor`), a training
    call (gradients on, plain tensors) computes the per-token losses (``reduction="none"``,
    ``ignore_index=-100``) and returns their sum: the value and gradient torchtitan's loss
    gives (the same terms, summed; equal bit for bit on CPU), and hands them to the ledger.
    Everywhere else (the validator, DTensors) it is torchtitan's loss as it is.
    """

    @dataclass(kw_only=True, slots=True)
    class Config(CrossEntropyLoss.Config):
        """torchtitan's cross-entropy, with per-source losses for plitzer's metrics and steering."""

    def __init__(self, config: Any, *, compile_config: Any = None) -> None:
        super().__init__(config, compile_config=compile_config)
        metrics = PlitzerMetricsProcessor.current()
        if metrics is not None:
            metrics.loss_given = True

    def __call__(
        self, pred: torch.Tensor, labels: torch.Tensor, global_valid_tokens: torch.Tensor | None = None, **kw: Any
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        metrics = PlitzerMetricsProcessor.current()
        ledger = None if metrics is None else metrics.ledger
        if ledger is None or ledger.off or not torch.is_grad_enabled():
            return super().__call__(pred, labels, global_valid_tokens, **kw)  # type: ignore[no-any-return]
        if isinstance(pred, DTensor) or isinstance(labels, DTensor):
            ledger.stop("the loss is a DTensor's (a parallelism that shards the logits or the labels)")
            return super().__call__(pred, labels, global_valid_tokens, **kw)  # type: ignore[no-any-return]
        each = F.cross_entropy(
            pred.flatten(0, 1).float(), labels.flatten(0, 1), reduction="none", ignore_index=IGNORE_INDEX
        )
        ledger.add(each.detach().view(labels.shape), labels)
        loss = each.sum()
        return (loss if global_valid_tokens is None else loss / global_valid_tokens), {}


class NullTokenizer(BaseTokenizer):
    """No tokenizer: torchtitan builds one in every run, and plitzer's data is already tokens.

    ``vocab_size`` is what ``get_vocab_size()`` says (0: unknown). ``encode`` and ``decode``
    raise: a text source is tokenized by plitzer (the ``tokenizer`` setting).
    """

    @dataclass(kw_only=True, slots=True)
    class Config(BaseTokenizer.Config):
        vocab_size: int = 0
        """What get_vocab_size() returns (the model's vocabulary is its own config's)."""

    def __init__(self, config: Config, *, tokenizer_path: str | None = None, **kwargs: Any) -> None:
        super().__init__()
        del tokenizer_path, kwargs
        self.vocab_size = config.vocab_size

    def encode(self, *args: Any, **kwargs: Any) -> list[int]:
        msg = (
            "NullTokenizer: the data is pre-tokenized; give plitzer a tokenizer (--dataloader.text_tokenizer) for text"
        )
        raise ConfigError(msg)

    def decode(self, *args: Any, **kwargs: Any) -> str:
        msg = "NullTokenizer cannot decode: set --tokenizer to a real tokenizer's config to read tokens as text"
        raise ConfigError(msg)

    def get_vocab_size(self) -> int:
        return self.vocab_size


def with_plitzer(config: Trainer.Config, *, validation: str = "", **settings: Any) -> Trainer.Config:
    """``config`` with plitzer as its training data loader and the validator's, its metrics and loss, a null tokenizer.

    The metrics processor and the cross-entropy loss become plitzer's subclasses of them
    (:class:`PlitzerMetricsProcessor`, :class:`PlitzerLoss`: a chunked loss's inner one), with
    the config's settings: plitzer's figures and per-source losses are logged, and
    ``steer=`` can steer the mixture.

    ``settings``: :class:`PlitzerDataLoader.Config`'s fields (``source=``, ``window=``, ...).
    ``validation``: the validation data (``source``), read in storage order, one pass
    (``shuffle=False, epochs=1``); without it the validator is off (``--validator.enable``
    and ``--validator.dataloader.source`` turn it on).
    """
    config.dataloader = PlitzerDataLoader.Config(**settings)
    config.metrics = _as(PlitzerMetricsProcessor.Config, config.metrics)
    if type(config.loss) is CrossEntropyLoss.Config:
        config.loss = _as(PlitzerLoss.Config, config.loss)
    for _, loss, parent, attr in config.loss.traverse(CrossEntropyLoss.Config):
        if type(loss) is CrossEntropyLoss.Config and parent is not None:  # a chunked loss's (llama3's configs)
            setattr(parent, attr, _as(PlitzerLoss.Config, loss))
    config.tokenizer = NullTokenizer.Config()
    config.validator.dataloader = PlitzerDataLoader.Config(source=validation, infinite=False, **VALIDATION)
    config.validator.enable = bool(validation)
    return config


def _as(cls: Any, config: Any) -> Any:
    """``config``'s fields as a ``cls`` (a subclass of its class: the user's settings kept)."""
    return cls(**{f.name: getattr(config, f.name) for f in fields(config) if f.init})


def _torchtitan_config(name: str) -> Callable[[], Trainer.Config] | None:
    """torchtitan's config function ``name`` (``llama3_debugmodel``), from its model family's registry."""
    for family in pkgutil.iter_modules(torchtitan.models.__path__):
        if not name.startswith(family.name + "_"):
            continue
        try:
            registry = importlib.import_module(f"torchtitan.models.{family.name}.config_registry")
        except ImportError:
            continue
        fn = getattr(registry, name, None)
        if callable(fn):
            return fn  # type: ignore[no-any-return]
    return None


def __getattr__(name: str) -> Callable[[], Trainer.Config]:
    """``plitzer.integrations.torchtitan.NAME``: torchtitan's config ``NAME`` fed by plitzer (``--config NAME``)."""
    base = None if name.startswith("_") else _torchtitan_config(name)
    if base is None:
        msg = f"module {__name__!r} has no attribute {name!r} (nor has any torchtitan model's config_registry)"
        raise AttributeError(msg)

    def config() -> Trainer.Config:
        return with_plitzer(base())

    config.__name__ = config.__qualname__ = name
    config.__doc__ = f"torchtitan's {name} with plitzer's data loader (plitzer.integrations.torchtitan.with_plitzer)."
    return config
