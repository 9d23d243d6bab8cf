"""REINFORCE++: its batch-normalised returns against a brute-force computation, the KL penalty in the reward against
the reference evaluated step by step, its loss against a token-by-token PPO clip, and the model in the SB3 manner
(learns, save / load, seeded determinism, clear refusals, a row of ``compare``)."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import json
import math

import numpy as np
import pytest
import torch as th
from helpers import collect_rollout, params, quiet

from sb3_grpo import ReinforcePP
from sb3_grpo.cli import main
from sb3_grpo.common.buffers import GRPODictRolloutBuffer, SequenceRolloutBuffer
from sb3_grpo.common.update.train_stats import TrainStats
from sb3_grpo.compare.algos import ALGOS
from sb3_grpo.objectives import batch_normalized_returns
from textrl_envs.sb3 import make_vec_env

N_ENVS, N_STEPS, MAX_NEW = 4, 16, 6
HP = {"n_steps": N_STEPS, "n_epochs": 1, "learning_rate": 1e-3, "seed": 5, "device": "cpu"}


def _env(n_envs=N_ENVS):
    return make_vec_env("TextGen-v0", n_envs=n_envs, seed=0, device="cpu", max_new_tokens=MAX_NEW)


# ------------------------------------------------------------------------------------------ the pure function
def _brute_force(rewards, ends, gamma):
    """Token by token: each token's return-to-go in its episode (only episodes that end in the window), then the
    batch's mean and population standard deviation over those tokens."""
    n_steps, n_envs = rewards.shape
    returns, valid = np.zeros((n_steps, n_envs)), np.zeros((n_steps, n_envs), dtype=bool)
    for env in range(n_envs):
        for t in range(n_steps):
            end = next((s for s in range(t, n_steps) if ends[s, env]), None)
            if end is None:
                continue
            valid[t, env] = True
            returns[t, env] = sum(gamma ** (s - t) * rewards[s, env] for s in range(t, end + 1))
    values = returns[valid]
    adv = np.where(valid, (returns - values.mean()) / (values.std() + 1e-8), 0.0)
    return adv, valid


@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_batch_normalized_returns_equal_a_brute_force(gamma):
    rng = np.random.default_rng(0)
    rewards = rng.normal(size=(9, 5))
    ends = rng.random((9, 5)) < 0.3
    ends[:, 0] = False  # an env whose episode never ends in the window: no advantage, no part in the statistics
    ends[8, 1] = True
    adv, valid = batch_normalized_returns(th.as_tensor(rewards), th.as_tensor(ends), gamma)
    expected, expected_valid = _brute_force(rewards, ends, gamma)
    np.testing.assert_array_equal(valid.numpy(), expected_valid)
    np.testing.assert_allclose(adv.numpy(), expected, rtol=1e-5, atol=1e-6)
    assert not valid[:, 0].any() and (adv[:, 0] == 0).all()
    assert adv[valid].mean().abs() < 1e-5 and abs(float(adv[valid].double().std(unbiased=False)) - 1.0) < 1e-5


def test_batch_normalized_returns_take_the_statistics_of_every_rank():
    """Under torchrun the mean and the standard deviation are the global batch's: the reducer sees the sums."""
    rewards, ends = th.tensor([[1.0], [2.0]]), th.tensor([[False], [True]])
    seen = []

    def two_ranks(total, count):  # this rank's sums, and another rank's batch of one token of return 9
        seen.append((total, count))
        other = 9.0 if len(seen) == 1 else 81.0
        return (total + other) / (count + 1)

    adv, _ = batch_normalized_returns(rewards, ends, mean_over_ranks=two_ranks)
    returns = np.array([3.0, 2.0, 9.0])  # this rank's two tokens, then the other rank's
    assert seen == [(5.0, 2.0), (13.0, 2.0)]
    expected = (np.array([3.0, 2.0]) - returns.mean()) / (returns.std() + 1e-8)
    np.testing.assert_allclose(adv.flatten().numpy(), expected, rtol=1e-5)


# ------------------------------------------------------------------------------------------ the model's rollout
def _rollout_by_hand(model, buffer):
    """The advantages by hand from the rollout: the env's rewards minus ``kl_coef * (log pi_old - log pi_ref)``, the
    reference evaluated on each step's own window, the returns-to-go and their normalisation (:func:`_brute_force`)."""
    n_steps, n_envs = buffer.rewards.shape
    ref = np.zeros((n_steps, n_envs))
    with th.no_grad():
        for t in range(n_steps):
            if isinstance(buffer, SequenceRolloutBuffer):
                obs = {"input_ids": buffer.token_ids[t], "attention_mask": buffer.token_mask[t]}
            else:
                obs = {key: th.as_tensor(value[t]) for key, value in buffer.observations.items()}
            actions = th.as_tensor(buffer.actions[t]).long().flatten()
            ref[t] = model.ref_policy.evaluate_actions(obs, actions)[1].numpy()
    kl = buffer.log_probs - ref
    ends = np.concatenate([buffer.episode_starts[1:], model._last_episode_starts[None]]).astype(bool)
    adv, valid = _brute_force(buffer.rewards - model.kl_coef * kl, ends, model.gamma)
    return adv, valid, kl, ends


@pytest.mark.parametrize("fast", [True, False], ids=["sequences", "transitions"])
def test_buffer_advantages_equal_the_brute_force_with_the_kl_in_the_reward(fast):
    buffer_class = None if fast else GRPODictRolloutBuffer
    model = quiet(ReinforcePP("CausalLMPolicy", _env(), kl_coef=0.5, rollout_buffer_class=buffer_class, **HP))
    assert isinstance(model.rollout_buffer, SequenceRolloutBuffer) == fast
    with th.no_grad():  # the policy away from the reference, so that the KL is not 0
        for p in model.policy.parameters():
            p.add_(0.05 * th.randn_like(p))
    buffer = collect_rollout(model, N_STEPS)
    expected, valid, kl, ends = _rollout_by_hand(model, buffer)
    assert valid.any() and not valid.all(), "some episodes must end in the rollout, some not"
    assert np.abs(kl[valid]).max() > 1e-2, "the KL must be large enough for the test to see it"
    np.testing.assert_allclose(buffer.advantages, expected, rtol=1e-4, atol=1e-4)
    without_kl, _ = _brute_force(buffer.rewards, ends, model.gamma)
    assert not np.allclose(buffer.advantages, without_kl, atol=1e-3), "the KL penalty must change the advantages"


def test_without_kl_there_is_no_reference_and_the_advantages_are_normalised_returns():
    model = quiet(ReinforcePP("CausalLMPolicy", _env(), kl_coef=0.0, **HP))
    assert model.ref_policy is None and model.batch_source.reference is None
    buffer = collect_rollout(model, N_STEPS)
    ends = np.concatenate([buffer.episode_starts[1:], model._last_episode_starts[None]]).astype(bool)
    expected, _ = _brute_force(buffer.rewards, ends, 1.0)
    np.testing.assert_allclose(buffer.advantages, expected, rtol=1e-5, atol=1e-6)


def test_loss_is_ppo_clip_averaged_over_the_tokens():
    model = quiet(
        ReinforcePP(
            "CausalLMPolicy",
            _env(),
            batch_size=N_STEPS * N_ENVS,
            ent_coef=0.01,
            rollout_buffer_class=GRPODictRolloutBuffer,
            **HP,
        )
    )
    buffer = collect_rollout(model, N_STEPS)
    with th.no_grad():
        for p in model.policy.parameters():
            p.add_(0.05 * th.randn_like(p))
    minibatch = next(iter(model.batch_source.minibatches(buffer, model.batch_size)))
    terms = model._minibatch_loss(minibatch, 0.05, None, TrainStats())
    old, advantages = np.ravel(buffer.log_probs), np.ravel(buffer.advantages)
    total, entropies, clipped = 0.0, 0.0, 0
    with th.no_grad():
        for i in range(N_STEPS * N_ENVS):
            obs = {key: th.as_tensor(value[i : i + 1]) for key, value in buffer.observations.items()}
            action = th.as_tensor(np.ravel(buffer.actions)[i : i + 1]).long()
            _, log_prob, entropy = model.policy.evaluate_actions(obs, action)
            ratio, a = math.exp(float(log_prob) - float(old[i])), float(advantages[i])
            clipped += not 0.95 <= ratio <= 1.05
            total += min(ratio * a, min(max(ratio, 0.95), 1.05) * a)
            entropies += float(entropy)
    assert clipped > 0, "the clip must act for the test to check it"
    n = N_STEPS * N_ENVS
    assert terms.value == pytest.approx(-total / n - 0.01 * entropies / n, rel=1e-4, abs=1e-6)


# ------------------------------------------------------------------------------------------ as an SB3 model
def test_learns_cartpole_a_little():
    """Any action space: on CartPole (no groups, no reference model of text) it lengthens the episodes."""
    model = quiet(ReinforcePP("MlpPolicy", "CartPole-v1", n_steps=256, batch_size=64, n_epochs=4, seed=0))
    model.learn(256)
    before = model.ep_info_buffer and np.mean([e["l"] for e in model.ep_info_buffer])
    model.learn(12_000, reset_num_timesteps=False)
    after = np.mean([e["l"] for e in model.ep_info_buffer])
    assert after > 1.5 * before, (before, after)


def test_save_load_gives_the_same_predictions_and_settings(tmp_path):
    model = quiet(ReinforcePP("CausalLMPolicy", _env(), kl_coef=0.2, batch_size=32, **HP))
    model.learn(N_STEPS * N_ENVS)
    obs = model.env.reset()
    before = model.predict(obs, deterministic=True)[0]
    model.save(tmp_path / "rpp")
    loaded = ReinforcePP.load(tmp_path / "rpp", env=_env(), device="cpu")
    assert loaded.kl_coef == 0.2 and loaded.gamma == 1.0 and loaded.advantage == "reinforce_pp"
    np.testing.assert_array_equal(loaded.predict(obs, deterministic=True)[0], before)
    th.testing.assert_close(params(loaded), params(model))


def test_seeded_runs_are_identical():
    runs = [quiet(ReinforcePP("CausalLMPolicy", _env(), batch_size=32, **HP)).learn(2 * N_STEPS * N_ENVS) for _ in "ab"]
    a, b = (params(m) for m in runs)
    assert all(th.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"advantage": "group"}, r"ReinforcePP does not take advantage='group': REINFORCE\+\+'s advantage.*GRPO"),
        ({"advantage": "gae"}, r"ReinforcePP trains no critic.*got 'gae'"),
        ({"reward_redistribution": "uniform"}, r"ReinforcePP does not take reward_redistribution='uniform'"),
        ({"carry_over": True}, r"carry_over=True trains a held sequence with one advantage.*'reinforce_pp'"),
        ({"kl_coef": -0.1}, "kl_coef"),
    ],
)
def test_bad_arguments_are_refused_by_name(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ReinforcePP("CausalLMPolicy", _env(), **{**HP, **kwargs})


def test_is_a_compare_row_that_runs(tmp_path):
    spec = ALGOS["reinforce-pp"]
    assert spec.algo_class() is ReinforcePP and not spec.grouped
    out = tmp_path / "rpp"
    argv = ["compare", "--env", "TextGen-v0", "--algos", "reinforce-pp", "--seeds", "1", "--timesteps", "96"]
    argv += ["--n-envs", "4", "--eval-episodes", "4", "--no-progress"]
    argv += ["--set", "*.n_steps=24", "--set", "*.batch_size=48", "--set", "*.n_epochs=1"]
    assert main([*argv, "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["status"] == "complete" and set(results["runs"]) == {"reinforce-pp/seed0"}
    assert math.isfinite(results["runs"]["reinforce-pp/seed0"]["final"]["reward_mean"])
    assert "| reinforce-pp |" in (out / "report.md").read_text()
