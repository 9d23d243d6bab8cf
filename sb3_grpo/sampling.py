"""Look at a saved model: load a checkpoint and play episodes with it (``sb3-grpo sample``, rl-zoo3's ``enjoy``)."""

from __future__ import annotations

import json
import os
import zipfile
from collections.abc import Iterator
from typing import Any

import numpy as np

__all__ = ["ALGO_CLASSES", "checkpoint_algo", "load_checkpoint", "make_sample_env", "sample_episodes"]

#: ``--algo`` name -> the algorithm class's import path.
ALGO_CLASSES = {
    "ppo": ("stable_baselines3", "PPO"),
    "grpo": ("sb3_grpo", "GRPO"),
    "dr-grpo": ("sb3_grpo", "DrGRPO"),
}


def checkpoint_algo(path: str | os.PathLike) -> str:
    """The ``--algo`` name of an SB3 checkpoint, from the attributes it saved (Dr. GRPO's ``max_completion_tokens``,
    GRPO's ``grad_var_coef``; otherwise stock PPO)."""
    try:
        with zipfile.ZipFile(path) as archive:
            data = json.loads(archive.read("data"))
    except (OSError, KeyError, zipfile.BadZipFile, json.JSONDecodeError) as err:
        raise ValueError(f"{os.fspath(path)!r} is not an SB3 checkpoint (a .zip saved by model.save): {err}") from None
    if "max_completion_tokens" in data:
        return "dr-grpo"
    if "grad_var_coef" in data:
        return "grpo"
    return "ppo"


def load_checkpoint(path: str | os.PathLike, algo: str = "auto", device: str = "cpu", env: Any = None) -> Any:
    """Load an SB3 checkpoint with its algorithm class (``algo="auto"``: :func:`checkpoint_algo`)."""
    import importlib

    name = checkpoint_algo(path) if algo == "auto" else algo
    if name not in ALGO_CLASSES:
        raise ValueError(f"unknown algo {algo!r}; known: auto, {', '.join(ALGO_CLASSES)}")
    module, cls_name = ALGO_CLASSES[name]
    cls = getattr(importlib.import_module(module), cls_name)
    return cls.load(os.fspath(path), env=env, device=device)


def make_sample_env(env_id: str, env_kwargs: dict[str, Any] | None = None, seed: int | None = None) -> Any:
    """One env to sample on, as an SB3 VecEnv: a text env through :func:`textrl_envs.sb3.make_vec_env`, any other
    registered id through SB3's ``make_vec_env``."""
    import textrl_envs

    env_kwargs = dict(env_kwargs or {})
    if env_id in textrl_envs.ENV_IDS:
        from textrl_envs.sb3 import make_vec_env

        env_kwargs.setdefault("device", "cpu")
        return make_vec_env(env_id, n_envs=1, seed=seed, **env_kwargs)
    from stable_baselines3.common.env_util import make_vec_env as sb3_make_vec_env

    return sb3_make_vec_env(env_id, n_envs=1, seed=seed, env_kwargs=env_kwargs)


def sample_episodes(model: Any, env: Any, n: int, deterministic: bool = False) -> Iterator[dict[str, Any]]:
    """Play ``n`` episodes of ``model`` on ``env`` (an SB3 VecEnv) and yield one row per episode.

    A row holds the episode's return (``reward``) and length in steps (``steps``), plus, for text envs, what the env
    put in the final info: prompt, completion, length in tokens, turns and transcript (the columns of
    :func:`~sb3_grpo.callbacks.completions.completion_row`).
    """
    from sb3_grpo.callbacks.completions import completion_row

    obs = env.reset()
    returns, steps = np.zeros(env.num_envs), np.zeros(env.num_envs, dtype=int)
    done_count = 0
    while done_count < n:
        actions, _ = model.predict(obs, deterministic=deterministic)
        obs, rewards, dones, infos = env.step(actions)
        returns += rewards
        steps += 1
        for j in np.flatnonzero(dones):
            if done_count >= n:
                break
            row = completion_row(infos[j], env_index=int(j), timestep=int(model.num_timesteps), rollout=0)
            row = {k: v for k, v in row.items() if v is not None and k not in ("rollout", "env")}
            row.update(episode=done_count, reward=float(returns[j]), steps=int(steps[j]))
            yield row
            done_count += 1
            returns[j], steps[j] = 0.0, 0


def format_row(row: dict[str, Any]) -> str:
    """A row as text for the terminal: the transcript (or prompt and completion) and the reward."""
    head = f"episode {row['episode']}: reward {row['reward']:.4g}, {row['steps']} steps"
    if "transcript" in row:
        lines = [f"  prompt: {row.get('prompt', '')!r}"] + [f"  {m['role']}: {m['text']!r}" for m in row["transcript"]]
        return "\n".join([head, *lines])
    if "completion" in row:
        return f"{head}\n  prompt: {row.get('prompt', '')!r}\n  completion: {row['completion']!r}"
    return head
