"""Registry of named reward models: ``make_reward(name, **kwargs)`` and ``reward="name"`` in ``gym.make``.

This module holds only the registry. The built-in rewards register themselves with :func:`register_reward`
when their modules are imported, and ``textrl_envs/rewards/__init__.py`` imports them all; Python runs that
package ``__init__`` before this module can be imported from it, so every built-in name is registered by the
time :func:`make_reward` is called.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Any

from textrl_envs.rewards.base import RewardModel

_REGISTRY: dict[str, Callable[..., Any]] = {}


def register_reward(name: str, factory: Callable[..., Any] | None = None, *, overwrite: bool = False):
    """Register a reward factory under ``name`` (usable as a decorator).

    :param name: The registry name, e.g. ``"sentiment"``.
    :param factory: A class or function returning a reward model (``RewardModel`` or callable).
    :param overwrite: Replace an existing entry instead of raising.
    """

    def _register(f: Callable[..., Any]) -> Callable[..., Any]:
        if name in _REGISTRY and not overwrite and _REGISTRY[name] is not f:
            raise ValueError(f"reward {name!r} is already registered; pass overwrite=True to replace it")
        _REGISTRY[name] = f
        return f

    return _register(factory) if factory is not None else _register


def registered_rewards() -> list[str]:
    """Sorted names of all registered rewards."""
    return sorted(_REGISTRY)


def make_reward(name: str, **kwargs: Any) -> Any:
    """Build the registered reward model ``name`` with ``kwargs``.

    :raises ValueError: if ``name`` is not registered (the message lists the known names).
    """
    if not isinstance(name, str):
        raise TypeError(f"make_reward expects a registered name (str), got {type(name).__name__}")
    if name not in _REGISTRY:
        close = difflib.get_close_matches(name, _REGISTRY, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(
            f"reward {name!r} is not registered; known: {', '.join(sorted(_REGISTRY))}.{hint} "
            "Or pass a callable f(prompts, completions, **kwargs) -> floats"
        )
    return _REGISTRY[name](**kwargs)


def resolve_reward(reward: Any, **kwargs: Any) -> Any:
    """Turn ``reward`` (a registered name, a :class:`RewardModel` or a callable) into a callable (a list of them,
    TRL's ``reward_funcs``, is their sum: :func:`textrl_envs.rewards.composite.reward_sum`).

    :raises TypeError: for anything else.
    """
    if isinstance(reward, str):
        return make_reward(reward, **kwargs)
    if kwargs:
        raise TypeError("reward_kwargs are only used with a registered reward name")

    if isinstance(reward, RewardModel) or callable(reward):
        return reward
    raise TypeError(
        f"reward must be a registered name, a RewardModel, a callable f(prompts, completions, **kwargs) -> floats "
        f"or a list of those; got {type(reward).__name__}"
    )
