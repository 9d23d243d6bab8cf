"""What a comparison is: :class:`CompareConfig`, built and checked by :func:`make_config` before anything runs.

Every input of ``sb3-grpo compare`` is validated here (names, numbers, overrides, groups), so a bad command fails
before the out dir is touched; :func:`resolve_hyperparameters` gives each algorithm its constructor arguments.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sb3_grpo.compare.algos import (
    ALGOS,
    DEFAULT_GROUP_SIZE,
    AlgoSpec,
    constructor_defaults,
    constructor_parameters,
    needs_groups,
)
from sb3_grpo.file_io import to_jsonable
from textrl_envs.hf_loading import cached_commit, hub_cache_dir, hub_offline, looks_like_hub_id
from textrl_envs.validation import check_float

__all__ = [
    "TEXT_DEFAULTS",
    "CompareConfig",
    "CompareError",
    "check_env_id",
    "check_env_kwargs",
    "check_hyperparameters",
    "check_policy_kwargs",
    "is_text_env",
    "make_config",
    "resolve_hyperparameters",
]

#: Hyperparameters of every algorithm on a text env, unless overridden (tuned for the bundled LM on CPU:
#: see the docs' comparison guide). Rollouts of ``n_envs x n_steps`` tokens; gamma 1 because the
#: reward comes at the end of the completion.
TEXT_DEFAULTS: dict[str, Any] = {
    "n_steps": 32,
    "batch_size": 256,
    "n_epochs": 1,
    "learning_rate": 3e-4,
    "gamma": 1.0,
    "gae_lambda": 0.95,
    "clip_range": 0.2,
    "ent_coef": 0.0,
    "vf_coef": 0.5,
    "max_grad_norm": 0.5,
}
TEXT_N_ENVS = 16
TEXT_EVAL_EPISODES = 128
CLASSIC_N_ENVS = 1
CLASSIC_EVAL_EPISODES = 10


class CompareError(ValueError):
    """A comparison that cannot run as asked (bad names, numbers, out dir); the message says what to do."""


@dataclass
class CompareConfig:
    """Everything that defines a comparison (what ``results.json`` stores under ``config``).

    :param env_id: A registered Gymnasium id (text env of ``textrl_envs`` or any other).
    :param env_kwargs: Keyword arguments of ``gym.make`` (``--env-kwargs``), for training and evaluation envs alike.
    :param algos: Names from :data:`~sb3_grpo.compare.algos.ALGOS`.
    :param seeds: Seeds (``--seeds K`` gives ``0 .. K-1``).
    :param timesteps: Env steps per run (tokens, for text envs).
    :param n_envs: Envs stepped in parallel.
    :param group_size: Envs per prompt group for group-advantage algorithms (others use 1).
    :param eval_episodes: Episodes of the final evaluation.
    :param eval_deterministic: Greedy actions in the evaluation (``None``: greedy for non-text envs,
        sampled from the policy for text envs).
    :param device: ``"auto"``, ``"cpu"``, ``"cuda"``.
    :param overrides: Per algorithm name (or ``"*"``), constructor arguments on top of the defaults.
    :param threshold: Reward the ``steps to threshold`` column waits for (``None``: halfway from the untrained
        policy to the best final reward).
    :param text: Whether ``env_id`` is a text env (set by :func:`make_config`).
    :param hyperparameters: The resolved constructor arguments per algorithm (set by :func:`make_config`).
    :param group_sizes: The group size each algorithm's envs use (set by :func:`make_config`).
    :param lm_eval: Evaluation on held-out prompts during every run (``--eval-every``; ``None``: none), as
        :func:`sb3_grpo.compare.heldout.make_lm_eval` returns it.
    """

    env_id: str
    algos: list[str]
    seeds: list[int]
    timesteps: int
    n_envs: int
    group_size: int = DEFAULT_GROUP_SIZE
    eval_episodes: int = TEXT_EVAL_EPISODES
    eval_deterministic: bool | None = None
    device: str = "auto"
    overrides: dict[str, dict[str, Any]] = field(default_factory=dict)
    threshold: float | None = None
    text: bool = False
    hyperparameters: dict[str, dict[str, Any]] = field(default_factory=dict)
    group_sizes: dict[str, int] = field(default_factory=dict)
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    lm_eval: dict[str, Any] | None = None

    def run_key(self, algo: str, seed: int) -> str:
        """Key of one run in ``results.json["runs"]``."""
        return f"{algo}/seed{seed}"

    def fingerprint(self, algo: str) -> dict[str, Any]:
        """What must be equal for a stored run of ``algo`` to count as done under this config."""
        out = {
            "env_id": self.env_id,
            "env_kwargs": self.env_kwargs,
            "timesteps": self.timesteps,
            "n_envs": self.n_envs,
            "group_size": self.group_sizes.get(algo),
            "eval_episodes": self.eval_episodes,
            "eval_deterministic": self.eval_deterministic,
            "hyperparameters": self.hyperparameters.get(algo),
        }
        if self.lm_eval:  # only then: runs stored before evaluation existed keep their fingerprint
            out["lm_eval"] = self.lm_eval
        return out


# ------------------------------------------------------------------------------------------------------------
# Building the config (all validation happens here, before anything touches the disk)
# ------------------------------------------------------------------------------------------------------------


def is_text_env(env_id: str) -> bool:
    """Whether ``env_id`` is one of ``textrl_envs``' text envs."""
    import textrl_envs

    return env_id in textrl_envs.ENV_IDS


def check_env_id(env_id: str) -> None:
    """Raise :class:`CompareError` when ``env_id`` is not a registered Gymnasium id.

    :param env_id: The id.
    """
    import gymnasium as gym

    import textrl_envs

    if env_id in gym.registry:
        return
    close = [k for k in gym.registry if k.lower().split("-")[0] == env_id.lower().split("-")[0]]
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    raise CompareError(
        f"unknown env {env_id!r}{hint}; text envs: {', '.join(textrl_envs.ENV_IDS)}; "
        "or any registered Gymnasium id, e.g. CartPole-v1, Pendulum-v1"
    )


def check_env_kwargs(env_id: str, env_kwargs: dict[str, Any]) -> None:
    """Make ``env_id`` once with ``env_kwargs`` (and close it): a bad argument fails here, before anything runs.

    :raises CompareError: with the env's own error.
    """
    import gymnasium as gym

    import textrl_envs  # noqa: F401  (registers the text ids)

    if not isinstance(env_kwargs, dict) or not all(isinstance(k, str) for k in env_kwargs):
        raise CompareError(f"--env-kwargs must be a JSON object of gym.make keyword arguments, got {env_kwargs!r}")
    try:
        gym.make(env_id, **env_kwargs).close()
    except Exception as err:  # noqa: BLE001  (whatever the env raises, say it before the out dir is touched)
        raise CompareError(
            f"--env-kwargs {env_kwargs}: {env_id} cannot be made with them: {_kind(err)}: {err}"
        ) from err


def _kind(err: BaseException) -> str:
    """The name of ``err``'s first built-in class (``ValueError`` for the checks' ``ArgumentValueError``)."""
    return next(c.__name__ for c in type(err).__mro__ if c.__module__ == "builtins")


def resolve_hyperparameters(
    spec: AlgoSpec,
    text: bool,
    n_envs: int,
    timesteps: int,
    overrides: dict[str, dict[str, Any]],
    engine: str | None = None,
) -> dict[str, Any]:
    """Constructor arguments of one algorithm: env-kind defaults, the algorithm's own, then the overrides.

    For non-text envs the defaults are SB3's, except that ``n_steps`` (and ``batch_size``) are lowered when
    one rollout would not fit in ``timesteps``.

    :param spec: The algorithm.
    :param text: Text env or not.
    :param n_envs: Number of envs.
    :param timesteps: Env steps of the run.
    :param overrides: ``{"*": {...}, name: {...}}``.
    :param engine: The rollout engine (``--engine``), set before the overrides (``None``: the class's default).
    :return: The keyword arguments (JSON-able) passed to the class besides policy, env, seed, device.
    """
    kwargs: dict[str, Any] = dict(TEXT_DEFAULTS) if text else {}
    if not text:
        n_steps = 2048
        if n_steps * n_envs > timesteps:
            n_steps = max(8, timesteps // n_envs)
            kwargs["n_steps"] = n_steps
            kwargs["batch_size"] = min(64, n_steps * n_envs)
    kwargs.update(spec.kwargs)
    if engine is not None:
        kwargs["engine"] = engine
    kwargs.update(overrides.get("*", {}))
    kwargs.update(overrides.get(spec.name, {}))
    return to_jsonable(kwargs)


def check_hyperparameters(spec: AlgoSpec, hyperparameters: dict[str, Any], text: bool) -> None:
    """Check one algorithm's constructor arguments with the checks its class runs (on top of its defaults), so a bad
    value (``--set ppo.learning_rate=abc``) fails here, before anything is written, not in the first run.

    :param spec: The algorithm.
    :param hyperparameters: Its resolved arguments (:func:`resolve_hyperparameters`).
    :param text: Text env (then ``policy_kwargs`` are checked against :class:`~sb3_grpo.policies.CausalLMPolicy`).
    :raises CompareError: naming the algorithm, the argument and what to pass.
    """
    from sb3_grpo.common.options.checks import check_ppo_args

    args = {**constructor_defaults(spec), **hyperparameters}
    try:
        if spec.cls_name == "PPO":
            check_ppo_args(args)
        else:  # the package's algorithm: PPO's checks, the shared options and its support of them, its own
            spec.algo_class().check_arguments(args)
        if text and args.get("policy_kwargs"):
            check_policy_kwargs(args["policy_kwargs"])
        if args.get("engine") == "vllm":
            check_vllm_available(args)
    except (TypeError, ValueError) as err:
        raise CompareError(f"{spec.name}: {err} (check --set / --config)") from None


def check_vllm_available(args: dict[str, Any]) -> None:
    """Refuse ``engine="vllm"`` before any run when vLLM is not installed, or with an exploration mixture it cannot
    sample (``explore_alpha > 0``), instead of a traceback once the first run has started.

    :raises ValueError: saying what to install or to change.
    """
    import importlib.util

    from sb3_grpo.engines.vllm_engine import VLLM_INSTALL_HINT

    if importlib.util.find_spec("vllm") is None:
        raise ValueError(
            f"engine 'vllm' needs vLLM, which is not installed here; install it ({VLLM_INSTALL_HINT}), or use "
            "--engine hf (the built-in decoder) or --engine step"
        )
    alpha = args.get("explore_alpha") or 0.0
    if isinstance(alpha, (int, float)) and alpha > 0:
        raise ValueError(
            f"engine 'vllm' samples from the policy alone, not from the exploration mixture (explore_alpha={alpha}); "
            "add --set '*.explore_alpha=0', or use --engine hf"
        )


def check_policy_kwargs(policy_kwargs: dict[str, Any]) -> None:
    """Check ``policy_kwargs`` meant for :class:`~sb3_grpo.policies.CausalLMPolicy` without building it (names, and
    the values :func:`check_policy_args` checks), e.g. a comparison's overrides before anything runs.

    :raises TypeError: for a name the policy does not take, or a value of a wrong type.
    :raises ValueError: for a value out of range.
    """
    from sb3_grpo.policies.causal_lm import CausalLMPolicy
    from sb3_grpo.policies.policy_kwargs import check_policy_args
    from textrl_envs.gguf import gguf_source, is_gguf_name

    params = inspect.signature(CausalLMPolicy.__init__).parameters
    taken = [n for n in params if n not in ("self", "observation_space", "action_space", "lr_schedule")]
    unknown = sorted(set(policy_kwargs) - set(taken))
    if unknown:
        raise TypeError(
            f"policy_kwargs has unknown name(s) {', '.join(unknown)}; CausalLMPolicy takes: {', '.join(taken)}"
        )
    args = {n: p.default for n, p in params.items() if n in taken}
    args.update(policy_kwargs)
    model = args["model"]
    if isinstance(model, (str, os.PathLike)) and os.path.isdir(model):
        if not os.path.isfile(os.path.join(model, "config.json")):
            raise ValueError(
                f"policy_kwargs['model'] = {os.fspath(model)!r} is a folder without a config.json, not a Hugging Face "
                "model folder; pass a folder written by model.save_pretrained(folder) (or warm-start --out), a Hub id, "
                "or leave it out for the bundled LM"
            )
    if is_gguf_name(model):  # a .gguf file or a packaged model: it must be here now (converted at the first run)
        try:
            gguf_source(model)
        except FileNotFoundError as err:
            raise ValueError(f"policy_kwargs['model'] = {os.fspath(model)!r}: {err}") from None
    elif isinstance(model, (str, os.PathLike)) and not os.path.isdir(model):
        if not looks_like_hub_id(str(model)):
            raise ValueError(
                f"policy_kwargs['model'] = {model!r} is neither a directory nor a Hub id; pass a local model "
                "directory, a Hugging Face Hub id such as 'org/name', or leave it out for the bundled LM"
            )
        if hub_offline() and cached_commit(str(model), args.get("revision")) is None:  # refused before any run
            raise ValueError(
                f"policy_kwargs['model'] = {model!r} is not a directory, and not in the Hugging Face cache at "
                f"{hub_cache_dir()} (HF_HUB_OFFLINE=1 forbids downloading it); pass a local model directory, fetch "
                f"it once online with `hf download {model}`, or leave it out for the bundled LM"
            )
    names = ("separate_critic", "use_cache", "pack_sequences", "share_prefixes", "gradient_checkpointing", "ortho_init")
    flags = {n: args[n] for n in names}
    check_policy_args(
        args["temperature"], args["top_k"], args["top_p"], args["critic_hidden"], args["value_head_init_std"], flags
    )


def make_config(
    env_id: str,
    algos: Sequence[str],
    seeds: int,
    timesteps: int,
    n_envs: int | None = None,
    group_size: int | None = None,
    eval_episodes: int | None = None,
    eval_deterministic: bool | None = None,
    device: str = "auto",
    overrides: dict[str, dict[str, Any]] | None = None,
    threshold: float | None = None,
    env_kwargs: dict[str, Any] | None = None,
    lm_eval: dict[str, Any] | None = None,
    engine: str | None = None,
) -> CompareConfig:
    """Check every input and resolve the defaults; raises :class:`CompareError` with what to do.

    :param env_id: Registered env id.
    :param env_kwargs: Keyword arguments of ``gym.make`` (checked by making the env once).
    :param algos: Algorithm names.
    :param seeds: Number of seeds (>= 1).
    :param timesteps: Env steps per run (>= 1).
    :param n_envs: Envs per run (``None``: 16 for text envs, 1 otherwise).
    :param group_size: Group size of group-advantage algorithms (``None``: 4).
    :param eval_episodes: Evaluation episodes (``None``: 128 for text envs, 10 otherwise).
    :param eval_deterministic: See :class:`CompareConfig`.
    :param device: Torch device for model and text env.
    :param overrides: Per-algorithm constructor overrides (``"*"`` for all).
    :param threshold: See :class:`CompareConfig`.
    :param lm_eval: Evaluation during training: the keyword arguments of
        :func:`~sb3_grpo.compare.heldout.make_lm_eval` besides the env (``every``, ``prompts``, ``k``,
        ``success_threshold``, ``reference_model``); ``None``: none.
    :param engine: The rollout engine (:mod:`sb3_grpo.engines.turn_queues`) of every algorithm that takes ``engine=``
        (all but stock ``ppo``, which keeps SB3's loop); a per-algorithm override wins. ``None``: each class's default.
    :return: The config.
    """

    unknown = [a for a in algos if a not in ALGOS]
    if unknown:
        raise CompareError(f"unknown algorithm(s) {', '.join(map(repr, unknown))}; known: {', '.join(ALGOS)}")
    if not algos:
        raise CompareError(f"no algorithm given; known: {', '.join(ALGOS)}")
    for name, value in (("--seeds", seeds), ("--timesteps", timesteps)):
        if not isinstance(value, int) or value < 1:
            raise CompareError(f"{name} must be an integer >= 1, got {value}")
    for name, value in (("--n-envs", n_envs), ("--group-size", group_size), ("--eval-episodes", eval_episodes)):
        if value is not None and (not isinstance(value, int) or value < 1):
            raise CompareError(f"{name} must be an integer >= 1, got {value}")
    if threshold is not None:
        threshold = check_float("--threshold", threshold, hint="a reward level, e.g. --threshold 0.5, or leave it out")
    check_env_id(env_id)
    text = is_text_env(env_id)
    overrides = dict(overrides or {})
    _check_overrides(overrides, algos)
    engines = engine_overrides(engine, algos, text, env_id)
    env_kwargs = dict(env_kwargs or {})
    check_env_kwargs(env_id, env_kwargs)
    n_envs = n_envs if n_envs is not None else (TEXT_N_ENVS if text else CLASSIC_N_ENVS)
    unique = list(dict.fromkeys(algos))
    resolved = {
        a: resolve_hyperparameters(ALGOS[a], text, n_envs, timesteps, overrides, engines.get(a)) for a in unique
    }
    # grouped: a group advantage, the algorithm's own or one set with --set / --config (e.g. grpo.advantage="group")
    grouped = [
        a
        for a in unique
        if ("advantage" in resolved[a] and needs_groups(resolved[a]["advantage"]))
        or ("advantage" not in resolved[a] and ALGOS[a].grouped)
    ]
    group = _check_groups(grouped, env_id, text, n_envs, group_size)
    cfg = CompareConfig(
        env_id=env_id,
        algos=list(dict.fromkeys(algos)),
        seeds=list(range(seeds)),
        timesteps=timesteps,
        n_envs=n_envs,
        group_size=group,
        eval_episodes=eval_episodes
        if eval_episodes is not None
        else (TEXT_EVAL_EPISODES if text else CLASSIC_EVAL_EPISODES),
        eval_deterministic=eval_deterministic,
        device=device,
        overrides=to_jsonable(overrides),
        threshold=threshold,
        text=text,
        env_kwargs=to_jsonable(env_kwargs),
    )
    if lm_eval is not None:
        from sb3_grpo.compare.heldout import make_lm_eval

        if not isinstance(lm_eval, dict) or "every" not in lm_eval:
            raise CompareError(f'the evaluation settings need "every" (--eval-every N), got {lm_eval!r}')
        known = {"every", "prompts", "k", "success_threshold", "reference_model"}
        unknown = sorted(set(lm_eval) - known)
        if unknown:
            raise CompareError(f"unknown evaluation setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        try:
            cfg.lm_eval = to_jsonable(make_lm_eval(env_id, cfg.env_kwargs, **lm_eval))
        except ValueError as err:
            raise CompareError(str(err)) from None
    for algo in cfg.algos:
        spec = ALGOS[algo]
        cfg.hyperparameters[algo] = resolved[algo]
        cfg.group_sizes[algo] = group if algo in grouped else 1
        check_hyperparameters(spec, cfg.hyperparameters[algo], text)
    return cfg


def engine_overrides(engine: str | None, algos: Sequence[str], text: bool, env_id: str) -> dict[str, str]:
    """``--engine``: the algorithms it applies to (those whose class takes ``engine=``) and the engine, checked.

    :raises CompareError: for an unknown engine, an engine other than ``"step"`` on a non-text env, or ``--algos``
        with no algorithm that takes it.
    """
    from sb3_grpo.engines import check_engine

    if engine is None:
        return {}
    try:
        check_engine(engine)
    except ValueError as err:
        raise CompareError(f"--engine: {err}") from None
    if engine != "step" and not text:
        raise CompareError(
            f"--engine {engine} computes the tokens of a text rollout, and {env_id!r} is not a text env; drop --engine "
            "(or pass --engine step)"
        )
    takers = {a: engine for a in dict.fromkeys(algos) if "engine" in constructor_parameters(ALGOS[a])}
    if not takers:
        raise CompareError(
            f"--engine {engine}: none of --algos ({', '.join(algos)}) takes an engine (stock ppo keeps SB3's own "
            "loop); add one of the package's algorithms, e.g. grpo-group"
        )
    return takers


def _check_overrides(overrides: dict[str, dict[str, Any]], algos: Sequence[str]) -> None:
    """Every override names a known algorithm (or ``"*"``) and only parameters its class takes."""
    bad = [k for k in overrides if k != "*" and k not in ALGOS]
    if bad:
        raise CompareError(
            f"override for unknown algorithm(s) {', '.join(map(repr, bad))}; known: {', '.join(ALGOS)} (or '*' for all)"
        )
    unused = [k for k in overrides if k != "*" and k not in algos]
    if unused:
        raise CompareError(
            f"override for {', '.join(map(repr, unused))}, which is not in --algos ({', '.join(algos)}), so it "
            f"would be ignored; add {unused[0]} to --algos, or drop the override ('*.KEY=VALUE' sets every algorithm)"
        )
    for name, values in overrides.items():
        targets = list(algos) if name == "*" else [name]
        for target in targets:
            allowed = constructor_parameters(ALGOS[target])
            wrong = sorted(set(values) - allowed)
            if wrong:
                raise CompareError(
                    f"{target} has no parameter {', '.join(map(repr, wrong))}; "
                    f"its parameters: {', '.join(sorted(allowed))}"
                )


def _check_groups(grouped: Sequence[str], env_id: str, text: bool, n_envs: int, group_size: int | None) -> int:
    """The group size of the group-advantage algorithms ``grouped``, after checking that the env and ``n_envs``
    allow it."""
    if group_size is not None and group_size < 2 and grouped:
        raise CompareError(f"--group-size must be >= 2 for group-advantage algorithms ({', '.join(grouped)})")
    group = group_size if group_size is not None else DEFAULT_GROUP_SIZE
    if grouped:
        if not text:
            raise CompareError(
                f"{', '.join(grouped)} need(s) envs in prompt groups (group_size > 1), which only the text envs "
                f"({', '.join(sorted(_text_ids()))}) provide; {env_id!r} is not one. Drop them from --algos"
            )
        if n_envs % group != 0:
            raise CompareError(
                f"--n-envs ({n_envs}) must be a multiple of the group size ({group}) for {', '.join(grouped)}"
            )
    return group


def _text_ids() -> list[str]:
    import textrl_envs

    return list(textrl_envs.ENV_IDS)
