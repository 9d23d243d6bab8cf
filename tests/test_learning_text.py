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
from sb3_grpo.common.buffers import SequenceRolloutBuffer
from textrl_envs.sb3 import make_vec_env


def says_great(prompts, completions, **kwargs):
    return [1.0 if "great" in c else 0.0 for c in completions]


def _env(group_size=1, seed=0):
    return make_vec_env(
        "TextGen-v0", n_envs=16, group_size=group_size, seed=seed, device="cpu", max_new_tokens=4, reward=says_great
    )


def _mean_reward(model, episodes=64):
    reward, _ = evaluate_policy(model, _env(seed=123), n_eval_episodes=episodes, deterministic=False)
    return reward


def _seeds() -> list[int]:
    """Seeds to run: ``TEXTRL_LEARNING_SEEDS="0-29"`` (or ``"3"``) sweeps them; the default is seed 0 only."""
    first, _, last = os.environ.get("TEXTRL_LEARNING_SEEDS", "0").partition("-")
    return list(range(int(first), int(last or first) + 1))


# Settings chosen to learn on most seeds, not just on seed 0: with TEXTRL_LEARNING_SEEDS=0-29 group advantages pass
# on all 30 seeds and GAE on 26 of 30 (on seeds 13, 17, 21 and 29 it ends at 0.02-0.47: the policy drifted away
# from "great" before the value head caught up, a failure of short runs that the default seed does not hide).
@pytest.mark.parametrize("seed", _seeds())
@pytest.mark.parametrize("advantage, group_size, updates", [("gae", 1, 10), ("group", 8, 8)])
def test_grpo_learns_an_easy_text_task(advantage, group_size, updates, seed):
    th.set_num_threads(1)
    th.manual_seed(seed)
    model = GRPO(
        "CausalLMPolicy",
        _env(group_size, seed),
        n_steps=16,
        batch_size=64,
        n_epochs=2,
        learning_rate=5e-4,
        seed=seed,
        device="cpu",
        advantage=advantage,
        grad_var_params=["value_head"],
    )
    model.set_logger(configure(None, []))
    assert isinstance(model.rollout_buffer, SequenceRolloutBuffer)
    before = _mean_reward(model)
    model.learn(16 * 16 * updates)
    after = _mean_reward(model)
    assert before < 0.2
    assert after > 0.6, f"{advantage}: reward {before:.2f} -> {after:.2f}"
