"""Dr. GRPO: its advantage and loss against brute-force computations, on both update paths, and as an SB3 algorithm."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch as th
from helpers import collect_rollout, params, per_transition_copy, quiet

from sb3_grpo import DrGRPO
from sb3_grpo.common.buffers import GRPODictRolloutBuffer, SequenceRolloutBuffer, segment_ids
from sb3_grpo.common.update.train_stats import TrainStats
from sb3_grpo.objectives import group_mean_advantages
from textrl_envs.sb3 import make_vec_env

N_ENVS, GROUP, N_STEPS, MAX_NEW = 4, 2, 16, 6
HP = {"n_steps": N_STEPS, "n_epochs": 1, "learning_rate": 1e-3, "seed": 5, "device": "cpu"}


def _env():
    return make_vec_env("TextGen-v0", n_envs=N_ENVS, group_size=GROUP, seed=0, device="cpu", max_new_tokens=MAX_NEW)


def test_group_mean_advantages_by_hand():
    returns = th.tensor([1.0, 3.0, 0.0, 0.0, 2.0, 7.0])
    groups = th.tensor([5, 5, 9, 9, 9, 4])  # group 4 has one member: not defined
    adv, valid = group_mean_advantages(returns, groups)
    assert adv.tolist() == pytest.approx([-1.0, 1.0, -2 / 3, -2 / 3, 4 / 3, 0.0])
    assert valid.tolist() == [True, True, True, True, True, False]


def test_segment_ids_by_hand():
    starts = np.array([[1, 0], [0, 0], [1, 1], [0, 0], [0, 1]], dtype=np.float32)
    # env 0: steps 0-1, 2-4; env 1: steps 0-1, 2-3, 4 (its first step opens a sequence whatever the flag says)
    assert segment_ids(starts).T.tolist() == [[0, 0, 1, 1, 1], [2, 2, 3, 3, 4]]


def _episodes(buffer):
    """The rollout's sequences by hand: runs of each env's steps between episode starts, as flat buffer indices
    (``env * n_steps + step``, SB3's order after ``get``)."""
    starts = buffer.episode_starts
    runs = []
    for env in range(N_ENVS):
        run = [0]
        for step in range(1, N_STEPS):
            if starts[step, env] > 0.5:
                runs.append([env * N_STEPS + t for t in run])
                run = []
            run.append(step)
        runs.append([env * N_STEPS + t for t in run])
    return runs


def test_loss_equals_a_brute_force_sum_over_sequences_and_tokens():
    """``-(1 / (S * L)) sum_t min(r A, clip(r) A) - ent_coef * mean H`` computed token by token, each token's
    log-prob from its own full-prefix forward, against the loss of one whole-rollout minibatch."""
    model = quiet(
        DrGRPO(
            "CausalLMPolicy",
            _env(),
            batch_size=N_STEPS * N_ENVS,
            ent_coef=0.01,
            rollout_buffer_class=GRPODictRolloutBuffer,
            **HP,
        )
    )
    assert model.max_completion_tokens == MAX_NEW  # from the env's budget
    buffer = collect_rollout(model, N_STEPS)
    assert (buffer.advantages != 0).any(), "some group must finish in the rollout"
    with th.no_grad():  # move the policy off pi_old, so the ratios are not all 1 and the clip matters
        for p in model.policy.parameters():
            p.add_(0.05 * th.randn_like(p))
    minibatch = next(iter(model.batch_source.minibatches(buffer, model.batch_size)))
    terms = model._minibatch_loss(minibatch, 0.2, None, TrainStats())

    obs = {key: th.as_tensor(value) for key, value in buffer.observations.items()}  # flattened by get()
    old_log_probs, advantages, actions = (np.ravel(a) for a in (buffer.log_probs, buffer.advantages, buffer.actions))
    total, entropies, n_tokens = 0.0, 0.0, 0
    runs = _episodes(buffer)
    with th.no_grad():
        for run in runs:
            for i in run:
                step_obs = {key: value[i : i + 1] for key, value in obs.items()}
                action = th.as_tensor(actions[i : i + 1]).long()
                _, log_prob, entropy = model.policy.evaluate_actions(step_obs, action)
                ratio = float(th.exp(log_prob - float(old_log_probs[i])))
                adv = float(advantages[i])
                total += min(ratio * adv, min(max(ratio, 0.8), 1.2) * adv)
                entropies += float(entropy)
                n_tokens += 1
    assert n_tokens == N_STEPS * N_ENVS
    expected = -total / (len(runs) * MAX_NEW) - 0.01 * entropies / n_tokens
    assert terms.value == pytest.approx(expected, rel=1e-4, abs=1e-6)


def test_one_update_is_the_same_on_both_paths():
    """The text fast path (whole sequences, one forward each) and the per-transition path know the same sequences:
    from the same rollout, one whole-rollout minibatch per epoch, the parameters after the update are the same."""
    hp = {**HP, "batch_size": N_STEPS * N_ENVS, "n_epochs": 2, "carry_over": False}  # carry_over: the fast path's
    fast = quiet(DrGRPO("CausalLMPolicy", _env(), **hp))
    slow = quiet(DrGRPO("CausalLMPolicy", _env(), rollout_buffer_class=GRPODictRolloutBuffer, **hp))
    assert isinstance(fast.rollout_buffer, SequenceRolloutBuffer)
    slow.policy.load_state_dict(fast.policy.state_dict())
    buf = collect_rollout(fast, N_STEPS)
    assert (buf.advantages != 0).any(), "some group must finish in the rollout"
    slow.rollout_buffer = per_transition_copy(slow, buf)
    before = params(fast)
    fast.train()
    slow.train()
    after_fast, after_slow = params(fast), params(slow)
    assert any(not th.equal(before[k], after_fast[k]) for k in before), "the update must move the weights"
    for k in after_fast:
        th.testing.assert_close(after_fast[k], after_slow[k], atol=2e-6, rtol=1e-5)
    for key in ["train/policy_gradient_loss", "train/entropy_loss", "train/loss"]:
        assert fast.logger.name_to_value[key] == pytest.approx(slow.logger.name_to_value[key], rel=1e-4, abs=1e-7)


def test_learns_saves_and_loads(tmp_path):
    model = quiet(DrGRPO("CausalLMPolicy", _env(), batch_size=32, **HP))
    model.learn(2 * N_STEPS * N_ENVS)
    logged = model.logger.name_to_value
    assert np.isfinite(logged["train/policy_gradient_loss"]) and "train/value_loss" not in logged
    obs = model.env.reset()
    before = model.predict(obs, deterministic=True)[0]
    model.save(tmp_path / "dr")
    loaded = DrGRPO.load(tmp_path / "dr", env=_env(), device="cpu")
    assert loaded.max_completion_tokens == MAX_NEW and loaded.advantage == "group_mean"
    np.testing.assert_array_equal(loaded.predict(obs, deterministic=True)[0], before)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"advantage": "gae"}, ValueError, r"DrGRPO trains no critic.*got 'gae'; use GRPO\(advantage='gae'\)"),
        ({"max_completion_tokens": 0}, ValueError, "max_completion_tokens"),
        ({"learning_rate": float("nan")}, ValueError, "learning_rate"),
    ],
)
def test_bad_arguments_are_refused_by_name(kwargs, error, match):
    with pytest.raises(error, match=match):
        DrGRPO("CausalLMPolicy", _env(), **{**HP, **kwargs})
