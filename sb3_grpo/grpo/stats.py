"""What one GRPO update measures, minibatch by minibatch, and how it is logged (PPO's keys first, then GRPO's)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch as th
from stable_baselines3.common.logger import Logger
from stable_baselines3.common.utils import explained_variance

from sb3_grpo.objectives import pearson_corr

__all__ = ["TrainStats", "nanmean", "record_update"]


def _mean(values: list[Any]) -> float:
    """``np.mean`` (NaN included), and NaN without numpy's empty-slice warning for an update that had no minibatch
    (``carry_over``'s first update, whose steps all wait for their groups)."""
    return float(np.mean(values)) if len(values) else float("nan")


def nanmean(values: list[float]) -> float:
    """The mean of the values that are not NaN (NaN when there are none)."""
    finite = [v for v in values if not np.isnan(v)]
    return float(np.mean(finite)) if finite else float("nan")


@dataclass
class TrainStats:
    """Per-minibatch figures of one update; ``approx_kl_divs`` holds the current epoch's (as PPO logs them)."""

    entropy_losses: list[float] = field(default_factory=list)
    pg_losses: list[float] = field(default_factory=list)
    value_losses: list[float] = field(default_factory=list)
    clip_fractions: list[float] = field(default_factory=list)
    clip_fractions_pos: list[float] = field(default_factory=list)
    clip_fractions_neg: list[float] = field(default_factory=list)
    grad_vars: list[float] = field(default_factory=list)
    kl_refs: list[float] = field(default_factory=list)
    grad_norms: list[float] = field(default_factory=list)
    approx_kl_divs: list[np.ndarray] = field(default_factory=list)
    last_loss: float = float("nan")

    def record(self, logger: Logger, kl: bool) -> None:
        """Log the means: PPO's ``train/*`` keys, then GRPO's (``clip_fraction_pos|neg``, ``grad_var``, ``kl_ref``,
        ``grad_norm(_max)``).

        :param logger: The algorithm's logger.
        :param kl: Whether the update has a KL term (``train/kl_ref`` is logged, NaN when no minibatch ran).
        """
        logger.record("train/entropy_loss", _mean(self.entropy_losses))
        logger.record("train/policy_gradient_loss", _mean(self.pg_losses))
        if self.value_losses:
            logger.record("train/value_loss", np.mean(self.value_losses))
        logger.record("train/approx_kl", _mean(self.approx_kl_divs))
        logger.record("train/clip_fraction", _mean(self.clip_fractions))
        logger.record("train/loss", self.last_loss)
        logger.record("train/clip_fraction_pos", nanmean(self.clip_fractions_pos))
        logger.record("train/clip_fraction_neg", nanmean(self.clip_fractions_neg))
        if self.grad_vars:
            logger.record("train/grad_var", np.mean(self.grad_vars))
        if kl:
            logger.record("train/kl_ref", nanmean(self.kl_refs))
        if self.grad_norms:
            logger.record("train/grad_norm", np.mean(self.grad_norms))
            logger.record("train/grad_norm_max", max(self.grad_norms))


def record_update(model: Any, stats: TrainStats, clip_range: float, clip_range_vf: float | None) -> None:
    """Log one update of ``model`` (a :class:`~sb3_grpo.GRPO`): PPO's keys (same names), then GRPO's own, and warn
    (once per model) when the gradient norm before clipping passed ``grad_norm_warn``.

    :param model: The algorithm.
    :param stats: The update's per-minibatch figures.
    :param clip_range: The update's ``eps``.
    :param clip_range_vf: The update's value clip range (``None``: no value clipping).
    """
    logger, buffer = model.logger, model.rollout_buffer
    explained_var = explained_variance(buffer.values.flatten(), buffer.returns.flatten())
    stats.record(logger, kl=model.kl_coef > 0)
    if model.nonfinite == "skip":
        logger.record("train/skipped_nonfinite", model._skipped_nonfinite)
        model._skipped_nonfinite = 0
    logger.record("train/explained_variance", explained_var)
    if hasattr(model.policy, "log_std"):
        logger.record("train/std", th.exp(model.policy.log_std).mean().item())
    logger.record("train/n_updates", model._n_updates, exclude="tensorboard")
    model._data_parallel.record(logger, model.num_timesteps)
    logger.record("train/clip_range", clip_range)
    if clip_range_vf is not None:
        logger.record("train/clip_range_vf", clip_range_vf)
    scale_pos, scale_neg = model.adaptive_clip if model.adaptive_clip is not None else (1.0, 1.0)
    logger.record("train/clip_range_pos", clip_range * scale_pos)
    logger.record("train/clip_range_neg", clip_range * scale_neg)
    logger.record("train/explore_alpha", model._rollout_explore_alpha)
    if model.kl_coef > 0:
        logger.record("train/kl_coef", model.kl_coef)
    if stats.grad_norms and model.grad_norm_warn is not None:
        biggest = max(stats.grad_norms)
        if biggest > model.grad_norm_warn and not model._grad_norm_warned:
            model._grad_norm_warned = True  # once per model: the logs carry train/grad_norm(_max) every update
            warnings.warn(
                f"GRPO: gradient norm {biggest:.3g} (before clipping to {model.max_grad_norm}) exceeds "
                f"grad_norm_warn={model.grad_norm_warn} at update {model._n_updates}; consider a lower "
                "learning rate or reward scaling",
                stacklevel=3,
            )
    logger.record("train/value_return_corr", pearson_corr(buffer.values, buffer.returns))
