"""Non-finite rewards, losses and gradients: raise with context by default, skip and count with
``GRPO(nonfinite="skip")`` / ``nonfinite_reward="skip"``; no NaN ever reaches the weights or a checkpoint.
Also the reward timeout of ``call_reward``."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import math
import threading
import time

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from helpers import RolloutLog, params, quiet
from stable_baselines3.common.env_util import make_vec_env as sb3_make_vec_env

from sb3_grpo import GRPO
from sb3_grpo.callbacks import (
    AtomicCheckpointCallback,
    latest_checkpoint,
    nonfinite_parameters,
)
from textrl_envs.core import load_tokenizer
from textrl_envs.rewards.base import RewardTimeoutError, call_reward
from textrl_envs.sb3 import make_vec_env

SMALL = {"n_steps": 32, "batch_size": 32, "n_epochs": 2, "seed": 0, "device": "cpu"}


def _same(a, b):
    return all(th.equal(a[k], b[k]) for k in a)


class NanEvery(gym.Wrapper):
    """CartPole whose reward is NaN on every ``k``-th step."""

    def __init__(self, env, k=20):
        super().__init__(env)
        self.k, self.n = k, 0

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.n += 1
        return obs, (math.nan if self.n % self.k == 0 else reward), terminated, truncated, info


def _nan_env(k=20):
    return sb3_make_vec_env(lambda: NanEvery(gym.make("CartPole-v1"), k), n_envs=2, seed=0)


def test_nonfinite_reward_raises_with_env_and_timestep():
    model = quiet(GRPO("MlpPolicy", _nan_env(), **SMALL))
    before = params(model)
    with pytest.raises(
        RuntimeError,
        match=r"env \d returned a non-finite reward \(nan\) at timestep \d+ \(update 0\).*nonfinite='skip'",
    ):
        model.learn(64)
    assert _same(before, params(model))


def test_skip_drops_bad_episodes_and_counts_them(tmp_path):
    model = quiet(GRPO("MlpPolicy", _nan_env(), nonfinite="skip", **SMALL))
    log = RolloutLog()
    model.learn(128, callback=[log, AtomicCheckpointCallback(64, tmp_path)])
    skipped = [v["rollout/skipped_episodes"] for v in log.values]
    assert sum(skipped) > 0
    assert np.isfinite(model.rollout_buffer.advantages).all()
    assert np.isfinite(model.rollout_buffer.rewards).all()
    assert not nonfinite_parameters(model.policy)
    loaded = GRPO.load(latest_checkpoint(tmp_path), device="cpu")
    assert not nonfinite_parameters(loaded.policy)


def test_skip_zeroes_the_advantages_of_the_flagged_episode_only():
    env = sb3_make_vec_env(lambda: NanEvery(gym.make("CartPole-v1"), 10), n_envs=1, seed=0)
    model = quiet(GRPO("MlpPolicy", env, nonfinite="skip", **{**SMALL, "n_epochs": 1}))
    model.learn(64)
    buffer = model.rollout_buffer
    # the second rollout holds env steps 33..64: NaN rewards at steps 40, 50, 60 -> rows 7, 17, 27
    starts = buffer.episode_starts[:, 0]
    expected = np.zeros(32, dtype=bool)
    for row in (7, 17, 27):
        first = max([r for r in range(row + 1) if starts[r]] or [0])
        expected[first : row + 1] = True
    assert (buffer.advantages[:, 0] == 0.0).tolist() == expected.tolist()
    assert buffer.rewards[[7, 17, 27], 0].tolist() == [0.0, 0.0, 0.0]
    np.testing.assert_array_equal(buffer.returns[expected, 0], buffer.values[expected, 0])


def test_skip_nonfinite_loss_takes_no_step_and_checkpoint_stays_finite(tmp_path):
    model = quiet(GRPO("MlpPolicy", "CartPole-v1", kl_coef=0.1, nonfinite="skip", **SMALL))
    model.batch_source.reference_log_prob = lambda batch: th.full((len(batch.actions),), math.nan)
    before = params(model)
    model.learn(64, callback=AtomicCheckpointCallback(32, tmp_path))
    assert model.logger.name_to_value["train/skipped_nonfinite"] == 2  # 1 minibatch x 2 epochs of the last update
    assert _same(before, params(model))
    loaded = GRPO.load(latest_checkpoint(tmp_path), device="cpu")
    assert _same(before, params(loaded)) and loaded.num_timesteps == 64


def test_nonfinite_gradient_raise_and_skip():
    def poisoned(nonfinite):
        # (no grad-variance penalty: it is made of gradients, so it would make the loss itself NaN)
        model = quiet(GRPO("MlpPolicy", "CartPole-v1", nonfinite=nonfinite, grad_var_coef=0.0, **SMALL))
        model.policy.action_net.weight.register_hook(lambda g: g * math.nan)
        return model

    model = poisoned("raise")
    before = params(model)
    with pytest.raises(RuntimeError, match=r"non-finite gradient at update 0 .*No optimizer step was taken"):
        model.learn(32)
    assert _same(before, params(model))

    model = poisoned("skip")
    before = params(model)
    model.learn(64)
    assert model.logger.name_to_value["train/skipped_nonfinite"] == 2
    assert _same(before, params(model))
    for state in model.policy.optimizer.state.values():  # Adam's moments never saw the NaN
        assert all(th.isfinite(v).all() for v in state.values() if isinstance(v, th.Tensor))


@pytest.mark.parametrize(
    "env_id, message",
    [
        # torch.multinomial refuses NaN probabilities itself: GRPO names the step around its message
        ("CartPole-v1", r"draw failed at rollout step 0 \(timestep 0, update 0\): probability tensor contains"),
        # a Gaussian samples NaN without complaint: GRPO's check of the log-probs stops it
        ("Pendulum-v1", r"action distribution is not finite for env 0 at rollout step 0 .*NaN"),
    ],
)
def test_nan_policy_raises_at_the_draw_and_restores_torch_checks(env_id, message):
    """The rollout's draw skips torch's distribution checks (for speed) and checks the log-probs instead: a policy
    with NaN weights raises GRPO's error at the first step, and torch's default is restored after it."""
    model = quiet(GRPO("MlpPolicy", env_id, **SMALL))
    with th.no_grad():
        model.policy.action_net.bias.fill_(math.nan)
    # torch's default under `python` (not `-O`); importing bitsandbytes (peft does) turns it off for the process
    previous = th.distributions.Distribution._validate_args
    th.distributions.Distribution.set_default_validate_args(True)
    try:
        with pytest.raises(RuntimeError, match=message):
            model.learn(32)
        assert th.distributions.Distribution._validate_args
        assert model.num_timesteps == 0  # nothing reached the env
        # outside the draw torch checks as before: the same policy's distribution refuses its NaN parameters
        with pytest.raises(ValueError, match="Expected parameter"):
            model.policy.get_distribution(th.zeros((1, *model.observation_space.shape)))
    finally:
        th.distributions.Distribution.set_default_validate_args(previous)


def test_nan_policy_raises_at_the_rollout_end_where_draw_checks_wait(monkeypatch):
    """On an accelerator the draws' log-probs are checked once, at the rollout's end (no host sync per step): the
    same error, naming the first bad step, before any update (simulated on the CPU)."""
    from sb3_grpo.common.rollout.rollout_extras import RolloutExtras

    start = RolloutExtras.start

    def deferring(*args, **kwargs):
        extras = start(*args, **kwargs)
        extras.defer_draw_checks = True
        return extras

    monkeypatch.setattr(RolloutExtras, "start", deferring)
    message = r"not finite for env 0 at rollout step 0 \(timestep 0, update 0\)"
    # Pendulum: the NaN action makes a NaN reward at the first step, reported as the draw's error
    model = quiet(GRPO("MlpPolicy", "Pendulum-v1", **SMALL))
    with th.no_grad():
        model.policy.action_net.bias.fill_(math.nan)
    with pytest.raises(RuntimeError, match=message):
        model.learn(64)
    assert model.num_timesteps == 0  # raised at the first step's reward check
    # skipping NaN rewards: the whole rollout runs, and its end raises before any update
    model = quiet(GRPO("MlpPolicy", "Pendulum-v1", nonfinite="skip", **SMALL))
    with th.no_grad():
        model.policy.action_net.bias.fill_(math.nan)
    before = params(model)
    with pytest.raises(RuntimeError, match=message):
        model.learn(64)
    assert model.num_timesteps == model.n_envs * SMALL["n_steps"] and model._n_updates == 0
    after = params(model)
    assert all(th.equal(before[k].nan_to_num(), after[k].nan_to_num()) for k in before)


def test_the_draw_keeps_a_user_default_of_no_checks():
    model = quiet(GRPO("MlpPolicy", "CartPole-v1", **SMALL))
    th.distributions.Distribution.set_default_validate_args(False)
    try:
        model.learn(32)
        assert not th.distributions.Distribution._validate_args
    finally:
        th.distributions.Distribution.set_default_validate_args(True)


def test_nan_text_policy_raises_at_the_draw():
    env = make_vec_env("TextGen-v0", n_envs=2, device="cpu", seed=0, max_new_tokens=4)
    model = quiet(GRPO("CausalLMPolicy", env, n_steps=8, batch_size=8, n_epochs=1, seed=0, device="cpu"))
    with th.no_grad():
        model.policy.lm.lm_head.weight[7].fill_(math.nan)  # one token's logit: every row's distribution is NaN
    with pytest.raises(RuntimeError, match=r"action distribution is not finite for env 0 at rollout step 0"):
        model.learn(8)


def test_bad_nonfinite_option():
    with pytest.raises(ValueError, match=r"nonfinite must be one of \('raise', 'skip'\), got 'drop'; 'raise' stops"):
        GRPO("MlpPolicy", "CartPole-v1", nonfinite="drop")


# --------------------------------------------------------------------------------------------- text envs
def _nan_for_odd_lengths(_prompts, completions):
    return [math.nan if len(c) % 2 else 1.0 for c in completions]


class _NanFor:
    """NaN for completions that start with ``text``, 1.0 for the others."""

    __name__ = "nan_for"

    def __init__(self, text):
        self.text = text

    def __call__(self, _prompts, completions):
        return [math.nan if c.startswith(self.text) else 1.0 for c in completions]


def _all_nan(_prompts, completions):
    return [math.inf] + [math.nan] * (len(completions) - 1)


def test_text_env_raises_naming_reward_and_completion():
    env = make_vec_env(None, n_envs=2, device="cpu", prompts=["The movie was"], reward=_all_nan, max_new_tokens=4)
    env.reset()
    with pytest.raises(
        ValueError,
        match=r"reward '_all_nan' returned a non-finite value \(inf\) for prompt 'The movie was' and completion",
    ):
        for _ in range(4):
            env.step(np.array([5, 5]))


def test_text_env_skip_flags_the_episode_and_grpo_drops_it():
    env = make_vec_env(
        "TextGen-v0",
        n_envs=2,
        device="cpu",
        seed=0,
        reward=_nan_for_odd_lengths,
        nonfinite_reward="skip",
        max_new_tokens=4,
    )
    # the env half, on fixed actions: env 0's completion starts with token 5's text (NaN), env 1's does not (1.0)
    bad_text = load_tokenizer().decode([5])
    assert bad_text and not load_tokenizer().decode([6, 6]).startswith(bad_text)
    fixed = make_vec_env(
        "TextGen-v0",
        n_envs=2,
        device="cpu",
        seed=0,
        reward=_NanFor(bad_text),
        nonfinite_reward="skip",
        max_new_tokens=2,
    )
    fixed.reset()
    flags = []
    for _ in range(4):  # two episodes per env
        _, rewards, dones, infos = fixed.step(np.array([5, 6]))
        flags += [
            (i, info["reward_nonfinite"], float(r)) for i, (info, r, d) in enumerate(zip(infos, rewards, dones)) if d
        ]
    assert flags == [(0, True, 0.0), (1, False, 1.0)] * 2

    model = quiet(
        GRPO("CausalLMPolicy", env, n_steps=8, batch_size=8, n_epochs=1, seed=0, device="cpu", nonfinite="skip")
    )
    log = RolloutLog()
    model.learn(32, callback=log)
    assert sum(v["rollout/skipped_episodes"] for v in log.values) > 0
    assert not nonfinite_parameters(model.policy)


# --------------------------------------------------------------------------------------------- timeouts
def test_call_reward_timeout():
    release = threading.Event()

    def hangs(_prompts, completions):
        release.wait(10)
        return [0.0] * len(completions)

    def quick(_prompts, completions):
        return [1.0] * len(completions)

    def own_timeout(_prompts, _completions):
        raise TimeoutError("upstream API")

    try:
        start = time.perf_counter()
        with pytest.raises(
            RewardTimeoutError, match=r"reward 'hangs' did not return within reward_timeout=0.2 s .*'a completion'"
        ):
            call_reward(hangs, ["p"], ["a completion"], timeout=0.2)
        assert time.perf_counter() - start < 2
    finally:
        release.set()
    assert call_reward(quick, ["p", "q"], ["a", "b"], timeout=5).tolist() == [1.0, 1.0]
    with pytest.raises(RuntimeError, match="reward 'own_timeout' raised TimeoutError: upstream API"):
        call_reward(own_timeout, ["p"], ["a"], timeout=5)
    with pytest.raises(ValueError, match="reward_timeout must be None .* or a positive number of seconds"):
        call_reward(quick, ["p"], ["a"], timeout=0)


def test_timed_reward_calls_reuse_one_thread_and_replace_one_that_timed_out():
    """A thread per call cost a thread start per finished batch; one worker thread per caller is reused, a worker
    still busy with a call that timed out is replaced, and a caller's worker stops when the caller ends."""
    import gc

    seen, release = [], threading.Event()

    def where(_prompts, completions):
        seen.append(threading.current_thread())
        return [1.0] * len(completions)

    def hangs(_prompts, completions):
        seen.append(threading.current_thread())
        release.wait(10)
        return [0.0] * len(completions)

    call_reward(where, ["p"], ["a"], timeout=5)
    call_reward(where, ["p"], ["a"], timeout=5)
    assert seen[0] is seen[1] and seen[0] is not threading.current_thread() and seen[0].daemon
    try:
        with pytest.raises(RewardTimeoutError):
            call_reward(hangs, ["p"], ["a"], timeout=0.2)
        assert seen[2] is seen[0]
        call_reward(where, ["p"], ["a"], timeout=5)  # the old worker still hangs: a new one answers at once
        assert seen[3] is not seen[2] and seen[2].is_alive()
    finally:
        release.set()
    caller = threading.Thread(target=call_reward, args=(where, ["p"], ["a"]), kwargs={"timeout": 5})
    caller.start()
    caller.join(5)
    gc.collect()
    worker = seen[4]
    assert worker is not seen[3]  # each calling thread has its own
    worker.join(5)
    assert not worker.is_alive()  # its caller ended: it stopped too


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_makes_timed_reward_calls_with_its_own_worker():
    """A child forked after the parent's worker started has no such thread: its calls must not wait on it."""

    def quick(_prompts, completions):
        return [1.0] * len(completions)

    call_reward(quick, ["p"], ["a"], timeout=5)  # the parent's worker exists
    pid = os.fork()
    if pid == 0:  # the child: exit 0 if the call is answered, 1 otherwise (a timeout after 2 s)
        try:
            ok = call_reward(quick, ["p"], ["a"], timeout=2).tolist() == [1.0]
        except BaseException:  # noqa: BLE001  (any failure is the child's exit status)
            ok = False
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
