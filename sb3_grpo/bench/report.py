"""``report.md`` and ``curves.png`` of ``sb3-grpo compare``, computed from ``results.json`` alone.

The metrics are small pure functions over the stored runs (:func:`summarize`), so a report can be
regenerated at any time (``sb3-grpo report DIR``) and the definitions below are the ones the report prints.

- **final reward**: mean (and std over seeds) of each run's separate evaluation, not of the training curve.
- **vs PPO**: ``(final - final_ppo) / |final_ppo|`` in percent.
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

from sb3_grpo.bench.algos import ALGOS

CLAIM_REWARD_GAIN = 15.0
CLAIM_STABILITY_GAIN = 30.0


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
        }
    base = out.get("ppo")
    for algo, s in out.items():
        if base is not None and algo != "ppo" and not math.isnan(base["final_mean"]) and base["final_mean"] != 0:
            s["vs_ppo_pct"] = 100.0 * (s["final_mean"] - base["final_mean"]) / abs(base["final_mean"])
        else:
            s["vs_ppo_pct"] = None
    return out


def relative_change(new: float, old: float) -> float | None:
    """``100 * (new - old) / |old|`` (``None`` when undefined)."""
    if old is None or new is None or math.isnan(old) or math.isnan(new) or old == 0:
        return None
    return 100.0 * (new - old) / abs(old)


def stability_verdict(std: float, std_ppo: float, n: int, n_ppo: int, what: str) -> str:
    """Compare two stds over seeds, with the sampling uncertainty of a std from few seeds.

    ``SE(log s) ~ 1 / sqrt(2 (k - 1))`` for a std ``s`` of ``k`` normal samples; the ratio of two is called
    resolved when ``|log(std / std_ppo)|`` exceeds two standard errors.

    :param std: The algorithm's std over seeds.
    :param std_ppo: PPO's.
    :param n: The algorithm's number of seeds.
    :param n_ppo: PPO's.
    :param what: Name of the measure.
    :return: A phrase for the verdict.
    """
    if n < 2 or n_ppo < 2 or not std_ppo or math.isnan(std) or math.isnan(std_ppo) or std <= 0:
        return f"{what} not measurable (needs 2+ seeds and nonzero stds)"
    ratio = std / std_ppo
    se = math.sqrt(1 / (2 * (n - 1)) + 1 / (2 * (n_ppo - 1)))
    change = f"{100 * (1 - ratio):.0f}% lower" if ratio <= 1 else f"{100 * (ratio - 1):.0f}% higher"
    if abs(math.log(ratio)) <= 2 * se:
        lo, hi = math.exp(-2 * se), math.exp(2 * se)
        return f"{what} {change}, not resolvable with these seeds (ratios {lo:.2f}-{hi:.2f} are within noise)"
    verdict = "more stable than PPO" if ratio < 1 else "less stable than PPO"
    return f"{what} {change}: {verdict} beyond seed noise" + (
        " (at least the claimed 30%)" if ratio <= 1 - CLAIM_STABILITY_GAIN / 100 else ""
    )


def claim_check(results: dict[str, Any], summary: dict[str, dict[str, Any]]) -> list[str]:
    """The report section that tests "GRPO gains about 15% reward and 30% stability over PPO".

    :param results: Contents of ``results.json``.
    :param summary: :func:`summarize` of it.
    :return: Markdown lines.
    """
    cfg = results["config"]
    lines = [
        '## The claim: "GRPO gains about 15% reward and 30% stability over PPO on long text generation"',
        "",
    ]
    if "ppo" not in summary or not summary["ppo"]["finals"]:
        return lines + ["Not tested: the comparison has no completed `ppo` run to compare against.", ""]
    contenders = [a for a in summary if a != "ppo" and ALGOS[a].cls_name == "GRPO" and summary[a]["finals"]]
    if not contenders:
        return lines + ["Not tested: the comparison has no completed GRPO variant.", ""]
    ppo = summary["ppo"]
    n_ppo = len(ppo["finals"])
    if not cfg.get("text"):
        lines.append(
            f"Note: `{cfg['env_id']}` is not a text env; the claim is about text generation, so this "
            "only says how the same algorithms behave here."
        )
    else:
        lines.append(
            f"Measured on `{cfg['env_id']}` with completions of at most the env's token budget (24 tokens for "
            'TextGen-v0): short, not "long", text generation; the claim\'s setting may differ.'
        )
    lines += [
        (
            "Reward gain = change of the mean final (evaluation) reward relative to PPO's; its uncertainty is the "
            "standard error of the difference of the two means over seeds. Stability gain = reduction of the "
            "seed-to-seed std of the final reward, and of the within-run volatility, relative to PPO's (in the table: "
            "relative change, negative = steadier than PPO)."
        ),
        "",
        "| algorithm | reward gain vs PPO | ± (1 s.e.) | seed std vs PPO | volatility vs PPO | verdict |",
        "|---|---|---|---|---|---|",
    ]
    verdicts = []
    for algo in contenders:
        s = summary[algo]
        gain = relative_change(s["final_mean"], ppo["final_mean"])
        n = len(s["finals"])
        se = math.nan
        if n > 1 and n_ppo > 1:
            se = math.sqrt(s["final_std"] ** 2 / n + ppo["final_std"] ** 2 / n_ppo)
        se_pct = 100.0 * se / abs(ppo["final_mean"]) if ppo["final_mean"] and not math.isnan(se) else math.nan
        std_red = (
            -relative_change(s["final_std"], ppo["final_std"])
            if relative_change(s["final_std"], ppo["final_std"]) is not None
            else None
        )
        vol_red = (
            -relative_change(s["volatility"], ppo["volatility"])
            if relative_change(s["volatility"], ppo["volatility"]) is not None
            else None
        )
        diff = s["final_mean"] - ppo["final_mean"]
        if gain is None:
            reward_verdict = "reward gain undefined (PPO's mean final reward is 0 or missing)"
        elif math.isnan(se):
            reward_verdict = f"reward {gain:+.0f}% (one seed: no error bar)"
        elif abs(diff) <= 2 * se:
            reward_verdict = f"reward {gain:+.0f}% is within seed noise (difference <= 2 s.e.)"
        elif diff > 0:
            reward_verdict = f"reward {gain:+.0f}%: better than PPO beyond seed noise" + (
                ", at least the claimed +15%" if gain >= CLAIM_REWARD_GAIN else ", but less than the claimed +15%"
            )
        else:
            reward_verdict = f"reward {gain:+.0f}%: worse than PPO beyond seed noise (claim not supported)"
        stab_verdict = stability_verdict(s["final_std"], ppo["final_std"], n, n_ppo, "seed-to-seed std")
        if vol_red is not None:
            stab_verdict += (
                "; volatility "
                + (f"{vol_red:.0f}% lower" if vol_red >= 0 else f"{-vol_red:.0f}% higher")
                + (" (at least the claimed 30%)" if vol_red >= CLAIM_STABILITY_GAIN else "")
            )
        reward_ok = gain is not None and not math.isnan(se) and diff > 2 * se and gain >= CLAIM_REWARD_GAIN
        reward_worse = not math.isnan(se) and diff < -2 * se
        ratio = s["final_std"] / ppo["final_std"] if ppo["final_std"] and not math.isnan(ppo["final_std"]) else math.nan
        stab_ok = "beyond seed noise" in stab_verdict and ratio <= 1 - CLAIM_STABILITY_GAIN / 100
        stab_worse = "less stable than PPO beyond seed noise" in stab_verdict
        if reward_ok and stab_ok:
            overall = "supported"
        elif reward_worse or stab_worse:
            overall = (
                "contradicted ("
                + " and ".join(
                    x
                    for x, bad in (
                        ("final reward below PPO's", reward_worse),
                        ("seed-to-seed std above PPO's", stab_worse),
                    )
                    if bad
                )
                + " beyond seed noise)"
            )
        elif reward_ok or stab_ok:
            overall = (
                "partly supported (" + ("reward gain" if reward_ok else "stability gain") + " shown, the other not)"
            )
        else:
            overall = (
                "not supported by this measurement (no reward gain beyond seed noise, no resolvable stability gain)"
            )
        verdicts.append((algo, reward_verdict, stab_verdict, overall))
        lines.append(
            f"| {algo} | {_fmt_pct(gain)} | {_fmt(se_pct, '.0f')}{'%' if not math.isnan(se_pct) else ''} | "
            f"{_fmt_pct(None if std_red is None else -std_red)} | {_fmt_pct(None if vol_red is None else -vol_red)} | "
            f"{reward_verdict}; {stab_verdict} |"
        )
    k = min([n_ppo] + [len(summary[a]["finals"]) for a in contenders])
    rel = 1 / math.sqrt(2 * (k - 1)) if k > 1 else math.inf
    lines += [
        "",
        "**What we found.** "
        + " ".join(f"Claim for `{a}`: **{ov}**." for a, _rv, _sv, ov in verdicts)
        + " In detail: "
        + " ".join(f"`{a}`: {rv}; {sv}." for a, rv, sv, _ov in verdicts),
        "",
        f"Caveat on stability: with {k} seed(s) per algorithm a standard deviation is itself uncertain by about "
        + (f"±{100 * rel:.0f}% (relative, 1/sqrt(2(k-1)))" if k > 1 else "an unbounded amount")
        + ", so a 30% difference in seed-to-seed std is not resolvable unless it is far larger than that; run "
        "more seeds (`--seeds 10`) to test it. The verdict above reports what was measured, not the claim's truth.",
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
    fig.savefig(path)
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
    unit = "tok/s" if cfg.get("text") else "steps/s"
    untrained = results.get("untrained")
    lines = [f"# sb3-grpo compare: {env_label(cfg)}", ""]
    total = len(cfg["algos"]) * len(cfg["seeds"])
    done = sum(len(s["seeds_done"]) for s in summary.values())
    status = results.get("status", "?")
    if done < total:
        missing = [f"{a} seed {seed}" for a, s in summary.items() for seed in s["seeds_missing"]]
        lines += [
            (
                f"**Incomplete ({status}): {done} of {total} runs finished.** Missing: {', '.join(missing)}. "
                "Rows below average the seeds that finished; rerun the command with `--resume` to complete it."
            ),
            "",
        ]
    lines += [
        (
            f"{len(cfg['algos'])} algorithms x {len(cfg['seeds'])} seeds x {cfg['timesteps']:,} env steps "
            f"({'tokens' if cfg.get('text') else 'steps'}), {cfg['n_envs']} envs."
        ),
        "",
    ]
    deterministic = None
    for run in results["runs"].values():
        deterministic = run["final"]["deterministic"]
        break
    if deterministic is None and untrained:
        deterministic = untrained.get("deterministic")
    policy_word = "greedy (deterministic) actions" if deterministic else "actions sampled from the policy"
    lines += [
        (
            f"**Final reward** is measured by a separate evaluation after training, not read off the noisy "
            f"training curve: {cfg['eval_episodes']} episodes with {policy_word}, on an env seeded "
            f"10000 + seed and torch seeded the same way."
        ),
        "",
    ]
    if untrained:
        lines += [f"Untrained policy (same evaluation, seed 0): **{untrained['reward_mean']:.3f}**.", ""]
    lines += [
        (
            "| algorithm | seeds | final reward (mean ± std) | vs PPO | AUC | "
            f"steps to {_fmt(summary[cfg['algos'][0]]['threshold'])} "
            f"| seed std | volatility | wall time (s) | {unit} | peak RSS (MB) | KL to init | KL to ref |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for algo, s in summary.items():
        n = len(s["seeds_done"])
        reach = f"{_fmt(s['steps_to_threshold'], ',.0f')} ({s['reached']}/{n})" if n else "–"
        mem = _fmt(s["peak_rss_mb"], ".0f") + (f" (CUDA {s['cuda_peak_mb']:.0f})" if s.get("cuda_peak_mb") else "")
        lines.append(
            f"| {algo} | {n}/{len(cfg['seeds'])} | {_fmt(s['final_mean'])} ± {_fmt(s['final_std'])} | "
            f"{_fmt_pct(s['vs_ppo_pct']) if algo != 'ppo' else '(baseline)'} | {_fmt(s['auc_mean'])} | {reach} | "
            f"{_fmt(s['final_std'])} | {_fmt(s['volatility'])} | {_fmt(s['wall_time_s'], '.1f')} | "
            f"{_fmt(s['steps_per_s'], ',.0f')} | {mem} | {_fmt(s['kl_to_init'], '.4f')} | {_fmt(s['kl_ref'], '.4f')} |"
        )
    lines += [
        "",
        "Columns:",
        "- *final reward*: mean ± std over seeds of each run's evaluation reward (above).",
        "- *vs PPO*: `(final - final_ppo) / |final_ppo|`.",
        (
            "- *AUC*: time-average of the training reward curve (area under it divided by the steps it spans); "
            "rewards earlier in training count as much as later ones."
        ),
        "- *steps to X*: first env step at which the training curve (smoothed over 3 rollouts) reaches X "
        + (
            "(set by --threshold)"
            if cfg.get("threshold") is not None
            else "(halfway from where the training curves start to where the best algorithm's curves end)"
        )
        + "; mean over the seeds that reach it (reached/seeds).",
        "- *seed std*: std over seeds (ddof=1) of the final reward: seed-to-seed stability.",
        (
            "- *volatility*: std of the rollout-to-rollout change of the training reward over the second half of "
            "training, mean over seeds: within-run stability (lower is steadier; it includes sampling noise of the "
            "episodes of each rollout)."
        ),
        f"- *wall time*: `learn()` only (evaluation excluded); *{unit}*: env steps / wall time.",
        "- *peak RSS*: "
        + (
            "peak resident memory of the process during the run (reset before each run)"
            if all(r.get("peak_rss_per_run") for r in results["runs"].values())
            else "peak resident memory of the process so far (not reset between runs on this platform)"
        )
        + "; CUDA peak allocated when a GPU is used.",
        (
            "- *KL to init*: mean `KL(pi_final || pi_initial)` over the evaluation's states (every algorithm); "
            "*KL to ref*: the last `train/kl_ref` of algorithms that have a KL term in their loss."
        ),
        "",
        "![reward curves](curves.png)",
        "",
    ]
    lines += claim_check(results, summary)
    lines += ["## Algorithms and hyperparameters", ""]
    if any(cfg["hyperparameters"].get(a, {}).get("grad_var_params") for a in cfg["algos"]):
        lines += [
            (
                "`grad_var_params` is set below: GRPO's gradient variance is measured over those parameters only "
                "(the design's default is every trainable parameter)."
            ),
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
    env = results.get("environment", {})
    lines += [
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
        f"Started {results.get('started', '?')}, finished {results.get('finished', '?')}, status {status}"
        + (
            f"; the last session took {results['session_wall_s']:.0f} s (all runs, evaluations and setup)."
            if results.get("session_wall_s") is not None
            else "."
        ),
        "",
    ]
    return "\n".join(lines)


def write_report(results: dict[str, Any], out: Path) -> None:
    """Write ``report.md`` and ``curves.png`` into ``out``.

    :param results: Contents of ``results.json``.
    :param out: The out dir.
    """
    out = Path(out)
    plot_curves(results, out / "curves.png")
    (out / "report.md").write_text(render_report(results))
