"""textrl_envs: token-generation MDPs as registered Gymnasium environments.

``import textrl_envs`` registers every id of the suite, from the one list of tasks in
:mod:`textrl_envs.tasks` (with a ``vector_entry_point`` for the batched, torch-native vector env); nothing
heavy is imported until an env is made::

    import gymnasium as gym
    import textrl_envs  # noqa: F401  (importing it registers the ids)

    env = gym.make("TextGen-v0")
    envs = gym.make_vec("TextGen-v0", num_envs=64, device="auto", group_size=4)
"""

from __future__ import annotations

from gymnasium.envs.registration import register, registry

from textrl_envs.tasks import TASKS

__version__ = "0.1.0"

#: Every registered env id and the class (``module:Class``) that documents it, from :data:`textrl_envs.tasks.TASKS`.
ENV_IDS: dict[str, str] = {task.env_id: task.entry_point for task in TASKS}

for _task in TASKS:
    if _task.env_id not in registry:
        register(
            id=_task.env_id,
            entry_point=_task.entry_point,
            vector_entry_point=_task.vector_entry_point,
            kwargs=_task.registered_kwargs,
        )

__all__ = ["ENV_IDS", "__version__"]
