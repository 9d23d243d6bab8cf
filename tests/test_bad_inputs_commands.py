"""Bad inputs of the commands and of a running model get one line that says what to do, never a traceback from deep
inside: sampling on the wrong env, unwritable outputs, broken rating files, ports, engines and trackers that cannot
work, model folders that are not models, NumPy numbers, over-long numbers in a turn, edited results, and schedules
that turn NaN mid-run."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch as th
from helpers import GIVEN, assert_refused, case_ids
from stable_baselines3.common.logger import configure

from sb3_grpo import GRPO
from sb3_grpo.cli import main as cli_main

QUICK = ["compare", "--env", "CartPole-v1", "--algos", "grpo", "--seeds", "1", "--timesteps", "64"]


@pytest.fixture(scope="module")
def text_checkpoint(tmp_path_factory):
    """A text model trained on windows of 8 + 3 tokens (TextGen-v0's prompt budget, 3 new tokens)."""
    from textrl_envs.sb3 import make_vec_env

    path = tmp_path_factory.mktemp("ckpt") / "text.zip"
    env = make_vec_env("TextGen-v0", n_envs=2, seed=0, device="cpu", max_new_tokens=3)
    model = GRPO("CausalLMPolicy", env, n_steps=4, batch_size=8, n_epochs=1, seed=0, device="cpu")
    model.save(path)
    return str(path)


def _given_file(name: str, text: str) -> str:
    Path(GIVEN).mkdir(exist_ok=True)
    Path(GIVEN, name).write_text(text)
    return str(Path(GIVEN, name))


def _results(**run_changes) -> str:
    run = {"algo": "ppo", "seed": 0, "status": "complete", "curve": {"steps": [32, 64], "reward": [1.0, 2.0]},
           "final": {"reward_mean": 2.0, "deterministic": True}, "wall_time_s": 1.0, "steps_per_s": 64.0,
           "peak_rss_mb": 100.0, **run_changes}  # fmt: skip
    config = {"env_id": "CartPole-v1", "algos": ["ppo"], "seeds": [0], "timesteps": 64, "n_envs": 1,
              "eval_episodes": 2, "hyperparameters": {"ppo": {}}}  # fmt: skip
    Path(GIVEN).mkdir()
    Path(GIVEN, "results.json").write_text(json.dumps({"config": config, "runs": {"ppo/seed0": run}}))
    return cli_main(["report", GIVEN])


def _cases(checkpoint: str) -> list:
    sample = ["sample", checkpoint, "--n", "1"]
    cases = [
        (
            "sample-another-window",
            lambda: cli_main([*sample, "--env", "TextGen-v0", "--env-kwargs", '{"max_new_tokens": 5}']),  # fmt: skip
            SystemExit,
            r"trained on windows of W = max_prompt_tokens \+ max_new_tokens = 11 tokens, but this "
            r"TextGen-v0 has W = 13; pass the training run's sizes",
        ),
        (
            "sample-text-model-on-cartpole",
            lambda: cli_main([*sample, "--env", "CartPole-v1"]),
            SystemExit,
            r"the checkpoint is a text model .* but CartPole-v1 gives Box",
        ),
        (
            "sample-out-under-a-file",
            lambda: cli_main(
                [*sample, "--env", "TextGen-v0", "--out", _given_file("f.txt", "x") + "/rows.jsonl"]
            ),  # fmt: skip
            SystemExit,
            r"--out 'given/f.txt/rows.jsonl': 'given/f.txt' is a file, not a folder",
        ),
        (
            "sample-out-in-a-missing-folder",
            lambda: cli_main([*sample, "--env", "TextGen-v0", "--out", "no/such/dir/rows.jsonl"]),  # fmt: skip
            SystemExit,
            r"the folder 'no/such/dir' does not exist; create it first",
        ),
        (
            "export-transcript-without-text",
            lambda: cli_main(
                [
                    "human-eval",
                    "export",
                    _given_file("rows.jsonl", json.dumps({"prompt": "p", "transcript": [{"role": "agent"}]}) + "\n"),
                    "--out",
                    "rate",
                ]
            ),
            SystemExit,
            r"given/rows.jsonl line 1: transcript message 0 must be an object with 'role' and 'text'",
        ),
        (
            "export-broken-jsonl-line",
            lambda: cli_main(
                [
                    "human-eval",
                    "export",
                    _given_file("rows.jsonl", json.dumps({"prompt": "p", "completion": "c"}) + "\n{oops\n"),
                    "--out",
                    "rate",
                ]
            ),
            SystemExit,
            r"given/rows.jsonl line 2 is not JSON .*; each line is one JSON object",
        ),
        (
            "export-no-such-file",
            lambda: cli_main(["human-eval", "export", "missing.jsonl", "--out", "rate"]),
            SystemExit,
            r"'missing.jsonl': no such file; give a JSONL file",
        ),
        (
            "serve-port-out-of-range",
            lambda: cli_main(["human-eval", "serve", "rate", "--port", "99999"]),
            SystemExit,
            r"--port: expected a port number 0..65535 \(0: any free port\), got 99999",
        ),
        (
            "compare-model-folder-without-config",
            lambda: cli_main(
                [
                    *QUICK,
                    "--env",
                    "TextGen-v0",
                    "--set",
                    'grpo.policy_kwargs={"model": "' + str(Path(_given_file("notes.txt", "x")).parent) + '"}',
                    "--out",
                    "o",
                ]
            ),
            SystemExit,
            r"policy_kwargs\['model'\] = 'given' is a folder without a config.json, not a Hugging Face "
            r"model folder",
        ),
        (
            "estimate-memory-of-a-text-file",
            lambda: cli_main(["estimate-memory", "--model", _given_file("passwd", "root:x:0:0\n")]),  # fmt: skip
            SystemExit,
            r"--model 'given/passwd' is a file but not a model's config.json \(JSONDecodeError",
        ),
        (
            "report-edited-curve",
            lambda: _results(curve={"steps": [32, 64], "reward": ["a", 2.0]}),
            SystemExit,
            r"its run 'ppo/seed0' has a curve whose steps and reward are not two lists of numbers",
        ),
        (
            "report-edited-final",
            lambda: _results(final="2.0"),
            SystemExit,
            r"its run 'ppo/seed0' is complete but has no final reward_mean number",
        ),
        (
            "track-mlflow-unreachable",
            lambda: cli_main([*QUICK, "--track", "mlflow", "--out", "o"]),
            SystemExit,
            r"--track mlflow: the MLflow tracking server http://127.0.0.1:1 does not answer",
        ),
    ]
    if importlib.util.find_spec("vllm") is None:
        cases.append(("compare-engine-vllm-not-installed",
                      lambda: cli_main([*QUICK, "--env", "TextGen-v0", "--engine", "vllm", "--out", "o"]),
                      SystemExit, r"engine 'vllm' needs vLLM, which is not installed here; install it"))  # fmt: skip
    if importlib.util.find_spec("wandb") is not None:
        cases.append(("track-wandb-without-login", lambda: cli_main([*QUICK, "--track", "wandb", "--out", "o"]),
                      SystemExit, r"--track wandb: wandb is not logged in .* run `wandb login`"))  # fmt: skip
    return cases


CASE_IDS = [c[0] for c in _cases("x")]


@pytest.mark.parametrize("case", CASE_IDS)
def test_a_bad_input_is_one_line_that_says_what_to_do(workdir, capsys, monkeypatch, text_checkpoint, case):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:1")
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(workdir / "no-netrc"))
    (_, action, error, match) = next(c for c in _cases(text_checkpoint) if c[0] == case)
    message = assert_refused(workdir, capsys, case, action, error, match)
    assert "Traceback" not in message


def test_the_case_ids_are_unique():
    assert len(set(case_ids(_cases("x")))) == len(CASE_IDS)


def test_an_unreachable_mlflow_server_is_refused_at_once(tmp_path):
    pytest.importorskip("mlflow")
    import time

    from sb3_grpo.callbacks import MLflowOutputFormat

    start = time.monotonic()
    with pytest.raises(ValueError, match="does not answer"):
        MLflowOutputFormat(str(tmp_path), tracking_uri="http://127.0.0.1:1")
    assert time.monotonic() - start < 10


def test_a_numpy_learning_rate_trains():
    model = GRPO("MlpPolicy", "CartPole-v1", learning_rate=np.float32(1e-4), clip_range=np.float64(0.2),
                 n_steps=32, batch_size=32, n_epochs=1, seed=0, device="cpu")  # fmt: skip
    model.set_logger(configure(None, []))
    model.learn(32)
    assert type(model.learning_rate) is float and model.learning_rate == pytest.approx(1e-4)
    assert model.policy.optimizer.param_groups[0]["lr"] == pytest.approx(1e-4)


def test_a_number_of_thousands_of_digits_gets_a_reply():
    from textrl_envs.interaction import answer_turns
    from textrl_envs.tasks.interactions import Calculator, GuessNumber

    huge = "9" * 4400
    guess = GuessNumber(1, 16)
    state = guess.start("", {}, np.random.default_rng(0))
    texts, rewards, done, _ = answer_turns(guess, [state], [f"I guess {huge}"], [1])
    assert texts == ["Too many digits (at most 100). x="] and rewards.tolist() == [0.0] and not done[0]
    calc = Calculator()
    state = calc.start("What is 2*3?", {}, np.random.default_rng(0))
    texts, _, done, _ = answer_turns(calc, [state], [f"calc: {huge}*2"], [1])
    assert texts == [" error: at most 100 digits."] and not done[0]
    texts, _, _, _ = answer_turns(calc, [state], ["calc: " + "9" * 100 + "*2"], [1])  # at the limit: computed
    assert texts == [f" = {int('9' * 100) * 2}."]


@pytest.mark.parametrize("name", ["learning_rate", "clip_range", "ent_coef"])
def test_a_schedule_that_turns_nan_mid_run_is_refused_before_the_update(name):
    def schedule(progress):  # finite at the start and the end (what the constructor checks), NaN in between
        return (
            float("nan") if 0.2 < progress < 0.8 else {"learning_rate": 3e-4, "clip_range": 0.2, "ent_coef": 0.0}[name]
        )

    model = GRPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32, n_epochs=1, seed=0, device="cpu",
                 **{name: schedule})  # fmt: skip
    model.set_logger(configure(None, []))
    before = {}

    def remember(locals_, globals_):
        before.update({k: v.detach().clone() for k, v in model.policy.state_dict().items()})
        return True

    with pytest.raises(ValueError, match=rf"{name} at progress_remaining=0\.\d+ \(its schedule's value now\) must be "
                                         r"a finite number.*got nan.*fix the schedule"):  # fmt: skip
        model.learn(32 * 5, callback=remember)
    for key, value in model.policy.state_dict().items():  # the weights are those before the refused update
        assert th.isfinite(value).all() and th.equal(value, before[key]), key
    assert not math.isnan(model.policy.optimizer.param_groups[0]["lr"])
