"""Instruct mode: final answers read from free text, checked against hand-worked cases, and tasks asked the way a
chat model is asked (the question, the instruction, the chat template), with the bundled-LM defaults unchanged."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import importlib.util

import gymnasium as gym
import numpy as np
import pytest
from helpers import chat_tokenizer_folder

import textrl_envs  # noqa: F401  (registers the ids)
from textrl_envs.instruct import INSTRUCTIONS, InstructFormat
from textrl_envs.rewards.answers import FinalAnswerReward, answers_match, final_answer, in_answer_style

needs_math = pytest.mark.skipif(
    importlib.util.find_spec("math_verify") is None, reason='needs Math-Verify: pip install "textrl[math]"'
)
needs_reasoning = pytest.mark.skipif(
    importlib.util.find_spec("reasoning_gym") is None, reason='needs reasoning-gym: pip install "textrl[reasoning]"'
)


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory):
    return chat_tokenizer_folder(tmp_path_factory.mktemp("chat-tokenizer"))


@pytest.mark.parametrize(
    "text, answer",
    [
        ("17 + 25 = 42.\nAnswer: 42.", "42"),
        ("First \\boxed{1}, then \\boxed{\\frac{3}{4}}", "\\frac{3}{4}"),  # the last box, braces balanced
        ("x \\boxed{7} y \\boxed{8", "7"),  # an unclosed box: the whole one before it
        ("The answer is 58 + 26 = 84.", "84"),  # after the answer line's last '='
        ("The answer to this problem is 3.", "3"),  # no 'answer:' / 'answer is': the last number
        ("Answer:\nsee below: 12", "12"),  # an empty answer line: the last number
        ("It costs 1,000 dollars", "1,000"),
        ("ANSWER: -7", "-7"),
        ("a reply without a number", None),
        ("No, it does not logically follow that all cats are dogs.", "No"),  # a verdict the reply opens with
        ("**yes**. The premises say so.", "Yes"),
        ("The answer is: true", "True"),  # a verdict on the answer line, capitalized
        ("Answer: **no**.", "No"),
        ("No problem: 2 + 3 = 5", "5"),  # a number comes first
        ("Nothing follows.", None),  # 'No' only as a whole word
        ("Maybe. Yes.", None),  # a verdict only where the reply opens
    ],
)
def test_final_answer(text, answer):
    assert final_answer(text) == answer


@pytest.mark.parametrize(
    "given, reference, check, expected",
    [
        ("42", "42", "number", True),
        ("42.0", "42", "number", True),
        ("−3", "-3", "number", True),  # a Unicode minus
        ("1,000", "1000", "number", True),
        ("3/4", "0.75", "number", True),
        ("42 apples", "42", "number", True),  # the first number of a stated answer
        ("41", "42", "number", False),
        ("Paris", "paris", "exact", True),
        ("Paris.", "paris", "exact", False),
        (None, "1", "number", False),
        ("", "1", "exact", False),
    ],
)
def test_answers_match(given, reference, check, expected):
    assert answers_match(given, reference, check) is expected


@needs_math
@pytest.mark.parametrize(
    "given, reference, expected",
    [("\\frac{3}{4}", "0.75", True), ("0.5", "1/2", True), ("x", "1", False), ("-3", "-3", True), ("2", "3", False)],
)
def test_answers_match_with_math_verify(given, reference, expected):
    assert answers_match(given, reference, "math") is expected


def test_final_answer_reward_by_hand():
    reward = FinalAnswerReward(check="number", style="answer-line", format_weight=0.25)
    completions = ["so 12.\nAnswer: 12", "The answer is 12", "Answer: 13", "nothing"]
    # correct + 0.25 * stated on an 'Answer:' line
    assert reward(["q"] * 4, completions, answer=["12"] * 4) == [1.25, 1.0, 0.25, 0.0]
    assert in_answer_style("\\boxed{3}", "boxed") and not in_answer_style("Answer: 3", "boxed")
    with pytest.raises(ValueError, match="no 'answer'"):
        reward(["q"], ["1"], answer=[None])


def test_math_check_without_math_verify_names_the_extra(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_math_verify(name, *args, **kwargs):
        if name.startswith("math_verify"):
            raise ImportError("No module named 'math_verify'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_math_verify)
    with pytest.raises(ImportError, match=r'pip install "textrl\[math\]".*check=.number.'):
        FinalAnswerReward(check="math")


# -- tasks in instruct mode -------------------------------------------------------------------------------------


def rendered(tok, messages):
    return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def operands(prompt: str) -> list[str]:
    """``"12+7="`` as ``["12", "+", "7"]``, by hand (a sign in front of the first operand kept)."""
    body = prompt.rstrip("=")
    for i, ch in enumerate(body[1:], start=1):
        if ch in "+-*":
            return [body[:i], ch, body[i + 1 :]]
    raise AssertionError(prompt)


@needs_math
def test_arithmetic_instruct_renders_the_question_and_grades_the_final_answer(chat_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(chat_dir)
    env = gym.make("Arithmetic-v0", tokenizer=chat_dir, instruct=True, system_prompt="Be brief.")
    spec = env.unwrapped.text_spec
    plain = gym.make("Arithmetic-v0").unwrapped.text_spec
    assert len(spec.prompt_texts) == len(plain.prompt_texts)
    system = {"role": "system", "content": "Be brief."}
    for i in (0, 1, len(plain.prompt_texts) - 1):
        question = f"What is {' '.join(operands(plain.prompt_texts[i]))}?\n\n{INSTRUCTIONS['answer-line']}"
        assert spec.prompt_texts[i] == rendered(tok, [system, {"role": "user", "content": question}])
    assert (spec.max_prompt_tokens, spec.max_new_tokens) == (96, 64)
    assert spec.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")
    assert isinstance(spec.reward, FinalAnswerReward) and spec.reward.check == "math"
    answer = spec.metadata["answer"][0]
    completions = [f"It is {answer}.\nAnswer: {answer}", "Answer: 99999", "I don't know"]
    assert list(spec.score([0, 0, 0], completions)) == [1.0, 0.0, 0.0]
    obs, _ = env.reset(seed=0, options={"prompt": "3+4="})  # a prompt given at reset is asked the same way
    shown = tok.decode(obs["input_ids"][obs["attention_mask"] == 1])
    user = {"role": "user", "content": f"What is 3 + 4?\n\n{INSTRUCTIONS['answer-line']}"}
    assert shown == rendered(tok, [system, user])


@needs_math
def test_instruct_vector_env_equals_the_single_env(chat_dir):
    kwargs = {"tokenizer": chat_dir, "instruct": {"style": "boxed", "format_weight": 0.5}}
    vec = gym.make_vec("Arithmetic-v0", num_envs=2, device="cpu", **kwargs)
    sync = gym.vector.SyncVectorEnv([lambda: gym.make("Arithmetic-v0", **kwargs) for _ in range(2)])
    a, _ = vec.reset(seed=3)
    b, _ = sync.reset(seed=3)
    np.testing.assert_array_equal(a["input_ids"], b["input_ids"])
    spec = vec.text_spec
    assert "\\boxed{}" in spec.prompt_texts[0] and spec.reward.format_weight == 0.5
    answer = spec.metadata["answer"][0]
    assert list(spec.score([0, 0], [f"\\boxed{{{answer}}}", f"Answer: {answer}"])) == [1.5, 1.0]


def test_bundled_defaults_are_unchanged():
    spec = gym.make("Arithmetic-v0").unwrapped.text_spec
    assert (spec.max_prompt_tokens, spec.max_new_tokens, spec.chat_template, spec.instruct) == (8, 4, None, None)
    assert type(spec.reward).__name__ == "ArithmeticReward"


@needs_reasoning
def test_reasoning_gym_instruct_reads_the_final_answer_with_the_task_scorer(chat_dir):
    env = gym.make("ReasoningGym-v0", task="basic_arithmetic", size=4, tokenizer=chat_dir,
                   instruct={"format_weight": 0.1})  # fmt: skip
    spec = env.unwrapped.text_spec
    suite = env.unwrapped.suite
    assert suite.reward.answer_format == "final" and (spec.max_prompt_tokens, spec.max_new_tokens) == (256, 128)
    assert spec.prompt_texts[0].count(INSTRUCTIONS["answer-line"]) == 1
    answer = suite.items[0]["answer"]
    scores = spec.score([0, 0, 0], [f"work\nAnswer: {answer}", f"The answer is {answer}.", "Answer: 1e9"])
    assert list(scores) == [1.1, 1.0, 0.1]
    plain = gym.make("ReasoningGym-v0", task="basic_arithmetic", size=4).unwrapped
    assert plain.suite.reward.answer_format == "plain" and plain.text_spec.chat_template is None


def test_an_answer_prefix_starts_every_reply_and_the_grader_reads_it(chat_dir):
    """``answer_prefix`` ends every conversation with it as an assistant message (rendered as the start of the
    reply, with no end-of-turn after it); the grader reads the prefix and the completion together."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(chat_dir)
    fmt = {"answer_prefix": "Answer:", "check": "number", "format_weight": 0.5}
    env = gym.make("Arithmetic-v0", tokenizer=chat_dir, instruct=fmt)
    vec = gym.make_vec("Arithmetic-v0", num_envs=2, device="cpu", tokenizer=chat_dir, instruct=fmt)
    spec = env.unwrapped.text_spec
    plain = gym.make("Arithmetic-v0").unwrapped.text_spec
    question = f"What is {' '.join(operands(plain.prompt_texts[0]))}?\n\n{INSTRUCTIONS['answer-line']}"
    messages = [{"role": "user", "content": question}, {"role": "assistant", "content": "Answer:"}]
    expected = tok.apply_chat_template(messages, tokenize=False, continue_final_message=True)
    assert spec.prompt_texts[0] == expected and expected.endswith("<|im_start|>assistant\nAnswer:")
    obs, _ = env.reset(seed=0, options={"prompt_index": 0})
    assert tok.decode(obs["input_ids"][obs["attention_mask"] == 1]) == expected
    assert vec.text_spec.prompt_texts == spec.prompt_texts
    answer = spec.metadata["answer"][0]
    # " 7" after the prefix is the answer line "Answer: 7": right, and in the asked style (the format bonus)
    scores = spec.score([0, 0, 0], [f" {answer}", " 99999", " I don't know"])
    assert list(scores) == [1.5, 0.5, 0.5]
    no_prefix = gym.make("Arithmetic-v0", tokenizer=chat_dir, instruct={"check": "number", "format_weight": 0.5})
    assert list(no_prefix.unwrapped.text_spec.score([0], [f" {answer}"])) == [1.0]  # a bare number: no answer line


@needs_reasoning
def test_reasoning_gym_answer_prefix_is_read_by_the_task_scorer(chat_dir):
    env = gym.make("ReasoningGym-v0", task="basic_arithmetic", size=4, tokenizer=chat_dir,
                   instruct={"answer_prefix": "Answer:"})  # fmt: skip
    spec, suite = env.unwrapped.text_spec, env.unwrapped.suite
    assert spec.prompt_texts[0].endswith("<|im_start|>assistant\nAnswer:")
    answer = suite.items[0]["answer"]
    assert list(spec.score([0, 0], [f" {answer}", " 1e9"])) == [1.0, 0.0]
    assert suite.reward.answer_prefix == "Answer:"


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"answer_prefix": "Answer: "}, ValueError, "ends in whitespace: end it at the last word \\('Answer:'\\)"),
        ({"answer_prefix": 3}, TypeError, "answer_prefix must be a str"),
    ],
)
def test_bad_answer_prefix(chat_dir, kwargs, error, match):
    with pytest.raises(error, match=match):
        gym.make("Arithmetic-v0", tokenizer=chat_dir, instruct=kwargs)


@pytest.mark.parametrize("prefix, error", [("Answer: ", ValueError), (b"Answer:", TypeError)])
def test_answer_reward_refuses_a_prefix_the_env_would_refuse(prefix, error):
    """A reward built by hand checks its ``answer_prefix`` as the env's instruct format does."""
    with pytest.raises(error, match="answer_prefix"):
        FinalAnswerReward(check="number", answer_prefix=prefix)


@needs_reasoning
@pytest.mark.parametrize("prefix, error", [("Answer: ", ValueError), (b"Answer:", TypeError)])
def test_reasoning_gym_reward_refuses_a_prefix_the_env_would_refuse(prefix, error):
    from textrl_envs.suites.reasoning import ReasoningGymReward

    with pytest.raises(error, match="answer_prefix"):
        ReasoningGymReward(dataset=[], answer_prefix=prefix)


def test_answer_prefix_refuses_interactive_tasks_and_a_second_prefill(chat_dir):
    with pytest.raises(ValueError, match="starts a single-turn reply.*reply_prefix"):
        gym.make("GuessNumber-v0", tokenizer=chat_dir, instruct={"answer_prefix": "My guess:"})
    from textrl_envs.instruct import instruct_prompts

    asked = [{"role": "user", "content": "2+2?"}]
    fmt = InstructFormat(answer_prefix="Answer:")
    assert instruct_prompts([asked], fmt) == [[*asked, {"role": "assistant", "content": "Answer:"}]]
    with pytest.raises(ValueError, match="already ends with one \\('It is'\\)"):
        instruct_prompts([[*asked, {"role": "assistant", "content": "It is"}]], fmt)


@pytest.mark.parametrize(
    "env_id, kwargs, error, match",
    [
        ("TextGen-v0", {"instruct": True}, ValueError, "no instruct mode.*Arithmetic-v0"),
        ("Arithmetic-v0", {"instruct": True, "chat_template": False}, ValueError, "renders prompts with a chat"),
        ("Arithmetic-v0", {"instruct": {"styl": "boxed"}}, ValueError, r"unknown field\(s\) \['styl'\]"),
        ("Arithmetic-v0", {"instruct": {"style": "xml"}}, ValueError, "style must be one of"),
        ("Arithmetic-v0", {"instruct": "yes"}, TypeError, "instruct must be"),
        ("Arithmetic-v0", {"system_prompt": "Be brief."}, ValueError, "chat_template=True"),
        ("Arithmetic-v0", {"instruct": True, "system_prompt": 3}, TypeError, "system_prompt must be a str"),
    ],
)
def test_bad_instruct_arguments(chat_dir, env_id, kwargs, error, match):
    with pytest.raises(error, match=match):
        gym.make(env_id, tokenizer=chat_dir, **kwargs)


def test_instruct_format_validates_itself():
    assert InstructFormat().text == INSTRUCTIONS["answer-line"]
    assert InstructFormat(instruction="Reply with a number.").text == "Reply with a number."
    with pytest.raises(ValueError, match="format_weight"):
        InstructFormat(format_weight=-1)
    with pytest.raises(ValueError, match="check must be one of"):
        InstructFormat(check="fuzzy")


# -- interactive tasks in instruct mode ---------------------------------------------------------------------------


def test_chat_interactions_read_free_text_by_hand():
    from textrl_envs.tasks.interactions import Calculator, GuessNumber

    guess = GuessNumber(1, 8, chat=True)
    state = {"secret": 5}
    assert guess.reply(state, "I think it is 3.\nAnswer: 4", 1).text == "Higher."  # the stated answer, not 3
    assert guess.reply(state, "Maybe 7", 1).text == "Lower."
    assert guess.reply(state, "no idea", 1).text == "Please guess one whole number."
    assert guess.reply(state, "Answer: 5", 2) == (("Correct!", 0.9, True))
    calc = Calculator(chat=True)
    state = {"answer": "444"}
    assert calc.reply(state, "Let me compute.\ncalc: 37*12", 1).text == "calc: 37*12 = 444"
    assert calc.reply(state, "calc: 37 x 12.", 1).text == "calc: 37*12 = 444"
    assert calc.reply(state, "calc: thirty-seven", 1).text.startswith("The calculator reads lines")
    assert calc.reply(state, "calc: 37*12 = 444\nAnswer: 444", 2) == (None, 1.0, True)  # an answer ends it
    assert calc.reply(state, "The answer is 440.", 2) == (None, 0.0, True)


@pytest.mark.parametrize("env_id", ["GuessNumber-v0", "ToolArithmetic-v0", "TicTacToe-v0", "KuhnPoker-v0", "Nim-v0"])
def test_interactive_instruct_vector_env_equals_sync(chat_dir, env_id):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(chat_dir)
    kwargs = {"tokenizer": chat_dir, "instruct": True}
    vec = gym.make_vec(env_id, num_envs=2, device="cpu", **kwargs)
    sync = gym.vector.SyncVectorEnv(
        [lambda: gym.make(env_id, **kwargs) for _ in range(2)], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )
    spec = vec.text_spec
    assert spec.interaction.chat and spec.max_turn_tokens > 3
    a, _ = vec.reset(seed=5)
    b, _ = sync.reset(seed=5)
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    script = tok("calc: 3*4", add_special_tokens=False)["input_ids"] + [im_end]  # a call (ToolArithmetic), a guess
    script += tok("Answer: 4", add_special_tokens=False)["input_ids"] + [im_end]  # the answer ends the episode
    for t in script:
        a, ra, ta, tra, _ = vec.step(np.array([t, t]))
        b, rb, tb, trb, _ = sync.step(np.array([t, t]))
        np.testing.assert_array_equal(a["input_ids"], b["input_ids"])
        np.testing.assert_array_equal(ra, rb)
        np.testing.assert_array_equal(ta | tra, tb | trb)


def test_games_speak_plain_language_by_hand():
    from textrl_envs.games import SelfPlay, make_game
    from textrl_envs.games.base import Game, play_moves

    ttt = make_game("tictactoe")
    state = play_moves(ttt, ttt.initial(None), [" 5", " 1"])
    assert ttt.chat_render(state, 0) == (
        "O | 2 | 3\n--+---+--\n4 | X | 6\n--+---+--\n7 | 8 | 9\n\nFree cells: 2, 3, 4, 6, 7, 8, 9. "
        "Your move (X): reply with the number of a free cell."
    )
    assert ttt.chat_render(state, 1).startswith("X | 2 | 3\n--+---+--\n4 | O | 6")  # each side is X
    assert ttt.parse(state, "5 is taken, so I take 3.\nAnswer: 3", chat=True) == 3  # the stated answer
    assert ttt.parse(state, "Answer: 5", chat=True) is None  # taken: illegal
    kuhn = make_game("kuhn")
    hand = kuhn.play(kuhn.initial(np.random.default_rng(0)), "p")
    assert kuhn.chat_render(hand, 1).endswith("So far: I passed. Do you pass or bet? Reply with one word: pass or bet.")
    assert kuhn.chat_read("I have the King, so I bet.") == "b" and kuhn.chat_read("Answer: fold") == "p"
    facing = kuhn.play(hand, "b")
    assert kuhn.chat_render(facing, 0).endswith(
        "So far: You passed, I bet. Do you fold (pass) or call (bet)? Reply with one word: fold or call."
    )
    nim = make_game("nim")
    assert nim.chat_render(nim.initial_distribution()[0][0], 0) == (
        "There are 5 stones left. You may take 1, 2 or 3: reply with the number of stones you take."
    )
    play = SelfPlay(nim, opponent="heuristic", learner_player=0, chat=True)
    episode = play.start("", {}, np.random.default_rng(0))
    assert play.reply(episode, "Answer: 7", 1) == ("You lose. Your move was not a legal move.", -1.0, True)
    assert play.episode_info(episode)["forfeit"] == "learner"  # what an illegal-move rate counts, in either mode
    with pytest.raises(ValueError, match="no chat mode"):
        SelfPlay(Game(), chat=True)  # the base class states no rules


def test_a_reply_prefix_starts_each_turn_and_its_first_move_counts(chat_dir):
    """In chat mode a game writes its reply prefix after every generation prompt but the last (the result's), and
    reads the move the text after it states first; ``reply_prefix=""`` keeps the free-text reading."""
    from transformers import AutoTokenizer

    from textrl_envs.games import SelfPlay, make_game

    ttt = make_game("tictactoe")
    assert ttt.chat_reply_prefix == "I take cell"
    prefixed = SelfPlay(ttt, opponent="heuristic", learner_player=0, chat=True)
    plain = SelfPlay(ttt, opponent="heuristic", learner_player=0, chat=True, reply_prefix="")
    assert prefixed.reply_prefix == "I take cell" and plain.reply_prefix == ""
    assert SelfPlay(ttt).reply_prefix == ""  # text mode: none
    for play, cell in ((prefixed, 1), (plain, 3)):
        episode = play.start("", {}, np.random.default_rng(0))
        play.reply(episode, " 1, then 3 next.\nAnswer: 3", 1)
        assert episode["game"].cells[cell - 1] == 0  # the learner's mark: the first move, or the stated answer
    tok = AutoTokenizer.from_pretrained(chat_dir)
    end = tok.convert_tokens_to_ids("<|im_end|>")
    env = gym.make("TicTacToe-v0", tokenizer=chat_dir, instruct=True,
                   interaction=SelfPlay(ttt, opponent="heuristic", learner_player=0, chat=True))  # fmt: skip

    def text(obs):
        return tok.decode([i for i, m in zip(obs["input_ids"].tolist(), obs["attention_mask"].tolist()) if m])

    obs, _ = env.reset(seed=0)
    assert text(obs).endswith("Your move (X): reply with the number of a free cell.<|im_end|>\n"
                              "<|im_start|>assistant\nI take cell")  # fmt: skip
    for t in tok(" 1", add_special_tokens=False)["input_ids"] + [end]:
        obs, reward, terminated, _, info = env.step(t)
    assert not terminated and text(obs).endswith("<|im_start|>assistant\nI take cell")
    assert text(obs).count("I take cell 1<|im_end|>") == 1  # the prefix and the move, one assistant message
    for t in tok(" X", add_special_tokens=False)["input_ids"] + [end]:  # no cell: the game is lost
        obs, reward, terminated, _, info = env.step(t)
    assert terminated and reward == -1.0 and info["forfeit"] == "learner"
    assert text(obs).endswith("You lose. Your move was not a legal move.<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"reply_prefix": "I take cell"}, ValueError, "starts a chat model's replies: pass chat=True"),
        ({"chat": True, "reply_prefix": "I take cell "}, ValueError, "ends in whitespace.*'I take cell'"),
        ({"chat": True, "reply_prefix": 3}, TypeError, "reply_prefix must be a str"),
    ],
)
def test_bad_reply_prefix(kwargs, error, match):
    from textrl_envs.games import SelfPlay, make_game

    with pytest.raises(error, match=match):
        SelfPlay(make_game("tictactoe"), **kwargs)


def test_an_interactions_reply_prefix_follows_a_prompt_that_asks_the_assistant(chat_dir):
    """An interaction that does not speak first gets its reply prefix right after the prompt's generation prompt, and
    after each reply; the vector env writes the same windows as the single env."""
    from transformers import AutoTokenizer

    from textrl_envs.tasks.interactions import GuessNumber

    class PrefixedGuess(GuessNumber):
        reply_prefix = "My guess:"

    tok = AutoTokenizer.from_pretrained(chat_dir)
    end = tok.convert_tokens_to_ids("<|im_end|>")
    kwargs = {"tokenizer": chat_dir, "instruct": True, "interaction": PrefixedGuess(1, 8, chat=True)}
    env = gym.make("GuessNumber-v0", **kwargs)
    vec = gym.make_vec("GuessNumber-v0", num_envs=1, device="cpu", **kwargs)
    assert not env.unwrapped.text_spec.chat_open  # the prompt ends with the generation prompt itself
    a, _ = env.reset(seed=3)
    b, _ = vec.reset(seed=3)

    def text(obs):
        ids, mask = np.asarray(obs["input_ids"]).reshape(-1), np.asarray(obs["attention_mask"]).reshape(-1)
        return tok.decode([i for i, m in zip(ids.tolist(), mask.tolist()) if m])

    assert text(a).endswith("<|im_start|>assistant\nMy guess:") and text(a) == text(b)
    for t in tok(" 4", add_special_tokens=False)["input_ids"] + [end]:
        a, *_ = env.step(t)
        b, *_ = vec.step(np.array([t]))
        assert text(a) == text(b)
    assert text(a).endswith("<|im_end|>\n<|im_start|>assistant\nMy guess:")
    assert "My guess: 4<|im_end|>" in text(a)
    # the transcript holds what the agent wrote, without the prefix the env wrote for it
    assert env.unwrapped._transcript[-2]["role"] == "agent" and env.unwrapped._transcript[-2]["text"].strip() == "4"
