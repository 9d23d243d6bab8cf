"""The loss of one minibatch: PPO's clipped surrogate, value and entropy terms, plus GRPO's penalty and KL.

Written out in the order of PPO's ``train`` (CleanRL's names: ``ratio``, ``pg_loss``, ``v_loss``, ``approx_kl``);
the formulas are the pure functions of :mod:`sb3_grpo.objectives`. :func:`minibatch_loss` records every figure
the update logs in a :class:`~sb3_grpo.grpo.stats.TrainStats`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch as th
from torch.nn import functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from sb3_grpo.common.type_aliases import Minibatch
from sb3_grpo.grpo.kl import kl_to_reference
from sb3_grpo.grpo.penalty import slice_sizes
from sb3_grpo.grpo.stats import TrainStats
from sb3_grpo.objectives import adaptive_clip_range, clip_fractions, clipped_surrogate

__all__ = ["LossTerms", "minibatch_loss", "stop_early"]


class LossTerms(NamedTuple):
    """One minibatch's loss and what the step after it needs (the KL estimate for early stopping, the log)."""

    loss: th.Tensor
    approx_kl: np.ndarray | None  # None: not measured (see minibatch_loss's measure_kl)
    details: dict[str, float]
    value: float  # loss.item(), fetched once


def minibatch_loss(
    model: Any,
    minibatch: Minibatch,
    clip_range: float,
    clip_range_vf: float | None,
    stats: TrainStats,
    measure_kl: bool = True,
) -> LossTerms:
    """PPO's loss of one minibatch plus GRPO's terms, with its statistics recorded in ``stats``.

    :param model: The algorithm (a :class:`~sb3_grpo.GRPO`): its coefficients, batch source and policy.
    :param minibatch: The minibatch.
    :param clip_range: The update's ``eps``.
    :param clip_range_vf: The update's value clip range (``None``: no value clipping).
    :param stats: Where the per-minibatch figures go.
    :param measure_kl: Compute ``approx_kl`` (PPO's early-stopping estimate). Without ``target_kl`` only the last
        epoch's are logged, so the other epochs skip it (``LossTerms.approx_kl`` is then ``None``).
    """
    n_slices = min(model.grad_var_slices, len(minibatch.actions))
    use_grad_var = model.grad_var_coef > 0 and n_slices >= 2
    use_critic = model.advantage == "gae"
    values, log_prob, entropy, slice_log_probs = _evaluate(model, minibatch, n_slices if use_grad_var else 0)
    # Normalize advantage (GAE only: group advantages are already normalized, and the steps
    # that have no complete group must keep advantage 0)
    advantages = minibatch.advantages
    # Normalization does not make sense if mini batchsize == 1, see GH issue #325
    if model.normalize_advantage and use_critic and len(advantages) > 1:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)

    # Per-sample clip range: eps (PPO) or eps * scale(sign A) (adaptive clip)
    eps = (
        clip_range if model.adaptive_clip is None else adaptive_clip_range(advantages, clip_range, model.adaptive_clip)
    )

    # ratio between old and new policy, should be one at the first iteration
    # (not with mixed exploration: the old log-prob is the mixture's)
    ratio = th.exp(log_prob - minibatch.old_log_prob)
    # clipped surrogate loss
    surrogate = clipped_surrogate(ratio, advantages, eps)
    policy_loss = -surrogate.mean()
    # the penalty's slice objectives, each from its own slice's outputs only (the same figures as slices of
    # `surrogate`, but none of their graphs goes through the concatenation of the other slices)
    slice_objectives = (
        _slice_objectives(slice_log_probs, minibatch.old_log_prob, advantages, eps) if use_grad_var else []
    )

    stats.pg_losses.append(policy_loss.item())
    with th.no_grad():
        fraction, fraction_pos, fraction_neg = clip_fractions(ratio, eps, advantages)
    stats.clip_fractions.append(fraction)
    stats.clip_fractions_pos.append(fraction_pos)
    stats.clip_fractions_neg.append(fraction_neg)

    # Entropy loss favor exploration (approximated when there is no analytical form)
    entropy_loss = -th.mean(-log_prob) if entropy is None else -th.mean(entropy)
    stats.entropy_losses.append(entropy_loss.item())
    if use_critic:
        if clip_range_vf is None:
            values_pred = values  # No clipping
        else:
            # Clip the difference between old and new value; NOTE: this depends on the reward scaling
            values_pred = minibatch.old_values + th.clamp(values - minibatch.old_values, -clip_range_vf, clip_range_vf)
        # Value loss using the TD(gae_lambda) target
        value_loss = F.mse_loss(minibatch.returns, values_pred)
        stats.value_losses.append(value_loss.item())
        loss = policy_loss + model.ent_coef * entropy_loss + model.vf_coef * value_loss
    else:
        # group forms: no critic (DeepSeekMath GRPO), the value head is not trained
        loss = policy_loss + model.ent_coef * entropy_loss

    details = {"pg_loss": stats.pg_losses[-1]}
    loss = _add_grpo_terms(model, loss, minibatch, slice_objectives, log_prob, stats, details)

    # Calculate approximate form of reverse KL Divergence for early stopping
    # see issue #417: https://github.com/DLR-RM/stable-baselines3/issues/417
    # and discussion in PR #419: https://github.com/DLR-RM/stable-baselines3/pull/419
    # and Schulman blog: http://joschu.net/blog/kl-approx.html
    approx_kl_div = None
    if measure_kl:
        with th.no_grad():
            log_ratio = log_prob - minibatch.old_log_prob
            approx_kl_div = th.mean((th.exp(log_ratio) - 1) - log_ratio).cpu().numpy()
            stats.approx_kl_divs.append(approx_kl_div)
    stats.last_loss = loss.item()
    return LossTerms(loss, approx_kl_div, details, stats.last_loss)


def _evaluate(
    model: Any, minibatch: Minibatch, n_slices: int
) -> tuple[th.Tensor, th.Tensor, th.Tensor | None, list[th.Tensor]]:
    """The policy's ``(values, log_prob, entropy)`` on the minibatch, in one forward, or (``n_slices >= 2``: the
    gradient-variance penalty) one forward per slice, with the slices' log-probs (else ``[]``)."""
    if n_slices >= 2:
        # each slice in its own forward (large policies), so that each slice gradient walks its own graph; the
        # fused attention kernels (flash / memory-efficient) have no double backward: record attention with the
        # math kernel so that Var can be differentiated (no-op for MLPs)
        sizes = slice_sizes(len(minibatch.actions), n_slices)
        with sdpa_kernel(SDPBackend.MATH):
            parts = model.batch_source.evaluate_slices(minibatch, sizes)
        values, log_prob = th.cat([p[0] for p in parts]), th.cat([p[1] for p in parts])
        entropy = None if any(p[2] is None for p in parts) else th.cat([p[2] for p in parts])
        return values, log_prob, entropy, [p[1] for p in parts]
    values, log_prob, entropy = model.batch_source.evaluate(minibatch)
    return values, log_prob, entropy, []


def _slice_objectives(
    log_probs: list[th.Tensor], old_log_prob: th.Tensor, advantages: th.Tensor, eps: float | th.Tensor
) -> list[th.Tensor]:
    """``L_k = -mean(clipped surrogate)`` of each slice, from that slice's log-probs only.

    :param log_probs: The slices' ``log pi(a|s)`` (with gradient), consecutive.
    :param old_log_prob: The whole minibatch's old log-probs.
    :param advantages: The whole minibatch's (normalized) advantages.
    :param eps: The clip range, a float or per sample.
    """
    objectives, lo = [], 0
    for part in log_probs:
        hi = lo + len(part)
        part_eps = eps[lo:hi] if isinstance(eps, th.Tensor) else eps
        ratio = th.exp(part - old_log_prob[lo:hi])
        objectives.append(-clipped_surrogate(ratio, advantages[lo:hi], part_eps).mean())
        lo = hi
    return objectives


def _add_grpo_terms(
    model: Any,
    loss: th.Tensor,
    minibatch: Minibatch,
    slice_objectives: list[th.Tensor],
    log_prob: th.Tensor,
    stats: TrainStats,
    details: dict[str, float],
) -> th.Tensor:
    """``loss`` plus GRPO's terms: ``grad_var_coef * Var`` (given ``K >= 2`` slice objectives) and ``kl_coef * KL``
    (``kl_coef > 0``).

    :param slice_objectives: The penalty's ``K`` slice objectives, each from its own forward (empty: no penalty).
    :param log_prob: ``log pi(a|s)`` of the minibatch's actions (with gradient).
    :param details: The figures a non-finite loss's error message shows (updated in place).
    """
    if len(slice_objectives) >= 2:
        # Var[grad L_CLIP] over K contiguous slices of the (randomly permuted) minibatch; its
        # gradient comes from double backprop when loss.backward() runs
        grad_var = model._grad_var(slice_objectives, separate_graphs=model.batch_source.separate_slices)
        stats.grad_vars.append(grad_var.item())
        details["grad_var"] = stats.grad_vars[-1]
        loss = loss + model.grad_var_coef * grad_var
    if model.kl_coef > 0:
        # (1/N) sum w * k3 with w = pi_old / mu: the KL of the policy's own samples, from the
        # mixture's (exactly the plain k3 mean when alpha = 0); the log and the controller use it too
        buffer_name = type(model.rollout_buffer).__name__
        kl_ref = kl_to_reference(model.batch_source, minibatch, log_prob, model._rollout_explore_alpha, buffer_name)
        stats.kl_refs.append(kl_ref.item())
        details["kl_ref"] = stats.kl_refs[-1]
        loss = loss + model.kl_coef * kl_ref
    return loss


def stop_early(model: Any, terms: LossTerms | None, epoch: int) -> bool:
    """PPO's ``target_kl``: stop the epochs when ``approx_kl > 1.5 * target_kl``; under ``torch.distributed`` the mean
    over the ranks, so all stop together (an idle step, ``terms=None``, adds nothing to the mean).

    :param model: The algorithm (its ``target_kl``, data-parallel seam and verbosity).
    :param terms: The minibatch's loss terms, or ``None`` for an idle step.
    :param epoch: The epoch (for the message).
    """
    if model.target_kl is None:
        return False
    if terms is None:
        approx_kl_div = model._data_parallel.mean(0.0, 0.0)
    else:
        approx_kl_div = model._data_parallel.mean(terms.approx_kl)
    if approx_kl_div > 1.5 * model.target_kl:
        if model.verbose >= 1 and terms is not None:
            print(f"Early stopping at step {epoch} due to reaching max kl: {approx_kl_div:.2f}")
        return True
    return False
