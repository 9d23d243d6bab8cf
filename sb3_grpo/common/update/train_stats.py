"""What one update measures, minibatch by minibatch (:class:`TrainStats`, logged with PPO's keys first), and what one
minibatch's loss hands the optimizer step (:class:`LossTerms`). :class:`MicroBatchStats` gathers the figures of one
minibatch's micro-batches (``micro_batch_size``) and records them as the whole minibatch's."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import torch as th
from stable_baselines3.common.logger import Logger

from sb3_grpo.objectives import clip_fractions

__all__ = ["LossTerms", "MicroBatchStats", "TrainStats", "nanmean"]


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

    def add_clip_fractions(self, ratio: th.Tensor, eps: float | th.Tensor, advantages: th.Tensor) -> None:
        """Record the minibatch's clip fractions: of all samples, of those with ``A > 0`` and of the others
        (:func:`~sb3_grpo.objectives.clip_fractions`)."""
        with th.no_grad():
            fraction, fraction_pos, fraction_neg = clip_fractions(ratio, eps, advantages)
        self.clip_fractions.append(fraction)
        self.clip_fractions_pos.append(fraction_pos)
        self.clip_fractions_neg.append(fraction_neg)

    def add_approx_kl(self, log_prob: th.Tensor, old_log_prob: th.Tensor) -> np.ndarray:
        """Record and return PPO's early-stopping estimate of the minibatch's KL, ``mean((r - 1) - log r)``.

        The approximate form of reverse KL divergence, as SB3's PPO computes it; see
        https://github.com/DLR-RM/stable-baselines3/issues/417, the discussion in
        https://github.com/DLR-RM/stable-baselines3/pull/419 and http://joschu.net/blog/kl-approx.html
        """
        with th.no_grad():
            log_ratio = log_prob - old_log_prob
            approx_kl_div = th.mean((th.exp(log_ratio) - 1) - log_ratio).cpu().numpy()
        self.approx_kl_divs.append(approx_kl_div)
        return approx_kl_div

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


#: The per-minibatch figures that a micro-batch's loss records as its share (they add up to the minibatch's).
SHARED_FIGURES = ("entropy_losses", "pg_losses", "value_losses", "kl_refs", "grad_vars")


class MicroBatchStats(TrainStats):
    """The figures of one minibatch's micro-batches, recorded as the whole minibatch's by :meth:`merge_into`.

    A micro-batch's loss records its share of each loss term (:data:`SHARED_FIGURES`), so the minibatch's figure is
    their sum; the clip fractions and ``approx_kl`` are kept as the micro-batches' tensors and measured once over the
    whole minibatch (a fraction of a subset does not add up).
    """

    def __init__(self) -> None:
        super().__init__()
        self._clip_parts: list[tuple[th.Tensor, float | th.Tensor, th.Tensor]] = []
        self._kl_parts: list[tuple[th.Tensor, th.Tensor]] = []

    def add_clip_fractions(self, ratio: th.Tensor, eps: float | th.Tensor, advantages: th.Tensor) -> None:
        self._clip_parts.append((ratio.detach(), eps.detach() if isinstance(eps, th.Tensor) else eps, advantages))

    def add_approx_kl(self, log_prob: th.Tensor, old_log_prob: th.Tensor) -> np.ndarray:
        self._kl_parts.append((log_prob.detach(), old_log_prob))
        with th.no_grad():
            log_ratio = log_prob - old_log_prob
            return th.mean((th.exp(log_ratio) - 1) - log_ratio).cpu().numpy()

    def merge_into(self, stats: TrainStats, loss_value: float) -> np.ndarray | None:
        """Record the whole minibatch's figures in ``stats``; return its ``approx_kl`` (``None``: not measured).

        :param stats: The update's figures.
        :param loss_value: The minibatch's loss (the sum of the micro-batches' shares).
        """
        for name in SHARED_FIGURES:
            shares = getattr(self, name)
            if shares:
                getattr(stats, name).append(float(sum(shares)))
        if self._clip_parts:
            ratios, eps, advantages = zip(*self._clip_parts, strict=True)
            whole_eps = th.cat(eps) if isinstance(eps[0], th.Tensor) else eps[0]
            stats.add_clip_fractions(th.cat(ratios), whole_eps, th.cat(advantages))
        stats.last_loss = loss_value
        if not self._kl_parts:
            return None
        log_probs, old_log_probs = zip(*self._kl_parts, strict=True)
        return stats.add_approx_kl(th.cat(log_probs), th.cat(old_log_probs))
