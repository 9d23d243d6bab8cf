"""TRL's reward functions plug in unchanged: keyword calls, conversational completions with chat prompts,
``completion_ids``, ``trainer_state`` and ``None`` for "not applicable"; our older positional rewards keep working.

The functions of ``trl.rewards`` are imported from TRL itself (the ``test`` extra installs ``trl`` and
``math-verify``); those tests skip, saying so, where TRL is absent."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import gymnasium as gym
import numpy as np
import pytest

import textrl_envs  # noqa: F401  (registers the ids)
from textrl_envs.rewards import CompositeReward, call_reward
from textrl_envs.rewards.calls import TrainerState, call_style, check_reward_call
from textrl_envs.sb3 import make_vec_env

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "{% if not (loop.last and continue_final_message) %}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
NO_TRL = "trl is not installed: pip install -e '.[test]' (the test extra) installs it"


def trl_rewards():
    pytest.importorskip("trl", reason=NO_TRL)
    pytest.importorskip("math_verify", reason="math-verify is not installed (the test extra installs it)")
    from trl import rewards

    return rewards


@pytest.fixture(scope="module")
def chat_tokenizer(tmp_path_factory):
    """The bundled tokenizer with ChatML's tokens and template (built here, no hub)."""
    from transformers import AutoTokenizer

    from textrl_envs.assets import tokenizer_path

    tok = AutoTokenizer.from_pretrained(tokenizer_path())
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = CHATML
    path = tmp_path_factory.mktemp("chat-tokenizer")
    tok.save_pretrained(path)
    return AutoTokenizer.from_pretrained(path)


def run_episode(env, text: str, end_token: int | None = None):
    """Reset ``env`` and write ``text`` token by token (then ``end_token``); the last step's reward and info."""
    env.reset(seed=0)
    tok = env.unwrapped.tokenizer
    ids = tok(text, add_special_tokens=False)["input_ids"] + ([end_token] if end_token is not None else [])
    for t in ids:
        _, reward, terminated, truncated, info = env.step(t)
        if terminated or truncated:
            return reward, info
    raise AssertionError("the episode did not end")


# -- the call forms ------------------------------------------------------------------------------------------


def test_call_style_reads_the_signature():
    def completions_only(completions, **kwargs):
        return []

    def with_column(completions, answer, **kwargs):
        return []

    def ids_only(completion_ids, **kwargs):
        return []

    def only_kwargs(**kwargs):
        return []

    assert call_style(completions_only) == call_style(with_column) == call_style(ids_only) == "keywords"
    assert call_style(only_kwargs) == "keywords"
    assert call_style(lambda prompts, completions: []) == "keywords"  # the two forms agree on it
    assert call_style(lambda p, c: []) == call_style(lambda _prompts, completions: []) == "positional"
    assert call_style(lambda p, c, answer: []) == "positional"
    assert call_style(max) == "positional"  # no signature to read: the older form


def test_the_testers_trl_functions_get_what_they_name():
    """`def f(completions, **kwargs)` and `def f(completions, answer, **kwargs)` failed with positional calls."""
    seen = {}

    def trl_reward(completions, **kwargs):
        seen["kwargs"] = sorted(kwargs)
        return [float(len(c)) for c in completions]

    def with_answer(completions, answer, **kwargs):
        return [1.0 if c.strip() == a else 0.0 for c, a in zip(completions, answer)]

    prompts = [{"prompt": "12+7=", "answer": "19"}]
    env = gym.make("Arithmetic-v0", prompts=prompts, reward=trl_reward, max_new_tokens=4)
    reward, info = run_episode(env, " 19", env.unwrapped.text_spec.eos_token_id)
    assert reward == len(info["completion"]) == 3
    assert seen["kwargs"] == ["answer", "completion_ids", "prompts", "trainer_state"]
    env = gym.make("Arithmetic-v0", prompts=prompts, reward=with_answer, max_new_tokens=4)
    assert run_episode(env, " 19", env.unwrapped.text_spec.eos_token_id)[0] == 1.0
    assert run_episode(env, " 18", env.unwrapped.text_spec.eos_token_id)[0] == 0.0


def test_a_function_without_kwargs_gets_only_what_it_names():
    calls = []

    def strict(completions, completion_ids):
        calls.append((completions, completion_ids))
        return [float(len(i)) for i in completion_ids]

    out = call_reward(strict, ["p", "q"], ["ab", "c"], {"answer": ["1", "2"]}, completion_ids=[(5, 6), (7,)])
    assert out.tolist() == [2.0, 1.0] and calls == [(["ab", "c"], [[5, 6], [7]])]


def test_older_positional_rewards_keep_working():
    out = call_reward(lambda p, c, answer: [float(a == x) for x, a in zip(c, answer)], ["q"], ["7"], {"answer": ["7"]})
    assert out.tolist() == [1.0]
    out = call_reward(lambda _prompts, completions: [float(len(completions[0]))], ["q"], ["abc"])
    assert out.tolist() == [3.0]


@pytest.mark.parametrize(
    "reward, match",
    [
        (lambda x: [0.0], r"takes \(x\), which no call fills.*keywords: prompts=, completions=, completion_ids="),
        (lambda completions, solution: [0.0], r"needs the argument\(s\) solution, which no call gives.*\(answer\)"),
        (lambda p, c, gold: [0.0], r"needs the argument\(s\) gold"),
    ],
)
def test_a_reward_no_call_can_fill_is_refused_when_the_env_is_built(reward, match):
    with pytest.raises(TypeError, match=match):
        gym.make("Arithmetic-v0", prompts=[{"prompt": "1+1=", "answer": "2"}], reward=reward)
    with pytest.raises(TypeError, match=match):
        check_reward_call(reward, ["answer"], "r")


# -- completion_ids, trainer_state ---------------------------------------------------------------------------


def test_completion_ids_are_the_generated_tokens_in_the_single_and_the_vector_env():
    got = []

    def ids_reward(completion_ids, **kwargs):
        got.extend(tuple(i) for i in completion_ids)
        return [float(len(i)) for i in completion_ids]

    env = gym.make("TextGen-v0", reward=ids_reward, max_new_tokens=5)
    reward, info = run_episode(env, " good good good good good")
    assert got == [info["completion_ids"]] and reward == 5.0
    venv = gym.make_vec("TextGen-v0", num_envs=3, reward=ids_reward, max_new_tokens=4)
    venv.reset(seed=1)
    got.clear()
    for _ in range(4):
        _, rewards, term, trunc, infos = venv.step(np.array([5, 6, 7]))
    final = infos["final_info"]
    assert (term | trunc).all() and got == [tuple(final["completion_ids"][i]) for i in range(3)]
    np.testing.assert_array_equal(rewards, [4.0, 4.0, 4.0])


def test_trainer_state_is_set_on_the_env_and_checked():
    seen = []

    def shaped(completions, trainer_state, **kwargs):
        seen.append(trainer_state)
        return [trainer_state.progress] * len(completions)

    env = gym.make("TextGen-v0", reward=shaped, max_new_tokens=2)
    assert run_episode(env, " good good")[0] == 0.0 and seen[-1] == TrainerState()
    env.unwrapped.set_trainer_state(global_step=3, max_steps=4)
    assert run_episode(env, " good good")[0] == 0.75 and seen[-1].global_step == 3
    with pytest.raises(TypeError, match="TrainerState's fields are global_step, max_steps"):
        env.unwrapped.set_trainer_state(epoch=1)
    with pytest.raises(TypeError, match=r"set_trainer_state\(global_step=-1\): it must be an int >= 0"):
        env.unwrapped.set_trainer_state(global_step=-1)


def test_grpo_sets_the_trainer_state_at_every_rollout():
    from sb3_grpo import GRPO

    steps = []

    def progress(completions, trainer_state, **kwargs):
        steps.append((trainer_state.global_step, trainer_state.max_steps))
        return [0.0] * len(completions)

    venv = make_vec_env("TextGen-v0", n_envs=2, group_size=2, reward=progress, max_new_tokens=2)
    model = GRPO("CausalLMPolicy", venv, n_steps=2, batch_size=4, n_epochs=1, advantage="group", seed=0, device="cpu")
    model.learn(12)  # 3 rollouts of 2 steps x 2 envs; every episode is 2 tokens, so each rollout ends 2 episodes
    assert sorted(set(steps)) == [(0, 3), (1, 3), (2, 3)]


# -- None: "not applicable" ----------------------------------------------------------------------------------


def half_none(completions, **kwargs):
    return [None if "x" in c else 1.0 for c in completions]


def test_none_leaves_a_reward_out_of_a_sum_as_trl_does():
    def length(completions, **kwargs):
        return [float(len(c)) for c in completions]

    total = call_reward(CompositeReward([(half_none, 2.0), (length, 0.5)]), ["p"] * 3, ["ab", "x", "abcd"])
    assert total.tolist() == [2.0 + 1.0, 0.5, 2.0 + 2.0]
    both = CompositeReward([(half_none, 1.0), (half_none, 1.0)])
    with pytest.raises(ValueError, match=r"returned None \(TRL's 'not applicable'\).*'x'.*nonfinite_reward='skip'"):
        call_reward(both, ["p", "p"], ["a", "x"])
    assert np.isnan(call_reward(both, ["p", "p"], ["a", "x"], on_nonfinite="nan")).tolist() == [False, True]


def test_an_episode_no_reward_applies_to_is_refused_or_skipped():
    env = gym.make("TextGen-v0", reward=[half_none], max_new_tokens=2)
    with pytest.raises(ValueError, match="returned None"):
        run_episode(env, " x x")
    env = gym.make("TextGen-v0", reward=[half_none], max_new_tokens=2, nonfinite_reward="skip")
    reward, info = run_episode(env, " x x")
    assert reward == 0.0 and info["reward_nonfinite"] is True
    reward, info = run_episode(env, " good good")
    assert reward == 1.0 and info["reward_nonfinite"] is False


def test_a_list_of_rewards_is_their_sum():
    def one(completions, **kwargs):
        return [1.0] * len(completions)

    env = gym.make("TextGen-v0", reward=[one, one, "length"], max_new_tokens=2)
    reward, info = run_episode(env, " good good")
    parts = info["reward_components"]
    assert parts["one"] == 1.0 and reward == pytest.approx(2.0 + parts["length"])
    with pytest.raises(ValueError, match=r"reward=\[\] holds no reward"):
        gym.make("TextGen-v0", reward=[])


# -- chat prompts: conversational completions ----------------------------------------------------------------


def test_with_chat_prompts_a_trl_reward_gets_conversations(chat_tokenizer):
    seen = {}

    def conversational(prompts, completions, **kwargs):
        seen["prompts"], seen["completions"] = prompts, completions
        return [float(c[0]["content"] == " Hello") for c in completions]

    def text(prompts, completions: list[str], **kwargs):
        seen["text"] = (prompts, completions)
        return [0.0] * len(completions)

    im_end = chat_tokenizer.convert_tokens_to_ids("<|im_end|>")
    system = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    env = gym.make(
        "TextGen-v0", prompts=[system], tokenizer=chat_tokenizer, chat_template=True, reward=[conversational, text],
        max_prompt_tokens=32,
    )  # fmt: skip
    reward, info = run_episode(env, " Hello", im_end)
    assert reward == 1.0
    assert seen["prompts"] == [system] and seen["completions"] == [[{"role": "assistant", "content": " Hello"}]]
    assert seen["text"] == ([info["prompt"]], [" Hello"])  # annotated list[str]: the rendered text
    # a prompt given at reset: its own conversation
    env.reset(options={"prompt": "Yo"})
    for t in chat_tokenizer(" Hello", add_special_tokens=False)["input_ids"] + [im_end]:
        env.step(t)
    assert seen["prompts"] == [[{"role": "user", "content": "Yo"}]]


def test_a_string_reward_on_chat_prompts_gets_a_hint(chat_tokenizer):
    def words(prompts, completions, **kwargs):
        return [float(len(c.split())) for c in completions]

    im_end = chat_tokenizer.convert_tokens_to_ids("<|im_end|>")
    env = gym.make("TextGen-v0", prompts=["Hi"], tokenizer=chat_tokenizer, chat_template=True, reward=words)
    with pytest.raises(RuntimeError, match=r"conversational form.*completion\[0\]\['content'\].*list\[str\]"):
        run_episode(env, " Hello", im_end)


# -- TRL's own reward functions ------------------------------------------------------------------------------


def test_trl_rewards_module_plugs_in_unchanged(chat_tokenizer):
    rewards = trl_rewards()
    overlong = rewards.get_soft_overlong_punishment(max_completion_len=40, soft_punish_cache=10)
    prompts = [{"prompt": "What is 1/3?", "solution": r"\frac{1}{3}"}]
    im_end = chat_tokenizer.convert_tokens_to_ids("<|im_end|>")
    env = gym.make(
        "TextGen-v0", prompts=prompts, tokenizer=chat_tokenizer, chat_template=True, max_new_tokens=64,
        max_prompt_tokens=32, reward=[rewards.accuracy_reward, rewards.think_format_reward, overlong],
    )  # fmt: skip
    answer = r"<think>ok</think> The answer is \boxed{\frac{1}{3}}"
    reward, info = run_episode(env, answer, im_end)
    n = len(info["completion_ids"])
    # TRL's own functions called directly, as TRL calls them, on the same completion
    conv = [[{"role": "assistant", "content": answer}]]
    expected = {
        "accuracy_reward": rewards.accuracy_reward(conv, [r"\frac{1}{3}"])[0],
        "think_format_reward": rewards.think_format_reward(conv)[0],
        "soft_overlong_punishment_reward": overlong([[0] * n])[0],
    }
    assert expected["accuracy_reward"] == 1.0 and expected["think_format_reward"] == 1.0 and 30 < n < 40
    assert info["reward_components"] == pytest.approx(expected)
    assert reward == pytest.approx(2.0 + (30 - n) / 10)  # DAPO's soft punishment past 40 - 10 tokens
    wrong, info = run_episode(env, r"\boxed{\frac{1}{2}}", im_end)
    assert info["reward_components"]["accuracy_reward"] == 0.0 and info["reward_components"]["think_format_reward"] == 0


def test_trl_accuracy_reward_none_for_an_unparseable_solution_is_left_out(chat_tokenizer):
    rewards = trl_rewards()
    im_end = chat_tokenizer.convert_tokens_to_ids("<|im_end|>")
    prompts = [{"prompt": "Say hi", "solution": "no math here"}]
    kwargs = {"prompts": prompts, "tokenizer": chat_tokenizer, "chat_template": True, "max_new_tokens": 16}
    env = gym.make("TextGen-v0", reward=[rewards.accuracy_reward, rewards.think_format_reward], **kwargs)
    reward, info = run_episode(env, "<think></think>hi", im_end)
    assert reward == 1.0 and np.isnan(info["reward_components"]["accuracy_reward"])
    env = gym.make("TextGen-v0", reward=rewards.accuracy_reward, nonfinite_reward="skip", **kwargs)
    reward, info = run_episode(env, "hi", im_end)
    assert reward == 0.0 and info["reward_nonfinite"] is True


def test_a_trl_reward_file_trains_unchanged(chat_tokenizer):
    """GRPO on a chat task with TRL's rewards, a hand-written TRL-style one that reads trainer_state, and TRL's
    multi-reward list: a few updates run, every reward is called TRL's way."""
    rewards = trl_rewards()
    from transformers import GPT2Config, GPT2LMHeadModel

    from sb3_grpo.presets import make_preset

    calls = []

    def brevity(completions, completion_ids, trainer_state, **kwargs):  # TRL-style, written by hand
        calls.append((completions[0][0]["role"], trainer_state.global_step, len(completion_ids)))
        return [-len(ids) / 8 for ids in completion_ids]

    prompts = [{"prompt": f"What is {a}+{b}?", "solution": str(a + b)} for a, b in [(1, 2), (3, 4)]]
    venv = make_vec_env(
        "TextGen-v0", n_envs=4, group_size=2, prompts=prompts, tokenizer=chat_tokenizer, chat_template=True,
        max_new_tokens=4, max_prompt_tokens=24, reward=[rewards.accuracy_reward, rewards.think_format_reward, brevity],
    )  # fmt: skip
    lm = GPT2LMHeadModel(GPT2Config(vocab_size=len(chat_tokenizer), n_layer=1, n_embd=16, n_head=2, n_positions=32))
    model = make_preset("trl-grpo", "CausalLMPolicy", venv, n_steps=4, batch_size=16, seed=0, device="cpu",
                        policy_kwargs={"model": lm}, learning_rate=1e-3)  # fmt: skip
    model.learn(32)
    assert {role for role, _, _ in calls} == {"assistant"}
    assert {step for _, step, _ in calls} == {0, 1}
