"""Window sizes: the env's window ``W = max_prompt_tokens + max_new_tokens`` is capped
(:data:`textrl_envs.core.MAX_WINDOW`) and checked before anything is allocated, so a huge budget is refused instead
of hanging or running out of memory; the policy checks ``W`` against its model's context when it is built, instead
of failing mid-rollout.
"""

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from helpers import assert_refused, case_ids

import textrl_envs  # noqa: F401 (registers the env ids)
from sb3_grpo import GRPO
from sb3_grpo.policies.policy_kwargs import check_window_fits, model_context
from textrl_envs.core import MAX_WINDOW
from textrl_envs.sb3 import make_vec_env

CAP = r"over the window cap MAX_WINDOW = 131,072 .*lower max_new_tokens or max_prompt_tokens"


def text_grpo(max_prompt_tokens, max_new_tokens):
    env = make_vec_env(
        "TextGen-v0", n_envs=2, device="cpu", max_prompt_tokens=max_prompt_tokens, max_new_tokens=max_new_tokens
    )
    return GRPO("CausalLMPolicy", env, device="cpu", n_steps=4, batch_size=8)


CASES = [
    (
        "env-max-new-tokens-1e9",
        lambda: gym.make("TextGen-v0", max_new_tokens=10**9),
        ValueError,
        rf"max_prompt_tokens \+ max_new_tokens = 8 \+ 1,000,000,000 = 1,000,000,008 tokens is {CAP}",
    ),
    ("env-max-new-tokens-1e7", lambda: gym.make("TextGen-v0", max_new_tokens=10**7), ValueError, CAP),
    ("env-max-prompt-tokens-1e7", lambda: gym.make("TextGen-v0", max_prompt_tokens=10**7), ValueError, CAP),
    (
        "vec-window-just-over-the-cap",
        lambda: make_vec_env("TextGen-v0", device="cpu", max_prompt_tokens=16, max_new_tokens=MAX_WINDOW - 15),
        ValueError,
        rf"= 16 \+ 131,057 = 131,073 tokens is {CAP}",
    ),
    (
        "policy-window-over-the-context",
        lambda: text_grpo(64, 65),
        ValueError,
        r"the env's window is W = max_prompt_tokens \+ max_new_tokens = 129 tokens, longer than the model's context "
        r"of 128 positions \(config.n_positions\); lower max_prompt_tokens \+ max_new_tokens to at most 128",
    ),
    ("policy-window-far-over-the-context", lambda: text_grpo(16, 1000), ValueError, r"W = .* = 1016 tokens, longer"),
]


@pytest.mark.parametrize("case, action, error, match", CASES, ids=case_ids(CASES))
def test_refused_clearly(workdir, capsys, case, action, error, match):
    assert_refused(workdir, capsys, case, action, error, match)


def test_a_window_at_the_cap_is_allowed():
    env = gym.make("TextGen-v0", max_prompt_tokens=16, max_new_tokens=MAX_WINDOW - 16)
    obs, _ = env.reset(seed=0)
    assert obs["input_ids"].shape == (MAX_WINDOW,)


def test_the_context_check_is_exact_for_the_bundled_lm():
    """W = 128 builds and acts on a full window; the LM itself fails at 129 positions, so the bound is tight."""
    model = text_grpo(64, 64)
    policy = model.policy
    assert model_context(policy.lm.config) == ("n_positions", 128)
    full = {"input_ids": th.randint(3, 100, (2, 128)), "attention_mask": th.ones(2, 128, dtype=th.long)}
    with th.no_grad():
        actions, values, _ = policy(full)
    assert actions.shape == (2,) and bool(th.isfinite(values).all())
    with pytest.raises(IndexError):  # what the check prevents: torch's error from inside the position embedding
        policy.lm(input_ids=th.ones(1, 129, dtype=th.long), position_ids=th.arange(129)[None])


def test_a_model_that_states_no_context_is_not_checked():
    space = gym.spaces.Dict({"input_ids": gym.spaces.Box(0, 9, (10**5,), np.int64)})
    check_window_fits(space, object())  # no n_positions / max_position_embeddings: nothing to compare
    assert model_context(object()) is None
