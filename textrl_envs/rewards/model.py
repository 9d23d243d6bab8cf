"""The reward-model base class: batched, device-aware, called as the environments call every reward."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["RewardModel"]


class RewardModel:
    """Base class of batched reward models.

    Subclasses implement :meth:`score`; :meth:`__call__` is what environments call. A reward
    model that runs a neural network is device-aware: it takes ``device`` and moves itself there
    with :meth:`to`.

    :param name: Name used in error messages and logs (defaults to the class name).
    """

    #: Metadata keys this reward needs in ``kwargs`` (checked before scoring).
    required_kwargs: tuple[str, ...] = ()
    #: Whether, with chat prompts, :meth:`score` gets TRL's conversational forms (prompts as message lists,
    #: completions as ``[{"role": "assistant", "content": ...}]`` or an interactive episode's transcript) instead of
    #: text (:mod:`textrl_envs.rewards.calls`).
    conversational: bool = False

    def __init__(self, name: str | None = None) -> None:
        self.name = name or type(self).__name__

    def score(self, prompts: list[str], completions: list[str], **kwargs: Any) -> Sequence[float]:
        """Score a batch of completions.

        :param prompts: The prompt texts.
        :param completions: The generated texts (without the prompt and without EOS).
        :param kwargs: Per-example metadata, each a list aligned with ``prompts``.
        :return: One float per completion.
        """
        raise NotImplementedError

    def __call__(self, prompts: list[str], completions: list[str], **kwargs: Any) -> Sequence[float]:
        missing = [k for k in self.required_kwargs if k not in kwargs]
        if missing:
            raise ValueError(
                f"reward {self.name!r} needs per-example {', '.join(missing)} in its keyword arguments; "
                f"give prompts as dicts with those keys, e.g. {{'prompt': ..., {missing[0]!r}: ...}}"
            )
        return self.score(list(prompts), list(completions), **kwargs)

    def to(self, device: Any) -> RewardModel:  # noqa: ARG002  (the interface: models with tensors move there)
        """Move the model to ``device`` (a no-op for models without tensors)."""
        return self

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"
