"""DAPO: its clip, loss, overlong penalty and group filter against brute-force computations, dynamic sampling, and the
algorithm as an SB3 model."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch as th
from helpers import collect_rollout, quiet

from sb3_grpo import DAPO
from sb3_grpo.common.buffers import GRPODictRolloutBuffer
from sb3_grpo.common.update.train_stats import TrainStats
from sb3_grpo.dapo.shaping import ShapedGroupTracker
from sb3_grpo.objectives import (
    adaptive_clip_range,
    clipped_surrogate,
    decoupled_clipped_surrogate,
    group_mean_advantages,
    informative_groups,
    overlong_penalty,
)
from textrl_envs.sb3 import make_vec_env

N_ENVS, GROUP, N_STEPS, MAX_NEW = 4, 2, 16, 6
HP = {"n_steps": N_STEPS, "n_epochs": 1, "learning_rate": 1e-3, "seed": 5, "device": "cpu"}


def _env():
    return make_vec_env("TextGen-v0", n_envs=N_ENVS, group_size=GROUP, seed=0, device="cpu", max_new_tokens=MAX_NEW)


def test_decoupled_clip_by_hand():
    ratio = th.tensor([0.5, 0.9, 1.1, 1.25, 1.3, 0.7, 1.5, 0.75])
    adv = th.tensor([1.0, 1.0, 1.0, 1.0, 1.0, -2.0, -2.0, -1.0])
    low, high = 0.2, 0.28
    expected = []
    for r, a in zip(ratio.tolist(), adv.tolist(), strict=True):
        clipped = min(max(r, 1 - low), 1 + high)
        expected.append(min(r * a, clipped * a))
    got = decoupled_clipped_surrogate(ratio, adv, low, high)
    assert got.tolist() == pytest.approx(expected)
    # the upper bound is 1.28, not 1.2: a positive-advantage token at 1.25 keeps its ratio; at 1.3 it is capped
    assert got[3].item() == pytest.approx(1.25) and got[4].item() == pytest.approx(1.28)


def test_decoupled_clip_equals_grpos_adaptive_clip_with_matching_scales():
    """``[1 - eps_low, 1 + eps_high]`` on every token gives the loss that GRPO's sign-of-advantage scales give with
    ``eps * s_pos = eps_high`` and ``eps * s_neg = eps_low``: only the upper bound binds for A > 0,
    the lower for A < 0."""
    gen = th.Generator().manual_seed(0)
    ratio = th.exp(0.4 * th.randn(200, generator=gen))
    adv = th.randn(200, generator=gen)
    eps = adaptive_clip_range(adv, 0.2, (1.4, 1.0))
    th.testing.assert_close(decoupled_clipped_surrogate(ratio, adv, 0.2, 0.28), clipped_surrogate(ratio, adv, eps))


@pytest.mark.parametrize("buffer_tokens", [0, 1, 4])
def test_overlong_penalty_is_the_papers_piecewise_rule(buffer_tokens):
    max_tokens, factor = 10, 0.5
    lengths = np.arange(0, 13)
    expected = []
    for n in lengths.tolist():
        if n <= max_tokens - buffer_tokens:
            expected.append(0.0)
        elif n <= max_tokens:
            expected.append(((max_tokens - buffer_tokens) - n) / buffer_tokens * factor)
        else:
            expected.append(-factor)
    assert overlong_penalty(lengths, max_tokens, buffer_tokens, factor).tolist() == pytest.approx(expected)


def test_informative_groups_by_hand():
    returns = th.tensor([1.0, 1.0, 0.0, 2.0, 3.0, 3.0, 3.0, 5.0])
    groups = th.tensor([7, 7, 2, 2, 9, 9, 9, 4])
    expected = []
    for g in groups.tolist():
        members = [r for r, h in zip(returns.tolist(), groups.tolist(), strict=True) if h == g]
        expected.append(max(members) > min(members))
    assert informative_groups(returns, groups).tolist() == expected == [False, False, True, True] + [False] * 4


def _step(tracker, rewards, dones, groups):
    tracker.add(np.array(rewards, dtype=np.float64), np.array(dones), [{"group_id": g} for g in groups])


def test_tracker_adds_the_overlong_penalty_and_drops_groups_without_signal():
    """Two envs, group size 2, budget 4 with a buffer of 2: env 0 finishes after 2 steps (no penalty), env 1 after 4
    (penalty -1 * factor); one group pays 1 to both (no signal), the next pays 1 and 0."""
    base = ShapedGroupTracker(2, 2, lambda r, g, _: group_mean_advantages(r, g))
    tracker = ShapedGroupTracker.like(base, overlong=(4, 2, 0.5), drop_uninformative=True)
    tracker.reset_rollout(8)
    # group 0: env 0 ends at step 1 with reward 1; env 1 ends at step 3 with reward 1.5 (penalty -0.5 -> 1.0)
    _step(tracker, [0, 0], [False, False], [0, 0])
    _step(tracker, [1, 0], [True, False], [0, 0])
    _step(tracker, [0, 0], [False, False], [1, 0])
    _step(tracker, [0, 1.5], [False, True], [1, 0])
    # group 1: env 0 (started at step 2) ends at step 4 with reward 1 (3 steps: penalty -0.25); env 1 at step 5, 0
    _step(tracker, [1, 0], [True, False], [1, 1])
    _step(tracker, [0, 0], [False, True], [2, 1])
    _step(tracker, [0, 0], [False, False], [2, 2])
    _step(tracker, [0, 0], [False, False], [2, 2])
    advantages, stats = tracker.compute()
    assert tracker.penalties == pytest.approx([0.0, -0.5, -0.25, 0.0])
    assert tracker.n_informative == 1 and tracker.n_uninformative == 1
    # group 0 (returns 1, 1): dropped, advantage 0 and not valid; group 1 (returns 0.75, 0): +-0.375
    assert advantages[:2, 0].tolist() == [0.0, 0.0] and advantages[:4, 1].tolist() == [0.0] * 4
    assert advantages[2:5, 0].tolist() == pytest.approx([0.375] * 3)
    assert advantages[4:6, 1].tolist() == pytest.approx([-0.375] * 2)
    assert sorted(tracker.dropped_segments()) == [(0, 0), (1, 0)]
    assert sorted(map(tuple, tracker.kept_segments().tolist())) == [(0, 2, 5), (1, 4, 6)]
    assert stats["n_groups"] == 2


def test_loss_equals_a_brute_force_token_mean():
    """``-(1 / T) sum_t min(r A, clip(r, 1 - eps_low, 1 + eps_high) A) - ent_coef * mean H`` computed token by token,
    each token's log-prob from its own forward, against the loss of one whole-rollout minibatch."""
    model = quiet(
        DAPO(
            "CausalLMPolicy",
            _env(),
            batch_size=N_STEPS * N_ENVS,
            ent_coef=0.01,
            clip_range_high=0.3,
            rollout_buffer_class=GRPODictRolloutBuffer,
            **HP,
        )
    )
    assert model.max_completion_tokens == MAX_NEW and model.overlong_buffer == 1  # a fifth of the budget
    buffer = collect_rollout(model, N_STEPS)
    assert (buffer.advantages != 0).any(), "some group must finish in the rollout"
    with th.no_grad():  # move the policy off pi_old, so the ratios are not all 1 and the clip matters
        for p in model.policy.parameters():
            p.add_(0.05 * th.randn_like(p))
    minibatch = next(iter(model.batch_source.minibatches(buffer, model.batch_size)))
    terms = model._minibatch_loss(minibatch, 0.2, None, TrainStats())

    obs = {key: th.as_tensor(value) for key, value in buffer.observations.items()}
    old_log_probs, advantages, actions = (np.ravel(a) for a in (buffer.log_probs, buffer.advantages, buffer.actions))
    total, entropies, n_tokens, clipped = 0.0, 0.0, 0, 0
    with th.no_grad():
        for i in range(N_STEPS * N_ENVS):
            step_obs = {key: value[i : i + 1] for key, value in obs.items()}
            _, log_prob, entropy = model.policy.evaluate_actions(step_obs, th.as_tensor(actions[i : i + 1]).long())
            ratio = float(th.exp(log_prob - float(old_log_probs[i])))
            adv = float(advantages[i])
            total += min(ratio * adv, min(max(ratio, 0.8), 1.3) * adv)
            clipped += not 0.8 <= ratio <= 1.3
            entropies += float(entropy)
            n_tokens += 1
    expected = -total / n_tokens - 0.01 * entropies / n_tokens
    assert terms.value == pytest.approx(expected, rel=1e-4, abs=1e-6)


def test_dynamic_sampling_holds_informative_groups_and_logs_its_cost():
    """An unreachable target: the rollout runs max_sampling_rollouts times, and the update trains on the last one's
    sequences plus the informative ones held from the earlier."""
    model = quiet(
        DAPO("CausalLMPolicy", _env(), batch_size=32, min_informative_groups=10_000, max_sampling_rollouts=3, **HP)
    )
    buffer = collect_rollout(model, N_STEPS)
    logged = dict(model.logger.name_to_value)
    assert logged["rollout/sampling_rollouts"] == 3
    assert logged["rollout/dynamic_sampling_extra_steps"] == 2 * N_STEPS * N_ENVS
    assert model.num_timesteps == 3 * N_STEPS * N_ENVS
    assert logged["rollout/informative_groups"] + logged["rollout/groups_dropped"] > 0
    held = buffer.carried_in
    assert held is not None and bool((held.advantages[held.action_mask] != 0).all())
    served = sum(int(m.actions.numel()) for m in model.batch_source.minibatches(buffer, 32))
    left_out = {(env, t0): t1 - t0 for env, t0, t1, _ in model._group_tracker.segments}
    own = N_STEPS * N_ENVS - sum(n for start, n in left_out.items() if start in buffer._deferred)
    assert served == own + int(held.action_mask.sum())
    model.train()
    assert np.isfinite(model.logger.name_to_value["train/policy_gradient_loss"])


def test_dynamic_sampling_stops_once_enough_groups_are_informative():
    model = quiet(
        DAPO("CausalLMPolicy", _env(), batch_size=32, min_informative_groups=1, max_sampling_rollouts=5, **HP)
    )
    collect_rollout(model, N_STEPS)
    logged = model.logger.name_to_value
    rollouts = logged["rollout/sampling_rollouts"]
    assert logged["rollout/informative_groups"] >= 1 and rollouts < 5
    assert logged["rollout/dynamic_sampling_extra_steps"] == (rollouts - 1) * N_STEPS * N_ENVS


def test_learns_saves_and_loads(tmp_path):
    model = quiet(DAPO("CausalLMPolicy", _env(), batch_size=32, **HP))
    model.learn(2 * N_STEPS * N_ENVS)
    logged = model.logger.name_to_value
    assert logged["train/clip_range_low"] == pytest.approx(0.2) and logged["train/clip_range_high"] == 0.28
    assert "train/value_loss" not in logged and logged["rollout/overlong_penalty_mean"] <= 0
    obs = model.env.reset()
    before = model.predict(obs, deterministic=True)[0]
    model.save(tmp_path / "dapo")
    loaded = DAPO.load(tmp_path / "dapo", env=_env(), device="cpu")
    assert loaded.clip_range_high == 0.28 and loaded.overlong_buffer == 1
    np.testing.assert_array_equal(loaded.predict(obs, deterministic=True)[0], before)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"advantage": "gae"}, r"DAPO trains no critic.*got 'gae'"),
        ({"clip_range_high": -0.1}, "clip_range_high"),
        ({"overlong_buffer": 7}, r"overlong_buffer=7 is longer than the completion budget"),
        ({"min_informative_groups": 0}, "min_informative_groups"),
        ({"min_informative_groups": 2, "rollout_buffer_class": GRPODictRolloutBuffer}, r"dynamic sampling.*fast path"),
    ],
)
def test_bad_arguments_are_refused_by_name(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DAPO("CausalLMPolicy", _env(), **{**HP, **kwargs})


def test_dapo_on_an_ungrouped_env_is_not_told_to_use_gae():
    from textrl_envs.sb3 import make_vec_env

    env = make_vec_env("TextGen-v0", n_envs=2, seed=0, device="cpu", max_new_tokens=3)
    with pytest.raises(ValueError, match="needs an env with group_size > 1") as err:
        DAPO("CausalLMPolicy", env, n_steps=4, batch_size=8, device="cpu")
    assert "GRPO(advantage='gae') or SB3's PPO (DAPO, DrGRPO, GSPO and CISPO train no critic" in str(err.value)
