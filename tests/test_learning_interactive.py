"""A short, seeded learning run on an interactive task (the longer one: ``python scripts/learn_interactive.py``).

GuessNumber-v0 with the bundled LM: a secret in 1-8, four turns, the env answers "Higher" / "Lower" / "Correct!".
The untrained LM guesses small numbers and ignores the answers (mean reward 0.25 over 128 sampled episodes, 3.5
turns, on seed 0). GRPO with group-relative advantages must lift the reward clearly and shorten the episodes in 16
updates of one epoch (the settings of ``scripts/learn_interactive.py``), on the fast path (one forward per
sequence, the env's replies as context).
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch as th
from helpers import quiet

from sb3_grpo import GRPO
from sb3_grpo.common.buffers import SequenceRolloutBuffer
from textrl_envs.sb3 import make_vec_env


def evaluate(model, episodes=128, seed=123):
    """Mean reward and mean turns of ``episodes`` sampled episodes on a separately seeded env."""
    env = make_vec_env("GuessNumber-v0", n_envs=16, seed=seed, device="cpu")
    obs, rewards, turns, running = env.reset(), [], [], np.zeros(16)
    while len(rewards) < episodes:
        actions, _ = model.predict(obs, deterministic=False)
        obs, r, dones, infos = env.step(actions)
        running += r
        for i in np.flatnonzero(dones):
            rewards.append(running[i])
            turns.append(infos[i]["turns"])
            running[i] = 0.0
    return float(np.mean(rewards[:episodes])), float(np.mean(turns[:episodes]))


def _seeds() -> list[int]:
    """Seeds to run: ``TEXTRL_LEARNING_SEEDS="0-9"`` (or ``"3"``) sweeps them; the default is seed 0 only."""
    first, _, last = os.environ.get("TEXTRL_LEARNING_SEEDS", "0").partition("-")
    return list(range(int(first), int(last or first) + 1))


# The settings of scripts/learn_interactive.py's GRPO run (group_size=8, one epoch per update, 16 updates).
@pytest.mark.parametrize("seed", _seeds())
def test_grpo_learns_to_guess_the_number(seed):
    th.set_num_threads(1)
    th.manual_seed(seed)
    env = make_vec_env("GuessNumber-v0", n_envs=16, group_size=8, seed=seed, device="cpu")
    model = quiet(
        GRPO(
            "CausalLMPolicy",
            env,
            advantage="group",
            n_steps=32,
            batch_size=256,
            n_epochs=1,
            learning_rate=2e-4,
            explore_alpha=0.0,
            grad_var_params=["value_head"],
            seed=seed,
            device="cpu",
        )
    )
    assert isinstance(model.rollout_buffer, SequenceRolloutBuffer)
    before, turns_before = evaluate(model)
    model.learn(16 * 32 * 16)
    after, turns_after = evaluate(model)
    assert before < 0.3
    assert after > before + 0.08 and turns_after < turns_before, (before, after, turns_before, turns_after)
