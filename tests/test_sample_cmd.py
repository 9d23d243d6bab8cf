"""`sb3-grpo sample`: load a checkpoint, play episodes on an env, print or save them."""

from __future__ import annotations

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import gymnasium as gym
import pytest
from stable_baselines3 import PPO
from stable_baselines3.common.logger import configure

from sb3_grpo import GRPO
from sb3_grpo.cli import main
from sb3_grpo.playback import checkpoint_algo
from textrl_envs.sb3 import make_vec_env


@pytest.fixture(scope="module")
def text_checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt") / "grpo.zip"
    env = make_vec_env("TextGen-v0", n_envs=2, seed=0, device="cpu", max_new_tokens=3)
    model = GRPO("CausalLMPolicy", env, n_steps=8, batch_size=16, n_epochs=1, seed=0, device="cpu")
    model.set_logger(configure(None, []))
    model.learn(16)
    model.save(path)
    return path


def test_sample_writes_the_episodes_the_env_scored(text_checkpoint, tmp_path, capsys):
    out = tmp_path / "s.jsonl"
    argv = ["sample", str(text_checkpoint), "--env", "TextGen-v0", "--env-kwargs", '{"max_new_tokens": 3}', "--n", "3"]
    assert main([*argv, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    rows = [json.loads(line) for line in open(out)]
    assert [r["episode"] for r in rows] == [0, 1, 2]
    spec = gym.make("TextGen-v0", max_new_tokens=3).unwrapped.text_spec
    for row in rows:
        assert (
            row["prompt"] in spec.prompt_texts
            and 1 <= row["length"] <= 3
            and row["steps"] == row["length"] + (row["length"] < 3)
        )  # an episode ended by EOS took one more step than its completion has tokens
        assert row["reward"] == pytest.approx(float(spec.reward([row["prompt"]], [row["completion"]])[0]), rel=1e-5)
        assert repr(row["completion"]) in printed
    assert checkpoint_algo(text_checkpoint) == "grpo"
    # greedy is reproducible
    greedy = [*argv, "--deterministic", "--quiet"]
    assert main([*greedy, "--out", str(tmp_path / "a.jsonl")]) == 0
    assert main([*greedy, "--out", str(tmp_path / "b.jsonl")]) == 0
    assert open(tmp_path / "a.jsonl").read() == open(tmp_path / "b.jsonl").read()
    assert capsys.readouterr().out == ""


def test_sample_interactive_and_non_text(tmp_path, capsys):
    env = make_vec_env("GuessNumber-v0", n_envs=1, seed=0, device="cpu")
    model = GRPO("CausalLMPolicy", env, n_steps=8, batch_size=8, n_epochs=1, seed=0, device="cpu")
    model.save(tmp_path / "guess.zip")
    assert main(["sample", str(tmp_path / "guess.zip"), "--env", "GuessNumber-v0", "--n", "1"]) == 0
    printed = capsys.readouterr().out
    assert "agent:" in printed and "reward" in printed
    PPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=16).save(tmp_path / "cp.zip")
    assert checkpoint_algo(tmp_path / "cp.zip") == "ppo"
    out = tmp_path / "cp.jsonl"
    assert main(["sample", str(tmp_path / "cp.zip"), "--env", "CartPole-v1", "--n", "2", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in open(out)]
    assert len(rows) == 2 and all(r["reward"] == r["steps"] for r in rows)  # CartPole: +1 per step


def test_sample_bad_input(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["sample", str(tmp_path / "missing.zip"), "--env", "TextGen-v0"])
    assert "is not a file" in capsys.readouterr().err
    (tmp_path / "bad.zip").write_text("not a zip")
    with pytest.raises(SystemExit):
        main(["sample", str(tmp_path / "bad.zip"), "--env", "TextGen-v0"])
    assert "is not an SB3 checkpoint" in capsys.readouterr().err


def test_every_algorithm_is_known_to_sample(tmp_path, capsys):
    """--algo names each algorithm of the package; auto tells them apart where their checkpoints differ."""
    import sb3_grpo
    from sb3_grpo.playback import ALGO_CLASSES

    assert set(ALGO_CLASSES) == {"ppo", "grpo", "dr-grpo", "dapo", "gspo", "cispo", "reinforce-pp"}
    from sb3_grpo.common.on_policy import GroupOnPolicyAlgorithm

    algorithms = {n for n in sb3_grpo.__all__ if isinstance(getattr(sb3_grpo, n), type)}
    algorithms = {n for n in algorithms if issubclass(getattr(sb3_grpo, n), GroupOnPolicyAlgorithm)}
    assert algorithms == {cls_name for module, cls_name in ALGO_CLASSES.values() if module == "sb3_grpo"}
    env = make_vec_env("TextGen-v0", n_envs=2, group_size=2, seed=0, device="cpu", max_new_tokens=3)
    for name in ("dapo", "gspo", "cispo", "dr-grpo", "reinforce-pp", "grpo"):
        cls = getattr(sb3_grpo, ALGO_CLASSES[name][1])
        cls("CausalLMPolicy", env, n_steps=4, batch_size=8, seed=0, device="cpu").save(tmp_path / f"{name}.zip")
    for name in ("dapo", "dr-grpo", "reinforce-pp", "grpo"):
        assert checkpoint_algo(tmp_path / f"{name}.zip") == name
    with pytest.raises(ValueError, match="GSPO or a CISPO checkpoint.*--algo gspo or --algo cispo"):
        checkpoint_algo(tmp_path / "gspo.zip")
    argv = ["sample", str(tmp_path / "cispo.zip"), "--env", "TextGen-v0", "--env-kwargs", '{"max_new_tokens": 3}']
    assert main([*argv, "--n", "1", "--algo", "cispo", "--quiet", "--out", str(tmp_path / "c.jsonl")]) == 0
