"""Where a text episode ends: an outside time limit (``max_episode_steps``) on the single env, the vector env and
the SB3 adapter, the token budget, and group advantages whose ``n_steps`` is shorter than an episode."""

import warnings

import gymnasium as gym
import numpy as np
import pytest

import textrl_envs  # noqa: F401 (registers the env ids)
from sb3_grpo import GRPO
from sb3_grpo.common.buffers import GRPODictRolloutBuffer
from textrl_envs.sb3 import make_vec_env


# ---------------------------------------------------------------- an outside time limit cutting a text episode
class CountingReward:
    """Scores ``len(completion) + 1`` (never 0) and counts its calls."""

    __name__ = "counting"

    def __init__(self):
        self.calls = 0

    def __call__(self, prompts, completions):
        self.calls += 1
        return [len(c) + 1.0 for c in completions]


def test_time_limit_on_the_single_env_cuts_unscored_and_the_env_warns_at_the_next_reset():
    reward = CountingReward()
    env = gym.make("TextGen-v0", max_new_tokens=5, max_episode_steps=2, reward=reward)
    env.reset(seed=0)
    env.step(5)
    _, r, terminated, truncated, info = env.step(6)
    assert (r, terminated, truncated, info, reward.calls) == (0.0, False, True, {}, 0)  # the documented semantics
    with pytest.warns(UserWarning, match=r"an outside time limit .*never scored: limit text episodes with max_new"):
        env.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per env
        env.step(5)
        env.reset()


def test_an_episode_that_ends_by_its_budget_gives_no_cut_warning():
    env = gym.make("TextGen-v0", max_new_tokens=2, reward=CountingReward())
    env.reset(seed=0)
    env.step(5)
    assert env.step(6)[2:4] == (False, True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        env.reset()


def test_max_episode_steps_on_the_vector_env_ends_and_scores_episodes_at_k_tokens():
    reward = CountingReward()
    vec = gym.make_vec("TextGen-v0", num_envs=3, device="cpu", max_new_tokens=5, max_episode_steps=2, reward=reward)
    assert vec.unwrapped.max_new_tokens == 5  # the window stays; the budget is the limit
    vec.reset(seed=0)
    vec.step(np.array([5, 6, 7]))
    _, rewards, terminated, truncated, infos = vec.step(np.array([8, 9, 10]))
    assert truncated.all() and not terminated.any() and reward.calls == 1
    completions = infos["final_info"]["completion"]
    assert [len(c) + 1.0 for c in completions] == rewards.tolist()
    assert [len(ids) for ids in infos["final_info"]["completion_ids"]] == [2, 2, 2]


def test_max_episode_steps_through_the_sb3_adapter():
    reward = CountingReward()
    venv = make_vec_env("TextGen-v0", n_envs=2, device="cpu", max_new_tokens=6, max_episode_steps=3, reward=reward)
    venv.reset()
    assert [venv.step(np.array([5, 6]))[2].any() for _ in range(2)] == [False, False]
    _, rewards, dones, infos = venv.step(np.array([5, 6]))
    assert dones.all() and all(i["TimeLimit.truncated"] for i in infos)
    assert rewards.tolist() == [len(i["completion"]) + 1.0 for i in infos]


def test_max_episode_steps_is_checked():
    with pytest.raises(ValueError, match=r"max_episode_steps must be an int >= 1, got 0; or None"):
        gym.make_vec("TextGen-v0", num_envs=2, device="cpu", max_episode_steps=0)


# ---------------------------------------------------------------- group advantages with n_steps < an episode
def test_group_advantages_warn_when_n_steps_is_shorter_than_an_episode():
    env = make_vec_env("TextGen-v0", n_envs=4, group_size=2, device="cpu", max_new_tokens=5)
    with pytest.warns(
        UserWarning, match=r"n_steps=2 is shorter than the env's episodes \(up to 5 tokens\).*n_steps >= 5"
    ):
        GRPO("CausalLMPolicy", env, advantage="group", n_steps=2, batch_size=8, device="cpu", carry_over=False)
    with pytest.warns(UserWarning, match=r"n_steps=2 is shorter than the env's episodes"):
        # "auto" resolves off without the text fast path's buffer: the warning comes with the rollout buffer
        model = GRPO("CausalLMPolicy", env, advantage="group", n_steps=2, batch_size=8, device="cpu",
                     rollout_buffer_class=GRPODictRolloutBuffer)  # fmt: skip
    assert model.carry_over_on is False
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*shorter than the env's episodes")
        # carry_over="auto" (on here) trains the steps a short rollout cuts: no warning
        assert GRPO("CausalLMPolicy", env, advantage="group", n_steps=2, batch_size=8, device="cpu").carry_over_on
        GRPO("CausalLMPolicy", env, advantage="group", n_steps=5, batch_size=20, device="cpu", carry_over=False)
        env.env_method("set_max_new_tokens", 2)  # a curriculum's shorter budget counts
        GRPO("CausalLMPolicy", env, advantage="rloo", n_steps=2, batch_size=8, device="cpu")
