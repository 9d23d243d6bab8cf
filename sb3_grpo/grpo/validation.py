"""Validation of GRPO's own arguments: cheap checks that run before any model is built.

PPO's arguments are checked where SB3 checks them; everything GRPO adds is checked here, so a bad value is
refused with a message that names it and says what to pass instead.
"""

from __future__ import annotations

import warnings
from typing import Any

from sb3_grpo.common.buffers import PolicyLogProbMixin

__all__ = [
    "ADVANTAGES",
    "NONFINITE",
    "check_buffer_for_kl",
    "check_grpo_args",
    "check_ppo_batching",
    "warn_if_exploration_clips",
]

#: The advantage forms (``advantage=``).
ADVANTAGES = ("gae", "group", "rloo", "self_critical")
#: What GRPO does with NaN/inf rewards, advantages, losses or gradients (``nonfinite=``).
NONFINITE = ("raise", "skip")


def check_grpo_args(
    *,
    advantage: str,
    nonfinite: str,
    grad_var_coef: float,
    grad_var_slices: int,
    batch_size: int,
    kl_coef: float,
    kl_target: float | None,
    explore_alpha: float,
    explore_fraction: float,
    adaptive_clip: Any,
) -> tuple[float, float] | None:
    """Check GRPO's own arguments (see :class:`~sb3_grpo.GRPO` for their meaning).

    :return: ``adaptive_clip`` as a pair of floats (or ``None``).
    :raises ValueError: naming the first argument that is out of range.
    """
    if advantage not in ADVANTAGES:
        raise ValueError(f"advantage={advantage!r} is not known; known: {', '.join(ADVANTAGES)}")
    if nonfinite not in NONFINITE:
        raise ValueError(
            f"nonfinite={nonfinite!r} is not known; use 'raise' (stop with an error, the default) or 'skip' "
            "(drop bad episodes and minibatches and count them in the logs)"
        )
    if grad_var_coef < 0:
        raise ValueError(f"grad_var_coef must be >= 0 (0 turns the penalty off), got {grad_var_coef}")
    if grad_var_coef > 0:
        if int(grad_var_slices) != grad_var_slices or grad_var_slices < 2:
            raise ValueError(f"grad_var_slices must be an integer >= 2, got {grad_var_slices}")
        if grad_var_slices > batch_size:
            # as PPO with a small batch: warn and train (the loss takes min(K, minibatch size) slices)
            warnings.warn(
                f"GRPO: grad_var_slices={grad_var_slices} is more than batch_size={batch_size}: the gradient-variance "
                f"penalty uses min(grad_var_slices, minibatch size) slices (one sample each), and none for minibatches "
                "of fewer than 2 samples (the penalty is then off). Raise batch_size or lower grad_var_slices to "
                "measure it over more samples",
                stacklevel=3,
            )
    if kl_coef < 0:
        raise ValueError(f"kl_coef must be >= 0 (0 turns the KL term off), got {kl_coef}")
    if kl_target is not None:
        if kl_target <= 0:
            raise ValueError(f"kl_target must be > 0 or None, got {kl_target}")
        if kl_coef <= 0:
            raise ValueError("kl_target adapts kl_coef multiplicatively; give a starting kl_coef > 0")
    if explore_alpha < 0 or explore_alpha > 1:
        raise ValueError(f"explore_alpha must be in [0, 1] (0 turns exploration off), got {explore_alpha}")
    if not 0 < explore_fraction <= 1:
        raise ValueError(f"explore_fraction must be in (0, 1], got {explore_fraction}")
    if adaptive_clip is None:
        return None
    if len(adaptive_clip) != 2 or not all(float(s) > 0 for s in adaptive_clip):
        raise ValueError(
            f"adaptive_clip must be a pair of positive scales (for A > 0, for A <= 0), e.g. (1.1, 0.9), "
            f"or None; got {adaptive_clip}"
        )
    return (float(adaptive_clip[0]), float(adaptive_clip[1]))


def warn_if_exploration_clips(explore_alpha: float, clip_range: Any, adaptive_clip: tuple[float, float] | None) -> None:
    """Warn when the exploration mixture alone puts the first epoch's ratio outside the clip range.

    The stored old log-prob is the mixture's, ``mu >= (1 - alpha) * pi_old``, so before any update the ratio
    ``pi / mu`` of a likely token is about ``1 / (1 - alpha)``. Once that exceeds ``1 + eps_pos`` (``eps`` times
    the positive scale of ``adaptive_clip``), i.e. ``alpha > eps_pos / (1 + eps_pos)``, the clipped objective
    gives positive-advantage tokens no gradient from the first step on.

    :param explore_alpha: The initial mixture weight.
    :param clip_range: ``eps`` or its schedule (evaluated at the start of training).
    :param adaptive_clip: The clip scales, or ``None``.
    """
    eps = clip_range(1.0) if callable(clip_range) else clip_range
    if explore_alpha <= 0 or not isinstance(eps, (int, float)):
        return
    eps_pos = float(eps) * (adaptive_clip[0] if adaptive_clip is not None else 1.0)
    threshold = eps_pos / (1.0 + eps_pos)
    if explore_alpha > threshold:
        warnings.warn(
            f"GRPO: explore_alpha={explore_alpha:g} makes the PPO ratio of likely tokens start near "
            f"1 / (1 - alpha) = {1.0 / (1.0 - explore_alpha):.3g}, above the clip bound 1 + {eps_pos:.3g}: "
            f"tokens with positive advantage would get no gradient. Use explore_alpha <= {threshold:.3g} "
            "or a wider clip_range",
            stacklevel=4,
        )


def check_ppo_batching(batch_size: int, n_steps: int, n_envs: int | None, normalize_advantage: bool) -> None:
    """PPO's own sanity checks of the batch sizes (same assertions, same warning).

    :param batch_size: Minibatch size.
    :param n_steps: Steps per env per rollout.
    :param n_envs: Envs of the VecEnv (``None``: no env yet, e.g. while loading).
    :param normalize_advantage: Whether advantages are normalized per minibatch.
    """
    if normalize_advantage:
        assert batch_size > 1, (
            "`batch_size` must be greater than 1. See https://github.com/DLR-RM/stable-baselines3/issues/440"
        )
    if n_envs is None:
        return
    buffer_size = n_envs * n_steps
    assert buffer_size > 1 or (not normalize_advantage), (
        f"`n_steps * n_envs` must be greater than 1. Currently n_steps={n_steps} and n_envs={n_envs}"
    )
    untruncated_batches = buffer_size // batch_size
    if buffer_size % batch_size > 0:
        warnings.warn(
            f"You have specified a mini-batch size of {batch_size},"
            f" but because the `RolloutBuffer` is of size `n_steps * n_envs = {buffer_size}`,"
            f" after every {untruncated_batches} untruncated mini-batches,"
            f" there will be a truncated mini-batch of size {buffer_size % batch_size}\n"
            f"We recommend using a `batch_size` that is a factor of `n_steps * n_envs`.\n"
            f"Info: (n_steps={n_steps} and n_envs={n_envs})",
            stacklevel=3,
        )


def check_buffer_for_kl(buffer_class: type, kl_coef: float, explore_alpha: float) -> None:
    """With ``kl_coef > 0`` and ``explore_alpha > 0`` the KL estimate is weighted by ``pi / mu``, so the buffer must
    store the policy's own log-probs beside the mixture's.

    :raises ValueError: when ``buffer_class`` does not (it is not a ``PolicyLogProbMixin``).
    """
    if kl_coef > 0 and explore_alpha > 0 and not issubclass(buffer_class, PolicyLogProbMixin):
        raise ValueError(
            f"kl_coef > 0 with explore_alpha > 0 weights the KL estimate by pi / mu, so the rollout buffer must "
            f"store the policy's own log-probs beside the mixture's; {buffer_class.__name__} does "
            "not. Use rollout_buffer_class=None (GRPO's default), a subclass of "
            "sb3_grpo.common.buffers.PolicyLogProbMixin, or explore_alpha=0"
        )
