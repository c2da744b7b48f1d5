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

from collections.abc import Iterator

from plitzer.torch import Batch, Dataset

__all__ = ["Feed"]


class Feed:
    """A :class:`plitzer.torch.Dataset` as a trainer's loop takes it (module docstring).

    ``restart``: every pass starts at its epoch's first step, whatever was read of it (an
    evaluation's feed: the same batches every time).
    """

    def __init__(self, dataset: Dataset, *, restart: bool = False) -> None:
        self.dataset = dataset
        self.restart = restart

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
