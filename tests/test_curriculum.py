"""Curricula: the pass-rate, weight and level functions against hand computations, weighted prompt draws in the
single and the vector env (exactly equal to each other, only allowed prompts, groups still sharing), draws unchanged
without weights, and the callbacks on hand-made episode outcomes and in short GRPO runs."""

from __future__ import annotations

from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils import seeding
from gymnasium.vector import AutoresetMode
from helpers import PROMPTS, length_reward, register_test_id, word_tokenizer
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.logger import configure

from sb3_grpo.callbacks import LevelCurriculum, PassRateCurriculum, StagedCurriculum
from sb3_grpo.callbacks.curriculum import (
    curriculum_weights,
    level_weights,
    next_level,
    stage_mask,
    update_pass_rates,
)
from textrl_envs.env import TextGenEnv
from textrl_envs.groups import draw_weighted, prompt_draw_cdf
from textrl_envs.vector import TextGenVectorEnv

TEST_ID = "TextRLTest/TinyCurriculum-v0"


@pytest.fixture(scope="module")
def kw():
    register_test_id(TEST_ID)
    tokenizer = word_tokenizer()
    return dict(prompts=PROMPTS, reward=length_reward, tokenizer=tokenizer, max_new_tokens=3, max_prompt_tokens=6)


# -- pure functions -----------------------------------------------------------------------------------------------


def test_pass_rates_equal_a_hand_computation():
    rates, counts = np.zeros(3), np.zeros(3, dtype=np.int64)
    rates, counts = update_pass_rates(rates, counts, [0, 0, 1, 0, 2, 0], [True, False, False, True, True, True], 0.5)
    # prompt 0: 1 -> 1 + .5 (0 - 1) = .5 -> .5 + .5 (1 - .5) = .75 -> .75 + .5 (1 - .75) = .875
    np.testing.assert_allclose(rates, [0.875, 0.0, 1.0])
    np.testing.assert_array_equal(counts, [4, 1, 1])
    w, fell_back = curriculum_weights(rates, counts, low=0.1, high=0.9, min_episodes=1, skip_weight=0.25)
    np.testing.assert_array_equal(w, [1.0, 0.25, 0.25])  # 0.875 in range; 0 below low, 1 above high
    assert not fell_back


def test_weights_filter_only_after_min_episodes_and_fall_back_to_uniform():
    rates, counts = np.array([0.875, 0.0, 1.0, 0.5]), np.array([4, 1, 1, 3])
    w, fell_back = curriculum_weights(rates, counts, low=0.1, high=0.8, min_episodes=2, skip_weight=0.25)
    np.testing.assert_array_equal(w, [0.25, 1.0, 1.0, 1.0])  # only prompt 0 has 2+ episodes and is out of range
    assert not fell_back
    w, fell_back = curriculum_weights(rates[:3], counts[:3], low=0.1, high=0.8, min_episodes=1, skip_weight=0.0)
    np.testing.assert_array_equal(w, [1.0, 1.0, 1.0])
    assert fell_back
    args = dict(low=0.1, high=0.8, min_episodes=1)
    w, fell_back = curriculum_weights(rates, counts, **args, skip_weight=0.5, mask=[0, 1, 1, 1])
    np.testing.assert_array_equal(w, [0.0, 0.5, 0.5, 1.0])  # within the mask
    assert not fell_back
    w, fell_back = curriculum_weights(rates, counts, **args, skip_weight=0.0, mask=[1, 1, 1, 0])
    np.testing.assert_array_equal(w, [1.0, 1.0, 1.0, 0.0])  # every prompt of the mask filtered: the mask
    assert fell_back


def test_prompt_draw_cdf_checks_and_draws_as_numpy_choice():
    assert prompt_draw_cdf(None, 3) is None
    for bad, match in (([1, 2], "one entry per prompt"), ([1, -1, 0], ">= 0"), ([0, 0, 0], "all 0"), ("ab", "numbers")):
        with pytest.raises(ValueError, match=match):
            prompt_draw_cdf(bad, 3 if bad != "ab" else 2)
    w = np.array([0.0, 2.0, 0.0, 1.0, 0.5])
    cdf = prompt_draw_cdf(w, 5)
    a, b = np.random.default_rng(3), np.random.default_rng(3)
    ours = [draw_weighted(a, cdf) for _ in range(2000)]
    theirs = b.choice(5, size=2000, p=w / w.sum()).tolist()
    assert ours == theirs
    assert set(ours) == {1, 3, 4}


# -- the envs ------------------------------------------------------------------------------------------------------


def _draws_single(env, seed, n):
    out = [env.reset(seed=seed)[1]["prompt_index"]]
    out += [env.reset()[1]["prompt_index"] for _ in range(n - 1)]
    return out


def test_single_env_draws_only_allowed_prompts_and_unchanged_without_weights(kw):
    env = TextGenEnv(**kw)
    uniform = _draws_single(env, 5, 200)
    rng, _ = seeding.np_random(5)
    assert uniform == [int(rng.integers(len(PROMPTS))) for _ in range(200)]  # today's draws
    env.set_prompt_weights([0, 1, 0, 1, 0])
    np.testing.assert_array_equal(env.prompt_weights, [0, 1, 0, 1, 0])
    weighted = _draws_single(env, 5, 200)
    assert set(weighted) == {1, 3}
    rng, _ = seeding.np_random(5)
    cdf = prompt_draw_cdf([0, 1, 0, 1, 0], 5)
    assert weighted == [draw_weighted(rng, cdf) for _ in range(200)]
    env.set_prompt_weights(None)
    assert env.prompt_weights is None and _draws_single(env, 5, 200) == uniform
    with pytest.raises(ValueError, match="one entry per prompt"):
        env.set_prompt_weights([1, 1])


def _run_vector_against_sync(kw, num_envs, weights, steps=120, seed=7):
    sync = gym.vector.SyncVectorEnv(
        [lambda: gym.make(TEST_ID, **kw) for _ in range(num_envs)], autoreset_mode=AutoresetMode.SAME_STEP
    )
    vec = TextGenVectorEnv(num_envs=num_envs, device="cpu", **kw)
    if weights is not None:
        sync.call("set_prompt_weights", weights)
        vec.set_prompt_weights(weights)
    _, info_s = sync.reset(seed=seed)
    _, info_v = vec.reset(seed=seed)
    seen = list(info_v["prompt_index"])
    np.testing.assert_array_equal(info_v["prompt_index"], info_s["prompt_index"])
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        actions = rng.integers(1, vec.single_action_space.n, size=num_envs)
        *_, term_s, trunc_s, info_s = sync.step(actions)
        *_, term_v, trunc_v, info_v = vec.step(actions)
        np.testing.assert_array_equal(term_v | trunc_v, term_s | trunc_s)
        done = np.flatnonzero(term_s | trunc_s)
        for i in done:
            assert info_v["prompt_index"][i] == info_s["prompt_index"][i]
            seen.append(int(info_v["prompt_index"][i]))
    return seen


@pytest.mark.parametrize("weights", [None, [0, 1, 0, 1, 0], [0.5, 0, 2, 1, 0]])
def test_vector_env_draws_equal_single_envs_with_the_same_weights(kw, weights):
    seen = _run_vector_against_sync(kw, 4, weights)
    assert len(seen) > 100
    if weights is not None:
        assert set(seen) == {i for i, w in enumerate(weights) if w > 0}


def test_groups_share_the_weighted_draw_of_their_round(kw):
    n, g, seed = 8, 4, 3
    weights = [0, 1, 0, 1, 1]
    vec = TextGenVectorEnv(num_envs=n, group_size=g, device="cpu", **kw)
    vec.set_prompt_weights(weights)
    _, info = vec.reset(seed=seed)
    by_group = {int(gid): {int(p)} for gid, p in zip(info["group_id"], info["prompt_index"])}
    rng = np.random.default_rng(0)
    for _ in range(150):
        _, _, term, trunc, info = vec.step(rng.integers(1, vec.single_action_space.n, size=n))
        new_groups = vec.group_ids()
        for j in np.flatnonzero(term | trunc):
            by_group.setdefault(int(new_groups[j]), set()).add(int(info["prompt_index"][j]))
    assert len(by_group) > 30 and all(len(p) == 1 for p in by_group.values())
    cdf = prompt_draw_cdf(weights, 5)
    for k in range(n // g):  # group k's r-th round is its RNG's r-th weighted draw
        rng_k, _ = seeding.np_random(seed + k * g)
        rounds = sorted(gid // (n // g) for gid in by_group if gid % (n // g) == k)
        draws = [draw_weighted(rng_k, cdf) for _ in range(max(rounds) + 1)]
        for r in rounds:
            assert by_group[r * (n // g) + k] == {draws[r]}
            assert weights[draws[r]] > 0


def test_vector_env_without_weights_draws_as_before_after_unsetting(kw):
    a = TextGenVectorEnv(num_envs=2, device="cpu", **kw)
    b = TextGenVectorEnv(num_envs=2, device="cpu", **kw)
    b.set_prompt_weights(None)
    assert b.prompt_weights is None
    for env in (a, b):
        env.reset(seed=1)
    rng = np.random.default_rng(0)
    for _ in range(60):
        actions = rng.integers(1, a.single_action_space.n, size=2)
        *_, info_a = a.step(actions)
        *_, info_b = b.step(actions)
        np.testing.assert_array_equal(a.prompt_indices(), b.prompt_indices())


# -- the callback --------------------------------------------------------------------------------------------------


def _callback_on(env, cls=PassRateCurriculum, **kwargs):
    cb = cls(**kwargs)
    model = SimpleNamespace(get_env=lambda: env, logger=configure(None, []), num_timesteps=0)
    cb.init_callback(model)
    cb.on_training_start({}, {})
    return cb


def _rollout(cb, episodes):
    """Feed ended episodes ``(prompt_index, reward)``, one step each (env 0), then end the rollout."""
    cb.on_rollout_start()
    for index, reward in episodes:
        cb.update_locals({"dones": np.array([True, False]), "infos": [{"prompt_index": index, "reward": reward}, {}]})
        cb.on_step()
    cb.on_rollout_end()


def test_callback_weights_equal_a_hand_computation(kw):
    from textrl_envs.sb3 import TextGenSB3VecEnv

    env = TextGenSB3VecEnv(TextGenVectorEnv(num_envs=2, device="cpu", **kw))
    cb = _callback_on(env, threshold=1.0, low=0.2, high=0.7, min_episodes=2, alpha=0.5, skip_weight=0.0)
    # prompt 0: 1, 1 -> rate 1 (too easy); prompt 1: 0, 0 -> 0 (too hard); prompt 2: 1, 0 -> .5;
    # prompt 3: one episode 0 (too few); prompt 4: reward 0.5 < 1 and -1 (a prompt given as text) is not counted
    _rollout(cb, [(0, 1.0), (1, 0.0), (2, 3.0), (0, 2.0), (1, 0.5), (2, 0.0), (3, 0.0), (-1, 1.0)])
    np.testing.assert_allclose(cb.rates[:4], [1.0, 0.0, 0.5, 0.0])
    np.testing.assert_array_equal(cb.counts, [2, 2, 2, 1, 0])
    np.testing.assert_array_equal(cb.weights, [0, 0, 1, 1, 1])
    np.testing.assert_array_equal(env.venv.prompt_weights, [0, 0, 1, 1, 1])
    values = cb.logger.name_to_value
    assert values["curriculum/active_prompts"] == 3
    assert values["curriculum/mean_pass_rate"] == pytest.approx((1.0 + 0.0 + 0.5 + 0.0) / 4)
    # next rollout: prompt 0 fails once -> 1 + .5 (0 - 1) = .5, back in range
    _rollout(cb, [(0, 0.0)])
    np.testing.assert_array_equal(cb.weights, [1, 0, 1, 1, 1])
    # every prompt out of range -> uniform, with a warning
    with pytest.warns(UserWarning, match="drawing those prompts uniformly"):
        _rollout(cb, [(p, 5.0) for p in range(5) for _ in range(4)])
    np.testing.assert_array_equal(cb.weights, [1, 1, 1, 1, 1])
    cb.on_training_end()
    assert env.venv.prompt_weights is None


def test_callback_checks_its_arguments():
    for kwargs, match in (
        ({"low": 0.8, "high": 0.2}, "low"),
        ({"alpha": 0.0}, "alpha"),
        ({"skip_weight": 2.0}, "skip_weight"),
        ({"min_episodes": 0}, "min_episodes"),
        ({"threshold": float("nan")}, "threshold"),
    ):
        with pytest.raises(ValueError, match=match):
            PassRateCurriculum(**kwargs)


def test_callback_in_a_grpo_run_counts_every_ended_episode():
    from sb3_grpo import GRPO
    from textrl_envs.sb3 import make_vec_env

    env = make_vec_env("TextGen-v0", n_envs=4, group_size=2, seed=0, device="cpu", max_new_tokens=3)
    model = GRPO("CausalLMPolicy", env, n_steps=6, batch_size=8, n_epochs=1, seed=0, device="cpu", verbose=0)
    ended = []

    class Ended(BaseCallback):
        def _on_step(self):
            ended.extend(info for info, d in zip(self.locals["infos"], self.locals["dones"]) if d)
            return True

    threshold = 0.5
    cb = PassRateCurriculum(threshold=threshold, min_episodes=1, alpha=0.5, restore_at_end=False)
    model.learn(48, callback=[cb, Ended()])
    # the info dicts as they are after the run: a reward scored in the background landed in them by the rollout's end
    ended = [(info["prompt_index"], info["reward"]) for info in ended]
    assert any(r >= threshold for _, r in ended) and any(r < threshold for _, r in ended)
    n = len(env.get_attr("text_spec")[0].prompt_texts)
    rates, counts = update_pass_rates(
        np.zeros(n), np.zeros(n, dtype=np.int64), [p for p, _ in ended], [r >= threshold for _, r in ended], 0.5
    )
    assert counts.sum() == len(ended) > 0
    np.testing.assert_array_equal(cb.counts, counts)
    np.testing.assert_allclose(cb.rates, rates)
    expected, _ = curriculum_weights(rates, counts, cb.low, cb.high, 1, 0.0)
    np.testing.assert_array_equal(env.get_attr("prompt_weights")[0], expected)


# -- stages --------------------------------------------------------------------------------------------------------


def test_stage_mask_by_indices_and_by_metadata():
    items = [{"prompt": "a", "task": "short"}, {"prompt": "b", "task": "long"}, {"prompt": "c", "task": "short"}]
    np.testing.assert_array_equal(stage_mask(items, [1]), [0, 1, 0])
    np.testing.assert_array_equal(stage_mask(items, lambda item: item["task"] == "short"), [1, 0, 1])
    with pytest.raises(ValueError, match=r"ints in \[0, 2\]"):
        stage_mask(items, [3])
    with pytest.raises(ValueError, match="takes no prompt"):
        stage_mask(items, lambda item: False)
    with pytest.raises(ValueError, match="start at timestep 0"):
        StagedCurriculum([(10, [0])])
    with pytest.raises(ValueError, match="timestep, prompts"):
        StagedCurriculum("short")


def _tagged_env(kw):
    from textrl_envs.sb3 import TextGenSB3VecEnv

    tasks = ["short", "medium", "short", "long", "medium"]
    prompts = [{"prompt": p, "task": t} for p, t in zip(PROMPTS, tasks)]

    def reward(prompts, completions, task, **_):
        return [float(t == "short") for t in task]

    vec = TextGenVectorEnv(num_envs=4, group_size=2, device="cpu", **dict(kw, prompts=prompts, reward=reward))
    return TextGenSB3VecEnv(vec)


def test_staged_curriculum_sets_each_stages_prompts(kw):
    env = _tagged_env(kw)
    stages = [
        (0, lambda item: item["task"] == "short"),
        (100, lambda item: item["task"] in ("short", "medium")),
        (200, [3]),
    ]
    cb = _callback_on(env, StagedCurriculum, stages=stages)
    np.testing.assert_array_equal(env.venv.prompt_weights, [1, 0, 1, 0, 0])
    for t, expected in ((99, [1, 0, 1, 0, 0]), (100, [1, 1, 1, 0, 1]), (250, [0, 0, 0, 1, 0])):
        cb.model.num_timesteps = t
        cb.on_rollout_start()
        np.testing.assert_array_equal(env.venv.prompt_weights, expected)
        assert cb.logger.name_to_value["curriculum/active_prompts"] == sum(expected)
    assert cb.stage == 2
    env.reset()
    drawn = set()
    for _ in range(30):  # stage 2: every group round draws prompt 3
        _, _, dones, infos = env.step(np.full(4, 5))
        drawn |= {info["prompt_index"] for info, d in zip(infos, dones) if d}
    assert drawn == {3}
    cb.on_training_end()
    assert env.venv.prompt_weights is None


def test_pass_rate_filter_within_stages(kw):
    env = _tagged_env(kw)
    stages = [(0, [0, 1, 2]), (50, [2, 3, 4])]
    cb = _callback_on(env, stages=stages, threshold=1.0, low=0.2, high=0.8, min_episodes=1, alpha=1.0)
    np.testing.assert_array_equal(env.venv.prompt_weights, [1, 1, 1, 0, 0])  # stage 0, nothing seen yet
    _rollout(cb, [(0, 1.0), (2, 0.0), (3, 1.0)])  # 0 too easy, 2 too hard, 3 too easy (outside the stage)
    np.testing.assert_array_equal(cb.weights, [0, 1, 0, 0, 0])
    cb.model.num_timesteps = 50
    cb.on_rollout_start()  # stage 1: 2 and 3 filtered, 4 not seen
    np.testing.assert_array_equal(env.venv.prompt_weights, [0, 0, 0, 0, 1])
    assert cb.logger.name_to_value["curriculum/stage"] == 1
    with pytest.warns(UserWarning, match="every prompt of stage 1"):
        _rollout(cb, [(4, 1.0)])  # every prompt of the stage filtered: all of the stage's prompts
    np.testing.assert_array_equal(cb.weights, [0, 0, 1, 1, 1])


def test_weighted_draws_of_an_interactive_env_match_single_envs():
    """Interactive tasks draw a task seed right after the prompt: the weighted draw keeps the two interleaved."""
    env_id, n, seed = "ToolArithmetic-v0", 4, 5
    weights = np.zeros(len(gym.make(env_id).unwrapped.text_spec.prompt_texts))
    weights[[3, 10, 200]] = [1.0, 2.0, 0.5]
    sync = gym.vector.SyncVectorEnv(
        [lambda: gym.make(env_id, max_new_tokens=8) for _ in range(n)], autoreset_mode=AutoresetMode.SAME_STEP
    )
    vec = gym.make_vec(env_id, num_envs=n, device="cpu", max_new_tokens=8)
    sync.call("set_prompt_weights", weights)
    vec.set_prompt_weights(weights)
    s, v = sync.reset(seed=seed), vec.reset(seed=seed)
    np.testing.assert_array_equal(v[0]["input_ids"], s[0]["input_ids"])
    rng = np.random.default_rng(0)
    eos, vocab = vec.text_spec.eos_token_id, vec.single_action_space.n
    seen = set()
    for _ in range(120):
        actions = rng.integers(0, vocab, n)
        actions[rng.random(n) < 0.3] = eos
        s, v = sync.step(actions), vec.step(actions)
        np.testing.assert_array_equal(v[0]["input_ids"], s[0]["input_ids"])
        np.testing.assert_array_equal(v[1], s[1])
        for i in np.flatnonzero(s[2] | s[3]):
            assert v[4]["final_info"]["prompt_index"][i] == s[4]["final_info"]["prompt_index"][i]
            seen.add(int(v[4]["final_info"]["prompt_index"][i]))
    assert seen == {3, 10, 200}


# -- difficulty levels ---------------------------------------------------------------------------------------------


def test_next_level_and_level_weights_by_hand():
    levels = [0, 2, 5]
    assert next_level(0, 0.8, levels, promote=0.8, demote=None) == 2  # at promote: up to the next listed level
    assert next_level(2, 0.79, levels, promote=0.8, demote=None) == 2
    assert next_level(5, 1.0, levels, promote=0.8, demote=None) == 5  # the top stays
    assert next_level(2, 0.19, levels, promote=0.8, demote=0.2) == 0
    assert next_level(2, 0.2, levels, promote=0.8, demote=0.2) == 2
    assert next_level(0, 0.0, levels, promote=0.8, demote=0.2) == 0  # the bottom stays
    np.testing.assert_array_equal(level_weights(np.array([0, 2, 5, 2, 0]), 2, 0.0), [0, 1, 0, 1, 0])
    np.testing.assert_array_equal(level_weights(np.array([0, 2, 5, 2, 0]), 2, 0.25), [0.25, 1, 0, 1, 0.25])


def _leveled_env(kw, levels=(0, 1, 0, 2, 1)):
    from textrl_envs.sb3 import TextGenSB3VecEnv

    prompts = [{"prompt": p, "level": level} for p, level in zip(PROMPTS, levels)]
    vec = TextGenVectorEnv(num_envs=2, device="cpu", **dict(kw, prompts=prompts))
    return TextGenSB3VecEnv(vec)


def test_level_curriculum_moves_as_a_hand_computation(kw):
    env = _leveled_env(kw)
    cb = _callback_on(env, LevelCurriculum, threshold=1.0, promote=0.75, demote=0.3, window=4, review_weight=0.5)
    assert cb.level == 0 and cb.levels == [0, 1, 2]
    np.testing.assert_array_equal(env.venv.prompt_weights, [1, 0, 1, 0, 0])
    # level 0 (prompts 0 and 2): 3 of 4 pass (0.75 >= promote); an episode of prompt 1 (level 1) does not count
    _rollout(cb, [(0, 1.0), (2, 1.0), (1, 0.0), (0, 0.0)])
    assert cb.level == 0 and cb.outcomes == [True, True, False]  # 3 < window: no decision yet
    _rollout(cb, [(2, 5.0)])
    assert cb.level == 1 and cb.outcomes == []
    np.testing.assert_array_equal(env.venv.prompt_weights, [0.5, 1, 0.5, 0, 1])
    assert cb.logger.name_to_value["curriculum/level"] == 1
    # level 1 (prompts 1 and 4): 1 of 5 pass (0.2 < demote): back to level 0
    _rollout(cb, [(1, 1.0), (4, 0.0), (4, 0.0), (1, 0.0), (1, 0.0)])
    assert cb.level == 0
    # level 0 again: 2 of 4 (in [demote, promote)): stays, a new window starts
    _rollout(cb, [(0, 1.0), (0, 0.0), (2, 1.0), (2, 0.0)])
    assert cb.level == 0 and cb.outcomes == []
    assert [level for _, level in cb.history] == [0, 1, 0]
    cb.on_training_end()
    assert env.venv.prompt_weights is None


def test_level_curriculum_checks_its_arguments_and_the_env(kw):
    for kwargs, match in (
        ({"promote": 1.5}, "promote"),
        ({"demote": 0.9, "promote": 0.8}, "demote"),
        ({"window": 0}, "window"),
        ({"review_weight": -0.1}, "review_weight"),
        ({"start_level": 1.5}, "start_level"),
    ):
        with pytest.raises(ValueError, match=match):
            LevelCurriculum(**kwargs)
    from textrl_envs.sb3 import TextGenSB3VecEnv

    plain = TextGenSB3VecEnv(TextGenVectorEnv(num_envs=2, device="cpu", **kw))
    with pytest.raises(ValueError, match="needs a 'level' column"):
        _callback_on(plain, LevelCurriculum)
    with pytest.raises(ValueError, match="start_level 7 is not a level"):
        _callback_on(_leveled_env(kw), LevelCurriculum, start_level=7)


def test_level_curriculum_in_a_grpo_run_draws_only_its_levels():
    """A GRPO run on reasoning-gym levels: every episode passes (threshold below every reward), so the level goes up
    once per window of its episodes, and every episode's item is of the level in force when it was drawn."""
    pytest.importorskip("reasoning_gym", reason="LevelCurriculum on reasoning-gym levels needs the reasoning extra")
    from sb3_grpo import GRPO
    from textrl_envs.sb3 import make_vec_env

    env = make_vec_env("ReasoningGym-v0", n_envs=4, seed=0, device="cpu", task="chain_sum", levels=[0, 1, 2], size=4)
    model = GRPO("CausalLMPolicy", env, n_steps=8, batch_size=32, n_epochs=1, seed=0, device="cpu", verbose=0)
    seen = []

    class Levels(BaseCallback):
        def _on_step(self):
            for row in np.flatnonzero(self.locals["dones"]):
                seen.append((int(row), cb.level, self.locals["infos"][row]["metadata"]["level"]))
            return True

    cb = LevelCurriculum(threshold=-1.0, window=4, restore_at_end=False)
    model.learn(96, callback=[cb, Levels()])
    assert [level for _, level in cb.history] == [0, 1, 2]
    assert [t for t, _ in cb.history] == [0, 32, 64]  # one rollout (8 steps x 4 envs) holds >= 4 episodes
    # SB3's learn() resets the env before callbacks start, so each row's first episode was drawn before the
    # curriculum; after it, an episode is of the level in force, or of the one before when it began before the change
    later = [(now, drawn) for k, (row, now, drawn) in enumerate(seen) if any(r == row for r, _, _ in seen[:k])]
    assert later and all(drawn in (now, now - 1) for now, drawn in later)
    assert any(drawn == now == 2 for now, drawn in later)
