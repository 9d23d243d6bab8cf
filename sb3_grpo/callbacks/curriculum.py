"""Difficulty curriculum by pass rate: :class:`PassRateCurriculum` and its pure functions.

A prompt every episode solves (or none does) gives a group of episodes equal rewards and so no group-advantage
signal; DAPO (Yu et al. 2025, arXiv 2503.14476) drops such groups after sampling them. This curriculum instead stops
drawing those prompts: it keeps each prompt's recent pass rate from the episodes it ends and sets the env's
prompt-draw weights (``set_prompt_weights``) at rollout boundaries.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
from stable_baselines3.common.callbacks import BaseCallback

from sb3_grpo.callbacks._common import check_positive_int

__all__ = ["PassRateCurriculum", "curriculum_weights", "update_pass_rates"]


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
    rates: np.ndarray, counts: np.ndarray, low: float, high: float, min_episodes: int, skip_weight: float
) -> tuple[np.ndarray, bool]:
    """Prompt-draw weights: ``skip_weight`` for a prompt seen at least ``min_episodes`` times whose pass rate is above
    ``high`` or below ``low``, 1 for every other prompt.

    :return: ``(weights, fell_back)``; when every weight would be 0 (``skip_weight=0`` and every prompt filtered),
        the weights are all 1 (uniform) and ``fell_back`` is ``True``.
    """
    rates, counts = np.asarray(rates, dtype=np.float64), np.asarray(counts)
    filtered = (counts >= min_episodes) & ((rates > high) | (rates < low))
    weights = np.where(filtered, float(skip_weight), 1.0)
    if not (weights > 0).any():
        return np.ones_like(weights), True
    return weights, False


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
        restore_at_end: bool = True,
        verbose: int = 0,
    ):
        super().__init__(verbose)
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not np.isfinite(threshold):
            raise ValueError(f"threshold must be a finite reward value, got {threshold!r}")
        self.threshold = float(threshold)
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

    def _num_prompts(self) -> int:
        try:
            spec = self.training_env.get_attr("text_spec", indices=[0])[0]
        except AttributeError:
            raise TypeError(
                f"PassRateCurriculum needs a text env with a prompt list (textrl_envs.sb3.make_vec_env or gym.make of "
                f"a textrl_envs id); the training env {type(self.training_env).__name__} has none"
            ) from None
        return len(spec.prompt_texts)

    def _set(self, weights: np.ndarray | None) -> None:
        try:
            self.training_env.env_method("set_prompt_weights", weights)
        except AttributeError:
            raise TypeError(
                f"PassRateCurriculum needs a text env with set_prompt_weights; the training env "
                f"{type(self.training_env).__name__} has none"
            ) from None

    def _on_training_start(self) -> None:
        if self.rates is None:  # a later learn() call keeps the rates
            n = self._num_prompts()
            self.rates, self.counts = np.zeros(n), np.zeros(n, dtype=np.int64)

    def _on_step(self) -> bool:
        dones, infos = self.locals.get("dones"), self.locals.get("infos")
        if dones is not None and infos is not None:
            # the info dicts themselves: a reward scored in the background lands in them by the rollout's end
            self._ended.extend(infos[i] for i in np.flatnonzero(np.asarray(dones)))
        return True

    def _on_rollout_end(self) -> None:
        prompts, successes = [], []
        for info in self._ended:
            index = info.get("prompt_index", -1)
            reward = info.get("reward")
            if reward is None and isinstance(info.get("episode"), dict):
                reward = info["episode"].get("r")
            if index is None or index < 0 or reward is None or not np.isfinite(reward):
                continue
            prompts.append(int(index))
            successes.append(float(reward) >= self.threshold)
        self._ended = []
        self.rates, self.counts = update_pass_rates(self.rates, self.counts, prompts, successes, self.alpha)
        weights, fell_back = curriculum_weights(
            self.rates, self.counts, self.low, self.high, self.min_episodes, self.skip_weight
        )
        if fell_back:
            warnings.warn(
                f"PassRateCurriculum: every prompt's pass rate is outside [{self.low}, {self.high}] with "
                "skip_weight=0; drawing all prompts uniformly. Widen low/high or give skip_weight > 0.",
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
