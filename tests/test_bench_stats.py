"""The claims study's statistics, verdict rules, tuning draw and progress display, against brute-force
computations: IQM by sorting, the bootstrap by an explicit resampling loop, the probability of improvement by
counting pairs, Newcombe's interval against the worked example of his paper."""

from __future__ import annotations

import io
import itertools
import math

import numpy as np
import pytest

from benchmarks.claims.experiments import BUDGETS, curriculum_budget, phase_one, phase_two, tuned
from benchmarks.claims.tuning import SEARCH_SPACE, best_trial, trial_configs
from benchmarks.claims.verdicts import claim_collapse, collapsed, judge
from sb3_grpo.compare import stats
from sb3_grpo.compare.progress import Progress, format_duration


def test_iqm_is_the_mean_of_the_middle_half():
    x = [9.0, 1.0, 5.0, 3.0, 7.0, 100.0, -50.0, 4.0]  # sorted: -50 1 3 4 5 7 9 100: middle half 3 4 5 7
    assert stats.iqm(x) == pytest.approx(np.mean([3, 4, 5, 7]))
    assert stats.iqm([1.0, 2.0, 3.0]) == pytest.approx(2.0)  # fewer than 4: nothing to cut


def test_bootstrap_interval_matches_an_explicit_resampling_loop():
    rng = np.random.default_rng(0)
    x, y = rng.normal(1.0, 0.3, 12), rng.normal(0.8, 0.3, 9)

    def diff(a, b, axis=-1):
        return stats.iqm(a, axis=axis) - stats.iqm(b, axis=axis)

    est = stats.bootstrap_ci([x, y], diff, seed=3)
    assert est.value == pytest.approx(stats.iqm(x) - stats.iqm(y))
    boot = np.random.default_rng(99)
    draws = [diff(boot.choice(x, len(x)), boot.choice(y, len(y))) for _ in range(4000)]
    low, high = np.percentile(draws, [2.5, 97.5])
    assert est.low == pytest.approx(low, abs=0.02) and est.high == pytest.approx(high, abs=0.02)
    rel = stats.relative_difference(x, y, seed=3)
    assert rel.value == pytest.approx((stats.iqm(x) - stats.iqm(y)) / abs(stats.iqm(y)))
    assert rel.low < rel.value < rel.high


def test_probability_of_improvement_counts_pairs():
    x, y = [1.0, 2.0, 3.0, 2.5, 0.5], [2.0, 0.0, 1.0, 3.5, 1.5]
    pairs = [(a > b) + 0.5 * (a == b) for a, b in itertools.product(x, y)]
    est = stats.probability_of_improvement(x, y)
    assert est.value == pytest.approx(np.mean(pairs))
    assert 0.0 <= est.low <= est.value <= est.high <= 1.0


def test_ratio_of_stds_and_degenerate_samples():
    x, y = [1.0, 2.0, 3.0, 4.0], [1.0, 3.0, 5.0, 7.0]
    assert stats.ratio(x, y, stats.std).value == pytest.approx(0.5)
    one = stats.iqm_estimate([0.7])
    assert one.value == 0.7 and math.isnan(one.low) and not one.excludes(0.0)
    few = stats.relative_difference([1.0, 1.1, 1.2, 1.3], [0.1, 0.2, 0.1, 0.2])  # fewer than MIN_RUNS: no interval
    assert few.value > 0 and math.isnan(few.low) and judge(few, 0.0, 0.15) == "inconclusive"
    flat = stats.iqm_estimate([0.5] * 5)
    assert (flat.low, flat.high) == (0.5, 0.5)
    assert math.isnan(stats.iqm_estimate([]).value)


def test_performance_profile_is_the_fraction_above_tau():
    x = [0.1, 0.4, 0.4, 0.9]
    prof = stats.performance_profile(x, [0.0, 0.4, 0.5, 1.0], n_resamples=500)
    assert [p.value for p in prof] == [1.0, 0.25, 0.25, 0.0]


def test_newcombe_interval_and_wilson():
    # Newcombe (1998), table II, example (a): 56/70 vs 48/80 -> 0.2 [0.0524, 0.3339] (method 10)
    est = stats.newcombe_difference(56, 70, 48, 80)
    assert est.value == pytest.approx(0.2)
    assert est.low == pytest.approx(0.0524, abs=5e-4) and est.high == pytest.approx(0.3339, abs=5e-4)
    low, high = stats.wilson_interval(0, 10)
    assert low == 0.0 and high == pytest.approx(0.2775, abs=5e-4)


def test_seeds_needed_for_a_thirty_percent_std_reduction():
    n = stats.seeds_to_resolve_std_ratio(0.7)
    se = 1 / math.sqrt(n - 1)
    assert (1.96 + 0.84) * se <= abs(math.log(0.7)) < (1.96 + 0.84) / math.sqrt(n - 2)


def test_drawdown_and_collapse():
    assert stats.drawdown([0.0, 1.0, 2.0, 3.0]) == 0.0
    assert stats.drawdown([0.0, 3.0, 3.0, 3.0, 0.0, 0.0, 0.0], window=1) == 3.0
    rise_then_fall = [0.1, 0.5, 0.8, 0.9, 0.9, 0.2, 0.1, 0.1, 0.1, 0.1]
    assert collapsed(rise_then_fall)
    assert not collapsed([0.1, 0.5, 0.8, 0.9, 0.9, 0.2, 0.1, 0.8, 0.9, 0.9])  # recovered
    assert not collapsed([0.5, 0.4, 0.3, 0.3, 0.3, 0.3])  # fell, but not below half of its best
    assert collapsed([0.6, 0.4, 0.2, 0.1, 0.1, 0.1, 0.1])  # fell from the start to below half: collapsed
    assert not collapsed([-0.5, -0.6, -0.9, -0.9, -0.9, -0.9])  # no positive best: half of it means nothing
    assert not collapsed([0.1, 0.9])  # too short to tell


@pytest.mark.parametrize(
    ("low", "high", "claimed", "higher", "verdict"),
    [
        (0.05, 0.30, 0.15, True, "supported"),  # excludes 0, reaches +15%
        (0.05, 0.12, 0.15, True, "contradicted"),  # a gain, but resolved below the claimed size
        (-0.30, -0.05, 0.15, True, "contradicted"),  # a loss
        (-0.10, 0.30, 0.15, True, "inconclusive"),  # spans both
        (0.40, 0.90, 0.70, False, "supported"),  # ratio below 1 reaching 0.7
        (0.75, 0.95, 0.70, False, "contradicted"),  # less than the claimed 30% reduction
        (0.50, 1.40, 0.70, False, "inconclusive"),
        (1.10, 2.00, None, True, "supported"),  # direction only
        (0.30, 0.90, None, True, "contradicted"),
        (0.80, 1.20, None, True, "inconclusive"),
    ],
)
def test_verdict_rule(low, high, claimed, higher, verdict):
    null = 0.0 if claimed is not None and higher else 1.0
    if claimed is None:
        null = 1.0
    est = stats.Estimate((low + high) / 2, low, high, 10)
    assert judge(est, null, claimed, higher_is_claimed=higher) == verdict
    assert judge(stats.Estimate(0.5, math.nan, math.nan, 1), null, claimed, higher) == "inconclusive"


_FALLS = [0.1, 0.5, 0.8, 0.9, 0.9, 0.2, 0.1, 0.1, 0.1, 0.1]  # collapses
_HOLDS = [0.1, 0.5, 0.8, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9]


def _collapse_runs(collapsed_per_arm: dict[str, int], n: int = 16) -> dict[str, dict]:
    runs = {}
    for arm in ("grpo", "grpo-noadaptclip", "ppo-seq", "ppo-adaptclip"):
        for seed in range(n):
            curve = _FALLS if seed < collapsed_per_arm.get(arm, 0) else _HOLDS
            runs[f"collapse/{arm}/seed{seed}"] = {"experiment": "collapse", "arm": arm, "seed": seed,
                                                  "status": "complete", "curve": {"reward": curve}}  # fmt: skip
    return runs


@pytest.mark.parametrize(
    ("on", "off", "verdict"),
    [
        (0, 0, "inconclusive"),  # nothing collapsed: the condition did not occur
        (1, 12, "supported"),  # fewer with the adaptive clip, beyond the interval
        (11, 9, "contradicted"),  # the full run's counts: collapses with it, not fewer
        (3, 5, "contradicted"),  # fewer, but not resolved, and it did not prevent them
        (0, 3, "inconclusive"),  # none with it, too few without it to tell
    ],
)
def test_collapse_verdict_rule(on, off, verdict):
    c = claim_collapse(_collapse_runs({"grpo": on, "grpo-noadaptclip": off}))
    assert c["verdict"] == verdict
    assert c["counts"]["grpo"]["collapsed"] == on and c["counts"]["grpo-noadaptclip"]["collapsed"] == off
    low, high = c["counts"]["grpo"]["rate_ci"]
    assert low <= on / 16 <= high and (low > 0) == (on > 0)  # a count above 0 excludes a rate of 0
    assert c["effect"]["value"] == pytest.approx((off - on) / 16)


def test_tuning_draw_is_fixed_and_starts_with_the_defaults():
    trials = trial_configs("grpo", 8)
    assert trials[0] == {} and trials == trial_configs("grpo", 8)
    assert trial_configs("grpo", 4) == trials[:4]  # a smaller budget tunes on a prefix of the same draw
    assert len({tuple(sorted((k, str(v)) for k, v in t.items())) for t in trials[1:]}) == 7  # no repeats
    for t in trials[1:]:
        assert all(v in SEARCH_SPACE["grpo"][k] for k, v in t.items())
    assert best_trial([0.1, None, 0.3, 0.3]) == 2 and best_trial([None]) is None
    with pytest.raises(ValueError, match="n_trials"):
        trial_configs("ppo", 100)


def test_plan_keeps_tuning_and_evaluation_seeds_apart():
    budget = BUDGETS["smoke"]
    jobs = phase_one(budget)
    assert len({j.key for j in jobs}) == len(jobs)
    tune_seeds = {j.seed for j in jobs if j.experiment == "tune"}
    eval_seeds = {j.seed for j in jobs if j.experiment not in ("tune", "untrained")}
    assert tune_seeds and eval_seeds and not tune_seeds & eval_seeds
    runs = {
        j.key: {"status": "complete", "final": {"reward_mean": float(i)}}
        for i, j in enumerate(jobs)
        if j.experiment == "tune"
    }
    tuning = tuned(budget, runs)
    assert tuning is not None and tuning["grpo"]["best"] == len(tuning["grpo"]["trials"]) - 1
    two = phase_two(budget, tuning)
    long_grpo = [j for j in two if j.arm == "grpo"][0]
    assert long_grpo.cfg.hyperparameters["grpo"]["learning_rate"] == trial_configs("grpo", 2)[1].get(
        "learning_rate", 3e-4
    )
    assert {j.experiment for j in two} == {"long", "curriculum"}
    missing = dict(runs)
    missing.pop(next(iter(missing)))
    assert tuned(budget, missing) is None


def test_curriculum_budget():
    spec = {"start": 24, "release_at": 0.5, "full_at": 0.9}
    assert [curriculum_budget(p, 96, **spec) for p in (0.0, 0.49, 0.5, 0.7, 0.9, 1.0)] == [24, 24, 24, 60, 96, 96]


def test_progress_plain_lines_when_not_a_terminal():
    stream = io.StringIO()
    bar = Progress(2, 200, stream=stream, interval=0.0)
    assert not bar.live
    bar.start_run("ppo seed 0", 100)
    bar.advance("ppo seed 0", 50, 0.25)
    bar.end_run("ppo seed 0", "ppo seed 0: final reward 0.500")
    text = stream.getvalue()
    assert "ppo seed 0: 50/100, reward 0.250" in text and "[1/2] ppo seed 0: final reward 0.500" in text
    assert "left:" in text
    silent = io.StringIO()
    Progress(1, 10, enabled=False, stream=silent).end_run("x", "x done")
    assert silent.getvalue() == ""
    assert (
        format_duration(42) == "42 s" and format_duration(185) == "3 min 05 s" and format_duration(3720) == "1 h 02 min"
    )
