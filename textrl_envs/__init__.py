"""textrl_envs: token-generation MDPs as registered Gymnasium environments.

``import textrl_envs`` registers every id of the suite (with a ``vector_entry_point`` for the
batched, torch-native vector env); nothing heavy is imported until an env is made::

    import gymnasium as gym
    import textrl_envs  # noqa: F401

    env = gym.make("TextGen-v0")
    envs = gym.make_vec("TextGen-v0", num_envs=64, device="auto", group_size=4)
"""

from __future__ import annotations

from gymnasium.envs.registration import register, registry

__version__ = "0.1.0"

#: Every registered env id and the class (``module:Class``) that documents it.
ENV_IDS: dict[str, str] = {
    "TextGen-v0": "textrl_envs.tasks.sentiment:SentimentEnv",
    "Arithmetic-v0": "textrl_envs.tasks.arithmetic:ArithmeticEnv",
    "IncreasingNumbers-v0": "textrl_envs.tasks.sequence:IncreasingNumbersEnv",
    "CommonGen-v0": "textrl_envs.tasks.reference:CommonGenEnv",
    "Keywords-v0": "textrl_envs.tasks.constraints:KeywordsEnv",
}

for _env_id, _entry in ENV_IDS.items():
    if _env_id not in registry:
        register(
            id=_env_id,
            entry_point=_entry,
            vector_entry_point="textrl_envs.vector:TextGenVectorEnv",
            kwargs={"task": _env_id},
        )

__all__ = ["ENV_IDS", "__version__"]
