"""Interactive episodes in the envs: the turn semantics by hand, the built-in interactive ids, vector == SyncVectorEnv
on every interactive id, prompt groups that share the task's initial state, and every bad input of item 7.

The env checkers (Gymnasium's and SB3's) run on every registered id, the interactive ones included, in
test_tasks.py::test_make_offline_and_env_checkers.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import math
import threading
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

import textrl_envs
from textrl_envs.env import TextGenEnv
from textrl_envs.interaction import Interaction, Reply, answer_turns
from textrl_envs.sb3 import make_vec_env
from textrl_envs.tasks import get_task
from textrl_envs.tasks.interactions import Calculator, GuessNumber
from textrl_envs.vector import TextGenVectorEnv

INTERACTIVE_IDS = [i for i in textrl_envs.ENV_IDS if get_task(i).interaction is not None]


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    from textrl_envs.assets import tokenizer_path

    return AutoTokenizer.from_pretrained(tokenizer_path())


def encode(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def say(env, text, end=True):
    """Play one agent turn: ``text``'s tokens, then EOS; return the last step's ``(reward, term, trunc, info)``."""
    tok = env.unwrapped.tokenizer
    ids = encode(tok, text) + ([tok.eos_token_id] if end else [])
    for t in ids:
        _, r, term, trunc, info = env.step(t)
        if term or trunc:
            break
    return r, term, trunc, info


def window_text(env, obs):
    ids = [i for i, m in zip(obs["input_ids"], obs["attention_mask"]) if m]
    return env.unwrapped.tokenizer.decode(ids, skip_special_tokens=False)


# -- the built-in interactive ids, played by hand ---------------------------------------------------------


def test_interactive_ids_are_in_the_one_list_of_tasks():
    assert INTERACTIVE_IDS == [
        "GuessNumber-v0", "ToolArithmetic-v0", "TicTacToe-v0", "Nim-v0", "KuhnPoker-v0", "ToolUse-v0"
    ]  # fmt: skip
    for env_id in INTERACTIVE_IDS:
        task = get_task(env_id)
        assert task.max_turns and gym.spec(env_id).vector_entry_point.endswith("TextGenVectorEnv")
        assert (task.reward is None) == (env_id != "ToolUse-v0")  # the tool task's reward scores the transcript


def test_guess_number_binary_search_finds_every_secret(tok):
    env = gym.make("GuessNumber-v0")
    found = {}
    for seed in range(40):
        obs, info = env.reset(seed=seed)
        assert window_text(env, obs) == "Guess 1-8: x=" and info == {"prompt": "Guess 1-8: x=", "prompt_index": 0}
        low, high = 1, 8
        for turn in range(1, 5):  # noqa: B007  (the turn that found it is checked after the loop)
            guess = (low + high) // 2
            r, term, trunc, info = say(env, str(guess))
            if term:
                break
            assert r == 0.0 and not trunc
            text = env.unwrapped.text_spec.decode(env.unwrapped._generated[-7:])
            if text == "Higher. x=":
                low = guess + 1
            else:
                assert text == "Lower. x=", text
                high = guess - 1
        assert term and not trunc and info["turns"] == turn <= 4
        assert r == pytest.approx(1 - 0.1 * (turn - 1)) and info["reward"] == r
        found[seed] = guess
        # the transcript, from the prompt on: agent turns (without EOS) and the env's replies
        transcript = info["transcript"]
        assert transcript[0] == {"role": "env", "text": "Guess 1-8: x="}
        assert [m["role"] for m in transcript[1:]] == ["agent", "env"] * turn
        assert transcript[-1] == {"role": "env", "text": "Correct!"} and transcript[-2]["text"] == str(guess)
        assert info["completion"] == "".join(m["text"] for m in transcript[1:])
        assert info["completion_ids"] == tuple(env.unwrapped._generated)
    assert len(set(found.values())) == 8  # secrets vary with the seed
    env.reset(seed=7)
    secret = env.unwrapped._task_state["secret"]
    env.reset(seed=7)
    assert env.unwrapped._task_state["secret"] == secret  # a seeded reset repeats the episode


def test_guess_number_range_1_to_16_is_an_option():
    """The registered id plays 1-8 (see its docstring for why); a prompt's metadata (or ``GuessNumber(high=16)`` with
    prompts without metadata) still gives the issue's 1-16 game, which binary search solves in 5 turns."""
    prompts = [{"prompt": "Guess 1-16: x=", "low": 1, "high": 16}]
    env = gym.make("GuessNumber-v0", prompts=prompts, max_turns=5, max_new_tokens=60)
    plain = gym.make("GuessNumber-v0", prompts=["Guess 1-16: x="], interaction=GuessNumber(low=1, high=16))
    secrets = set()
    for seed in range(120):
        env.reset(seed=seed)
        plain.reset(seed=seed)
        secret = env.unwrapped._task_state["secret"]
        assert plain.unwrapped._task_state["secret"] == secret
        secrets.add(secret)
        low, high = 1, 16
        for _ in range(5):
            guess = (low + high) // 2
            r, term, trunc, info = say(env, str(guess))
            if term:
                break
            assert not trunc
            low, high = (guess + 1, high) if guess < secret else (low, guess - 1)
        assert term and guess == secret and r == pytest.approx(1 - 0.1 * (info["turns"] - 1))
    assert secrets == set(range(1, 17))


def test_guess_number_wasted_turns_hints_and_running_out_of_turns():
    env = gym.make("GuessNumber-v0")
    env.reset(seed=0)
    secret = env.unwrapped._task_state["secret"]
    wrong = 1 if secret != 1 else 2
    r, term, trunc, _ = say(env, "x")
    obs = env.unwrapped._obs()
    assert (r, term, trunc) == (0.0, False, False) and window_text(env, obs).endswith("<|endoftext|>Say a number. x=")
    for _ in range(2):
        assert say(env, str(wrong))[:3] == (0.0, False, False)
    r, term, trunc, info = say(env, str(wrong))  # the fourth turn: out of turns
    assert (r, term, trunc) == (0.0, False, True) and info["turns"] == 4


def test_turn_budget_and_episode_budget_end_turns(tok):
    env = gym.make("GuessNumber-v0", max_turn_tokens=2, max_new_tokens=20)
    env.reset(seed=3)
    ids = encode(tok, " 9 9 9")  # guesses 9, above every secret: "Lower. x=" each turn
    _, r, term, trunc, _ = env.step(ids[0])
    assert not (term or trunc) and env.unwrapped._turns == 0
    env.step(ids[1])  # the second token ends the turn (max_turn_tokens=2): answered
    assert env.unwrapped._turns == 1 and env.unwrapped._turn == []
    used = len(env.unwrapped._generated)
    assert used == 2 + len(encode(tok, "Lower. x="))  # every token after the prompt counts, the reply's too
    term = trunc = False
    while not (term or trunc):
        _, r, term, trunc, info = env.step(ids[2])
    assert trunc and not term and len(info["completion_ids"]) >= 20  # the budget: every token after the prompt


def test_tool_arithmetic_calls_errors_and_answers():
    env = gym.make("ToolArithmetic-v0")
    _, info = env.reset(seed=0, options={"prompt": "Compute 37*12."})
    r, term, trunc, _ = say(env, " calc: 37*12")
    assert (r, term, trunc) == (0.0, False, False)
    assert window_text(env, env.unwrapped._obs()).endswith(" calc: 37*12<|endoftext|> = 444.")
    r, term, trunc, _ = say(env, " calc: 37*")
    assert (r, term, trunc) == (0.0, False, False) and env.unwrapped._transcript[-1][
        "text"
    ] == " error: write calc: a*b."
    r, term, trunc, info = say(env, " 444")
    assert (r, term, trunc) == (1.0, True, False) and info["turns"] == 3
    env.reset(seed=0, options={"prompt": "Compute 37*12."})
    assert say(env, " 443")[:3] == (0.0, True, False)
    item = get_task("ToolArithmetic-v0").prompts()[5]
    env.reset(options={"prompt_index": 5})
    assert say(env, " " + item["answer"])[0] == 1.0
    calc = Calculator()
    assert calc.reply({"answer": "7"}, "calc: -3 - 4", 1) == Reply(" = -7.")  # signed operands
    assert calc.reply({"answer": "7"}, "calc: 3 * -4", 1) == Reply(" = -12.")
    assert calc.reply({"answer": "7"}, "calc: 3 / 4", 1) == Reply(" error: write calc: a*b.")


# -- vector env == SyncVectorEnv, every interactive id ----------------------------------------------------


def play_actions(rng, n, tok, vocab, eos):
    """Random tokens with many turn ends, digits and tool calls, so that every reply kind shows up."""
    digits = [encode(tok, d)[0] for d in "0123456789"] + [encode(tok, " " + d)[0] for d in "0123456789"]
    calc = encode(tok, " calc: 37*12")
    a = rng.integers(0, vocab, n)
    roll = rng.random(n)
    a[roll < 0.5] = rng.choice(digits, int((roll < 0.5).sum()))
    a[roll > 0.7] = eos
    pick = rng.random(n) < 0.1
    a[pick] = rng.choice(calc, int(pick.sum()))
    return a


def _compare_step(s, v, step):
    for key in ("input_ids", "attention_mask"):
        np.testing.assert_array_equal(v[0][key], s[0][key], err_msg=f"{key} at step {step}")
    np.testing.assert_array_equal(v[1], s[1])
    np.testing.assert_array_equal(v[2], s[2])
    np.testing.assert_array_equal(v[3], s[3])
    done = np.flatnonzero(s[2] | s[3])
    for i in done:
        for key in ("prompt", "completion", "prompt_index", "reward", "turns", "transcript"):
            assert v[4]["final_info"][key][i] == s[4]["final_info"][key][i], (key, step)
        assert tuple(v[4]["final_info"]["completion_ids"][i]) == tuple(s[4]["final_info"]["completion_ids"][i])
        for key in ("input_ids", "attention_mask"):
            np.testing.assert_array_equal(v[4]["final_obs"][i][key], s[4]["final_obs"][i][key])
    return len(done)


@pytest.mark.parametrize("env_id", INTERACTIVE_IDS)
@pytest.mark.parametrize("kwargs", [{}, {"max_turn_tokens": 2, "max_new_tokens": 14}])
def test_interactive_ids_match_sync_vector_env(env_id, kwargs, tok):
    n = 5
    sync = gym.vector.SyncVectorEnv(
        [lambda: gym.make(env_id, **kwargs) for _ in range(n)], autoreset_mode=AutoresetMode.SAME_STEP
    )
    vec = gym.make_vec(env_id, num_envs=n, device="cpu", **kwargs)
    assert isinstance(vec, TextGenVectorEnv)
    s, v = sync.reset(seed=11), vec.reset(seed=11)
    np.testing.assert_array_equal(v[0]["input_ids"], s[0]["input_ids"])
    rng = np.random.default_rng(0)
    eos, vocab = vec.text_spec.eos_token_id, vec.single_action_space.n
    ended = turns = 0
    for step in range(250):
        actions = play_actions(rng, n, tok, vocab, eos)
        s, v = sync.step(actions), vec.step(actions)
        ended += _compare_step(s, v, step)
        turns += int(v[1].astype(bool).sum())
        if step == 120:  # a reset in the middle, with a given prompt: the task seeds are drawn all the same
            options = {"prompt_index": 0}
            with warnings.catch_warnings():  # the single envs warn that an episode was running: on purpose here
                warnings.simplefilter("ignore")
                s, v = sync.reset(options=options), vec.reset(options=options)
            np.testing.assert_array_equal(v[0]["input_ids"], s[0]["input_ids"])
    assert ended > 30


class Counting(GuessNumber):
    """GuessNumber that records every batch it answers."""

    def __init__(self):
        super().__init__()
        self.batches = []

    def replies(self, states, texts, turns):
        self.batches.append(len(texts))
        return super().replies(states, texts, turns)


def test_vector_env_answers_every_turn_of_a_step_in_one_call(tok):
    game = Counting()
    vec = gym.make_vec("GuessNumber-v0", num_envs=6, device="cpu", interaction=game)
    vec.reset(seed=0)
    eos = vec.text_spec.eos_token_id
    vec.step(np.array(encode(tok, "8") * 6))
    assert game.batches == []  # no turn ended yet
    vec.step(np.array([eos, eos, eos, 5, eos, 5]))
    assert game.batches == [4]  # four turns ended: one batched call


def test_groups_start_their_members_from_the_same_task_state():
    n, g = 8, 4
    vec = gym.make_vec("GuessNumber-v0", num_envs=n, group_size=g, device="cpu")
    single = gym.make("GuessNumber-v0")
    for seed in range(5):
        vec.reset(seed=seed)
        secrets = [{vec._turn_book.states[j]["secret"] for j in range(k * g, (k + 1) * g)} for k in range(n // g)]
        assert all(len(s) == 1 for s in secrets)  # one secret per group
        for k in range(n // g):  # group k is seeded like env k * G of a SyncVectorEnv (seed + k * G)
            single.reset(seed=seed + k * g)
            assert secrets[k] == {single.unwrapped._task_state["secret"]}


def test_group_rounds_share_the_secret_when_members_are_out_of_step(tok):
    n, g = 6, 3
    vec = gym.make_vec("GuessNumber-v0", num_envs=n, group_size=g, device="cpu")
    vec.reset(seed=1)
    eos, say_x = vec.text_spec.eos_token_id, encode(tok, "x")[0]
    seen = {}  # group round id -> set of secrets of the members that started it
    rng = np.random.default_rng(3)
    for _ in range(300):
        for j, gid in enumerate(vec.group_ids()):
            seen.setdefault(int(gid), set()).add(vec._turn_book.states[j]["secret"])
        actions = np.where(rng.random(n) < 0.5, eos, say_x)  # wasted turns at random times: rounds drift apart
        vec.step(actions)
    assert len(seen) > 3 * (n // g) and all(len(s) == 1 for s in seen.values())


# -- writing your own: the protocol, openings, end-of-episode rewards --------------------------------------


class Echo(Interaction):
    """The env speaks first (an opening), then echoes each turn; the episode ends when the agent says 'stop'."""

    def start(self, prompt, metadata, rng):
        return {"n": int(rng.integers(100)), "word": metadata.get("word")}

    def opening(self, state):
        return f" [{state['n']}]"

    def reply(self, state, text, turn):
        return Reply(f" echo{turn}", reward=0.25, done="stop" in text)


def test_own_interaction_with_opening_and_end_reward(tok):
    prompts = [{"prompt": "Talk:", "word": "hi"}]
    lengths = []

    def length_reward(prompts, completions, **meta):
        lengths.append((completions[0], meta["word"][0]))
        return [0.5]

    env = TextGenEnv(prompts=prompts, interaction=Echo(), max_turns=3, reward=length_reward, max_new_tokens=30)
    obs, _ = env.reset(seed=0)
    n = env._task_state["n"]
    assert window_text(env, obs) == f"Talk: [{n}]"
    assert say(env, " go")[0] == 0.25
    r, term, trunc, info = say(env, " stop")
    assert term and not trunc and r == pytest.approx(0.25 + 0.5)  # the turn's reward plus the end-of-episode score
    assert info["transcript"] == [
        {"role": "env", "text": "Talk:"},
        {"role": "env", "text": f" [{n}]"},
        {"role": "agent", "text": " go"},
        {"role": "env", "text": " echo1"},
        {"role": "agent", "text": " stop"},
        {"role": "env", "text": " echo2"},
    ]
    assert lengths == [(f" [{n}] go echo1 stop echo2", "hi")]
    # single-turn semantics are untouched: no turn keywords without an interaction
    with pytest.raises(ValueError, match="max_turns only apply to interactive episodes; pass interaction="):
        gym.make("TextGen-v0", max_turns=2)


def test_sb3_vec_env_infos_carry_turns_and_transcript(tok):
    venv = make_vec_env("GuessNumber-v0", n_envs=2, device="cpu", seed=0)
    venv.reset()
    secret = venv.unwrapped.venv._turn_book.states[0]["secret"]
    eos = venv.unwrapped.venv.text_spec.eos_token_id
    for t in encode(tok, str(secret)):
        venv.step(np.array([t, t]))
    _, rewards, dones, infos = venv.step(np.array([eos, eos]))
    assert dones[0] and rewards[0] == pytest.approx(1.0)
    assert infos[0]["turns"] == 1 and infos[0]["transcript"][-1] == {"role": "env", "text": "Correct!"}
    assert infos[0]["episode"]["r"] == pytest.approx(1.0)  # VecMonitor's episode return


# -- bad input ---------------------------------------------------------------------------------------------


class Raises(Interaction):
    def reply(self, state, text, turn):
        if turn == 2:
            raise KeyError("oops")
        return Reply(" ok")


class Hangs(Interaction):
    def __init__(self):
        self.release = threading.Event()

    def reply(self, state, text, turn):
        self.release.wait(5)
        return Reply(" late")


class Returns(Interaction):
    def __init__(self, value):
        self.value = value

    def reply(self, state, text, turn):
        return self.value


def _two_turns(interaction, **kw):
    env = TextGenEnv(prompts=["Talk:"], interaction=interaction, max_turns=4, max_new_tokens=30, **kw)
    env.reset(seed=0)
    say(env, " a")
    return say(env, " b")


@pytest.mark.parametrize(
    "interaction, kw, error, match",
    [
        (Raises(), {}, RuntimeError, r"interaction Raises raised KeyError while replying .*turn 2 \(agent text ' b'\)"),
        (
            Returns(5),
            {},
            TypeError,
            r"interaction Returns returned '5' for turn 1 .* expected Reply\(text, reward, done\)",
        ),
        (Returns(Reply(7)), {}, TypeError, r"reply text of type int \('7'\) for turn 1 .*must be a str or None"),
        (Returns(Reply("x", "1")), {}, TypeError, r"reward of type str .* for turn 1 .*must be a real number"),
        (Returns(Reply("x", 0.0, "no")), {}, TypeError, r"done='no' for turn 1 .*must be a bool"),
        (
            Returns(Reply("x", math.nan)),
            {},
            ValueError,
            r"non-finite reward \(nan\) for turn 1 .*nonfinite_reward='skip'",
        ),
    ],
    ids=["raises", "not-a-reply", "text-not-str", "reward-not-number", "done-not-bool", "reward-nan"],
)
def test_bad_interactions_name_the_task_and_the_turn(interaction, kw, error, match):
    with pytest.raises(error, match=match):
        _two_turns(interaction, **kw)


def test_bad_interaction_in_a_registered_id_names_the_id():
    env = gym.make("GuessNumber-v0", interaction=Raises())
    env.reset(seed=0)
    say(env, "3")
    with pytest.raises(RuntimeError, match=r"task 'GuessNumber-v0' \(interaction Raises\) raised KeyError .*turn 2"):
        say(env, "4")
    vec = gym.make_vec("GuessNumber-v0", num_envs=2, device="cpu", interaction=Returns(Reply(None, math.inf)))
    vec.reset(seed=0)
    with pytest.raises(ValueError, match=r"task 'GuessNumber-v0' .*non-finite reward \(inf\) for turn 1"):
        vec.step(np.array([vec.text_spec.eos_token_id] * 2))


def test_hanging_reply_hits_the_reward_timeout():
    game = Hangs()
    try:
        with pytest.raises(TimeoutError, match=r"interaction Hangs did not reply within reward_timeout=0.2 s .*turn 1"):
            _two_turns(game, reward_timeout=0.2)
    finally:
        game.release.set()


def test_nonfinite_turn_reward_skipped_and_flagged():
    env = TextGenEnv(prompts=["Talk:"], interaction=Returns(Reply(None, math.nan, True)), nonfinite_reward="skip")
    env.reset(seed=0)
    r, term, _, info = say(env, " a")
    assert term and r == 0.0 and info["reward_nonfinite"] is True
    texts, rewards, done, bad = answer_turns(Returns(Reply(None, math.nan, True)), [None], ["a"], [1], nonfinite="skip")
    assert texts == [None] and rewards.tolist() == [0.0] and done.tolist() == [True] and bad.tolist() == [True]


def test_reply_longer_than_the_window_is_truncated_with_one_warning(tok):
    long = " " + " ".join(["word"] * 60)
    env = TextGenEnv(prompts=["Talk:"], interaction=Returns(Reply(long)), max_prompt_tokens=4, max_new_tokens=100)
    w = env.text_spec.window
    env.reset(seed=0)
    with pytest.warns(UserWarning, match=rf"reply of \d+ tokens is longer than the observation window \({w} tokens\)"):
        r, term, trunc, info = say(env, " a")
    assert trunc and not term  # the reply filled the window past the budget
    obs = env._obs()
    assert obs["attention_mask"].all() and list(obs["input_ids"]) == encode(tok, long)[-w:]
    env.reset(seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per env
        say(env, " a")


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"max_turns": 0}, ValueError, r"max_turns must be an int >= 1, got 0"),
        ({"max_turn_tokens": 0}, ValueError, r"max_turn_tokens must be an int >= 1, got 0"),
        ({"max_turns": 2.5}, TypeError, r"max_turns must be an int"),
        ({"turn_end": 99999}, ValueError, r"turn_end token id 99999 is outside the vocabulary \(ids 0..1228"),
        ({"turn_end": -1}, ValueError, r"turn_end token id -1 is outside the vocabulary"),
        ({"turn_end": "Higher"}, ValueError, r"turn_end 'Higher' is 3 tokens .* give a single token's text or its id"),
        ({"turn_end": []}, ValueError, r"turn_end is empty"),
        ({"interaction": object()}, TypeError, r"interaction must be an instance of .*Interaction .*got object"),
    ],
)
def test_bad_turn_arguments_rejected_at_construction(kwargs, error, match):
    with pytest.raises(error, match=match):
        gym.make("GuessNumber-v0", **kwargs)
    with pytest.raises(error, match=match):
        gym.make_vec("GuessNumber-v0", num_envs=2, device="cpu", **kwargs)


def test_turn_end_may_be_any_token_or_several(tok):
    newline, eos = encode(tok, "\n")[0], tok.eos_token_id
    env = gym.make("GuessNumber-v0", turn_end=["\n", eos])
    assert env.unwrapped.text_spec.turn_end_ids == (newline, eos)
    env.reset(seed=0)
    r, term, trunc, info = say(env, "3\n", end=False)  # the newline ends the turn, and stays in its text
    assert env.unwrapped._transcript[-2] == {"role": "agent", "text": "3\n"}


def test_opening_that_fills_the_budget_is_an_error():
    class Chatty(Echo):
        def opening(self, state):
            return " " + " ".join(["word"] * 40)

    single = TextGenEnv(prompts=["Talk:"], interaction=Chatty(), max_new_tokens=10)
    whole = len(encode(single.text_spec.tokenizer, Chatty().opening(None)))
    vector = TextGenVectorEnv(num_envs=2, prompts=["Talk:"], interaction=Chatty(), max_new_tokens=10)
    assert whole > single.observation_space["input_ids"].shape[-1]  # longer than the window, too
    for env in (single, vector):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # refused with its whole length, not cut to the window with a warning
            with pytest.raises(ValueError, match=rf"the opening has {whole} tokens, which leaves the agent none"):
                env.reset(seed=0)


def test_compare_runs_as_is_on_an_interactive_id(tmp_path):
    """`sb3-grpo compare --env GuessNumber-v0` runs stock PPO and GRPO (group advantages) on the interactive env."""
    import json

    from sb3_grpo.cli import main

    out = tmp_path / "guess"
    args = ["compare", "--env", "GuessNumber-v0", "--algos", "ppo,grpo-group", "--seeds", "1", "--timesteps", "96"]
    args += ["--n-envs", "4", "--group-size", "2", "--eval-episodes", "4", "--no-progress", "--out", str(out)]
    args += ["--set", "*.n_steps=24", "--set", "*.batch_size=48", "--set", "*.n_epochs=1"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tiny n_steps draws GRPO's straddling-episodes warning
        assert main(args) == 0
    results = json.loads((out / "results.json").read_text())
    assert sorted(results["runs"]) == ["grpo-group/seed0", "ppo/seed0"]
    assert all(np.isfinite(run["final"]["reward_mean"]) for run in results["runs"].values())
    assert (out / "report.md").is_file()
