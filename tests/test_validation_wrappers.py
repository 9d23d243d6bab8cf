"""Wrappers around the text vector env: one that breaks the observation layout (stacked frames, normalised ids)
is refused at the first step, before any update; one that keeps the token ids (reward normalisation) trains."""

import numpy as np
import pytest
from stable_baselines3.common.vec_env import VecFrameStack, VecNormalize

from sb3_grpo import GRPO
from textrl_envs.sb3 import make_vec_env


def text_env(**kwargs):
    return make_vec_env("TextGen-v0", n_envs=2, device="cpu", max_new_tokens=4, **kwargs)


@pytest.mark.parametrize(
    "wrap, match",
    [
        (lambda v: VecFrameStack(v, 2), r"not one run of ones ending at the last column .*VecFrameStack .*remove it"),
        (lambda v: VecNormalize(v, norm_obs=True), r"not integer token ids .*VecNormalize\(venv, norm_obs=False\)"),
    ],
    ids=["VecFrameStack", "VecNormalize-obs"],
)
def test_wrappers_that_break_the_layout_are_refused_at_the_first_step(wrap, match):
    model = GRPO("CausalLMPolicy", wrap(text_env()), device="cpu", n_steps=4, batch_size=8, n_epochs=1)
    before = [p.detach().clone() for p in model.policy.parameters()]
    with pytest.raises(ValueError, match=match):
        model.learn(8)
    assert all(np.array_equal(a, b.detach()) for a, b in zip(before, model.policy.parameters()))  # never trained


def test_reward_normalization_alone_still_trains():
    """The check refuses what it cannot read, not every wrapper: VecNormalize(norm_obs=False) keeps the ids."""
    env = VecNormalize(text_env(), norm_obs=False, norm_reward=True)
    model = GRPO("CausalLMPolicy", env, device="cpu", n_steps=4, batch_size=8, n_epochs=1, seed=0)
    before = [p.detach().clone() for p in model.policy.parameters()]
    model.learn(8)
    assert any(not np.array_equal(a, b.detach()) for a, b in zip(before, model.policy.parameters()))
