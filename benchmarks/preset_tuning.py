"""``textrl-bench tune-presets``: check the presets' own numbers (those marked "ours, untuned") with an Optuna search.

The presets (:data:`sb3_grpo.presets.PRESETS`) take their numbers from papers where the papers give them; the rest
(learning rate for small models, epochs, gradient clip, KL coefficient, DAPO's sampling bounds) are the package's
choices. This command searches those knobs the way rl-zoo3 tunes SB3's algorithms: Optuna's TPE sampler (Bergstra et
al., NeurIPS 2011; seeded, so the trials are reproducible), one study per preset, the preset's own values enqueued as
trial 0, every trial trained by ``sb3-grpo compare``'s runner on the tuning seeds (``1000 + i``, disjoint from the
evaluation seeds ``0 .. n-1``) and scored by the mean of their final evaluation rewards. Then the best trial and the
preset are both trained again on the evaluation seeds, and the page compares them there (IQM with bootstrap
intervals, as ``compare`` reports), so that a trial that only won on the tuning seeds' noise is seen as such::

    textrl-bench tune-presets --presets ppo-lm,grad-reg-grpo --trials 12 --page docs/results/preset_tuning.md

Needs the ``tune`` extra (``pip install "textrl[tune]"``, Optuna).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
import warnings
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from sb3_grpo.compare.algos import PRESET_PREFIX
from sb3_grpo.compare.pages import write_results_page
from sb3_grpo.compare.stats import iqm_estimate, relative_difference

__all__ = ["SEARCH_SPACES", "TUNING_SEED_BASE", "main", "search_space", "tune_preset"]

#: Tuning seeds are ``TUNING_SEED_BASE + i``: disjoint from the evaluation seeds ``0 .. n-1``.
TUNING_SEED_BASE = 1000
#: Seed of the TPE sampler.
SAMPLER_SEED = 20261202

#: Per preset, its own knobs (the numbers its source marks "ours") and their ranges:
#: ``("log", low, high)`` a log-uniform float, ``("float", low, high)``, ``("int", low, high)``, or a list of choices.
SEARCH_SPACES: dict[str, dict[str, Any]] = {
    "ppo-lm": {
        "learning_rate": ("log", 1e-6, 1e-3),
        "kl_coef": ("float", 0.0, 0.2),
        "n_epochs": ("int", 1, 4),
        "max_grad_norm": [0.5, 1.0, 2.0],
    },
    "grad-reg-grpo": {
        "learning_rate": ("log", 1e-6, 1e-3),
        "n_epochs": ("int", 1, 4),
        "max_grad_norm": [0.5, 1.0, 2.0],
    },
    "dr-grpo": {"learning_rate": ("log", 1e-6, 1e-3), "max_grad_norm": [0.5, 1.0, 2.0]},
    "gspo": {"learning_rate": ("log", 1e-6, 1e-3), "max_grad_norm": [0.5, 1.0, 2.0]},
    "cispo": {"learning_rate": ("log", 1e-6, 1e-3), "max_grad_norm": [0.5, 1.0, 2.0]},
    "dapo": {
        "learning_rate": ("log", 1e-6, 1e-3),
        "min_informative_groups": ("int", 1, 4),
        "max_sampling_rollouts": ("int", 1, 4),
        "max_grad_norm": [0.5, 1.0, 2.0],
    },
}


def search_space(preset: str) -> dict[str, Any]:
    """The knobs searched for ``preset`` (:data:`SEARCH_SPACES`), or a ``ValueError`` listing the tunable ones."""
    if preset not in SEARCH_SPACES:
        raise ValueError(f"no search space for preset {preset!r}; tunable: {', '.join(SEARCH_SPACES)}")
    return SEARCH_SPACES[preset]


def _suggest(trial: Any, name: str, spec: Any) -> Any:
    if isinstance(spec, list):
        return trial.suggest_categorical(name, spec)
    kind, low, high = spec
    if kind == "log":
        return trial.suggest_float(name, low, high, log=True)
    if kind == "float":
        return trial.suggest_float(name, low, high)
    return trial.suggest_int(name, low, high)


def _train_scores(
    env_id: str, preset: str, params: dict[str, Any], seeds: Sequence[int], timesteps: int, out: Path
) -> list[float]:
    """Final evaluation reward of ``preset`` with ``params`` on top, one compare run per seed."""
    from sb3_grpo.compare.config import make_config
    from sb3_grpo.compare.runner import run_one

    algo = f"{PRESET_PREFIX}{preset}"
    cfg = make_config(env_id, [algo], seeds=1, timesteps=timesteps, device="cpu", overrides={algo: params})
    scores = []
    for seed in seeds:
        run = run_one(replace(cfg, seeds=[seed]), algo, seed, out)
        scores.append(float(run["final"]["reward_mean"]))
    return scores


def tune_preset(
    preset: str, env_id: str, trials: int, tuning_seeds: int, eval_seeds: int, timesteps: int, out: Path
) -> dict[str, Any]:
    """One preset's study: the trials on the tuning seeds, then the best and the preset on the evaluation seeds.

    :return: ``{"preset", "own", "trials": [{"number", "params", "scores", "score"}], "best", "confirm": {...}}``.
    """
    import optuna

    from sb3_grpo.presets import PRESETS

    space = search_space(preset)
    own = {name: PRESETS[preset].kwargs[name] for name in space}
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=SAMPLER_SEED))
    study.enqueue_trial(own)
    seeds = [TUNING_SEED_BASE + i for i in range(tuning_seeds)]
    records: list[dict[str, Any]] = []

    def objective(trial: Any) -> float:
        params = {name: _suggest(trial, name, spec) for name, spec in space.items()}
        start = time.perf_counter()
        scores = _train_scores(env_id, preset, params, seeds, timesteps, out / preset / f"trial{trial.number}")
        score = float(np.mean(scores))
        records.append({"number": trial.number, "params": params, "scores": scores, "score": score})
        print(f"  {preset} trial {trial.number}: {params} -> {score:.3f} ({time.perf_counter() - start:.0f} s)")
        return score

    study.optimize(objective, n_trials=trials)
    best = max(records, key=lambda r: (r["score"], -r["number"]))  # the first on ties
    confirm = {}
    eval_list = list(range(eval_seeds))
    for label, params in (("preset", own), ("best", best["params"])):
        confirm[label] = _train_scores(env_id, preset, params, eval_list, timesteps, out / preset / f"confirm-{label}")
    return {"preset": preset, "own": own, "trials": records, "best": best, "confirm": confirm}


def _fmt_params(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())


def _ci(e: Any, pct: bool = False) -> str:
    spec = "+.1%" if pct else ".3f"
    if not (np.isfinite(e.low) and np.isfinite(e.high)):
        return f"{e.value:{spec}} (no interval: too few seeds)"
    return f"{e.value:{spec}} [{e.low:{spec}}, {e.high:{spec}}]"


def render(studies: list[dict[str, Any]], env_id: str, args: argparse.Namespace) -> str:
    """The results page's body."""
    lines = [
        f"Optuna TPE (seed {SAMPLER_SEED}), {args.trials} trials per preset on `{env_id}` with the bundled LM, "
        f"{args.timesteps:,} env steps (tokens) per run, `compare`'s text defaults under the preset's arguments. "
        f"Each trial is scored by the mean final evaluation reward of {args.tuning_seeds} tuning seeds "
        f"({TUNING_SEED_BASE}+); trial 0 is the preset's own values. The best trial and the preset are then trained "
        f"on {args.eval_seeds} evaluation seeds (0+), and compared there: IQM with 95% bootstrap intervals.",
        "",
    ]
    for study in studies:
        preset, own = study["preset"], study["own"]
        ranked = sorted(study["trials"], key=lambda r: -r["score"])
        rank = 1 + [r["number"] for r in ranked].index(0)
        lines += [f"## `{preset}`", "", f"Searched: {_fmt_params(own)} (the preset's values).", ""]
        lines += ["| trial | arguments | tuning scores | mean |", "|---|---|---|---|"]
        for r in ranked:
            mark = " (the preset)" if r["number"] == 0 else ""
            scores = ", ".join(f"{s:.3f}" for s in r["scores"])
            lines.append(f"| {r['number']}{mark} | {_fmt_params(r['params'])} | {scores} | {r['score']:.3f} |")
        preset_scores, best_scores = study["confirm"]["preset"], study["confirm"]["best"]
        e_preset, e_best = iqm_estimate(preset_scores), iqm_estimate(best_scores)
        diff = relative_difference(best_scores, preset_scores)
        best = study["best"]
        lines += [
            "",
            f"The preset's values rank {rank} of {len(ranked)} on the tuning seeds; the best is trial "
            f"{best['number']} ({_fmt_params(best['params'])}).",
            "",
            "| on the evaluation seeds | final reward IQM [95% CI] |",
            "|---|---|",
            f"| the preset | {_ci(e_preset)} |",
            f"| the best trial | {_ci(e_best)} |",
            f"| best vs preset | {_ci(diff, pct=True)} |",
            "",
        ]
        if best["number"] == 0:
            verdict = "The search found nothing better than the preset's values on the tuning seeds."
        elif not np.isfinite(diff.low):
            verdict = "Too few evaluation seeds for an interval: nothing is resolved."
        elif diff.low > 0:
            verdict = (
                "The best trial beats the preset on the evaluation seeds too (the interval excludes 0): on this task "
                "and model its values are better than the preset's."
            )
        else:
            verdict = (
                "On the evaluation seeds the interval of the difference contains 0 (or is below it): the search's "
                "gain on the tuning seeds is not confirmed, and the preset's values stand."
            )
        lines += [verdict, ""]
    lines += [
        "What this checks: the presets' own numbers on the bundled 1M-parameter LM and a short budget. A preset's "
        "learning rate is for the models its source trained (and the docs say to raise it for small models); the "
        "search says which values suit a small model here, not a 7B model.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``textrl-bench tune-presets``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default="ppo-lm", help=f"comma-separated, of: {', '.join(SEARCH_SPACES)}")
    parser.add_argument("--env", default="TextGen-v0", help="the task (a registered text env id)")
    parser.add_argument("--trials", type=int, default=12, help="trials per preset (trial 0 is the preset)")
    parser.add_argument("--tuning-seeds", type=int, default=2, help="seeds per trial")
    parser.add_argument("--eval-seeds", type=int, default=5, help="seeds of the confirmation runs")
    parser.add_argument("--timesteps", type=int, default=4096, help="env steps (tokens) per run")
    parser.add_argument("--out", default="runs/preset-tuning", help="where the runs' logs go")
    parser.add_argument("--page", default=None, help="write the results page here (e.g. docs/results/...)")
    args = parser.parse_args(argv)
    try:
        import optuna  # noqa: F401  (the extra's presence, checked before any run)
    except ImportError:
        print('textrl-bench tune-presets needs Optuna: pip install "textrl[tune]"', file=sys.stderr)
        return 2
    presets = [p.strip() for p in args.presets.split(",") if p.strip()]
    for name in presets:
        try:
            search_space(name)
        except ValueError as err:
            parser.error(str(err))
    for name, value in (("--trials", args.trials), ("--tuning-seeds", args.tuning_seeds)):
        if value < 1:
            parser.error(f"{name} must be >= 1, got {value}")
    if args.eval_seeds < 2:
        parser.error(f"--eval-seeds must be >= 2 (an interval needs several seeds), got {args.eval_seeds}")
    import textrl_envs  # noqa: F401  (registers the ids)

    warnings.filterwarnings("ignore", category=UserWarning)
    studies = []
    for name in presets:
        print(f"tuning {name} on {args.env}: {args.trials} trials x {args.tuning_seeds} seeds", flush=True)
        studies.append(
            tune_preset(name, args.env, args.trials, args.tuning_seeds, args.eval_seeds, args.timesteps, Path(args.out))
        )
    body = render(studies, args.env, args)
    print(body)
    if args.page:
        command = shlex.join(["textrl-bench", "tune-presets", *(sys.argv[1:] if argv is None else argv)])
        write_results_page(args.page, "The presets' own numbers, checked by a search", body, command)
        print(f"wrote {args.page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
