"""The task suite: one module per task family, each registering a :class:`Task` here.

A task is the defaults behind one registered environment id: where its prompts come from, which
reward scores it, and its token budgets. ``textrl_envs/__init__.py`` registers every task in
:data:`TASKS` with Gymnasium (entry point and vector entry point), so ``gym.make(task.env_id)``
works; any default can be overridden with keyword arguments to ``gym.make``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

PromptItem = Any  # str, or a dict {"prompt": str, **metadata}


@dataclass(frozen=True)
class Task:
    """Defaults of one registered environment id.

    :param env_id: The Gymnasium id, e.g. ``"TextGen-v0"``.
    :param summary: One line for the README table.
    :param prompts: Zero-argument function returning the default prompts (loaded lazily).
    :param reward: Registered reward name used by default.
    :param reward_kwargs: Keyword arguments for the default reward.
    :param max_new_tokens: Default generation budget.
    :param max_prompt_tokens: Default prompt budget.
    """

    env_id: str
    summary: str
    prompts: Callable[[], list[PromptItem]]
    reward: str
    reward_kwargs: dict[str, Any] = field(default_factory=dict)
    max_new_tokens: int = 24
    max_prompt_tokens: int = 16


TASKS: dict[str, Task] = {}


def register_task(task: Task) -> Task:
    """Add ``task`` to :data:`TASKS` (its env id must be new)."""
    if task.env_id in TASKS:
        raise ValueError(f"task {task.env_id!r} is already registered")
    TASKS[task.env_id] = task
    return task


def get_task(env_id: str) -> Task:
    """The :class:`Task` registered under ``env_id``."""
    _load()
    try:
        return TASKS[env_id]
    except KeyError:
        raise ValueError(f"no task {env_id!r}; known: {', '.join(sorted(TASKS))}") from None


def all_tasks() -> list[Task]:
    """Every registered task, in registration order."""
    _load()
    return list(TASKS.values())


def _load() -> None:
    from textrl_envs.tasks import suite  # noqa: F401  (importing registers the tasks)
