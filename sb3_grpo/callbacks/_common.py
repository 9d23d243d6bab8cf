"""What the callbacks share: the alert warning class and argument checks."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

__all__ = ["TrainingAlertWarning", "check_positive_int", "env_chain"]


class TrainingAlertWarning(UserWarning):
    """A training quantity (gradient norm, KL, evaluation reward) crossed a threshold set on a callback."""


def check_positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return int(value)


# ---------------------------------------------------------------------------------------------------------
# Checkpoints
# ---------------------------------------------------------------------------------------------------------


def env_chain(env: Any) -> Iterator[Any]:
    """Every object of an env's wrapper chain, each once: ``venv``, ``env`` and ``unwrapped`` links, and the envs of
    a ``DummyVecEnv``."""
    stack, visited = [env], set()
    while stack:
        obj = stack.pop()
        if obj is None or id(obj) in visited:
            continue
        visited.add(id(obj))
        yield obj
        for attr in ("venv", "env", "unwrapped"):
            inner = getattr(obj, attr, None)
            if inner is not None and inner is not obj:
                stack.append(inner)
        envs = getattr(obj, "envs", None)
        if isinstance(envs, (list, tuple)):
            stack.extend(envs)
