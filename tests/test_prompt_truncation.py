"""A prompt longer than ``max_prompt_tokens`` is cut on a character boundary, from the side asked for."""

import gymnasium as gym
import pytest

import textrl_envs  # noqa: F401 (registers the env ids)
from textrl_envs.core import load_tokenizer


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
