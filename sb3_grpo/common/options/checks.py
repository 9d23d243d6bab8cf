"""The checks of the arguments every algorithm of the package takes: cheap, and run before any model is built.

PPO's constructor arguments (:data:`PPO_CHECKS`) and the skeleton's shared options (:data:`SHARED_CHECKS`) are checked
here with the shared checks of :mod:`textrl_envs.validation` (type, finiteness, range, choice), so a bad value is
refused with a message that names it, shows it and says what to pass instead; a NaN never quietly turns a mechanism
off. An algorithm's own arguments are checked in its folder (GRPO's: :mod:`sb3_grpo.grpo.arguments`); the comparison
(:mod:`sb3_grpo.compare.config`) runs an algorithm's checks (``check_arguments``) on its hyperparameters before it
writes anything.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from sb3_grpo.common.advantages.forms import ADVANTAGE_FORMS, advantage_form
from sb3_grpo.common.buffers import SequenceRolloutBuffer
from sb3_grpo.common.data_parallel import DATA_PARALLEL
from sb3_grpo.common.rollout.redistribution import REDISTRIBUTIONS
from sb3_grpo.engines import check_engine
from textrl_envs.validation import (
    check_bool,
    check_choice,
    check_float,
    check_int,
    check_mapping,
    check_schedule,
    check_seed,
    given,
)

__all__ = [
    "NONFINITE",
    "PPO_CHECKS",
    "SHARED_CHECKS",
    "check_argument_values",
    "check_clip_bounds",
    "check_carry_over",
    "check_carry_over_value",
    "check_learn_args",
    "check_ppo_args",
    "check_ppo_batching",
    "check_shared_args",
    "resolve_carry_over",
]

#: What GRPO does with NaN/inf rewards, advantages, losses or gradients (``nonfinite=``).
NONFINITE = ("raise", "skip")

Check = Callable[[str, Any], Any]


def _optional(check: Check) -> Check:
    """``check`` that lets ``None`` through (arguments where ``None`` means "off")."""
    return lambda name, value: None if value is None else check(name, value)


def _check_path(name: str, value: Any) -> str | os.PathLike:
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{name} must be a folder path (str) or None, got {given(value)}; e.g. {name}='runs/tb'")
    return value


def _check_device(name: str, value: Any) -> Any:
    """Any device this machine has (:func:`textrl_envs.devices.resolve_device`); ``"auto"`` as SB3 means it."""
    from textrl_envs.devices import resolve_device

    if isinstance(value, str) and value == "auto":
        return value
    if _is_missing_cuda(value):
        # SB3's get_device falls back to the CPU here; code written against SB3 relies on it, so warn, do not refuse
        warnings.warn(
            f"{name}={str(value)!r}: CUDA is not available here, running on the CPU (as SB3 does); pass "
            f"{name}='auto' or {name}='cpu' to silence this",
            UserWarning,
            stacklevel=4,
        )
        return "cpu"
    try:
        resolved = resolve_device(value)
    except ValueError as err:
        raise ValueError(f"{name}: {err}") from None
    if getattr(resolved, "type", None) == "meta":
        raise ValueError(f"{name}='meta' holds no data (nothing can be trained on it); pass 'auto', 'cpu' or 'cuda'")
    return value


def _is_missing_cuda(value: Any) -> bool:
    """Whether ``value`` names a CUDA device on a machine without CUDA."""
    import torch

    try:
        return torch.device(value).type == "cuda" and not torch.cuda.is_available()
    except (RuntimeError, TypeError):
        return False


def _check_buffer_class(name: str, value: Any) -> type:
    from stable_baselines3.common.buffers import RolloutBuffer

    if not (isinstance(value, type) and issubclass(value, RolloutBuffer)):
        raise TypeError(
            f"{name} must be None (the default buffer) or a subclass of SB3's RolloutBuffer, got {given(value)}; "
            f"e.g. {name}=None"
        )
    return value


def _check_policy_kwargs(name: str, value: Any) -> dict[str, Any] | None:
    """A dict, whose SB3 keys ``net_arch``, ``optimizer_class`` and ``activation_fn`` (when present) have the types
    SB3's policies take (they would fail deep inside torch otherwise)."""
    import torch as th

    kwargs = check_mapping(name, value, hint="e.g. policy_kwargs={'net_arch': [64, 64]}")
    if not kwargs:
        return kwargs
    arch = kwargs.get("net_arch")
    sizes = "a list of layer sizes, e.g. net_arch=[64, 64], or dict(pi=[64, 64], vf=[64, 64])"

    def layers(v: Any) -> bool:
        return isinstance(v, (list, tuple)) and all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in v)

    def per_net(v: Any) -> bool:
        return isinstance(v, dict) and all(layers(net) for net in v.values())

    # SB3 still takes the pre-1.8 form, one dict in a list ([dict(pi=[8], vf=[8])]), with a deprecation warning
    old_form = isinstance(arch, list) and len(arch) == 1 and per_net(arch[0])
    if arch is not None and not (layers(arch) or per_net(arch) or old_form):
        raise TypeError(f"{name}['net_arch'] must be {sizes}; got {given(arch)}")
    optimizer = kwargs.get("optimizer_class")
    if optimizer is not None and not (isinstance(optimizer, type) and issubclass(optimizer, th.optim.Optimizer)):
        raise TypeError(
            f"{name}['optimizer_class'] must be a torch optimizer class, e.g. torch.optim.Adam, got {given(optimizer)}"
        )
    activation = kwargs.get("activation_fn")
    if activation is not None and not (isinstance(activation, type) and issubclass(activation, th.nn.Module)):
        raise TypeError(
            f"{name}['activation_fn'] must be a torch.nn module class, e.g. torch.nn.Tanh, got {given(activation)}"
        )
    return kwargs


#: The checks of PPO's constructor arguments (SB3's ``PPO`` and GRPO take them): argument name -> check.
PPO_CHECKS: dict[str, Check] = {
    "learning_rate": lambda n, v: check_schedule(n, v, low=0, example=3e-4),
    "n_steps": lambda n, v: check_int(n, v, low=1, example=2048),
    "batch_size": lambda n, v: check_int(n, v, low=1, example=64),
    "n_epochs": lambda n, v: check_int(n, v, low=1, example=10),
    "gamma": lambda n, v: check_float(n, v, low=0, high=1, example=0.99),
    "gae_lambda": lambda n, v: check_float(n, v, low=0, high=1, example=0.95),
    "clip_range": lambda n, v: check_schedule(n, v, low=0, low_open=True, example=0.2),
    "clip_range_vf": _optional(lambda n, v: check_schedule(n, v, low=0, low_open=True, example=0.2)),
    "normalize_advantage": check_bool,
    # a number is checked (and refused) as before; a callable is an SB3 schedule, checked at its two ends
    "ent_coef": lambda n, v: check_schedule(n, v) if callable(v) else check_float(n, v, example=0.0),
    "vf_coef": lambda n, v: check_float(n, v, low=0, example=0.5),
    "max_grad_norm": lambda n, v: check_float(n, v, low=0, low_open=True, allow_inf=True, example=0.5),
    "use_sde": check_bool,
    "sde_sample_freq": lambda n, v: check_int(n, v, low=-1, example=-1),
    "target_kl": _optional(lambda n, v: check_float(n, v, low=0, low_open=True, example=0.01)),
    "stats_window_size": lambda n, v: check_int(n, v, low=1, example=100),
    "tensorboard_log": _optional(_check_path),
    "policy_kwargs": _check_policy_kwargs,
    "rollout_buffer_class": _optional(_check_buffer_class),
    "rollout_buffer_kwargs": lambda n, v: check_mapping(n, v),
    "verbose": lambda n, v: check_int(n, v, low=0, high=2, example=1),
    "seed": check_seed,
    "device": _check_device,
}

#: The checks of the options every algorithm of the package takes beyond PPO's (the skeleton's keyword-only
#: arguments): argument name -> check. Which values an algorithm supports is its declaration
#: (:class:`~sb3_grpo.common.options.support.Supports`).
SHARED_CHECKS: dict[str, Check] = {
    "advantage": lambda n, v: check_choice(n, v, tuple(ADVANTAGE_FORMS)),
    "grad_norm_warn": _optional(lambda n, v: check_float(n, v, low=0, low_open=True, allow_inf=True, example=1000.0)),
    "nonfinite": lambda n, v: check_choice(
        n, v, NONFINITE, hint="'raise' stops with an error (the default), 'skip' drops bad episodes and minibatches"
    ),
    "carry_over": lambda _n, v: check_carry_over_value(v),
    "micro_batch_size": _optional(lambda n, v: check_int(n, v, low=1, example=8)),
    "data_parallel": lambda n, v: check_choice(n, v, DATA_PARALLEL),
    "engine": lambda _n, v: check_engine(v),
    "reward_redistribution": _optional(lambda n, v: check_choice(n, v, REDISTRIBUTIONS, hint="None turns it off")),
}


def check_ppo_args(args: Mapping[str, Any]) -> None:
    """Check PPO's constructor arguments present in ``args`` (type, finiteness, range; others are ignored).

    :param args: Argument name -> value, e.g. a constructor's ``locals()`` or a comparison's hyperparameters.
    :raises TypeError: naming the first argument of a wrong type.
    :raises ValueError: naming the first argument with a wrong value (NaN and infinities included).
    """
    for name, check in PPO_CHECKS.items():
        if name in args:
            check(name, args[name])
    if "env" in args and args["env"] is None and args.get("_init_setup_model", False):
        raise ValueError(
            "env is None: pass an env to train on (a gymnasium Env, an SB3 VecEnv or an env id such as "
            "'CartPole-v1'); to use a saved model without an env, GRPO.load(path) and later model.set_env(env)"
        )


def check_argument_values(args: Mapping[str, Any]) -> None:
    """Check each of ``args`` that PPO or the skeleton takes on its own (:data:`PPO_CHECKS`, :data:`SHARED_CHECKS`;
    other keys are ignored), without the checks of how they go together: what ``load(path, **kwargs)`` and
    ``custom_objects`` set over a saved model.

    :raises TypeError: naming the first argument of a wrong type.
    :raises ValueError: naming the first argument with a wrong value (NaN and infinities included).
    """
    for name, value in args.items():
        check = PPO_CHECKS.get(name) or SHARED_CHECKS.get(name)
        if check is not None:
            check(name, value)


def check_shared_args(args: Mapping[str, Any], advantages: tuple[str, ...] | None = None) -> None:
    """Check the shared options present in ``args`` (:data:`SHARED_CHECKS`) and how they go together with the
    advantage form. Runs before any model is built.

    :param args: Argument name -> value (other keys are ignored).
    :param advantages: The forms the algorithm takes, which the message names for an ``advantage`` that is no form at
        all (``None``: every registered form).
    :raises TypeError: naming the first argument of a wrong type.
    :raises ValueError: naming the first argument with a wrong value, or two that do not go together.
    """
    for name, check in SHARED_CHECKS.items():
        if name not in args:
            continue
        value = args[name]
        if name == "advantage" and not (isinstance(value, str) and value in ADVANTAGE_FORMS):
            check_choice(name, value, advantages or tuple(ADVANTAGE_FORMS))
        check(name, value)
    form = advantage_form(args.get("advantage", "gae"))
    if args.get("carry_over") is True and form.critic:
        raise ValueError(
            "carry_over=True holds the steps of episodes whose group advantage is not known yet, so it needs a group "
            "advantage: pass advantage='group' (or 'rloo', 'self_critical', 'role'), or carry_over=False"
        )
    if args.get("carry_over") is True and form.per_token:
        raise ValueError(
            f"carry_over=True trains a held sequence with one advantage, but advantage={form.name!r} gives the steps "
            "of an episode advantages of their own (per turn or per token); pass carry_over=False (and n_steps of a "
            "few episode lengths, so few episodes straddle two rollouts)"
        )


def check_clip_bounds(clip_range_low: Any, clip_range_high: Any, low_example: float, high_example: float) -> None:
    """The bounds of a decoupled clip (``clip_range_low``: ``None`` or ``> 0``; ``clip_range_high > 0``), as DAPO, GSPO
    and CISPO take them.

    :raises TypeError: naming a bound of a wrong type.
    :raises ValueError: naming a bound with a wrong value.
    """
    if clip_range_low is not None:
        check_float("clip_range_low", clip_range_low, low=0, low_open=True, example=low_example)
    check_float("clip_range_high", clip_range_high, low=0, low_open=True, example=high_example)


def check_learn_args(total_timesteps: Any, callback: Any, log_interval: Any, tb_log_name: Any) -> int:
    """Check ``learn``'s arguments (SB3's take them unchecked).

    :return: ``total_timesteps`` as an int (an integral float such as ``1e5`` is accepted, as SB3 users write it).
    :raises TypeError: for a value of a wrong type (a callback that is not a ``BaseCallback``, a callable or a list
        of them).
    :raises ValueError: for NaN, a negative or fractional ``total_timesteps``, or ``log_interval < 1``.
    """
    from stable_baselines3.common.callbacks import BaseCallback

    todo = "pass the number of env steps to train for, e.g. total_timesteps=100_000"
    if (
        isinstance(total_timesteps, float)
        and math.isfinite(total_timesteps)
        and total_timesteps == int(total_timesteps)
    ):
        total_timesteps = int(total_timesteps)
    if isinstance(total_timesteps, float):
        check_float("total_timesteps", total_timesteps, low=0, hint=todo)
        raise ValueError(f"total_timesteps must be a whole number of env steps, got {total_timesteps}; {todo}")
    total_timesteps = check_int("total_timesteps", total_timesteps, low=0, hint=todo)
    if log_interval is not None:
        check_int("log_interval", log_interval, low=1, hint="pass the iterations between log dumps, e.g. 1, or None")
    if tb_log_name is not None and not isinstance(tb_log_name, str):
        raise TypeError(f"tb_log_name must be a str or None, got {given(tb_log_name)}; e.g. tb_log_name='run'")
    items = callback if isinstance(callback, list) else [callback]
    for item in items:
        if item is not None and not isinstance(item, BaseCallback) and not callable(item):
            raise TypeError(
                f"callback must be None, an SB3 BaseCallback, a callable f(locals, globals) -> bool, or a list of "
                f"them, got {given(item)}; e.g. callback=CheckpointCallback(1000, 'ckpt')"
            )
    return total_timesteps


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


def check_carry_over_value(carry_over: Any) -> None:
    """``carry_over`` is ``True``, ``False`` or ``"auto"``."""
    if carry_over is not True and carry_over is not False and carry_over != "auto":
        raise TypeError(
            f"carry_over must be True, False or 'auto' (on for group advantages on the text fast path), got "
            f"{carry_over!r}"
        )


def resolve_carry_over(carry_over: bool | str, advantage: str, buffer_class: type, importance_cap: Any = None) -> bool:
    """Whether ``carry_over`` is on: ``True`` / ``False`` as given; ``"auto"`` is on where it applies, that is with a
    group advantage that gives a held sequence one advantage (not ``"gae"``, not ``"group_turn"``), the text fast
    path's buffer (:class:`~sb3_grpo.common.buffers.SequenceRolloutBuffer`), and no vLLM importance cap (which
    weights each rollout's own steps)."""
    if carry_over != "auto":
        return bool(carry_over)
    form = advantage_form(advantage)
    return (
        not form.critic
        and not form.per_token
        and issubclass(buffer_class, SequenceRolloutBuffer)
        and importance_cap is None
    )


def check_carry_over(buffer_class: type, carry_over: bool | str) -> None:
    """``carry_over`` holds whole sequences of the text fast path, so the rollout buffer must be a
    :class:`~sb3_grpo.common.buffers.SequenceRolloutBuffer` (a ``CausalLMPolicy`` on a text env, the default buffer).

    :raises ValueError: when it is not.
    """
    if carry_over is True and not issubclass(buffer_class, SequenceRolloutBuffer):
        raise ValueError(
            f"carry_over=True holds the text fast path's sequences until their group advantage is known; the rollout "
            f"buffer here is {buffer_class.__name__}. Use a CausalLMPolicy on a text env with rollout_buffer_class="
            "None (GRPO's default), or carry_over=False"
        )
