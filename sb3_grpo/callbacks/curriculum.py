"""Difficulty curricula: :class:`PassRateCurriculum`, :class:`StagedCurriculum`, :class:`LevelCurriculum` and their
pure functions.

A prompt every episode solves (or none does) gives a group of episodes equal rewards and so no group-advantage
signal; DAPO (Yu et al. 2025, arXiv 2503.14476) drops such groups after sampling them. :class:`PassRateCurriculum`
instead stops drawing those prompts: it keeps each prompt's recent pass rate from the episodes it ends and sets the
env's prompt-draw weights (``set_prompt_weights``) at rollout boundaries. :class:`StagedCurriculum` chooses the
prompts by timestep; :class:`LevelCurriculum` by difficulty level (reasoning-gym's own knobs,
``ReasoningGym-v0(levels=...)``), one level up when the current one is passed.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from stable_baselines3.common.callbacks import BaseCallback

from sb3_grpo.callbacks._common import check_positive_int

__all__ = [
    "LevelCurriculum",
    "PassRateCurriculum",
    "StagedCurriculum",
    "curriculum_weights",
    "level_weights",
    "next_level",
    "stage_mask",
    "update_pass_rates",
]

#: A stage's prompts: their indices in the env's prompt list, or a test ``item -> bool`` of each prompt as a dict
#: ``{"prompt": text, **metadata}`` (the text as the env shows it, after any chat template).
StageSelector = Sequence[int] | Callable[[dict[str, Any]], bool]


def update_pass_rates(
    rates: np.ndarray, counts: np.ndarray, prompts: Sequence[int], successes: Sequence[bool], alpha: float
) -> tuple[np.ndarray, np.ndarray]:
    """The pass rates after episodes of ``prompts`` ended with ``successes``, in order.

    A prompt's first episode sets its rate to the outcome (1 or 0); each later one moves it by the exponential moving
    average ``rate <- rate + alpha * (outcome - rate)``.

    :param rates: ``(P,)`` pass rate of each prompt (any value where its count is 0).
    :param counts: ``(P,)`` episodes seen per prompt.
    :param prompts: The prompt index of each ended episode.
    :param successes: Whether each one succeeded.
    :param alpha: Weight of a new outcome, in (0, 1].
    :return: New ``(rates, counts)`` (the inputs are not changed).
    """
    rates, counts = np.array(rates, dtype=np.float64), np.array(counts, dtype=np.int64)
    for p, ok in zip(prompts, successes):
        outcome = 1.0 if ok else 0.0
        rates[p] = outcome if counts[p] == 0 else rates[p] + alpha * (outcome - rates[p])
        counts[p] += 1
    return rates, counts


def curriculum_weights(
    rates: np.ndarray,
    counts: np.ndarray,
    low: float,
    high: float,
    min_episodes: int,
    skip_weight: float,
    mask: np.ndarray | None = None,
) -> tuple[np.ndarray, bool]:
    """Prompt-draw weights: ``skip_weight`` for a prompt seen at least ``min_episodes`` times whose pass rate is above
    ``high`` or below ``low``, 1 for every other prompt; times ``mask`` (a stage's 0/1 prompts) when given.

    :return: ``(weights, fell_back)``; when every weight would be 0 (``skip_weight=0`` and every prompt, or every
        prompt of the mask, filtered), the weights are the mask (all 1 without one) and ``fell_back`` is ``True``.
    """
    rates, counts = np.asarray(rates, dtype=np.float64), np.asarray(counts)
    keep = np.ones_like(rates) if mask is None else np.asarray(mask, dtype=np.float64)
    filtered = (counts >= min_episodes) & ((rates > high) | (rates < low))
    weights = np.where(filtered, float(skip_weight), 1.0) * keep
    if not (weights > 0).any():
        return keep.copy(), True
    return weights, False


def stage_mask(items: Sequence[dict[str, Any]], selector: StageSelector) -> np.ndarray:
    """``1.0`` for each prompt ``selector`` takes (:data:`StageSelector`), ``0.0`` for the others.

    :raises ValueError: for an index outside the list, or a selector that takes no prompt.
    """
    n = len(items)
    mask = np.zeros(n)
    if callable(selector):
        mask[[i for i, item in enumerate(items) if selector(item)]] = 1.0
    else:
        indices = list(selector)
        bad = [i for i in indices if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not 0 <= i < n]
        if bad:
            raise ValueError(f"a stage's prompt indices must be ints in [0, {n - 1}]; got {bad[:5]}")
        mask[indices] = 1.0
    if not mask.any():
        raise ValueError("a stage takes no prompt of the env; every stage needs at least one")
    return mask


def _check_stages(stages: Any) -> list[tuple[int, StageSelector]]:
    try:
        parsed = sorted(((int(t), sel) for t, sel in stages), key=lambda stage: stage[0])
    except (TypeError, ValueError):
        raise ValueError(
            "stages must be a list of (timestep, prompts) pairs, prompts a list of prompt indices or a callable "
            f"item -> bool, e.g. [(0, [0, 1]), (5000, lambda item: True)]; got {stages!r}"
        ) from None
    if not parsed:
        raise ValueError("stages is empty; give at least one (timestep, prompts) stage starting at 0")
    if parsed[0][0] != 0:
        raise ValueError(f"the first stage must start at timestep 0, got {parsed[0][0]}")
    return parsed


def _prompt_items(env: Any, who: str) -> list[dict[str, Any]]:
    """The training env's prompts as dicts ``{"prompt": text, **metadata}``."""
    try:
        spec = env.get_attr("text_spec", indices=[0])[0]
    except AttributeError:
        raise TypeError(
            f"{who} needs a text env with a prompt list (textrl_envs.sb3.make_vec_env or gym.make of a textrl_envs "
            f"id); the training env {type(env).__name__} has none"
        ) from None
    return [{"prompt": t, **{k: v[i] for k, v in spec.metadata.items()}} for i, t in enumerate(spec.prompt_texts)]


def _set_prompt_weights(env: Any, weights: np.ndarray | None, who: str) -> None:
    try:
        env.env_method("set_prompt_weights", weights)
    except AttributeError:
        raise TypeError(
            f"{who} needs a text env with set_prompt_weights; the training env {type(env).__name__} has none"
        ) from None


class _Stages:
    """The stage in force at a timestep and its prompt mask."""

    def __init__(self, stages: Any) -> None:
        self.stages = _check_stages(stages)
        self.masks: list[np.ndarray] = []

    def bind(self, items: Sequence[dict[str, Any]]) -> None:
        self.masks = [stage_mask(items, sel) for _, sel in self.stages]

    def index(self, timestep: int) -> int:
        return max(k for k, (t, _) in enumerate(self.stages) if timestep >= t)


def _check_threshold(threshold: Any) -> float:
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not np.isfinite(threshold):
        raise ValueError(f"threshold must be a finite reward value, got {threshold!r}")
    return float(threshold)


def _ended_infos(locals_: dict[str, Any]) -> list[dict[str, Any]]:
    """The info dicts of the episodes a step ended (the dicts themselves: a reward scored in the background lands in
    them by the rollout's end)."""
    dones, infos = locals_.get("dones"), locals_.get("infos")
    if dones is None or infos is None:
        return []
    return [infos[i] for i in np.flatnonzero(np.asarray(dones))]


def _prompt_outcomes(infos: Sequence[dict[str, Any]]) -> list[tuple[int, float]]:
    """``(prompt index, reward)`` of each ended episode that started on a prompt of the env's list
    (``info["prompt_index"] >= 0``) and has a finite reward (``info["reward"]``, or the monitor's
    ``info["episode"]["r"]``)."""
    out = []
    for info in infos:
        index = info.get("prompt_index", -1)
        reward = info.get("reward")
        if reward is None and isinstance(info.get("episode"), dict):
            reward = info["episode"].get("r")
        if index is None or index < 0 or reward is None or not np.isfinite(reward):
            continue
        out.append((int(index), float(reward)))
    return out


def _check_unit(name: str, value: Any, low_open: bool = False) -> float:
    ok = not isinstance(value, bool) and isinstance(value, (int, float, np.floating))
    if not ok or not (0.0 < value <= 1.0 if low_open else 0.0 <= value <= 1.0):
        interval = "(0, 1]" if low_open else "[0, 1]"
        raise ValueError(f"{name} must be a number in {interval}, got {value!r}")
    return float(value)


class PassRateCurriculum(BaseCallback):
    """Skip (or down-weight) prompts that are too easy or too hard for the policy now, by their recent pass rate.

    Every episode that ends with a prompt of the env's list (``info["prompt_index"] >= 0``) counts as a success when
    its reward (``info["reward"]``, or the monitor's ``info["episode"]["r"]``) is at least ``threshold``. Each
    prompt's pass rate is an exponential moving average of its outcomes (:func:`update_pass_rates`, weight ``alpha``
    for the newest). At the end of every rollout (once its rewards, also those scored in the background, are in) the
    env's prompt-draw weights are set (:func:`curriculum_weights`): ``skip_weight`` (0: never drawn) for a prompt
    seen at least ``min_episodes`` times with a pass rate above ``high`` or below ``low``, 1 for the others. If that
    would leave no prompt at all, the draws are uniform again and a warning says so.

    With groups (``group_size > 1``) the weights choose which prompt a group round draws; all the round's members
    still share it. The env needs ``set_prompt_weights``
    (:meth:`textrl_envs.vector.TextGenVectorEnv.set_prompt_weights`,
    :meth:`textrl_envs.env.TextGenEnv.set_prompt_weights`).
    Logged every rollout: ``curriculum/active_prompts`` (prompts of weight > 0), ``curriculum/mean_pass_rate``
    (over prompts seen at least once). At the end of training the env draws uniformly again (``restore_at_end``).

    :param threshold: Reward at or above which an episode succeeded.
    :param low: Pass rates below this are too hard.
    :param high: Pass rates above this are too easy.
    :param min_episodes: Episodes a prompt needs before it can be filtered.
    :param alpha: EMA weight of a new outcome, in (0, 1] (1: the last outcome only).
    :param skip_weight: Draw weight of a filtered prompt (0: skipped, in (0, 1): down-weighted).
    :param stages: Optional :class:`StagedCurriculum` stages ``[(timestep, prompts), ...]``: the pass-rate weights
        then apply within the stage's prompts (the others weigh 0), and fall back to all of the stage's prompts.
    :param restore_at_end: Give the env uniform draws back when training ends.
    """

    def __init__(
        self,
        threshold: float = 1.0,
        low: float = 0.1,
        high: float = 0.9,
        min_episodes: int = 4,
        alpha: float = 0.25,
        skip_weight: float = 0.0,
        stages: Sequence[tuple[int, StageSelector]] | None = None,
        restore_at_end: bool = True,
        verbose: int = 0,
    ):
        super().__init__(verbose)
        self._stages = None if stages is None else _Stages(stages)
        self.stage: int | None = None
        self.threshold = _check_threshold(threshold)
        self.low, self.high = _check_unit("low", low), _check_unit("high", high)
        if self.low > self.high:
            raise ValueError(f"low ({low}) must be <= high ({high})")
        self.min_episodes = check_positive_int("min_episodes", min_episodes)
        self.alpha = _check_unit("alpha", alpha, low_open=True)
        self.skip_weight = _check_unit("skip_weight", skip_weight)
        self.restore_at_end = restore_at_end
        self.rates: np.ndarray | None = None
        self.counts: np.ndarray | None = None
        self.weights: np.ndarray | None = None
        self._ended: list[dict[str, Any]] = []

    def _set(self, weights: np.ndarray | None) -> None:
        _set_prompt_weights(self.training_env, weights, type(self).__name__)

    def _on_training_start(self) -> None:
        items = _prompt_items(self.training_env, type(self).__name__)
        if self.rates is None:  # a later learn() call keeps the rates
            self.rates, self.counts = np.zeros(len(items)), np.zeros(len(items), dtype=np.int64)
        if self._stages is not None:
            self._stages.bind(items)
            self._apply()

    def _on_rollout_start(self) -> None:
        if self._stages is not None and self._stages.index(self.model.num_timesteps) != self.stage:
            self._apply()

    def _on_step(self) -> bool:
        self._ended.extend(_ended_infos(self.locals))
        return True

    def _on_rollout_end(self) -> None:
        outcomes = _prompt_outcomes(self._ended)
        self._ended = []
        prompts = [index for index, _ in outcomes]
        successes = [reward >= self.threshold for _, reward in outcomes]
        self.rates, self.counts = update_pass_rates(self.rates, self.counts, prompts, successes, self.alpha)
        self._apply()

    def _apply(self) -> None:
        """Set the env's weights from the pass rates (within the current stage's prompts, with stages)."""
        mask, where = None, "every prompt's"
        if self._stages is not None:
            self.stage = self._stages.index(self.model.num_timesteps)
            mask, where = self._stages.masks[self.stage], f"every prompt of stage {self.stage}:"
            self.logger.record("curriculum/stage", self.stage)
        weights, fell_back = curriculum_weights(
            self.rates, self.counts, self.low, self.high, self.min_episodes, self.skip_weight, mask
        )
        if fell_back:
            warnings.warn(
                f"PassRateCurriculum: {where} pass rate is outside [{self.low}, {self.high}] with skip_weight=0; "
                "drawing those prompts uniformly. Widen low/high or give skip_weight > 0.",
                stacklevel=2,
            )
        self.weights = weights
        self._set(weights)
        seen = self.counts > 0
        self.logger.record("curriculum/active_prompts", int((weights > 0).sum()))
        self.logger.record("curriculum/mean_pass_rate", float(self.rates[seen].mean()) if seen.any() else 0.0)

    def _on_training_end(self) -> None:
        if self.restore_at_end:
            self._set(None)


class StagedCurriculum(BaseCallback):
    """A curriculum of tasks in stages: from each stage's timestep on, the env draws only that stage's prompts.

    Stages are ``[(timestep, prompts), ...]`` (the first at timestep 0), ``prompts`` the indices of the env's
    prompts the stage draws or a test ``item -> bool`` of each prompt as a dict ``{"prompt": text, **metadata}``.
    With one env holding the prompts of several tasks (a prompt list whose metadata names each prompt's task, or a
    ``ReasoningGym-v0`` mix of tasks, its items' reasoning-gym ``metadata`` naming their source dataset), the stages
    are stages of tasks: e.g. short tasks first, then constrained medium ones, then open long ones, each stage a
    selection of prompts (a stage may keep the earlier stages' prompts too). The env itself (its reward, its
    observation width) stays the same all run; stages change only which prompts are drawn, through the env's
    ``set_prompt_weights`` at rollout boundaries. Combine with :class:`MaxNewTokensCurriculum` for stages of length,
    and give the same stages to :class:`PassRateCurriculum` (``stages=``) to filter by pass rate within them.

    Logged: ``curriculum/stage`` and ``curriculum/active_prompts``. At the end of training the env draws uniformly
    again (``restore_at_end``).

    :param stages: The stages, see above.
    :param restore_at_end: Give the env uniform draws back when training ends.
    """

    def __init__(self, stages: Sequence[tuple[int, StageSelector]], restore_at_end: bool = True, verbose: int = 0):
        super().__init__(verbose)
        self._stages = _Stages(stages)
        self.restore_at_end = restore_at_end
        self.stage: int | None = None

    @property
    def weights(self) -> np.ndarray | None:
        """The prompt-draw weights of the current stage (``None`` before training)."""
        return None if self.stage is None else self._stages.masks[self.stage]

    def _apply(self) -> None:
        stage = self._stages.index(self.model.num_timesteps)
        if stage != self.stage:
            self.stage = stage
            _set_prompt_weights(self.training_env, self._stages.masks[stage], type(self).__name__)
        self.logger.record("curriculum/stage", stage)
        self.logger.record("curriculum/active_prompts", int(self._stages.masks[stage].sum()))

    def _on_training_start(self) -> None:
        self._stages.bind(_prompt_items(self.training_env, type(self).__name__))
        self.stage = None
        self._apply()

    def _on_rollout_start(self) -> None:
        self._apply()

    def _on_step(self) -> bool:
        return True

    def _on_training_end(self) -> None:
        if self.restore_at_end:
            _set_prompt_weights(self.training_env, None, type(self).__name__)


# -- difficulty levels ---------------------------------------------------------------------------------------------


def next_level(level: int, pass_rate: float, levels: Sequence[int], promote: float, demote: float | None) -> int:
    """The level after a window of episodes at ``level`` passed at ``pass_rate``: the next of ``levels`` (sorted)
    when ``pass_rate >= promote``, the previous one when ``demote`` is given and ``pass_rate < demote``, else the
    same (never past either end)."""
    k = list(levels).index(level)
    if pass_rate >= promote and k + 1 < len(levels):
        return levels[k + 1]
    if demote is not None and pass_rate < demote and k > 0:
        return levels[k - 1]
    return level


def level_weights(item_levels: np.ndarray, level: int, review_weight: float) -> np.ndarray:
    """Prompt-draw weights at ``level``: 1 for its prompts, ``review_weight`` for those of lower levels, 0 above."""
    item_levels = np.asarray(item_levels)
    return np.where(item_levels == level, 1.0, np.where(item_levels < level, float(review_weight), 0.0))


class LevelCurriculum(BaseCallback):
    """Difficulty levels, one at a time: draw the current level's prompts until the policy passes them, then the next.

    The env's prompts need a ``level`` column (an int per prompt): ``ReasoningGym-v0`` with ``levels=[...]`` makes
    one from reasoning-gym's own curricula (each level a config of the task's difficulty knobs), and a prompt list
    may carry its own (``{"prompt": ..., "level": 2}``). Every episode that ends on a prompt of the current level
    counts as a success when its reward (``info["reward"]``, or the monitor's ``info["episode"]["r"]``) is at least
    ``threshold``. At the end of each rollout, once at least ``window`` episodes of the current level have ended since
    its window began, their pass rate decides (:func:`next_level`): up a level at ``promote`` or above, down one below
    ``demote`` (when given); a change starts a new window. This is reasoning-gym's own way to train with its
    curricula (raise a task's level when the model's accuracy at it passes a threshold).

    The env draws the current level's prompts (weight 1), lower levels' at ``review_weight`` (0: never; a little
    keeps earlier levels from being forgotten), higher ones never (:func:`level_weights`). Groups share their
    round's prompt as always. Logged every rollout: ``curriculum/level`` and ``curriculum/level_pass_rate`` (of the
    window so far). The level persists across ``learn`` calls; at the end of training the env draws uniformly again
    (``restore_at_end``). SB3's ``learn`` resets the env before callbacks start, so each row's first episode is
    drawn before the curriculum (uniformly); it counts only if it is of the current level.

    :param threshold: Reward at or above which an episode succeeded.
    :param promote: Pass rate of a window at or above which the next level starts.
    :param demote: Pass rate below which the previous level comes back (``None``: never down).
    :param window: Episodes of the current level that decide.
    :param review_weight: Draw weight of lower levels' prompts, in [0, 1].
    :param start_level: The first level (default: the lowest).
    :param restore_at_end: Give the env uniform draws back when training ends.
    """

    def __init__(
        self,
        threshold: float = 1.0,
        promote: float = 0.8,
        demote: float | None = None,
        window: int = 64,
        review_weight: float = 0.0,
        start_level: int | None = None,
        restore_at_end: bool = True,
        verbose: int = 0,
    ):
        super().__init__(verbose)
        self.threshold = _check_threshold(threshold)
        self.promote = _check_unit("promote", promote)
        self.demote = None if demote is None else _check_unit("demote", demote)
        if self.demote is not None and self.demote >= self.promote:
            raise ValueError(f"demote ({demote}) must be below promote ({promote}), or None")
        self.window = check_positive_int("window", window)
        self.review_weight = _check_unit("review_weight", review_weight)
        bad_start = isinstance(start_level, bool) or not isinstance(start_level, (int, np.integer))
        if start_level is not None and bad_start:
            raise ValueError(f"start_level must be an int level of the env's prompts (or None), got {start_level!r}")
        self.start_level = start_level
        self.restore_at_end = restore_at_end
        self.level: int | None = None
        self.levels: list[int] = []
        self.item_levels: np.ndarray | None = None
        self.outcomes: list[bool] = []  # the current window's outcomes, in order
        self.history: list[tuple[int, int]] = []  # (timestep, level) at every change, the start included
        self._ended: list[dict[str, Any]] = []

    def _on_training_start(self) -> None:
        items = _prompt_items(self.training_env, type(self).__name__)
        levels = [item.get("level") for item in items]
        if any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) for v in levels):
            raise ValueError(
                f"{type(self).__name__} needs a 'level' column (an int) on every prompt of the env: build it with "
                "gym.make('ReasoningGym-v0', task=..., levels=[0, 1, 2]) or give prompt dicts {'prompt': ..., "
                "'level': 0}"
            )
        self.item_levels = np.asarray(levels, dtype=np.int64)
        self.levels = sorted({int(v) for v in levels})
        if self.level is None:  # a later learn() call keeps the level
            start = self.levels[0] if self.start_level is None else int(self.start_level)
            if start not in self.levels:
                raise ValueError(f"start_level {start} is not a level of the env's prompts {self.levels}")
            self._change(start)
        self._apply()

    def _change(self, level: int) -> None:
        self.level, self.outcomes = level, []
        self.history.append((int(self.model.num_timesteps), level))

    def _apply(self) -> None:
        _set_prompt_weights(
            self.training_env, level_weights(self.item_levels, self.level, self.review_weight), type(self).__name__
        )
        self.logger.record("curriculum/level", self.level)
        rate = float(np.mean(self.outcomes)) if self.outcomes else 0.0
        self.logger.record("curriculum/level_pass_rate", rate)

    def _on_step(self) -> bool:
        self._ended.extend(_ended_infos(self.locals))
        return True

    def _on_rollout_end(self) -> None:
        for index, reward in _prompt_outcomes(self._ended):
            if self.item_levels[index] == self.level:
                self.outcomes.append(reward >= self.threshold)
        self._ended = []
        if len(self.outcomes) >= self.window:
            rate = float(np.mean(self.outcomes))
            level = next_level(self.level, rate, self.levels, self.promote, self.demote)
            if level != self.level:
                self._change(level)
            else:
                self.outcomes = []  # a new window at the same level
        self._apply()

    def _on_training_end(self) -> None:
        if self.restore_at_end:
            _set_prompt_weights(self.training_env, None, type(self).__name__)
