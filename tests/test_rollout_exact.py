"""GRPO's rollout is the same MDP whichever way it is computed: the fast paths of collect_rollouts against the
step-by-step reference paths, on the same random streams (same transitions, log-probs and buffer contents)."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch as th
from helpers import quiet
from stable_baselines3.common.callbacks import CallbackList

from sb3_grpo import GRPO
from textrl_envs.sb3 import make_vec_env

N_ENVS, N_STEPS = 4, 24
FIELDS_EXACT = ("actions", "episode_starts", "token_ids", "token_mask")
FIELDS_CLOSE = ("log_probs", "policy_log_probs", "values", "rewards", "advantages", "returns")


def _rollout(setup=None, **grpo_kwargs):
    """One rollout of GRPO on TextGen-v0 (bundled LM, EOS on, groups of 2); ``setup(model)`` runs before it."""
    env = make_vec_env("TextGen-v0", n_envs=N_ENVS, group_size=2, seed=7, device="cpu", max_new_tokens=8)
    model = quiet(GRPO("CausalLMPolicy", env, n_steps=N_STEPS, batch_size=N_STEPS * N_ENVS, seed=3, device="cpu",
                       **grpo_kwargs))  # fmt: skip
    if setup is not None:
        setup(model)
    model._setup_learn(N_STEPS * N_ENVS, None)
    callback = CallbackList([])
    callback.init_callback(model)
    assert model.collect_rollouts(model.env, callback, model.rollout_buffer, N_STEPS)
    return model.rollout_buffer


def _assert_same(fast, slow):
    for name in FIELDS_EXACT:
        a, b = getattr(fast, name), getattr(slow, name)
        a, b = (
            (a.cpu().numpy() if isinstance(a, th.Tensor) else a),
            (b.cpu().numpy() if isinstance(b, th.Tensor) else b),
        )
        np.testing.assert_array_equal(a, b, err_msg=name)
    for name in FIELDS_CLOSE:
        np.testing.assert_allclose(getattr(fast, name), getattr(slow, name), atol=2e-6, rtol=1e-5, err_msg=name)


def _two_calls(model):
    model.policy.accepts_action_filter = False  # the generic path: a second call per replaced action


@pytest.mark.parametrize(
    "extras",
    [{"explore_alpha": 0.3, "explore_fraction": 1.0}, {"explore_alpha": 0.3, "advantage": "self_critical"}],
    ids=["explore", "explore+greedy"],
)
def test_exploration_in_one_call_equals_the_two_call_path(extras):
    fast = _rollout(**extras)
    slow = _rollout(_two_calls, **extras)
    explored = fast.log_probs != fast.policy_log_probs
    assert explored.any(), "the mixture must have replaced some actions"
    _assert_same(fast, slow)


def test_cached_rollout_equals_full_recompute():
    """The reference MDP: every step recomputes every prefix (no cache, no look-ahead)."""
    fast = _rollout(explore_alpha=0.3, explore_fraction=1.0)
    slow = _rollout(explore_alpha=0.3, explore_fraction=1.0, policy_kwargs={"use_cache": False})
    assert (fast.episode_starts[1:] > 0).any(), "episodes must end and auto-reset inside the rollout"
    _assert_same(fast, slow)
