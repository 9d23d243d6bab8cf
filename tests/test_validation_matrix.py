"""The bad-input matrix: malformed inputs across envs, rewards, policies, algorithm arguments, callbacks, loading
and the CLI. Each must fail with a clear error (the test matches the message: what was wrong, and usually what
to do) and leave no partial files behind: every case runs in an empty working directory (the CLI's default
output folder and every path a case names live there) that must hold exactly what the case put there before.
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import functools
import math
import threading
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from helpers import assert_refused, case_ids

import textrl_envs  # noqa: F401 (registers the env ids)
from benchmarks.cli import main as bench_main
from sb3_grpo import GRPO
from sb3_grpo.callbacks import (
    AtomicCheckpointCallback,
    EarlyStoppingCallback,
    GammaSchedule,
    MaxNewTokensCurriculum,
    RollbackCallback,
    TrainingMonitor,
    atomic_save,
)
from sb3_grpo.cli import main as cli_main
from textrl_envs.rewards import make_reward
from textrl_envs.rewards.base import RewardTimeoutError, call_reward
from textrl_envs.sb3 import make_vec_env

TB = "tb"  # a tensorboard folder every GRPO case asks for: a failed constructor must not create it


@functools.cache
def text_env(group_size: int = 1):
    return make_vec_env("TextGen-v0", n_envs=2, group_size=group_size, device="cpu", max_new_tokens=4)


def grpo(*args, **kwargs):
    return GRPO(*args, tensorboard_log=TB, device="cpu", **kwargs)


def cli(*argv):
    """Run the CLI (a usage error raises SystemExit(2), checked by the test)."""
    return cli_main(list(argv))


# -- rewards that misbehave ---------------------------------------------------------------------------------
def boom(_prompts, completions):
    return [1 / 0 for _ in completions]


def one_too_many(_prompts, completions):
    return [0.0] * (len(completions) + 1)


def words(_prompts, completions):
    return ["good" for _ in completions]


def nan_reward(_prompts, completions):
    return [math.nan for _ in completions]


_RELEASE = threading.Event()


def hangs(_prompts, completions):
    _RELEASE.wait(20)
    return [0.0 for _ in completions]


def _score(reward, **kw):
    return call_reward(reward, ["The movie was"], ["great"], **kw)


def _step_once(env):
    env.reset(seed=0)
    return env.step(10**6)


def _step_before_reset():
    return gym.make("TextGen-v0", max_new_tokens=4).step(5)


def _cli_bad_config():
    Path("given").mkdir()
    Path("given/bad.json").write_text("{not json")
    cli("compare", "--config", "given/bad.json", "--out", "out")


def _cli_existing_out():
    Path("given").mkdir()
    Path("given/results.json").write_text("{}")
    cli("compare", "--env", "CartPole-v1", "--algos", "ppo", "--timesteps", "10", "--out", "given")


def _torn_checkpoint():
    Path("given").mkdir()
    model = GRPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32, device="cpu")
    model.save("given/whole.zip")
    data = Path("given/whole.zip").read_bytes()
    Path("given/torn.zip").write_bytes(data[: len(data) // 2])
    GRPO.load("given/torn.zip")


def _nan_weights_checkpoint():
    model = GRPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32, device="cpu")
    with th.no_grad():
        model.policy.action_net.bias.fill_(math.nan)
    atomic_save(model, "ckpt/model.zip")


CUDA = th.cuda.is_available()

# (id, action, expected exception, message regex)
CASES = [
    # ---------------------------------------------------------------- environments
    (
        "env-max-new-tokens-zero",
        lambda: gym.make("TextGen-v0", max_new_tokens=0),
        ValueError,
        r"max_new_tokens must be an int >= 1, got 0; pass e.g. max_new_tokens=24",
    ),
    (
        "env-max-new-tokens-str",
        lambda: gym.make("TextGen-v0", max_new_tokens="8"),
        TypeError,
        r"max_new_tokens must be an int >= 1, got '8' \(str\); pass e.g.",
    ),
    (
        "env-prompts-empty",
        lambda: gym.make("TextGen-v0", prompts=[]),
        ValueError,
        r"prompts is empty; give at least one prompt",
    ),
    (
        "env-prompts-a-string",
        lambda: gym.make("TextGen-v0", prompts="The movie was"),
        TypeError,
        r"prompts must be a list of str",
    ),
    (
        "env-prompt-dict-without-prompt",
        lambda: gym.make("TextGen-v0", prompts=[{"text": "hi"}]),
        ValueError,
        r"prompt #0 is a dict without a str 'prompt' key",
    ),
    (
        "env-unknown-kwarg",
        lambda: gym.make("TextGen-v0", max_tokens=8),
        TypeError,
        r"unknown keyword argument\(s\) max_tokens; known: .*max_new_tokens",
    ),
    (
        "env-tokenizer-missing-dir",
        lambda: gym.make("TextGen-v0", tokenizer="no/such/tokenizer"),
        ValueError,
        r"tokenizer path 'no/such/tokenizer' is not a directory",
    ),
    (
        "env-reward-typo",
        lambda: gym.make("TextGen-v0", reward="sentimnt"),
        ValueError,
        r"reward 'sentimnt' is not registered; known: .*Did you mean 'sentiment'",
    ),
    (
        "env-prompt-truncation",
        lambda: gym.make("TextGen-v0", prompt_truncation="middle"),
        ValueError,
        r"prompt_truncation must be one of \('left', 'right', 'error'\)",
    ),
    (
        "env-prompt-too-long",
        lambda: gym.make(
            "TextGen-v0", prompts=["a prompt that is far too long"], max_prompt_tokens=2, prompt_truncation="error"
        ),
        ValueError,
        r"prompt #0 .* tokens, over max_prompt_tokens=2; raise max_prompt_tokens",
    ),
    (
        "env-nonfinite-reward-option",
        lambda: gym.make("TextGen-v0", nonfinite_reward="ignore"),
        ValueError,
        r"nonfinite_reward must be one of \('raise', 'skip'\)",
    ),
    (
        "env-reward-timeout-negative",
        lambda: gym.make("TextGen-v0", reward_timeout=-1),
        ValueError,
        r"reward_timeout must be None \(no limit\) or a positive number of seconds",
    ),
    (
        "env-action-out-of-range",
        lambda: _step_once(gym.make("TextGen-v0", max_new_tokens=4)),
        ValueError,
        r"action 1000000 is outside the action space Discrete\(\d+\)",
    ),
    (
        "env-step-before-reset",
        _step_before_reset,
        gym.error.ResetNeeded,
        r"Cannot call env.step\(\) before calling env.reset\(\)",
    ),
    (
        "env-unwrapped-step-before-reset",
        lambda: gym.make("TextGen-v0").unwrapped.step(5),
        RuntimeError,
        r"step\(\) called before reset\(\); call env.reset\(\) first",
    ),
    (
        "vec-group-does-not-divide",
        lambda: make_vec_env("TextGen-v0", n_envs=3, group_size=2, device="cpu"),
        ValueError,
        r"num_envs=3 is not divisible by group_size=2",
    ),
    (
        "vec-not-a-text-env",
        lambda: make_vec_env("CartPole-v1", n_envs=2),
        ValueError,
        r"'CartPole-v1' is not a textrl_envs text env",
    ),
    (
        "vec-budget-above-max",
        lambda: text_env().env_method("set_max_new_tokens", 9),
        ValueError,
        r"budget must be an int in \[1, 4\] .*build the env with a larger max_new_tokens",
    ),
    (
        "vec-actions-wrong-shape",
        lambda: (text_env().reset(), text_env().step(np.array([1, 2, 3]))),
        ValueError,
        r"actions have shape \(3,\); expected 2 integer token ids",
    ),
    pytest.param(
        "vec-cuda-unavailable",
        lambda: make_vec_env("TextGen-v0", n_envs=2, device="cuda"),
        ValueError,
        r"CUDA is not available on this machine; use device='auto'",
        marks=pytest.mark.skipif(CUDA, reason="this machine has CUDA"),
    ),
    # ---------------------------------------------------------------- rewards
    (
        "reward-raises",
        lambda: _score(boom),
        RuntimeError,
        r"reward 'boom' raised ZeroDivisionError: division by zero .*first completion: 'great'",
    ),
    (
        "reward-wrong-length",
        lambda: _score(one_too_many),
        ValueError,
        r"reward 'one_too_many' returned 2 value\(s\) .* for 1 completions; it must return exactly one float",
    ),
    (
        "reward-not-numbers",
        lambda: _score(words),
        ValueError,
        r"reward 'words' must return a sequence of floats, one per completion; got list",
    ),
    (
        "reward-nan",
        lambda: _score(nan_reward),
        ValueError,
        r"reward 'nan_reward' returned a non-finite value \(nan\) for prompt 'The movie was' and completion 'great'",
    ),
    (
        "reward-hangs",
        lambda: _score(hangs, timeout=0.1),
        RewardTimeoutError,
        r"reward 'hangs' did not return within reward_timeout=0.1 s .*'great'",
    ),
    (
        "reward-missing-metadata",
        lambda: _score(make_reward("exact-match")),
        RuntimeError,
        r"needs per-example answer in its keyword arguments",
    ),
    (
        "reward-on-nonfinite-option",
        lambda: _score(words, on_nonfinite="zero"),
        ValueError,
        r"on_nonfinite must be one of \('raise', 'nan'\)",
    ),
    # ---------------------------------------------------------------- policies
    (
        "policy-temperature-zero",
        lambda: grpo("CausalLMPolicy", text_env(), policy_kwargs={"temperature": 0}),
        ValueError,
        r"temperature must be a finite number > 0, got 0; e.g. temperature=1.0",
    ),
    (
        "policy-top-p",
        lambda: grpo("CausalLMPolicy", text_env(), policy_kwargs={"top_p": 1.5}),
        ValueError,
        r"top_p must be a finite number in \(0, 1\], got 1.5; None or 1.0 keeps every token",
    ),
    (
        "policy-model-missing-dir",
        lambda: grpo("CausalLMPolicy", text_env(), policy_kwargs={"model": "no/such/lm"}),
        FileNotFoundError,
        r"model directory 'no/such/lm' does not exist",
    ),
    (
        "policy-on-cartpole",
        lambda: grpo("CausalLMPolicy", "CartPole-v1"),
        ValueError,
        r"CausalLMPolicy needs a Dict observation space with keys \['input_ids', 'attention_mask'\]",
    ),
    ("policy-unknown-name", lambda: grpo("NoSuchPolicy", "CartPole-v1"), ValueError, r"Policy NoSuchPolicy unknown"),
    # ---------------------------------------------------------------- algorithm arguments
    (
        "grpo-advantage",
        lambda: grpo("MlpPolicy", "CartPole-v1", advantage="grpo"),
        ValueError,
        r"advantage must be one of \('gae', 'group', 'group_mean', 'rloo', 'self_critical', 'group_turn', 'role'\), "
        r"got 'grpo' "
        r"\(did you mean 'group'\?\)",
    ),
    (
        "grpo-grad-var-coef",
        lambda: grpo("MlpPolicy", "CartPole-v1", grad_var_coef=-0.1),
        ValueError,
        r"grad_var_coef must be a finite number >= 0, got -0.1; 0 turns the penalty off",
    ),
    (
        "grpo-grad-var-slices",
        lambda: grpo("MlpPolicy", "CartPole-v1", grad_var_slices=1),
        ValueError,
        r"grad_var_slices must be an int >= 2",
    ),
    (
        "grpo-grad-var-params",
        lambda: grpo("MlpPolicy", "CartPole-v1", grad_var_params=["nope"]),
        ValueError,
        r"grad_var_params=\['nope'\] matches no trainable parameter; names start with",
    ),
    (
        "grpo-explore-alpha",
        lambda: grpo("MlpPolicy", "CartPole-v1", explore_alpha=1.5),
        ValueError,
        r"explore_alpha must be a finite number in \[0, 1\], got 1.5; 0 turns exploration off",
    ),
    (
        "grpo-adaptive-clip",
        lambda: grpo("MlpPolicy", "CartPole-v1", adaptive_clip=(1.1, -0.9)),
        ValueError,
        r"adaptive_clip must be a pair of positive scales",
    ),
    (
        "grpo-kl-target-without-coef",
        lambda: grpo("MlpPolicy", "CartPole-v1", kl_target=0.01),
        ValueError,
        r"kl_target adapts kl_coef multiplicatively; give a starting kl_coef > 0",
    ),
    (
        "grpo-group-on-ungrouped-env",
        lambda: grpo("CausalLMPolicy", text_env(), advantage="group"),
        ValueError,
        r"advantage='group' needs an env with group_size > 1",
    ),
    (
        "grpo-nonfinite-option",
        lambda: grpo("MlpPolicy", "CartPole-v1", nonfinite="ignore"),
        ValueError,
        r"nonfinite must be one of \('raise', 'skip'\), got 'ignore'; 'raise' stops with an error",
    ),
    (
        "grpo-load-missing",
        lambda: GRPO.load("no/such/model"),
        FileNotFoundError,
        r"no saved model at 'no/such/model' or 'no/such/model.zip'",
    ),
    (
        "grpo-load-torn",
        _torn_checkpoint,
        ValueError,
        r"'given/torn.zip' is not a complete saved model .*latest_checkpoint\(folder\)",
    ),
    (
        "save-nan-weights",
        _nan_weights_checkpoint,
        ValueError,
        r"not saving ckpt/model.zip: the policy has non-finite values in action_net.bias",
    ),
    # ---------------------------------------------------------------- callbacks
    (
        "cb-checkpoint-freq",
        lambda: AtomicCheckpointCallback(0, "ckpt"),
        ValueError,
        r"save_freq must be an int >= 1, got 0",
    ),
    (
        "cb-early-stopping-patience",
        lambda: EarlyStoppingCallback(gym.make("CartPole-v1"), patience=0, eval_freq=100),
        ValueError,
        r"patience must be an int >= 1, got 0",
    ),
    (
        "cb-rollback-threshold",
        lambda: RollbackCallback(threshold=0),
        ValueError,
        r"threshold must be a finite number > 0",
    ),
    (
        "cb-gamma-range",
        lambda: GammaSchedule(0.9, 1.2),
        ValueError,
        r"gamma_max must be a discount factor in \[0, 1\], got 1.2",
    ),
    (
        "cb-curriculum-empty",
        lambda: MaxNewTokensCurriculum([]),
        ValueError,
        r"schedule is empty; give at least one \(timestep, max_new_tokens\) stage",
    ),
    (
        "cb-monitor-nothing",
        lambda: TrainingMonitor(),
        ValueError,
        r"needs at least one of max_grad_norm, kl_target, approx_kl_target",
    ),
    # ---------------------------------------------------------------- CLI (exit status 2 and a message on stderr)
    (
        "cli-seeds-zero",
        lambda: cli("compare", "--seeds", "0", "--out", "out"),
        SystemExit,
        r"argument --seeds: expected an integer >= 1, got 0",
    ),
    (
        "cli-timesteps-negative",
        lambda: cli("compare", "--timesteps", "-5", "--out", "out"),
        SystemExit,
        r"argument --timesteps: expected an integer >= 1",
    ),
    (
        "cli-unknown-algo",
        lambda: cli("compare", "--algos", "ppo,trpo", "--out", "out"),
        SystemExit,
        r"unknown algorithm\(s\) 'trpo'; known: ppo",
    ),
    (
        "cli-bad-set",
        lambda: cli("compare", "--set", "learning_rate", "--out", "out"),
        SystemExit,
        r"--set 'learning_rate': expected ALGO.KEY=VALUE",
    ),
    (
        "cli-unknown-param",
        lambda: cli("compare", "--env", "CartPole-v1", "--algos", "grpo", "--set", "grpo.lr=1", "--out", "out"),
        SystemExit,
        r"grpo has no parameter 'lr'; its parameters: ",
    ),
    (
        "cli-missing-config",
        lambda: cli("compare", "--config", "missing.json", "--out", "out"),
        SystemExit,
        r"--config missing.json: No such file or directory",
    ),
    ("cli-bad-config", _cli_bad_config, SystemExit, r"--config given/bad.json: not valid JSON"),
    (
        "cli-unknown-env",
        lambda: cli("compare", "--env", "NoSuchEnv-v0", "--out", "out"),
        SystemExit,
        r"unknown env 'NoSuchEnv-v0'; text envs: TextGen-v0",
    ),
    (
        "cli-group-algo-on-cartpole",
        lambda: cli("compare", "--env", "CartPole-v1", "--algos", "grpo-group", "--out", "out"),
        SystemExit,
        r"grpo-group need\(s\) envs in prompt groups",
    ),
    ("cli-existing-out", _cli_existing_out, SystemExit, r"--out given already exists; pass --resume to continue it"),
    (
        "cli-overwrite-and-resume",
        lambda: cli("compare", "--overwrite", "--resume"),
        SystemExit,
        r"argument --resume: not allowed with argument --overwrite",
    ),
    (
        "cli-report-missing",
        lambda: cli("report", "no/such/run"),
        SystemExit,
        r"no/such/run/results.json does not exist",
    ),
    ("cli-unknown-command", lambda: cli("frobnicate"), SystemExit, r"invalid choice: 'frobnicate'"),
    (
        "cli-perf-threads",
        lambda: bench_main(["perf", "--threads", "0", "--out", "out"]),
        SystemExit,
        r"argument --threads: expected an integer >= 1, got 0",
    ),
    pytest.param(
        "cli-device-cuda",
        lambda: cli("compare", "--device", "cuda", "--out", "out"),
        SystemExit,
        r"CUDA is not available",
        marks=pytest.mark.skipif(CUDA, reason="this machine has CUDA"),
    ),
]


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _RELEASE.clear()
    yield tmp_path
    _RELEASE.set()


def test_the_matrix_is_large_enough():
    assert len(CASES) >= 25
    groups = {name.split("-")[0] for name in case_ids(CASES)}
    assert {"env", "vec", "reward", "policy", "grpo", "cb", "cli"} <= groups


@pytest.mark.parametrize("case, action, error, match", CASES, ids=case_ids(CASES))
def test_bad_input(workdir, capsys, case, action, error, match):
    assert_refused(workdir, capsys, case, action, error, match)
