"""From the claims study's runs to a verdict per claim: pure functions over ``results.json["runs"]``.

Every verdict is one of ``supported``, ``contradicted`` or ``inconclusive`` and rests on a 95% interval
(:mod:`sb3_grpo.compare.stats`), by one rule for every claim: a claim is **supported** when the interval of its effect
excludes "no effect" on the claimed side *and* reaches the claimed size; **contradicted** when the interval lies
entirely on the wrong side of the claimed size (for "about +15%": below +15%, whether or not it excludes 0);
**inconclusive** otherwise. Claims without a size ("ends better", "higher variance") are contradicted only when the
interval lies on the other side of "no effect". So no verdict is stated that its interval does not support.

Definitions (also printed in ``claims.md``):

- **final reward** of a run: the mean reward of its separate evaluation after training (``final.reward_mean``);
- **reward gain**: ``(IQM(x) - IQM(ppo)) / |IQM(ppo)|`` over seeds;
- **seed-to-seed std**: the sample std of the final rewards over seeds; **stability gain**: ``1 - std_x / std_ppo``;
- **drawdown** of a run: ``max_t (max_{s <= t} y_s - y_t)`` of its training curve ``y`` smoothed over 3 rollouts
  (:func:`~sb3_grpo.compare.stats.drawdown`); the arm's drawdown is the mean over its seeds;
- **collapse** of a run: its smoothed training reward ends below half of its running best and has stayed below
  that line for at least :data:`COLLAPSE_MIN_ROLLOUTS` rollouts (to the end), the best being positive (a run that
  only falls from where it started collapses too);
- **gradient noise** of a run: the mean over its rollouts of ``Var / ((1/K) sum_k ||g_k||^2)`` of the
  policy-gradient surrogate's slice gradients (:class:`~benchmarks.claims.diagnostics.GradientNoiseProbe`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from sb3_grpo.compare import stats
from sb3_grpo.compare.stats import CONTRADICTED, INCONCLUSIVE, SUPPORTED, combine, judge

__all__ = [
    "COLLAPSE_MIN_ROLLOUTS",
    "CLAIM_ARMS",
    "above_untrained",
    "arm_iqm",
    "arm_runs",
    "claim_curriculum",
    "claim_collapse",
    "claim_reward",
    "claim_self_critical",
    "claim_stability",
    "collapsed",
    "gate_on_untrained",
    "judge",
]

COLLAPSE_MIN_ROLLOUTS = 3


def arm_runs(runs: dict[str, dict[str, Any]], experiment: str, arm: str) -> list[dict[str, Any]]:
    """The completed runs of one arm, by seed."""
    out = [r for r in runs.values() if r.get("experiment") == experiment and r.get("arm") == arm]
    return sorted([r for r in out if r.get("status") == "complete"], key=lambda r: r["seed"])


def finals(runs: list[dict[str, Any]]) -> list[float]:
    """Each run's final (evaluation) reward."""
    return [float(r["final"]["reward_mean"]) for r in runs]


def drawdowns(runs: list[dict[str, Any]]) -> list[float]:
    """Each run's drawdown (runs without a curve are left out)."""
    return [stats.drawdown(r["curve"]["reward"]) for r in runs if r["curve"]["reward"]]


def collapsed(curve: list[float], window: int = 3, min_rollouts: int = COLLAPSE_MIN_ROLLOUTS) -> bool:
    """Whether a training curve collapsed (see the module docstring).

    :param curve: Mean training reward per rollout.
    :param window: Smoothing window (rollouts).
    :param min_rollouts: Rollouts the curve must stay below half of its running best, to the end.
    """
    y = np.asarray(curve, dtype=float)
    if len(y) < min_rollouts + 1:
        return False
    c = np.cumsum(np.insert(y, 0, 0.0))
    idx = np.arange(1, len(y) + 1)
    smooth = (c[idx] - c[np.maximum(0, idx - window)]) / (idx - np.maximum(0, idx - window))
    best = np.maximum.accumulate(smooth)
    below = smooth < 0.5 * best
    tail = below[-min_rollouts:]
    return bool(tail.all() and best[-1] > 0)


def _mean(values: list[float]) -> float:
    return float(np.mean(values)) if values else math.nan


def _est(e: stats.Estimate) -> dict[str, float]:
    return e.as_dict()


def arm_iqm(final_rewards: list[float]) -> dict[str, float]:
    """The IQM of an arm's final rewards with its bootstrap interval: the figure of the arm tables and of the
    untrained check alike."""
    return _est(stats.iqm_estimate(final_rewards, seed=12))


def claim_reward(runs: dict[str, dict[str, Any]], claimed: float = 0.15) -> dict[str, Any]:
    """Claim 1: GRPO gains about ``claimed`` (a fraction) reward over PPO on long generation (``long``)."""
    grpo, ppo = finals(arm_runs(runs, "long", "grpo")), finals(arm_runs(runs, "long", "ppo"))
    gain = stats.relative_difference(grpo, ppo, seed=1)
    poi = stats.probability_of_improvement(grpo, ppo, seed=2)
    return {
        "verdict": judge(gain, 0.0, claimed),
        "effect": _est(gain),
        "iqm": {"grpo": _est(stats.iqm_estimate(grpo, seed=3)), "ppo": _est(stats.iqm_estimate(ppo, seed=4))},
        "probability_of_improvement": _est(poi),
        "seeds": {"grpo": len(grpo), "ppo": len(ppo)},
    }


def claim_stability(runs: dict[str, dict[str, Any]], claimed: float = 0.30) -> dict[str, Any]:
    """Claim 2: GRPO is about ``claimed`` more stable than PPO (``long``): both the seed-to-seed std and the
    drawdown, as ratios GRPO / PPO, must be below ``1 - claimed`` for the claim."""
    g, p = arm_runs(runs, "long", "grpo"), arm_runs(runs, "long", "ppo")
    std_ratio = stats.ratio(finals(g), finals(p), stats.std, seed=5)
    dd_ratio = stats.ratio(drawdowns(g), drawdowns(p), np.mean, seed=6)
    parts = {
        "seed_std": judge(std_ratio, 1.0, 1.0 - claimed, higher_is_claimed=False),
        "drawdown": judge(dd_ratio, 1.0, 1.0 - claimed, higher_is_claimed=False),
    }
    return {
        "verdict": combine(list(parts.values())),
        "parts": parts,
        "seed_std_ratio": _est(std_ratio),
        "drawdown_ratio": _est(dd_ratio),
        "drawdown": {"grpo": _mean(drawdowns(g)), "ppo": _mean(drawdowns(p))},
        "seeds_needed_for_std": stats.seeds_to_resolve_std_ratio(1.0 - claimed),
    }


def claim_collapse(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Claim 3: the adaptive clip prevents collapse (``collapse``: ``grpo`` against ``grpo-noadaptclip``)."""
    counts = {}
    for arm in ("grpo", "grpo-noadaptclip", "ppo-seq", "ppo-adaptclip"):
        rs = arm_runs(runs, "collapse", arm)
        k = sum(collapsed(r["curve"]["reward"]) for r in rs)
        counts[arm] = {"collapsed": k, "runs": len(rs), "rate_ci": list(stats.wilson_interval(k, len(rs)))}
    on, off = counts["grpo"], counts["grpo-noadaptclip"]
    diff = stats.newcombe_difference(off["collapsed"], off["runs"], on["collapsed"], on["runs"])
    if sum(c["collapsed"] for c in counts.values()) == 0:
        verdict, why = INCONCLUSIVE, "no run collapsed in any arm: the condition the claim is about did not occur"
    elif not math.isnan(diff.low) and diff.low > 0:
        verdict, why = SUPPORTED, "fewer collapses with the adaptive clip, beyond the interval"
    elif on["collapsed"] > 0:
        verdict, why = CONTRADICTED, "runs with the adaptive clip collapsed, and not measurably less often"
    else:
        verdict, why = INCONCLUSIVE, "no collapse with the adaptive clip, too few without it to resolve a difference"
    return {"verdict": verdict, "why": why, "counts": counts, "effect": _est(diff)}


def claim_curriculum(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Claim 4: the length curriculum ends better than fixed-length training of the same token budget."""
    cur, fixed = finals(arm_runs(runs, "curriculum", "grpo+curriculum")), finals(arm_runs(runs, "long", "grpo"))
    gain = stats.relative_difference(cur, fixed, seed=7)
    return {
        "verdict": judge(gain, 0.0, None),
        "effect": _est(gain),
        "probability_of_improvement": _est(stats.probability_of_improvement(cur, fixed, seed=8)),
        "seeds": {"curriculum": len(cur), "fixed": len(fixed)},
    }


def claim_self_critical(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Claim 5: the self-critical baseline gives noisier gradients and less stable training than GAE's learned one."""
    sc, gae = arm_runs(runs, "baselines", "ppo-selfcritical"), arm_runs(runs, "baselines", "ppo-seq")

    def noise(rs: list[dict[str, Any]]) -> list[float]:
        return [r["probe"]["grad_var_relative"] for r in rs if r.get("probe", {}).get("grad_var_relative") is not None]

    noise_ratio = stats.ratio(noise(sc), noise(gae), np.mean, seed=9)
    std_ratio = stats.ratio(finals(sc), finals(gae), stats.std, seed=10)
    dd_ratio = stats.ratio(drawdowns(sc), drawdowns(gae), np.mean, seed=11)
    parts = {
        "gradient_noise": judge(noise_ratio, 1.0, None),
        "seed_std": judge(std_ratio, 1.0, None),
        "drawdown": judge(dd_ratio, 1.0, None),
    }
    stable = combine([parts["seed_std"], parts["drawdown"]]) if parts["seed_std"] == parts["drawdown"] else INCONCLUSIVE
    return {
        "verdict": combine([parts["gradient_noise"], stable]),
        "parts": parts,
        "gradient_noise_ratio": _est(noise_ratio),
        "seed_std_ratio": _est(std_ratio),
        "drawdown_ratio": _est(dd_ratio),
        "noise": {arm: float(np.mean(noise(arm_runs(runs, "baselines", arm)) or [math.nan])) for arm in _BASELINES},
    }


_BASELINES = ("ppo-seq", "ppo-selfcritical", "ppo-group")

#: The arms (experiment, arm) each long-text claim compares: each must have learned something, its final reward
#: above the untrained policy's, before the claim's verdict is read.
CLAIM_ARMS = {
    "reward": (("long", "grpo"), ("long", "ppo")),
    "stability": (("long", "grpo"), ("long", "ppo")),
    "curriculum": (("curriculum", "grpo+curriculum"), ("long", "grpo")),
}


def above_untrained(iqm: dict[str, float], untrained: float | None) -> bool | None:
    """Whether an arm's IQM interval (``_est`` of :func:`~sb3_grpo.compare.stats.iqm_estimate`) lies above the
    untrained policy's final reward: ``None`` when there is no untrained figure or no interval (too few seeds)."""
    if untrained is None or iqm.get("low") is None or math.isnan(iqm["low"]):
        return None
    return bool(iqm["low"] > untrained)


def gate_on_untrained(
    claims: dict[str, dict[str, Any]], runs: dict[str, dict[str, Any]], untrained: float | None
) -> dict[str, dict[str, Any]]:
    """The claims with each long-text verdict withheld (``inconclusive``, the reason under ``gate``) where an arm it
    compares is not shown to beat the untrained policy (``untrained``: its final reward on ``LongReview-v0``): a
    comparison of arms that learned nothing says nothing about the claim. The verdict it would have had is kept under
    ``verdict_ungated``. Claims not listed in :data:`CLAIM_ARMS`, and every claim when ``untrained`` is ``None``, are
    returned as they are."""
    out = dict(claims)
    if untrained is None:
        return out
    shown = {}  # each arm once, though several claims compare it
    for experiment, arm in {pair for arms in CLAIM_ARMS.values() for pair in arms}:
        f = finals(arm_runs(runs, experiment, arm))
        shown[experiment, arm] = bool(f) and above_untrained(arm_iqm(f), untrained) is True
    for name, arms in CLAIM_ARMS.items():
        short = [f"`{experiment}/{arm}`" for experiment, arm in arms if not shown[experiment, arm]]
        if name in out and short:
            claim = dict(out[name])
            claim["verdict_ungated"] = claim["verdict"]
            claim["verdict"] = INCONCLUSIVE
            claim["gate"] = (
                f"not read: {', '.join(short)} not shown to beat the untrained policy ({untrained:.3f}; its IQM "
                "interval must lie above it)"
            )
            out[name] = claim
    return out


def arm_table(runs: dict[str, dict[str, Any]], experiment: str, arms: list[str], baseline: str) -> list[dict[str, Any]]:
    """Per arm of an experiment: IQM of the final reward with its interval, change vs ``baseline`` with its interval,
    probability of improvement over it, drawdown, and the mean update figures (gradient norm, ``grad_var``, clip
    fractions)."""
    base = finals(arm_runs(runs, experiment, baseline))
    rows = []
    for arm in arms:
        rs = arm_runs(runs, experiment, arm)
        f = finals(rs)
        row: dict[str, Any] = {"arm": arm, "seeds": len(f), "iqm": arm_iqm(f)}
        if arm != baseline:
            row["vs_baseline"] = _est(stats.relative_difference(f, base, seed=13))
            row["probability_of_improvement"] = _est(stats.probability_of_improvement(f, base, seed=14))
        row["drawdown"] = float(np.mean(drawdowns(rs) or [math.nan]))
        for key in ("train/grad_norm", "train/grad_var", "train/clip_fraction_pos", "train/clip_fraction_neg"):
            vals = [r.get("updates", {}).get(key) for r in rs]
            vals = [v for v in vals if v is not None]
            row[key] = float(np.mean(vals)) if vals else None
        rows.append(row)
    return rows
