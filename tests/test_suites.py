"""External task suites behind extras: ``ReasoningGym-v0`` (reasoning-gym).

Every test but the missing-extra one needs the extra (the ``test`` extra installs it); each makes small datasets.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import subprocess
import sys
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

import textrl_envs  # noqa: F401  (registers the ids)
from textrl_envs.tasks import REASONING_GYM

RG = REASONING_GYM.env_id


def run_answer(env, text: str):
    """Step the tokens of ``text`` then EOS; return the last step's ``(reward, terminated, truncated, info)``."""
    u = env.unwrapped
    ids = u.tokenizer(text, add_special_tokens=False)["input_ids"] + [u.tokenizer.eos_token_id]
    for token in ids:
        _, reward, terminated, truncated, info = env.step(token)
        if terminated or truncated:
            break
    return reward, terminated, truncated, info


def test_missing_extra_names_the_pip_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # makes `import reasoning_gym` raise ImportError
    with pytest.raises(ImportError, match=r'ReasoningGym-v0 needs .*reasoning-gym.*pip install "textrl\[reasoning\]"'):
        gym.make(RG)
    with pytest.raises(ImportError, match=r'pip install "textrl\[reasoning\]"'):
        gym.make_vec(RG, num_envs=2, device="cpu")


rg = pytest.importorskip("reasoning_gym")  # everything below needs the extra


#: Tasks with their small configs: answers of a few tokens, prompts that fit 96 tokens after left truncation.
TASKS = {
    "leg_counting": {"min_animals": 1, "max_animals": 3},
    "chain_sum": {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2},
    "spell_backward": {},
    "word_sequence_reversal": {"min_words": 2, "max_words": 4},
    "prime_factorization": {},
    "gcd": {},
}


@pytest.mark.parametrize("task", ["leg_counting", "chain_sum", "spell_backward"])
def test_env_checkers(task):
    from gymnasium.utils.env_checker import check_env as gym_check_env
    from stable_baselines3.common.env_checker import check_env as sb3_check_env

    env = gym.make(RG, task=task, task_kwargs=TASKS[task], size=8)
    assert env.unwrapped.observation_space["input_ids"].shape == (96 + 16,)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gym_check_env(env.unwrapped, skip_render_check=True)
        sb3_check_env(env.unwrapped, warn=False)


@pytest.mark.parametrize("task", sorted(TASKS))
def test_the_correct_answer_gets_the_full_score(task):
    """The item's answer, fed as the action tokens, scores 1.0; a wrong one scores what the task's scorer says."""
    env = gym.make(RG, task=task, task_kwargs=TASKS[task], size=4, seed=3, max_new_tokens=48)
    suite = env.unwrapped.suite
    for i, item in enumerate(suite.items):
        _, info = env.reset(seed=i, options={"prompt_index": i})
        assert info["prompt"] == item["question"]
        reward, terminated, _, info = run_answer(env, item["answer"])
        assert terminated and reward == 1.0 and info["reward"] == 1.0, (item["question"], item["answer"])
        assert info["completion"] == item["answer"] and info["answer"] == item["answer"]
        assert info["metadata"] == item["metadata"] and info["metadata"]["source_dataset"] == task
    env.reset(options={"prompt_index": 0})
    item = suite.items[0]
    wrong = "x" + item["answer"]
    try:
        expected = suite.dataset.score_answer(wrong, item)
    except ValueError:  # prime_factorization's scorer raises on text it cannot parse: the env scores that 0
        expected = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        reward, *_ = run_answer(env, wrong)
    assert reward == pytest.approx(0.0 if expected is None else expected) and reward < 1.0
    assert (expected is None) == any("score_answer raised" in str(w.message) for w in caught)


@pytest.mark.parametrize("vector", [False, True])
def test_partial_credit_off_keeps_only_full_scores(vector):
    """reasoning-gym's default scorer gives an answer that contains the right one len(right) / len(given); with
    partial_credit=False that answer scores 0 and the right one still scores 1."""
    kwargs = {"task": "letter_counting", "task_kwargs": {"min_words": 3, "max_words": 5}, "size": 6, "seed": 5}
    items = gym.make(RG, **kwargs).unwrapped.suite.items
    answers = [item["answer"] for item in items]
    padded = [a + "0" for a in answers]  # contains the right answer: partial credit len(a) / (len(a) + 1)
    by_hand = [len(a) / (len(a) + 1) for a in answers]
    for partial_credit, expected in ((True, by_hand), (False, [0.0] * len(items))):
        if vector:
            reward = gym.make_vec(RG, num_envs=2, device="cpu", partial_credit=partial_credit, **kwargs).suite.reward
        else:
            reward = gym.make(RG, partial_credit=partial_credit, **kwargs).unwrapped.suite.reward
        columns = {key: [item[key] for item in items] for key in ("question", "answer", "metadata")}
        assert reward.score(None, padded, **columns) == pytest.approx(expected)
        assert reward.score(None, answers, **columns) == [1.0] * len(items)
    from textrl_envs.suites.reasoning import ReasoningGymSuite

    columns = {key: [item[key] for item in items] for key in ("question", "answer", "metadata")}
    for partial_credit, expected in ((True, by_hand[0]), (False, 0.0)):  # instruct mode reads "Answer: ..." lines
        suite = ReasoningGymSuite(instruct=True, partial_credit=partial_credit, **kwargs)
        got = suite.reward.score(None, [f"Counting.\nAnswer: {padded[0]}"], **{k: v[:1] for k, v in columns.items()})
        assert got == pytest.approx([expected])
    env = gym.make(RG, partial_credit=False, max_new_tokens=8, **kwargs)  # and through the env's step
    env.reset(options={"prompt_index": 0})
    assert run_answer(env, padded[0])[0] == 0.0
    env.reset(options={"prompt_index": 0})
    assert run_answer(env, answers[0])[0] == 1.0


def test_seeded_generator_fixes_the_items_and_reset_options_pick_them():
    a = gym.make(RG, task="chain_sum", size=6, seed=11).unwrapped
    b = gym.make(RG, task="chain_sum", size=6, seed=11).unwrapped
    c = gym.make(RG, task="chain_sum", size=6, seed=12).unwrapped
    assert a.suite.items == b.suite.items != c.suite.items
    direct = rg.create_dataset("chain_sum", size=6, seed=11)
    assert [direct[i]["question"] for i in range(6)] == a.text_spec.prompt_texts
    assert a.text_spec.metadata["answer"] == [item["answer"] for item in a.suite.items]  # the reward's metadata


def test_weighted_mix_of_tasks():
    env = gym.make(RG, task={"leg_counting": 1, "gcd": 3}, task_kwargs={"leg_counting": {"max_animals": 3}}, size=40)
    suite = env.unwrapped.suite
    sources = [item["metadata"]["source_dataset"] for item in suite.items]
    assert set(sources) == {"leg_counting", "gcd"} and sources.count("gcd") > sources.count("leg_counting")
    for i in (sources.index("leg_counting"), sources.index("gcd")):
        env.reset(options={"prompt_index": i})
        assert run_answer(env, suite.items[i]["answer"])[0] == 1.0
    same = gym.make(RG, task=["leg_counting", "gcd"], size=10).unwrapped.suite  # a list: equal weights
    assert {item["metadata"]["source_dataset"] for item in same.items} == {"leg_counting", "gcd"}


@pytest.mark.parametrize(
    "answer_format, text",
    [
        ("plain", "  {a}\n"),
        ("tag", "I think <answer>x</answer> no, <answer> {a} </answer>"),
        ("prefix", "so\nAnswer: {a}"),
    ],
)
def test_answer_formats(answer_format, text):
    env = gym.make(RG, task="leg_counting", size=2, answer_format=answer_format, max_new_tokens=40)
    env.reset(options={"prompt_index": 1})
    answer = env.unwrapped.suite.items[1]["answer"]
    assert run_answer(env, text.format(a=answer))[0] == 1.0
    env.reset(options={"prompt_index": 1})
    assert run_answer(env, "no answer here")[0] == 0.0


def test_answer_format_callable_and_template():
    env = gym.make(RG, task="leg_counting", size=2, template="Q: {question}A:", answer_format=lambda s: s[::-1])
    u = env.unwrapped
    assert u.text_spec.prompt_texts[0] == "Q: " + u.suite.items[0]["question"] + "A:"
    env.reset(options={"prompt_index": 0})
    assert run_answer(env, u.suite.items[0]["answer"][::-1])[0] == 1.0


def test_group_members_share_the_item_and_vector_matches_sync():
    kw = {"task": "chain_sum", "task_kwargs": TASKS["chain_sum"], "size": 12, "max_new_tokens": 6}
    vec = gym.make_vec(RG, num_envs=4, group_size=2, device="cpu", **kw)
    assert type(vec).__name__ == "ReasoningGymVectorEnv"
    _, info = vec.reset(seed=0)
    index = info["prompt_index"]
    assert index[0] == index[1] and index[2] == index[3]
    answers = [vec.tokenizer(item["answer"], add_special_tokens=False)["input_ids"] for item in vec.suite.items]

    n = 4
    sync = gym.vector.SyncVectorEnv(
        [lambda: gym.make(RG, **kw) for _ in range(n)], autoreset_mode=AutoresetMode.SAME_STEP
    )
    vec = gym.make_vec(RG, num_envs=n, device="cpu", **kw)
    _, info_s = sync.reset(seed=5)
    _, info_v = vec.reset(seed=5)
    np.testing.assert_array_equal(info_s["prompt_index"], info_v["prompt_index"])
    current, pos = list(info_v["prompt_index"]), [0] * n
    rng, eos, rewards = np.random.default_rng(0), vec.text_spec.eos_token_id, []
    for _ in range(60):  # the right answer, with a digit spoiled now and then
        actions = np.array(
            [answers[current[i]][pos[i]] if pos[i] < len(answers[current[i]]) else eos for i in range(n)]
        )
        spoil = rng.random(n) < 0.1
        actions[spoil] = vec.tokenizer("7", add_special_tokens=False)["input_ids"][0]
        out_s, out_v = sync.step(actions), vec.step(actions)
        for a, b in zip(out_s[:4], out_v[:4]):
            for key in ("input_ids", "attention_mask") if isinstance(a, dict) else ():
                np.testing.assert_array_equal(a[key], b[key])
            if not isinstance(a, dict):
                np.testing.assert_array_equal(a, b)
        done = out_v[2] | out_v[3]
        for i in range(n):
            pos[i] += 1
            if done[i]:
                fi_s, fi_v = out_s[4]["final_info"], out_v[4]["final_info"]
                assert fi_v["answer"][i] == fi_s["answer"][i] == vec.suite.items[fi_v["prompt_index"][i]]["answer"]
                assert fi_v["metadata"][i]["source_index"] == fi_v["prompt_index"][i]
                rewards.append(out_v[1][i])
                current[i], pos[i] = int(out_v[4]["prompt_index"][i]), 0
    assert 1.0 in rewards and min(rewards) < 1.0  # both right and spoiled answers were scored


def test_levels_are_reasoning_gyms_curriculum_levels():
    """``levels=`` makes each level's items with the config reasoning-gym's curriculum gives at that level (its
    ranges from the first level's value up to the level's, written out by hand here), seeded ``seed + level``."""
    env = gym.make(RG, task="chain_sum", task_kwargs={"allow_negation": True}, levels=[0, 3], size=4, seed=5)
    env = env.unwrapped
    suite = env.suite
    assert env.text_spec.metadata["level"] == [0, 0, 0, 0, 3, 3, 3, 3]
    by_hand = {  # chain_sum's curriculum: num_terms levels 2, 3, 4, 5, ...; num_digits 1, 2, 3, 4, ...
        0: {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1},
        3: {"min_terms": 2, "max_terms": 5, "min_digits": 1, "max_digits": 4},
    }
    for level, config in by_hand.items():
        direct = rg.create_dataset("chain_sum", size=4, seed=5 + level, allow_negation=True, **config)
        items = [item for item in suite.items if item["metadata"]["level"] == level]
        assert [item["question"] for item in items] == [direct[i]["question"] for i in range(4)]
        for item in items:
            difficulty = item["metadata"]["difficulty"]
            assert difficulty["num_terms"] == (config["min_terms"], config["max_terms"])
            assert difficulty["num_digits"] == (config["min_digits"], config["max_digits"])
    for i in (0, 5):  # an item of each level scores 1.0 with its answer, by its own level's dataset
        env.reset(options={"prompt_index": i})
        assert run_answer(env, suite.items[i]["answer"])[0] == 1.0
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*longer than max_prompt_tokens")  # the top levels' long sums
        every = gym.make(RG, task="chain_sum", levels="all", size=1).unwrapped
    assert every.text_spec.metadata["level"] == list(range(11))  # num_terms has 11 levels, num_digits 10
    mix = gym.make(RG, task=["chain_sum", "gcd"], levels=[1], size=6).unwrapped.suite
    assert {item["metadata"]["source_dataset"] for item in mix.items} == {"chain_sum", "gcd"}
    assert {item["metadata"]["level"] for item in mix.items} == {1}


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"task": "acre", "levels": [0]}, "'acre' has no curriculum"),
        ({"task": "chain_sum", "levels": [11]}, r"ints in \[0, 10\]"),
        ({"task": "chain_sum", "levels": []}, "non-empty list"),
        ({"task": "chain_sum", "levels": "hard"}, "levels must be 'all'"),
        ({"task": "chain_sum", "levels": [1, 1]}, "lists a level twice"),
        ({"task": "chain_sum", "levels": [0], "task_kwargs": {"max_terms": 3}}, r"sets \['max_terms'\]"),
    ],
)
def test_bad_levels(kwargs, match):
    with pytest.raises(ValueError, match=match):
        gym.make(RG, **{"size": 2, **kwargs})


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"task": "leg_countin"}, ValueError, r"no task 'leg_countin'; did you mean 'leg_counting'"),
        ({"task": 3}, TypeError, "task must be a reasoning-gym task name"),
        ({"task": []}, ValueError, "task is empty"),
        ({"task": {"gcd": 0}}, ValueError, "weight of task 'gcd' must be a finite number > 0"),
        ({"task": ["gcd", "gcd"]}, ValueError, "lists a name twice"),
        ({"task": ["gcd", "lcm"], "task_kwargs": {"leg_counting": {}}}, ValueError, "not among the tasks"),
        ({"task_kwargs": {"legs": 2}}, ValueError, r"has no option \['legs'\]; its options: min_animals"),
        ({"task_kwargs": {"seed": 2}}, ValueError, "give them as the env's own size= and seed="),
        ({"task_kwargs": {"min_animals": 0}}, ValueError, "rejected task_kwargs"),
        ({"size": 0}, ValueError, "size .* must be an int >= 1"),
        ({"seed": 1.5}, TypeError, "seed .* must be an int or None"),
        ({"template": "no question"}, ValueError, "template must be a str containing"),
        ({"template": "{question} {other}"}, ValueError, "does not format with question= alone"),
        ({"answer_format": "json"}, ValueError, "answer_format must be one of"),
        ({"prompts": ["hi"]}, TypeError, "takes no prompts="),
        ({"partial_credit": 1}, TypeError, r"partial_credit must be True or False, got 1"),
        ({"partial_credit": False, "reward": lambda p, c: [0.0] * len(c)}, TypeError, "reward= replaces that grader"),
    ],
)
def test_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        gym.make(RG, **{"size": 2, **kwargs})


def test_a_prompt_given_as_text_is_refused_at_scoring():
    env = gym.make(RG, task="gcd", size=2)
    env.reset(options={"prompt": "What is 2+2?"})
    with pytest.raises(RuntimeError, match="scores only the items of its dataset"):
        run_answer(env, "4")


def test_no_network_at_run_time():
    """A fresh interpreter in which every socket connection fails makes, runs and scores envs of several tasks."""
    code = (
        "import socket\n"
        "def refuse(*a, **k):\n"
        "    raise OSError('network is off in this test')\n"
        "socket.socket.connect = refuse\n"
        "socket.create_connection = refuse\n"
        "import gymnasium as gym, textrl_envs\n"
        f"for task in {['leg_counting', 'spell_backward', 'word_ladder', 'arc_1d']!r}:\n"
        f"    env = gym.make({RG!r}, task=task, size=2)\n"
        "    env.reset(seed=0)\n"
        "    env.action_space.seed(0)\n"
        "    done = False\n"
        "    while not done:  # to the end, so that the answer is scored\n"
        "        _, _, terminated, truncated, _ = env.step(env.action_space.sample())\n"
        "        done = terminated or truncated\n"
        "print('ok')\n"
    )
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]
