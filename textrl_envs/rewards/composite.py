"""Weighted composition of rewards: the layered, multi-objective reward."""

from __future__ import annotations

import threading
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


#: What :class:`CompositeReward` does to each component's scores before weighting them.
NORMALIZE = (None, "batch", "running")
#: Added to a standard deviation before dividing by it.
NORMALIZE_EPS = 1e-8


def normalize_scores(values: np.ndarray, mean: float, std: float, eps: float = NORMALIZE_EPS) -> np.ndarray:
    """``(values - mean) / (std + eps)``: a component's scores on a common scale before weighting."""
    return (np.asarray(values, dtype=np.float64) - mean) / (std + eps)


class RunningMoments:
    """Mean and population standard deviation of every value seen so far (Chan et al.'s parallel update of
    Welford's algorithm, one batch at a time)."""

    def __init__(self) -> None:
        self.count, self.mean, self._m2 = 0, 0.0, 0.0

    def update(self, values: np.ndarray) -> None:
        values = np.asarray(values, dtype=np.float64)
        n = values.size
        if n == 0:
            return
        batch_mean = float(values.mean())
        batch_m2 = float(((values - batch_mean) ** 2).sum())
        total = self.count + n
        delta = batch_mean - self.mean
        self.mean += delta * n / total
        self._m2 += batch_m2 + delta * delta * self.count * n / total
        self.count = total

    @property
    def std(self) -> float:
        return float(np.sqrt(self._m2 / self.count)) if self.count else 0.0


@register_reward("composite")
class CompositeReward(RewardModel):
    """Weighted sum of reward models: ``r = sum_i w_i * r_i(prompts, completions, **metadata)``.

    Each component is called through :func:`~textrl_envs.rewards.base.call_reward`, so its output is
    checked and its errors name it; a plain callable component receives only the keywords it accepts. A component's
    ``None`` for a completion (TRL's "not applicable") leaves it out of that completion's sum, as TRL's ``nansum``
    does; a completion no component scores gets ``None``. The range is the weighted sum of the components' ranges.
    :meth:`score_components` returns the sum and each component's scores of the batch (an env puts them in each
    episode's ``info["reward_components"]``, and :class:`~sb3_grpo.callbacks.CompletionLogger` logs them per
    episode). After each call, :attr:`last_components`
    maps each component's label to its scores (unweighted) for logging, and
    :meth:`pop_component_means` gives each component's mean score since it was last called. A reader of its own
    (:meth:`component_reader`: what :class:`~sb3_grpo.callbacks.CompletionLogger` logs as ``reward/<label>``) counts
    from its own last read, so several readers of one reward each see every episode.

    Components on different scales (a 0/1 correctness score beside a length penalty in words) can be put on one
    scale before they are weighted, as TRL's GRPO does with its ``normalize_then_sum`` aggregation:
    ``r = sum_i w_i * (r_i - mean_i) / (std_i + eps)``. With ``normalize="batch"`` the mean and (population)
    standard deviation are those of the batch being scored; with ``normalize="running"`` those of every score the
    component has given so far, this batch included (steadier when an env scores a few episodes at a time). The
    sum is then no longer within the components' ranges.

    ``components`` is any of::

        {"sentiment": 1.0, "length": 0.5}                       # registered names -> weight
        {"length": (0.5, {"max_words": 20})}                    # name -> (weight, kwargs)
        [(LexiconSentiment(), 1.0), (my_fn, -0.2)]              # (reward, weight)
        [("length", 0.5, {"min_words": 5, "max_words": 20})]    # (name, weight, kwargs)

    :param components: The rewards and their weights (see above).
    :param name: Name used in messages and logs (default: ``"composite(a*w_a + b*w_b ...)"``).
    :param normalize: ``None`` (the weighted sum of the scores), ``"batch"`` or ``"running"`` (each component's
        scores standardised before weighting, see above).
    """

    def __init__(self, components: Any, name: str | None = None, normalize: str | None = None) -> None:
        if normalize not in NORMALIZE:
            raise ValueError(
                f"normalize must be one of {NORMALIZE} (None: a plain weighted sum; 'batch' or 'running': each "
                f"component standardised before weighting), got {normalize!r}"
            )
        self.components = _parse_components(components)
        self.normalize = normalize
        default = "composite(" + " + ".join(f"{w:g}*{label}" for label, _, w in self.components) + ")"
        if normalize is not None:
            default += f"[normalize={normalize}]"
        super().__init__(name or default)
        #: Unweighted scores of each component on the last batch, by label.
        self.last_components: dict[str, np.ndarray] = {}
        self._moments = {label: RunningMoments() for label, _, _ in self.components}
        # every finite score so far, per label: [sum, count] (readers take differences, so nothing resets them)
        self._totals: dict[str, list[float]] = {label: [0.0, 0] for label, _, _ in self.components}
        self._lock = threading.Lock()  # an env may score in a background worker while a callback reads the means
        self._own_reader = ComponentMeanReader(self)

    @property
    def weights(self) -> dict[str, float]:
        """Component label -> weight."""
        return {label: w for label, _, w in self.components}

    def score(
        self,
        prompts: list[str],
        completions: list[str],
        *,
        completion_ids: Any = None,
        trainer_state: Any = None,
        chat_prompts: Any = None,
        chat_completions: Any = None,
        **kwargs: Any,
    ) -> np.ndarray | list[float | None]:
        return self.score_components(
            prompts,
            completions,
            completion_ids=completion_ids,
            trainer_state=trainer_state,
            chat_prompts=chat_prompts,
            chat_completions=chat_completions,
            **kwargs,
        )[0]

    def score_components(
        self,
        prompts: list[str],
        completions: list[str],
        *,
        completion_ids: Any = None,
        trainer_state: Any = None,
        chat_prompts: Any = None,
        chat_completions: Any = None,
        **kwargs: Any,
    ) -> tuple[np.ndarray | list[float | None], dict[str, np.ndarray]]:
        """The weighted sum (what :meth:`score` returns) and each component's unweighted, unnormalised scores of this
        batch, by label: what an env puts in each episode's ``info["reward_components"]``.

        A component that returns ``None`` for a completion (TRL's "not applicable") is left out of that completion's
        sum (its score is NaN in the components); a completion that no component scores gets ``None``, which the env
        treats as its ``nonfinite_reward`` says. Unlike :attr:`last_components`, the scores come back with the call,
        so a reward scored in a background thread gives each batch its own.

        :param completion_ids: Each completion's token ids, handed to the components that take them.
        :param trainer_state: How far training has come, handed on likewise.
        :param chat_prompts: The prompts as chat conversations (chat-template envs), handed on likewise.
        :param chat_completions: Interactive episodes' transcripts as messages, handed on likewise.
        :param kwargs: The metadata columns.
        """
        total = np.zeros(len(completions), dtype=np.float64)
        scored = np.zeros(len(completions), dtype=bool)
        last: dict[str, np.ndarray] = {}
        for label, model, weight in self.components:
            values = call_reward(
                model,
                prompts,
                completions,
                kwargs,
                completion_ids=completion_ids,
                trainer_state=trainer_state,
                chat_prompts=chat_prompts,
                chat_completions=chat_completions,
                on_none="nan",
            )
            last[label] = values
            applies = ~np.isnan(values)  # a component's NaN here is a None: its own NaN/inf raised in call_reward
            scored |= applies
            total += np.where(applies, weight * self._scaled(label, values), 0.0)
        with self._lock:
            for label, values in last.items():
                finite = values[np.isfinite(values)]
                self._totals[label][0] += float(finite.sum())
                self._totals[label][1] += int(finite.size)
        self.last_components = last
        if not scored.all():
            return [float(t) if s else None for t, s in zip(total, scored)], last
        return total, last

    def _scaled(self, label: str, values: np.ndarray) -> np.ndarray:
        """A component's scores as they enter the sum: as they are, or standardised over those that apply."""
        if self.normalize is None:
            return values
        applies = values[~np.isnan(values)]
        if self.normalize == "batch":
            if not applies.size:
                return values
            return normalize_scores(values, float(applies.mean()), float(applies.std()))
        moments = self._moments[label]
        moments.update(applies)
        return normalize_scores(values, moments.mean, moments.std)

    def component_totals(self) -> dict[str, tuple[float, int]]:
        """Each component's sum of finite (unweighted, unnormalised) scores and their count, over every episode
        scored so far."""
        with self._lock:
            return {label: (total, int(n)) for label, (total, n) in self._totals.items()}

    def component_reader(self) -> ComponentMeanReader:
        """A reader of the component means that counts from now on and from its own last read, whoever else reads:
        what a callback that logs them holds."""
        return ComponentMeanReader(self)

    def pop_component_means(self) -> dict[str, float]:
        """Each component's mean (unweighted, unnormalised) score over the episodes scored since the last call
        (components with nothing scored are left out); starts the next count. Readers made by
        :meth:`component_reader` keep their own counts, untouched by this one."""
        return self._own_reader.pop()

    def to(self, device: Any) -> CompositeReward:
        """Move every component that has tensors to ``device``."""
        for _, model, _ in self.components:
            if hasattr(model, "to") and isinstance(model, RewardModel):
                model.to(device)
        return self

    def __repr__(self) -> str:
        return f"CompositeReward({[(label, w) for label, _, w in self.components]!r})"


class ComponentMeanReader:
    """Reads a :class:`CompositeReward`'s component means since its own last read (:meth:`pop`), from the reward's
    running totals: readers never reset anything, so each sees every episode however many there are.

    :param reward: The reward to read; counting starts when the reader is made.
    """

    def __init__(self, reward: CompositeReward) -> None:
        self.reward = reward
        self._seen = reward.component_totals()

    def pop(self) -> dict[str, float]:
        """Each component's mean score over the episodes scored since this reader last read (components with
        nothing new are left out)."""
        now = self.reward.component_totals()
        means = {}
        for label, (total, n) in now.items():
            seen_total, seen_n = self._seen.get(label, (0.0, 0))
            if n > seen_n:
                means[label] = (total - seen_total) / (n - seen_n)
        self._seen = now
        return means


def reward_sum(rewards: list[Any]) -> CompositeReward:
    """TRL's ``reward_funcs``: the sum of ``rewards`` (names, :class:`~textrl_envs.rewards.RewardModel` objects or
    callables), each with weight 1 (TRL's ``reward_weights`` are ``CompositeReward([(f, 1.0), (g, 0.5)])``). A
    reward's ``None`` leaves it out of a completion's sum.

    :raises ValueError: for an empty list.
    """
    if not rewards:
        raise ValueError("reward=[] holds no reward; give one or more (names, RewardModels or callables)")
    return CompositeReward([(r, 1.0) for r in rewards])
