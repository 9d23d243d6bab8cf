"""Weighted composition of rewards: the layered, multi-objective reward."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from textrl_envs.rewards.base import RewardModel, call_reward, reward_name
from textrl_envs.rewards.registry import register_reward, resolve_reward


def _parse_components(components: Any) -> list[tuple[str, Any, float]]:
    """Normalise the accepted shapes into ``[(label, reward, weight), ...]``."""
    if isinstance(components, Mapping):
        items = []
        for key, value in components.items():
            if isinstance(value, (tuple, list)):
                items.append((key, *value))
            else:
                items.append((key, value))
    elif isinstance(components, Sequence) and not isinstance(components, (str, bytes)):
        items = [tuple(c) if isinstance(c, (tuple, list)) else c for c in components]
    else:
        raise TypeError(
            "components must be a dict {name: weight} or a list of (reward, weight) or (name, weight, kwargs); "
            f"got {type(components).__name__}"
        )
    if not items:
        raise ValueError("CompositeReward needs at least one component")
    parsed: list[tuple[str, Any, float]] = []
    seen: dict[str, int] = {}
    for item in items:
        if not isinstance(item, tuple) or len(item) not in (2, 3):
            raise ValueError(
                f"component {item!r} must be (reward, weight) or (name, weight, kwargs), with reward a registered "
                "name, a RewardModel or a callable"
            )
        reward, weight = item[0], item[1]
        kwargs = item[2] if len(item) == 3 else {}
        if (
            isinstance(weight, bool)
            or not isinstance(weight, (int, float, np.integer, np.floating))
            or not np.isfinite(weight)
        ):
            raise ValueError(
                f"component {reward_name(reward) if not isinstance(reward, str) else reward!r} has weight "
                f"{weight!r}; weights must be finite numbers"
            )
        if kwargs and not isinstance(reward, str):
            raise TypeError("component kwargs are only used with a registered reward name")
        model = resolve_reward(reward, **dict(kwargs))
        label = reward if isinstance(reward, str) else reward_name(model)
        seen[label] = seen.get(label, 0) + 1
        if seen[label] > 1:
            label = f"{label}#{seen[label]}"
        parsed.append((label, model, float(weight)))
    return parsed


@register_reward("composite")
class CompositeReward(RewardModel):
    """Weighted sum of reward models: ``r = sum_i w_i * r_i(prompts, completions, **metadata)``.

    Each component is called through :func:`~textrl_envs.rewards.base.call_reward`, so its output is
    checked and its errors name it; a plain callable component receives only the metadata keys it
    accepts. The range is the weighted sum of the components' ranges. After each call,
    :attr:`last_components` maps each component's label to its scores (unweighted) for logging.

    ``components`` is any of::

        {"sentiment": 1.0, "length": 0.5}                       # registered names -> weight
        {"length": (0.5, {"max_words": 20})}                    # name -> (weight, kwargs)
        [(LexiconSentiment(), 1.0), (my_fn, -0.2)]              # (reward, weight)
        [("length", 0.5, {"min_words": 5, "max_words": 20})]    # (name, weight, kwargs)

    :param components: The rewards and their weights (see above).
    :param name: Name used in messages and logs (default: ``"composite(a*w_a + b*w_b ...)"``).
    """

    def __init__(self, components: Any, name: str | None = None) -> None:
        self.components = _parse_components(components)
        default = "composite(" + " + ".join(f"{w:g}*{label}" for label, _, w in self.components) + ")"
        super().__init__(name or default)
        #: Unweighted scores of each component on the last batch, by label.
        self.last_components: dict[str, np.ndarray] = {}

    @property
    def weights(self) -> dict[str, float]:
        """Component label -> weight."""
        return {label: w for label, _, w in self.components}

    def score(self, prompts: list[str], completions: list[str], **kwargs: Any) -> np.ndarray:
        total = np.zeros(len(completions), dtype=np.float64)
        last: dict[str, np.ndarray] = {}
        for label, model, weight in self.components:
            values = call_reward(model, prompts, completions, kwargs)
            last[label] = values
            total += weight * values
        self.last_components = last
        return total

    def to(self, device: Any) -> CompositeReward:
        """Move every component that has tensors to ``device``."""
        for _, model, _ in self.components:
            if hasattr(model, "to") and isinstance(model, RewardModel):
                model.to(device)
        return self

    def __repr__(self) -> str:
        return f"CompositeReward({[(label, w) for label, _, w in self.components]!r})"
