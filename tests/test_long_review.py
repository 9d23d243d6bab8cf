"""``LongReview-v0`` (every episode 96 tokens, EOS is an ordinary token) and its ``coherence`` reward."""

from __future__ import annotations

import math
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import gymnasium as gym
import numpy as np
import pytest

import textrl_envs  # noqa: F401  (registers the ids)
from textrl_envs.rewards import Coherence, make_reward
from textrl_envs.rewards.metrics import perplexity


@pytest.fixture(scope="module")
def coherence():
    return Coherence()


def test_coherence_is_one_minus_nll_over_log_vocab(coherence):
    prompts = ["The movie was", "I watched it and"]
    completions = [" great. The ending was powerful.", " zq xv brr kk ##"]
    scores = coherence(prompts, completions)
    for p, c, s in zip(prompts, completions, scores):
        nll = math.log(perplexity([c], coherence.model, coherence.tokenizer, prompts=[p]))  # the mean NLL
        assert s == pytest.approx(min(1.0, max(0.0, 1.0 - nll / math.log(len(coherence.tokenizer)))), abs=1e-6)
    assert scores[0] > scores[1]  # text the reference LM writes beats noise
    assert coherence(["The movie was"], [""])[0] == 0.0  # empty completion: empty_score
    assert make_reward("coherence").log_vocab == coherence.log_vocab


def test_long_review_runs_its_whole_budget_and_scores_the_whole_text():
    env = gym.make("LongReview-v0")
    spec = env.unwrapped.text_spec
    assert spec.eos_token_id is None and spec.max_new_tokens == 96
    eos = spec.tokenizer.eos_token_id
    obs, _ = env.reset(seed=0)
    assert obs["input_ids"].shape == (104,)
    steps, terminated, truncated = 0, False, False
    while not (terminated or truncated):
        action = eos if steps % 10 == 0 else env.action_space.sample()  # EOS now and then
        obs, reward, terminated, truncated, info = env.step(action)
        steps += 1
    assert steps == 96 and truncated and not terminated  # EOS did not end the episode
    assert np.isfinite(reward) and -2.0 <= reward <= 2.0
    assert "<|endoftext|>" not in info["completion"]


def test_other_tasks_still_stop_at_eos():
    env = gym.make("TextGen-v0")
    env.reset(seed=0)
    eos = env.unwrapped.text_spec.eos_token_id
    assert eos is not None
    _, _, terminated, _, _ = env.step(eos)
    assert terminated
