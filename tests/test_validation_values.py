"""Values that would quietly change what runs are refused at construction: non-finite numbers (NaN / inf
hyperparameters, schedules and rewards), rewards that are not numbers, and CLI overrides that would be ignored.
"""

import math

import numpy as np
import pytest
from helpers import assert_refused, case_ids

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
    # ---------------------------------------------------------------- GRPO's own arguments, rewards, CLI overrides
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
    # None is TRL's "does not apply": alone, nothing scores the completion
    ("reward-none", lambda: _score(None), ValueError, r"returned None \(TRL's 'not applicable'\).*'skip'"),
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
