""":class:`LMEvalCallback`: evaluate a language-model policy on held-out prompts during training."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.vec_env import DummyVecEnv, VecEnv

from sb3_grpo.callbacks._common import check_positive_int, env_chain
from sb3_grpo.common.checkpoints.files import atomic_save

__all__ = ["LMEvalCallback", "eval_metrics", "text_spec_of"]


def text_spec_of(env: Any) -> Any:
    """The :class:`~textrl_envs.core.EpisodeSpec` of a text env (a VecEnv or a gymnasium env, wrappers included),
    or ``None`` when ``env`` is no text env."""
    for obj in env_chain(env):
        spec = getattr(obj, "text_spec", None)
        if spec is not None and hasattr(spec, "prompt_texts"):
            return spec
    return None


def eval_metrics(
    greedy: Sequence[float],
    samples: Sequence[Sequence[float]],
    success_threshold: float,
    ks: Sequence[int],
) -> dict[str, float]:
    """The reward metrics of one evaluation, from the rewards per prompt.

    :param greedy: The greedy episode's reward, one per prompt.
    :param samples: The ``n`` sampled episodes' rewards, one list per prompt.
    :param success_threshold: A sample is correct when its reward is at least this.
    :param ks: The ``k`` of each pass@k (each <= ``n``).
    :return: ``greedy_reward_mean``, ``sampled_reward_mean`` (also as ``mean@<n>``: the mean reward of ``n`` samples,
        averaged over the prompts), ``greedy_pass`` (fraction of prompts whose greedy episode is correct) and
        ``pass@<k>`` (Chen et al.'s unbiased estimator, averaged over the prompts).
    """
    from textrl_envs.rewards.metrics import pass_at_k

    n = len(samples[0])
    out = {
        "greedy_reward_mean": float(np.mean(greedy)),
        "sampled_reward_mean": float(np.mean([np.mean(s) for s in samples])),
        "greedy_pass": float(np.mean([g >= success_threshold for g in greedy])),
    }
    out[f"mean@{n}"] = out["sampled_reward_mean"]
    for k in ks:
        correct = [int(np.sum(np.asarray(s) >= success_threshold)) for s in samples]
        out[f"pass@{k}"] = float(np.mean([pass_at_k(n, c, k) for c in correct]))
    return out


class LMEvalCallback(BaseCallback):
    """Evaluate the policy on held-out prompts every ``eval_freq`` timesteps; log it under ``eval/``; keep the best.

    On each prompt of ``eval_env`` (or the ``prompt_indices`` among them), the policy plays one greedy episode
    (``deterministic=True``) and ``n_samples`` sampled ones. Logged, at the start of a rollout (so no update mixes two
    policies' data):

    * ``eval/greedy_reward_mean``, ``eval/sampled_reward_mean`` and ``eval/mean@<n>`` (its name in the pass@k
      literature: the mean reward of ``n`` samples, averaged over the prompts);
    * ``eval/pass@<k>`` for each ``k``: the unbiased estimator of Chen et al. (2021),
      ``1 - C(n - c, k) / C(n, k)`` with ``c`` of the ``n`` samples correct (reward >= ``success_threshold``),
      averaged over the prompts; ``eval/greedy_pass``;
    * ``eval/completion_length`` (tokens, sampled; ``eval/greedy_completion_length``), ``eval/distinct_<d>``
      (distinct-n of the sampled completions, :func:`~textrl_envs.rewards.metrics.distinct_n`), ``eval/repetition``
      (:func:`~textrl_envs.rewards.metrics.repetition_rate`) and, with ``reference_model``, ``eval/perplexity``
      (:func:`~textrl_envs.rewards.metrics.perplexity` of the sampled completions after their prompts);
    * ``eval/best_<metric>`` and ``eval/evals_without_improvement``.

    A reward is an episode's return (the sum of its step rewards: an interactive episode's turn rewards included).
    When ``metric`` improves, the model is kept: saved atomically to ``best_model_path`` (if given), and its value
    and timestep are in :attr:`best`. Every evaluation's metrics are in :attr:`evaluations`.

    :param eval_env: A text env with the held-out prompts, separate from the training env: an SB3 VecEnv
        (``textrl_envs.sb3.make_vec_env``; its envs play samples side by side), a gymnasium env, or an env id (made
        with ``make_vec_env(eval_env, **env_kwargs)``; held-out prompts as ``prompts=`` in ``env_kwargs``: a list, a
        file or a dataset).
    :param eval_freq: Timesteps between evaluations (the first after ``eval_freq`` timesteps).
    :param k: The ``k`` of pass@k: an int or a sequence of ints, each <= ``n_samples``.
    :param n_samples: Sampled episodes per prompt (default: the largest ``k``).
    :param success_threshold: The reward from which an episode counts as correct (1.0: an exact match).
    :param prompt_indices: The prompts of ``eval_env`` to evaluate on (default: all).
    :param distinct: The ``n`` of each distinct-n.
    :param reference_model: A causal LM (or a local folder) for the perplexity (``None``: none); its tokenizer is the
        env's.
    :param metric: The metric that picks the best model (a key above without ``eval/``).
    :param best_model_path: Where to save the best model (``None``: not saved).
    :param env_kwargs: Keyword arguments of ``make_vec_env`` when ``eval_env`` is an id.
    :param verbose: 1 prints every evaluation.
    """

    def __init__(
        self,
        eval_env: Any,
        eval_freq: int,
        k: int | Sequence[int] = 1,
        n_samples: int | None = None,
        success_threshold: float = 1.0,
        prompt_indices: Sequence[int] | None = None,
        distinct: Sequence[int] = (1, 2),
        reference_model: Any = None,
        metric: str = "greedy_reward_mean",
        best_model_path: str | os.PathLike | None = None,
        env_kwargs: dict[str, Any] | None = None,
        verbose: int = 0,
    ) -> None:
        super().__init__(verbose)
        self.eval_freq = check_positive_int("eval_freq", eval_freq)
        ks = [k] if isinstance(k, (int, np.integer)) and not isinstance(k, bool) else list(k)
        if not ks:
            raise ValueError("k must be an int >= 1 or a non-empty sequence of them, e.g. k=(1, 4)")
        self.ks = [check_positive_int("k", v) for v in ks]
        self.n_samples = check_positive_int("n_samples", n_samples if n_samples is not None else max(self.ks))
        if max(self.ks) > self.n_samples:
            raise ValueError(
                f"pass@{max(self.ks)} needs at least {max(self.ks)} samples per prompt, but "
                f"n_samples={self.n_samples}; raise n_samples or lower k"
            )
        if not (isinstance(success_threshold, (int, float)) and math.isfinite(success_threshold)):
            raise ValueError(f"success_threshold must be a finite number, got {success_threshold!r}")
        self.success_threshold = float(success_threshold)
        self.distinct = [check_positive_int("distinct", d) for d in distinct]
        known = {"greedy_reward_mean", "sampled_reward_mean", "greedy_pass", f"mean@{self.n_samples}"}
        known |= {f"pass@{v}" for v in self.ks}
        if metric not in known:
            raise ValueError(f"metric {metric!r} is not one of {sorted(known)}")
        self.metric = metric
        self.reference_model = reference_model
        self.best_model_path = Path(best_model_path) if best_model_path is not None else None
        self.eval_env = self._as_vec_env(eval_env, env_kwargs or {})
        self.spec = text_spec_of(self.eval_env)
        if self.spec is None:
            raise TypeError(
                "LMEvalCallback needs a text env (TextGen-v0 and the other textrl_envs ids); "
                f"got {type(eval_env).__name__}"
            )
        n_prompts = len(self.spec.prompt_texts)
        indices = list(range(n_prompts)) if prompt_indices is None else [int(i) for i in prompt_indices]
        bad = [i for i in indices if not 0 <= i < n_prompts]
        if bad or not indices:
            raise ValueError(f"prompt_indices must be in [0, {n_prompts - 1}] (the eval env's prompts), got {bad}")
        self.prompt_indices = indices
        #: Every evaluation's metrics (with its ``timestep``).
        self.evaluations: list[dict[str, float]] = []
        #: The last evaluation's episodes, per prompt: ``prompt_index``, ``greedy`` and ``samples`` as
        #: ``{"reward", "completion", "length"}`` dicts.
        self.last_episodes: list[dict[str, Any]] = []
        #: The best value of ``metric`` so far and its timestep.
        self.best: dict[str, float] = {"value": -math.inf, "timestep": -1}
        #: Evaluations in a row without a better ``metric`` (logged; the ``RewardStalled`` alert reads it).
        self.evals_without_improvement = 0
        self._next_eval = 0

    @staticmethod
    def _as_vec_env(env: Any, env_kwargs: dict[str, Any]) -> VecEnv:
        if isinstance(env, str):
            from textrl_envs.sb3 import make_vec_env

            return make_vec_env(env, **env_kwargs)
        if env_kwargs:
            raise ValueError("env_kwargs is only used when eval_env is an env id")
        if isinstance(env, VecEnv):
            return env
        if hasattr(env, "reset") and hasattr(env, "step"):
            return DummyVecEnv([lambda: env])
        raise TypeError(f"eval_env must be an env id, a gymnasium Env or an SB3 VecEnv, got {type(env).__name__}")

    def _init_callback(self) -> None:
        self._next_eval = self.num_timesteps + self.eval_freq
        if isinstance(self.reference_model, (str, os.PathLike)):  # load it once, not at every evaluation
            from transformers import AutoModelForCausalLM

            self.reference_model = AutoModelForCausalLM.from_pretrained(os.fspath(self.reference_model)).eval()
        if self.best_model_path is not None:
            self.best_model_path.parent.mkdir(parents=True, exist_ok=True)

    def _on_step(self) -> bool:
        return True

    def _on_rollout_start(self) -> None:
        if self.num_timesteps < self._next_eval:
            return
        self._next_eval = self.num_timesteps + self.eval_freq
        self.evaluate()

    def _play(self, prompt_index: int, deterministic: bool, n: int) -> list[tuple[float, dict]]:
        """``n`` episodes on one prompt: (return, final info) each; every env plays one episode per round."""
        env = self.eval_env
        out: list[tuple[float, dict]] = []
        while len(out) < n:
            env.set_options({"prompt_index": prompt_index})
            obs = env.reset()
            returns = np.zeros(env.num_envs)
            finished = np.zeros(env.num_envs, dtype=bool)
            while not finished.all():
                actions, _ = self.model.predict(obs, deterministic=deterministic)
                obs, rewards, dones, infos = env.step(actions)
                returns += np.where(finished, 0.0, rewards)
                for j in np.flatnonzero(dones & ~finished):
                    finished[j] = True
                    out.append((float(returns[j]), infos[j]))
        return out[:n]

    def evaluate(self) -> dict[str, float]:
        """Evaluate now, log under ``eval/``, keep the best; returns the metrics."""
        from textrl_envs.rewards.metrics import distinct_n, perplexity, repetition_rate

        training = self.model.policy.training
        self.model.policy.set_training_mode(False)
        greedy, samples, texts, prompts, lengths, greedy_lengths = [], [], [], [], [], []
        episodes: list[dict[str, Any]] = []

        def episode(reward: float, info: dict) -> dict[str, Any]:
            return {
                "reward": reward,
                "completion": info.get("completion", ""),
                "length": len(info.get("completion_ids", ())),
            }

        try:
            for i in self.prompt_indices:
                ((g, g_info),) = self._play(i, True, 1)
                sampled = self._play(i, False, self.n_samples)
                episodes.append(
                    {"prompt_index": i, "greedy": episode(g, g_info), "samples": [episode(r, f) for r, f in sampled]}
                )
                greedy.append(g)
                greedy_lengths.append(episodes[-1]["greedy"]["length"])
                samples.append([r for r, _ in sampled])
                for row in episodes[-1]["samples"]:
                    texts.append(row["completion"])
                    prompts.append(self.spec.prompt_texts[i])
                    lengths.append(row["length"])
        finally:
            self.model.policy.set_training_mode(training)
            reset_cache = getattr(self.model.policy, "reset_cache", None)
            if callable(reset_cache):  # the eval env's rows are not the training env's
                reset_cache()
        self.last_episodes = episodes
        metrics = eval_metrics(greedy, samples, self.success_threshold, self.ks)
        metrics["completion_length"] = float(np.mean(lengths))
        metrics["greedy_completion_length"] = float(np.mean(greedy_lengths))
        for d in self.distinct:
            metrics[f"distinct_{d}"] = distinct_n(texts, d)
        metrics["repetition"] = repetition_rate(texts, 2)
        if self.reference_model is not None:
            try:
                metrics["perplexity"] = perplexity(
                    texts, self.reference_model, tokenizer=self.spec.tokenizer, prompts=prompts
                )
            except ValueError:  # every completion empty: nothing to score
                metrics["perplexity"] = float("nan")
        value = metrics[self.metric]
        if math.isfinite(value) and value > self.best["value"]:
            self.best = {"value": value, "timestep": self.num_timesteps}
            self.evals_without_improvement = 0
            if self.best_model_path is not None:
                atomic_save(self.model, self.best_model_path)
        else:
            self.evals_without_improvement += 1
        metrics[f"best_{self.metric}"] = self.best["value"]
        metrics["evals_without_improvement"] = float(self.evals_without_improvement)
        for key, v in metrics.items():
            self.logger.record(f"eval/{key}", v)
        self.evaluations.append({"timestep": self.num_timesteps, **metrics})
        if self.verbose >= 1:
            shown = ", ".join(f"{k}={v:.3f}" for k, v in metrics.items())
            print(f"LMEval num_timesteps={self.num_timesteps}: {shown}")
        return metrics
