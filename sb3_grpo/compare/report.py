"""``report.md`` and ``curves.png`` of ``sb3-grpo compare``, computed from ``results.json`` alone.

The metrics are small pure functions over the stored runs (:func:`summarize`), so a report can be
regenerated at any time (``sb3-grpo report DIR``) and the definitions below are the ones the report prints.

- **final reward**: the interquartile mean (IQM) over seeds of each run's separate evaluation, not of the training
  curve, with its 95% bootstrap interval (:mod:`sb3_grpo.compare.stats`, Agarwal et al. 2021).
- **vs PPO**: ``(IQM - IQM_ppo) / |IQM_ppo|`` with its 95% interval; **P(> PPO)**: the probability that a run of the
  algorithm ends above a run of PPO.
- **AUC**: the time-average of the training reward curve (trapezoid area divided by the steps it spans).
- **steps to threshold**: first env step at which the training curve, smoothed over 3 rollouts, reaches the
  threshold; mean over the seeds that reach it.
- **seed std**: std over seeds of the final reward (``ddof=1``).
- **volatility**: std of the rollout-to-rollout change of the training curve over the second half of
  training, mean over seeds.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from sb3_grpo.compare import stats
from sb3_grpo.compare.algos import ALGOS
from sb3_grpo.file_io import save_figure_atomic, write_text_atomic

#: The claim ``compare`` checks: about +15% reward and 30% lower seed-to-seed std than PPO (as fractions).
CLAIM_REWARD_GAIN = 0.15
CLAIM_STABILITY_GAIN = 0.30


# ------------------------------------------------------------------------------------------------------------
# Metrics (pure functions)
# ------------------------------------------------------------------------------------------------------------


def curve_auc(steps: list[float], rewards: list[float]) -> float:
    """Time-average of a reward curve: trapezoid area over the steps it spans (the single value if one point).

    :param steps: Env steps, increasing.
    :param rewards: Reward at each step.
    :return: The average reward over training (NaN for an empty curve).
    """
    if not steps:
        return math.nan
    if len(steps) == 1 or steps[-1] == steps[0]:
        return float(np.mean(rewards))
    x, y = np.asarray(steps, float), np.asarray(rewards, float)
    return float(np.sum((y[1:] + y[:-1]) / 2 * np.diff(x)) / (x[-1] - x[0]))


def smooth(values: list[float], window: int = 3) -> np.ndarray:
    """Trailing moving average (the first points average what exists so far).

    :param values: The series.
    :param window: Points per average.
    :return: The smoothed series, same length.
    """
    y = np.asarray(values, float)
    if len(y) == 0:
        return y
    c = np.cumsum(np.insert(y, 0, 0.0))
    idx = np.arange(1, len(y) + 1)
    lo = np.maximum(0, idx - window)
    return (c[idx] - c[lo]) / (idx - lo)


def steps_to_threshold(steps: list[float], rewards: list[float], threshold: float, window: int = 3) -> float | None:
    """First env step at which the smoothed curve reaches ``threshold`` (``None`` if never).

    :param steps: Env steps.
    :param rewards: Training reward per step.
    :param threshold: The reward to reach.
    :param window: Smoothing window (rollouts).
    :return: The step, or ``None``.
    """
    y = smooth(rewards, window)
    hits = np.flatnonzero(y >= threshold)
    return float(steps[hits[0]]) if len(hits) else None


def volatility(rewards: list[float]) -> float:
    """Std of the rollout-to-rollout change of the curve over its second half (NaN with < 3 points there).

    :param rewards: Training reward per rollout.
    :return: The volatility.
    """
    half = np.asarray(rewards[len(rewards) // 2 :], float)
    if len(half) < 3:
        return math.nan
    return float(np.std(np.diff(half), ddof=1))


def _mean(values: list[float]) -> float:
    values = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return float(np.mean(values)) if values else math.nan


def _std(values: list[float]) -> float:
    values = [v for v in values if v is not None and not math.isnan(v)]
    return float(np.std(values, ddof=1)) if len(values) > 1 else math.nan


def default_threshold(results: dict[str, Any]) -> float | None:
    """Halfway from where the training curves start to where the best algorithm's curves end.

    Both ends come from the training curves (mean over runs of the first point; best algorithm's mean over
    seeds of the last point, smoothed over 3 rollouts), so the threshold is on the scale it is compared with.

    :param results: Contents of ``results.json``.
    :return: The threshold, or ``None`` when no algorithm's curve ends above where the curves start.
    """
    runs = [r for r in results["runs"].values() if r.get("status") == "complete" and r["curve"]["reward"]]
    if not runs:
        return None
    start = float(np.mean([r["curve"]["reward"][0] for r in runs]))
    ends: dict[str, list[float]] = {}
    for r in runs:
        ends.setdefault(r["algo"], []).append(float(smooth(r["curve"]["reward"])[-1]))
    best = max(float(np.mean(v)) for v in ends.values())
    return start + 0.5 * (best - start) if best > start else None


def summarize(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per algorithm: the report's metrics over its completed seeds.

    :param results: Contents of ``results.json``.
    :return: ``{algo: {metric: value}}`` in the config's algorithm order.
    """
    cfg = results["config"]
    threshold = cfg.get("threshold")
    if threshold is None:
        threshold = default_threshold(results)
    out: dict[str, dict[str, Any]] = {}
    for algo in cfg["algos"]:
        runs = [r for r in results["runs"].values() if r["algo"] == algo and r.get("status") == "complete"]
        runs.sort(key=lambda r: r["seed"])
        finals = [r["final"]["reward_mean"] for r in runs]
        reach = (
            [steps_to_threshold(r["curve"]["steps"], r["curve"]["reward"], threshold) for r in runs]
            if (threshold is not None)
            else []
        )
        kl_refs = [r["kl_ref"] for r in runs if r.get("kl_ref") is not None]
        out[algo] = {
            "seeds_done": [r["seed"] for r in runs],
            "seeds_missing": [s for s in cfg["seeds"] if s not in [r["seed"] for r in runs]],
            "final_mean": _mean(finals),
            "final_std": _std(finals),
            "final_iqm": stats.iqm_estimate(finals, seed=0).as_dict(),
            "finals": finals,
            "auc_mean": _mean([curve_auc(r["curve"]["steps"], r["curve"]["reward"]) for r in runs]),
            "threshold": threshold,
            "steps_to_threshold": _mean([s for s in reach if s is not None]),
            "reached": sum(s is not None for s in reach),
            "volatility": _mean([volatility(r["curve"]["reward"]) for r in runs]),
            "wall_time_s": _mean([r["wall_time_s"] for r in runs]),
            "steps_per_s": _mean([r["steps_per_s"] for r in runs]),
            "peak_rss_mb": max([r["peak_rss_mb"] for r in runs], default=math.nan),
            "cuda_peak_mb": max([r["cuda_peak_mb"] for r in runs if r.get("cuda_peak_mb") is not None], default=None),
            "kl_to_init": _mean([r.get("kl_to_init") for r in runs]),
            "kl_ref": _mean(kl_refs) if kl_refs else None,
            "lm_eval": lm_eval_summary(runs, cfg.get("lm_eval")),
        }
    base = out.get("ppo")
    for algo, s in out.items():
        s["vs_ppo_pct"], s["vs_ppo"], s["p_over_ppo"] = None, None, None
        if base is not None and algo != "ppo" and not math.isnan(base["final_mean"]) and base["final_mean"] != 0:
            s["vs_ppo_pct"] = 100.0 * (s["final_mean"] - base["final_mean"]) / abs(base["final_mean"])
            s["vs_ppo"] = stats.relative_difference(s["finals"], base["finals"], seed=1).as_dict()
            s["p_over_ppo"] = stats.probability_of_improvement(s["finals"], base["finals"], seed=2).as_dict()
    return out


def lm_eval_summary(runs: list[dict[str, Any]], lm_eval: dict[str, Any] | None) -> dict[str, dict[str, Any]] | None:
    """Per metric of the evaluation on held-out prompts: each run's final value (seed order) and their IQM with its
    95% bootstrap interval, as for the final reward.

    :param runs: One algorithm's completed runs, in seed order.
    :param lm_eval: The config's ``lm_eval`` (``None``: no evaluation, returns ``None``).
    :return: ``{metric: {"values": [...], "iqm": {"value", "low", "high", "n"}}}``.
    """
    if not lm_eval:
        return None
    from sb3_grpo.compare.heldout import reported_metrics

    out: dict[str, dict[str, Any]] = {}
    for key in reported_metrics(lm_eval):
        values = [float(r["lm_eval"]["final"][key]) for r in runs if key in r.get("lm_eval", {}).get("final", {})]
        out[key] = {"values": values, "iqm": stats.iqm_estimate(values, seed=0).as_dict()}
    return out


def claim_check(results: dict[str, Any], summary: dict[str, dict[str, Any]]) -> list[str]:
    """The report section that checks "GRPO gains about 15% reward and 30% stability over PPO" on this comparison,
    with the verdict rule of ``textrl-bench claims`` (:func:`sb3_grpo.compare.stats.judge`): supported when the 95%
    interval excludes no effect and reaches the claimed size, contradicted when it lies on the wrong side of the
    claimed size, inconclusive otherwise.

    :param results: Contents of ``results.json``.
    :param summary: :func:`summarize` of it.
    :return: Markdown lines.
    """
    from sb3_grpo.compare.stats import combine, judge

    lines = ['## The claim: "GRPO gains about 15% reward and 30% stability over PPO on long text generation"', ""]
    contenders = [a for a in summary if a != "ppo" and ALGOS[a].cls_name == "GRPO" and summary[a]["finals"]]
    if "ppo" not in summary or not summary["ppo"]["finals"] or not contenders:
        return lines + ["Not tested: the comparison needs completed `ppo` runs and a completed GRPO variant.", ""]
    cfg = results["config"]
    lines += [
        f"Measured on `{cfg['env_id']}` with {len(cfg['seeds'])} seed(s) and one shared set of hyperparameters: "
        "not the claim's condition (long text, tuned baselines): `textrl-bench claims` tests it there (its page, "
        "docs/results/claims.md, once generated). Reward gain: change of the IQM of the final reward relative to "
        "PPO's; stability: the ratio of the seed-to-seed stds (claim: at most 0.70). Intervals are 95% bootstrap "
        "intervals.",
        "",
        "| algorithm | reward gain vs PPO [95% CI] | seed std / PPO's [95% CI] | verdict |",
        "|---|---|---|---|",
    ]
    ppo = summary["ppo"]["finals"]
    for algo in contenders:
        gain = stats.relative_difference(summary[algo]["finals"], ppo, seed=1)
        std_ratio = stats.ratio(summary[algo]["finals"], ppo, stats.std, seed=3)
        parts = [
            judge(gain, 0.0, CLAIM_REWARD_GAIN),
            judge(std_ratio, 1.0, 1.0 - CLAIM_STABILITY_GAIN, higher_is_claimed=False),
        ]
        lines.append(
            f"| {algo} | {_ci(gain.as_dict(), pct=True)} | {_ci(std_ratio.as_dict(), spec='.2f')} | "
            f"**{combine(parts)}** (reward: {parts[0]}; stability: {parts[1]}) |"
        )
    n = min(len(summary[a]["finals"]) for a in ["ppo", *contenders])
    lines += [
        "",
        f"With {n} seed(s) per algorithm a 30% lower std is resolved with 80% power only from about "
        f"{stats.seeds_to_resolve_std_ratio(0.7)} seeds per algorithm; an inconclusive stability verdict says so.",
        "",
    ]
    return lines


# ------------------------------------------------------------------------------------------------------------
# Rendering
# ------------------------------------------------------------------------------------------------------------


def _fmt(value: Any, spec: str = ".3f") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return format(value, spec)


def _fmt_pct(value: float | None) -> str:
    return "–" if value is None or math.isnan(value) else f"{value:+.1f}%"


def _ci(e: dict[str, float] | None, pct: bool = False, spec: str = ".3f") -> str:
    """``0.812 [0.760, 0.850]`` (``+12% [-3%, +25%]`` with ``pct``; ``–`` without a value)."""
    if not e or e.get("value") is None or math.isnan(e["value"]):
        return "–"

    def f(x: float) -> str:
        return f"{100 * x:+.0f}%" if pct else format(x, spec)

    return f(e["value"]) + ("" if math.isnan(e["low"]) else f" [{f(e['low'])}, {f(e['high'])}]")


def plot_curves(results: dict[str, Any], path: Path) -> bool:
    """Mean (line) and ± one std over seeds (band) of the training reward against env steps, per algorithm.

    Each run's curve (one point per rollout) is interpolated onto a common grid of env steps before averaging.

    :param results: Contents of ``results.json``.
    :param path: The PNG to write.
    :return: Whether anything was plotted.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cfg = results["config"]
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    plotted = False
    for algo in cfg["algos"]:
        runs = [r for r in results["runs"].values() if r["algo"] == algo and r["curve"]["steps"]]
        if not runs:
            continue
        hi = min(r["curve"]["steps"][-1] for r in runs)
        lo = max(r["curve"]["steps"][0] for r in runs)
        grid = np.linspace(lo, hi, 100) if hi > lo else np.array([lo])
        ys = np.array([np.interp(grid, r["curve"]["steps"], r["curve"]["reward"]) for r in runs])
        mean = ys.mean(axis=0)
        (line,) = ax.plot(grid, mean, label=f"{algo} ({len(runs)} seed{'s' if len(runs) > 1 else ''})")
        if len(runs) > 1:
            std = ys.std(axis=0, ddof=1)
            ax.fill_between(grid, mean - std, mean + std, color=line.get_color(), alpha=0.2)
        plotted = True
    if results.get("untrained"):
        ax.axhline(results["untrained"]["reward_mean"], color="grey", ls="--", lw=1, label="untrained (eval)")
    unit = "tokens" if cfg.get("text") else "env steps"
    ax.set_xlabel(f"env steps ({unit})")
    ax.set_ylabel("mean episode reward per training rollout")
    ax.set_title(f"{env_label(cfg, short=True)}: mean ± std over seeds")
    ax.grid(alpha=0.3)
    if plotted:
        ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure_atomic(fig, path)
    plt.close(fig)
    return plotted


def env_label(cfg: dict[str, Any], short: bool = False) -> str:
    """The env of a comparison as the report names it: the id, and its ``--env-kwargs`` (``short``: only a
    ``task``, which is what tells reasoning-gym runs apart)."""
    kwargs = cfg.get("env_kwargs") or {}
    if not kwargs:
        return cfg["env_id"]
    if short:
        return f"{cfg['env_id']} {kwargs['task']}" if isinstance(kwargs.get("task"), str) else cfg["env_id"]
    return f"{cfg['env_id']} `{json.dumps(kwargs, sort_keys=True)}`"


def render_report(results: dict[str, Any]) -> str:
    """The Markdown report.

    :param results: Contents of ``results.json``.
    :return: The text of ``report.md``.
    """
    cfg = results["config"]
    summary = summarize(results)
    lines = [f"# sb3-grpo compare: {env_label(cfg)}", ""] + _status_lines(results, summary)
    lines += _results_table(results, summary) + _column_notes(results) + _lm_eval_lines(results, summary)
    lines += claim_check(results, summary) + _algorithm_lines(cfg) + _reproduce_lines(results)
    return "\n".join(lines)


def _status_lines(results: dict[str, Any], summary: dict[str, dict[str, Any]]) -> list[str]:
    """Completeness, the size of the comparison, and how the final reward is measured."""
    cfg = results["config"]
    lines: list[str] = []
    total = len(cfg["algos"]) * len(cfg["seeds"])
    done = sum(len(s["seeds_done"]) for s in summary.values())
    if done < total:
        missing = [f"{a} seed {seed}" for a, s in summary.items() for seed in s["seeds_missing"]]
        lines += [
            f"**Incomplete ({results.get('status', '?')}): {done} of {total} runs finished.** Missing: "
            f"{', '.join(missing)}. Rows below use the seeds that finished; rerun the command with `--resume` to "
            "complete it.",
            "",
        ]
    unit = "tokens" if cfg.get("text") else "steps"
    took = sorted({r["env_steps"] for r in results["runs"].values() if isinstance(r.get("env_steps"), int)})
    ran = ""
    if took and took != [cfg["timesteps"]]:  # learn() runs whole rollouts, so a run may take more than asked
        span = f"{took[0]:,}" if len(took) == 1 else f"{took[0]:,} to {took[-1]:,}"
        ran = f" (each run took {span} env steps: learn() runs whole rollouts of n_steps x n_envs)"
    lines += [
        f"{len(cfg['algos'])} algorithms x {len(cfg['seeds'])} seeds x {cfg['timesteps']:,} env steps ({unit}){ran}, "
        f"{cfg['n_envs']} envs.",
        "",
    ]
    untrained = results.get("untrained")
    deterministic = next((r["final"]["deterministic"] for r in results["runs"].values()), None)
    if deterministic is None and untrained:
        deterministic = untrained.get("deterministic")
    policy_word = "greedy (deterministic) actions" if deterministic else "actions sampled from the policy"
    lines += [
        "**Final reward** is measured by a separate evaluation after training, not read off the noisy training "
        f"curve: {cfg['eval_episodes']} episodes with {policy_word}, on an env seeded 10000 + seed and torch seeded "
        "the same way.",
        "",
    ]
    if untrained:
        lines += [f"Untrained policy (same evaluation, seed 0): **{untrained['reward_mean']:.3f}**.", ""]
    return lines


def _results_table(results: dict[str, Any], summary: dict[str, dict[str, Any]]) -> list[str]:
    cfg = results["config"]
    unit = "tok/s" if cfg.get("text") else "steps/s"
    lines = [
        "| algorithm | seeds | final reward IQM [95% CI] | vs PPO [95% CI] | P(> PPO) | AUC | "
        f"steps to {_fmt(summary[cfg['algos'][0]]['threshold'])} | seed std | volatility | wall time (s) | {unit} | "
        "peak RSS (MB) | KL to init | KL to ref |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for algo, s in summary.items():
        n = len(s["seeds_done"])
        reach = f"{_fmt(s['steps_to_threshold'], ',.0f')} ({s['reached']}/{n})" if n else "–"
        mem = _fmt(s["peak_rss_mb"], ".0f") + (f" (CUDA {s['cuda_peak_mb']:.0f})" if s.get("cuda_peak_mb") else "")
        vs = "(baseline)" if algo == "ppo" else _ci(s["vs_ppo"], pct=True)
        lines.append(
            f"| {algo} | {n}/{len(cfg['seeds'])} | {_ci(s['final_iqm'])} | {vs} | {_ci(s['p_over_ppo'], spec='.2f')} | "
            f"{_fmt(s['auc_mean'])} | {reach} | {_fmt(s['final_std'])} | {_fmt(s['volatility'])} | "
            f"{_fmt(s['wall_time_s'], '.1f')} | {_fmt(s['steps_per_s'], ',.0f')} | {mem} | "
            f"{_fmt(s['kl_to_init'], '.4f')} | {_fmt(s['kl_ref'], '.4f')} |"
        )
    return lines


def _column_notes(results: dict[str, Any]) -> list[str]:
    cfg = results["config"]
    unit = "tok/s" if cfg.get("text") else "steps/s"
    per_run = all(r.get("peak_rss_per_run") for r in results["runs"].values())
    threshold = (
        "(set by --threshold)"
        if cfg.get("threshold") is not None
        else "(halfway from where the training curves start to where the best algorithm's curves end)"
    )
    return [
        "",
        "Columns:",
        "- *final reward*: interquartile mean (IQM: the mean of the middle half) over seeds of each run's evaluation "
        "reward, with its 95% percentile-bootstrap interval (Agarwal et al., NeurIPS 2021); with fewer than 4 seeds "
        "the IQM is the mean, and one seed has no interval.",
        "- *vs PPO*: `(IQM - IQM_ppo) / |IQM_ppo|` with its interval (both algorithms' seeds resampled); "
        "*P(> PPO)*: probability that a run of the algorithm ends above a run of PPO (0.5: no tendency).",
        "- *AUC*: time-average of the training reward curve (area under it divided by the steps it spans); "
        "rewards earlier in training count as much as later ones.",
        f"- *steps to X*: first env step at which the training curve (smoothed over 3 rollouts) reaches X {threshold}"
        "; mean over the seeds that reach it (reached/seeds).",
        "- *seed std*: std over seeds (ddof=1) of the final reward: seed-to-seed stability.",
        "- *volatility*: std of the rollout-to-rollout change of the training reward over the second half of "
        "training, mean over seeds: within-run stability (lower is steadier; it includes sampling noise of the "
        "episodes of each rollout).",
        "- *wall time*: `learn()` only (the final evaluation excluded"
        + ("; the evaluations on held-out prompts during training included" if cfg.get("lm_eval") else "")
        + f"); *{unit}*: env steps / wall time.",
        "- *peak RSS*: "
        + (
            "peak resident memory of the process during the run (reset before each run)"
            if per_run
            else "peak resident memory of the process so far (not reset between runs on this platform)"
        )
        + "; CUDA peak allocated when a GPU is used.",
        "- *KL to init*: mean `KL(pi_final || pi_initial)` over the evaluation's states (every algorithm); "
        "*KL to ref*: the last `train/kl_ref` of algorithms that have a KL term in their loss.",
        "",
        "![reward curves](curves.png)",
        "",
    ]


#: How the report names the metrics of the evaluation on held-out prompts.
LM_EVAL_LABELS = {
    "greedy_reward_mean": "greedy reward",
    "sampled_reward_mean": "sampled reward (mean@{n})",
    "greedy_pass": "greedy pass rate",
    "completion_length": "completion length (tokens, sampled)",
    "greedy_completion_length": "completion length (tokens, greedy)",
    "distinct_1": "distinct-1",
    "distinct_2": "distinct-2",
    "repetition": "repetition (2-grams)",
    "perplexity": "perplexity under the reference LM",
}


def _lm_eval_lines(results: dict[str, Any], summary: dict[str, dict[str, Any]]) -> list[str]:
    """The section on the evaluation on held-out prompts (``--eval-every``): one row per metric, one column per
    algorithm, each cell the IQM over seeds of the runs' final values with its 95% interval."""
    spec = results["config"].get("lm_eval")
    if not spec:
        return []
    if spec.get("heldout"):
        where = f"{len(spec['heldout'])} prompts of the env held out from training (a seeded draw)"
    elif spec.get("prompts") == "heldout":
        where = "items of another reasoning-gym generator seed than the training items"
    else:
        where = f"the prompts of `{spec['prompts']}`"
    n = spec["n_samples"]
    algos = list(summary)
    lines = [
        "## Evaluation on held-out prompts",
        "",
        f"Every {spec['every']:,} env steps during training and once more after it, each run played on {where} one "
        f"greedy episode and {n} sampled ones per prompt (`LMEvalCallback`; logged under `eval/` in tensorboard). "
        f"A sample is correct with a reward of at least {spec['success_threshold']:g}; pass@k is the unbiased "
        "estimator of Chen et al. (2021). Each cell: the IQM over seeds of the runs' evaluation after training, with "
        "its 95% bootstrap interval (as the final reward above).",
        "",
        "| metric | " + " | ".join(algos) + " |",
        "|---|" + "---|" * len(algos),
    ]
    first = summary[algos[0]]["lm_eval"] or {}
    for key in first:
        label = LM_EVAL_LABELS.get(key, key).format(n=n)
        cells = [_ci((summary[a]["lm_eval"] or {}).get(key, {}).get("iqm")) for a in algos]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += [""]
    return lines


def _algorithm_lines(cfg: dict[str, Any]) -> list[str]:
    lines = ["## Algorithms and hyperparameters", ""]
    if any(cfg["hyperparameters"].get(a, {}).get("grad_var_params") for a in cfg["algos"]):
        lines += [
            "`grad_var_params` is set below: GRPO's gradient variance is measured over those parameters only "
            "(the design's default is every trainable parameter).",
            "",
        ]
    for algo in cfg["algos"]:
        hp = cfg["hyperparameters"].get(algo, {})
        group = cfg.get("group_sizes", {}).get(algo, 1)
        lines.append(
            f"- `{algo}`: {ALGOS[algo].summary}. Envs in prompt groups of {group}"
            + (" (set by the command for group advantages)" if group > 1 else "")
            + f". `{ALGOS[algo].cls_name}(**{hp})`"
        )
    return lines


def _reproduce_lines(results: dict[str, Any]) -> list[str]:
    env = results.get("environment", {})
    wall = results.get("session_wall_s")
    return [
        "",
        "## Reproduce",
        "",
        "```",
        results.get("command", "?"),
        "```",
        "",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in env.get("versions", {}).items()),
        "",
        "Hardware: " + ", ".join(f"{k}: {v}" for k, v in env.get("hardware", {}).items() if v is not None),
        "",
        "The same command on the same machine reproduces every number exactly (seeded, one torch thread, CPU); "
        "on another CPU or BLAS build float rounding differs and, through sampling, so do the runs, by about their "
        "seed-to-seed spread: compare across machines by the intervals, not the digits.",
        "",
        f"Started {results.get('started', '?')}, finished {results.get('finished', '?')}, status "
        f"{results.get('status', '?')}"
        + (f"; the last session took {wall:.0f} s (all runs, evaluations and setup)." if wall is not None else "."),
        "",
    ]


def write_report(results: dict[str, Any], out: Path) -> None:
    """Write ``report.md`` and ``curves.png`` into ``out``.

    :param results: Contents of ``results.json``.
    :param out: The out dir.
    """
    out = Path(out)
    plot_curves(results, out / "curves.png")
    write_text_atomic(out / "report.md", render_report(results))
