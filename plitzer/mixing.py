"""Steering a mixture from per-source losses (SPEC section 20 item 2): :class:`Online` and its rules.

A training loop feeds the controller each step's per-source losses, already reduced over the
data-parallel group (so equal on every rank); at the global steps that are multiples of
``every`` (counted from step 0) the controller asks its rule for new weights and appends
them as a live stage (``set_weights`` at the earliest allowed step, SPEC section 8)::

    mixer = plitzer.mixing.Online(loader, every=500)        # a Loader or a plitzer.torch.Dataset
    for batch in loader:
        ...                                                 # per-source mean losses, all-reduced
        mixer.observe(batch.step, losses)                   # a stage every 500 steps

A rule is a pure function of the losses it was given and its own state (random choices
only from the run's seed), and gives integer weights in parts per million (:data:`PPM`), so
every rank sets the same stage and a stage built from them is exact. The controller's state
(the rule's, and the losses observed since its last change) rides in the loader's
checkpoints (:mod:`plitzer.state.steering`, floats bit for bit): a controller built before
or after ``resume`` continues from the state the checkpoint holds, and makes its changes at
the same steps. Each change is a live stage, so ``loader.stages`` of a steered run's
checkpoint, given to a new Loader as ``weights=``, gives that run's batches step for step.

:class:`Exp3` is Online Data Mixing's rule (Albalak et al. 2023); :class:`Rule` is the
protocol a rule of one's own follows (docs/steering.md, docs/design.md "Steering a mixture").
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any, Protocol, runtime_checkable

from planner.errors import CheckpointError, ConfigError, UsageError
from plitzer.state import steering

__all__ = ["PPM", "Exp3", "Online", "Rule", "epsilon", "exp3_probabilities", "rule_of", "to_ppm"]

PPM = 1_000_000
"""A rule's weights are integers that sum to this (parts per million)."""


@runtime_checkable
class Rule(Protocol):
    """A steering rule: integer weights from per-source losses, a pure function of them and its state.

    ``name`` is recorded in the checkpoint (with the rule's parameters: a resume with another
    is refused). ``init`` gives the first state from the source names (source-number order,
    ``loader.sources``), the weights in force (parts per million, that order) and the run's
    seed, the only source of random choices. ``update`` is called at each change with the
    change's global step (a multiple of ``every``, in practice) and each source's mean loss
    over the steps observed since the last change (NaN for a source with no tokens there),
    and returns the new state and the new weights: non-negative integers, one a source, that
    sum to :data:`PPM` (:func:`to_ppm` rounds shares so). A state is built of ints, floats,
    lists and dicts with string keys (tuples come back as lists), so that it rides in the
    checkpoint exactly; it is never mutated by the controller, and a rule should not keep
    anything outside it.
    """

    @property
    def name(self) -> str: ...

    def init(self, names: Sequence[str], weights: Sequence[int], seed: int) -> Any: ...

    def update(self, state: Any, step: int, losses: Sequence[float]) -> tuple[Any, Sequence[int]]: ...


def to_ppm(shares: Sequence[float]) -> list[int]:
    """Non-negative ``shares`` as integers summing to :data:`PPM`, by largest remainder, exactly.

    Each float is taken as the exact fraction it is (``fractions.Fraction``), so the rounding
    is the same on every machine; remainders tie by source order. A positive share keeps at
    least 1 (taken from the largest), so a source a rule gives any weight is never switched off.
    """
    if not all(math.isfinite(s) and s >= 0 for s in shares) or not any(s > 0 for s in shares):
        msg = f"weights from shares {list(shares)!r}: shares are finite, non-negative, and not all 0"
        raise ValueError(msg)
    exact = [Fraction(s) for s in shares]
    scaled = [s * PPM / sum(exact) for s in exact]
    out = [math.floor(s) for s in scaled]
    order = sorted(range(len(out)), key=lambda i: (-(scaled[i] - out[i]), i))
    for i in order[: PPM - sum(out)]:
        out[i] += 1
    for i, s in enumerate(exact):
        if s > 0 and out[i] == 0:
            out[i] = 1
            out[max(range(len(out)), key=lambda j: (out[j], -j))] -= 1
    return out


def epsilon(k: int, t: int) -> float:
    """ODM's exploration rate at step ``t`` for ``k`` sources: ``min(1/k, sqrt(ln k / (k t)))``, ``1/k`` at 0."""
    return 1.0 / k if t <= 0 else min(1.0 / k, math.sqrt(math.log(k) / (k * t)))


def exp3_probabilities(rewards: Sequence[float], eps_prev: float, eps: float) -> list[float]:
    """``(1 - K eps) * softmax(eps_prev * R) + eps``: ODM's Algorithm 1, line 4.

    The largest exponent is subtracted before ``exp`` (the softmax is the same number, and no
    reward, however large, overflows).
    """
    k = len(rewards)
    top = max(eps_prev * r for r in rewards)
    e = [math.exp(eps_prev * r - top) for r in rewards]
    total = math.fsum(e)
    return [(1.0 - k * eps) * x / total + eps for x in e]


class Exp3:
    """Online Data Mixing's rule: EXP3 with the training loss as the reward.

    Albalak, Pan, Raffel, Wang, "Efficient Online Data Mixing For Language Model
    Pre-Training" (2023, arXiv:2312.02406), Algorithm 1. Each source is an arm; with ``K``
    sources, at round ``t``:

    - exploration rate ``eps_t = min(1/K, sqrt(ln K / (K t)))`` (``eps_0 = 1/K``): it decays
      with the steps;
    - the mixture ``pi_t(i) = (1 - K eps_t) exp(eps_{t-1} R_i) / sum_j exp(eps_{t-1} R_j) + eps_t``:
      exponential weights, mixed with uniform so that no share falls below ``eps_t``;
    - the smoothed importance-weighted reward estimate ``R_i <- alpha R_i + (1 - alpha) L_i / pi(i)``
      (``R_i = 0`` at first), ``L_i`` the loss seen on source ``i`` and ``pi(i)`` its share
      when it was seen.

    Here a round is a change (every ``every`` steps) and ``t`` the change's global step, so
    the exploration rate decays with the run's steps as in the paper (where every step is a
    round); ``eps_{t-1}`` is the rate of the previous change (of step 0 at the first). The
    paper samples one source per micro-batch and updates the sampled arm's estimate; every
    step here carries every source in its share, so every source's estimate is updated at
    each change with its mean loss over the steps since the last change, importance-weighted
    by the share it was given (what the authors' code does for mixed micro-batches). A source
    with no tokens since the last change (NaN) keeps its estimate. ``alpha`` is 0.9 by default
    (the authors' code's default). The weights are ``pi`` in parts per million
    (:func:`to_ppm`); no random choice is made (the loader's interleave takes the place of
    sampling), so the seed is unused.
    """

    def __init__(self, alpha: float = 0.9) -> None:
        alpha = float(alpha)
        if not 0.0 <= alpha < 1.0:
            msg = f"Exp3(alpha={alpha!r}): alpha is the reward estimate's smoothing, in [0, 1)"
            raise ConfigError(msg)
        self.alpha = alpha

    @property
    def name(self) -> str:
        return f"exp3(alpha={self.alpha!r})"

    def init(self, names: Sequence[str], weights: Sequence[int], seed: int) -> dict[str, Any]:
        """Estimates 0, the weights in force, round 0."""
        return {"t": 0, "rewards": [0.0] * len(names), "weights": [int(w) for w in weights]}

    def update(self, state: Mapping[str, Any], step: int, losses: Sequence[float]) -> tuple[dict[str, Any], list[int]]:
        """One round at global step ``step`` with each source's mean loss since the last (NaN: none)."""
        k, a = len(losses), self.alpha
        shares = [w / PPM for w in state["weights"]]
        rewards = [
            a * r + (1.0 - a) * loss / p if math.isfinite(loss) and p > 0 else r
            for r, loss, p in zip(state["rewards"], losses, shares, strict=True)
        ]
        probs = exp3_probabilities(rewards, epsilon(k, int(state["t"])), epsilon(k, step))
        weights = to_ppm(probs)
        return {"t": int(step), "rewards": rewards, "weights": weights}, weights

    def __repr__(self) -> str:
        return f"Exp3(alpha={self.alpha!r})"


def rule_of(rule: str | Rule) -> Rule:
    """A rule by name (``"exp3"``: :class:`Exp3` with its defaults) or a :class:`Rule` as it is."""
    if isinstance(rule, str):
        if rule.lower() == "exp3":
            return Exp3()
        msg = f"rule={rule!r}: the rule that comes with plitzer is 'exp3'; pass an object following plitzer.mixing.Rule"
        raise ConfigError(msg)
    if not isinstance(rule, Rule):
        msg = f"rule={rule!r} has no name, init and update: see plitzer.mixing.Rule"
        raise ConfigError(msg)
    return rule


def _loader_of(target: Any) -> Any:
    """The plitzer.Loader behind ``target`` (a Loader, or a plitzer.torch.Dataset's), which holds the state."""
    for cand in (target, getattr(target, "loader", None)):
        if isinstance(getattr(cand, "steering", None), steering.Slot):
            return cand
    msg = (
        f"Online takes a plitzer.Loader or a plitzer.torch.Dataset of a mixture, got {type(target).__name__} "
        "(a Dataset with replicas= is not supported: its followers hold no loader)"
    )
    raise ConfigError(msg)


class Online:
    """A mixture steered by a rule from per-source losses: a live stage every ``every`` steps.

    The controller registers with the loader (one a loader): its state is in every later
    checkpoint and a resume gives it back, whether the controller was built before or
    after the resume. Take checkpoints after the last observed batch's ``observe``
    (``loader.checkpoint()`` then, or ``batch.state_after()`` of that batch).

    Parameters
    ----------
    loader : plitzer.Loader or plitzer.torch.Dataset
        A mixture's (two or more named sources). Through a ``plitzer.torch.Dataset`` its
        ``set_weights`` checks that every rank makes the same call; a plain Loader cannot.
    every : int
        The changes are made at the global steps that are multiples of ``every`` (counted
        from step 0: a resumed controller changes at the same steps), when the step before
        one has been observed.
    rule : "exp3" or Rule
        :class:`Exp3` (Online Data Mixing), or a rule of one's own (:class:`Rule`).
    """

    def __init__(self, loader: Any, every: int, rule: str | Rule = "exp3") -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            msg = f"Online(every={every!r}): every is a number of steps >= 1"
            raise ConfigError(msg)
        self._target, self._loader = loader, _loader_of(loader)
        self.every, self.rule = every, rule_of(rule)
        self.names: list[str] = list(self._loader.sources)
        if len(self.names) < 2 or not self._loader.stages:
            msg = (
                "Online steers a mixture of two or more named sources (Loader({'web': ..., 'code': ...}, weights=...))"
            )
            raise ConfigError(msg)
        self._fresh(self._loader.step)
        pending = self._loader.steering.register(self)
        if pending is not None:
            self.restore(pending, self._loader.step)

    def _fresh(self, step: int) -> None:
        """The rule's first state from the weights of the last stage; nothing observed before ``step``."""
        self.weights = self._loader_weights()
        self.state = self.rule.init(list(self.names), list(self.weights), int(self._loader.settings.seed))
        self.next = step
        self.sums = [0.0] * len(self.names)
        self.counts = [0] * len(self.names)

    # -- the checkpoint's part (plitzer.state.steering.Controller) --------------------

    def snapshot(self) -> dict[str, Any]:
        """The controller's state as the loader's checkpoints record it."""
        return {
            "rule": self.rule.name,
            "every": self.every,
            "next": self.next,
            "sums": [float(s).hex() for s in self.sums],
            "counts": list(self.counts),
            "state": steering.pack(self.state),
        }

    def restore(self, doc: Mapping[str, Any] | None, step: int) -> None:
        """Continue from a checkpoint's state (None: it had none, so start afresh at ``step``)."""
        if doc is None:
            self._fresh(step)
            return
        mine = {"rule": self.rule.name, "every": self.every, "sources": len(self.names)}
        theirs = {"rule": doc["rule"], "every": doc["every"], "sources": len(doc["sums"])}
        diffs = [f"{k}: checkpoint {theirs[k]!r}, controller {mine[k]!r}" for k in mine if mine[k] != theirs[k]]
        if diffs:
            msg = "the checkpoint's steering does not match this controller: " + "; ".join(diffs)
            raise CheckpointError(msg)
        self.next = int(doc["next"])
        self.sums = [float.fromhex(s) for s in doc["sums"]]
        self.counts = [int(c) for c in doc["counts"]]
        self.state = steering.unpack(doc["state"])
        self.weights = self._loader_weights()

    def _loader_weights(self) -> list[int]:
        """The last stage's weights in parts per million, in source-number order."""
        last = self._loader.stages[-1][1]
        return to_ppm([float(last.get(n, 0)) for n in self.names])

    # -- the loop's call ---------------------------------------------------------------

    def _losses(self, losses: Any) -> list[float]:
        """``losses`` as floats in source-number order (a mapping by name, a sequence, an array or tensor)."""
        if isinstance(losses, Mapping):
            unknown = sorted(set(map(str, losses)) - set(self.names))
            if unknown:
                msg = f"observe(losses=...): no source named {unknown}; the sources are {self.names}"
                raise ConfigError(msg)
            return [float(losses.get(n, math.nan)) for n in self.names]
        if hasattr(losses, "tolist"):  # numpy arrays and torch tensors (on the CPU: .tolist() copies them there)
            losses = losses.tolist()
        out = [float(x) for x in losses]
        if len(out) != len(self.names):
            msg = f"observe(losses=...) has {len(out)} values for {len(self.names)} sources {self.names}"
            raise ConfigError(msg)
        return out

    def observe(self, step: int, losses: Any) -> int | None:
        """Step ``step``'s per-source losses; at a change, the step its stage starts at (else None).

        ``losses``: each source's mean loss on this step's tokens, the same on every rank
        (all-reduced over the data-parallel group), in source-number order (``loader.sources``)
        or by name; NaN (or a name left out) for a source with no tokens in the step. Steps
        are observed in increasing order; after the step before a multiple of ``every`` the
        rule is asked for weights, and they become a stage through ``set_weights`` at the
        earliest allowed step.
        """
        if isinstance(step, bool) or not isinstance(step, int) or step < self.next:
            msg = f"observe(step={step!r}): steps are observed in order, and the next is at least {self.next}"
            raise UsageError(msg)
        values = self._losses(losses)
        sums, counts = list(self.sums), list(self.counts)
        for i, v in enumerate(values):
            if math.isfinite(v):
                sums[i] += v
                counts[i] += 1
        if (step + 1) // self.every == self.next // self.every:
            self.sums, self.counts, self.next = sums, counts, step + 1
            return None
        means = [s / c if c else math.nan for s, c in zip(sums, counts, strict=True)]
        state, weights = self.rule.update(self.state, step + 1, means)
        weights = _checked(weights, len(self.names), self.rule.name)
        start = int(self._target.set_weights(dict(zip(self.names, weights, strict=True))))
        self.state, self.weights, self.next = state, weights, step + 1
        self.sums, self.counts = [0.0] * len(self.names), [0] * len(self.names)
        return start

    def __repr__(self) -> str:
        return f"Online(every={self.every}, rule={self.rule.name}, next={self.next}, weights={self.weights})"


def _checked(weights: Sequence[int], k: int, name: str) -> list[int]:
    """A rule's weights: ``k`` non-negative integers, not all 0."""
    out = list(weights)
    if len(out) != k or any(isinstance(w, bool) or not isinstance(w, int) or w < 0 for w in out) or not sum(out):
        msg = f"rule {name} gave weights {out!r}: give {k} non-negative integers, not all 0 (plitzer.mixing.to_ppm)"
        raise ConfigError(msg)
    return [int(w) for w in out]
