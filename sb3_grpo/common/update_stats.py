"""What one update measures, minibatch by minibatch (:class:`TrainStats`, logged with PPO's keys first), and what one
minibatch's loss hands the optimizer step (:class:`LossTerms`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import torch as th
from stable_baselines3.common.logger import Logger

__all__ = ["LossTerms", "TrainStats", "nanmean"]


class LossTerms(NamedTuple):
    """One minibatch's loss and what the step after it needs (the KL estimate for early stopping, the log)."""

    loss: th.Tensor
    approx_kl: np.ndarray | None  # None: not measured (the loss's measure_kl)
    details: dict[str, float]
    value: float  # loss.item(), fetched once


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
