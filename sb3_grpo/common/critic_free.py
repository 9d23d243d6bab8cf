"""The base of the package's algorithms without a critic: :class:`CriticFreeAlgorithm`.

Dr. GRPO, DAPO, GSPO, CISPO and REINFORCE++ train no value function: their advantages come from returns alone, and
their loss of a minibatch is their own policy term plus PPO's entropy bonus. Such an algorithm writes only the policy
term (``_policy_loss``); the rest of the loss, its statistics and its micro-batch share are written once here.
"""

from __future__ import annotations

import torch as th

from sb3_grpo.common.on_policy import GroupOnPolicyAlgorithm
from sb3_grpo.common.type_aliases import Minibatch
from sb3_grpo.common.update.train_stats import LossTerms, TrainStats

__all__ = ["CriticFreeAlgorithm"]


class CriticFreeAlgorithm(GroupOnPolicyAlgorithm):
    """The skeleton (:class:`~sb3_grpo.common.on_policy.GroupOnPolicyAlgorithm`) with the loss of an algorithm
    without a critic: a subclass defines its policy term, :meth:`_policy_loss` (``vf_coef``, ``clip_range_vf`` and
    ``normalize_advantage`` have no effect)."""

    def _minibatch_loss(
        self,
        minibatch: Minibatch,
        clip_range: float,
        clip_range_vf: float | None,
        stats: TrainStats,
        measure_kl: bool = True,
    ) -> LossTerms:
        """The loss of one minibatch without a critic: the policy term (:meth:`_policy_loss`) plus PPO's entropy bonus,
        ``policy_loss + ent_coef * entropy_loss`` (a micro-batch's entropy mean weighted by its share of the
        minibatch's transitions), its statistics recorded in ``stats``.

        :param minibatch: The minibatch (per transition, with its sequences: ``Minibatch.sequence_ids``).
        :param clip_range: The update's ``eps``.
        :param clip_range_vf: The update's value clip range (``None``: no value clipping; unused without a critic).
        :param stats: Where the per-minibatch figures go.
        :param measure_kl: Compute ``approx_kl`` (PPO's early-stopping estimate); else ``LossTerms.approx_kl`` is
            ``None``.
        """
        del clip_range_vf  # no critic
        _, log_prob, entropy = self.batch_source.evaluate(minibatch)
        policy_loss = self._policy_loss(minibatch, log_prob, clip_range, stats)
        stats.pg_losses.append(policy_loss.item())
        # Entropy loss favor exploration (approximated when there is no analytical form)
        entropy_loss = -th.mean(-log_prob) if entropy is None else -th.mean(entropy)
        if minibatch.share is not None:  # a micro-batch: its mean weighted by its share of the transitions
            entropy_loss = entropy_loss * minibatch.share.fraction
        stats.entropy_losses.append(entropy_loss.item())
        loss = policy_loss + self._current_ent_coef * entropy_loss
        approx_kl_div = stats.add_approx_kl(log_prob, minibatch.old_log_prob) if measure_kl else None
        stats.last_loss = loss.item()
        return LossTerms(loss, approx_kl_div, {"pg_loss": stats.pg_losses[-1]}, stats.last_loss)

    def _policy_loss(
        self, minibatch: Minibatch, log_prob: th.Tensor, clip_range: float, stats: TrainStats
    ) -> th.Tensor:
        """The policy term of an algorithm without a critic (to be minimised; for a micro-batch, its share of the
        minibatch's), its clip fractions recorded in ``stats`` (:meth:`_minibatch_loss` adds the rest).

        :param minibatch: The minibatch.
        :param log_prob: ``log pi(a|s)`` of its actions under the current policy (with gradient).
        :param clip_range: The update's ``eps``.
        :param stats: Where the per-minibatch figures go.
        """
        raise NotImplementedError(f"{type(self).__name__} must define _policy_loss")
