"""Rewards scored in a background thread (textrl_envs.reward_worker) during GRPO's rollout land exactly where a reward
scored in step would have been: the buffer, the group advantages, the infos and the monitor's episode records; the
reward's errors, timeout and NaN rules are the synchronous ones."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pickle
import threading
import time

import numpy as np
import pytest
from helpers import quiet
from stable_baselines3.common.callbacks import CallbackList

from sb3_grpo import GRPO
from textrl_envs.rewards.base import RewardTimeoutError
from textrl_envs.sb3 import make_vec_env
from textrl_envs.vector import TextGenVectorEnv

N_ENVS, N_STEPS = 4, 24


def _weird_reward(prompts, completions, **_kw):
    """Deterministic, depends on the text; NaN for completions whose length is a multiple of 7."""
    return [float("nan") if len(c) % 7 == 0 else (len(c) % 5) / 5 - 0.3 for c in completions]


def _collect(reward_worker, reward="sentiment", nonfinite="raise", **env_kw):
    env = make_vec_env(
        "TextGen-v0",
        n_envs=N_ENVS,
        group_size=2,
        seed=1,
        device="cpu",
        max_new_tokens=6,
        reward=reward,
        reward_worker=reward_worker,
        **env_kw,
    )
    model = quiet(
        GRPO(
            "CausalLMPolicy",
            env,
            n_steps=N_STEPS,
            batch_size=N_STEPS * N_ENVS,
            seed=0,
            device="cpu",
            advantage="group",
            nonfinite=nonfinite,
        )
    )
    model._setup_learn(N_STEPS * N_ENVS, None)
    callback = CallbackList([])
    callback.init_callback(model)
    assert model.collect_rollouts(model.env, callback, model.rollout_buffer, N_STEPS)
    return model


def _assert_same_rollout(fast, slow):
    a, b = fast.rollout_buffer, slow.rollout_buffer
    np.testing.assert_array_equal(a.actions, b.actions)
    for name in ("rewards", "advantages", "returns", "values", "log_probs"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    episodes = [[float(ep["r"]) for ep in m.ep_info_buffer] for m in (fast, slow)]
    assert episodes[0] == episodes[1] and len(episodes[0]) > 4


def test_deferred_rewards_land_where_step_would_have_put_them():
    fast, slow = _collect(True), _collect(False)
    assert fast.env.venv.venv.unwrapped._worker is not None, "the rollout must have used the worker"
    assert not fast.env.venv.venv.unwrapped._deferred, "deferral is off outside the rollout"
    assert np.abs(fast.rollout_buffer.rewards).sum() > 0
    _assert_same_rollout(fast, slow)


def test_deferred_nonfinite_rewards_are_dropped_as_in_step():
    kw = {"reward": _weird_reward, "nonfinite": "skip", "nonfinite_reward": "skip"}
    fast, slow = _collect(True, **kw), _collect(False, **kw)
    _assert_same_rollout(fast, slow)
    assert (
        fast.logger.name_to_value["rollout/skipped_episodes"] == slow.logger.name_to_value["rollout/skipped_episodes"]
    )
    assert slow.logger.name_to_value["rollout/skipped_episodes"] > 0


def test_deferred_reward_errors_and_timeouts_are_raised_at_the_end_of_the_rollout():
    with pytest.raises(ValueError, match="non-finite"):  # nonfinite_reward="raise": the env's own error
        _collect(True, reward=_weird_reward)

    def hangs(prompts, completions, **_kw):
        time.sleep(1.0)
        return [0.0] * len(completions)

    with pytest.raises(RewardTimeoutError, match="reward 'hangs' did not return within reward_timeout=0.1 s"):
        _collect(True, reward=hangs, reward_timeout=0.1)


def test_vector_env_scores_in_the_background_and_step_does_not_wait():
    started, release = threading.Event(), threading.Event()
    threads = []

    def slow(prompts, completions, **_kw):
        threads.append(threading.current_thread().name)
        started.set()
        assert release.wait(10), "the test never released the reward"
        return [float(len(c)) for c in completions]

    env = TextGenVectorEnv(num_envs=3, prompts=["the movie was"], reward=slow, max_new_tokens=2, device="cpu")
    env.reset(seed=0)
    assert env.defer_rewards(True)
    env.step(np.full(3, 5))
    _, rewards, terminated, truncated, infos = env.step(np.full(3, 6))  # every episode ends: scored in the thread
    assert (terminated | truncated).all() and (rewards == 0).all()
    assert started.wait(10) and not release.is_set()  # step returned while the reward was still running
    tickets = infos["final_info"]["reward_ticket"]
    with pytest.raises(RuntimeError, match="still pending; call collect_rewards"):
        env.defer_rewards(False)
    with pytest.raises(RuntimeError, match="cannot be pickled"):
        pickle.dumps(env._worker)
    release.set()
    (result,) = env.collect_rewards()
    assert result.ticket == tickets[0] and result.envs.tolist() == [0, 1, 2]
    assert result.rewards.tolist() == [float(len(c)) for c in infos["final_info"]["completion"]]
    assert threads and threads[0].startswith("textrl-reward")
    assert not env.defer_rewards(False)
    env.close()


def _one(prompts, completions, **_kw):
    return [1.0] * len(completions)


def test_reward_worker_false_keeps_rewards_in_step():
    env = TextGenVectorEnv(num_envs=2, prompts=["a cat"], reward=_one, max_new_tokens=1, reward_worker=False)
    env.reset(seed=0)
    assert not env.defer_rewards(True)
    _, rewards, *_ = env.step(np.full(2, 5))
    assert (rewards != 0).all()
