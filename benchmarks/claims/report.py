"""``claims.md``, ``curves.png`` and ``profiles.png`` of ``textrl-bench claims``, from ``results.json`` alone."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.claims import verdicts as V
from benchmarks.claims.experiments import (
    ABLATION_ARMS,
    BASELINE_ARMS,
    COLLAPSE_ARMS,
    EXPERIMENT_ENV,
    EXPERIMENTS,
    LONG_ENV,
    REASONING_ENV,
    SHORT_ENV,
)
from sb3_grpo.file_io import save_figure_atomic, write_text_atomic

__all__ = ["CLAIMS", "evaluate_claims", "render_claims", "write_claims_report"]

#: The claims as given to us, and the experiment each is tested by.
CLAIMS = {
    "reward": ("On long text generation, gradient-regularized GRPO gains about 15% reward over PPO", "long"),
    "stability": ("... with about 30% better training stability", "long"),
    "collapse": ("On complex reasoning tasks, the adaptive clip prevents policy collapse", "collapse"),
    "curriculum": (
        "A curriculum on generation length, introduced mid-training and gradually releasing the limit, ends better "
        "than training at a fixed length",
        "curriculum",
    ),
    "self_critical": (
        "A self-critical baseline gives higher-variance gradients and less stable training than PPO's learned baseline",
        "baselines",
    ),
}


def evaluate_claims(
    runs: dict[str, dict[str, Any]], experiments: tuple[str, ...] | list[str] = EXPERIMENTS
) -> dict[str, dict[str, Any]]:
    """The verdict, effect and interval of every claim whose experiment is among ``experiments``
    (:mod:`benchmarks.claims.verdicts`); a long-text verdict is withheld where an arm it compares does not beat the
    untrained policy (:func:`~benchmarks.claims.verdicts.gate_on_untrained`)."""
    judged = {
        "reward": V.claim_reward,
        "stability": V.claim_stability,
        "collapse": V.claim_collapse,
        "curriculum": V.claim_curriculum,
        "self_critical": V.claim_self_critical,
    }
    claims = {name: judge(runs) for name, judge in judged.items() if CLAIMS[name][1] in experiments}
    return V.gate_on_untrained(claims, runs, untrained_rewards(runs).get(LONG_ENV))


def planned_experiments(results: dict[str, Any]) -> list[str] | tuple[str, ...]:
    """The experiments the study's plan runs (every one for a study recorded before a budget named them)."""
    return results.get("plan", {}).get("budget", {}).get("experiments") or EXPERIMENTS


def untrained_rewards(runs: dict[str, dict[str, Any]]) -> dict[str, float]:
    """The untrained policy's final reward per env."""
    return {
        r["arm"]: r["final"]["reward_mean"]
        for r in runs.values()
        if r.get("experiment") == "untrained" and r.get("status") == "complete"
    }


def ci(e: dict[str, float] | None, pct: bool = False, fmt: str = ".3f") -> str:
    """``0.812 [0.760, 0.850]`` (``+12% [-3%, +25%]`` with ``pct``)."""
    if not e or e.get("value") is None or (isinstance(e["value"], float) and math.isnan(e["value"])):
        return "n/a"

    def f(x: float) -> str:
        if x is None or math.isnan(x):
            return "?"
        return f"{100 * x:+.0f}%" if pct else format(x, fmt)

    if math.isnan(e["low"]):
        return f"{f(e['value'])} (no interval: {e.get('n', 0)} seed(s))"
    return f"{f(e['value'])} [{f(e['low'])}, {f(e['high'])}]"


def _effect_line(name: str, c: dict[str, Any]) -> str:
    if name == "reward":
        poi = ci(c["probability_of_improvement"], fmt=".2f")
        return f"GRPO vs PPO final reward (IQM): {ci(c['effect'], pct=True)}; P(GRPO > PPO) {poi}"
    if name == "stability":
        return (
            f"GRPO / PPO seed-to-seed std {ci(c['seed_std_ratio'], fmt='.2f')}; "
            f"drawdown {ci(c['drawdown_ratio'], fmt='.2f')} (claim: at most 0.70)"
        )
    if name == "collapse":
        on, off = (_collapse_count(c["counts"][arm]) for arm in ("grpo", "grpo-noadaptclip"))
        return (
            f"collapsed: {on} with the adaptive clip, {off} without (Wilson intervals); fewer with it: "
            f"{ci(c['effect'], fmt='.2f')} ({c['why']})"
        )
    if name == "curriculum":
        return f"curriculum vs fixed length final reward (IQM): {ci(c['effect'], pct=True)}"
    parts = ", ".join(f"{part.replace('_', ' ')}: {v}" for part, v in c["parts"].items())
    return (
        f"self-critical / GAE gradient noise {ci(c['gradient_noise_ratio'], fmt='.2f')}; "
        f"seed-to-seed std {ci(c['seed_std_ratio'], fmt='.2f')}; drawdown {ci(c['drawdown_ratio'], fmt='.2f')} "
        f"(claim: above 1; {parts})"
    )


def _collapse_count(count: dict[str, Any]) -> str:
    """``k/n [low, high]``: the arm's collapsed runs and the 95% interval of its rate."""
    low, high = count["rate_ci"]  # (nan, nan) for an arm without runs
    rate = f" [{low:.2f}, {high:.2f}]" if not math.isnan(low) else ""
    return f"{count['collapsed']}/{count['runs']}{rate}"


def verdict_table(claims: dict[str, dict[str, Any]]) -> list[str]:
    """The verdict table: claim, experiment, effect with its 95% interval, verdict."""
    lines = ["| claim | experiment | effect [95% CI] | verdict |", "|---|---|---|---|"]
    for name, c in claims.items():
        text, experiment = CLAIMS[name]
        gate = f" ({c['gate']})" if c.get("gate") else ""
        lines.append(f"| {text} | `{experiment}` | {_effect_line(name, c)} | **{c['verdict']}**{gate} |")
    return lines


def _header(results: dict[str, Any]) -> list[str]:
    runs = results["runs"]
    done = sum(r.get("status") == "complete" for r in runs.values())
    failed = [k for k, r in runs.items() if r.get("status") == "failed"]
    hw = results.get("environment", {}).get("hardware", {})
    lines = [f"# textrl-bench claims (budget `{results['budget']}`)", ""]
    model = results.get("plan", {}).get("budget", {}).get("model")
    if model:
        lines += [
            f"Policy: `{model}` with LoRA adapters, on `{LONG_ENV}` in chat form (a neutral request for a review, "
            "96 tokens, rewarded for positive sentiment, fluency under the frozen starting model and no repeated "
            "bigrams). Claims 1, 2 and 4 only: the others test conditions of the bundled LM's tasks.",
            "",
        ]
    if results.get("status") != "complete":
        lines += [
            f"**Status: {results.get('status')}** ({done} runs complete). Verdicts below use the runs that finished; "
            "rerun the command with `--resume` to complete it.",
            "",
        ]
    if failed:
        lines += [f"**Failed runs:** {', '.join(failed)} (their errors are in results.json).", ""]
    wall, cpu = results.get("session_wall_s"), results.get("session_cpu_s")
    lines += [
        f"Command: `{results.get('command')}`; {results.get('workers', 1)} worker(s); "
        f"{done} runs; last session {_minutes(wall)} wall, {_minutes(cpu)} CPU.",
        "",
        f"Hardware: {hw.get('cpu', '?')} ({hw.get('cpu_capability', '?')}; BLAS {hw.get('blas_info', '?')}), "
        f"{hw.get('usable_cpus', '?')} usable CPUs, load average at start "
        f"{hw.get('load_average_at_start', '?')}; versions: "
        + ", ".join(f"{k} {v}" for k, v in results.get("environment", {}).get("versions", {}).items()),
        "",
    ]
    return lines


def _minutes(seconds: float | None) -> str:
    return "?" if seconds is None else f"{seconds / 60:.1f} min"


DEFINITIONS = [
    "## How the verdicts are reached",
    "",
    "- Every interval is a 95% percentile bootstrap (SciPy, 5,000 resamples, each arm's runs resampled on their own; "
    "Agarwal et al., NeurIPS 2021). Location is the interquartile mean (IQM) of the runs' final rewards; the final "
    "reward of a run is its separate evaluation after training, not the training curve.",
    "- **supported**: the interval excludes no effect on the claimed side and reaches the claimed size; "
    "**contradicted**: the interval lies entirely on the wrong side of the claimed size (or, for a claim with "
    "only a direction, of no effect); **inconclusive**: anything else.",
    "- **Stability** (claims 2 and 5), two measures that must agree: the seed-to-seed std of the final reward, "
    "`std = sqrt(sum_i (f_i - mean f)^2 / (n - 1))` over seeds, and the within-run drawdown, "
    "`D = max_t (max_{s<=t} y_s - y_t)` of the training curve `y` smoothed over 3 rollouts, averaged over seeds; "
    "each compared as a ratio (arm / baseline) with its interval.",
    "- **Collapse** (claim 3): the smoothed training reward ends below half of its running best and stays below it "
    "for the last 3 rollouts (the running best positive; falling from the start counts). Counts are compared by the "
    "difference of proportions with Newcombe's hybrid score interval.",
    "- **Gradient noise** (claim 5), one estimator for every arm: after each rollout, the gradients `g_k` of the "
    "policy-gradient surrogate on 4 slices of a minibatch, `Var / ((1/K) sum_k ||g_k||^2)` (scale-free: the "
    "baselines' advantages have different scales), averaged over the run.",
    "",
]


def _table(rows: list[dict[str, Any]], baseline: str, untrained: float | None = None) -> list[str]:
    lines = [
        f"| arm | seeds | final reward IQM [95% CI] | above untrained ({_num(untrained)}) | vs `{baseline}` [95% CI] | "
        f"P(arm > {baseline}) | drawdown | grad norm | grad_var | clip frac + / - |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        clip = [r.get("train/clip_fraction_pos"), r.get("train/clip_fraction_neg")]
        vs, poi = "baseline", ""
        if "vs_baseline" in r:
            vs, poi = ci(r["vs_baseline"], pct=True), ci(r["probability_of_improvement"], fmt=".2f")
        above = {True: "yes", False: "no", None: "–"}[V.above_untrained(r["iqm"], untrained)]
        lines.append(
            f"| `{r['arm']}` | {r['seeds']} | {ci(r['iqm'])} | {above} | {vs} | {poi} | {_num(r['drawdown'])} | "
            f"{_num(r['train/grad_norm'], '.2f')} | {_num(r['train/grad_var'], '.3g')} | "
            f"{' / '.join(_num(c, '.3f') for c in clip)} |"
        )
    return lines


def _num(x: float | None, fmt: str = ".3f") -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def _tuning(results: dict[str, Any]) -> list[str]:
    tuning = results.get("tuning")
    if not tuning:
        return ["## Tuning", "", "Not finished yet.", ""]
    lines = ["## Tuning (every trial; score = mean final reward over the tuning seeds)", ""]
    for algo, rec in tuning.items():
        lines += [f"`{algo}`, chosen: trial {rec['best']} ({rec['overrides'] or 'the defaults'})", ""]
        lines += ["| trial | overrides | score |", "|---|---|---|"]
        lines += [f"| {t['trial']} | {t['overrides'] or 'defaults'} | {t['score']:.3f} |" for t in rec["trials"]]
        lines.append("")
    return lines


def render_claims(results: dict[str, Any]) -> str:
    """The text of ``claims.md`` (the sections of the experiments the study's plan ran)."""
    runs = results["runs"]
    experiments = planned_experiments(results)
    claims = evaluate_claims(runs, experiments)
    untrained = untrained_rewards(runs)
    lines = _header(results) + ["## Verdicts", ""] + verdict_table(claims) + [""]
    skipped = [f"claim {i} ({CLAIMS[name][1]})" for i, name in enumerate(CLAIMS, 1) if name not in claims]
    skipped += ["the ablation"] if "ablation" not in experiments else []
    if skipped:
        lines += [f"Not run in this study: {', '.join(skipped)}.", ""]
    if untrained:
        lines += ["Untrained policy: " + ", ".join(f"{k} {v:.3f}" for k, v in untrained.items()) + ".", ""]
    if "stability" in claims:
        lines += [
            "Resolving a 30% lower seed-to-seed std (ratio 0.70) with 80% power needs about "
            f"{claims['stability']['seeds_needed_for_std']} seeds per arm (`SE(log std) = 1 / sqrt(2 (n - 1))` per "
            "arm); the drawdown, a per-run measure, needs fewer.",
            "",
        ]
    lines += DEFINITIONS
    noise = claims.get("self_critical", {}).get("noise", {})
    sections = [  # (experiment, heading or None, arms, baseline)
        ("long", f"## Claims 1, 2, 4: long generation (`{LONG_ENV}`)", ["ppo", "grpo"], "ppo"),
        ("curriculum", None, ["grpo+curriculum"], "grpo+curriculum"),
        ("collapse", f"## Claim 3: collapse on `{REASONING_ENV}` at an aggressive learning rate", COLLAPSE_ARMS,
         "ppo-seq"),
        ("baselines", f"## Claim 5: baselines on `{SHORT_ENV}` (gradient noise per arm: "
         + ", ".join(f"`{a}` {_num(v)}" for a, v in noise.items()) + ")", BASELINE_ARMS, "ppo-seq"),
        ("ablation", f"## Ablation: GRPO's mechanisms on `{SHORT_ENV}` (compare's defaults)", ABLATION_ARMS, "ppo-seq"),
    ]  # fmt: skip
    for experiment, heading, arms, baseline in sections:
        if experiment in experiments:
            rows = V.arm_table(runs, experiment, list(arms), baseline)
            lines += [
                *([heading, ""] if heading else []),
                *_table(rows, baseline, untrained.get(EXPERIMENT_ENV[experiment])),
                "",
            ]
    lines += [
        "*above untrained*: whether the arm's IQM interval lies above the untrained policy's final reward on the same "
        "env (`–`: no interval); a long-text verdict is read only where every arm it compares does. *grad norm*: the "
        "gradient norm before clipping to `max_grad_norm`, mean over updates; *grad_var*: GRPO's logged penalty "
        "value; *clip frac + / -*: fraction of samples clipped where the advantage is positive / not.",
        "",
        *reward_terms_section(runs),
        *(_tuning(results) if "tune" in experiments else []),
        "![training curves](curves.png)",
        "",
        "![performance profiles](profiles.png)",
        "",
    ]
    return "\n".join(lines)


def reward_terms_section(runs: dict[str, dict[str, Any]]) -> list[str]:
    """A table of each composite-reward term per experiment and arm: its mean over seeds in the first rollout (the
    untrained policy's samples) and over the last three (:class:`~benchmarks.claims.diagnostics.RewardTerms`), so
    that a trained arm's total is read term by term. Empty when no run recorded terms."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for run in runs.values():
        if run.get("reward_terms"):
            groups.setdefault((run["experiment"], run["arm"]), []).append(run["reward_terms"])
    if not groups:
        return []
    labels = list(dict.fromkeys(label for terms in groups.values() for t in terms for label in t))
    lines = ["## Reward terms", "",
             "Each term of the composite reward, mean over seeds of its mean over the episodes of the first rollout "
             "(the untrained policy's samples) -> of the last three rollouts.", "",
             "| experiment | arm | seeds | " + " | ".join(labels) + " |",
             "|---|---|---|" + "---|" * len(labels)]  # fmt: skip
    for (experiment, arm), terms in sorted(groups.items()):
        cells = []
        for label in labels:
            found = [t[label] for t in terms if label in t]
            cells.append(f"{np.mean([f['first'] for f in found]):.3f} -> {np.mean([f['last'] for f in found]):.3f}"
                         if found else "–")  # fmt: skip
        lines.append(f"| {experiment} | {arm} | {len(terms)} | " + " | ".join(cells) + " |")
    return lines + [""]


def write_claims_report(results: dict[str, Any], out: Path) -> None:
    """Write ``claims.md``, ``curves.png`` and ``profiles.png`` into ``out``."""
    out = Path(out)
    _plot_curves(results, out / "curves.png")
    _plot_profiles(results, out / "profiles.png")
    write_text_atomic(out / "claims.md", render_claims(results))


def _plot_curves(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    planned = planned_experiments(results)
    experiments = [e for e in ("long", "curriculum", "collapse", "baselines", "ablation") if e in planned]
    fig, axes = plt.subplots(1, len(experiments), figsize=(4.2 * len(experiments), 3.6), dpi=100, squeeze=False)
    axes = axes[0]
    for ax, experiment in zip(axes, experiments):
        arms = sorted({r["arm"] for r in results["runs"].values() if r.get("experiment") == experiment})
        for arm in arms:
            rs = [r for r in V.arm_runs(results["runs"], experiment, arm) if r["curve"]["steps"]]
            if not rs:
                continue
            hi, lo = min(r["curve"]["steps"][-1] for r in rs), max(r["curve"]["steps"][0] for r in rs)
            grid = np.linspace(lo, hi, 50) if hi > lo else np.array([lo])
            ys = np.array([np.interp(grid, r["curve"]["steps"], r["curve"]["reward"]) for r in rs])
            ax.plot(grid, np.mean(ys, axis=0), label=f"{arm} ({len(rs)})", lw=1.2)
        ax.set_title(experiment, fontsize=9)
        ax.set_xlabel("env steps (tokens)", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        if arms:
            ax.legend(fontsize=6)
    axes[0].set_ylabel("mean training reward (mean over seeds)", fontsize=8)
    fig.tight_layout()
    save_figure_atomic(fig, path)
    plt.close(fig)


def _plot_profiles(results: dict[str, Any], path: Path) -> None:
    """Performance profiles (fraction of runs with final reward above tau, Agarwal et al. 2021) of ``long``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from sb3_grpo.compare import stats

    fig, ax = plt.subplots(figsize=(5.5, 3.8), dpi=100)
    arms = {"ppo": ("long", "ppo"), "grpo": ("long", "grpo"), "grpo+curriculum": ("curriculum", "grpo+curriculum")}
    finals = {k: V.finals(V.arm_runs(results["runs"], e, a)) for k, (e, a) in arms.items()}
    values = [v for f in finals.values() for v in f]
    if values:
        taus = np.linspace(min(values), max(values), 25)
        for name, f in finals.items():
            if not f:
                continue
            prof = stats.performance_profile(f, taus, n_resamples=1000)
            (line,) = ax.plot(taus, [p.value for p in prof], label=f"{name} ({len(f)})")
            low = [p.low if not math.isnan(p.low) else p.value for p in prof]
            high = [p.high if not math.isnan(p.high) else p.value for p in prof]
            ax.fill_between(taus, low, high, color=line.get_color(), alpha=0.2)
        ax.legend(fontsize=8)
    ax.set_xlabel("final reward tau (LongReview-v0)")
    ax.set_ylabel("fraction of runs with final reward > tau")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    save_figure_atomic(fig, path)
    plt.close(fig)
