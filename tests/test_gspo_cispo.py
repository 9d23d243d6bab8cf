"""GSPO and CISPO: their ratios, objectives and losses against brute-force computations, GSPO on both update paths,
and both as SB3 models."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import math

import numpy as np
import pytest
import torch as th
from helpers import collect_rollout, params, per_transition_copy, quiet

from sb3_grpo import CISPO, GSPO
from sb3_grpo.common.buffers import GRPODictRolloutBuffer, SequenceRolloutBuffer
from sb3_grpo.common.type_aliases import sequence_index
from sb3_grpo.common.update.train_stats import TrainStats
from sb3_grpo.objectives import cispo_objective, gspo_objective, gspo_token_objective, sequence_ratio
from textrl_envs.sb3 import make_vec_env

N_ENVS, GROUP, N_STEPS, MAX_NEW = 4, 2, 16, 6
HP = {"n_steps": N_STEPS, "n_epochs": 1, "learning_rate": 1e-3, "seed": 5, "device": "cpu"}


def _env():
    return make_vec_env("TextGen-v0", n_envs=N_ENVS, group_size=GROUP, seed=0, device="cpu", max_new_tokens=MAX_NEW)


# ------------------------------------------------------------------------------------------ pure functions
def test_sequence_ratio_and_gspo_objective_by_hand():
    log_prob = th.tensor([-1.0, -2.0, -0.5, -0.1, -3.0, -1.5])
    old = th.tensor([-1.1, -1.9, -0.2, -0.3, -2.0, -1.5])
    seq = th.tensor([7, 7, 3, 7, 3, 9])  # three sequences, tokens interleaved
    adv = {3: -1.0, 7: 2.0, 9: 0.5}
    index, n = sequence_index(seq)
    ratios = sequence_ratio(log_prob, old, index, n)
    expected_ratio, terms = [], []
    for sid in sorted(adv):  # rows are ordered by id
        diffs = [lp - o for lp, o, s in zip(log_prob.tolist(), old.tolist(), seq.tolist(), strict=True) if s == sid]
        s_i = math.exp(sum(diffs) / len(diffs))
        expected_ratio.append(s_i)
        a = adv[sid]
        terms.append(min(s_i * a, min(max(s_i, 1 - 0.1), 1 + 0.15) * a))
    assert ratios.tolist() == pytest.approx(expected_ratio)
    got = gspo_objective(ratios, th.tensor([adv[s] for s in sorted(adv)]), 0.1, 0.15)
    assert got.item() == pytest.approx(sum(terms) / len(terms))


def test_gspo_token_objective_by_hand_and_equal_to_gspo_with_one_advantage_per_sequence():
    """GSPO-token: value and gradient against the hand formula (each token's term uses its own advantage and the
    sequence's ratio, its gradient s_i * A_t * grad log pi_t where unclipped); and equal to GSPO when a sequence's
    advantages are all the same."""
    logits = th.tensor([[0.3, -0.2, 0.9], [0.1, 0.4, -0.5], [1.0, 0.0, 0.2], [-0.3, 0.8, 0.1], [0.5, 0.5, -1.0]])
    actions = th.tensor([2, 1, 0, 1, 2])
    old = th.tensor([-0.9, -0.8, -0.6, -1.0, -2.5])
    seq = th.tensor([0, 0, 1, 1, 1])
    index, n = sequence_index(seq)
    low, high = 0.05, 0.08

    def log_probs(theta):
        return th.log_softmax(theta, dim=-1)[th.arange(5), actions]

    per_token = th.tensor([1.0, -2.0, 0.5, 0.5, -1.5])  # e.g. per-turn advantages
    theta = logits.clone().requires_grad_(True)
    got = gspo_token_objective(log_probs(theta), old, per_token, index, n, low, high)
    got.backward()
    with th.no_grad():
        lp = log_probs(logits)
        s = [math.exp(float((lp[seq == i] - old[seq == i]).mean())) for i in range(n)]
        value, grad = 0.0, th.zeros_like(logits)
        for t in range(5):
            i, a = int(seq[t]), float(per_token[t])
            size = int((seq == i).sum())
            clipped = min(max(s[i], 1 - low), 1 + high)
            value += min(s[i] * a, clipped * a) / size / n
            if s[i] * a <= clipped * a:  # the unclipped term is the min: its gradient flows
                onehot = th.zeros(3)
                onehot[actions[t]] = 1.0
                grad[t] += s[i] * a * (onehot - th.softmax(logits[t], dim=-1)) / size / n
    assert got.item() == pytest.approx(value)
    np.testing.assert_allclose(theta.grad.numpy(), grad.numpy(), rtol=1e-5, atol=1e-7)
    assert any(abs(x - 1) > high for x in s)  # one sequence was clipped: the check covered both cases

    constant = th.tensor([2.0, 2.0, -1.0, -1.0, -1.0])
    a, b = logits.clone().requires_grad_(True), logits.clone().requires_grad_(True)
    token_form = gspo_token_objective(log_probs(a), old, constant, index, n, 0.5, 0.5)
    sequence_form = gspo_objective(sequence_ratio(log_probs(b), old, index, n), th.tensor([2.0, -1.0]), 0.5, 0.5)
    token_form.backward()
    sequence_form.backward()
    assert token_form.item() == pytest.approx(sequence_form.item())
    np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-5, atol=1e-7)


def test_cispo_weights_are_clipped_detached_and_every_token_keeps_a_gradient():
    log_prob = th.tensor([-1.0, -0.2, -3.0, -0.5], requires_grad=True)
    old = th.tensor([-1.0, -1.0, -1.0, -0.5])
    adv = th.tensor([1.0, 2.0, -1.0, 0.5])
    objective = cispo_objective(log_prob, old, adv, None, 0.28)
    expected, weights = [], []
    for lp, o, a in zip(log_prob.tolist(), old.tolist(), adv.tolist(), strict=True):
        w = min(math.exp(lp - o), 1.28)  # no floor
        weights.append(w)
        expected.append(w * a * lp)
    assert objective.tolist() == pytest.approx(expected)
    objective.sum().backward()
    # d/d logp of sg(w) * A * logp is w * A: the capped token (ratio e^0.8) and the one far below 1 still move
    assert log_prob.grad.tolist() == pytest.approx([w * a for w, a in zip(weights, adv.tolist(), strict=True)])
    assert all(g != 0 for g in log_prob.grad.tolist())
    floored = cispo_objective(log_prob.detach(), old, adv, 0.2, 0.28)
    assert floored[2].item() == pytest.approx(0.8 * -1.0 * -3.0)


# ------------------------------------------------------------------------------------------ brute force on a rollout
def _episodes(buffer):
    """The rollout's sequences by hand: runs of each env's steps between episode starts, as flat buffer indices."""
    starts = buffer.episode_starts
    n_steps, n_envs = starts.shape
    runs = []
    for env in range(n_envs):
        run = [0]
        for step in range(1, n_steps):
            if starts[step, env] > 0.5:
                runs.append([env * n_steps + t for t in run])
                run = []
            run.append(step)
        runs.append([env * n_steps + t for t in run])
    return runs


def _moved_rollout(model, n_steps=N_STEPS):
    buffer = collect_rollout(model, n_steps)
    assert (buffer.advantages != 0).any(), "some group must finish in the rollout"
    with th.no_grad():  # move the policy off pi_old, so the ratios are not all 1 and the clip matters
        for p in model.policy.parameters():
            p.add_(0.05 * th.randn_like(p))
    minibatch = next(iter(model.batch_source.minibatches(buffer, model.batch_size)))
    return buffer, minibatch


def _token(model, buffer, i):
    """``(log pi(a_i|s_i), H_i)`` of flat step ``i`` from its own forward."""
    obs = {key: th.as_tensor(value[i : i + 1]) for key, value in buffer.observations.items()}
    action = th.as_tensor(np.ravel(buffer.actions)[i : i + 1]).long()
    _, log_prob, entropy = model.policy.evaluate_actions(obs, action)
    return float(log_prob), float(entropy)


def test_gspo_loss_equals_a_brute_force_mean_over_sequences():
    model = quiet(
        GSPO(
            "CausalLMPolicy",
            _env(),
            batch_size=N_STEPS * N_ENVS,
            ent_coef=0.01,
            clip_range=0.01,
            clip_range_high=0.02,
            rollout_buffer_class=GRPODictRolloutBuffer,
            **HP,
        )
    )
    buffer, minibatch = _moved_rollout(model)
    terms = model._minibatch_loss(minibatch, 0.01, None, TrainStats())
    old, advantages = np.ravel(buffer.log_probs), np.ravel(buffer.advantages)
    objective, entropies, n_tokens, clipped = 0.0, 0.0, 0, 0
    runs = _episodes(buffer)
    with th.no_grad():
        for run in runs:
            log_ratios = []
            for i in run:
                log_prob, entropy = _token(model, buffer, i)
                log_ratios.append(log_prob - float(old[i]))
                entropies += entropy
                n_tokens += 1
            s = math.exp(sum(log_ratios) / len(run))
            a = float(advantages[run[0]])
            objective += min(s * a, min(max(s, 0.99), 1.02) * a)
            clipped += not 0.99 <= s <= 1.02
    assert clipped > 0, "the clip must act for the test to check it"
    expected = -objective / len(runs) - 0.01 * entropies / n_tokens
    assert terms.value == pytest.approx(expected, rel=1e-4, abs=1e-6)


def test_gspo_with_turn_credit_uses_gspo_tokens_loss():
    """advantage="group_turn" on an interactive env: each token's term has its own turn's advantage, with the
    sequence's ratio (GSPO-token), by hand over the rollout's sequences."""

    def score(prompts, completions, **kwargs):  # noqa: ARG001  (a reward's signature)
        return [0.1 * (len(c) % 5) for c in completions]  # on top of the turn rewards: returns differ in a group

    n_steps = 32
    env = make_vec_env("GuessNumber-v0", n_envs=8, group_size=4, seed=0, device="cpu", reward=score)
    model = quiet(
        GSPO(
            "CausalLMPolicy",
            env,
            advantage="group_turn",
            batch_size=n_steps * 8,
            clip_range=0.01,
            clip_range_high=0.02,
            rollout_buffer_class=GRPODictRolloutBuffer,
            **{**HP, "n_steps": n_steps},
        )
    )
    buffer, minibatch = _moved_rollout(model, n_steps)
    terms = model._minibatch_loss(minibatch, 0.01, None, TrainStats())
    old, advantages = np.ravel(buffer.log_probs), np.ravel(buffer.advantages)
    objective, runs, varying = 0.0, _episodes(buffer), 0
    with th.no_grad():
        for run in runs:
            log_probs = [_token(model, buffer, i)[0] for i in run]
            s = math.exp(sum(lp - float(old[i]) for lp, i in zip(log_probs, run, strict=True)) / len(run))
            a = [float(advantages[i]) for i in run]
            varying += len(set(a)) > 1
            objective += sum(min(s * x, min(max(s, 0.99), 1.02) * x) for x in a) / len(run)
    assert varying > 0, "some sequence must hold turns of different advantages for the test to check GSPO-token"
    assert terms.value == pytest.approx(-objective / len(runs), rel=1e-4, abs=1e-6)


def test_cispo_loss_equals_a_brute_force_token_mean():
    model = quiet(
        CISPO(
            "CausalLMPolicy",
            _env(),
            batch_size=N_STEPS * N_ENVS,
            ent_coef=0.01,
            clip_range_high=0.05,
            rollout_buffer_class=GRPODictRolloutBuffer,
            **HP,
        )
    )
    buffer, minibatch = _moved_rollout(model)
    terms = model._minibatch_loss(minibatch, 0.2, None, TrainStats())
    old, advantages = np.ravel(buffer.log_probs), np.ravel(buffer.advantages)
    total, entropies, capped = 0.0, 0.0, 0
    with th.no_grad():
        for i in range(N_STEPS * N_ENVS):
            log_prob, entropy = _token(model, buffer, i)
            ratio = math.exp(log_prob - float(old[i]))
            capped += ratio > 1.05
            total += min(ratio, 1.05) * float(advantages[i]) * log_prob
            entropies += entropy
    assert capped > 0, "the cap must act for the test to check it"
    n = N_STEPS * N_ENVS
    assert terms.value == pytest.approx(-total / n - 0.01 * entropies / n, rel=1e-4, abs=1e-6)


@pytest.mark.parametrize("cls", [GSPO, CISPO])
def test_one_update_is_the_same_on_both_paths(cls):
    """The text fast path (whole sequences) and the per-transition path, from the same rollout with one
    whole-rollout minibatch per epoch, know the same sequences: the parameters after the update are the same."""
    hp = {**HP, "batch_size": N_STEPS * N_ENVS, "n_epochs": 2, "carry_over": False}  # carry_over: the fast path's
    fast = quiet(cls("CausalLMPolicy", _env(), **hp))
    slow = quiet(cls("CausalLMPolicy", _env(), rollout_buffer_class=GRPODictRolloutBuffer, **hp))
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


@pytest.mark.parametrize("cls, low, high", [(GSPO, 3e-4, 4e-4), (CISPO, None, 0.28)])
def test_learns_saves_and_loads(tmp_path, cls, low, high):
    model = quiet(cls("CausalLMPolicy", _env(), batch_size=32, **HP))
    assert (model.clip_range_low if cls is CISPO else model.clip_range(1.0), model.clip_range_high) == (low, high)
    model.learn(2 * N_STEPS * N_ENVS)
    logged = model.logger.name_to_value
    assert np.isfinite(logged["train/policy_gradient_loss"]) and "train/value_loss" not in logged
    assert logged["train/clip_range_high"] == high
    obs = model.env.reset()
    before = model.predict(obs, deterministic=True)[0]
    model.save(tmp_path / "m")
    loaded = cls.load(tmp_path / "m", env=_env(), device="cpu")
    assert loaded.clip_range_high == high and loaded.advantage == "group"
    np.testing.assert_array_equal(loaded.predict(obs, deterministic=True)[0], before)


@pytest.mark.parametrize("cls", [GSPO, CISPO])
@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"advantage": "gae"}, r"trains no critic.*got 'gae'"),
        ({"clip_range_high": 0.0}, "clip_range_high"),
        ({"clip_range_low": float("nan")}, "clip_range_low"),
    ],
)
def test_bad_arguments_are_refused_by_name(cls, kwargs, match):
    with pytest.raises(ValueError, match=match):
        cls("CausalLMPolicy", _env(), **{**HP, **kwargs})
