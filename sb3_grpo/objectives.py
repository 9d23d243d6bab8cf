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
- turn-level leave-one-out baseline for interactive episodes: RLOO's baseline (above) taken per turn over the
  members that reached the turn, on the turns' returns-to-go (REINFORCE's causality: Williams 1992; Sutton et al.
  2000); this project's estimator, its bias stated in :func:`turn_rloo_advantages`.
- role-conditioned advantages: Liu et al. 2025, "SPIRAL: Self-Play on Zero-Sum Games Incentivizes Reasoning via
  Multi-Agent Multi-Turn Reinforcement Learning", arXiv 2506.24119, section 3 (role-conditioned advantage
  estimation: a baseline per game and role).
- self-critical baseline: Rennie et al. 2017, "Self-critical Sequence Training for Image Captioning",
  arXiv 1612.00563, eq. 8.
- decoupled clip ("clip-higher"), token-level loss, soft overlong punishment, dynamic sampling: Yu et al. 2025,
  "DAPO: An Open-Source LLM Reinforcement Learning System at Scale", arXiv 2503.14476, sections 3.1-3.4, eqs. 8-13.
- sequence-level importance ratio and clip: Zheng et al. 2025, "Group Sequence Policy Optimization", arXiv
  2507.18071, section 4.1, eqs. 5-7; its token-level variant GSPO-token, section 4.3.
- clipped, detached importance weight: MiniMax 2025, "MiniMax-M1: Scaling Test-Time Compute Efficiently with
  Lightning Attention", arXiv 2506.13585, section 3.1, eqs. 4-5 (CISPO).
- token-level KL penalty in the reward, returns-to-go normalised over the whole batch: Hu 2025, "REINFORCE++: A
  Simple and Efficient Approach for Aligning Large Language Models", arXiv 2501.03262, eqs. 8-10 (REINFORCE++).
- uniform-mixture exploration: this project's design, ``(1 - alpha) * pi + alpha * uniform``; the mixture
  density is what makes the PPO ratio an honest importance weight (Precup et al. 2000 style off-policy
  correction).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import torch as th
from gymnasium import spaces

__all__ = [
    "adaptive_clip_range",
    "clip_fraction",
    "clip_fractions",
    "cispo_objective",
    "clipped_surrogate",
    "decoupled_eps",
    "constant_normalized_sum",
    "decoupled_clipped_surrogate",
    "gspo_objective",
    "gspo_token_objective",
    "informative_groups",
    "gradient_variance",
    "group_advantages",
    "batch_normalized_returns",
    "kl_k3",
    "kl_k3_weighted_mean",
    "returns_to_go",
    "mixture_log_prob",
    "overlong_penalty",
    "pearson_corr",
    "relative_gradient_variance",
    "rloo_advantages",
    "role_advantages",
    "role_ema_advantages",
    "self_critical_advantages",
    "sequence_mean",
    "sequence_ratio",
    "slice_gradients",
    "stacked_variance",
    "turn_returns_to_go",
    "turn_rloo_advantages",
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


def clip_fractions(
    ratio: th.Tensor, clip_range: float | th.Tensor, advantages: th.Tensor
) -> tuple[float, float, float]:
    """
    :func:`clip_fraction` of all samples, of those with a positive advantage and of the others, with one
    device-to-host transfer for the three.

    :param ratio: ``pi_new / pi_old``, shape ``(B,)``
    :param clip_range: ``eps`` (float) or per-sample ``eps_i`` (tensor ``(B,)``)
    :param advantages: the advantages, shape ``(B,)``
    :return: ``(all, positive, non-positive)`` fractions (``nan`` for a group with no sample)
    """
    clipped = (th.abs(ratio - 1) > clip_range).float()
    positive = (advantages > 0).float()
    # the clipped positives as a dot product of the 0/1 masks (one op fewer than a product and a sum; exact)
    sums = th.stack([clipped.mean(), clipped.sum(), th.dot(clipped, positive), positive.sum()])
    fraction, clipped_all, clipped_pos, n_pos = sums.tolist()  # mean as SB3 computes it; exact counts
    n = len(ratio)
    pos = clipped_pos / n_pos if n_pos > 0 else float("nan")
    neg = (clipped_all - clipped_pos) / (n - n_pos) if n_pos < n else float("nan")
    return fraction, pos, neg


def decoupled_clipped_surrogate(
    ratio: th.Tensor, advantages: th.Tensor, clip_range_low: float, clip_range_high: float
) -> th.Tensor:
    """
    DAPO's decoupled clip ("clip-higher", Yu et al. 2025, arXiv 2503.14476, section 3.1, eq. 10), per token:

    ``min(r_t * A_t, clip(r_t, 1 - eps_low, 1 + eps_high) * A_t)``

    The ratio's lower and upper bounds are set apart: a larger ``eps_high`` (the paper: ``eps_low = 0.2``,
    ``eps_high = 0.28``) lets a token the policy finds unlikely grow more before the clip stops its gradient, which
    the paper finds keeps the policy's entropy from collapsing. With ``eps_low == eps_high == eps`` this is
    :func:`clipped_surrogate`. Which bound acts depends on the sign of ``A_t``: for ``A_t > 0`` only the upper one
    (the ratio may not push above ``1 + eps_high``), for ``A_t < 0`` only the lower one.

    :param ratio: ``pi(a|s) / pi_old(a|s)``, shape ``(B,)``
    :param advantages: the advantages, shape ``(B,)``
    :param clip_range_low: ``eps_low`` (the ratio's floor is ``1 - eps_low``)
    :param clip_range_high: ``eps_high`` (the ratio's ceiling is ``1 + eps_high``)
    :return: the per-token surrogate (to be maximised), shape ``(B,)``
    """
    unclipped = advantages * ratio
    clipped = advantages * th.clamp(ratio, 1 - clip_range_low, 1 + clip_range_high)
    return th.min(unclipped, clipped)


def decoupled_eps(ratio: th.Tensor, clip_range_low: float, clip_range_high: float) -> th.Tensor:
    """Per token, the distance to the bound on the ratio's side of 1 (``eps_high`` above 1, ``eps_low`` below), so
    that ``|r - 1| > eps`` says the ratio left ``[1 - eps_low, 1 + eps_high]`` (the clip fraction of a decoupled clip:
    :func:`clip_fractions`).

    :param ratio: ``pi(a|s) / pi_old(a|s)``, shape ``(B,)``
    :param clip_range_low: ``eps_low``
    :param clip_range_high: ``eps_high``
    """
    return th.where(ratio > 1, th.full_like(ratio, clip_range_high), th.full_like(ratio, clip_range_low))


def overlong_penalty(
    lengths: np.ndarray, max_tokens: int, buffer_tokens: int, penalty_factor: float = 1.0
) -> np.ndarray:
    """
    DAPO's soft overlong punishment (Yu et al. 2025, arXiv 2503.14476, section 3.4, eq. 13), added to a
    completion's reward:

    ``R_len(y) = 0``                                           if ``|y| <= L_max - L_cache``
    ``R_len(y) = ((L_max - L_cache) - |y|) / L_cache``         if ``L_max - L_cache < |y| <= L_max``
    ``R_len(y) = -1``                                          if ``|y| > L_max``

    times ``penalty_factor``: a completion is punished linearly over the last ``L_cache`` tokens of the budget
    ``L_max``, reaching ``-penalty_factor`` at the budget (the paper: ``L_max = 20480``, ``L_cache = 4096``).

    :param lengths: ``|y|`` of each completion, any shape
    :param max_tokens: ``L_max``, the completion budget
    :param buffer_tokens: ``L_cache``, the punishment buffer (``0``: no penalty below the budget, ``-1`` past it)
    :param penalty_factor: the penalty at the budget (the paper's ``1``)
    :return: the penalty of each completion (``<= 0``), float64, the shape of ``lengths``
    """
    lengths = np.asarray(lengths, dtype=np.float64)
    start = max_tokens - buffer_tokens
    ramp = (start - lengths) / buffer_tokens if buffer_tokens > 0 else np.zeros_like(lengths)
    penalty = np.where(lengths <= start, 0.0, np.where(lengths <= max_tokens, ramp, -1.0))
    return penalty_factor * penalty


def informative_groups(returns: th.Tensor, group_ids: th.Tensor) -> th.Tensor:
    """
    DAPO's dynamic-sampling test (Yu et al. 2025, arXiv 2503.14476, section 3.2, eq. 11): a group whose
    completions all have the same reward gives every member a zero group advantage and the update no signal.

    ``informative(i) = max_{j in g(i)} r_j > min_{j in g(i)} r_j``

    :param returns: one return per episode, shape ``(E,)``
    :param group_ids: the group of each episode, shape ``(E,)``
    :return: per episode, whether its group is informative, boolean ``(E,)``
    """
    returns = returns.double()
    _, index = th.unique(group_ids, return_inverse=True)
    n_groups = int(index.max()) + 1 if index.numel() else 0
    highest = th.full((n_groups,), -math.inf, dtype=returns.dtype).scatter_reduce(0, index, returns, "amax")
    lowest = th.full((n_groups,), math.inf, dtype=returns.dtype).scatter_reduce(0, index, returns, "amin")
    return (highest > lowest)[index]


def sequence_mean(values: th.Tensor, sequence_index: th.Tensor, n_sequences: int) -> th.Tensor:
    """
    The mean of each sequence's tokens, ``(1 / |y_i|) sum_{t in y_i} x_t``.

    :param values: one value per token, shape ``(B,)``
    :param sequence_index: each token's sequence as a row ``0 .. S - 1``
        (:func:`~sb3_grpo.common.type_aliases.sequence_index`), shape ``(B,)``
    :param n_sequences: ``S``
    :return: shape ``(S,)``
    """
    sums = th.zeros(n_sequences, dtype=values.dtype, device=values.device).index_add(0, sequence_index, values)
    counts = th.zeros(n_sequences, dtype=values.dtype, device=values.device).index_add(
        0, sequence_index, th.ones_like(values)
    )
    return sums / counts


def sequence_ratio(
    log_prob: th.Tensor, old_log_prob: th.Tensor, sequence_index: th.Tensor, n_sequences: int
) -> th.Tensor:
    """
    GSPO's sequence-level importance ratio (Zheng et al. 2025, arXiv 2507.18071, section 4.1, eq. 7), the
    length-normalised (geometric-mean) likelihood ratio of each sequence:

    ``s_i = (pi(y_i|x) / pi_old(y_i|x)) ** (1 / |y_i|) = exp((1 / |y_i|) sum_t (log pi(y_i,t) - log pi_old(y_i,t)))``

    :param log_prob: ``log pi(a_t|s_t)`` per token, shape ``(B,)``
    :param old_log_prob: ``log pi_old(a_t|s_t)`` per token, shape ``(B,)``
    :param sequence_index: each token's sequence, ``0 .. S - 1``, shape ``(B,)``
    :param n_sequences: ``S``
    :return: ``s_i``, shape ``(S,)``
    """
    return th.exp(sequence_mean(log_prob - old_log_prob, sequence_index, n_sequences))


def gspo_objective(
    sequence_ratios: th.Tensor, sequence_advantages: th.Tensor, clip_range_low: float, clip_range_high: float
) -> th.Tensor:
    """
    GSPO's objective (Zheng et al. 2025, arXiv 2507.18071, section 4.1, eq. 5), to be maximised: the clipped
    surrogate of whole sequences, averaged over them,

    ``J = (1 / S) sum_i min(s_i * A_i, clip(s_i, 1 - eps_low, 1 + eps_high) * A_i)``

    with ``s_i`` of :func:`sequence_ratio`. The paper's clip ranges are ``eps_low = 3e-4``, ``eps_high = 4e-4``
    (section 5.1): a length-normalised ratio moves far less than a token's.

    :param sequence_ratios: ``s_i``, shape ``(S,)``
    :param sequence_advantages: ``A_i``, shape ``(S,)``
    :param clip_range_low: ``eps_low``
    :param clip_range_high: ``eps_high``
    :return: ``J``, a scalar
    """
    return decoupled_clipped_surrogate(sequence_ratios, sequence_advantages, clip_range_low, clip_range_high).mean()


def gspo_token_objective(
    log_prob: th.Tensor,
    old_log_prob: th.Tensor,
    advantages: th.Tensor,
    sequence_index: th.Tensor,
    n_sequences: int,
    clip_range_low: float,
    clip_range_high: float,
) -> th.Tensor:
    """
    GSPO-token's objective (Zheng et al. 2025, arXiv 2507.18071, section 4.3), to be maximised: GSPO with
    an advantage per token,

    ``J = (1 / S) sum_i (1 / |y_i|) sum_t min(s_i,t * A_i,t, clip(s_i,t, 1 - eps_low, 1 + eps_high) * A_i,t)``,
    ``s_i,t = sg[s_i] * pi(y_i,t) / sg[pi(y_i,t)]``

    so ``s_i,t`` has the value of the sequence ratio ``s_i`` (:func:`sequence_ratio`) and the gradient
    ``s_i * grad log pi(y_i,t)``. With every ``A_i,t = A_i`` it equals :func:`gspo_objective` in value and gradient
    (the paper's remark, tested); per-turn advantages (``advantage="group_turn"``) need this form.

    :param log_prob: ``log pi(a_t|s_t)`` per token, shape ``(B,)``
    :param old_log_prob: ``log pi_old(a_t|s_t)`` per token, shape ``(B,)``
    :param advantages: ``A_i,t``, shape ``(B,)``
    :param sequence_index: each token's sequence, ``0 .. S - 1``, shape ``(B,)``
    :param n_sequences: ``S``
    :param clip_range_low: ``eps_low``
    :param clip_range_high: ``eps_high``
    :return: ``J``, a scalar
    """
    sequence = sequence_ratio(log_prob, old_log_prob, sequence_index, n_sequences).detach()
    token_ratio = sequence[sequence_index] * th.exp(log_prob - log_prob.detach())
    surrogate = decoupled_clipped_surrogate(token_ratio, advantages, clip_range_low, clip_range_high)
    return sequence_mean(surrogate, sequence_index, n_sequences).mean()


def cispo_objective(
    log_prob: th.Tensor,
    old_log_prob: th.Tensor,
    advantages: th.Tensor,
    clip_range_low: float | None,
    clip_range_high: float,
) -> th.Tensor:
    """
    CISPO's objective (MiniMax 2025, arXiv 2506.13585, section 3.1, eqs. 4-5), to be maximised, per token:

    ``J_t = sg(clip(r_t, 1 - eps_low, 1 + eps_high)) * A_t * log pi(a_t|s_t)``

    the importance weight ``r_t = pi / pi_old`` clipped and detached (``sg``: stop-gradient), so that every token
    keeps a gradient ``clip(r_t) * A_t * grad log pi``: unlike PPO's clip, which zeroes the gradient of a token whose
    ratio left the range, CISPO only caps its weight. The paper sets no lower bound in practice (``eps_low`` large:
    ``clip_range_low=None`` here) and tunes only ``eps_high``. The loss is ``-`` the mean of ``J_t`` over the
    minibatch's tokens (the paper's ``1 / sum_i |o_i|``).

    :param log_prob: ``log pi(a_t|s_t)`` (with its graph), shape ``(B,)``
    :param old_log_prob: ``log pi_old(a_t|s_t)``, shape ``(B,)``
    :param advantages: ``A_t``, shape ``(B,)``
    :param clip_range_low: ``eps_low``, or ``None`` for no lower bound
    :param clip_range_high: ``eps_high``
    :return: ``J_t`` per token, shape ``(B,)``
    """
    ratio = th.exp(log_prob - old_log_prob).detach()
    low = None if clip_range_low is None else 1 - clip_range_low
    weight = th.clamp(ratio, min=low, max=1 + clip_range_high)
    return weight * advantages * log_prob


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
    gradients summed over coordinates. ``Var`` is invariant to the sign of the ``L_k``. It is summed parameter
    by parameter (``sum_p (1/K) sum_k ||g_kp - g_bar_p||^2``), so no ``K x n_params`` copy is kept.

    With ``create_graph=True`` each ``g_k`` keeps its graph, so ``Var`` is a differentiable tensor and
    ``Var.backward()`` gives ``grad_theta Var`` by double backpropagation (Hessian-vector products,
    Pearlmutter 1994): ``grad Var = (2/K) sum_k H_k (g_k - g_bar)``. The returned tensor's value is ``Var``
    computed without a graph, and its graph is that of ``sum_k <g_k, (2/K)(g_k - g_bar)>`` with the second factor
    held constant, which has exactly that gradient (first derivatives only: do not differentiate it twice).
    GRPO minimizes ``pg_loss + beta * Var``, i.e. maximizes ``L_CLIP - beta * Var``.

    Which pass is cheaper depends on the graphs. When each ``L_k`` comes from its own forward (GRPO evaluates
    the slices separately, :meth:`~sb3_grpo.common.update.batch_sources.SequenceBatches.evaluate_slices`), ``K``
    passes (``batched=False``) each walk only their slice's graph: together about one backward of the
    minibatch. When the ``L_k`` share one forward, every pass walks the whole graph, and ``batched=True`` does
    the ``K`` passes as one vectorized backward instead.

    :param slice_objectives: ``K >= 2`` scalar tensors ``L_1 .. L_K``, each built from its own slice
    :param params: the parameters ``theta``; parameters that do not influence an ``L_k`` count as zero
    :param create_graph: keep the graph of the slice gradients (needed to differentiate ``Var``)
    :param batched: compute the ``K`` gradients in one vectorized backward pass
        (``torch.autograd.grad(..., is_grads_batched=True)``, i.e. ``vmap`` over the backward) instead of
        ``K`` passes; same result. Needs batching rules for every backward op.
    :return: scalar tensor ``Var``
    """
    return gradient_variance_terms(slice_objectives, params, create_graph=create_graph, batched=batched)[0]


def gradient_variance_terms(
    slice_objectives: Sequence[th.Tensor],
    params: Sequence[th.Tensor],
    create_graph: bool = True,
    batched: bool = False,
) -> tuple[th.Tensor, th.Tensor]:
    """
    ``(Var, E)``: :func:`gradient_variance`'s ``Var`` and, without a graph, the slice gradients' mean squared norm
    ``E = (1/K) sum_k ||g_k||^2`` (``= Var + ||g_bar||^2``), from one set of slice gradients; ``Var / E`` is the
    scale-free :func:`relative_gradient_variance`. Same arguments as :func:`gradient_variance`.
    """
    n_slices = len(slice_objectives)
    per_param = _per_parameter_gradients(slice_objectives, params, create_graph, batched)
    zero = th.zeros((), dtype=slice_objectives[0].dtype, device=slice_objectives[0].device)
    value, energy, stand_in = zero, zero, zero
    for grads in _blocks([g for g in per_param if g is not None]):
        with th.no_grad():
            mean = grads[0].detach().clone()
            for g in grads[1:]:
                mean.add_(g.detach())
            mean.div_(n_slices)
        for g in grads:
            flat = g.reshape(-1)
            with th.no_grad():
                energy = energy + th.vdot(flat.detach(), flat.detach())
                centered = (g.detach() - mean).reshape(-1)
                value = value + th.vdot(centered, centered)
            if create_graph and g.requires_grad:
                # A stand-in with Var's gradient: dVar/dg_k = (2/K)(g_k - g_bar), so sum_k <g_k, (2/K)(g_k - g_bar)>,
                # the second factor held constant, has Var's gradient at this point (through the slice gradients'
                # graphs); recording and differentiating the centring and squares of K x n_params numbers costs more
                stand_in = stand_in + th.vdot(flat, centered.mul_(2.0 / n_slices))
    value, energy = value / n_slices, energy / n_slices
    if not stand_in.requires_grad:
        return value, energy
    # value + (stand_in - its value): the value Var, the gradient Var's (exact to first order)
    return value + (stand_in - stand_in.detach()), energy


def _per_parameter_gradients(
    slice_objectives: Sequence[th.Tensor], params: Sequence[th.Tensor], create_graph: bool, batched: bool
) -> list[list[th.Tensor] | None]:
    """Each parameter's ``K`` slice gradients (``None`` for a parameter no slice objective depends on)."""
    n_slices = len(slice_objectives)
    if n_slices < 2:
        raise ValueError(f"gradient_variance needs at least 2 slices, got {n_slices}")
    params = list(params)
    if batched:
        objectives = th.stack(list(slice_objectives))
        eye = th.eye(n_slices, dtype=objectives.dtype, device=objectives.device)
        grads = th.autograd.grad(
            objectives, params, grad_outputs=eye, is_grads_batched=True,
            create_graph=create_graph, retain_graph=True, allow_unused=True,
        )  # fmt: skip
        return [None if g is None else list(g.unbind(0)) for g in grads]
    per_slice = [
        th.autograd.grad(objective, params, create_graph=create_graph, retain_graph=True, allow_unused=True)
        for objective in slice_objectives
    ]
    return [_slice_gradients(grads) for grads in zip(*per_slice, strict=True)]


#: Up to this many numbers, the slice gradients of all parameters are concatenated and reduced at once (fewer, larger
#: operations: small models); above it they are reduced parameter by parameter (no K x n_params copy: large models).
CONCAT_NUMEL = 1 << 22


def _blocks(per_param: list[list[th.Tensor]]) -> list[list[th.Tensor]]:
    """The ``K`` slice gradients to reduce together: one block of all parameters concatenated (at most
    :data:`CONCAT_NUMEL` numbers), else one block per parameter."""
    if len(per_param) <= 1 or sum(grads[0].numel() for grads in per_param) > CONCAT_NUMEL:
        return per_param
    return [[th.cat([grads[k].reshape(-1) for grads in per_param]) for k in range(len(per_param[0]))]]


def _slice_gradients(grads: Sequence[th.Tensor | None]) -> list[th.Tensor] | None:
    """One parameter's ``K`` slice gradients; a slice it does not influence counts as zero (``None``: none does)."""
    present = [g for g in grads if g is not None]
    if not present:
        return None
    zero = th.zeros_like(present[0])
    return [zero if g is None else g for g in grads]


def slice_gradients(
    slice_objectives: Sequence[th.Tensor],
    params: Sequence[th.Tensor],
    create_graph: bool = True,
    batched: bool = False,
) -> th.Tensor:
    """
    The gradients ``g_k = grad_theta L_k`` of ``K >= 2`` slice objectives, flattened over ``params`` and stacked:
    shape ``(K, n_params)`` (see :func:`gradient_variance` for the arguments). For diagnostics that look at the
    gradients themselves; training uses :func:`gradient_variance_terms`, which keeps no ``K x n_params`` copy.
    """
    per_param = _per_parameter_gradients(slice_objectives, params, create_graph, batched)
    columns = [
        th.zeros((len(slice_objectives), p.numel()), dtype=p.dtype, device=p.device)
        if grads is None
        else th.stack([g.reshape(-1) for g in grads])
        for grads, p in zip(per_param, params, strict=True)
    ]
    return th.cat(columns, dim=1)


def stacked_variance(stacked: th.Tensor) -> th.Tensor:
    """``Var = (1 / K) * sum_k || g_k - g_bar ||^2`` of stacked slice gradients ``(K, n_params)``."""
    centered = stacked - stacked.mean(dim=0, keepdim=True)
    return centered.pow(2).sum(dim=1).mean()


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


# ----------------------------------------------------------------------------------------------------------
# KL to a reference policy
# ----------------------------------------------------------------------------------------------------------
def kl_k3(log_prob: th.Tensor, ref_log_prob: th.Tensor) -> th.Tensor:
    """
    Per-sample k3 estimator of ``KL(pi || pi_ref)`` for actions sampled from ``pi`` (Schulman 2020,
    "Approximating KL Divergence"; DeepSeekMath eq. 4):

    ``k3 = exp(ref - logp) - (ref - logp) - 1``  (unbiased, always >= 0)

    :param log_prob: ``log pi(a|s)``, shape ``(B,)``
    :param ref_log_prob: ``log pi_ref(a|s)``, shape ``(B,)``
    :return: per-sample estimate, shape ``(B,)``
    """
    log_ratio = ref_log_prob - log_prob
    return th.exp(log_ratio) - log_ratio - 1


def kl_k3_weighted_mean(
    log_prob: th.Tensor,
    ref_log_prob: th.Tensor,
    old_policy_log_prob: th.Tensor | None = None,
    behaviour_log_prob: th.Tensor | None = None,
) -> th.Tensor:
    """
    Mean k3 estimate of ``KL(pi || pi_ref)`` from actions drawn by a behaviour policy ``mu`` (e.g. the
    exploration mixture ``(1 - alpha) * pi_old + alpha * uniform``), importance-weighted back to the policy:

    ``KL_hat = (1 / N) * sum_i w_i * k3_i``,  ``w_i = pi_old(a_i|s_i) / mu(a_i|s_i) = exp(old_policy_log_prob_i
    - behaviour_log_prob_i)``,  ``k3_i = kl_k3(log_prob_i, ref_log_prob_i)``

    Since ``E_mu[w f] = E_pi_old[f]`` (importance sampling), ``KL_hat`` is an unbiased estimate of the mean k3
    that ``N`` tokens sampled from ``pi_old`` itself would give, i.e. of ``KL(pi || pi_ref)`` (Schulman's k3 is
    unbiased under the sampling policy) at the visited states. The weights carry no gradient (they are rollout
    data); the gradient flows through ``k3`` exactly as in the unweighted mean.

    Normalised by the count ``N``, not by ``sum_i w_i`` (self-normalised importance sampling): the count keeps
    the estimate unbiased, the weights of the uniform mixture are bounded (``w <= 1 / (1 - alpha)``, so the
    variance cannot blow up, which is the usual reason to self-normalise), the loss of a minibatch stays a sum
    of per-token terms (the same whichever way the tokens are grouped into minibatches), and with
    ``mu = pi_old`` every weight is exactly 1 and the result is bit-identical to ``kl_k3(...).mean()``.

    :param log_prob: ``log pi(a|s)`` of the current policy (with gradient), shape ``(N,)``
    :param ref_log_prob: ``log pi_ref(a|s)``, shape ``(N,)``
    :param old_policy_log_prob: ``log pi_old(a|s)`` of the policy that acted (before mixing), shape ``(N,)``;
        ``None`` (with ``behaviour_log_prob=None``): the actions are the policy's own samples, all weights 1
    :param behaviour_log_prob: ``log mu(a|s)`` of the distribution the actions were drawn from, shape ``(N,)``
    :return: the scalar estimate
    """
    if old_policy_log_prob is None and behaviour_log_prob is None:
        return kl_k3(log_prob, ref_log_prob).mean()
    if old_policy_log_prob is None or behaviour_log_prob is None:
        raise ValueError(
            "kl_k3_weighted_mean needs both old_policy_log_prob (log pi_old) and behaviour_log_prob (log mu) for "
            "the importance weights pi_old / mu, or neither (the actions were sampled from pi_old)"
        )
    if old_policy_log_prob.shape != log_prob.shape or behaviour_log_prob.shape != log_prob.shape:
        raise ValueError(
            f"kl_k3_weighted_mean: old_policy_log_prob {tuple(old_policy_log_prob.shape)} and behaviour_log_prob "
            f"{tuple(behaviour_log_prob.shape)} must have the shape of log_prob {tuple(log_prob.shape)} "
            "(one per action)"
        )
    weights = th.exp((old_policy_log_prob - behaviour_log_prob).detach()).to(log_prob.dtype)
    # a token pi_old cannot produce (w = 0, e.g. an explored token outside a top-k policy's support) adds exactly
    # 0, value and gradient: its k3 is evaluated at log_prob := ref_log_prob instead of an inf (0 * inf = nan)
    log_prob = th.where(weights > 0, log_prob, ref_log_prob.detach())
    return (weights * kl_k3(log_prob, ref_log_prob)).mean()


# ----------------------------------------------------------------------------------------------------------
# Group advantages (per episode)
# ----------------------------------------------------------------------------------------------------------
def _group_index(group_ids: th.Tensor) -> tuple[th.Tensor, th.Tensor, int]:
    """Map arbitrary group ids to ``0 .. n_groups - 1``; returns (index, counts, n_groups)."""
    _, index, counts = th.unique(group_ids, return_inverse=True, return_counts=True)
    return index, counts, int(counts.numel())


#: Added to a group's standard deviation in :func:`group_advantages`: TRL's value (``GRPOTrainer``, ``scale_rewards=
#: "group"``), so that ``advantage="group"`` computes TRL's advantages exactly; it also keeps a group whose rewards
#: differ by float noise from getting advantages of +-1.
GROUP_STD_EPS = 1e-4


def group_advantages(
    returns: th.Tensor, group_ids: th.Tensor, eps: float = GROUP_STD_EPS
) -> tuple[th.Tensor, th.Tensor]:
    """
    Group-relative advantage of DeepSeekMath's GRPO (arXiv 2402.03300, section 4.1.2, outcome supervision):

    ``A_i = (r_i - mean_{j in g(i)} r_j) / (std_{j in g(i)} r_j + eps)``

    with the *unbiased* (``G - 1``) standard deviation and ``eps = 1e-4``, as in TRL's ``GRPOTrainer``.
    Every token (step) of completion ``i`` gets ``A_i``. Groups with fewer than 2 members are not
    defined; they get ``A = 0`` and ``valid = False``.

    :param returns: one return per episode, shape ``(E,)``
    :param group_ids: the group (prompt round) of each episode, integer tensor ``(E,)``
    :param eps: added to the standard deviation
    :return: ``(advantages, valid)``, both of shape ``(E,)``
    """
    returns = returns.double()
    index, counts, n_groups = _group_index(group_ids)
    sums = th.zeros(n_groups, dtype=returns.dtype).index_add_(0, index, returns)
    means = sums / counts
    sq = th.zeros(n_groups, dtype=returns.dtype).index_add_(0, index, (returns - means[index]) ** 2)
    stds = th.sqrt(sq / (counts - 1).clamp(min=1))
    valid = counts[index] >= 2
    adv = (returns - means[index]) / (stds[index] + eps)
    return th.where(valid, adv, th.zeros_like(adv)).float(), valid


def group_mean_advantages(returns: th.Tensor, group_ids: th.Tensor) -> tuple[th.Tensor, th.Tensor]:
    """
    Group-mean advantage of Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training", arXiv 2503.20783,
    section 3.1): GRPO's advantage without the division by the group's standard deviation,

    ``A_i = r_i - mean_{j in g(i)} r_j``

    The division biases the update toward groups whose rewards barely differ (too easy or too hard prompts weigh
    more); the paper drops it. Groups with fewer than 2 members: ``A = 0``, not valid.

    :param returns: one return per episode, shape ``(E,)``
    :param group_ids: the group of each episode, shape ``(E,)``
    :return: ``(advantages, valid)``, both of shape ``(E,)``
    """
    returns = returns.double()
    index, counts, n_groups = _group_index(group_ids)
    sums = th.zeros(n_groups, dtype=returns.dtype).index_add_(0, index, returns)
    valid = counts[index] >= 2
    adv = returns - (sums / counts)[index]
    return th.where(valid, adv, th.zeros_like(adv)).float(), valid


def constant_normalized_sum(values: th.Tensor, n_sequences: int, max_tokens: int) -> th.Tensor:
    """
    Dr. GRPO's token aggregation (Liu et al. 2025, arXiv 2503.20783, section 3.1): the sum over every token of the
    minibatch divided by a constant, ``sum_t x_t / (S * L)``, with ``S`` the minibatch's sequences and ``L`` the
    completion budget, instead of GRPO's per-sequence mean ``(1/S) sum_i (1/|o_i|) sum_t x_{i,t}``, whose
    ``1/|o_i|`` gives a long wrong answer a smaller penalty per token than a short one.

    :param values: one value per token (e.g. the clipped surrogate), any shape
    :param n_sequences: ``S``, the sequences the tokens belong to
    :param max_tokens: ``L``, the constant length normaliser
    """
    return values.sum() / (n_sequences * max_tokens)


def rloo_advantages(returns: th.Tensor, group_ids: th.Tensor) -> tuple[th.Tensor, th.Tensor]:
    """
    REINFORCE leave-one-out advantage (Kool et al. 2019; Ahmadian et al. 2024, arXiv 2402.14740, eq. 6):

    ``A_i = r_i - (1 / (G - 1)) * sum_{j in g(i), j != i} r_j  =  G / (G - 1) * (r_i - mean_g r)``

    The baseline of each sample is the mean of the *other* members of its group, so it is independent of
    the sample and the estimator stays unbiased. Groups with fewer than 2 members: ``A = 0``, not valid.

    :param returns: one return per episode, shape ``(E,)``
    :param group_ids: the group of each episode, shape ``(E,)``
    :return: ``(advantages, valid)``, both of shape ``(E,)``
    """
    returns = returns.double()
    index, counts, n_groups = _group_index(group_ids)
    sums = th.zeros(n_groups, dtype=returns.dtype).index_add_(0, index, returns)
    n = counts[index].to(returns.dtype)
    valid = counts[index] >= 2
    baseline = (sums[index] - returns) / (n - 1).clamp(min=1)
    adv = returns - baseline
    return th.where(valid, adv, th.zeros_like(adv)).float(), valid


def turn_returns_to_go(turn_rewards: th.Tensor, turn_mask: th.Tensor) -> th.Tensor:
    """
    Undiscounted return-to-go of every turn: ``G_{i,k} = sum_{k' >= k} r_{i,k'}`` over the turns episode ``i``
    took (0 where it took no turn ``k``).

    :param turn_rewards: ``(E, K)`` the reward each episode earned in each turn (the sum of its steps' rewards)
    :param turn_mask: ``(E, K)`` bool, ``True`` where the episode took turn ``k``
    :return: ``(E, K)`` float64
    """
    rewards = th.where(turn_mask, turn_rewards.double(), th.zeros((), dtype=th.float64))
    return th.where(turn_mask, rewards.flip(1).cumsum(1).flip(1), th.zeros((), dtype=th.float64))


def turn_rloo_advantages(
    turn_rewards: th.Tensor, turn_mask: th.Tensor, group_ids: th.Tensor
) -> tuple[th.Tensor, th.Tensor]:
    """
    Turn-level leave-one-out group advantage for interactive (multi-turn) episodes whose group members start from
    the same state (same prompt, same task seed). For turn ``k`` of member ``i`` of group ``g``:

    ``A_{i,k} = G_{i,k} - (1 / (n_{g,k} - 1)) * sum_{j in g, j != i, T_j > k} G_{j,k}``

    with ``G_{i,k}`` the undiscounted return-to-go from turn ``k`` (:func:`turn_returns_to_go`), ``T_j`` the
    number of turns member ``j`` took and ``n_{g,k}`` the members of ``g`` that reached turn ``k``. Every token of
    turn ``k`` gets ``A_{i,k}``. At turn 0 every member reaches the turn and ``G_{i,0}`` is the episode's return,
    so turn 0 is exactly RLOO (:func:`rloo_advantages`).

    Where it is unbiased. The baseline of ``(i, k)`` is built from the *other* members only, which are sampled
    independently of member ``i`` given the shared start; it is therefore independent of member ``i``'s actions,
    and ``E[grad log pi(a_t | s_t) * b] = 0`` for every token ``t`` of member ``i``: the policy-gradient estimate
    ``sum_t grad log pi(a_t | s_t) * A_{i,k(t)}`` is unbiased at every turn (with rewards paid at turn ends,
    ``G_{i,k}`` is each token's own reward-to-go). What the baseline is *not* at ``k > 0``: the value of member
    ``i``'s own state. Members share the state only at turn 0; at turn ``k`` they stand in different
    conversations, and the baseline estimates ``E[G_k | the turn is reached]`` averaged over the other members'
    turn-``k`` states, not ``V(s_{i,k})``. As an estimate of member ``i``'s advantage ``Q(s_{i,k}, .) -
    V(s_{i,k})`` it is biased by ``V(s_{i,k}) - E_j[V(s_{j,k}) | T_j > k]`` (a baseline that conditions on "reached
    turn k", not on the state), which costs variance, not gradient bias. The one biased place: a turn that no
    other member reached (``n_{g,k} = 1``) has no baseline; it gets ``A = 0`` and ``valid = False``, which drops
    that term and so weights the gradient of turn-``k`` states by the chance that another member reaches turn ``k``
    too. Groups of one member: ``A = 0``, not valid, as in RLOO.

    :param turn_rewards: ``(E, K)`` per episode and turn, the sum of the rewards of the turn's steps (a reply's
        reward and, on the last turn, the end-of-episode reward)
    :param turn_mask: ``(E, K)`` bool: episode ``e`` took turns ``0 .. T_e - 1`` (each row a prefix of ``True``)
    :param group_ids: ``(E,)`` the group of each episode
    :return: ``(advantages, valid)``, both ``(E, K)``: float32 advantages (0 where not valid) and bool
    :raises ValueError: for mismatched shapes or a mask row that is not a prefix (a turn after a missing one)
    """
    if turn_rewards.shape != turn_mask.shape or turn_rewards.dim() != 2 or group_ids.shape != turn_rewards.shape[:1]:
        raise ValueError(
            f"turn_rewards and turn_mask must both be (episodes, turns) and group_ids (episodes,); got shapes "
            f"{tuple(turn_rewards.shape)}, {tuple(turn_mask.shape)} and {tuple(group_ids.shape)}"
        )
    mask = turn_mask.bool()
    if bool((mask[:, 1:] & ~mask[:, :-1]).any()):
        raise ValueError("turn_mask: every row must be a prefix of True (an episode takes turns 0 .. T - 1 in order)")
    returns = turn_returns_to_go(turn_rewards, mask)
    index, _, n_groups = _group_index(group_ids)
    sums = th.zeros((n_groups, mask.shape[1]), dtype=th.float64).index_add_(0, index, returns)
    reached = th.zeros((n_groups, mask.shape[1]), dtype=th.float64).index_add_(0, index, mask.double())
    n = reached[index]
    valid = mask & (n >= 2)
    baseline = (sums[index] - returns) / (n - 1).clamp(min=1)
    adv = returns - baseline
    return th.where(valid, adv, th.zeros_like(adv)).float(), valid


def _role_keys(games: th.Tensor, roles: th.Tensor) -> list[tuple[int, int]]:
    if games.shape != roles.shape:
        raise ValueError(f"games and roles need one entry per episode each; got shapes {tuple(games.shape)} and "
                         f"{tuple(roles.shape)}")  # fmt: skip
    return list(zip(games.tolist(), roles.tolist()))


def role_advantages(returns: th.Tensor, games: th.Tensor, roles: th.Tensor) -> tuple[th.Tensor, th.Tensor]:
    """
    Role-conditioned advantage with the batch as the baseline (SPIRAL, Liu et al. 2025, arXiv 2506.24119,
    section 3): in a zero-sum game the two roles have different expected returns (the first mover of tic-tac-toe
    wins more), so each episode is compared with the episodes of the same game played in the same role,

    ``A_i = r_i - mean_{j: game_j = game_i, role_j = role_i} r_j``

    Keys with a single episode get ``A = 0`` and ``valid = False``.

    :param returns: one return per episode (the learner's payoff), shape ``(E,)``
    :param games: the game of each episode (any integer id), shape ``(E,)``
    :param roles: the learner's role (player number) in each episode, shape ``(E,)``
    :return: ``(advantages, valid)``, both of shape ``(E,)``
    """
    keys = _role_keys(games, roles)
    number = {k: i for i, k in enumerate(dict.fromkeys(keys))}
    ids = th.tensor([number[k] for k in keys], dtype=th.int64)
    return group_mean_advantages(returns, ids)


def role_ema_advantages(
    returns: th.Tensor,
    games: th.Tensor,
    roles: th.Tensor,
    baselines: dict[tuple[int, int], float] | None = None,
    decay: float = 0.95,
) -> tuple[th.Tensor, dict[tuple[int, int], float]]:
    """
    SPIRAL's role-conditioned advantage estimation (Liu et al. 2025, arXiv 2506.24119, section 3) with a running
    baseline per game and role, an exponential moving average over every episode seen so far: for each episode
    ``i`` in order, with ``k = (game_i, role_i)``,

    ``b_k <- decay * b_k + (1 - decay) * r_i``, then ``A_i = r_i - b_k``

    (a key seen for the first time starts at ``b_k = 0``). Unlike :func:`role_advantages` this needs no second
    episode of the same key in the batch, and the baseline carries over between updates.

    :param returns: one return per episode, shape ``(E,)``, in the order the episodes ended
    :param games: the game of each episode, shape ``(E,)``
    :param roles: the learner's role in each episode, shape ``(E,)``
    :param baselines: the baselines so far by ``(game, role)`` (``None``: none yet); not modified
    :param decay: the moving average's decay, in ``[0, 1)``
    :return: ``(advantages (E,), the updated baselines)``
    """
    if not 0.0 <= decay < 1.0:
        raise ValueError(f"decay must be in [0, 1), got {decay!r}")
    keys = _role_keys(games, roles)
    out = dict(baselines or {})
    values = returns.double().tolist()
    adv = []
    for key, r in zip(keys, values):
        b = decay * out.get(key, 0.0) + (1.0 - decay) * r
        out[key] = b
        adv.append(r - b)
    return th.tensor(adv, dtype=th.float64).float(), out


def returns_to_go(rewards: th.Tensor, ends: th.Tensor, gamma: float = 1.0) -> tuple[th.Tensor, th.Tensor]:
    """Each step's discounted return-to-go within its episode, ``G_t = sum_{s=t}^{T} gamma^(s-t) r_s``, ``T`` the
    episode's last step, in a rollout of envs stepped side by side.

    :param rewards: ``(n_steps, n_envs)`` rewards.
    :param ends: ``(n_steps, n_envs)`` booleans, true at an episode's last step.
    :param gamma: The discount.
    :return: ``(returns, valid)``, both ``(n_steps, n_envs)``: ``valid`` marks the steps of episodes that end within
        the rollout (the others' returns are not known yet; they are 0).
    """
    returns = th.zeros_like(rewards, dtype=th.float64)
    valid = th.zeros_like(ends, dtype=th.bool)
    running = th.zeros(rewards.shape[1], dtype=th.float64)
    seen_end = th.zeros(rewards.shape[1], dtype=th.bool)
    for t in range(rewards.shape[0] - 1, -1, -1):  # backwards: an episode's end starts its return
        end = ends[t].bool()
        running = rewards[t].double() + th.where(end, th.zeros_like(running), gamma * running)
        seen_end = seen_end | end
        returns[t] = th.where(seen_end, running, th.zeros_like(running))
        valid[t] = seen_end
    return returns, valid


def batch_normalized_returns(
    rewards: th.Tensor,
    ends: th.Tensor,
    gamma: float = 1.0,
    eps: float = 1e-8,
    mean_over_ranks: Callable[[float, float], float] | None = None,
) -> tuple[th.Tensor, th.Tensor]:
    """REINFORCE++'s advantages (Hu 2025, arXiv 2501.03262, eqs. 8-10): each token's return-to-go in its episode
    (:func:`returns_to_go`; the token-level KL penalty is in ``rewards``), normalised with the mean and standard
    deviation over every token of the batch that has one, ``A_t = (G_t - mean) / (std + eps)``; no baseline per
    prompt, no critic.

    :param rewards: ``(n_steps, n_envs)`` per-token rewards (the episode's reward at its last token, minus
        ``beta * KL(t)`` at every token).
    :param ends: ``(n_steps, n_envs)`` booleans, true at an episode's last step.
    :param gamma: The discount (REINFORCE++: 1).
    :param eps: Added to the standard deviation.
    :param mean_over_ranks: ``(total, count) -> sum(total) / sum(count)`` over the data-parallel ranks, so that the
        batch is the global one (``None``: this process's rollout is the batch). The standard deviation is the
        population one, ``sqrt(mean(G^2) - mean(G)^2)``.
    :return: ``(advantages, valid)``, both ``(n_steps, n_envs)``; tokens of episodes that do not end in the rollout
        are not valid, take no part in the statistics and get 0.
    """
    returns, valid = returns_to_go(rewards, ends, gamma)
    mean_of = mean_over_ranks if mean_over_ranks is not None else (lambda total, count: total / max(count, 1.0))
    values = returns[valid]
    count = float(values.numel())
    mean = mean_of(float(values.sum()), count)
    mean_sq = mean_of(float((values**2).sum()), count)
    std = math.sqrt(max(mean_sq - mean**2, 0.0))
    advantages = th.where(valid, (returns - mean) / (std + eps), th.zeros_like(returns))
    return advantages.float(), valid


def self_critical_advantages(
    returns: th.Tensor, group_ids: th.Tensor, is_greedy: th.Tensor
) -> tuple[th.Tensor, th.Tensor]:
    """
    Self-critical advantage (Rennie et al. 2017, arXiv 1612.00563, eq. 8): the baseline of a sampled
    completion is the reward of the greedy (test-time) completion for the same prompt,

    ``A_i = r_i - r_greedy(g(i))``

    The greedy episodes themselves are not samples of the policy; they get ``A = 0`` and ``valid = False``.
    Sampled episodes whose group has no finished greedy member also get ``A = 0``, ``valid = False``.
    If a group holds several greedy episodes (it should not), their mean is the baseline.

    :param returns: one return per episode, shape ``(E,)``
    :param group_ids: the group of each episode, shape ``(E,)``
    :param is_greedy: boolean, which episodes were generated greedily, shape ``(E,)``
    :return: ``(advantages, valid)``, both of shape ``(E,)``
    """
    returns = returns.double()
    is_greedy = is_greedy.bool()
    index, _, n_groups = _group_index(group_ids)
    greedy_sum = th.zeros(n_groups, dtype=returns.dtype).index_add_(0, index, th.where(is_greedy, returns, 0.0))
    greedy_count = th.zeros(n_groups, dtype=returns.dtype).index_add_(0, index, is_greedy.to(returns.dtype))
    has_baseline = greedy_count[index] > 0
    baseline = greedy_sum[index] / greedy_count[index].clamp(min=1)
    valid = has_baseline & ~is_greedy
    adv = returns - baseline
    return th.where(valid, adv, th.zeros_like(adv)).float(), valid


# ----------------------------------------------------------------------------------------------------------
# Uniform-mixture exploration
# ----------------------------------------------------------------------------------------------------------
def _box_bounds(action_space: spaces.Box, squashed: bool) -> tuple[np.ndarray, np.ndarray]:
    if squashed:
        # SB3 policies with squash_output sample in [-1, 1] and unscale afterwards
        return -np.ones(action_space.shape, dtype=np.float64), np.ones(action_space.shape, dtype=np.float64)
    low = np.asarray(action_space.low, dtype=np.float64)
    high = np.asarray(action_space.high, dtype=np.float64)
    if not (np.all(np.isfinite(low)) and np.all(np.isfinite(high))):
        raise ValueError(
            "uniform exploration needs a bounded Box action space; got low="
            f"{action_space.low}, high={action_space.high}. Use explore_alpha=0 for unbounded actions."
        )
    return low, high


def uniform_log_prob(
    action_space: spaces.Space, actions: th.Tensor | None = None, squashed: bool = False
) -> float | th.Tensor:
    """
    Log density of the uniform policy on ``action_space``.

    - ``Discrete(n)``: ``-log n``; ``MultiDiscrete(nvec)``: ``-sum log n_k``; ``MultiBinary(d)``: ``-d log 2``.
    - bounded ``Box``: ``-sum log(high - low)`` (``-log volume``) inside the box, ``-inf`` outside. The box
      is the space the policy's distribution lives in: ``[low, high]`` for SB3's (unsquashed) Gaussian,
      whose samples are clipped only when passed to the env, and ``[-1, 1]^d`` for squashed policies.

    :param action_space: the action space
    :param actions: for ``Box``, the actions (``(B, d)``) whose density is wanted; ignored otherwise
    :param squashed: whether the policy squashes its actions to ``[-1, 1]`` (``policy.squash_output``)
    :return: a float, or for ``Box`` with ``actions`` a tensor ``(B,)``
    """
    if isinstance(action_space, spaces.Discrete):
        return -math.log(int(action_space.n))
    if isinstance(action_space, spaces.MultiDiscrete):
        return -float(np.sum(np.log(action_space.nvec.astype(np.float64))))
    if isinstance(action_space, spaces.MultiBinary):
        return -float(np.prod(action_space.shape)) * math.log(2.0)
    if isinstance(action_space, spaces.Box):
        low, high = _box_bounds(action_space, squashed)
        log_density = -float(np.sum(np.log(high - low)))
        if actions is None:
            return log_density
        low_t = th.as_tensor(low, dtype=actions.dtype, device=actions.device).reshape(1, -1)
        high_t = th.as_tensor(high, dtype=actions.dtype, device=actions.device).reshape(1, -1)
        flat = actions.reshape(actions.shape[0], -1)
        inside = ((flat >= low_t) & (flat <= high_t)).all(dim=1)
        return th.where(inside, th.full_like(flat[:, 0], log_density), th.full_like(flat[:, 0], -math.inf))
    raise ValueError(
        f"uniform exploration supports Discrete, MultiDiscrete, MultiBinary and bounded Box actions, "
        f"not {type(action_space).__name__}"
    )


def uniform_sample(action_space: spaces.Space, n: int, rng: np.random.Generator, squashed: bool = False) -> np.ndarray:
    """
    Draw ``n`` actions from the uniform policy on ``action_space`` (see :func:`uniform_log_prob`).

    :param action_space: the action space
    :param n: number of actions
    :param rng: numpy generator (GRPO keeps its own, so exploration does not shift torch's RNG stream)
    :param squashed: whether the policy squashes its actions to ``[-1, 1]``
    :return: array of shape ``(n, *action_space.shape)``; discrete actions as the indices ``0 .. n - 1``
        that SB3 policies emit (no ``start`` offset)
    """
    if isinstance(action_space, spaces.Discrete):
        return rng.integers(0, int(action_space.n), size=n)
    if isinstance(action_space, spaces.MultiDiscrete):
        return rng.integers(0, action_space.nvec, size=(n, *action_space.nvec.shape))
    if isinstance(action_space, spaces.MultiBinary):
        return rng.integers(0, 2, size=(n, *action_space.shape))
    if isinstance(action_space, spaces.Box):
        low, high = _box_bounds(action_space, squashed)
        return rng.uniform(low, high, size=(n, *action_space.shape)).astype(np.float32)
    raise ValueError(f"uniform exploration does not support {type(action_space).__name__} actions")


def mixture_log_prob(log_prob: th.Tensor, uniform_log_prob_: float | th.Tensor, alpha: float) -> th.Tensor:
    """
    Log density of the exploration mixture ``(1 - alpha) * pi + alpha * uniform``:

    ``log pi_mix(a) = logaddexp(log(1 - alpha) + log pi(a), log(alpha) + log u(a))``

    Storing this as the rollout's ``old_log_prob`` makes the PPO ratio ``pi_new(a) / pi_mix(a)`` an honest
    importance weight for actions drawn from the mixture. ``alpha = 0`` returns ``log_prob`` unchanged.

    :param log_prob: ``log pi(a|s)``, shape ``(B,)``
    :param uniform_log_prob_: ``log u(a)``: a float, or a tensor ``(B,)`` (``-inf`` outside a Box)
    :param alpha: mixing weight in ``[0, 1]``
    :return: ``log pi_mix(a|s)``, shape ``(B,)``
    """
    if alpha <= 0.0:
        return log_prob
    log_u = th.as_tensor(uniform_log_prob_, dtype=log_prob.dtype, device=log_prob.device).expand_as(log_prob)
    if alpha >= 1.0:
        return log_u.clone()
    return th.logaddexp(log_prob + math.log1p(-alpha), log_u + math.log(alpha))


# ----------------------------------------------------------------------------------------------------------
# Diagnostics
# ----------------------------------------------------------------------------------------------------------
def pearson_corr(x: np.ndarray | th.Tensor, y: np.ndarray | th.Tensor) -> float:
    """
    Pearson correlation of two flat arrays; ``nan`` when either is constant. Used for
    ``train/value_return_corr`` (values against their regression targets): below about 0.5 the value
    head is undertrained and GAE advantages are mostly noise.

    :param x: first sample
    :param y: second sample
    :return: the correlation coefficient in ``[-1, 1]`` or ``nan``
    """
    x = np.asarray(x, dtype=np.float64).ravel()
    y = np.asarray(y, dtype=np.float64).ravel()
    if x.size < 2:
        return float("nan")
    xc, yc = x - x.mean(), y - y.mean()
    denom = math.sqrt(float(np.dot(xc, xc)) * float(np.dot(yc, yc)))
    if denom == 0.0:
        return float("nan")
    return float(np.dot(xc, yc) / denom)
