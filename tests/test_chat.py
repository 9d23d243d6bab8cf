"""Chat templates: prompts rendered as ``tokenizer.apply_chat_template`` renders them (TRL's conversational
format), with a tiny tokenizer that carries a ChatML template, built here from the bundled one (no hub)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import json

import gymnasium as gym
import numpy as np
import pytest
from helpers import CHATML, bundled_tokenizer, chat_tokenizer_folder

import textrl_envs  # noqa: F401  (registers the ids)
from textrl_envs.chat import end_of_turn_id


@pytest.fixture(scope="module")
def chat_tokenizer_dir(tmp_path_factory):
    """The bundled tokenizer plus ChatML's two special tokens and template, saved as a local tokenizer folder."""
    return chat_tokenizer_folder(tmp_path_factory.mktemp("chat-tokenizer"))


@pytest.fixture(scope="module")
def chat_tokenizer(chat_tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(chat_tokenizer_dir)


def reference_ids(tok, messages, **kwargs):
    out = tok.apply_chat_template(messages, tokenize=True, **kwargs)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def window_ids(obs):
    return list(obs["input_ids"][obs["attention_mask"] == 1])


CONVERSATIONS = [
    "2+2=",  # a str: one user message
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "The movie was"}],
    [{"role": "user", "content": "Say yes."}, {"role": "assistant", "content": "Yes, and"}],  # continued
]


def test_prompts_render_as_apply_chat_template(chat_tokenizer_dir, chat_tokenizer):
    prompts = [{"prompt": p, "i": i} for i, p in enumerate(CONVERSATIONS)]
    env = gym.make(
        "TextGen-v0", prompts=prompts, tokenizer=chat_tokenizer_dir, chat_template=True, max_prompt_tokens=40
    )
    for i, conversation in enumerate(CONVERSATIONS):
        messages = [{"role": "user", "content": conversation}] if isinstance(conversation, str) else conversation
        ends_with_assistant = messages[-1]["role"] == "assistant"
        want = reference_ids(
            chat_tokenizer,
            messages,
            add_generation_prompt=not ends_with_assistant,
            continue_final_message=ends_with_assistant,
        )
        obs, info = env.reset(options={"prompt_index": i})
        assert window_ids(obs) == want
        assert info["prompt"] == chat_tokenizer.decode(want)
    # the first one, by hand
    assert env.unwrapped.text_spec.prompt_texts[0] == "<|im_start|>user\n2+2=<|im_end|>\n<|im_start|>assistant\n"
    assert env.unwrapped.text_spec.prompt_texts[2].endswith("<|im_start|>assistant\nYes, and")


def test_the_episode_ends_at_the_end_of_turn_token(chat_tokenizer):
    im_end = chat_tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert end_of_turn_id(chat_tokenizer, CHATML) == im_end != chat_tokenizer.eos_token_id
    seen = []

    def reward(prompts, completions: list[str]):  # annotated: text, not TRL's conversational completions
        seen.append((prompts[0], completions[0]))
        return [1.0]

    env = gym.make("TextGen-v0", prompts=["Hi"], tokenizer=chat_tokenizer, chat_template=True, reward=reward)
    assert env.unwrapped.text_spec.eos_token_id == im_end
    env.reset(seed=0)
    ids = chat_tokenizer(" Hello", add_special_tokens=False)["input_ids"]
    for t in ids:
        assert env.step(t)[2] is False
    _, reward, terminated, truncated, info = env.step(im_end)
    assert terminated and not truncated and reward == 1.0
    assert info["completion"] == " Hello" and seen == [
        ("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", " Hello")
    ]


def test_an_interactive_turn_ends_at_the_end_of_turn_token(chat_tokenizer):
    from textrl_envs.interaction import Interaction, Reply

    class Echo(Interaction):
        def start(self, prompt, metadata, rng):
            return None

        def reply(self, state, text, turn):
            return Reply(f" got{text}", reward=float(turn), done=turn == 2)

    im_end = chat_tokenizer.convert_tokens_to_ids("<|im_end|>")
    env = gym.make("TextGen-v0", prompts=["Hi"], tokenizer=chat_tokenizer, chat_template=True, interaction=Echo())
    assert env.unwrapped.text_spec.turn_end_ids == (im_end,)
    env.reset(seed=0)
    hello = chat_tokenizer(" Hello", add_special_tokens=False)["input_ids"]
    for t in hello:
        assert env.step(t)[1] == 0.0  # inside the turn: no reply yet
    _, reward, terminated, _, _ = env.step(im_end)  # the template's end of turn ends the agent's turn
    assert reward == 1.0 and not terminated
    # an explicit turn_end wins over the template's
    env = gym.make(
        "TextGen-v0",
        prompts=["Hi"],
        tokenizer=chat_tokenizer,
        chat_template=True,
        interaction=Echo(),
        turn_end=hello[0],
    )
    assert env.unwrapped.text_spec.turn_end_ids == (hello[0],)


def test_a_template_string_with_a_tokenizer_that_has_none(chat_tokenizer_dir):
    plain = bundled_tokenizer()
    assert not plain.chat_template
    with pytest.raises(ValueError, match="has no chat template; pass the template itself"):
        gym.make("TextGen-v0", tokenizer=plain, chat_template=True)
    template = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}[assistant]"
    env = gym.make("TextGen-v0", prompts=["Hi"], tokenizer=plain, chat_template=template)
    spec = env.unwrapped.text_spec
    assert spec.prompt_texts == ["[user] Hi\n[assistant]"]
    assert spec.eos_token_id == plain.eos_token_id  # the template writes no special token after a turn: EOS ends it
    # a template string wins over the tokenizer's own
    env = gym.make("TextGen-v0", prompts=["Hi"], tokenizer=chat_tokenizer_dir, chat_template=template)
    assert env.unwrapped.text_spec.prompt_texts == ["[user] Hi\n[assistant]"]


def test_reset_prompt_option_and_vector_env(chat_tokenizer_dir, chat_tokenizer):
    kw = {"prompts": ["Hi", "Yo"], "tokenizer": chat_tokenizer_dir, "chat_template": True, "max_prompt_tokens": 24}
    env = gym.make("TextGen-v0", **kw)
    obs, info = env.reset(options={"prompt": "New one"})
    assert info["prompt_index"] == -1
    assert window_ids(obs) == reference_ids(
        chat_tokenizer, [{"role": "user", "content": "New one"}], add_generation_prompt=True
    )
    vec = gym.make_vec("TextGen-v0", num_envs=3, device="cpu", **kw)
    sync = gym.vector.SyncVectorEnv([lambda: gym.make("TextGen-v0", **kw) for _ in range(3)])
    np.testing.assert_array_equal(vec.reset(seed=2)[0]["input_ids"], sync.reset(seed=2)[0]["input_ids"])
    im_end = chat_tokenizer.convert_tokens_to_ids("<|im_end|>")
    _, _, term_v, _, _ = vec.step(np.array([im_end, 5, im_end]))
    _, _, term_s, _, _ = sync.step(np.array([im_end, 5, im_end]))
    assert list(term_v) == list(term_s) == [True, False, True]


def test_conversational_prompts_from_a_file(tmp_path, chat_tokenizer_dir):
    path = tmp_path / "chat.jsonl"
    rows = [{"prompt": [{"role": "user", "content": "2+2="}], "answer": "4"}]
    path.write_text("\n".join(json.dumps(r) for r in rows), encoding="utf-8")
    env = gym.make(
        "TextGen-v0", prompts=str(path), tokenizer=chat_tokenizer_dir, chat_template=True, reward="exact-match"
    )
    assert env.unwrapped.text_spec.metadata == {"answer": ["4"]}
    with pytest.raises(ValueError, match="prompt #0 is a list of chat messages; pass chat_template=True"):
        gym.make("TextGen-v0", prompts=str(path), tokenizer=chat_tokenizer_dir, reward="exact-match")


@pytest.mark.parametrize(
    "chat_template, prompts, error, match",
    [
        ("", ["Hi"], ValueError, "chat_template is an empty string"),
        (3, ["Hi"], TypeError, "chat_template must be None, True/False or a Jinja template str"),
        (True, [[{"content": "no role"}]], ValueError, "message #0 needs a str 'role'"),
        (True, [[]], TypeError, "must be a str or a list of chat messages"),
        (
            "{{ messages[0]['content'] | nosuchfilter }}",
            ["Hi"],
            ValueError,
            "the chat template failed to render prompt #0",
        ),
    ],
)
def test_bad_chat_arguments(chat_tokenizer_dir, chat_template, prompts, error, match):
    with pytest.raises(error, match=match):
        gym.make("TextGen-v0", prompts=prompts, tokenizer=chat_tokenizer_dir, chat_template=chat_template)


def test_replies_join_the_conversation_as_the_template_renders_it(chat_tokenizer_dir, chat_tokenizer):
    """An interactive chat episode's observation is the conversation ``apply_chat_template`` renders: the agent's
    turn, the reply as a user message (stripped), the next generation prompt; a turn cut by its budget gets the
    end-of-turn marker from the reply."""
    from textrl_envs.interaction import Interaction, Reply

    class Echo(Interaction):
        def reply(self, state, text, turn):
            return Reply(f" you said{text} ", done=turn == 3)

    tok = chat_tokenizer
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    kw = {"prompts": ["Hi"], "tokenizer": chat_tokenizer_dir, "chat_template": True, "interaction": Echo()}
    env = gym.make("TextGen-v0", max_turn_tokens=6, max_new_tokens=120, max_prompt_tokens=16, **kw)
    obs, _ = env.reset(seed=0)
    hello = tok(" Hello", add_special_tokens=False)["input_ids"]
    assert len(hello) < 6
    for t in [*hello, im_end]:  # a turn ended by the agent's own end-of-turn token
        obs, *_ = env.step(t)
    turn = tok(" the movie was good and long", add_special_tokens=False)["input_ids"][:6]
    for t in turn:  # a turn cut at max_turn_tokens=6
        obs, *_ = env.step(t)
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": " Hello"},
        {"role": "user", "content": "you said Hello"},
        {"role": "assistant", "content": tok.decode(turn)},
        {"role": "user", "content": "you said" + tok.decode(turn)},
    ]
    assert window_ids(obs) == reference_ids(tok, messages, add_generation_prompt=True)
