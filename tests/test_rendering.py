"""Hardening, class 5 (issue 17): ``render_mode="human"`` prints and returns ``None``; the SB3 vector adapter
pickles; a prompt cut to ``max_prompt_tokens`` ends on a character boundary.
"""

import copy
import pickle
import warnings

import gymnasium as gym
import numpy as np
import pytest

import textrl_envs  # noqa: F401 (registers the env ids)
from textrl_envs.core import load_tokenizer
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


def test_the_sb3_adapter_pickles_and_the_copy_steps_alike():
    venv = make_vec_env("TextGen-v0", n_envs=2, device="cpu", seed=0, max_new_tokens=3)
    venv.reset()
    venv.step(np.array([5, 6]))
    for make_copy in (lambda v: pickle.loads(pickle.dumps(v)), copy.deepcopy):
        clone = make_copy(venv)
        assert type(clone) is type(venv) and clone.get_attr("group_size") == [1, 1]
        for actions in ([7, 8], [9, 10]):
            a, b = venv.step(np.array(actions)), clone.step(np.array(actions))
            assert np.array_equal(a[0]["input_ids"], b[0]["input_ids"]) and np.array_equal(a[2], b[2])
        assert [i.get("completion") for i in a[3]] == [i.get("completion") for i in b[3]]
        venv.reset(), clone.reset()


@pytest.mark.parametrize("side", ["left", "right"])
def test_a_cut_prompt_ends_on_a_character_boundary(side):
    tok = load_tokenizer()
    text = "\U0001f600\U0001f600\U0001f600 ok" if side == "left" else "ok\U0001f600\U0001f600\U0001f600"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == 13  # three 4-byte emoji of 4 byte tokens each, and "ok"
    cut_inside = gym.make("TextGen-v0", prompts=[text], max_prompt_tokens=11, prompt_truncation=side)
    kept = cut_inside.unwrapped.text_spec.prompt_ids[0].tolist()
    assert "\ufffd" not in tok.decode(kept)
    assert kept == (ids[-9:] if side == "left" else ids[:9])  # the split emoji's 2 stray bytes dropped, nothing else
    on_boundary = gym.make("TextGen-v0", prompts=[text], max_prompt_tokens=9, prompt_truncation=side)
    assert on_boundary.unwrapped.text_spec.prompt_ids[0].tolist() == kept


def test_a_prompt_with_its_own_replacement_character_is_cut_as_asked():
    tok = load_tokenizer()
    text = "\U0001f600\U0001f600 \ufffd ok"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    env = gym.make("TextGen-v0", prompts=[text], max_prompt_tokens=len(ids) - 1)
    assert env.unwrapped.text_spec.prompt_ids[0].tolist() == ids[1:]
