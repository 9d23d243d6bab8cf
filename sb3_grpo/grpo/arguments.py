"""GRPO's own arguments: their checks (:data:`GRPO_CHECKS`, :func:`check_grpo_args`), run before any model is built,
and the warnings and refusals of how they go together with PPO's and the shared ones.

PPO's arguments and the options every algorithm shares are checked by the skeleton
(:mod:`sb3_grpo.common.options.checks`); these are the ones ``GRPO`` adds.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

from sb3_grpo.common.buffers import PolicyLogProbMixin
from textrl_envs.validation import check_bool, check_float, check_int, given

__all__ = [
    "GRPO_CHECKS",
    "check_buffer_for_kl",
    "check_grpo_args",
    "warn_if_exploration_clips",
    "warn_if_slices_exceed_batch",
]


def _optional(check: Any) -> Any:
    """``check`` that lets ``None`` through (arguments where ``None`` means "off")."""
    return lambda name, value: None if value is None else check(name, value)


def _check_param_names(name: str, value: Any) -> list[str]:
    if isinstance(value, str) or not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise TypeError(
            f"{name} must be None (all trainable parameters) or a list of parameter-name prefixes, got {given(value)}; "
            f"e.g. {name}=['action_net', 'mlp_extractor.policy_net']"
        )
    return list(value)


def _check_adaptive_clip(name: str, value: Any) -> tuple[float, float]:
    todo = "pass a pair of positive scales (for A > 0, for A <= 0), e.g. (1.1, 0.9), or None to turn it off"
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise TypeError(f"{name} must be a pair of positive scales or None, got {given(value)}; {todo}")
    if len(value) != 2:
        raise ValueError(f"{name} must be a pair of positive scales, got {len(value)} value(s) {tuple(value)}; {todo}")
    pair = tuple(check_float(f"{name}[{i}]", v, hint=todo) for i, v in enumerate(value))
    if not all(s > 0 for s in pair):
        raise ValueError(f"{name} must be a pair of positive scales (for A > 0, for A <= 0), got {value}; {todo}")
    return pair  # type: ignore[return-value]


#: The checks of GRPO's own constructor arguments: argument name -> check.
GRPO_CHECKS: dict[str, Any] = {
    "grad_var_coef": lambda n, v: check_float(n, v, low=0, hint="0 turns the penalty off; e.g. grad_var_coef=0.01"),
    "grad_var_slices": lambda n, v: check_int(n, v, low=2, example=4),
    "grad_var_params": _optional(_check_param_names),
    "grad_var_normalize": check_bool,
    "adaptive_clip": _optional(_check_adaptive_clip),
    "explore_alpha": lambda n, v: check_float(n, v, low=0, high=1, hint="0 turns exploration off; e.g. 0.05"),
    "explore_fraction": lambda n, v: check_float(n, v, low=0, high=1, low_open=True, example=0.5),
    "kl_coef": lambda n, v: check_float(n, v, low=0, hint="0 turns the KL term off; e.g. kl_coef=0.04"),
    "kl_target": _optional(lambda n, v: check_float(n, v, low=0, low_open=True, example=0.01)),
}


def check_grpo_args(args: Mapping[str, Any]) -> tuple[float, float] | None:
    """Check GRPO's own arguments present in ``args`` (:data:`GRPO_CHECKS`) and how they go together with each other
    and with ``micro_batch_size``. Runs before any model is built.

    :param args: Argument name -> value (``GRPO.__init__`` passes its own and the shared options; other keys are
        ignored).
    :return: ``adaptive_clip`` as a pair of floats (or ``None``).
    :raises TypeError: naming the first argument of a wrong type.
    :raises ValueError: naming the first argument with a wrong value, or two that do not go together.
    """
    for name, check in GRPO_CHECKS.items():
        if name in args:
            check(name, args[name])
    if args.get("kl_target") is not None and not args.get("kl_coef", 0.0) > 0:
        raise ValueError("kl_target adapts kl_coef multiplicatively; give a starting kl_coef > 0")
    grad_var_coef = args.get("grad_var_coef", 0.0)
    if args.get("micro_batch_size") is not None and grad_var_coef > 0:
        raise ValueError(
            f"micro_batch_size={args['micro_batch_size']} splits each minibatch's backward, but the gradient-variance "
            f"penalty (grad_var_coef={grad_var_coef}) is a function of all K slice gradients of the whole minibatch at "
            "once, so it cannot be accumulated micro-batch by micro-batch; pass grad_var_coef=0 to use micro-batches, "
            "or micro_batch_size=None to keep the penalty"
        )
    adaptive_clip = args.get("adaptive_clip")
    return None if adaptive_clip is None else _check_adaptive_clip("adaptive_clip", adaptive_clip)


def warn_if_slices_exceed_batch(grad_var_coef: float, grad_var_slices: int, batch_size: int) -> None:
    """Warn (as PPO does for a small batch) when the penalty's slices outnumber the minibatch's samples: the loss then
    takes ``min(K, minibatch size)`` slices."""
    if grad_var_coef > 0 and grad_var_slices > batch_size:
        warnings.warn(
            f"GRPO: grad_var_slices={grad_var_slices} is more than batch_size={batch_size}: the gradient-variance "
            f"penalty uses min(grad_var_slices, minibatch size) slices (one sample each), and none for minibatches "
            "of fewer than 2 samples (the penalty is then off). Raise batch_size or lower grad_var_slices to "
            "measure it over more samples",
            stacklevel=3,
        )


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
        start_ratio = 1.0 / (1.0 - explore_alpha) if explore_alpha < 1 else float("inf")
        warnings.warn(
            f"GRPO: explore_alpha={explore_alpha:g} makes the PPO ratio of likely tokens start near "
            f"1 / (1 - alpha) = {start_ratio:.3g}, above the clip bound 1 + {eps_pos:.3g}: "
            f"tokens with positive advantage would get no gradient. Use explore_alpha <= {threshold:.3g} "
            "or a wider clip_range",
            stacklevel=4,
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
