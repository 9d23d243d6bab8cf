"""What a benchmark run records besides its reward curve: the update's own figures and a gradient-noise probe.

- :class:`UpdateLog` keeps, after every update, the ``train/*`` figures the algorithm logged (gradient norm before
  clipping, ``grad_var``, clip fractions, approximate KL, policy-gradient loss), read from the SB3 logger before they
  are dumped. The ablation of GRPO's mechanisms is explained with them.
- :class:`GradientNoiseProbe` measures, after every rollout, the same gradient-noise estimator for every algorithm
  (the claims study compares baselines with it): the slice gradients ``g_k`` of the policy-gradient surrogate
  ``mean(ratio * A)`` over ``K`` slices of a minibatch of the fresh rollout, with the advantages the algorithm's
  loss uses (GAE normalised per minibatch, group forms as they are), and from them both
  ``Var = (1/K) sum_k ||g_k - g_bar||^2`` (:func:`~sb3_grpo.objectives.stacked_variance`) and the scale-free
  ``Var / ((1/K) sum_k ||g_k||^2)`` (:func:`~sb3_grpo.objectives.relative_gradient_variance`). It draws its
  minibatches with the algorithm's own sampler and puts NumPy's and torch's random state back afterwards, so a
  probed run trains exactly as an unprobed one. Only for :class:`~sb3_grpo.GRPO` (which ``ppo-seq`` is).
- :class:`RewardTerms` keeps, per rollout, the mean of each term of a composite reward over the episodes scored in
  it: which term a trained arm raised, and which it gave up for it.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch as th
from stable_baselines3.common.callbacks import BaseCallback

__all__ = ["UPDATE_KEYS", "GradientNoiseProbe", "RewardTerms", "UpdateLog"]

#: The ``train/*`` figures :class:`UpdateLog` keeps (those an algorithm does not log are skipped).
UPDATE_KEYS = (
    "train/grad_norm",
    "train/grad_var",
    "train/clip_fraction",
    "train/clip_fraction_pos",
    "train/clip_fraction_neg",
    "train/approx_kl",
    "train/policy_gradient_loss",
    "train/entropy_loss",
)


class UpdateLog(BaseCallback):
    """Keep every update's ``train/*`` figures (:data:`UPDATE_KEYS`): ``records[key]`` is one value per update."""

    def __init__(self) -> None:
        super().__init__()
        self.records: dict[str, list[float]] = {}

    def _read(self) -> None:
        values = self.model.logger.name_to_value
        if not any(key in values for key in UPDATE_KEYS):
            return
        for key in UPDATE_KEYS:
            if key in values:
                self.records.setdefault(key, []).append(float(values[key]))

    def _on_rollout_start(self) -> None:
        # SB3's learn loop: collect (this hook first), dump the logs, train: the last update's figures are still here
        self._read()

    def _on_training_end(self) -> None:
        self._read()

    def _on_step(self) -> bool:
        return True

    def summary(self) -> dict[str, float]:
        """The mean of each figure over the updates (``nan``-free; keys without values are left out)."""
        return {key: float(np.mean(v)) for key, v in self.records.items() if v}


class RewardTerms(BaseCallback):
    """Per rollout, the mean of each composite-reward term over the episodes scored in it: ``series[label]`` is one
    value per rollout (a rollout in which no episode was scored adds none). Read from the reward itself
    (a :meth:`~textrl_envs.rewards.CompositeReward.component_reader` of its own), so rewards scored in the background
    count, and other readers (a :class:`~sb3_grpo.callbacks.CompletionLogger`) take nothing from it.

    :param rewards: The composite rewards to read (default: those of the training env; none for a plain reward).
    """

    def __init__(self, rewards: list[Any] | None = None) -> None:
        super().__init__()
        self.series: dict[str, list[float]] = {}
        self._rewards = rewards
        self._readers: list[Any] = []

    def _init_callback(self) -> None:
        from sb3_grpo.callbacks.completions import composite_rewards

        if self._rewards is None:
            self._rewards = composite_rewards(self.training_env)
        self._readers = [reward.component_reader() for reward in self._rewards]  # from this run's first rollout

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        for reader in self._readers:
            for label, mean in reader.pop().items():
                self.series.setdefault(str(label), []).append(float(mean))

    def summary(self) -> dict[str, Any]:
        """Each term's mean in the first rollout, over the last three, and its whole series."""
        return {
            label: {"first": values[0], "last": float(np.mean(values[-3:])), "series": [round(v, 5) for v in values]}
            for label, values in self.series.items()
            if values
        }


class GradientNoiseProbe(BaseCallback):
    """After each rollout, the gradient noise of the policy-gradient surrogate on ``batches`` minibatches.

    :param slices: ``K``, the number of slices of a minibatch.
    :param batches: Minibatches probed per rollout.
    """

    def __init__(self, slices: int = 4, batches: int = 2) -> None:
        super().__init__()
        self.slices = slices
        self.batches = batches
        self.var: list[float] = []
        self.relative: list[float] = []

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        source = getattr(self.model, "batch_source", None)
        if source is None:  # not a GRPO: nothing to evaluate minibatches with
            return
        np_state, th_state = np.random.get_state(), th.get_rng_state()
        try:
            with th.enable_grad():
                for i, minibatch in enumerate(source.minibatches(self.model.rollout_buffer, self.model.batch_size)):
                    if i >= self.batches:
                        break
                    self._probe(source, minibatch)
        finally:
            np.random.set_state(np_state)
            th.set_rng_state(th_state)

    def _probe(self, source: Any, minibatch: Any) -> None:
        from sb3_grpo.objectives import relative_gradient_variance, slice_gradients, stacked_variance

        if len(minibatch.actions) < self.slices:
            return
        _, log_prob, _ = source.evaluate(minibatch)
        advantages = minibatch.advantages
        model = self.model
        if model.normalize_advantage and model.advantage == "gae" and len(advantages) > 1:
            advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        surrogate = th.exp(log_prob - minibatch.old_log_prob) * advantages
        params = [p for p in model.policy.parameters() if p.requires_grad]
        stacked = slice_gradients(
            [-part.mean() for part in th.tensor_split(surrogate, self.slices)], params, create_graph=False
        ).detach()
        var, rel = float(stacked_variance(stacked)), float(relative_gradient_variance(stacked))
        if math.isfinite(var) and math.isfinite(rel):
            self.var.append(var)
            self.relative.append(rel)

    def summary(self) -> dict[str, Any]:
        """Mean ``Var`` and mean relative variance over every probed minibatch of the run, and the relative variance
        of each probe in order (how it moves over training)."""
        return {
            "grad_var": float(np.mean(self.var)) if self.var else None,
            "grad_var_relative": float(np.mean(self.relative)) if self.relative else None,
            "probes": len(self.var),
            "grad_var_relative_series": [round(v, 6) for v in self.relative],
        }
