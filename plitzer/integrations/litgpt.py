"""litgpt: plitzer as its pretraining data (docs/trainers/litgpt.md).

:class:`Plitzer` is a litgpt ``DataModule``, named in a YAML config by ``class_path``::

    data:
      class_path: plitzer.integrations.litgpt.Plitzer
      init_args:
        source: s3://bucket/fineweb-edu
        val_source: s3://bucket/fineweb-edu-val
        window: 64

``litgpt pretrain --config that.yaml``: ``connect(batch_size=micro_batch_size,
max_seq_length=L)`` gives plitzer's ``lanes = micro_batch_size * world`` (``world`` and
``rank`` from ``torch.distributed``, which Fabric initialises) and ``seq_len = L``.

litgpt's pretraining loop takes one ``(micro_batch_size, L + 1)`` tensor a step and shifts
it itself (``input_ids = batch[:, :L]``, ``targets = batch[:, 1:]``). The rows here are
plitzer's rows of L tokens, and the extra column is plitzer's label of each row's last token
(SPEC section 16: the next token of its document, which the next row holds, or -100 at a
document's end): no token is read twice and no target is lost at a row's end, as asking
plitzer for ``L + 1`` tokens would. The targets inside a row are the row's own next tokens, as
litgpt's format has them (it has no document masking).

The loaders are ``torch.utils.data.DataLoader``\\ s with ``state_dict`` and
``load_state_dict``: Fabric's checkpoint (``state["train_dataloader"]``) carries plitzer's
global checkpoint, and ``--resume`` continues the same global batches on any number of
devices. The validation loader reads ``val_source`` in storage order, one pass
(``shuffle=False, epochs=1``, ``len()`` its steps), from its first step at every evaluation.

This is the only module of plitzer that imports litgpt.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from litgpt.data.base import DataModule
from litgpt.tokenizer import Tokenizer
from torch.utils.data import DataLoader

import plitzer.torch
from planner.errors import ConfigError
from plitzer.integrations.feed import Feed
from plitzer.integrations.settings import Settings
from plitzer.integrations.shared import VALIDATION, labels_of, lanes_of, open_dataset, resume

__all__ = ["BEST_FIT_REFUSED", "Plitzer", "PlitzerDataLoader", "rows_of"]


def rows_of(batch: plitzer.torch.Batch) -> torch.Tensor:
    """litgpt's batch of a plitzer batch: ``(rows, L + 1)`` int64, the tokens and each row's last label.

    litgpt cannot mask a target, so a row holding padding (a finite run's last step) is left
    out: padding never becomes a target (the rows kept may be none).
    """
    out = torch.cat([batch.tokens.long(), labels_of(batch)[:, -1:]], dim=1)
    if batch.mask.dim():  # padded: keep the whole rows
        out = out[batch.mask.all(dim=1)]
    return out


BEST_FIT_REFUSED = (
    "litgpt's pretraining shifts one (rows, L + 1) tensor to make its targets and cannot mask one, so under "
    "packing='best-fit' the padding and the token after each document's last would be targets: use "
    "packing: concat (litgpt's own format: documents run on), or a trainer that takes plitzer's labels "
    "(torchtitan, OLMo-core) to keep documents whole"
)
"""Why the litgpt adapter refuses best-fit packing (docs/trainers/litgpt.md)."""


class PlitzerDataLoader(DataLoader[Any]):
    """A plitzer.torch.Dataset as litgpt's loader: one ``(rows, L + 1)`` tensor a step, and Fabric's state.

    ``restart``: every ``iter()`` starts at the run's first step (a validation loader: the same
    batches at every evaluation).
    """

    def __init__(self, dataset: plitzer.torch.Dataset, *, restart: bool = False) -> None:
        super().__init__(dataset, batch_size=None, num_workers=0, collate_fn=self.rows)  # type: ignore[arg-type]
        self.plitzer = dataset
        self.feed = Feed(dataset, restart=restart)
        self.restart = restart

    def metrics(self) -> dict[str, float]:
        """This rank's per-source tokens and targets, padding and wait since the last call (``Feed.metrics``).

        litgpt's pretraining logs its own fixed figures and gives a data module no hook into
        Fabric's ``log_dict``: a loop of one's own logs these with
        ``fabric.log_dict(loader.metrics(), step=...)`` (summed over ranks where it matters).
        """
        return self.feed.metrics()

    def rows(self, batch: plitzer.torch.Batch) -> torch.Tensor:
        """The step's tensor (:func:`rows_of`)."""
        return rows_of(batch)

    def __iter__(self) -> Iterator[torch.Tensor]:  # type: ignore[override]
        if self.restart:
            self.feed.start_epoch(0)
        return (rows for rows in super().__iter__() if len(rows))  # a last step all padding: none

    def __len__(self) -> int:
        """The run's steps, when it is finite (``epochs``: the validation loader)."""
        return len(self.plitzer)  # type: ignore[arg-type]

    def state_dict(self) -> dict[str, Any]:
        """plitzer's global checkpoint: collective (Fabric's ``save`` calls it on every rank)."""
        return self.plitzer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`, taken on any number of devices."""
        resume(self.plitzer, state_dict, batch="micro_batch_size", seq_len="max_seq_length")


@dataclass(kw_only=True)
class Plitzer(Settings, DataModule):
    """plitzer as litgpt's data (class_path: plitzer.integrations.litgpt.Plitzer): source (or mixture, a mixture
    file), val_source (the validation data), and every plitzer parameter but lanes, seq_len, rank and world,
    which litgpt's micro_batch_size, the model's sequence length and torch.distributed give."""

    val_source: str = ""
    """The validation data (a folder, file or URL), read in storage order, one pass, at every evaluation."""

    def __post_init__(self) -> None:
        # Settings comes first: LightningDataModule.__init__ calls super().__init__() down its
        # bases, which would run Settings' __init__ again with every default.
        DataModule.__init__(self)
        self.batch_size = 1
        self.seq_len: int | None = None  # connect() sets it

    def connect(
        self, tokenizer: Tokenizer | None = None, batch_size: int = 1, max_seq_length: int | None = None
    ) -> None:
        """litgpt's call before the loaders: the micro-batch size and the model's sequence length (no tokenizer)."""
        del tokenizer
        self.batch_size, self.seq_len = batch_size, max_seq_length

    def _open(self, source: str | None = None, **given: Any) -> plitzer.torch.Dataset:
        """The dataset of this rank (``torch.distributed``'s, which Fabric initialises), with ``source`` if given."""
        if self.seq_len is None:
            msg = "plitzer.integrations.litgpt.Plitzer: call connect(batch_size=, max_seq_length=) first (litgpt does)"
            raise ConfigError(msg)
        ready = dist.is_available() and dist.is_initialized()
        world, rank = (dist.get_world_size(), dist.get_rank()) if ready else (1, 0)
        lanes = lanes_of(self.batch_size, world, "micro_batch_size")
        if self.steer:
            msg = (
                f"steer={self.steer}: litgpt's pretraining gives its data module neither the loss nor a hook into "
                "its loop, so nothing could feed the controller; steer in a loop of your own (docs/steering.md)"
            )
            raise ConfigError(msg)
        if self.packing != "concat":
            msg = f"packing={self.packing!r}: {BEST_FIT_REFUSED}"
            raise ConfigError(msg)
        return open_dataset(self, lanes=lanes, seq_len=self.seq_len, rank=rank, world=world, source=source, **given)

    def train_dataloader(self) -> PlitzerDataLoader:
        """The training loader: every epoch of ``source`` (or ``mixture``), one step a ``next``."""
        return PlitzerDataLoader(self._open())

    def val_dataloader(self) -> PlitzerDataLoader:
        """The validation loader: ``val_source`` in storage order, one pass (SPEC section 17), else as trained."""
        if not self.val_source:
            msg = (
                "litgpt's pretraining validates before it trains and at every eval.interval: set val_source "
                "(the validation data: a folder, file or URL) in the data's init_args"
            )
            raise ConfigError(msg)
        return PlitzerDataLoader(self._open(self.val_source, **VALIDATION), restart=True)
