"""
The loss pieces of GRPO as small, pure torch functions.

Every function here is stateless: tensors in, tensors out. :class:`sb3_grpo.GRPO` composes them; the tests
pin each one down against a brute-force reference. Names follow CleanRL / SB3 PPO (``ratio``, ``pg_loss``,
``approx_kl``, ``clipfracs``).

Sources, one per mechanism:

- clipped surrogate: Schulman et al. 2017, "Proximal Policy Optimization Algorithms", arXiv 1707.06347, eq. 7.
- asymmetric / adaptive clip range: this project's design (``eps * 1.1`` for positive advantages,
  ``eps * 0.9`` otherwise); asymmetric ranges in the same spirit as "clip-higher" in DAPO, arXiv 2503.14476.
- gradient-variance penalty: this project's design, ``L = L_CLIP - beta * Var[grad L_CLIP]``; ``Var`` is
  defined exactly in :func:`gradient_variance`; its gradient is obtained by double backpropagation.
- k3 KL estimator: J. Schulman, "Approximating KL Divergence", 2020, http://joschu.net/blog/kl-approx.html;
  used per token in DeepSeekMath's GRPO loss, arXiv 2402.03300, eq. 4. Under mixed exploration its mean is
  importance-weighted back to the policy's own samples (ordinary importance sampling: ``E_mu[(pi / mu) f] =
  E_pi[f]`` wherever ``mu > 0`` where ``pi > 0``; Owen, "Monte Carlo theory, methods and examples", 2013, ch. 9;
  Precup et al. 2000).
- group-relative advantage: Shao et al. 2024, "DeepSeekMath", arXiv 2402.03300, section 4.1.2.
- leave-one-out (RLOO) baseline: Kool et al. 2019 "Buy 4 REINFORCE samples, get a baseline for free!";
  Ahmadian et al. 2024, "Back to Basics", arXiv 2402.14740, eq. 6.
- self-critical baseline: Rennie et al. 2017, "Self-critical Sequence Training for Image Captioning",
  arXiv 1612.00563, eq. 8.
- uniform-mixture exploration: this project's design, ``(1 - alpha) * pi + alpha * uniform``; the mixture
  density is what makes the PPO ratio an honest importance weight (Precup et al. 2000 style off-policy
  correction).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch as th
from gymnasium import spaces

__all__ = [
    "adaptive_clip_range",
    "clip_fraction",
    "clipped_surrogate",
    "gradient_variance",
    "group_advantages",
    "kl_k3",
    "kl_k3_weighted_mean",
    "mixture_log_prob",
    "pearson_corr",
    "relative_gradient_variance",
    "rloo_advantages",
    "self_critical_advantages",
    "slice_gradients",
    "stacked_variance",
    "uniform_log_prob",
    "uniform_sample",
]


# ----------------------------------------------------------------------------------------------------------
# Clipped surrogate and clip ranges
# ----------------------------------------------------------------------------------------------------------
def clipped_surrogate(ratio: th.Tensor, advantages: th.Tensor, clip_range: float | th.Tensor) -> th.Tensor:
    """
    Per-sample clipped surrogate objective (to be *maximized*), PPO eq. 7 (arXiv 1707.06347):

    ``L_CLIP_i = min(r_i * A_i, clip(r_i, 1 - eps_i, 1 + eps_i) * A_i)``

    With a float ``clip_range`` this performs exactly the operations of SB3's ``PPO.train``
    (``th.clamp`` with scalar bounds), so ``pg_loss = -clipped_surrogate(...).mean()`` is bit-identical to
    SB3's ``policy_loss``. With a tensor, each sample has its own range (see :func:`adaptive_clip_range`).

    :param ratio: ``pi_new(a|s) / pi_old(a|s)``, shape ``(B,)``
    :param advantages: advantage estimates, shape ``(B,)``
    :param clip_range: ``eps``, a float or a per-sample tensor of shape ``(B,)``
    :return: the per-sample surrogate, shape ``(B,)``
    """
    policy_loss_1 = advantages * ratio
    # th.clamp accepts Python scalars (SB3's exact ops) as well as per-sample tensor bounds
    policy_loss_2 = advantages * th.clamp(ratio, 1 - clip_range, 1 + clip_range)
    return th.min(policy_loss_1, policy_loss_2)


def adaptive_clip_range(
    advantages: th.Tensor, clip_range: float, scales: tuple[float, float] = (1.1, 0.9)
) -> th.Tensor:
    """
    Asymmetric, per-sample clip range from the sign of the advantage:

    ``eps_i = eps * scales[0]`` if ``A_i > 0`` else ``eps * scales[1]``

    With the default ``(1.1, 0.9)`` the policy may move further toward actions that did better than
    expected and less far toward (away from) the others. ``eps`` is the value of SB3's ``clip_range``
    schedule at the current progress, so schedules compose (the scales multiply whatever the schedule gives).
    The sign is taken of the advantage *as used in the loss* (after minibatch normalization, if any).

    :param advantages: advantages as used in the surrogate, shape ``(B,)``
    :param clip_range: the base ``eps`` (current value of the clip-range schedule)
    :param scales: ``(scale for A > 0, scale for A <= 0)``, both positive
    :return: per-sample ``eps_i``, shape ``(B,)``, same dtype and device as ``advantages``
    """
    pos = th.full_like(advantages, clip_range * scales[0])
    neg = th.full_like(advantages, clip_range * scales[1])
    return th.where(advantages > 0, pos, neg)


def clip_fraction(ratio: th.Tensor, clip_range: float | th.Tensor, mask: th.Tensor | None = None) -> float:
    """
    Fraction of samples whose ratio lies outside ``[1 - eps_i, 1 + eps_i]`` (SB3's ``clip_fraction``;
    CleanRL's ``clipfracs``).

    :param ratio: ``pi_new / pi_old``, shape ``(B,)``
    :param clip_range: ``eps`` (float) or per-sample ``eps_i`` (tensor ``(B,)``)
    :param mask: optional boolean mask selecting the samples to count (e.g. positive advantages)
    :return: the fraction as a Python float (``nan`` if the mask selects nothing)
    """
    clipped = (th.abs(ratio - 1) > clip_range).float()
    if mask is None:
        return th.mean(clipped).item()
    if not bool(mask.any()):
        return float("nan")
    return th.mean(clipped[mask]).item()


# ----------------------------------------------------------------------------------------------------------
# Gradient-variance penalty
# ----------------------------------------------------------------------------------------------------------
def gradient_variance(
    slice_objectives: Sequence[th.Tensor],
    params: Sequence[th.Tensor],
    create_graph: bool = True,
    batched: bool = False,
) -> th.Tensor:
    r"""
    Variance of the policy gradient across minibatch slices: the trace of the empirical covariance of the
    slice gradients,

    ``g_k = grad_theta L_k``  (``L_k`` = mean clipped surrogate over slice ``k`` of the minibatch)

    ``Var = (1 / K) * sum_k || g_k - g_bar ||^2``,  with ``g_bar = (1 / K) * sum_j g_j``

    where ``theta`` are ``params`` (all trainable parameters, or a named subset) and ``||.||`` is the
    Euclidean norm over all of them concatenated. It is the (biased, ``1/K``) sample variance of the slice
    gradients summed over coordinates. ``Var`` is invariant to the sign of the ``L_k``.

    With ``create_graph=True`` each ``g_k`` keeps its graph, so ``Var`` is a differentiable tensor and
    ``Var.backward()`` gives ``grad_theta Var`` by double backpropagation (Hessian-vector products,
    Pearlmutter 1994). GRPO minimizes ``pg_loss + beta * Var``, i.e. maximizes ``L_CLIP - beta * Var``.

    :param slice_objectives: ``K >= 2`` scalar tensors ``L_1 .. L_K``, each built from its own slice
    :param params: the parameters ``theta``; parameters that do not influence an ``L_k`` count as zero
    :param create_graph: keep the graph of the slice gradients (needed to differentiate ``Var``)
    :param batched: compute the ``K`` gradients in one vectorized backward pass
        (``torch.autograd.grad(..., is_grads_batched=True)``, i.e. ``vmap`` over the backward) instead of
        ``K`` passes; same result, fewer kernel launches. Needs batching rules for every backward op.
    :return: scalar tensor ``Var``
    """
    return stacked_variance(slice_gradients(slice_objectives, params, create_graph=create_graph, batched=batched))


def stacked_variance(stacked: th.Tensor) -> th.Tensor:
    """``Var = (1 / K) * sum_k || g_k - g_bar ||^2`` of stacked slice gradients ``(K, n_params)``."""
    centered = stacked - stacked.mean(dim=0, keepdim=True)
    return centered.pow(2).sum(dim=1).mean()


def slice_gradients(
    slice_objectives: Sequence[th.Tensor],
    params: Sequence[th.Tensor],
    create_graph: bool = True,
    batched: bool = False,
) -> th.Tensor:
    """
    The gradients ``g_k = grad_theta L_k`` of ``K >= 2`` slice objectives, flattened over ``params`` and stacked:
    shape ``(K, n_params)`` (see :func:`gradient_variance` for the arguments).
    """
    n_slices = len(slice_objectives)
    if n_slices < 2:
        raise ValueError(f"slice gradients need at least 2 slices, got {n_slices}")
    params = list(params)
    if batched:
        objectives = th.stack(list(slice_objectives))
        eye = th.eye(n_slices, dtype=objectives.dtype, device=objectives.device)
        grads = th.autograd.grad(
            objectives, params, grad_outputs=eye, is_grads_batched=True,
            create_graph=create_graph, retain_graph=True, allow_unused=True,
        )  # fmt: skip
        stacked = th.cat(
            [
                (
                    th.zeros((n_slices, p.numel()), dtype=p.dtype, device=p.device)
                    if g is None
                    else g.reshape(n_slices, -1)
                )
                for g, p in zip(grads, params, strict=True)
            ],
            dim=1,
        )
    else:
        flat_grads = []
        for objective in slice_objectives:
            grads = th.autograd.grad(objective, params, create_graph=create_graph, retain_graph=True, allow_unused=True)
            flat_grads.append(
                th.cat([(th.zeros_like(p) if g is None else g).reshape(-1) for g, p in zip(grads, params, strict=True)])
            )
        stacked = th.stack(flat_grads)  # (K, n_params)
    return stacked


def relative_gradient_variance(stacked: th.Tensor, eps: float = 1e-12) -> th.Tensor:
    """
    The scale-free gradient noise ``Var / ((1/K) sum_k ||g_k||^2)`` of stacked slice gradients ``(K, n)``: the
    fraction of the slice gradients' energy that is spread around their mean, in ``[0, 1]``, since
    ``(1/K) sum_k ||g_k||^2 = Var + ||g_bar||^2``. 0 when the slices agree, ``1 - 1/K`` for independent
    zero-mean slices, 1 when they cancel. Unlike ``Var`` it does not change when the loss is rescaled (the
    advantages of different baselines have different scales), so it compares gradient noise across them.

    :param stacked: ``(K, n_params)``, from :func:`slice_gradients`
    :param eps: added to the denominator
    """
    return stacked_variance(stacked) / (stacked.pow(2).sum(dim=1).mean() + eps)
