"""GRPO with its defaults as a drop-in for PPO, the way SB3's own test suite checks PPO: every action space SB3
supports, the classic-control envs, the identity tasks at PPO's thresholds, small batches and save/load.

Cheap on purpose (CI runs on 2 cores): the learning checks are SB3's ``test_identity.py`` settings (2,500 steps,
threshold 90 of 100; ``IdentityEnvBox``: 2,000 steps, against stock PPO's reward), the others train one short
rollout.
"""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from stable_baselines3 import PPO
from stable_baselines3.common.envs import IdentityEnv, IdentityEnvBox, IdentityEnvMultiBinary, IdentityEnvMultiDiscrete
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.vec_env import DummyVecEnv

from sb3_grpo import GRPO


class ShapedBoxEnv(gym.Env):
    """A one-step-reward env with a Box action space of any shape: reward ``-mean((a - target)^2)``."""

    def __init__(self, shape: tuple[int, ...], ep_length: int = 8):
        self.action_space = spaces.Box(-1.0, 1.0, shape=shape, dtype=np.float32)
        self.observation_space = spaces.Box(-1.0, 1.0, shape=(3,), dtype=np.float32)
        self.ep_length = ep_length
        self.target = np.full(shape, 0.5, dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self.observation_space.sample(), {}

    def step(self, action):
        assert np.shape(action) == self.action_space.shape
        self.t += 1
        reward = -float(np.mean((np.asarray(action) - self.target) ** 2))
        return self.observation_space.sample(), reward, False, self.t >= self.ep_length, {}


SPACES = {
    "Discrete": lambda: IdentityEnv(4, ep_length=16),
    "MultiDiscrete": lambda: IdentityEnvMultiDiscrete(4, ep_length=16),
    "MultiBinary": lambda: IdentityEnvMultiBinary(4, ep_length=16),
    "Box1": lambda: ShapedBoxEnv((2,)),
    "Box2": lambda: ShapedBoxEnv((2, 2)),
    "Box3": lambda: ShapedBoxEnv((2, 1, 3)),
}


@pytest.mark.parametrize("name", list(SPACES))
def test_every_action_space_trains_predicts_and_reloads(name, tmp_path):
    """GRPO's defaults (penalty, adaptive clip, exploration) on every action space SB3 supports."""
    env = DummyVecEnv([SPACES[name], SPACES[name]])
    model = GRPO("MlpPolicy", env, n_steps=32, batch_size=16, n_epochs=2, seed=0)
    assert model.explore_alpha > 0 and model.grad_var_coef > 0 and model.adaptive_clip is not None
    model.learn(128)
    assert model.logger.name_to_value["train/grad_var"] > 0  # the penalty ran
    obs = env.reset()
    action, _ = model.predict(obs, deterministic=True)
    assert action.shape == (2, *env.action_space.shape)
    model.save(tmp_path / "m.zip")
    loaded = GRPO.load(tmp_path / "m.zip", env=env)
    np.testing.assert_array_equal(loaded.predict(obs, deterministic=True)[0], action)


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1", "MountainCarContinuous-v0", "Acrobot-v1"])
def test_classic_envs(env_id):
    """The classic-control envs SB3's tests use: one short rollout and update with GRPO's defaults."""
    model = GRPO("MlpPolicy", env_id, n_steps=64, batch_size=32, n_epochs=1, seed=0).learn(128)
    assert model.num_timesteps == 128
    assert all(th.isfinite(p).all() for p in model.policy.parameters())


@pytest.mark.parametrize(
    "make_env", [lambda: IdentityEnv(4), lambda: IdentityEnvMultiDiscrete(4), lambda: IdentityEnvMultiBinary(4)]
)
def test_identity_discrete_at_ppos_threshold(make_env):
    """SB3's ``test_identity.py::test_discrete`` for PPO (gamma 0.4, seed 3, 2,500 steps, 90 of 100), with GRPO."""
    env = DummyVecEnv([make_env])
    model = GRPO("MlpPolicy", env, gamma=0.4, seed=3).learn(2500)
    evaluate_policy(model, env, n_eval_episodes=20, reward_threshold=90, warn=False)


def test_identity_box_as_good_as_ppo():
    """SB3's ``test_identity.py::test_continuous`` setting (``IdentityEnvBox(eps=0.5)``, 2,000 steps, net 64x64,
    gamma 0.95): GRPO's defaults end at least where stock PPO ends (both reach about 71 of 100 here)."""
    scores = {}
    for cls in (PPO, GRPO):
        env = DummyVecEnv([lambda: IdentityEnvBox(eps=0.5)])
        model = cls("MlpPolicy", env, policy_kwargs=dict(net_arch=[64, 64]), seed=0, gamma=0.95).learn(2000)
        scores[cls.__name__], _ = evaluate_policy(model, env, n_eval_episodes=20, warn=False)
    assert scores["GRPO"] >= scores["PPO"] - 5.0, scores
    assert scores["GRPO"] > 50.0, scores  # well above an untrained policy


def test_batch_smaller_than_the_penalty_slices_warns_and_trains():
    """PPO trains with a small batch (it warns about the truncated minibatch); so does GRPO, degrading the penalty:
    ``min(grad_var_slices, minibatch size)`` slices, none below 2 samples."""
    with pytest.warns(UserWarning, match="grad_var_slices=4 is more than batch_size=1"):
        model = GRPO("MlpPolicy", "CartPole-v1", batch_size=1, normalize_advantage=False, n_steps=8, seed=0)
    model.learn(16)
    assert "train/grad_var" not in model.logger.name_to_value  # one sample per minibatch: no penalty
    with pytest.warns(UserWarning, match="grad_var_slices=4 is more than batch_size=3"):
        model = GRPO("MlpPolicy", "CartPole-v1", batch_size=3, n_steps=9, seed=0)
    model.learn(18)
    assert model.logger.name_to_value["train/grad_var"] >= 0  # three slices of one sample


def test_batch_size_one_with_advantage_normalization_fails_as_ppo_does():
    """PPO refuses ``batch_size=1`` with advantage normalization (SB3 issue 440); GRPO gives the same error."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(AssertionError, match="`batch_size` must be greater than 1") as ppo_err:
            PPO("MlpPolicy", "CartPole-v1", batch_size=1)
        with pytest.raises(AssertionError, match="`batch_size` must be greater than 1") as grpo_err:
            GRPO("MlpPolicy", "CartPole-v1", batch_size=1)
    assert str(ppo_err.value) == str(grpo_err.value)


def test_box_exploration_log_prob_matches_the_mixture_density():
    """The exploration mixture's stored log-prob for a (2, 2) Box: ``log((1 - a) pi + a u)`` of the flat action."""
    from sb3_grpo.engines.step import sample_actions
    from sb3_grpo.objectives import uniform_log_prob

    env = ShapedBoxEnv((2, 2))
    model = GRPO("MlpPolicy", env, n_steps=8, batch_size=8, seed=0)
    obs = th.as_tensor(np.stack([env.observation_space.sample() for _ in range(5)]))
    alpha = 0.5
    with th.no_grad():
        actions, _, mixed, own = sample_actions(
            model.policy, obs, env.action_space, alpha, None, np.random.default_rng(0)
        )
        log_pi = model.policy.get_distribution(obs).log_prob(actions.reshape(5, -1))
    assert actions.shape == (5, 2, 2)
    np.testing.assert_allclose(own.numpy(), log_pi.numpy(), rtol=1e-5)
    log_u = uniform_log_prob(env.action_space, actions)
    expected = np.logaddexp(np.log(1 - alpha) + log_pi.numpy(), np.log(alpha) + log_u.numpy())
    np.testing.assert_allclose(mixed.numpy(), expected, rtol=1e-5)
