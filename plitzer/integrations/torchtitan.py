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

This is the only module of plitzer that imports torchtitan.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torchtitan.models
from torchtitan.components.dataloader import BaseDataLoader
from torchtitan.components.tokenizer import BaseTokenizer
from torchtitan.trainer import Trainer

import plitzer.torch
from planner.errors import ConfigError
from plitzer.integrations.feed import Feed
from plitzer.integrations.settings import BaseSettings
from plitzer.integrations.shared import VALIDATION, labels_of, lanes_of, open_dataset, resume

__all__ = ["NullTokenizer", "PlitzerDataLoader", "batch_of", "with_plitzer"]


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
        self.feed = Feed(self.dataset)

    def __iter__(self) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]:
        """Every step from the dataset's position on; with ``infinite=False`` the rest of its epoch only."""
        while True:
            for batch in self.feed:
                yield batch_of(batch)
            if not self.config.infinite:
                return

    def __len__(self) -> int:
        """The run's steps, when it is finite (``epochs``)."""
        return len(self.dataset)  # type: ignore[arg-type]

    def state_dict(self) -> dict[str, Any]:
        """plitzer's global checkpoint (``plitzer.torch.Dataset.state_dict``): collective, the same on every rank."""
        return self.dataset.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict` taken at any data-parallel degree (an empty state: nothing saved)."""
        if state_dict:
            resume(self.dataset, state_dict, batch="training.local_batch_size", seq_len="training.seq_len")

    def close(self) -> None:
        self.dataset.close()


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
    """``config`` with plitzer as its training data loader and the validator's, and the null tokenizer.

    ``settings``: :class:`PlitzerDataLoader.Config`'s fields (``source=``, ``window=``, ...).
    ``validation``: the validation data (``source``), read in storage order, one pass
    (``shuffle=False, epochs=1``); without it the validator is off (``--validator.enable``
    and ``--validator.dataloader.source`` turn it on).
    """
    config.dataloader = PlitzerDataLoader.Config(**settings)
    config.tokenizer = NullTokenizer.Config()
    config.validator.dataloader = PlitzerDataLoader.Config(source=validation, infinite=False, **VALIDATION)
    config.validator.enable = bool(validation)
    return config


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
