"""The feed every trainer adapter reads through: epochs, a restart for evaluation, tokens seen.

A trainer counts what plitzer already knows, so nothing here restates it. The first step of
epoch label ``e`` and the steps of an epoch are the run's (:meth:`planner.run.Run.epoch_end`);
the token slots of steps ``[0, t)`` are the layout's ``X(t)``
(:meth:`planner.order.layout.Layout.run_at`: every layout stage's lanes times ``seq_len``, so a
stage added live changes it from its step on); the real tokens of a step (what a trainer's
"tokens seen" means) are those slots under concat and, under best-fit, the rows' real tokens
summed over the data-parallel ranks (one all-gather of an int a step: each rank holds its own
rows' padding only).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch

from planner.errors import ConfigError
from plitzer.mixing import Online
from plitzer.readpath.labels import IGNORE_INDEX
from plitzer.torch import Batch, Dataset

__all__ = ["Feed", "metric_names"]


def metric_names(sources: Sequence[str]) -> list[str]:
    """The metrics' names of the sources: their names, ``data`` for a lone unnamed one."""
    return [n or "data" for n in sources] if len(sources) > 1 or sources[0] else ["data"]


class Feed:
    """A :class:`plitzer.torch.Dataset` as a trainer's loop takes it (module docstring).

    ``restart``: every pass starts at its epoch's first step, whatever was read of it (an
    evaluation's feed: the same batches every time).
    """

    def __init__(self, dataset: Dataset, *, restart: bool = False, steer: int = 0, rule: str = "exp3") -> None:
        self.dataset = dataset
        self.restart = restart
        self.mixer = Online(dataset, every=steer, rule=rule) if steer else None
        self._seen: dict[str, float] = {}  # the running totals at the last metrics() call

    def metrics(self) -> dict[str, float]:
        """This rank's figures since the last call, by name (the trainer sums them over ranks, maxes the wait).

        ``plitzer/tokens/NAME`` and ``plitzer/targets/NAME`` (real tokens and targets of each
        source, ``loader.sources`` order), ``plitzer/padding`` and ``plitzer/wait_s`` (the
        consumer's wait for batches): differences of ``loader.stats``' running totals.
        """
        st = self.dataset.loader.stats
        names = metric_names(st.sources)
        now = {f"plitzer/tokens/{n}": float(t) for n, t in zip(names, st.source_tokens, strict=True)}
        if st.source_targets is not None:
            now |= {f"plitzer/targets/{n}": float(t) for n, t in zip(names, st.source_targets, strict=True)}
        now |= {"plitzer/padding": float(st.padding_tokens), "plitzer/wait_s": float(st.wait_seconds)}
        out = {k: v - self._seen.get(k, 0.0) for k, v in now.items()}
        self._seen = now
        return out

    def source_losses(self, batch: Batch, losses: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each source's summed loss and target count in ``batch``, from its per-token ``losses`` (rows x seq_len).

        One ``bincount`` each over ``batch.source_ids`` where the labels are targets (a token's
        label is the next token of its own document, so of its source). float64 and int64, on
        the losses' device; all-reduce both over the data-parallel group for the step's means.
        """
        labels = batch.labels
        if labels is None:
            msg = "source_losses: the batch has no labels (the adapters open their dataset with labels=True)"
            raise ConfigError(msg)
        device = losses.device
        keep = labels.to(device).reshape(-1) != IGNORE_INDEX
        ids = batch.source_ids.to(device).reshape(-1)[keep].long()
        k = len(self.dataset.loader.sources)
        sums = torch.bincount(ids, weights=losses.detach().reshape(-1)[keep].double(), minlength=k)
        return sums, torch.bincount(ids, minlength=k)

    def observe(self, step: int, sums: Any, counts: Any) -> int | None:
        """Step ``step``'s per-source loss sums and counts, reduced over the ranks, to the steering controller.

        The means (NaN for a source with no target in the step) go to :meth:`plitzer.mixing.Online.observe`;
        without ``steer`` nothing happens. Returns the step a new stage starts at, if one was set.
        """
        if self.mixer is None:
            return None
        s, c = torch.as_tensor(sums, dtype=torch.float64).cpu(), torch.as_tensor(counts).cpu()
        means = torch.where(c > 0, s / c.clamp(min=1), torch.full_like(s, float("nan")))
        return self.mixer.observe(step, means.tolist())

    @property
    def pads(self) -> bool:
        """Whether rows may end in padding (best-fit): then a step's real tokens are counted, not computed."""
        return bool(self.dataset.loader.settings.rule.pads)

    def epoch_start(self, epoch: int) -> int:
        """The first step of epoch label ``epoch`` (0-based, plitzer's)."""
        return 0 if epoch <= 0 else int(self.dataset.loader.run.epoch_end(epoch - 1))

    def steps_in_epoch(self, epoch: int) -> int:
        """The steps whose epoch label is ``epoch`` (0-based): plitzer's epochs differ by a step or so."""
        return int(self.dataset.steps_in_epoch(epoch))

    def start_epoch(self, epoch: int) -> int:
        """Begin epoch ``epoch``: where the dataset is if inside it (a resumed run), else its first step.

        Returns the steps of it already taken. With ``restart`` it is always its first step.
        """
        first = self.epoch_start(epoch)
        if self.restart or self.dataset.epoch != epoch:
            self.dataset.loader.seek(first)
        return int(self.dataset.step) - first

    def slots(self, first: int, last: int) -> int:
        """The token slots (rows times ``seq_len``, padding included) of steps ``[first, last)``: ``X(last) - X(f)``."""
        layout = self.dataset.loader.layout
        return int(layout.run_at(last)) - int(layout.run_at(first))

    def step_tokens(self, batch: Batch) -> int:
        """The real tokens of ``batch``'s global step: every rank's rows but their padding.

        Collective under best-fit at ``world > 1`` (every rank calls it for the same step).
        """
        if not self.pads:
            return self.slots(batch.step, batch.step + 1)
        mine = int(batch.mask.sum()) if batch.mask.dim() else int(batch.tokens.numel())
        if self.dataset.world == 1:
            return mine
        return sum(x[0] for x in self.dataset._all_gather_ints([mine]))

    def __iter__(self) -> Iterator[Batch]:
        """The dataset's batches from where it is (``iter(dataset)``)."""
        return iter(self.dataset)
