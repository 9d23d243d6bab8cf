"""Evaluation during training: pass@k against brute-force enumeration, the metrics by hand, and LMEvalCallback's logged
values recomputed from the episodes it played; the best model kept."""

from __future__ import annotations

import csv
import itertools
import math
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
from stable_baselines3.common.logger import configure

from sb3_grpo import GRPO
from sb3_grpo.callbacks import LMEvalCallback
from sb3_grpo.callbacks.lm_eval import eval_metrics
from textrl_envs.rewards.metrics import distinct_n, pass_at_k, perplexity, repetition_rate
from textrl_envs.sb3 import make_vec_env

HELD_OUT = ["The film", "My friend said the movie", "Honestly, the ending"]


def _brute_pass_at_k(n: int, c: int, k: int) -> float:
    """Over every k-subset of n samples (the first c correct): the fraction holding a correct one."""
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(i < c for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", range(1, 9))
def test_pass_at_k_equals_brute_force_enumeration(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            expected = _brute_pass_at_k(n, c, k)
            assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12), (n, c, k)
            assert expected == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k), abs=1e-12)


def test_pass_at_k_bad_input():
    with pytest.raises(ValueError, match="1 <= k <= n"):
        pass_at_k(3, 1, 4)
    with pytest.raises(ValueError, match="0 <= c <= n"):
        pass_at_k(3, 5, 1)
    with pytest.raises(TypeError, match="n must be an int"):
        pass_at_k(3.0, 1, 1)


def test_eval_metrics_by_hand():
    greedy = [1.0, 0.0]
    samples = [[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.5]]  # threshold 1: 2 of 4 correct, then 0 of 4
    got = eval_metrics(greedy, samples, success_threshold=1.0, ks=[1, 2])
    assert got["greedy_reward_mean"] == 0.5 and got["greedy_pass"] == 0.5
    assert got["sampled_reward_mean"] == pytest.approx((0.5 + 0.125) / 2) == got["mean@4"]
    assert got["pass@1"] == pytest.approx((2 / 4 + 0) / 2)
    assert got["pass@2"] == pytest.approx((1 - math.comb(2, 2) / math.comb(4, 2) + 0) / 2)  # (1 - 1/6) / 2


def _words_reward(_prompts, completions):  # 1 from two words on: a task some samples pass and some fail
    return [1.0 if len(c.split()) >= 2 else 0.0 for c in completions]


def _eval_env(n_envs=3):
    return make_vec_env(
        "TextGen-v0", n_envs=n_envs, seed=0, device="cpu", max_new_tokens=3, prompts=HELD_OUT, reward=_words_reward
    )


def test_callback_logs_what_its_episodes_give_and_keeps_the_best(tmp_path):
    from textrl_envs.assets import lm_path

    train = make_vec_env("TextGen-v0", n_envs=2, seed=0, device="cpu", max_new_tokens=3, reward=_words_reward)
    model = GRPO("CausalLMPolicy", train, n_steps=8, batch_size=16, n_epochs=1, seed=0, device="cpu")
    model.set_logger(configure(str(tmp_path), ["csv"]))
    cb = LMEvalCallback(
        _eval_env(),
        eval_freq=16,
        k=(1, 2),
        n_samples=4,
        reference_model=lm_path(),
        metric="sampled_reward_mean",
        best_model_path=tmp_path / "best.zip",
    )
    model.learn(16 * 3, callback=cb)
    model.logger.close()
    assert [e["timestep"] for e in cb.evaluations] == [16, 32]
    last = cb.evaluations[-1]
    episodes = cb.last_episodes
    assert [e["prompt_index"] for e in episodes] == [0, 1, 2]
    texts = [s["completion"] for e in episodes for s in e["samples"]]
    for e in episodes:  # each reward is the env's reward of that completion
        for s in [e["greedy"], *e["samples"]]:
            assert s["reward"] == _words_reward(None, [s["completion"]])[0]
            assert 1 <= s["length"] <= 3
    correct = [sum(s["reward"] >= 1 for s in e["samples"]) for e in episodes]
    assert last["pass@2"] == pytest.approx(np.mean([_brute_pass_at_k(4, c, 2) for c in correct]))
    assert last["pass@1"] == pytest.approx(np.mean(correct) / 4)
    assert last["greedy_reward_mean"] == pytest.approx(np.mean([e["greedy"]["reward"] for e in episodes]))
    assert last["mean@4"] == pytest.approx(np.mean([s["reward"] for e in episodes for s in e["samples"]]))
    assert last["completion_length"] == pytest.approx(np.mean([s["length"] for e in episodes for s in e["samples"]]))
    assert last["distinct_1"] == distinct_n(texts, 1) and last["distinct_2"] == distinct_n(texts, 2)
    assert last["repetition"] == repetition_rate(texts, 2)
    prompts = [HELD_OUT[e["prompt_index"]] for e in episodes for _ in e["samples"]]
    assert last["perplexity"] == pytest.approx(perplexity(texts, lm_path(), prompts=prompts), rel=1e-5)
    # logged under eval/ at the next dump
    rows = list(csv.DictReader(open(tmp_path / "progress.csv")))
    assert float(rows[-1]["eval/pass@2"]) == pytest.approx(last["pass@2"])
    best = max(cb.evaluations, key=lambda e: e["sampled_reward_mean"])
    assert cb.best["value"] == best["sampled_reward_mean"] and cb.best["timestep"] == best["timestep"]
    assert float(rows[-1]["eval/best_sampled_reward_mean"]) == pytest.approx(best["sampled_reward_mean"])
    loaded = GRPO.load(tmp_path / "best.zip", device="cpu")
    assert loaded.num_timesteps == best["timestep"]


def test_greedy_is_deterministic_and_samples_vary():
    env = _eval_env(n_envs=2)
    model = GRPO("CausalLMPolicy", env, n_steps=8, batch_size=16, seed=0, device="cpu")
    model.set_logger(configure(None, []))
    cb = LMEvalCallback(env, eval_freq=1, k=4)
    cb.init_callback(model)
    cb.evaluate()
    first = [e["greedy"]["completion"] for e in cb.last_episodes]
    cb.evaluate()
    assert [e["greedy"]["completion"] for e in cb.last_episodes] == first
    assert all(len(e["samples"]) == 4 for e in cb.last_episodes)
    assert len({s["completion"] for e in cb.last_episodes for s in e["samples"]}) > 1


def test_bad_arguments_are_named():
    env = _eval_env(n_envs=1)
    with pytest.raises(ValueError, match="pass@4 needs at least 4 samples"):
        LMEvalCallback(env, eval_freq=10, k=4, n_samples=2)
    with pytest.raises(ValueError, match="metric 'pass@3' is not one of"):
        LMEvalCallback(env, eval_freq=10, k=1, metric="pass@3")
    with pytest.raises(ValueError, match=r"prompt_indices must be in \[0, 2\]"):
        LMEvalCallback(env, eval_freq=10, prompt_indices=[5])
    with pytest.raises(TypeError, match="needs a text env"):
        import gymnasium as gym

        LMEvalCallback(gym.make("CartPole-v1"), eval_freq=10)
    with pytest.raises(ValueError, match="env_kwargs is only used when eval_env is an env id"):
        LMEvalCallback(env, eval_freq=10, env_kwargs={"prompts": ["x"]})
    made = LMEvalCallback("TextGen-v0", eval_freq=10, env_kwargs={"prompts": HELD_OUT, "device": "cpu"})
    assert made.prompt_indices == [0, 1, 2]
