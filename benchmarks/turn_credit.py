"""``textrl-bench turn-credit``: turn-level group credit against episode-level group advantages on the interactive
ids, and the reward-redistribution ablation on ``LongReview-v0``, written as one results page.

Each study is one ``sb3-grpo compare`` run (its own out dir, ``results.json``, report and curves); the page collects
their final-reward IQMs with 95% bootstrap intervals and, for each pair that the question is about, the relative
difference of the IQMs and the probability of improvement with their intervals, and a verdict that says "resolved"
only when the difference's interval excludes 0::

    textrl-bench turn-credit                       # every study, 5 seeds; writes docs/results/turn-credit.md
    textrl-bench turn-credit --reuse --out runs/tc # rewrite the page from the studies' results.json
"""

from __future__ import annotations

import argparse
import math
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks import RESULTS_DIR
from sb3_grpo.compare import stats
from sb3_grpo.compare.pages import write_results_page
from sb3_grpo.compare.report import summarize
from sb3_grpo.compare.results import load_results


@dataclass(frozen=True)
class Study:
    """One comparison: an env, the algorithms, the pairs the page judges, and the compare options."""

    name: str
    env: str
    algos: tuple[str, ...]
    pairs: tuple[tuple[str, str], ...]  # (candidate, baseline)
    timesteps: int
    options: tuple[str, ...] = field(default_factory=tuple)
    question: str = ""


STUDIES = (
    Study(
        "guess-number",
        "GuessNumber-v0",
        ("ppo-turn", "ppo-rloo", "grpo-group"),
        (("ppo-turn", "ppo-rloo"), ("ppo-turn", "grpo-group")),
        6144,
        ("--set", "*.n_steps=48"),
        "Does turn-level credit learn faster than episode-level group advantages?",
    ),
    Study(
        "tool-arithmetic",
        "ToolArithmetic-v0",
        ("ppo-turn", "ppo-rloo", "grpo-group"),
        (("ppo-turn", "ppo-rloo"), ("ppo-turn", "grpo-group")),
        6144,
        ("--set", "*.n_steps=48"),
        "Does turn-level credit learn faster than episode-level group advantages?",
    ),
    Study(
        "long-review",
        "LongReview-v0",
        ("ppo-seq", "ppo-redistribute", "ppo-redistribute-uniform"),
        (("ppo-redistribute", "ppo-seq"), ("ppo-redistribute-uniform", "ppo-seq")),
        4096,
        ("--n-envs", "8", "--set", "*.n_steps=96", "--set", "*.batch_size=192"),
        "Does spreading the end-of-episode reward over the 96 tokens (reward redistribution) help PPO?",
    ),
)


def compare_argv(study: Study, seeds: int, out: Path) -> list[str]:
    """The ``sb3-grpo compare`` arguments of a study."""
    return [
        "compare",
        "--env",
        study.env,
        "--algos",
        ",".join(study.algos),
        "--seeds",
        str(seeds),
        "--timesteps",
        str(study.timesteps),
        *study.options,
        "--no-progress",
        "--overwrite",
        "--out",
        str(out),
    ]


def _ci(e: dict[str, float], pct: bool = False) -> str:
    scale, unit = (100.0, "%") if pct else (1.0, "")
    if e is None or math.isnan(e["value"]):
        return "–"
    if math.isnan(e["low"]):
        return f"{scale * e['value']:.3g}{unit}"
    return (
        f"{scale * e['value']:+.1f}{unit} [{scale * e['low']:+.1f}, {scale * e['high']:+.1f}]"
        if pct
        else (f"{e['value']:.3f} [{e['low']:.3f}, {e['high']:.3f}]")
    )


def verdict(diff: stats.Estimate, candidate: str, baseline: str, finals: list[float]) -> str:
    """The pair's verdict: "resolved" only when the interval of the relative difference excludes 0.

    :param finals: Both algorithms' final rewards (to say why there is no interval).
    """
    if len(set(finals)) == 1:
        return f"nothing to tell apart: every run of both scored {finals[0]:.3f} (no learning at this budget)"
    if math.isnan(diff.value):
        return "not resolved: the baseline's IQM is 0, so the relative difference is undefined"
    if math.isnan(diff.low):
        return "not resolved (no interval: too few seeds)"
    if diff.excludes(0.0):
        side = "above" if diff.value > 0 else "below"
        return f"resolved: `{candidate}` ends {side} `{baseline}`"
    return "not resolved: the interval of the difference contains 0"


def study_section(study: Study, results: dict, command: str) -> str:
    """One study's section of the page."""
    summary = summarize(results)
    cfg = results["config"]
    commit = results.get("environment", {}).get("commit") or "unknown"
    lines = [f"## {study.env}", "", study.question, "", f"Command: `{results.get('command', command)}` (commit "]
    lines[-1] += f"`{commit}`, {results.get('session_wall_s', math.nan):.0f} s)"
    untrained = results.get("untrained", {}).get("reward_mean", math.nan)
    lines += [
        "",
        f"{len(cfg['algos'])} algorithms x {len(cfg['seeds'])} seeds x {cfg['timesteps']:,} env steps (tokens), "
        f"{cfg['n_envs']} envs; final reward: a separate evaluation after training "
        f"({cfg['eval_episodes']} episodes); the untrained policy scores {untrained:.3f} there.",
    ]
    lines += ["", "| algorithm | seeds | final reward IQM [95% CI] | AUC | wall time (s) |", "|---|---|---|---|---|"]
    for algo, s in summary.items():
        lines.append(
            f"| {algo} | {len(s['seeds_done'])}/{len(cfg['seeds'])} | {_ci(s['final_iqm'])} | {s['auc_mean']:.3f} | "
            f"{s['wall_time_s']:.1f} |"
        )
    lines += ["", "| pair | IQM difference (relative) [95% CI] | P(candidate > baseline) [95% CI] | verdict |"]
    lines.append("|---|---|---|---|")
    for candidate, baseline in study.pairs:
        if candidate not in summary or baseline not in summary:
            lines.append(f"| `{candidate}` vs `{baseline}` | – | – | not run |")
            continue
        x, y = summary[candidate]["finals"], summary[baseline]["finals"]
        diff = stats.relative_difference(x, y, seed=1)
        p = stats.probability_of_improvement(x, y, seed=2)
        p_text = "–" if math.isnan(p.value) else f"{p.value:.2f} [{p.low:.2f}, {p.high:.2f}]"
        lines.append(
            f"| `{candidate}` vs `{baseline}` | {_ci(diff.as_dict(), pct=True)} | {p_text} | "
            f"{verdict(diff, candidate, baseline, [*x, *y])} |"
        )
    return "\n".join(lines) + "\n"


INTRO = """Turn-level group credit (`advantage="group_turn"`, {doc}`/algorithms/turn_credit`) against
episode-level group advantages (`ppo-rloo`: the same leave-one-out baseline per episode; `grpo-group`: today's GRPO
with DeepSeekMath's group advantage), and the reward-redistribution ablation
({doc}`/algorithms/reward_redistribution`). `ppo-*` rows are GRPO with every other extra off, so a pair of them
differs only in the advantage (or the rewards). A verdict says "resolved" only where the 95% bootstrap interval of the
relative IQM difference excludes 0 (Agarwal et al., NeurIPS 2021); the budgets are small (minutes on two CPU cores),
so an unresolved pair says that these runs cannot tell, not that the methods are equal.
"""


def main(argv: list[str] | None = None) -> int:
    """``textrl-bench turn-credit [--seeds K] [--out DIR] [--page PATH] [--only NAME ...] [--reuse]``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="textrl-bench turn-credit", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=5, help="seeds per algorithm (default 5; intervals need 5)")
    parser.add_argument("--out", default="runs/turn-credit", help="folder of the studies' compare out dirs")
    parser.add_argument("--page", default=str(RESULTS_DIR / "turn-credit.md"), help="the results page to write")
    parser.add_argument("--only", nargs="+", choices=[s.name for s in STUDIES], default=None, help="some studies")
    parser.add_argument("--reuse", action="store_true", help="do not run: read each study's results.json")
    args = parser.parse_args(argv)
    if args.seeds < 1:
        parser.error("--seeds must be >= 1")
    from sb3_grpo.cli import main as sb3_grpo_main

    sections = []
    for study in STUDIES:
        if args.only is not None and study.name not in args.only:
            continue
        out = Path(args.out) / study.name
        compare = compare_argv(study, args.seeds, out)
        if not args.reuse:
            status = sb3_grpo_main(compare)
            if status != 0:
                return status
        sections.append(study_section(study, load_results(out), shlex.join(["sb3-grpo", *compare])))
    command = shlex.join(["textrl-bench", "turn-credit", *argv])
    body = INTRO + "\n" + "\n".join(sections)
    page = write_results_page(args.page, "Turn-level credit and reward redistribution", body, command)
    print(f"wrote {page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
