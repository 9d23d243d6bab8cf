"""Evaluation during a comparison's runs: which prompts are held out, and the :class:`LMEvalCallback` of each run.

``sb3-grpo compare --eval-every N`` evaluates every run on prompts its training never sees:

- ``--eval-prompts heldout`` (the default): for a task with a prompt list (its own or ``--env-kwargs``' ``prompts``),
  a seeded draw of :func:`heldout_count` of its prompts is set aside; the runs train (and are finally evaluated) on
  the rest and :class:`~sb3_grpo.callbacks.LMEvalCallback` evaluates on the held-out ones. For ``ReasoningGym-v0``
  the held-out items are those of another generator seed (``seed + HELDOUT_SEED_OFFSET``).
- ``--eval-prompts FILE``: the prompts of a ``.jsonl`` / ``.json`` / ``.csv`` / ``.txt`` file; the runs train on the
  env's prompts unchanged.

What a run records (``results.json["runs"][key]["lm_eval"]``): every evaluation's metrics during training and the
``final`` ones, measured once more after training; :func:`sb3_grpo.compare.report.summarize` reduces the final ones
over seeds.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = [
    "HELDOUT",
    "HELDOUT_FRACTION",
    "HELDOUT_MAX",
    "HELDOUT_SEED_OFFSET",
    "eval_env_kwargs",
    "heldout_count",
    "make_eval_callback",
    "make_lm_eval",
    "reported_metrics",
    "split_heldout",
    "train_env_kwargs",
]

#: The ``--eval-prompts`` value that holds out some of the env's own prompts.
HELDOUT = "heldout"
#: Share of a prompt list held out (at least 1, at most :data:`HELDOUT_MAX`; at least 1 prompt is left to train on).
HELDOUT_FRACTION = 0.2
HELDOUT_MAX = 16
#: Seed of the draw of the held-out prompts (the same for every run of a comparison).
HELDOUT_DRAW_SEED = 0
#: reasoning-gym: the held-out items are generated with ``seed + HELDOUT_SEED_OFFSET``.
HELDOUT_SEED_OFFSET = 1_000_003
#: Keys of a run's final evaluation that the report shows (``pass@<k>`` is added for each configured ``k``).
REPORTED_METRICS = (
    "greedy_reward_mean",
    "sampled_reward_mean",
    "greedy_pass",
    "completion_length",
    "greedy_completion_length",
    "distinct_1",
    "distinct_2",
    "repetition",
    "perplexity",
)


def heldout_count(n_prompts: int) -> int:
    """How many of ``n_prompts`` prompts are held out: ``round(HELDOUT_FRACTION * n)``, at least 1, at most
    :data:`HELDOUT_MAX` and at most ``n - 1`` (0 when ``n < 2``: nothing can be held out)."""
    if n_prompts < 2:
        return 0
    return int(min(max(1, round(HELDOUT_FRACTION * n_prompts)), HELDOUT_MAX, n_prompts - 1))


def split_heldout(n_prompts: int, n_heldout: int, seed: int = HELDOUT_DRAW_SEED) -> list[int]:
    """The indices of the held-out prompts: ``n_heldout`` of ``range(n_prompts)`` drawn without replacement with
    ``numpy.random.default_rng(seed)``, sorted."""
    rng = np.random.default_rng(seed)
    return sorted(int(i) for i in rng.choice(n_prompts, size=n_heldout, replace=False))


def _prompt_items(env_id: str, env_kwargs: dict[str, Any]) -> list[Any] | None:
    """The prompt items an env of ``env_id`` made with ``env_kwargs`` plays (``None``: an external suite)."""
    from textrl_envs.data import load_prompts
    from textrl_envs.tasks import get_task

    if "prompts" in env_kwargs:
        return list(load_prompts(env_kwargs["prompts"]))
    task = get_task(env_id)
    return None if task.prompts is None else list(task.prompts())


def _check_k(k: Any) -> list[int]:
    ks = [k] if isinstance(k, int) and not isinstance(k, bool) else k
    if not isinstance(ks, (list, tuple)) or not ks or not all(isinstance(v, int) and v >= 1 for v in ks):
        raise ValueError(f"--eval-k must be integers >= 1, comma-separated (e.g. --eval-k 1,4), got {k!r}")
    return sorted(set(ks))


def make_lm_eval(
    env_id: str,
    env_kwargs: dict[str, Any],
    every: int,
    prompts: str = HELDOUT,
    k: Sequence[int] | int = (1, 4),
    success_threshold: float = 1.0,
    reference_model: str | None = None,
) -> dict[str, Any]:
    """The ``lm_eval`` entry of a :class:`~sb3_grpo.compare.config.CompareConfig`, checked before anything runs
    (:func:`~sb3_grpo.compare.config.make_config` calls it and raises its errors as ``CompareError``).

    :param env_id: The comparison's (text) env id.
    :param env_kwargs: Its ``--env-kwargs``.
    :param every: Timesteps between two evaluations of a run (``--eval-every``).
    :param prompts: ``"heldout"`` or a prompt file (``--eval-prompts``).
    :param k: The ``k`` of pass@k (``--eval-k``); the samples per prompt are the largest ``k``.
    :param success_threshold: The reward from which a sample is correct (``--eval-success``).
    :param reference_model: A local causal-LM folder, or ``"bundled"`` (the bundled LM), for the perplexity
        (``--eval-reference``; ``None``: no perplexity).
    :return: ``{"every", "prompts", "k", "n_samples", "success_threshold", "reference_model", "heldout"}`` with
        ``heldout`` the held-out prompt indices (``None`` unless ``prompts`` is ``"heldout"`` on a prompt list).
    :raises ValueError: naming the option and what to pass.
    """
    import textrl_envs
    from textrl_envs.validation import check_float

    if env_id not in textrl_envs.ENV_IDS:
        raise ValueError(
            f"--eval-every evaluates a language model on held-out prompts; {env_id!r} is not a text env "
            f"({', '.join(textrl_envs.ENV_IDS)}): drop --eval-every"
        )
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ValueError(f"--eval-every must be an integer >= 1 (timesteps between evaluations), got {every!r}")
    ks = _check_k(k)
    threshold = check_float("--eval-success", success_threshold, hint="the reward of a correct sample, e.g. 1.0")
    if reference_model is not None and reference_model != "bundled" and not os.path.isdir(reference_model):
        raise ValueError(
            f"--eval-reference {reference_model!r} is not a folder; give a local causal-LM folder, or 'bundled' for "
            "the bundled LM"
        )
    heldout: list[int] | None = None
    if not isinstance(prompts, str) or not prompts:
        raise ValueError(f"--eval-prompts must be 'heldout' or a prompt file, got {prompts!r}")
    if prompts == HELDOUT:
        if env_id == "ReasoningGym-v0":
            pass  # another generator seed: see eval_env_kwargs
        else:
            items = _prompt_items(env_id, env_kwargs)
            n = heldout_count(len(items)) if items is not None else 0
            if n == 0:
                what = "an external suite" if items is None else f"{len(items)} prompt(s)"
                raise ValueError(
                    f"--eval-prompts heldout: {env_id} has {what}, none of which can be held out; give the held-out "
                    "prompts as a file: --eval-prompts FILE.jsonl"
                )
            heldout = split_heldout(len(items), n)
    else:
        from textrl_envs.data import load_prompts

        try:
            items = load_prompts(prompts)
        except (OSError, TypeError, ValueError) as err:
            raise ValueError(f"--eval-prompts {prompts}: {err} (or pass 'heldout')") from None
        if not items:
            raise ValueError(f"--eval-prompts {prompts}: the file holds no prompts")
    return {
        "every": every,
        "prompts": prompts,
        "k": ks,
        "n_samples": max(ks),
        "success_threshold": threshold,
        "reference_model": reference_model,
        "heldout": heldout,
    }


def train_env_kwargs(cfg: Any) -> dict[str, Any]:
    """The env arguments of a run's training env and its final evaluation: ``cfg.env_kwargs``, minus the held-out
    prompts when some of the env's prompts are held out."""
    kwargs = dict(cfg.env_kwargs)
    heldout = (cfg.lm_eval or {}).get("heldout")
    if heldout:
        items = _prompt_items(cfg.env_id, kwargs)
        held = set(heldout)
        kwargs["prompts"] = [p for i, p in enumerate(items) if i not in held]
    return kwargs


def eval_env_kwargs(cfg: Any) -> dict[str, Any]:
    """The env arguments of the evaluation env of :class:`LMEvalCallback` (held-out prompts only)."""
    spec = cfg.lm_eval or {}
    kwargs = dict(cfg.env_kwargs)
    if spec.get("prompts", HELDOUT) != HELDOUT:
        kwargs["prompts"] = spec["prompts"]
    elif spec.get("heldout"):
        items = _prompt_items(cfg.env_id, kwargs)
        kwargs["prompts"] = [items[i] for i in spec["heldout"]]
    else:  # reasoning-gym: items of another generator seed
        kwargs["seed"] = int(kwargs.get("seed", 0)) + HELDOUT_SEED_OFFSET
        kwargs["size"] = min(int(kwargs.get("size", HELDOUT_MAX)), HELDOUT_MAX)
    return kwargs


def make_eval_callback(cfg: Any, env_seed: int) -> Any:
    """The :class:`~sb3_grpo.callbacks.LMEvalCallback` of one run (``None`` when ``cfg`` has no ``lm_eval``), its env
    seeded ``env_seed``."""
    from sb3_grpo.callbacks import LMEvalCallback
    from textrl_envs.sb3 import make_vec_env

    spec = cfg.lm_eval
    if not spec:
        return None
    reference = spec.get("reference_model")
    if reference == "bundled":
        from textrl_envs.assets import lm_path

        reference = lm_path()
    env = make_vec_env(cfg.env_id, n_envs=spec["n_samples"], device=cfg.device, seed=env_seed, **eval_env_kwargs(cfg))
    return LMEvalCallback(
        env,
        eval_freq=spec["every"],
        k=spec["k"],
        n_samples=spec["n_samples"],
        success_threshold=spec["success_threshold"],
        reference_model=reference,
    )


def reported_metrics(lm_eval: dict[str, Any]) -> list[str]:
    """The metric keys of a run's evaluation that the report shows, in its order."""
    keys = list(REPORTED_METRICS[:3]) + [f"pass@{k}" for k in lm_eval["k"]] + list(REPORTED_METRICS[3:])
    if not lm_eval.get("reference_model"):
        keys.remove("perplexity")
    return keys
