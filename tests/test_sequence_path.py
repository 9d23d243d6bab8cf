"""The text fast path: SequenceRolloutBuffer and GRPO's one-forward-per-sequence update, against the
per-transition path and stock SB3 PPO on the same rollout."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch as th
from helpers import collect_rollout, params, per_transition_copy, quiet
from stable_baselines3 import PPO
from stable_baselines3.common.buffers import DictRolloutBuffer

from sb3_grpo import GRPO, CausalLMPolicy
from sb3_grpo.common.buffers import GRPODictRolloutBuffer, SequenceRolloutBuffer, episode_segments, pack_segments
from sb3_grpo.grpo.extras import EXTRAS_OFF
from textrl_envs.sb3 import make_vec_env

OFF = EXTRAS_OFF.switches()
N_ENVS, N_STEPS = 4, 12
HP = {"n_steps": N_STEPS, "batch_size": 16, "n_epochs": 2, "learning_rate": 1e-3, "seed": 3, "device": "cpu"}


def _env(seed=0, **kw):
    # 8-token completions of the bundled LM: episodes end at EOS or cross rollout boundaries
    return make_vec_env("TextGen-v0", n_envs=N_ENVS, seed=seed, device="cpu", max_new_tokens=8, **kw)


# ---------------------------------------------------------------------------------------- buffer helpers
def test_episode_segments_and_packing_by_hand():
    starts = np.array([[1, 1], [0, 0], [1, 0], [0, 1], [0, 0]], dtype=np.float32)
    seg = episode_segments(starts)
    assert seg.tolist() == [[0, 0, 2], [0, 2, 5], [1, 0, 3], [1, 3, 5]]
    lengths = seg[:, 2] - seg[:, 1]
    batches = pack_segments(lengths, 4, np.array([3, 0, 1, 2]))
    # 2 + 2 -> closes at 4; 3 + 3 -> closes at 6
    assert [b.tolist() for b in batches] == [[3, 0], [1, 2]]
    assert sum(lengths[b].sum() for b in batches) == lengths.sum()


def test_sequence_buffer_rejects_non_text_spaces():
    from gymnasium import spaces

    with pytest.raises(ValueError, match="needs a text env"):
        SequenceRolloutBuffer(4, spaces.Dict({"obs": spaces.Box(0, 1, (2,))}), spaces.Discrete(3), "cpu")


def test_grpo_picks_the_sequence_buffer_for_causal_lm_policy_only():
    env = _env()
    assert isinstance(GRPO("CausalLMPolicy", env, **HP).rollout_buffer, SequenceRolloutBuffer)
    per_transition = GRPO("CausalLMPolicy", env, rollout_buffer_class=DictRolloutBuffer, **HP)
    # SB3's DictRolloutBuffer, plus the policy's own log-probs (the KL's importance weights)
    assert type(per_transition.rollout_buffer) is GRPODictRolloutBuffer


def test_sequences_rebuild_every_stored_window_and_field():
    model = quiet(GRPO("CausalLMPolicy", _env(), **HP, **OFF))
    buf = collect_rollout(model, N_STEPS)
    seg = episode_segments(buf.episode_starts)
    assert len(seg) > N_ENVS, "the rollout should hold episode ends (EOS or the 8-token budget)"
    samples = buf.sequence_samples(seg)
    w = buf.token_ids.shape[-1]
    seen = set()
    for s in range(len(seg)):
        for j in th.nonzero(samples.action_mask[s]).flatten().tolist():
            flat = int(samples.index[s, j])
            env, step = divmod(flat, N_STEPS)
            seen.add(flat)
            # the state before the action is the final window's first j tokens, right-aligned in W
            obs_ids, obs_mask = buf.token_ids[step, env], buf.token_mask[step, env]
            assert th.equal(obs_ids[w - j :], samples.input_ids[s, :j])
            assert th.equal(obs_mask[w - j :], samples.attention_mask[s, :j])
            assert not obs_mask[: w - j].any()
            assert int(samples.input_ids[s, j]) == int(buf.actions[step, env, 0])
            assert float(samples.old_log_prob[s, j]) == pytest.approx(float(buf.log_probs[step, env]))
            assert float(samples.old_policy_log_prob[s, j]) == pytest.approx(float(buf.policy_log_probs[step, env]))
            assert float(samples.advantages[s, j]) == pytest.approx(float(buf.advantages[step, env]))
            assert float(samples.returns[s, j]) == pytest.approx(float(buf.returns[step, env]))
            assert float(samples.old_values[s, j]) == pytest.approx(float(buf.values[step, env]))
    assert seen == set(range(N_STEPS * N_ENVS)), "every transition appears exactly once"


def test_sequence_outputs_equal_per_transition_outputs_on_the_same_rollout():
    model = quiet(GRPO("CausalLMPolicy", _env(), **HP, **OFF))
    buf = collect_rollout(model, N_STEPS)
    model.batch_size = N_STEPS * N_ENVS  # one minibatch: the whole rollout
    batch = next(model.batch_source.minibatches(model.rollout_buffer, model.batch_size))
    values, log_prob, entropy = model.batch_source.evaluate(batch)
    index = batch.inputs.index[batch.inputs.action_mask]
    env, step = index // N_STEPS, index % N_STEPS
    obs = {"input_ids": buf.token_ids[step, env], "attention_mask": buf.token_mask[step, env]}
    ref_values, ref_log_prob, ref_entropy = model.policy.evaluate_actions(obs, batch.actions)
    th.testing.assert_close(log_prob, ref_log_prob, atol=1e-5, rtol=1e-5)
    th.testing.assert_close(entropy, ref_entropy, atol=1e-5, rtol=1e-5)
    th.testing.assert_close(values, ref_values.flatten(), atol=1e-5, rtol=1e-5)
    # and the stored (rollout-time, KV-cached) log-probs are those of the same policy
    th.testing.assert_close(log_prob, batch.old_log_prob, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "extras",
    [
        OFF,
        {"grad_var_coef": 0.01, "grad_var_params": ["value_head"], "adaptive_clip": (1.1, 0.9), "kl_coef": 0.1},
        # explored tokens: the importance-weighted KL (w = pi_old / mu) on both paths, and its controller
        {"explore_alpha": 0.3, "explore_fraction": 1.0, "kl_coef": 0.1, "kl_target": 0.01},
    ],
    ids=["ppo", "grpo-terms", "explore-kl"],
)
def test_one_update_from_the_same_rollout_is_the_same_on_both_paths(extras):
    """Same rollout, one minibatch per epoch: the fast path's update equals the per-transition path's, the KL
    to the reference and the KL controller included."""
    hp = {**HP, "batch_size": N_STEPS * N_ENVS, "n_epochs": 2}
    extras = {**OFF, **extras}
    fast = quiet(GRPO("CausalLMPolicy", _env(), **hp, **extras))
    slow = quiet(GRPO("CausalLMPolicy", _env(), rollout_buffer_class=DictRolloutBuffer, **hp, **extras))
    slow.policy.load_state_dict(fast.policy.state_dict())
    if fast.ref_policy is not None:
        slow.ref_policy.load_state_dict(fast.ref_policy.state_dict())
    buf = collect_rollout(fast, N_STEPS)
    slow.rollout_buffer = per_transition_copy(slow, buf)
    if extras["explore_alpha"] > 0:  # the weights pi_old / mu differ from 1: the test sees whether they are used
        assert fast._rollout_explore_alpha == pytest.approx(0.3)
        assert not np.array_equal(buf.policy_log_probs, buf.log_probs)
    before = params(fast)
    fast.train()
    slow.train()
    after_fast, after_slow = params(fast), params(slow)
    assert any(not th.equal(before[k], after_fast[k]) for k in before), "the update must move the weights"
    for k in after_fast:
        th.testing.assert_close(after_fast[k], after_slow[k], atol=2e-6, rtol=1e-5)
    keys = ["train/policy_gradient_loss", "train/value_loss", "train/entropy_loss", "train/loss"]
    if extras["kl_coef"] > 0:
        keys += ["train/kl_ref", "train/kl_coef"]
        assert fast.logger.name_to_value["train/kl_ref"] > 0
    for key in keys:
        a, b = fast.logger.name_to_value[key], slow.logger.name_to_value[key]
        assert a == pytest.approx(b, rel=1e-5, abs=1e-6), key


# ------------------------------------------------------------------------------------- PPO equivalence
def test_textgen_extras_off_per_transition_equals_stock_ppo_exactly():
    """The anchor: on TextGen-v0, GRPO with every extra off computes what stock PPO computes."""
    ppo = quiet(PPO(CausalLMPolicy, _env(), **HP)).learn(2 * N_STEPS * N_ENVS)
    grpo = quiet(GRPO("CausalLMPolicy", _env(), rollout_buffer_class=DictRolloutBuffer, **HP, **OFF))
    grpo.learn(2 * N_STEPS * N_ENVS)
    a, b = params(ppo), params(grpo)
    assert all(th.equal(a[k], b[k]) for k in a)


def test_textgen_extras_off_fast_path_matches_stock_ppo_with_one_minibatch():
    """Through the fast path (sequence minibatches), one minibatch per epoch: PPO's update to float rounding."""
    hp = {**HP, "batch_size": N_STEPS * N_ENVS}
    ppo = quiet(PPO(CausalLMPolicy, _env(), **hp)).learn(2 * N_STEPS * N_ENVS)
    grpo = quiet(GRPO("CausalLMPolicy", _env(), **hp, **OFF)).learn(2 * N_STEPS * N_ENVS)
    assert isinstance(grpo.rollout_buffer, SequenceRolloutBuffer)
    a, b = params(ppo), params(grpo)
    for k in a:
        th.testing.assert_close(a[k], b[k], atol=5e-6, rtol=1e-5)
