"""The SB3 VecEnv adapter: the VecEnv contract, equality with DummyVecEnv, and SB3's wrappers and tools."""

from __future__ import annotations

import copy
import csv
import pickle
from collections import Counter

import gymnasium as gym
import numpy as np
import pytest
from helpers import EOS, PROMPTS, WORDS, bundled_assets, length_reward, register_test_id, word_tokenizer
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import (
    DummyVecEnv,
    VecEnv,
    VecMonitor,
    VecNormalize,
)

from textrl_envs.sb3 import TextGenSB3VecEnv, make_vec_env, unbatch_info
from textrl_envs.vector import TextGenVectorEnv

TEST_ID = "TextRLTest/TinySB3-v0"


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    """A tiny word-level tokenizer saved as a local HF tokenizer directory (passed by path)."""
    fast = word_tokenizer()
    path = tmp_path_factory.mktemp("tok")
    fast.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def kw(tokenizer_dir):
    register_test_id(TEST_ID)
    return dict(prompts=PROMPTS, reward=length_reward, tokenizer=tokenizer_dir, max_new_tokens=6, max_prompt_tokens=5)


def biased_actions(rng, n, vocab):
    a = rng.integers(3, vocab, size=n)
    a[rng.random(n) < (np.arange(n) + 1) / (2 * n + 2)] = EOS
    return a


class RandomPolicy:
    """The least a model needs for ``evaluate_policy``: ``predict`` returning random tokens."""

    def __init__(self, vocab, seed=0):
        self.vocab, self.rng = vocab, np.random.default_rng(seed)

    def predict(self, obs, state=None, episode_start=None, deterministic=False):  # noqa: ARG002  (SB3's predict)
        return biased_actions(self.rng, len(obs["input_ids"]), self.vocab), None


def test_make_vec_env_returns_monitored_vecenv(kw):
    venv = make_vec_env(None, n_envs=4, group_size=2, device="cpu", seed=0, **kw)
    assert isinstance(venv, VecMonitor) and isinstance(venv.unwrapped, TextGenSB3VecEnv)
    assert isinstance(venv, VecEnv) and venv.num_envs == 4 and venv.unwrapped.group_size == 2
    obs = venv.reset()
    assert set(obs) == {"input_ids", "attention_mask"}
    for v in obs.values():
        assert isinstance(v, np.ndarray) and v.dtype == np.int64 and v.shape == (4, 11)
    assert venv.observation_space["input_ids"].shape == (11,) and venv.action_space.n == len(WORDS) + 3
    # SB3's wrappers keep their own (empty) reset_infos; the adapter's are on venv.unwrapped
    assert [r["group_id"] for r in venv.unwrapped.reset_infos] == [0, 0, 1, 1]
    plain = make_vec_env(TEST_ID, n_envs=2, device="cpu", monitor=False, **kw)  # through gym.make_vec
    assert isinstance(plain, TextGenSB3VecEnv) and plain.spec.id == TEST_ID


def test_matches_dummy_vec_env(kw):
    n, seed = 5, 3
    dummy = DummyVecEnv([lambda: gym.make(TEST_ID, **kw) for _ in range(n)])
    ours = make_vec_env(TEST_ID, n_envs=n, device="cpu", monitor=False, **kw)
    dummy.seed(seed)
    ours.seed(seed)
    obs_d, obs_o = dummy.reset(), ours.reset()
    for key in obs_d:
        np.testing.assert_array_equal(obs_d[key], obs_o[key])
    for i in range(n):
        assert {k: ours.reset_infos[i][k] for k in ("prompt", "prompt_index")} == dummy.reset_infos[i]
    rng = np.random.default_rng(0)
    ends = truncs = 0
    for _ in range(120):
        actions = biased_actions(rng, n, ours.action_space.n)
        obs_d, rew_d, done_d, info_d = dummy.step(actions)
        obs_o, rew_o, done_o, info_o = ours.step(actions)
        for key in obs_d:
            np.testing.assert_array_equal(obs_d[key], obs_o[key])
        np.testing.assert_array_equal(rew_d, rew_o)
        assert rew_o.dtype == np.float32
        np.testing.assert_array_equal(done_d, done_o)
        for i in range(n):
            assert info_o[i]["TimeLimit.truncated"] == info_d[i]["TimeLimit.truncated"]
            assert {"group_id", "episode_id"} <= set(info_o[i])
            if done_d[i]:
                ends += 1
                truncs += info_o[i]["TimeLimit.truncated"]
                for key in ("input_ids", "attention_mask"):
                    np.testing.assert_array_equal(
                        info_o[i]["terminal_observation"][key], info_d[i]["terminal_observation"][key]
                    )
                for key in ("prompt", "completion", "prompt_index", "reward"):
                    assert info_o[i][key] == info_d[i][key]
                assert tuple(info_o[i]["completion_ids"]) == info_d[i]["completion_ids"]
                assert ours.reset_infos[i]["prompt"] == dummy.reset_infos[i]["prompt"]
            else:
                assert "terminal_observation" not in info_o[i] and "completion" not in info_o[i]
    assert ends > 30 and 0 < truncs < ends


def test_ids_in_infos_and_reset_infos(kw):
    venv = make_vec_env(None, n_envs=4, group_size=2, device="cpu", seed=1, monitor=False, **kw)
    venv.reset()
    current = [r["episode_id"] for r in venv.reset_infos]
    assert current == [0, 1, 2, 3]
    rng = np.random.default_rng(1)
    for _ in range(60):
        _, _, dones, infos = venv.step(biased_actions(rng, 4, venv.action_space.n))
        assert [info["episode_id"] for info in infos] == current
        assert [info["group_id"] for info in infos] == [e // 2 for e in current]
        for i in np.flatnonzero(dones):
            assert venv.reset_infos[i]["episode_id"] == current[i] + 4
            assert venv.reset_infos[i]["group_id"] == (current[i] + 4) // 2
            current[i] += 4


def test_seed_applies_to_next_reset_only(kw):
    a = make_vec_env(None, n_envs=3, device="cpu", monitor=False, **kw)
    b = make_vec_env(None, n_envs=3, device="cpu", monitor=False, **kw)
    assert a.seed(10) == [10, 11, 12]
    b.seed(10)
    np.testing.assert_array_equal(a.reset()["input_ids"], b.reset()["input_ids"])
    single = TextGenVectorEnv(num_envs=3, device="cpu", **kw)
    np.testing.assert_array_equal(a.reset_infos[2]["prompt_index"], single.reset(seed=10)[1]["prompt_index"][2])
    # later resets continue the RNGs instead of reseeding
    assert a._seeds == [None, None, None]
    for _ in range(4):
        np.testing.assert_array_equal(a.reset()["input_ids"], b.reset()["input_ids"])


def test_set_options_prompt(kw):
    venv = make_vec_env(None, n_envs=2, device="cpu", monitor=False, **kw)
    venv.set_options({"prompt": "good fun plot"})
    venv.reset()
    assert [r["prompt"] for r in venv.reset_infos] == ["good fun plot"] * 2
    venv.set_options([{"prompt": "a"}, {"prompt": "b"}])
    with pytest.raises(ValueError, match="one options dict"):
        venv.reset()


def test_attr_methods_and_wrapped(kw):
    venv = make_vec_env(None, n_envs=3, device="cpu", monitor=False, **kw)
    venv.reset()
    assert venv.get_attr("max_new_tokens") == [6, 6, 6]
    assert venv.get_attr("group_size", indices=[0, 2]) == [1, 1]
    assert venv.has_attr("tokenizer") and not venv.has_attr("no_such_attribute")
    venv.set_attr("flag", 5)
    assert venv.get_attr("flag", indices=1) == [5]
    with pytest.raises(ValueError, match="subset of envs"):
        venv.set_attr("flag", 6, indices=[0])
    assert venv.env_method("decode", [3, 4, 5], indices=[0, 1]) == ["the movie was"] * 2
    assert venv.env_is_wrapped(Monitor) == [False, False, False]
    venv.close()


def test_render(kw):
    venv = make_vec_env(None, n_envs=2, device="cpu", monitor=False, render_mode="ansi", **kw)
    venv.set_options({"prompt_index": 2})
    venv.reset()
    venv.step(np.array([3, 4]))
    assert venv.render() == ("the dog|the", "the dog|movie")
    quiet = make_vec_env(None, n_envs=2, device="cpu", monitor=False, **kw)
    quiet.reset()
    with pytest.warns(UserWarning):
        assert quiet.render() is None


def test_vec_monitor_and_vec_normalize(kw):
    venv = VecNormalize(make_vec_env(None, n_envs=4, device="cpu", seed=0, **kw), norm_obs=False, gamma=0.99)
    obs = venv.reset()
    assert obs["input_ids"].dtype == np.int64
    rng = np.random.default_rng(2)
    episodes = []
    for _ in range(50):
        obs, _, dones, infos = venv.step(biased_actions(rng, 4, 20))
        assert obs["input_ids"].dtype == np.int64  # untouched with norm_obs=False
        for i in np.flatnonzero(dones):
            ep = infos[i]["episode"]
            assert ep["r"] == pytest.approx(infos[i]["reward"]) and 1 <= ep["l"] <= 6
            episodes.append(ep)
    assert len(episodes) > 20
    assert venv.get_original_reward().dtype == np.float32


def test_evaluate_policy_with_random_policy(kw):
    """evaluate_policy counts each episode's reward as the env's reward model scored it, with its length."""
    scored = []

    def recorded(prompts, completions, **metadata):
        values = length_reward(prompts, completions, **metadata)
        scored.extend((v, len(c.split())) for v, c in zip(values, completions))
        return values

    venv = make_vec_env(None, n_envs=4, device="cpu", seed=0, **{**kw, "reward": recorded})
    rewards, lengths = evaluate_policy(
        RandomPolicy(venv.action_space.n), venv, n_eval_episodes=12, return_episode_rewards=True
    )
    assert len(rewards) == 12 and all(1 <= n <= 6 for n in lengths)
    assert not Counter(rewards) - Counter(v for v, _ in scored)  # every counted reward is one the model gave
    assert len(set(rewards)) > 1  # random episodes differ: the counts are not all one value
    mean, std = evaluate_policy(RandomPolicy(venv.action_space.n, seed=1), venv, n_eval_episodes=8)
    values = [v for v, _ in scored]
    assert min(values) <= mean - std and mean + std <= max(values) and std > 0


def test_stock_ppo_logs_ep_rew_mean(kw, tmp_path):
    from stable_baselines3 import PPO
    from stable_baselines3.common.logger import configure

    venv = make_vec_env(None, n_envs=4, group_size=2, device="cpu", seed=0, **kw)
    model = PPO("MultiInputPolicy", venv, n_steps=32, batch_size=64, n_epochs=1, seed=0, device="cpu")
    model.set_logger(configure(str(tmp_path), ["csv"]))
    model.learn(total_timesteps=128)
    with open(tmp_path / "progress.csv") as f:
        rows = list(csv.DictReader(f))
    assert rows and "rollout/ep_rew_mean" in rows[0] and rows[-1]["rollout/ep_rew_mean"] != ""
    mean, _ = evaluate_policy(model, venv, n_eval_episodes=4)
    assert np.isfinite(mean)


def test_bad_input(kw):
    with pytest.raises(ValueError, match="not divisible by group_size"):
        make_vec_env(None, n_envs=3, group_size=2, device="cpu", **kw)
    with pytest.raises(ValueError, match="numpy"):
        make_vec_env(None, n_envs=2, device="cpu", obs_backend="torch", **kw)
    with pytest.raises(ValueError, match="not a textrl_envs text env"):
        make_vec_env("CartPole-v1", n_envs=2)
    with pytest.raises(ValueError, match="numpy"):
        TextGenSB3VecEnv(TextGenVectorEnv(num_envs=2, device="cpu", obs_backend="torch", **kw))
    venv = make_vec_env(None, n_envs=2, device="cpu", monitor=False, **kw)
    with pytest.raises(RuntimeError, match="before reset"):
        venv.step(np.array([3, 3]))
    venv.reset()
    with pytest.raises(ValueError, match="shape"):
        venv.step(np.array([3, 3, 3]))


def test_unbatch_info():
    infos = {
        "a": np.array([1, 2]),
        "_a": np.array([True, False]),
        "d": {"x": np.array([0.5, 1.5]), "_x": np.array([False, True])},
    }
    infos["_d"] = np.array([True, True])
    assert unbatch_info(infos, 0) == {"a": 1, "d": {}}
    assert unbatch_info(infos, 1) == {"d": {"x": 1.5}}


@pytest.mark.skipif(not bundled_assets(), reason="bundled tokenizer not built yet")
def test_registered_id_with_groups_and_evaluate_policy():
    venv = make_vec_env("TextGen-v0", n_envs=4, group_size=2, device="cpu", seed=0)
    assert isinstance(venv, VecMonitor) and venv.unwrapped.spec.id == "TextGen-v0"
    venv.reset()
    prompts = [r["prompt"] for r in venv.unwrapped.reset_infos]
    assert prompts[0] == prompts[1] and prompts[2] == prompts[3]
    rewards, _ = evaluate_policy(
        RandomPolicy(venv.action_space.n), venv, n_eval_episodes=8, return_episode_rewards=True
    )
    assert len(rewards) == 8 and all(np.isfinite(rewards))


def test_the_sb3_adapter_pickles_and_the_copy_steps_alike():
    venv = make_vec_env("TextGen-v0", n_envs=2, device="cpu", seed=0, max_new_tokens=3)
    venv.reset()
    venv.step(np.array([5, 6]))
    for make_copy in (lambda v: pickle.loads(pickle.dumps(v)), copy.deepcopy):
        clone = make_copy(venv)
        assert type(clone) is type(venv) and clone.get_attr("group_size") == [1, 1]
        for actions in ([7, 8], [9, 10]):
            a, b = venv.step(np.array(actions)), clone.step(np.array(actions))
            assert np.array_equal(a[0]["input_ids"], b[0]["input_ids"]) and np.array_equal(a[2], b[2])
        assert [i.get("completion") for i in a[3]] == [i.get("completion") for i in b[3]]
        venv.reset(), clone.reset()
