"""Arguments of the wrong type or kind (a float where an int goes, a string where a number goes, a device or
backend typo, a damaged results file for ``sb3-grpo report``) are refused by the validation layer
(:mod:`textrl_envs.validation`) with an error that names the argument, shows the value and says what to do, not a
type error deep inside or a blame on another argument; the documented-valid ones (``explore_alpha=1.0``,
``GRPO.load(..., env="CartPole-v1")``) work.
"""

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from helpers import GIVEN, assert_refused, case_ids, run_report

import textrl_envs  # noqa: F401 (registers the env ids)
from sb3_grpo import GRPO
from textrl_envs.rewards.base import call_reward
from textrl_envs.sb3 import make_vec_env
from textrl_envs.vector import TextGenVectorEnv

MPS = th.backends.mps.is_available()


def cartpole(**kwargs):
    return GRPO("MlpPolicy", "CartPole-v1", device="cpu", **kwargs)


def text_grpo(policy_kwargs):
    env = make_vec_env("TextGen-v0", n_envs=2, device="cpu", max_new_tokens=4)
    return GRPO("CausalLMPolicy", env, device="cpu", n_steps=4, batch_size=8, policy_kwargs=policy_kwargs)


def _score(out):
    return call_reward(lambda _p, c: out, ["The movie was"], ["great"])


def _empty_tokenizer_dir():
    Path(GIVEN).mkdir()
    gym.make("TextGen-v0", tokenizer=GIVEN)


CASES = [
    # ---------------------------------------------------------------- devices, tokenizers, rewards, GRPO's arguments
    pytest.param(
        "vec-device-mps",
        lambda: gym.make_vec("TextGen-v0", num_envs=2, device="mps"),
        ValueError,
        r"device='mps' .*MPS \(Apple GPU\) is not available on this machine; use device='auto'",
        marks=pytest.mark.skipif(MPS, reason="this machine has MPS"),
    ),
    (
        "env-tokenizer-empty-dir",
        _empty_tokenizer_dir,
        ValueError,
        r"tokenizer directory 'given' holds no tokenizer .*tokenizer.save_pretrained\(dir\)",
    ),
    (
        "reward-huge-int",
        lambda: _score([10**400]),
        ValueError,
        r"reward '<lambda>' returned 1000.*\(401 digits\), too large for a float; .*scale or clip",
    ),
    (
        "policy-top-k-float",
        lambda: text_grpo({"top_k": 2.5}),
        TypeError,
        r"top_k must be an int >= 0, got 2.5 \(float\); None or 0 keeps every token",
    ),
    (
        "grpo-adaptive-clip-float",
        lambda: cartpole(adaptive_clip=1.1),
        TypeError,
        r"adaptive_clip must be a pair of positive scales or None, got 1.1 \(float\); pass a pair .* \(1.1, 0.9\)",
    ),
    (
        "grpo-adaptive-clip-str",
        lambda: cartpole(adaptive_clip="ab"),
        TypeError,
        r"adaptive_clip must be a pair of positive scales or None, got 'ab' \(str\)",
    ),
    (
        "grpo-grad-var-coef-str",
        lambda: cartpole(grad_var_coef="0.1"),
        TypeError,
        r"grad_var_coef must be a finite number >= 0, got '0.1' \(str\); 0 turns the penalty off",
    ),
    (
        "grpo-batch-size-zero",  # used to blame grad_var_slices
        lambda: cartpole(batch_size=0),
        ValueError,
        r"^batch_size must be an int >= 1, got 0; pass e.g. batch_size=64",
    ),
    (
        "vec-seed-str",
        lambda: make_vec_env("TextGen-v0", n_envs=2, device="cpu", seed="a"),
        TypeError,
        r"seed must be an int in \[0, 4294967295\], got 'a' \(str\); pass None \(random\) or an int",
    ),
    (
        "env-reset-options-str",
        lambda: gym.make("TextGen-v0").unwrapped.reset(options="notadict"),
        TypeError,
        r"options must be a dict with str keys or None, got 'notadict' \(str\); e.g. options=\{'prompt'",
    ),
    ("cli-report-truncated", lambda: run_report('{"schema": 1, "conf'), SystemExit, r"is not valid JSON .*truncated"),
    ("cli-report-empty-object", lambda: run_report("{}"), SystemExit, r"has no 'config' and 'runs' objects; run the"),
    ("cli-report-list", lambda: run_report("[]"), SystemExit, r"holds a JSON list, not an object; run the comparison"),
    # ---------------------------------------------------------------- the vector env, the env, GRPO and the policy
    (
        "vec-num-envs-str",
        lambda: TextGenVectorEnv(num_envs="2", device="cpu"),
        TypeError,
        r"num_envs must be an int >= 1, got '2' \(str\); pass e.g. num_envs=8",
    ),
    (
        "vec-group-size-float",
        lambda: make_vec_env("TextGen-v0", n_envs=4, group_size=2.0, device="cpu"),
        TypeError,
        r"group_size must be an int >= 1, got 2.0 \(float\); 1 \(no groups\) or the completions per prompt",
    ),
    (
        "vec-obs-backend-typo",
        lambda: TextGenVectorEnv(num_envs=2, device="cpu", obs_backend="nump"),
        ValueError,
        r"obs_backend must be one of \('numpy', 'torch'\), got 'nump' \(did you mean 'numpy'\?\)",
    ),
    (
        "vec-seed-list-with-str",
        lambda: gym.make_vec("TextGen-v0", num_envs=2, device="cpu").reset(seed=[0, "1"]),
        TypeError,
        r"seed\[1\] must be an int in \[0, 4294967295\], got '1' \(str\)",
    ),
    (
        "vec-seed-negative",
        lambda: gym.make_vec("TextGen-v0", num_envs=2, device="cpu").reset(seed=-1),
        ValueError,
        r"seed must be an int in \[0, 4294967295\], got -1; pass None \(random\) or an int",
    ),
    (
        "vec-monitor-str",
        lambda: make_vec_env("TextGen-v0", n_envs=2, device="cpu", monitor="yes"),
        TypeError,
        r"monitor must be True or False, got 'yes' \(str\)",
    ),
    (
        "env-prompt-index-str",
        lambda: gym.make("TextGen-v0").unwrapped.reset(options={"prompt_index": "0"}),
        TypeError,
        r"options\['prompt_index'\] must be an int in \[0, \d+\], got '0' \(str\); the env has \d+ prompt",
    ),
    (
        "env-reward-kwargs-list",
        lambda: gym.make("TextGen-v0", reward_kwargs=["target"]),
        TypeError,
        r"reward_kwargs must be a dict with str keys or None, got \['target'\] \(list\); e.g. reward_kwargs=",
    ),
    (
        "reward-string-array",
        lambda: _score(np.array(["0.5"])),
        ValueError,
        r"reward '<lambda>' must return a sequence of floats.*dtype <U3; rewards are numbers only",
    ),
    (
        "grpo-n-epochs-zero",
        lambda: cartpole(n_epochs=0),
        ValueError,
        r"n_epochs must be an int >= 1, got 0; pass e.g. n_epochs=10",
    ),
    (
        "grpo-verbose-str",
        lambda: cartpole(verbose="1"),
        TypeError,
        r"verbose must be an int in \[0, 2\], got '1' \(str\); pass e.g. verbose=1",
    ),
    (
        "grpo-policy-kwargs-list",
        lambda: cartpole(policy_kwargs=[64, 64]),
        TypeError,
        r"policy_kwargs must be a dict with str keys or None, got \[64, 64\] \(list\); e.g. policy_kwargs=",
    ),
    (
        "grpo-grad-var-params-str",
        lambda: cartpole(grad_var_params="action_net"),
        TypeError,
        r"grad_var_params must be None .* or a list of parameter-name prefixes, got 'action_net' \(str\); e.g.",
    ),
    (
        "grpo-tensorboard-log-int",
        lambda: cartpole(tensorboard_log=5),
        TypeError,
        r"tensorboard_log must be a folder path \(str\) or None, got 5 \(int\); e.g. tensorboard_log='runs/tb'",
    ),
    (
        "grpo-seed-float",
        lambda: cartpole(seed=1.5),
        TypeError,
        r"seed must be an int in \[0, 4294967295\], got 1.5 \(float\)",
    ),
    (
        "grpo-device-typo",
        lambda: GRPO("MlpPolicy", "CartPole-v1", device="gpu"),
        ValueError,
        r"device: device='gpu' is not a torch device; pass 'auto'",
    ),
    (
        "policy-critic-hidden-zero",
        lambda: text_grpo({"critic_hidden": 0}),
        ValueError,
        r"critic_hidden must be an int >= 1, got 0; pass e.g. critic_hidden=256",
    ),
    (
        "policy-use-cache-str",
        lambda: text_grpo({"use_cache": "False"}),
        TypeError,
        r"use_cache must be True or False, got 'False' \(str\)",
    ),
]


@pytest.mark.parametrize("case, action, error, match", CASES, ids=case_ids(CASES))
def test_refused_clearly(workdir, capsys, case, action, error, match):
    assert_refused(workdir, capsys, case, action, error, match)


def test_explore_alpha_one_is_allowed_and_warns_with_a_number():
    """explore_alpha=1.0 is documented as allowed: it builds (no ZeroDivisionError in the warning's text)."""
    with pytest.warns(UserWarning, match=r"explore_alpha=1 .*1 / \(1 - alpha\) = inf, above the clip bound"):
        model = cartpole(explore_alpha=1.0)
    assert model.explore_alpha == 1.0


def test_load_takes_an_env_id_as_the_constructor_does(tmp_path):
    model = cartpole(n_steps=32, batch_size=32, seed=0)
    model.save(tmp_path / "m.zip")
    loaded = GRPO.load(tmp_path / "m.zip", env="CartPole-v1", device="cpu")
    assert loaded.env is not None and loaded.env.num_envs == 1
    obs = loaded.env.reset()
    assert np.array_equal(loaded.predict(obs, deterministic=True)[0], model.predict(obs, deterministic=True)[0])
