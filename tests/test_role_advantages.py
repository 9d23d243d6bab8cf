"""Role-conditioned advantages (``advantage="role"``, SPIRAL's): the tracker and the buffer against a brute force."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import quiet
from stable_baselines3.common.callbacks import BaseCallback

import textrl_envs  # noqa: F401  (registers the ids)
from sb3_grpo import CISPO, DAPO, GRPO, GSPO, DrGRPO
from sb3_grpo.common.advantages.forms import make_group_tracker
from sb3_grpo.common.advantages.group_trackers import ROLE_BASELINE_DECAY, RoleBaselineTracker
from textrl_envs.games import Nim, SelfPlay
from textrl_envs.sb3 import make_vec_env


def brute_force_role_advantages(steps, n_envs, decay=ROLE_BASELINE_DECAY, baselines=None):
    """The advantage of every step of a stream of VecEnv steps, written out plainly: each env's episodes, in the order
    they end (step by step, env by env), update the running mean of their (game, role) and get ``r - b``.

    :param steps: one ``(rewards, dones, infos)`` per step
    :return: ``(advantages [n_steps, n_envs], baselines)``; steps of unfinished episodes get 0
    """
    baselines = dict(baselines or {})
    adv = np.zeros((len(steps), n_envs))
    start, total = [0] * n_envs, [0.0] * n_envs
    for t, (rewards, dones, infos) in enumerate(steps):
        for env in range(n_envs):
            total[env] += float(rewards[env])
            if dones[env]:
                key = (infos[env]["game"], infos[env]["learner_player"])
                b = decay * baselines.get(key, 0.0) + (1 - decay) * total[env]
                baselines[key] = b
                adv[start[env] : t + 1, env] = total[env] - b
                start[env], total[env] = t + 1, 0.0
    return adv, baselines


def _info(game, role):
    return {"game": game, "learner_player": role, "group_id": 0}


def test_role_tracker_matches_the_brute_force_on_hand_made_episodes():
    # 3 envs, two games, both roles; episodes of 1-4 steps, one straddling the two rollouts
    ends = {  # (t, env) -> (game, role)
        (1, 0): ("nim", 0), (3, 0): ("nim", 1), (4, 0): ("nim", 0),
        (0, 1): ("kuhn", 1), (2, 1): ("nim", 0), (5, 1): ("kuhn", 1),
        (3, 2): ("nim", 1), (7, 2): ("nim", 1),
    }  # fmt: skip
    rng = np.random.default_rng(0)
    steps = []
    for t in range(8):
        dones = np.array([(t, e) in ends for e in range(3)])
        rewards = np.where(dones, rng.choice([-1.0, 0.0, 1.0, 2.0], size=3), 0.0)
        infos = [_info(*ends[(t, e)]) if dones[e] else {"group_id": 0} for e in range(3)]
        steps.append((rewards, dones, infos))
    tracker = RoleBaselineTracker(3)
    got = []
    for lo, hi in ((0, 5), (5, 8)):  # two rollouts: env 2's episode 4..7 and env 1's 3..5 straddle
        tracker.reset_rollout(hi - lo)
        for rewards, dones, infos in steps[lo:hi]:
            tracker.add(rewards, dones, infos)
        adv, stats = tracker.compute()
        got.append(adv)
    expected, baselines = brute_force_role_advantages(steps, 3)
    # a straddling episode's steps in the first rollout get 0 there (its advantage comes when it ends)
    first = expected[:5].copy()
    first[3:5, 1] = first[4:5, 2] = 0.0
    np.testing.assert_allclose(got[0], first, rtol=1e-6)
    np.testing.assert_allclose(got[1], expected[5:], rtol=1e-6)
    names = {v: k for k, v in tracker.game_ids.items()}
    assert {(names[g], r): b for (g, r), b in tracker.baselines.items()} == pytest.approx(baselines)
    assert stats["role_baseline_nim_1"] == pytest.approx(baselines[("nim", 1)])
    assert stats["n_groups"] == 2.0  # episodes resolved in the second rollout
    # every ended episode is resolved; only the running ones are live
    assert len(tracker.resolved) == 2 and tracker.live_keys() == {int(k) for k in tracker.running_keys}


def test_role_tracker_refuses_an_episode_without_a_role():
    tracker = RoleBaselineTracker(1)
    tracker.reset_rollout(1)
    with pytest.raises(ValueError, match=r"advantage='role' needs the side the learner played.*TicTacToe-v0"):
        tracker.add(np.array([1.0]), np.array([True]), [{"group_id": 0}])
    with pytest.raises(ValueError, match=r"decay must be in \[0, 1\)"):
        RoleBaselineTracker(1, decay=1.0)


class StepLog(BaseCallback):
    """Every step's ``(rewards, dones, infos)`` as the algorithm saw them, and the buffer's advantages at each
    rollout's end (written by then)."""

    def __init__(self):
        super().__init__()
        self.steps, self.advantages, self.logged = [], [], []

    def _on_step(self):
        self.steps.append((self.locals["rewards"].copy(), self.locals["dones"].copy(), list(self.locals["infos"])))
        return True

    def _on_rollout_end(self):
        self.advantages.append(self.model.rollout_buffer.advantages.copy())
        self.logged.append(dict(self.model.logger.name_to_value))


HP = {"n_steps": 24, "batch_size": 24, "n_epochs": 1, "learning_rate": 1e-3, "seed": 0, "device": "cpu"}


@pytest.mark.parametrize("cls", [GRPO, DrGRPO, GSPO, CISPO])
def test_role_advantages_in_the_buffer_equal_the_brute_force(cls):
    """The bundled LM plays Nim (both sides, against the random opponent): the advantages the algorithm writes into
    its buffer over two rollouts equal the brute force over the logged steps."""
    env = make_vec_env("Nim-v0", n_envs=4, seed=0, device="cpu", interaction=SelfPlay(Nim(), "random"))
    model = quiet(cls("CausalLMPolicy", env, advantage="role", **HP))
    log = StepLog()
    model.learn(2 * HP["n_steps"] * 4, callback=log)
    buffers = log.advantages
    assert len(buffers) == 2
    steps = log.steps
    assert {s[2][e]["learner_player"] for s in steps for e in range(4) if s[1][e]} == {0, 1}
    expected, baselines = brute_force_role_advantages(steps, 4)
    # steps of an episode still running when a rollout ends get 0 in that rollout
    for r, adv in enumerate(buffers):
        want = expected[r * 24 : (r + 1) * 24].copy()
        for env in range(4):
            dones = np.flatnonzero([s[1][env] for s in steps[r * 24 : (r + 1) * 24]])
            want[(dones[-1] + 1 if dones.size else 0) :, env] = 0.0
        np.testing.assert_allclose(adv, want, rtol=1e-5, atol=1e-7)
    assert np.any(buffers[1] != 0)
    tracker = model._group_tracker
    names = {v: k for k, v in tracker.game_ids.items()}
    assert {(names[g], r): b for (g, r), b in tracker.baselines.items()} == pytest.approx(baselines)
    assert log.logged[-1]["rollout/role_baseline_nim_0"] == pytest.approx(baselines[("nim", 0)])


def test_role_advantage_bad_input():
    env = make_vec_env("TextGen-v0", n_envs=2, seed=0, device="cpu", max_new_tokens=4)
    model = quiet(GRPO("CausalLMPolicy", env, advantage="role", **{**HP, "n_steps": 8, "batch_size": 16}))
    with pytest.raises(ValueError, match=r"advantage='role' needs the side the learner played"):
        model.learn(16)
    games = make_vec_env("Nim-v0", n_envs=2, seed=0, device="cpu")
    with pytest.raises(ValueError, match="DAPO.s overlong penalty and dynamic sampling act on each episode.s return"):
        DAPO("CausalLMPolicy", games, advantage="role", **HP)
    with pytest.raises(ValueError, match="advantage must be one of"):
        GRPO("CausalLMPolicy", games, advantage="roles", **HP)
    assert isinstance(make_group_tracker(games, "role"), RoleBaselineTracker)  # no group needed


def test_role_tracker_state_round_trip():
    tracker = RoleBaselineTracker(1)
    tracker.baselines, tracker.game_ids = {(0, 0): 0.25, (0, 1): -0.5, (1, 1): 1.0}, {"nim": 0, "kuhn": 1}
    again = RoleBaselineTracker(2)
    again.load_state_dict(tracker.state_dict())
    assert again.baselines == tracker.baselines and again.game_ids == tracker.game_ids


def test_saved_model_keeps_its_role_baselines(tmp_path):
    """A model trained with role advantages, saved and loaded, trains on from the baselines it had: the first
    update after loading starts from them (the brute force over its steps, started there, agrees)."""
    env = make_vec_env("Nim-v0", n_envs=4, seed=0, device="cpu", interaction=SelfPlay(Nim(), "random"))
    model = quiet(GRPO("CausalLMPolicy", env, advantage="role", **HP))
    model.learn(HP["n_steps"] * 4)
    names = {v: k for k, v in model._group_tracker.game_ids.items()}
    saved = {(names[g], r): b for (g, r), b in model._group_tracker.baselines.items()}
    assert set(saved) == {("nim", 0), ("nim", 1)} and all(b != 0 for b in saved.values())
    model.save(tmp_path / "model.zip")

    loaded = quiet(GRPO.load(tmp_path / "model.zip", env=env, device="cpu"))  # the envs start new episodes
    log = StepLog()
    loaded.learn(HP["n_steps"] * 4, callback=log, reset_num_timesteps=False)
    expected, _ = brute_force_role_advantages(log.steps, 4, baselines=saved)
    fresh, _ = brute_force_role_advantages(log.steps, 4)  # what starting again from 0 would give
    for e in range(4):  # steps of an episode still running at the rollout's end get 0
        dones = np.flatnonzero([s[1][e] for s in log.steps])
        expected[(dones[-1] + 1 if dones.size else 0) :, e] = fresh[(dones[-1] + 1 if dones.size else 0) :, e] = 0.0
    np.testing.assert_allclose(log.advantages[0], expected, rtol=1e-5, atol=1e-7)
    assert not np.allclose(fresh, expected)
