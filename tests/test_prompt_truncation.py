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


def test_cut_prompts_are_warned_about_once_with_the_share_cut():
    import warnings

    prompts = ["one two three four five six seven eight nine ten eleven twelve", "hi", "ok"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gym.make("TextGen-v0", prompts=prompts, max_prompt_tokens=4)
    cut = [str(w.message) for w in caught if "max_prompt_tokens" in str(w.message)]
    assert len(cut) == 1
    assert "1 of 3 prompts (33%)" in cut[0] and "cut on the left" in cut[0]
    longest = len(load_tokenizer()(prompts[0], add_special_tokens=False)["input_ids"])
    assert f"Pass max_prompt_tokens={longest}" in cut[0]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gym.make("TextGen-v0", prompts=prompts, max_prompt_tokens=longest)
    assert not [w for w in caught if "max_prompt_tokens" in str(w.message)]


def test_a_chat_template_over_the_prompt_budget_gets_a_clear_hint(tmp_path):
    tok = load_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    tok.save_pretrained(tmp_path)
    with pytest.warns(UserWarning, match=r"3 of 3 prompts \(100%\).*chat template adds its role markers.*not the "):
        gym.make(
            "TextGen-v0",
            prompts=["2+2=", "3+3=", "4+4="],
            tokenizer=str(tmp_path),
            chat_template=True,
            max_prompt_tokens=8,
        )


def test_a_cut_reset_prompt_is_warned_about():
    env = gym.make("TextGen-v0", prompts=["hi"], max_prompt_tokens=4)
    with pytest.warns(UserWarning, match=r"options\['prompt'\] is longer than max_prompt_tokens=4.*cut on the left"):
        env.reset(seed=0, options={"prompt": "one two three four five six seven eight nine ten"})


def test_an_over_long_prompt_is_not_quoted_whole_in_an_error():
    text = "word " * 200_000
    with pytest.raises(ValueError, match=r"1,000,000 characters") as err:
        gym.make("TextGen-v0", prompts=[text], max_prompt_tokens=4, prompt_truncation="error")
    assert len(str(err.value)) < 1000
