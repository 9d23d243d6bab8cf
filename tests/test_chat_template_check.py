"""A chat template that drops or cuts the user's message warns, instead of rendering every prompt the same silently."""

from __future__ import annotations

import warnings

import gymnasium as gym
import pytest

import textrl_envs  # noqa: F401  (registers the ids)

PROMPTS = ["the movie was", "a cat sat on the mat", "it was very"]
KEEPS = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
DROPS = "{% for m in messages %}[{{ m['role'] }}]\n{% endfor %}"
CUTS = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'][:2] }}\n{% endfor %}"


def test_a_template_that_keeps_the_message_is_quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        env = gym.make("TextGen-v0", prompts=PROMPTS, chat_template=KEEPS, max_prompt_tokens=32)
    assert [p.strip() for p in env.unwrapped.text_spec.prompt_texts] == [f"[user] {p}" for p in PROMPTS]


@pytest.mark.parametrize("template", [DROPS, CUTS], ids=["drops", "cuts"])
def test_a_template_that_loses_the_message_warns(template):
    with pytest.warns(UserWarning, match=r"the chat template loses the user's message: 3 of 3 prompts are not in "
                                         r"their rendered text"):  # fmt: skip
        env = gym.make("TextGen-v0", prompts=PROMPTS, chat_template=template, max_prompt_tokens=32)
    if template is DROPS:
        assert len(set(env.unwrapped.text_spec.prompt_texts)) == 1
