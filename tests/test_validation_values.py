"""Hardening, class 1 (issue 17): inputs that used to be accepted and quietly change what runs. Now refused at
construction (non-finite numbers, non-number rewards, overrides that would be ignored, wrappers that break the
observation layout), or given documented semantics that are tested (an outside time limit, ``n_steps`` shorter
than an episode under group advantages).
"""

import math
import warnings

import gymnasium as gym
import numpy as np
import pytest
from helpers import assert_refused, case_ids
from stable_baselines3.common.vec_env import VecFrameStack, VecNormalize

import textrl_envs  # noqa: F401 (registers the env ids)
from sb3_grpo import GRPO
from sb3_grpo.cli import main as cli_main
from textrl_envs.rewards.base import call_reward
from textrl_envs.sb3 import make_vec_env

NAN, INF = math.nan, math.inf


def cartpole(**kwargs):
    return GRPO("MlpPolicy", "CartPole-v1", device="cpu", **kwargs)


def text_env(**kwargs):
    return make_vec_env("TextGen-v0", n_envs=2, device="cpu", max_new_tokens=4, **kwargs)


def _score(value):
    return call_reward(lambda _p, c: [value for _ in c], ["The movie was"], ["great"])


NONFINITE = r"got nan: non-finite numbers never enter training"

CASES = [
    # ---------------------------------------------------------------- the instances
    ("grpo-grad-var-coef-nan", lambda: cartpole(grad_var_coef=NAN), ValueError, rf"^grad_var_coef .*{NONFINITE}; 0 "),
    ("grpo-kl-coef-nan", lambda: cartpole(kl_coef=NAN), ValueError, rf"^kl_coef .*{NONFINITE}; 0 turns the KL"),
    ("grpo-explore-alpha-nan", lambda: cartpole(explore_alpha=NAN), ValueError, rf"^explore_alpha .*{NONFINITE}"),
    (
        "reward-str",
        lambda: _score("0.5"),
        ValueError,
        r"reward '<lambda>' .* holding '0.5' \(str\) for completion #0; rewards are numbers only .* \[float\(s\)",
    ),
    ("reward-bool", lambda: _score(True), ValueError, r"holding True \(bool\) .*rewards are numbers only"),
    ("reward-none", lambda: _score(None), ValueError, r"holding None \(NoneType\) .*rewards are numbers only"),
    (
        "cli-override-for-an-algo-not-run",
        lambda: cli_main(["compare", "--algos", "ppo", "--set", "grpo.learning_rate=1e-4", "--out", "out"]),
        SystemExit,
        r"override for 'grpo', which is not in --algos \(ppo\), so it would be ignored; add grpo to --algos",
    ),
    # ---------------------------------------------------------------- PPO's arguments that GRPO passes on, and more
    ("grpo-learning-rate-nan", lambda: cartpole(learning_rate=NAN), ValueError, rf"^learning_rate .*{NONFINITE}"),
    (
        "grpo-learning-rate-schedule-nan",
        lambda: cartpole(learning_rate=lambda p: NAN * p),
        ValueError,
        rf"^learning_rate\(1\) \(the schedule's value at progress 1\) .*{NONFINITE}",
    ),
    ("grpo-gamma-inf", lambda: cartpole(gamma=INF), ValueError, r"^gamma must be a finite number in \[0, 1\], got inf"),
    ("grpo-gae-lambda-big", lambda: cartpole(gae_lambda=1.5), ValueError, r"^gae_lambda .*got 1.5; pass e.g. gae_"),
    ("grpo-ent-coef-nan", lambda: cartpole(ent_coef=NAN), ValueError, rf"^ent_coef .*{NONFINITE}; pass e.g."),
    ("grpo-vf-coef-neg-inf", lambda: cartpole(vf_coef=-INF), ValueError, r"^vf_coef must be a finite number >= 0"),
    ("grpo-max-grad-norm-nan", lambda: cartpole(max_grad_norm=NAN), ValueError, rf"^max_grad_norm .*{NONFINITE}"),
    ("grpo-clip-range-nan", lambda: cartpole(clip_range=NAN), ValueError, rf"^clip_range .*{NONFINITE}"),
    ("grpo-target-kl-nan", lambda: cartpole(target_kl=NAN), ValueError, rf"^target_kl .*{NONFINITE}; pass e.g."),
    ("grpo-kl-target-inf", lambda: cartpole(kl_target=INF, kl_coef=0.1), ValueError, r"^kl_target .*got inf"),
    ("grpo-explore-fraction-nan", lambda: cartpole(explore_fraction=NAN), ValueError, r"^explore_fraction .*got nan"),
    ("grpo-grad-norm-warn-nan", lambda: cartpole(grad_norm_warn=NAN), ValueError, r"^grad_norm_warn .*got nan"),
    (
        "policy-temperature-nan",
        lambda: GRPO("CausalLMPolicy", text_env(), device="cpu", policy_kwargs={"temperature": NAN}),
        ValueError,
        rf"^temperature must be a finite number > 0, {NONFINITE}; e.g. temperature=1.0",
    ),
    (
        "policy-top-p-nan",
        lambda: GRPO("CausalLMPolicy", text_env(), device="cpu", policy_kwargs={"top_p": NAN}),
        ValueError,
        rf"^top_p .*{NONFINITE}; None or 1.0 keeps every token",
    ),
    ("reward-inf-int-like", lambda: _score(np.float64(INF)), ValueError, r"returned a non-finite value \(inf\)"),
    (
        "cli-override-nan",
        lambda: cli_main(["compare", "--algos", "ppo", "--set", "ppo.gamma=NaN", "--out", "out"]),
        SystemExit,
        rf"ppo: gamma must be a finite number in \[0, 1\], {NONFINITE}; pass e.g. gamma=0.99 \(check --set",
    ),
]


@pytest.mark.parametrize("case, action, error, match", CASES, ids=case_ids(CASES))
def test_refused_clearly(workdir, capsys, case, action, error, match):
    assert_refused(workdir, capsys, case, action, error, match)


# ---------------------------------------------------------------- wrappers that break the observation layout
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
        GRPO("CausalLMPolicy", env, advantage="group", n_steps=2, batch_size=8, device="cpu")
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*shorter than the env's episodes")
        GRPO("CausalLMPolicy", env, advantage="group", n_steps=5, batch_size=20, device="cpu")
        env.env_method("set_max_new_tokens", 2)  # a curriculum's shorter budget counts
        GRPO("CausalLMPolicy", env, advantage="rloo", n_steps=2, batch_size=8, device="cpu")
