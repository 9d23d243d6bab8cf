"""The ``trainer_state`` a reward sees: how far training has come, pushed to a text env at each rollout's start.

TRL hands its reward functions ``trainer_state=`` (transformers' ``TrainerState``) so that a reward may change as
training goes on (a length target that grows, a format bonus that fades). Here the env calls its rewards, so the
algorithm tells the env: :func:`push_trainer_state` sets the env's
:class:`~textrl_envs.rewards.calls.TrainerState` through ``env_method("set_trainer_state", ...)``. The algorithms of
:mod:`sb3_grpo` call it at the start of every rollout; :class:`~sb3_grpo.callbacks.TrainerStateCallback` does the
same for any SB3 algorithm (stock ``PPO``). An env that is not a text env is left alone.
"""

from __future__ import annotations

from typing import Any

__all__ = ["push_trainer_state", "trainer_state_fields"]


def trainer_state_fields(num_timesteps: int, total_timesteps: int, n_steps: int, n_envs: int) -> dict[str, int]:
    """The :class:`~textrl_envs.rewards.calls.TrainerState` of an on-policy run: ``global_step`` the rollouts done
    (``num_timesteps // (n_steps * n_envs)``), ``max_steps`` those ``learn()`` does in all (rounded up, as SB3's loop
    runs until ``num_timesteps >= total_timesteps``).

    :param num_timesteps: SB3's ``num_timesteps`` (env steps so far, summed over the envs).
    :param total_timesteps: SB3's ``_total_timesteps`` (the env steps ``learn()`` runs to).
    :param n_steps: Steps per env per rollout.
    :param n_envs: Envs.
    """
    per_rollout = max(1, int(n_steps) * int(n_envs))
    return {
        "global_step": int(num_timesteps) // per_rollout,
        "max_steps": -(-int(total_timesteps) // per_rollout),
        "num_timesteps": int(num_timesteps),
        "total_timesteps": int(total_timesteps),
    }


def push_trainer_state(model: Any, env: Any) -> bool:
    """Set the trainer state of ``model``'s run on ``env`` (an SB3 ``VecEnv``); ``False`` for an env without
    ``set_trainer_state`` (not a text env), which is left alone.

    :param model: An SB3 on-policy algorithm (``n_steps``, ``num_timesteps``, ``_total_timesteps``).
    :param env: Its training ``VecEnv``.
    """
    has = getattr(env, "has_attr", None)
    if has is None or not has("set_trainer_state"):
        return False
    fields = trainer_state_fields(
        model.num_timesteps, getattr(model, "_total_timesteps", 0), getattr(model, "n_steps", 1), env.num_envs
    )
    env.env_method("set_trainer_state", **fields)
    return True
