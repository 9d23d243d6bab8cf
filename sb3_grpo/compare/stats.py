"""Interval estimates for few-seed RL results, as Agarwal et al. recommend ("Deep Reinforcement Learning at the
Edge of the Statistical Precipice", NeurIPS 2021, arXiv 2108.13264).

The point estimates are the paper's: the **interquartile mean** (IQM: the mean of the middle 50% of runs,
``scipy.stats.trim_mean(x, 0.25)``), the **probability of improvement** ``P(X > Y) + P(X = Y) / 2`` (the
Mann-Whitney ``U / (n m)``) and the **performance profile** (the fraction of runs scoring above ``tau``). Every
interval is a 95% percentile bootstrap from :func:`scipy.stats.bootstrap`, each algorithm's runs resampled on their
own (the paper's stratified bootstrap, with one task as the only stratum). This module is the thin layer that
names those estimates; the resampling is SciPy's. rliable, the paper's library, is not used because its dependency
``arch`` does not import beside pandas 3 (what pip resolves today); the estimators here are the ones rliable
computes for a single task, and ``tests/test_bench_stats.py`` checks them against brute-force computations.

Effects between two algorithms (:func:`relative_difference`, :func:`ratio`) are bootstrapped with both samples
resampled independently, so their intervals carry the uncertainty of both.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "CONFIDENCE",
    "MIN_RUNS",
    "N_RESAMPLES",
    "Estimate",
    "bootstrap_ci",
    "combine",
    "drawdown",
    "iqm",
    "iqm_estimate",
    "judge",
    "newcombe_difference",
    "performance_profile",
    "probability_of_improvement",
    "ratio",
    "relative_difference",
    "seeds_to_resolve_std_ratio",
    "wilson_interval",
]

#: Coverage of every interval.
CONFIDENCE = 0.95
#: Fewest runs per sample for an interval: with fewer, the percentile bootstrap is far too narrow (with 2 runs
#: most resamples repeat one value), so the estimate has no interval and every verdict on it is "inconclusive".
MIN_RUNS = 5
#: Bootstrap resamples (Agarwal et al. use 2,000 for their figures; 5,000 keeps the interval ends steady).
N_RESAMPLES = 5000


@dataclass(frozen=True)
class Estimate:
    """A point estimate with its 95% confidence interval (``nan`` ends when it cannot be computed).

    :param value: The point estimate.
    :param low: Lower end of the interval.
    :param high: Upper end of the interval.
    :param n: The sample size(s) it rests on (smallest over the samples).
    """

    value: float
    low: float
    high: float
    n: int

    def as_dict(self) -> dict[str, float]:
        """``{"value", "low", "high", "n"}`` for ``results.json``."""
        return {"value": self.value, "low": self.low, "high": self.high, "n": self.n}

    def excludes(self, x: float) -> bool:
        """Whether the interval lies entirely on one side of ``x`` (``False`` without an interval)."""
        return not math.isnan(self.low) and (self.low > x or self.high < x)


def iqm(x: Sequence[float] | np.ndarray, axis: int = -1) -> np.ndarray | float:
    """Interquartile mean: the mean of the middle 50% (``scipy.stats.trim_mean(x, 0.25)``; with fewer than 4
    values nothing is cut and it is the mean)."""
    from scipy.stats import trim_mean

    return trim_mean(np.asarray(x, dtype=float), 0.25, axis=axis)


def _clean(x: Sequence[float] | np.ndarray) -> np.ndarray:
    a = np.asarray([v for v in np.asarray(x, dtype=float).ravel() if math.isfinite(v)], dtype=float)
    return a


def bootstrap_ci(
    samples: Sequence[Sequence[float] | np.ndarray],
    statistic: Callable[..., np.ndarray | float],
    seed: int = 0,
    n_resamples: int = N_RESAMPLES,
) -> Estimate:
    """``statistic(*samples)`` with a 95% percentile bootstrap interval, each sample resampled on its own.

    :param samples: One or more 1-D samples (non-finite values are dropped).
    :param statistic: A vectorised statistic ``f(*samples, axis=-1)``.
    :param seed: Seed of the resampling (results are reproducible).
    :param n_resamples: Number of bootstrap resamples.
    :return: The estimate; the interval is ``nan`` when a sample has fewer than :data:`MIN_RUNS` values.
    """
    data = [_clean(s) for s in samples]
    n = min(len(d) for d in data)
    if n == 0:
        return Estimate(math.nan, math.nan, math.nan, 0)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        # a std of one value, or a resample with no spread (a ratio of stds is then inf or nan), is not an error
        warnings.simplefilter("ignore", RuntimeWarning)
        value = float(statistic(*data, axis=-1))
        if n < MIN_RUNS or not math.isfinite(value):
            return Estimate(value, math.nan, math.nan, n)
        if all(np.all(d == d[0]) for d in data):  # nothing varies: the interval is the point
            return Estimate(value, value, value, n)
        warnings.simplefilter("ignore")  # SciPy's DegenerateDataWarning: every resample gave the same value
        res = _bootstrap(data, statistic, n_resamples, seed)
    low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
    return Estimate(value, low, high, n)


def _bootstrap(data: list[np.ndarray], statistic: Callable[..., Any], n_resamples: int, seed: int) -> Any:
    from scipy.stats import bootstrap

    return bootstrap(
        tuple(data),
        statistic,
        n_resamples=n_resamples,
        confidence_level=CONFIDENCE,
        method="percentile",
        vectorized=True,
        paired=False,
        axis=-1,
        rng=np.random.default_rng(seed),
    )


def iqm_estimate(x: Sequence[float], seed: int = 0) -> Estimate:
    """IQM of ``x`` with its bootstrap interval."""
    return bootstrap_ci([x], iqm, seed=seed)


def relative_difference(x: Sequence[float], y: Sequence[float], seed: int = 0) -> Estimate:
    """``(IQM(x) - IQM(y)) / |IQM(y)|``: the change of ``x`` relative to the baseline ``y`` (a fraction)."""

    def stat(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
        base = iqm(b, axis=axis)
        with np.errstate(divide="ignore", invalid="ignore"):
            return (iqm(a, axis=axis) - base) / np.abs(base)

    return bootstrap_ci([x, y], stat, seed=seed)


def ratio(
    x: Sequence[float], y: Sequence[float], statistic: Callable[..., np.ndarray | float], seed: int = 0
) -> Estimate:
    """``statistic(x) / statistic(y)`` with its interval (e.g. the ratio of two seed-to-seed stds)."""

    def stat(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.asarray(statistic(a, axis=axis)) / np.asarray(statistic(b, axis=axis))

    return bootstrap_ci([x, y], stat, seed=seed)


def std(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Sample standard deviation (``ddof=1``), vectorised for the bootstrap."""
    return np.std(x, axis=axis, ddof=1)


def probability_of_improvement(x: Sequence[float], y: Sequence[float], seed: int = 0) -> Estimate:
    """``P(X > Y) + P(X = Y) / 2`` for a run ``X`` of one algorithm and ``Y`` of the other (Agarwal et al. 2021,
    section 4.3): the Mann-Whitney ``U / (n m)``, with its bootstrap interval. 0.5 means no tendency."""

    def stat(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
        a, b = np.moveaxis(a, axis, -1), np.moveaxis(b, axis, -1)
        diff = a[..., :, None] - b[..., None, :]
        return np.mean((diff > 0) + 0.5 * (diff == 0), axis=(-2, -1))

    return bootstrap_ci([x, y], stat, seed=seed)


def performance_profile(
    x: Sequence[float], taus: Sequence[float], seed: int = 0, n_resamples: int = N_RESAMPLES
) -> list[Estimate]:
    """The run-score distribution ``F(tau) = fraction of runs scoring above tau`` (Agarwal et al., section 4.2),
    at each ``tau``, with bootstrap intervals."""
    out = []
    for tau in taus:

        def stat(a: np.ndarray, axis: int = -1, _tau: float = float(tau)) -> np.ndarray:
            return np.mean(a > _tau, axis=axis)

        out.append(bootstrap_ci([x], stat, seed=seed, n_resamples=n_resamples))
    return out


def drawdown(curve: Sequence[float], window: int = 3) -> float:
    """Within-run drawdown: the largest fall of the training curve below its running best,
    ``max_t (max_{s <= t} y_s - y_t)``, on the curve smoothed by a trailing mean over ``window`` rollouts
    (0 for a curve that never falls; ``nan`` for an empty one)."""
    y = np.asarray(curve, dtype=float)
    if len(y) == 0:
        return math.nan
    c = np.cumsum(np.insert(y, 0, 0.0))
    idx = np.arange(1, len(y) + 1)
    lo = np.maximum(0, idx - window)
    smooth = (c[idx] - c[lo]) / (idx - lo)
    return float(np.max(np.maximum.accumulate(smooth) - smooth))


def wilson_interval(k: int, n: int) -> tuple[float, float]:
    """Wilson score interval of a proportion ``k / n`` (95%; ``(nan, nan)`` for ``n = 0``)."""
    if n == 0:
        return (math.nan, math.nan)
    from scipy.stats import binomtest

    ci = binomtest(k, n).proportion_ci(confidence_level=CONFIDENCE, method="wilson")
    return (float(ci.low), float(ci.high))


def newcombe_difference(k1: int, n1: int, k2: int, n2: int) -> Estimate:
    """``p1 - p2`` of two proportions with Newcombe's hybrid score interval (Newcombe 1998, "Interval estimation
    for the difference between independent proportions", method 10), built from the two Wilson intervals."""
    if n1 == 0 or n2 == 0:
        return Estimate(math.nan, math.nan, math.nan, min(n1, n2))
    p1, p2 = k1 / n1, k2 / n2
    l1, u1 = wilson_interval(k1, n1)
    l2, u2 = wilson_interval(k2, n2)
    d = p1 - p2
    low = d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2)
    high = d + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2)
    return Estimate(d, low, high, min(n1, n2))


def seeds_to_resolve_std_ratio(target_ratio: float, z_alpha: float = 1.96, z_power: float = 0.84) -> int:
    """Seeds per algorithm for which a ratio of seed-to-seed stds equal to ``target_ratio`` is resolved (its 95%
    interval excludes 1) with 80% power, for normally distributed finals: ``SE(log s) = 1 / sqrt(2 (k - 1))``
    per std, so ``k = 1 + (z_alpha + z_power)^2 / log(ratio)^2`` (two stds, equal ``k``)."""
    effect = abs(math.log(target_ratio))
    return int(math.ceil(1 + (z_alpha + z_power) ** 2 / effect**2))


#: The three verdicts of :func:`judge`.
SUPPORTED, CONTRADICTED, INCONCLUSIVE = "supported", "contradicted", "inconclusive"


def judge(est: Estimate, null: float, claimed: float | None, higher_is_claimed: bool = True) -> str:
    """The verdict rule of ``compare``'s claim check and of the claims study, for one effect: **supported** when the
    interval excludes "no effect" on the claimed side and reaches the claimed size, **contradicted** when it lies
    entirely on the wrong side of the claimed size, **inconclusive** otherwise.

    :param est: The effect with its interval.
    :param null: The effect's "no effect" value (0 for a difference, 1 for a ratio).
    :param claimed: The claimed size (``None``: the claim names only a direction).
    :param higher_is_claimed: Whether the claim is that the effect is above ``null`` (else below).
    """
    if math.isnan(est.low) or math.isnan(est.high):
        return INCONCLUSIVE
    sign = 1.0 if higher_is_claimed else -1.0
    low, high = (est.low, est.high) if sign > 0 else (-est.high, -est.low)
    null_s = sign * null
    target = null_s if claimed is None else sign * claimed
    if low > null_s and high >= target:
        return SUPPORTED
    if high < target:  # below the claimed size (or, for a direction, below "no effect")
        return CONTRADICTED
    return INCONCLUSIVE


def combine(verdicts: list[str]) -> str:
    """All parts of a claim: contradicted if any part is, supported if every part is, else inconclusive."""
    if CONTRADICTED in verdicts:
        return CONTRADICTED
    return SUPPORTED if verdicts and all(v == SUPPORTED for v in verdicts) else INCONCLUSIVE
