"""``sb3-grpo compare --eval-every``: every run evaluated on held-out prompts; results.json keeps each run's metrics
and the report's figures equal a recomputation from them (IQM by hand, the interval by SciPy's bootstrap)."""

from __future__ import annotations

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest

from sb3_grpo.cli import main
from sb3_grpo.compare.config import CompareError, make_config
from sb3_grpo.compare.heldout import eval_env_kwargs, heldout_count, split_heldout, train_env_kwargs
from sb3_grpo.compare.report import _ci, summarize
from sb3_grpo.compare.stats import CONFIDENCE, N_RESAMPLES
from textrl_envs.tasks import get_task

SEEDS = 5  # the fewest with which the report gives intervals
ARGS = [
    "compare",
    "--env",
    "TextGen-v0",
    "--env-kwargs",
    '{"max_new_tokens": 5}',
    "--algos",
    "grpo-group",
    "--seeds",
    str(SEEDS),
    "--timesteps",
    "48",
    "--n-envs",
    "4",
    "--group-size",
    "2",
    "--eval-episodes",
    "4",
    "--no-progress",
    "--set",
    "*.n_steps=6",
    "--set",
    "*.batch_size=24",
    "--eval-every",
    "24",
    "--eval-k",
    "1,2",
    "--eval-success",
    "0.2",
    "--eval-reference",
    "bundled",
]


def _iqm_by_hand(values):
    """Mean of the middle half: drop the lowest and highest quarter (``floor(n / 4)`` runs each)."""
    x = sorted(values)
    cut = len(x) // 4
    return float(np.mean(x[cut : len(x) - cut]))


def _bootstrap_interval(values):
    from scipy.stats import bootstrap, trim_mean

    res = bootstrap(
        (np.asarray(values, float),),
        lambda a, axis: trim_mean(a, 0.25, axis=axis),
        n_resamples=N_RESAMPLES,
        confidence_level=CONFIDENCE,
        method="percentile",
        vectorized=True,
        rng=np.random.default_rng(0),
    )
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    out = tmp_path_factory.mktemp("compare-eval") / "out"
    assert main([*ARGS, "--out", str(out)]) == 0
    return out, json.loads((out / "results.json").read_text())


def test_every_run_records_its_evaluations(compared):
    _out, results = compared
    spec = results["config"]["lm_eval"]
    assert spec["k"] == [1, 2] and spec["n_samples"] == 2 and spec["success_threshold"] == 0.2
    for run in results["runs"].values():
        record = run["lm_eval"]
        assert [e["timestep"] for e in record["during"]] == [24]  # at the rollout after 24 of 48 steps
        final = record["final"]
        assert final["timestep"] == run["env_steps"]
        for key in ("greedy_reward_mean", "sampled_reward_mean", "pass@1", "pass@2", "mean@2", "distinct_1"):
            assert np.isfinite(final[key]), key
        assert final["mean@2"] == final["sampled_reward_mean"] and final["pass@1"] <= final["pass@2"]
        assert final["perplexity"] > 1.0 and 0.0 <= final["repetition"] <= 1.0


def test_report_figures_equal_a_recomputation_from_the_runs(compared):
    out, results = compared
    runs = sorted(results["runs"].values(), key=lambda r: r["seed"])
    summary = summarize(results)["grpo-group"]["lm_eval"]
    report = (out / "report.md").read_text()
    section = report.split("## Evaluation on held-out prompts")[1].split("\n## ")[0]
    assert "3 prompts of the env held out" in section
    keys = ["greedy_reward_mean", "sampled_reward_mean", "greedy_pass", "pass@1", "pass@2", "completion_length"]
    keys += ["greedy_completion_length", "distinct_1", "distinct_2", "repetition", "perplexity"]
    assert list(summary) == keys
    for key in keys:
        values = [r["lm_eval"]["final"][key] for r in runs]
        assert summary[key]["values"] == values
        est = summary[key]["iqm"]
        assert est["value"] == pytest.approx(_iqm_by_hand(values), abs=1e-12), key
        if len(set(values)) > 1:
            low, high = _bootstrap_interval(values)
            assert (est["low"], est["high"]) == pytest.approx((low, high), abs=1e-12), key
        else:
            assert est["low"] == est["high"] == est["value"]
        row = _ci(est)
        assert f"| {row} |" in section, (key, row)
        assert np.isfinite(est["low"]) and est["low"] <= est["value"] <= est["high"]


def test_heldout_prompts_are_kept_out_of_training():
    cfg = make_config(
        "TextGen-v0", ["ppo"], seeds=1, timesteps=8, lm_eval={"every": 4}, env_kwargs={"max_new_tokens": 4}
    )
    items = get_task("TextGen-v0").prompts()
    held = cfg.lm_eval["heldout"]
    assert held == split_heldout(len(items), heldout_count(len(items))) and len(held) == 3  # 20% of 16
    train, ev = train_env_kwargs(cfg)["prompts"], eval_env_kwargs(cfg)["prompts"]
    assert ev == [items[i] for i in held] and not set(train) & set(ev) and sorted(train + ev) == sorted(items)


@pytest.mark.parametrize(
    "lm_eval, env, message",
    [
        ({"every": 0}, "TextGen-v0", "--eval-every must be an integer >= 1"),
        ({"every": 4, "k": [0]}, "TextGen-v0", "--eval-k must be integers >= 1"),
        ({"every": 4, "prompts": "nope.jsonl"}, "TextGen-v0", "--eval-prompts nope.jsonl"),
        ({"every": 4, "reference_model": "/no/such"}, "TextGen-v0", "--eval-reference"),
        ({"every": 4}, "GuessNumber-v0", "--eval-prompts FILE.jsonl"),
        ({"every": 4}, "CartPole-v1", "not a text env"),
        ({"every": 4, "colour": 1}, "TextGen-v0", "unknown evaluation setting"),
    ],
)
def test_bad_evaluation_settings_are_refused_early(lm_eval, env, message):
    with pytest.raises(CompareError, match=message):
        make_config(env, ["ppo"], seeds=1, timesteps=8, lm_eval=lm_eval)


def test_cli_eval_options_need_eval_every(tmp_path, capsys):
    with pytest.raises(SystemExit) as err:
        main(["compare", "--eval-k", "1,2", "--out", str(tmp_path / "x")])
    assert err.value.code == 2 and "need --eval-every" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_config_file_lm_eval_key(tmp_path):
    from sb3_grpo.cli import build_parser, parse_lm_eval

    args = build_parser().parse_args(["compare", "--eval-k", "3"])
    assert parse_lm_eval(args, {"every": 8, "prompts": "heldout"}) == {"every": 8, "prompts": "heldout", "k": [3]}
