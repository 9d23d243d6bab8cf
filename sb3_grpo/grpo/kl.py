"""The KL-to-reference term: its importance-weighted k3 estimate and Ziegler et al.'s adaptive controller.

``KL = (1/N) sum_i w_i k3_i`` over a minibatch's ``N`` actions, ``k3 = exp(ref - logp) - (ref - logp) - 1`` at the
current policy (Schulman 2020, "Approximating KL Divergence"; DeepSeekMath eq. 4) and ``w = pi_old(a|s) / mu(a|s)``,
``mu = (1 - alpha) * pi_old + alpha * uniform`` the distribution the action was drawn from
(:func:`~sb3_grpo.objectives.kl_k3_weighted_mean`). k3 is unbiased only for actions sampled from the policy; the
importance weight makes the mean over mixture samples an unbiased estimate of the one over the policy's own samples
(``E_mu[w f] = E_pi_old[f]``), so uniformly explored tokens, which the policy would rarely pick, count for little
instead of dominating. The rollout buffer stores both log-probs per action, ``log_probs`` (``log mu``, for the PPO
ratio) and ``policy_log_probs`` (``log pi_old``) (:class:`~sb3_grpo.common.buffers.PolicyLogProbMixin`). With
``alpha = 0`` every ``w`` is exactly 1 and ``KL`` is the plain mean. The weights correct each action, not the
states: a state reached after an explored token is still in the average. ``KL`` is what the loss, the log
(``train/kl_ref``) and the controller use. With ``kl_target``, ``kl_coef`` follows Ziegler et al.'s (arXiv
1909.08593) proportional controller after each update (:func:`adapt_kl_coef`).

The reference is a frozen copy of the initial policy, or a LoRA policy's own model with its adapters off; the
batch source gives its log-probs (:meth:`~sb3_grpo.common.update.batch_sources.TransitionBatches.reference_log_prob`).
"""

from __future__ import annotations

import copy

import numpy as np
import torch as th

from sb3_grpo.common.type_aliases import Minibatch
from sb3_grpo.common.update.batch_sources import BatchSource
from sb3_grpo.objectives import kl_k3_weighted_mean

__all__ = ["KL_CONTROLLER_CLIP", "KL_CONTROLLER_GAIN", "adapt_kl_coef", "frozen_copy", "kl_to_reference"]

# Ziegler et al. 2019 (arXiv 1909.08593), section 2.2: beta <- beta * (1 + K_beta * e), e clipped to +-0.2
KL_CONTROLLER_GAIN = 0.1
KL_CONTROLLER_CLIP = 0.2


def kl_to_reference(
    batch_source: BatchSource, minibatch: Minibatch, log_prob: th.Tensor, rollout_alpha: float, buffer_name: str
) -> th.Tensor:
    """
    The minibatch's importance-weighted k3 estimate of ``KL(pi || pi_ref)``
    (:func:`~sb3_grpo.objectives.kl_k3_weighted_mean`, weights ``pi_old / mu`` from the rollout).

    :param batch_source: Where the minibatch came from (it evaluates the reference).
    :param minibatch: The minibatch.
    :param log_prob: ``log pi(a|s)`` of its actions under the current policy (with gradient).
    :param rollout_alpha: The exploration weight the rollout was collected with.
    :param buffer_name: The rollout buffer's class name (for the error message).
    :raises RuntimeError: when the rollout explored but the buffer did not store the policy's own log-probs.
    """
    ref_log_prob = batch_source.reference_log_prob(minibatch)
    if minibatch.old_policy_log_prob is None:
        if rollout_alpha > 0:
            raise RuntimeError(
                f"GRPO: the rollout was collected with explore_alpha={rollout_alpha:.3g} but the "
                f"rollout buffer ({buffer_name}) does not store the policy's own log-probs, "
                "so the KL to the reference cannot be importance-weighted; use GRPO's buffers "
                "(sb3_grpo.common.buffers.GRPORolloutBuffer, GRPODictRolloutBuffer, SequenceRolloutBuffer)"
            )
        return kl_k3_weighted_mean(log_prob, ref_log_prob)
    return kl_k3_weighted_mean(log_prob, ref_log_prob, minibatch.old_policy_log_prob, minibatch.old_log_prob)


def adapt_kl_coef(kl_coef: float, kl_mean: float, kl_target: float) -> float:
    """Ziegler et al.'s proportional controller (arXiv 1909.08593, section 2.2), applied after each update:
    ``kl_coef * (1 + 0.1 * clip(KL / kl_target - 1, -0.2, 0.2))``; unchanged when ``KL`` is not finite.

    :param kl_coef: The current coefficient.
    :param kl_mean: The update's mean KL to the reference.
    :param kl_target: The target KL.
    """
    if not np.isfinite(kl_mean):
        return kl_coef
    error = np.clip(kl_mean / kl_target - 1.0, -KL_CONTROLLER_CLIP, KL_CONTROLLER_CLIP)
    return kl_coef * (1.0 + KL_CONTROLLER_GAIN * float(error))


def frozen_copy(policy: th.nn.Module) -> th.nn.Module:
    """A frozen copy of ``policy`` (no gradients, evaluation mode): the KL reference ``pi_ref``."""
    reference = copy.deepcopy(policy)
    reference.set_training_mode(False)
    for param in reference.parameters():
        param.requires_grad_(False)
    return reference
