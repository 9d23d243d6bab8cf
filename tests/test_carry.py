"""GRPO's ``carry_over``: every step of an episode whose group completes is trained on exactly once, with the
episode's group advantage, however many rollouts the episode and its group straddle (checked against a brute-force
replay of the rollouts); and what is never carried."""

import numpy as np
import pytest
import torch as th
from helpers import RolloutLog, quiet
from stable_baselines3.common.callbacks import BaseCallback

from sb3_grpo import GRPO
from sb3_grpo.common.advantages.group_trackers import EpisodeGroupTracker, _ignore_greedy
from sb3_grpo.common.buffers import GRPODictRolloutBuffer, SequenceRolloutBuffer
from sb3_grpo.common.options.checks import check_carry_over, resolve_carry_over
from sb3_grpo.objectives import group_advantages, rloo_advantages
from textrl_envs.sb3 import make_vec_env

N_ENVS, GROUP, BUDGET, N_STEPS, ROLLOUTS = 8, 4, 10, 6, 6


def char_reward(prompts, completions, **kwargs):  # noqa: ARG001  (a reward's signature)
    """A cheap deterministic reward that spreads the returns of a group (characters mod 7)."""
    return [float(len(c) % 7) for c in completions]


class StepLog(BaseCallback):
    """Every step of every rollout: behaviour log-probs, dones, group ids and the finished episodes' rewards."""

    def __init__(self):
        super().__init__()
        self.steps = []
        self.completions = []  # of the episodes that ended, in step order then env order

    def _on_step(self):
        loc = self.locals
        infos = loc["infos"]
        rewards = [char_reward([], [info["completion"]])[0] if done else 0.0 for done, info in zip(loc["dones"], infos)]
        self.completions.extend(info["completion"] for done, info in zip(loc["dones"], infos) if done)
        self.steps.append((loc["log_probs"].detach().clone(), loc["dones"].copy(), [i["group_id"] for i in infos],
                           rewards))  # fmt: skip
        return True


def _trained(model):
    """Record ``(old_log_prob, advantage)`` of every transition every update trains on."""
    seen = []
    minibatches = model.batch_source.minibatches

    def recording(buffer, batch_size):
        for mb in minibatches(buffer, batch_size):
            seen.extend(zip(mb.old_log_prob.tolist(), mb.advantages.tolist(), strict=True))
            yield mb

    model.batch_source.minibatches = recording
    return seen


def _expected(steps, advantage_fn=group_advantages):
    """Brute force over the whole run: the episodes (steps of each env between dones), their returns and groups; the
    ``(log_prob, advantage)`` of every step of every episode whose group completed, and the steps of the others."""
    episodes, running = [], {e: [] for e in range(N_ENVS)}
    for log_probs, dones, gids, rewards in steps:
        for e in range(N_ENVS):
            running[e].append(float(log_probs[e]))
            if dones[e]:
                episodes.append((gids[e], rewards[e], running[e]))
                running[e] = []
    by_group = {}
    for gid, ret, lps in episodes:
        by_group.setdefault(gid, []).append((ret, lps))
    complete = {gid: members for gid, members in by_group.items() if len(members) >= GROUP}
    pairs = []
    for gid, members in complete.items():
        adv, _ = advantage_fn(th.tensor([m[0] for m in members], dtype=th.float64), th.full((len(members),), gid))
        pairs.extend((lp, float(a)) for a, (_, lps) in zip(adv, members, strict=True) for lp in lps)
    waiting = sum(len(lps) for gid, members in by_group.items() if gid not in complete for _, lps in members)
    waiting += sum(len(lps) for lps in running.values())
    return pairs, waiting


def _model(carry_over, advantage="group", **kwargs):
    env = make_vec_env("TextGen-v0", n_envs=N_ENVS, group_size=GROUP, seed=0, max_new_tokens=BUDGET,
                       reward=char_reward)  # fmt: skip
    return quiet(GRPO("CausalLMPolicy", env, n_steps=N_STEPS, batch_size=N_STEPS * N_ENVS // 2, n_epochs=1,
                      advantage=advantage, carry_over=carry_over, seed=0, **kwargs))  # fmt: skip


@pytest.mark.parametrize(("advantage", "advantage_fn"), [("group", group_advantages), ("rloo", rloo_advantages)])
def test_every_step_of_a_completed_group_is_trained_once_with_its_advantage(advantage, advantage_fn):
    model = _model(True, advantage)
    trained, log = _trained(model), StepLog()
    model.learn(N_STEPS * N_ENVS * ROLLOUTS, callback=log)
    pairs, waiting = _expected(log.steps, advantage_fn)
    # the episodes straddle rollouts (budget 10 > n_steps 6), and some groups are still open at the end
    assert len(pairs) > N_STEPS * N_ENVS and waiting > 0
    assert model._carry.held_steps() == waiting  # the rest waits for its groups
    got = np.array(sorted(trained))
    want = np.array(sorted(pairs))
    assert got.shape == want.shape  # each step once: none twice, none with advantage 0 meanwhile
    np.testing.assert_array_equal(got[:, 0], want[:, 0])
    np.testing.assert_allclose(got[:, 1], want[:, 1], rtol=1e-5, atol=1e-6)


def test_without_carry_over_straddling_steps_train_in_their_own_rollout_with_advantage_zero():
    model = _model(False)
    trained, log = _trained(model), StepLog()
    model.learn(N_STEPS * N_ENVS * ROLLOUTS, callback=log)
    assert len(trained) == N_STEPS * N_ENVS * ROLLOUTS  # every step, in its own rollout's update
    pairs, _ = _expected(log.steps)
    zero = sum(1 for _, a in trained if a == 0.0)
    assert zero > len(trained) - len(pairs)  # straddling steps of completed groups got 0 too (what carry_over fixes)


def test_carry_over_logs_and_an_update_without_minibatches(recwarn):
    model = _model(True)
    log = RolloutLog()
    model.learn(N_STEPS * N_ENVS * 3, callback=log)
    first, later = log.values[0], log.values[1:]
    # the first rollout's episodes all straddle its end (budget 10 > n_steps 6): its update has nothing to train on
    assert first["rollout/carried_steps"] == 0.0
    assert first["rollout/deferred_steps"] == N_STEPS * N_ENVS
    assert any(v["rollout/carried_steps"] > 0 for v in later)
    assert not [w for w in recwarn if "Mean of empty slice" in str(w.message) or "shorter than" in str(w.message)]


def test_tracker_keys_follow_episodes_across_rollouts():
    tracker = EpisodeGroupTracker(2, 2, _ignore_greedy(group_advantages))
    info = [{"group_id": 0}, {"group_id": 0}]
    # rollout 1: env 0 ends its episode at step 1, env 1 is still running
    tracker.reset_rollout(2)
    tracker.add(np.zeros(2), np.array([False, False]), info)
    tracker.add(np.array([1.0, 0.0]), np.array([True, False]), info)
    tracker.compute()
    assert tracker.resolved == {}
    assert tracker.segments == [(0, 0, 2, 0), (1, 0, 2, 1)]
    assert tracker.live_keys() == {0, 1, 2}  # env 0's finished member (key 0) waits; env 1's episode runs (key 1)
    # rollout 2: env 1's episode (key 1) ends at step 0
    tracker.reset_rollout(2)
    tracker.add(np.array([0.0, 3.0]), np.array([False, True]), [{"group_id": 1}, {"group_id": 0}])
    tracker.add(np.zeros(2), np.array([False, False]), [{"group_id": 1}, {"group_id": 1}])
    tracker.compute()
    adv, _ = group_advantages(th.tensor([1.0, 3.0], dtype=th.float64), th.zeros(2))
    assert tracker.resolved == pytest.approx({0: float(adv[0]), 1: float(adv[1])})
    assert tracker.segments == [(0, 0, 2, 2), (1, 0, 1, 1), (1, 1, 2, 3)]
    assert tracker.live_keys() == {2, 3}


def test_a_dropped_pending_group_drops_its_keys():
    tracker = EpisodeGroupTracker(2, 2, _ignore_greedy(group_advantages), max_pending_groups=0)
    tracker.reset_rollout(1)
    tracker.add(np.ones(2), np.array([True, False]), [{"group_id": 0}, {"group_id": 0}])
    tracker.compute()
    assert 0 not in tracker.live_keys()  # its group was forgotten: its advantage never comes


def test_carry_over_is_refused_where_it_cannot_work():
    with pytest.raises(ValueError, match="carry_over=True .* needs a group advantage"):
        GRPO("CausalLMPolicy", make_vec_env("TextGen-v0", n_envs=2, seed=0), carry_over=True)
    with pytest.raises(TypeError, match="carry_over"):
        GRPO("CausalLMPolicy", make_vec_env("TextGen-v0", n_envs=2, seed=0), advantage="group", carry_over="yes")
    with pytest.raises(ValueError, match="GRPODictRolloutBuffer"):
        check_carry_over(GRPODictRolloutBuffer, True)
    check_carry_over(SequenceRolloutBuffer, True)
    check_carry_over(GRPODictRolloutBuffer, False)


def test_carry_over_is_saved_and_its_store_is_not(tmp_path):
    model = _model(True)
    model.learn(N_STEPS * N_ENVS * 2)
    assert model._carry.held_steps() > 0
    model.save(tmp_path / "m")
    loaded = GRPO.load(tmp_path / "m", env=model.get_env())
    assert loaded.carry_over is True
    assert loaded._carry is not None and loaded._carry.held_steps() == 0


def nan_reward(prompts, completions, **kwargs):  # noqa: ARG001  (a reward's signature)
    """:func:`char_reward`, but NaN for some completions."""
    return [float("nan") if len(c) % 7 == 3 else float(len(c) % 7) for c in completions]


def test_an_episode_dropped_for_a_non_finite_reward_is_not_carried():
    env = make_vec_env("TextGen-v0", n_envs=N_ENVS, group_size=GROUP, seed=0, max_new_tokens=BUDGET,
                       reward=nan_reward, nonfinite_reward="skip")  # fmt: skip
    model = quiet(GRPO("CausalLMPolicy", env, n_steps=N_STEPS, batch_size=N_STEPS * N_ENVS // 2, n_epochs=1,
                       advantage="group", carry_over=True, nonfinite="skip", seed=0))  # fmt: skip
    trained, log = _trained(model), StepLog()
    model.learn(N_STEPS * N_ENVS * ROLLOUTS, callback=log)
    dropped, kept, running = set(), set(), {e: [] for e in range(N_ENVS)}
    for log_probs, dones, _, _ in log.steps:
        for e in range(N_ENVS):
            running[e].append(float(log_probs[e]))
            if dones[e]:
                (dropped if len(log.completions.pop(0)) % 7 == 3 else kept).update(running[e])
                running[e] = []
    dropped -= kept  # log-probs identify steps, except the few equal ones (e.g. two members' same first token)
    assert len(dropped) > N_STEPS
    assert all(np.isfinite(a) for _, a in trained)
    assert all(a == 0.0 for lp, a in trained if lp in dropped)  # never with an advantage, in no update
    assert {lp for lp, _ in trained} & dropped  # (its last rollout's steps still train, with 0, as without carry)


def test_trl_loop_counts_the_steps_trained_with_an_advantage():
    """``textrl-bench trl``'s figure: with the learning rate at 0 both runs sample the same completions, and
    ``carry_over`` trains more of the sampled steps with an advantage."""
    from benchmarks.perf import trl

    cfg = trl.LoopConfig(n_envs=8, group_size=4, tokens=10, completions=48, lr=0.0, beta=0.0, model="tiny")
    short = {"n_steps": 6, "batch_size": 48}  # rollouts shorter than the episodes: every episode straddles one
    plain, carried = trl.run_ours(cfg, 0, carry_over=False, **short), trl.run_ours(cfg, 0, carry_over=True, **short)
    rewards = [[r for _, _, r in run["curve"]] for run in (plain, carried)]
    np.testing.assert_array_equal(*rewards)  # the same samples
    assert len(plain["advantaged"]) == plain["updates"] and all(0 <= a <= 1 for a in plain["advantaged"])
    assert sum(carried["advantaged"]) > sum(plain["advantaged"])


def test_self_critical_greedy_members_are_never_trained_with_an_advantage():
    model = _model(True, "self_critical")
    trained, log = _trained(model), StepLog()
    model.learn(N_STEPS * N_ENVS * ROLLOUTS, callback=log)
    greedy = {float(lp[e]) for lp, *_ in log.steps for e in range(0, N_ENVS, GROUP)}
    sampled = {float(lp[e]) for lp, *_ in log.steps for e in range(N_ENVS) if e % GROUP}
    greedy -= sampled  # log-probs identify steps, except the few equal ones
    assert greedy and any(a != 0.0 for _, a in trained)
    assert all(a == 0.0 for lp, a in trained if lp in greedy)


@pytest.mark.parametrize(
    ("carry_over", "advantage", "buffer", "cap", "on"),
    [
        ("auto", "group", "sequence", None, True),
        ("auto", "rloo", "sequence", None, True),
        ("auto", "role", "sequence", None, True),
        ("auto", "gae", "sequence", None, False),  # GAE knows every step's advantage
        ("auto", "group_turn", "sequence", None, False),  # a held sequence gets one advantage
        ("auto", "group", "dict", None, False),  # only the text fast path holds sequences
        ("auto", "group", "sequence", 2.0, False),  # vLLM's cap weights each rollout's own steps
        (True, "group", "sequence", None, True),
        (False, "group", "sequence", None, False),
    ],
)
def test_carry_over_auto_resolves_where_it_applies(carry_over, advantage, buffer, cap, on):
    cls = SequenceRolloutBuffer if buffer == "sequence" else GRPODictRolloutBuffer
    assert resolve_carry_over(carry_over, advantage, cls, cap) is on


def test_carry_over_is_on_by_default_for_group_advantages_on_text():
    env = make_vec_env("TextGen-v0", n_envs=2, group_size=2, seed=0, device="cpu", max_new_tokens=4)
    assert quiet(GRPO("CausalLMPolicy", env, advantage="group", n_steps=4, batch_size=8)).carry_over_on
    assert not quiet(GRPO("CausalLMPolicy", env, n_steps=4, batch_size=8)).carry_over_on  # GAE
