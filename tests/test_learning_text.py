"""Short, seeded learning runs on an easy text task (the long runs are benchmarks: `sb3-grpo compare`).

The task: TextGen-v0's prompts and the bundled LM, 4-token completions, reward 1 when the completion
contains "great" (the untrained LM does so about 5% of the time). GRPO must lift the sampled reward
far above that, through the fast path, with GAE and with group-relative advantages.
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch as th
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.logger import configure

from sb3_grpo import GRPO
from sb3_grpo.buffers import SequenceRolloutBuffer
from textrl_envs.sb3 import make_vec_env


def says_great(prompts, completions, **kwargs):
    return [1.0 if "great" in c else 0.0 for c in completions]


def _env(group_size=1, seed=0):
    return make_vec_env(
        "TextGen-v0", n_envs=8, group_size=group_size, seed=seed, device="cpu", max_new_tokens=4, reward=says_great
    )


def _mean_reward(model, episodes=64):
    reward, _ = evaluate_policy(model, _env(seed=123), n_eval_episodes=episodes, deterministic=False)
    return reward


@pytest.mark.parametrize("advantage, group_size, updates", [("gae", 1, 20), ("group", 4, 6)])
def test_grpo_learns_an_easy_text_task(advantage, group_size, updates):
    th.set_num_threads(1)
    th.manual_seed(0)
    model = GRPO(
        "CausalLMPolicy",
        _env(group_size),
        n_steps=16,
        batch_size=64,
        n_epochs=2,
        learning_rate=2e-3,
        seed=0,
        device="cpu",
        advantage=advantage,
        grad_var_params=["value_head"],
    )
    model.set_logger(configure(None, []))
    assert isinstance(model.rollout_buffer, SequenceRolloutBuffer)
    before = _mean_reward(model)
    model.learn(16 * 8 * updates)
    after = _mean_reward(model)
    assert before < 0.2
    assert after > 0.6, f"{advantage}: reward {before:.2f} -> {after:.2f}"
