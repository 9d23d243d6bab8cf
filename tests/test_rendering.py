"""Rendering: ``render_mode="human"`` prints the text and returns ``None`` (single-turn and interactive episodes,
the vector env and the SB3 adapter); ``"ansi"`` returns the same text.
"""

import warnings

import gymnasium as gym

import textrl_envs  # noqa: F401 (registers the env ids)
from textrl_envs.sb3 import make_vec_env


def test_human_rendering_prints_and_returns_none(capsys):
    env = gym.make("TextGen-v0", render_mode="human", max_new_tokens=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Gymnasium's checker warns when human rendering returns something
        obs, info = env.reset(seed=0)
        env.step(5)
        assert env.render() is None
    printed = capsys.readouterr().out.splitlines()
    assert printed and printed[-1].startswith(info["prompt"] + "|")
    ansi = gym.make("TextGen-v0", render_mode="ansi", max_new_tokens=3)
    ansi.reset(seed=0)
    ansi.step(5)
    assert ansi.render() == printed[-1]


def test_interactive_human_rendering_prints_the_transcript_once_per_step(capsys):
    env = gym.make("GuessNumber-v0", render_mode="human")
    ansi = gym.make("GuessNumber-v0", render_mode="ansi")
    env.reset(seed=0), ansi.reset(seed=0)
    capsys.readouterr()
    tokens = [int(t) for t in env.unwrapped.text_spec.tokenizer("8\n4\n", add_special_tokens=False)["input_ids"]]
    for token in tokens:
        env.step(token), ansi.step(token)
        printed = capsys.readouterr().out.splitlines()
        assert "None" not in printed
        assert printed and "\n".join(printed) == ansi.render()


def test_vector_and_sb3_human_rendering(capsys):
    vec = gym.make_vec("TextGen-v0", num_envs=3, device="cpu", render_mode="human")
    vec.reset(seed=0)
    assert vec.render() is None
    assert len(capsys.readouterr().out.splitlines()) == 3
    venv = make_vec_env("TextGen-v0", n_envs=2, device="cpu", render_mode="human")
    venv.reset()
    assert venv.render() is None
    assert len(capsys.readouterr().out.splitlines()) == 2
    ansi = make_vec_env("TextGen-v0", n_envs=2, device="cpu", render_mode="ansi")
    ansi.reset()
    assert len(ansi.render()) == 2
