"""The task suite: every registered id works offline and passes the env checkers; episode semantics,
seeded determinism, user overrides and every bad input."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import warnings

import gymnasium as gym
import numpy as np
import pytest

import textrl_envs
from textrl_envs.env import TextGenEnv
from textrl_envs.rewards import CompositeReward, LexiconSentiment, make_reward
from textrl_envs.rewards.calls import TrainerState
from textrl_envs.tasks import TASKS, all_tasks, builtin_tasks, get_task

ENV_IDS = list(textrl_envs.ENV_IDS)
#: The single-turn ids (a prompt, a completion, a reward); the interactive ones are tested in test_interactive.py.
SINGLE_TURN_IDS = [i for i in ENV_IDS if get_task(i).interaction is None]
#: The ids whose prompts and reward are in the package (the suites behind extras are tested in test_suites.py).
BUILTIN_IDS = [task.env_id for task in builtin_tasks()]
SINGLE_TURN_BUILTIN_IDS = [i for i in BUILTIN_IDS if i in SINGLE_TURN_IDS]


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from textrl_envs.assets import tokenizer_path

    return AutoTokenizer.from_pretrained(tokenizer_path())


def encode(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def run(env, tokens):
    """Step ``tokens``; return the list of (reward, terminated, truncated, info) per step."""
    out = []
    for t in tokens:
        _, r, term, trunc, info = env.step(t)
        out.append((r, term, trunc, info))
    return out


# A completion per task that its reward should like, and the reward computed by hand on it.
def good_completion(env_id, prompt_item):
    meta = prompt_item if isinstance(prompt_item, dict) else {}
    if env_id == "Arithmetic-v0":
        return meta["answer"]
    if env_id == "IncreasingNumbers-v0":
        return " 60 70 80 90"
    if env_id == "CommonGen-v0":
        return meta["references"][0]
    if env_id == "Keywords-v0":
        return " The " + " and the ".join(meta["keywords"]) + " were lovely."
    if env_id == "CodeGen-v0":  # a body that passes some of the units of the first problem (repeat_8)
        return "    return s * 8 if s else 'x'\n"
    return " The movie was wonderful."


# ----------------------------------------------------------------------------------------------
# every registered id
# ----------------------------------------------------------------------------------------------


def test_every_env_id_has_a_task_and_a_documented_class():
    assert [t.env_id for t in all_tasks()] == ENV_IDS or {t.env_id for t in all_tasks()} == set(ENV_IDS)
    for env_id, entry in textrl_envs.ENV_IDS.items():
        cls = gym.spec(env_id).entry_point
        assert cls == entry
        module, name = entry.split(":")
        klass = getattr(__import__(module, fromlist=[name]), name)
        assert issubclass(klass, TextGenEnv) and klass.default_task == env_id
        for section in (
            "Description",
            "Action Space",
            "Observation Space",
            "Rewards",
            "Starting State",
            "Episode End",
            "Arguments",
            "Vectorized environment",
            "Version History",
        ):
            assert f"## {section}" in klass.__doc__, (env_id, section)


def test_registration_comes_from_the_one_list_of_tasks():
    assert ENV_IDS == [t.env_id for t in TASKS] == [t.env_id for t in all_tasks()]
    for task in TASKS:
        spec = gym.spec(task.env_id)
        assert (spec.entry_point, spec.vector_entry_point) == (task.entry_point, task.vector_entry_point)
        assert spec.kwargs == task.registered_kwargs
        if task.extra is None:  # a built-in task: the generic vector env, told its task by the registered kwargs
            assert spec.vector_entry_point == "textrl_envs.vector:TextGenVectorEnv"
            assert spec.kwargs == {"task": task.env_id} and task.prompts is not None
            # an interactive task pays per turn, or scores the transcript at the end (ToolUse-v0)
            assert task.reward is not None or task.interaction is not None
        else:  # a suite: its own classes, whose task= names a task of the suite
            assert spec.kwargs == {} and task.install_hint == f'pip install "textrl[{task.extra}]"'
        assert get_task(task.env_id) is task
    with pytest.raises(ValueError, match="no task 'Nope-v0'; known: Arithmetic-v0, CodeGen-v0, CommonGen-v0"):
        get_task("Nope-v0")


@pytest.mark.parametrize("env_id", BUILTIN_IDS)
def test_make_offline_and_env_checkers(env_id):
    from gymnasium.utils.env_checker import check_env as gym_check_env
    from stable_baselines3.common.env_checker import check_env as sb3_check_env

    env = gym.make(env_id)
    task = get_task(env_id)
    u = env.unwrapped
    assert isinstance(u, TextGenEnv)
    assert u.max_new_tokens == task.max_new_tokens
    assert u.action_space.n == len(u.tokenizer)
    assert u.observation_space["input_ids"].shape == (task.max_prompt_tokens + task.max_new_tokens,)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gym_check_env(u, skip_render_check=True)
        sb3_check_env(u, warn=False)
    env.close()


@pytest.mark.parametrize("env_id", BUILTIN_IDS)
def test_default_prompts_fit_the_prompt_budget(env_id):
    env = gym.make(env_id, prompt_truncation="error")  # raises if any default prompt is over budget
    spec = env.unwrapped.text_spec
    # one prompt is enough where the episode's randomness is the interaction's (GuessNumber's secret, a game's
    # side, deal and opponent)
    one_prompt = ("TextGen-v0", "GuessNumber-v0", "TicTacToe-v0", "Nim-v0", "KuhnPoker-v0")
    assert len(spec.prompt_texts) >= 10 or env_id in one_prompt
    assert max(len(ids) for ids in spec.prompt_ids) <= spec.max_prompt_tokens


@pytest.mark.parametrize("env_id", SINGLE_TURN_BUILTIN_IDS)
def test_reward_at_episode_end_equals_reward_called_by_hand(env_id, tokenizer):
    env = gym.make(env_id)
    task = get_task(env_id)
    items = task.prompts()
    _obs, info = env.reset(seed=0, options={"prompt_index": 0})
    item = items[0]
    prompt = item["prompt"] if isinstance(item, dict) else item
    assert info == {"prompt": prompt, "prompt_index": 0}
    completion = good_completion(env_id, item)
    if task.stop_at_eos:
        ids = encode(tokenizer, completion)[: task.max_new_tokens - 1]
        steps = run(env, ids + [tokenizer.eos_token_id])
    else:  # the episode always runs its budget (LongReview-v0): fill it with different good sentences
        sentences = [" The acting was wonderful.", " I loved the story.", " The music was great.", " A fine film."]
        ids = encode(tokenizer, "".join(sentences * 8))[: task.max_new_tokens]
        steps = run(env, ids)
    assert all(r == 0.0 and not te and not tr for r, te, tr, _ in steps[:-1])
    r, term, trunc, info = steps[-1]
    assert (term and not trunc) if task.stop_at_eos else (trunc and not term)
    assert info["prompt"] == prompt and info["completion"] == tokenizer.decode(ids)
    meta = {k: [v] for k, v in item.items() if k != "prompt"} if isinstance(item, dict) else {}
    by_hand = make_reward(task.reward, **task.reward_kwargs)([prompt], [info["completion"]], **meta)[0]
    assert r == pytest.approx(by_hand) and info["reward"] == r
    assert r > 0.0  # the task's good completion is rewarded


def test_arithmetic_exact_answer_and_custom_problem(tokenizer):
    env = gym.make("Arithmetic-v0")
    item = get_task("Arithmetic-v0").prompts()[3]
    env.reset(seed=1, options={"prompt_index": 3})
    *_, (r, term, _, info) = run(env, encode(tokenizer, item["answer"]) + [tokenizer.eos_token_id])
    assert term and r == 1.0 and info["completion"] == item["answer"]
    # a problem given as text: the reward computes its answer from the prompt
    env.reset(options={"prompt": "19*19="})  # not in the list
    *_, (r, _, _, info) = run(env, encode(tokenizer, "361") + [tokenizer.eos_token_id])
    assert info["prompt_index"] == -1 and r == 1.0


def test_keywords_reward_is_the_documented_composite(tokenizer):
    env = gym.make("Keywords-v0")
    reward = env.unwrapped.text_spec.reward
    assert isinstance(reward, CompositeReward)
    assert reward.weights == {"keywords": 1.0, "length": 0.5, "repetition": 0.5}
    env.reset(options={"prompt_index": 0})
    kws = get_task("Keywords-v0").prompts()[0]["keywords"]
    completion = " " + " ".join(kws) + " " + " ".join(kws)  # all keywords, too short, repeated
    *_, (r, _, _, _info) = run(env, encode(tokenizer, completion) + [tokenizer.eos_token_id])
    n = len(completion.split())
    parts = reward.last_components
    assert parts["keywords"][0] == 1.0
    assert parts["length"][0] == pytest.approx(-0.1 * max(0, 4 - n))
    assert r == pytest.approx(1.0 + 0.5 * parts["length"][0] + 0.5 * parts["repetition"][0])


# ----------------------------------------------------------------------------------------------
# episode semantics
# ----------------------------------------------------------------------------------------------


def test_seeded_reset_is_deterministic():
    a, b = gym.make("Arithmetic-v0"), gym.make("Arithmetic-v0")
    seq_a = [a.reset(seed=123)[1]["prompt_index"]] + [a.reset()[1]["prompt_index"] for _ in range(10)]
    seq_b = [b.reset(seed=123)[1]["prompt_index"]] + [b.reset()[1]["prompt_index"] for _ in range(10)]
    assert seq_a == seq_b
    o1, _ = a.reset(seed=7)
    o2, _ = b.reset(seed=7)
    for k in o1:
        np.testing.assert_array_equal(o1[k], o2[k])
    firsts = {a.reset(seed=s)[1]["prompt_index"] for s in range(20)}
    assert len(firsts) > 1


def test_observation_layout_after_reset_and_step(tokenizer):
    env = gym.make("TextGen-v0")
    spec = env.unwrapped.text_spec
    obs, info = env.reset(seed=0, options={"prompt": "The movie was"})
    ids = encode(tokenizer, "The movie was")
    w = spec.window
    assert obs["input_ids"].dtype == np.int64 and obs["input_ids"].shape == (w,)
    np.testing.assert_array_equal(obs["input_ids"][-len(ids) :], ids)
    assert (obs["input_ids"][: w - len(ids)] == spec.pad_token_id).all()
    np.testing.assert_array_equal(obs["attention_mask"], [0] * (w - len(ids)) + [1] * len(ids))
    tok = encode(tokenizer, " great")[0]
    obs, r, term, trunc, info = env.step(tok)
    assert obs["input_ids"][-1] == tok and obs["attention_mask"][-len(ids) - 1 :].all()
    assert r == 0.0 and not term and not trunc and info == {}


def test_episode_end_by_eos_and_by_budget(tokenizer):
    env = gym.make("TextGen-v0", max_new_tokens=5)
    env.reset(seed=0, options={"prompt_index": 0})
    prompt = env.unwrapped.text_spec.prompt_texts[0]
    # EOS first: terminated, empty completion
    ((r, term, trunc, info),) = run(env, [tokenizer.eos_token_id])
    assert term and not trunc and info["completion"] == "" and len(info["completion_ids"]) == 0
    assert info["prompt"] == prompt and r == 0.0
    # budget: truncated after exactly max_new_tokens tokens
    env.reset(seed=0, options={"prompt_index": 0})
    ids = encode(tokenizer, " great great great great great")[:5]
    assert len(ids) == 5
    steps = run(env, ids)
    assert [s[2] for s in steps] == [False] * 4 + [True]
    assert not any(s[1] for s in steps)
    r, term, trunc, info = steps[-1]
    assert info["completion"] == tokenizer.decode(ids)
    np.testing.assert_array_equal(info["completion_ids"], ids)
    assert r == pytest.approx(LexiconSentiment()([prompt], [info["completion"]])[0]) and r > 0


# ----------------------------------------------------------------------------------------------
# user overrides
# ----------------------------------------------------------------------------------------------


def test_user_tokenizer_prompts_and_reward(tokenizer):
    from textrl_envs.assets import tokenizer_path

    calls = []

    def my_reward(prompts, completions, **kwargs):  # TRL's reward-function shape
        calls.append((list(prompts), list(completions), kwargs))
        return [float(len(c)) for c in completions]

    for tok in (tokenizer_path(), tokenizer):
        env = gym.make("TextGen-v0", tokenizer=tok, prompts=["Hello there", "Once upon a time"], reward=my_reward)
        _, info = env.reset(seed=0, options={"prompt_index": 1})
        assert info["prompt"] == "Once upon a time"
        *_, (r, _, _, info) = run(env, encode(tokenizer, " ab") + [tokenizer.eos_token_id])
        ids = [list(info["completion_ids"])]  # TRL's keywords besides the metadata: the ids and the trainer state
        assert r == 3.0 and calls[-1] == (["Once upon a time"], [" ab"], {"completion_ids": ids,
                                                                          "trainer_state": TrainerState()})  # fmt: skip
    # dict prompts pass their metadata to the reward as keyword lists
    env = gym.make("TextGen-v0", prompts=[{"prompt": "Q:", "answer": "yes"}], reward=my_reward)
    env.reset(seed=0)
    run(env, [tokenizer.eos_token_id])
    assert calls[-1][2] == {"answer": ["yes"], "completion_ids": [[]], "trainer_state": TrainerState()}
    # a registered reward by name, with options
    env = gym.make("TextGen-v0", reward="sentiment", reward_kwargs={"scale": "prob"})
    env.reset(seed=0)
    ((r, *_),) = run(env, [tokenizer.eos_token_id])
    assert r == 0.5  # empty completion: compound 0 -> (0 + 1) / 2


# ----------------------------------------------------------------------------------------------
# bad input
# ----------------------------------------------------------------------------------------------


def test_unknown_reward_name_lists_known_ones():
    with pytest.raises(ValueError, match=r"reward 'sentimnt' is not registered; known: .*rouge-l.*sentiment"):
        gym.make("TextGen-v0", reward="sentimnt")


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"prompts": []}, ValueError, "prompts is empty"),
        ({"prompts": "The movie was"}, TypeError, "prompts must be a list"),
        ({"max_new_tokens": 0}, ValueError, "max_new_tokens must be an int >= 1, got 0"),
        ({"max_prompt_tokens": 0}, ValueError, "max_prompt_tokens must be an int >= 1, got 0"),
        ({"max_new_tokens": 2.5}, TypeError, "max_new_tokens must be an int"),
        ({"prompt_truncation": "middle"}, ValueError, "prompt_truncation must be one of"),
        ({"reward": 42}, TypeError, "reward must be a registered name"),
        ({"tokenizer": "/no/such/tokenizer"}, ValueError, "is not a directory"),
        ({"temperature": 1.0}, TypeError, "unknown keyword argument.*temperature"),
    ],
)
def test_bad_arguments_raise_early(kwargs, error, match):
    with pytest.raises(error, match=match):
        gym.make("TextGen-v0", **kwargs)


def test_prompt_over_budget_truncation_sides(tokenizer):
    text = "The movie was great fun"
    ids = encode(tokenizer, text)
    assert len(ids) > 2
    for side, want in (("left", ids[-2:]), ("right", ids[:2])):
        env = gym.make("TextGen-v0", prompts=[text], max_prompt_tokens=2, prompt_truncation=side)
        obs, _ = env.reset(seed=0)
        np.testing.assert_array_equal(obs["input_ids"][-2:], want)
        assert obs["attention_mask"].sum() == 2
    with pytest.raises(ValueError, match=r"has \d+ tokens, over max_prompt_tokens=2"):
        gym.make("TextGen-v0", prompts=[text], max_prompt_tokens=2, prompt_truncation="error")


def test_bad_actions_and_step_order(tokenizer):
    env = gym.make("TextGen-v0").unwrapped
    with pytest.raises(RuntimeError, match="before reset"):
        env.step(0)
    env.reset(seed=0)
    n = env.action_space.n
    for bad in (n, -1):
        with pytest.raises(ValueError, match="outside the action space"):
            env.step(bad)
    with pytest.raises(ValueError, match="one integer token id"):
        env.step([1, 2])
    env.step(tokenizer.eos_token_id)
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step(0)
    wrapped = gym.make("TextGen-v0")
    with pytest.raises(gym.error.ResetNeeded):
        wrapped.step(0)


@pytest.mark.parametrize(
    "reward, error, match",
    [
        (lambda _prompts, _completions: [1.0, 2.0], ValueError, r"returned 2 value\(s\).*for 1 completions"),
        (lambda _prompts, _completions: [float("inf")], ValueError, r"non-finite value \(inf\).*completion ' great'"),
        (lambda _prompts, _completions: 1 / 0, RuntimeError, r"raised ZeroDivisionError.*first completion: ' great'"),
    ],
)
def test_bad_rewards_name_the_reward_and_show_the_completion(reward, error, match, tokenizer):
    env = gym.make("TextGen-v0", reward=reward)
    env.reset(seed=0)
    with pytest.raises(error, match=match) as err:
        run(env, encode(tokenizer, " great") + [tokenizer.eos_token_id])
    assert "<lambda>" in str(err.value)


def test_reward_missing_metadata_is_explained(tokenizer):
    env = gym.make("CommonGen-v0")
    env.reset(seed=0, options={"prompt": "Concepts: dog, ball. Sentence:"})  # no references for this text
    with pytest.raises(RuntimeError, match=r"'rouge-l'.*no 'references' for example #0"):
        run(env, [tokenizer.eos_token_id])


def test_tokenizer_without_pad_falls_back_to_eos():
    from transformers import AutoTokenizer

    from textrl_envs.assets import tokenizer_path

    tok = AutoTokenizer.from_pretrained(tokenizer_path())
    tok.pad_token = None
    assert tok.pad_token_id is None
    env = gym.make("TextGen-v0", tokenizer=tok)
    spec = env.unwrapped.text_spec
    assert spec.pad_token_id == tok.eos_token_id
    obs, _ = env.reset(seed=0)
    assert obs["input_ids"][0] == tok.eos_token_id and obs["attention_mask"][0] == 0


def test_tokenizer_without_eos_warns_and_only_truncates():
    from transformers import AutoTokenizer

    from textrl_envs.assets import tokenizer_path

    tok = AutoTokenizer.from_pretrained(tokenizer_path())
    eos = tok.eos_token_id
    tok.eos_token = None
    assert tok.eos_token_id is None
    with pytest.warns(UserWarning, match="no EOS token"):
        env = gym.make("TextGen-v0", tokenizer=tok, max_new_tokens=3)
    assert env.unwrapped.text_spec.eos_token_id is None
    env.reset(seed=0)
    steps = run(env, [eos] * 3)  # the old EOS id is now an ordinary token
    assert [s[1] for s in steps] == [False] * 3 and [s[2] for s in steps] == [False, False, True]


def test_bundled_classifier_reward_in_an_env(tokenizer):
    from textrl_envs.rewards import HFClassifierReward

    env = gym.make("TextGen-v0", reward="classifier", reward_kwargs={"device": "cpu"})
    reward = env.unwrapped.text_spec.reward
    assert isinstance(reward, HFClassifierReward)
    env.reset(seed=0, options={"prompt": "The movie was"})
    *_, (r, term, _, info) = run(env, encode(tokenizer, " wonderful and brilliant.") + [tokenizer.eos_token_id])
    assert term and r == pytest.approx(reward(["The movie was"], [info["completion"]])[0]) and r > 0.5
