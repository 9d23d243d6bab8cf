"""Turn-level group credit (``advantage="group_turn"``): the estimator against a brute-force loop on hand-made
episodes (members with different numbers of turns, episodes that end early, turns no other member reached), the
tracker on a hand-made step stream that straddles rollouts, and the advantages GRPO writes into the buffer it fills
on GuessNumber-v0, recomputed by brute force from the rollout's own steps."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch as th
from helpers import quiet
from stable_baselines3.common.callbacks import BaseCallback

from sb3_grpo import CISPO, DAPO, GRPO, GSPO, DrGRPO
from sb3_grpo.common.advantages.group_trackers import TurnGroupTracker
from sb3_grpo.objectives import rloo_advantages, turn_returns_to_go, turn_rloo_advantages
from textrl_envs.sb3 import make_vec_env


def brute_force_turn_credit(episodes, group_of):
    """``{(episode, turn): advantage or None}`` by the definition, one loop per term.

    :param episodes: ``{episode: [reward of turn 0, reward of turn 1, ...]}``
    :param group_of: ``{episode: group id}``
    """
    out = {}
    for i, rewards in episodes.items():
        for k in range(len(rewards)):
            g_ik = sum(rewards[k:])
            others = [sum(r[k:]) for j, r in episodes.items() if j != i and group_of[j] == group_of[i] and len(r) > k]
            out[(i, k)] = g_ik - sum(others) / len(others) if others else None
    return out


HAND_MADE = {  # episode -> rewards per turn; groups A (3 members), B (4), C (a group of one)
    0: [0.0, 0.0, 1.0],  # solves on its third turn
    1: [0.7],  # solves at once
    2: [0.0, 0.5, -0.25, 2.0],  # the longest: its last turn is reached by nobody else in the group
    3: [1.0, 0.0],
    4: [0.25],
    5: [0.0, 0.0],
    6: [3.0, -1.0, 0.5],
    7: [0.4, 0.6],
}
GROUP_OF = {0: "A", 1: "A", 2: "A", 3: "B", 4: "B", 5: "B", 6: "B", 7: "C"}


def _dense(episodes, group_of):
    order = sorted(episodes)
    n_turns = max(len(r) for r in episodes.values())
    rewards = th.zeros(len(order), n_turns, dtype=th.float64)
    mask = th.zeros(len(order), n_turns, dtype=th.bool)
    for row, e in enumerate(order):
        rewards[row, : len(episodes[e])] = th.tensor(episodes[e], dtype=th.float64)
        mask[row, : len(episodes[e])] = True
    names = {g: n for n, g in enumerate(sorted(set(group_of.values())))}
    return order, rewards, mask, th.tensor([names[group_of[e]] for e in order])


def test_turn_rloo_advantages_equal_the_definition_on_hand_made_episodes():
    order, rewards, mask, gids = _dense(HAND_MADE, GROUP_OF)
    adv, valid = turn_rloo_advantages(rewards, mask, gids)
    want = brute_force_turn_credit(HAND_MADE, GROUP_OF)
    for row, e in enumerate(order):
        for k in range(mask.shape[1]):
            expected = want.get((e, k))
            assert bool(valid[row, k]) == (expected is not None), (e, k)
            assert float(adv[row, k]) == pytest.approx(0.0 if expected is None else expected, abs=1e-6), (e, k)
    # spot checks by hand: episode 0, turn 1: G = 1.0; episode 2 reached turn 1 too with G = 0.5 - 0.25 + 2 = 2.25
    assert float(adv[0, 1]) == pytest.approx(1.0 - 2.25)
    assert not bool(valid[2, 3])  # episode 2's turn 3: no other member of group A reached it
    assert bool(valid[0, 2]) and bool(valid[2, 2])  # turn 2: episodes 0 and 2 are each other's baseline
    assert float(adv[0, 2]) == pytest.approx(1.0 - 1.75)


def test_turn_zero_is_rloo_and_one_turn_episodes_are_exactly_rloo():
    order, rewards, mask, gids = _dense(HAND_MADE, GROUP_OF)
    adv, valid = turn_rloo_advantages(rewards, mask, gids)
    episode_returns = th.tensor([sum(HAND_MADE[e]) for e in order], dtype=th.float64)
    rloo, rloo_valid = rloo_advantages(episode_returns, gids)
    th.testing.assert_close(adv[:, 0], rloo)
    assert th.equal(valid[:, 0], rloo_valid)


def test_returns_to_go_and_bad_input():
    rewards = th.tensor([[1.0, 2.0, 4.0], [8.0, 16.0, 99.0]])
    mask = th.tensor([[True, True, True], [True, True, False]])
    th.testing.assert_close(turn_returns_to_go(rewards, mask), th.tensor([[7.0, 6, 4], [24, 16, 0]], dtype=th.float64))
    with pytest.raises(ValueError, match="prefix"):
        turn_rloo_advantages(rewards, th.tensor([[True, False, True], [True, True, False]]), th.tensor([0, 0]))
    with pytest.raises(ValueError, match="shapes"):
        turn_rloo_advantages(rewards, mask, th.tensor([0, 0, 0]))


def test_tracker_on_a_hand_made_stream_that_straddles_two_rollouts():
    """Two envs, groups of 2; env 0 plays episode a (turns 0,0,1,1 then done) and episode c; env 1 plays b over the
    rollout boundary. Rewards land on turn ends. Advantages per step, by the definition."""
    tracker = TurnGroupTracker(n_envs=2, group_size=2)
    # rollout 1: 5 steps. env 0: a = steps 0-3 (turn 0: steps 0,1 reward 0.0; turn 1: steps 2,3 reward 1.0 at end),
    # then c starts at step 4 (group 8). env 1: b (group 7 with a) runs steps 0-4, turns 0,0,0,1,1.
    tracker.reset_rollout(5)
    env0 = [(0.0, False, 7, 0), (0.0, False, 7, 0), (0.0, False, 7, 1), (1.0, True, 7, 1), (0.0, False, 8, 0)]
    env1 = [(0.0, False, 7, 0), (0.0, False, 7, 0), (0.5, False, 7, 0), (0.0, False, 7, 1), (0.0, False, 7, 1)]
    for s0, s1 in zip(env0, env1, strict=True):
        infos = [{"group_id": s[2], "turn": s[3]} for s in (s0, s1)]
        tracker.add(np.array([s0[0], s1[0]]), np.array([s0[1], s1[1]]), infos)
    adv1, stats1 = tracker.compute()
    np.testing.assert_array_equal(adv1, 0.0)  # b still runs: group 7 is not complete
    assert stats1["n_groups"] == 0
    # rollout 2: env 1's b takes turn 2 (steps 0,1; reward 2.0 at its end); env 0's c goes on
    tracker.reset_rollout(2)
    infos = [{"group_id": 8, "turn": 0}, {"group_id": 7, "turn": 2}]
    tracker.add(np.array([0.0, 0.0]), np.array([False, False]), infos)
    tracker.add(np.array([0.0, 2.0]), np.array([False, True]), infos)
    adv2, stats2 = tracker.compute()
    a, b = [0.0, 1.0], [0.5, 0.0, 2.0]  # rewards per turn
    want = brute_force_turn_credit({"a": a, "b": b}, {"a": 7, "b": 7})
    assert want[("b", 2)] is None  # nobody else reached turn 2
    np.testing.assert_allclose(adv2[:, 1], [0.0, 0.0])  # b's turn-2 steps
    np.testing.assert_array_equal(adv2[:, 0], 0.0)  # c's group is open; a's steps were in rollout 1 (baseline only)
    assert stats2["n_groups"] == 1 and stats2["group_reward_mean"] == pytest.approx((1.0 + 2.5) / 2)
    # the same two episodes within one rollout: every step gets its turn's advantage
    tracker = TurnGroupTracker(n_envs=2, group_size=2)
    tracker.reset_rollout(7)
    streams = [env0[:4] + [(0.0, False, 8, 0)] * 3, env1 + [(0.0, False, 7, 2), (2.0, True, 7, 2)]]
    for t in range(7):
        infos = [{"group_id": streams[e][t][2], "turn": streams[e][t][3]} for e in range(2)]
        tracker.add(np.array([streams[e][t][0] for e in range(2)]), np.array([streams[e][t][1] for e in range(2)]),
                    infos)  # fmt: skip
    adv, _ = tracker.compute()
    expect_a = [want[("a", k)] for k in (0, 0, 1, 1)]
    expect_b = [want[("b", k)] or 0.0 for k in (0, 0, 0, 1, 1, 2, 2)]
    np.testing.assert_allclose(adv[:4, 0], expect_a, rtol=1e-6)
    np.testing.assert_array_equal(adv[4:, 0], 0.0)
    np.testing.assert_allclose(adv[:, 1], expect_b, rtol=1e-6)


def test_tracker_refuses_steps_without_a_turn():
    tracker = TurnGroupTracker(n_envs=1, group_size=2)
    tracker.reset_rollout(1)
    with pytest.raises(ValueError, match="info\\['turn'\\]"):
        tracker.add(np.array([0.0]), np.array([False]), [{"group_id": 0}])


N_ENVS, GROUP, N_STEPS = 8, 4, 24


def length_reward(prompts, completions, **kwargs):  # noqa: ARG001  (a reward's signature)
    """An end-of-episode score on top of GuessNumber's turn rewards, so that returns differ within a group."""
    return [0.1 * (len(c) % 5) for c in completions]


class TurnLog(BaseCallback):
    """Each rollout's steps (turn, group id, done per env) and, at its end, the buffer's rewards and advantages."""

    def __init__(self):
        super().__init__()
        self.rollouts, self._steps = [], []

    def _on_rollout_start(self):
        self._steps = []

    def _on_step(self):
        infos = self.locals["infos"]
        self._steps.append(([i["turn"] for i in infos], [i["group_id"] for i in infos], self.locals["dones"].copy()))
        return True

    def _on_rollout_end(self):
        buf = self.model.rollout_buffer
        self.rollouts.append((self._steps, buf.rewards.copy(), buf.advantages.copy()))


def brute_force_rollouts(rollouts):
    """Each rollout's expected advantages from the whole run's steps: a step gets its turn's advantage when its
    episode ends in the step's rollout and the episode's whole group has ended by then; otherwise 0."""
    episodes, group_of, end_rollout = {}, {}, {}  # (env, n) -> per-turn rewards; its group; rollout it ended in
    step_of = []  # per rollout: (n_steps, n_envs) episode keys and turns
    count = [0] * N_ENVS
    for r, (steps, rewards, _) in enumerate(rollouts):
        keys = np.empty((len(steps), N_ENVS), dtype=object)
        turns = np.zeros((len(steps), N_ENVS), dtype=np.int64)
        for t, (turn_row, gid_row, dones) in enumerate(steps):
            for e in range(N_ENVS):
                key = (e, count[e])
                turn = turn_row[e]
                per_turn = episodes.setdefault(key, [])
                per_turn.extend([0.0] * (turn + 1 - len(per_turn)))
                per_turn[turn] += float(rewards[t, e])
                group_of[key] = gid_row[e]
                keys[t, e], turns[t, e] = key, turn
                if dones[e]:
                    end_rollout[key] = r
                    count[e] += 1
        step_of.append((keys, turns))
    expected = []
    for r, (keys, turns) in enumerate(step_of):
        ended = {k: v for k, v in episodes.items() if end_rollout.get(k, 1 << 30) <= r}
        sizes = {}
        for k in ended:
            sizes[group_of[k]] = sizes.get(group_of[k], 0) + 1
        credit = brute_force_turn_credit(ended, group_of)
        out = np.zeros(keys.shape, dtype=np.float64)
        for t in range(keys.shape[0]):
            for e in range(N_ENVS):
                key = keys[t, e]
                if end_rollout.get(key) == r and sizes[group_of[key]] >= GROUP:
                    out[t, e] = credit[(key, turns[t, e])] or 0.0
        expected.append(out)
    return expected


@pytest.mark.parametrize("cls", [GRPO, DrGRPO, GSPO, CISPO])
def test_each_algorithm_fills_its_buffer_with_the_brute_force_turn_credit(cls):
    env = make_vec_env("GuessNumber-v0", n_envs=N_ENVS, group_size=GROUP, seed=0, reward=length_reward)
    model = quiet(cls("CausalLMPolicy", env, advantage="group_turn", n_steps=N_STEPS, batch_size=N_STEPS * N_ENVS,
                      n_epochs=1, seed=0))  # fmt: skip
    log = TurnLog()
    model.learn(N_STEPS * N_ENVS * 3, callback=log)
    expected = brute_force_rollouts(log.rollouts)
    multi_turn = nonzero = 0
    for (steps, _, got), want in zip(log.rollouts, expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        multi_turn += sum(int(max(turns) > 0) for turns, _, _ in steps)
        nonzero += int((want != 0).sum())
    assert multi_turn > 0 and nonzero > 0  # the check covered later turns and real advantages


def test_group_turn_is_refused_where_it_cannot_work():
    with pytest.raises(ValueError, match="overlong penalty and dynamic sampling act on each episode's return"):
        DAPO("CausalLMPolicy", make_vec_env("GuessNumber-v0", n_envs=4, group_size=2), advantage="group_turn",
             n_steps=8, batch_size=8)  # fmt: skip
    with pytest.raises(ValueError, match="interaction"):
        GRPO("CausalLMPolicy", make_vec_env("TextGen-v0", n_envs=4, group_size=2, max_new_tokens=4),
             advantage="group_turn", n_steps=8, batch_size=8)  # fmt: skip
    with pytest.raises(ValueError, match="carry_over"):
        GRPO("CausalLMPolicy", make_vec_env("GuessNumber-v0", n_envs=4, group_size=2), advantage="group_turn",
             carry_over=True, n_steps=8, batch_size=8)  # fmt: skip
