"""Micro-batches (``micro_batch_size``): the accumulated update equals the unsplit one, on both update paths."""

import math
import os
from dataclasses import replace

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch as th
from helpers import collect_rollout, params, quiet

from sb3_grpo import CISPO, DAPO, GRPO, GSPO, DrGRPO, ReinforcePP
from sb3_grpo.common.buffers import GRPODictRolloutBuffer, SequenceRolloutBuffer
from textrl_envs.sb3 import make_vec_env

N_ENVS, GROUP, N_STEPS, MAX_NEW = 4, 2, 16, 6
MLP = {"n_steps": 64, "batch_size": 32, "n_epochs": 2, "device": "cpu", "seed": 3, "grad_var_coef": 0.0}
TEXT = {"n_steps": N_STEPS, "n_epochs": 2, "learning_rate": 1e-3, "seed": 5, "device": "cpu"}
LOGGED = ("train/policy_gradient_loss", "train/entropy_loss", "train/loss", "train/approx_kl", "train/clip_fraction")


def _text_env():
    return make_vec_env("TextGen-v0", n_envs=N_ENVS, group_size=GROUP, seed=0, device="cpu", max_new_tokens=MAX_NEW)


def _assert_same_update(whole, split, extra_keys=()):
    a, b = params(whole), params(split)
    for k in a:
        th.testing.assert_close(a[k], b[k], atol=2e-6, rtol=1e-5)
    for key in (*LOGGED, *extra_keys):
        assert (key in split.logger.name_to_value) == (key in whole.logger.name_to_value), key
        if key not in whole.logger.name_to_value:  # e.g. no gradient norm when target_kl stopped every epoch
            continue
        assert split.logger.name_to_value[key] == pytest.approx(whole.logger.name_to_value[key], rel=1e-4, abs=1e-7), (
            key
        )


@pytest.mark.parametrize(
    "micro, extra",
    [(8, {}), (12, {}), (8, {"target_kl": 1e-7})],  # 12: the last micro-batch of each minibatch is smaller
    ids=["8", "12", "8-target_kl"],
)
def test_mlp_learn_equals_unsplit_with_normalised_advantages_value_loss_and_kl(micro, extra):
    hp = {**MLP, "kl_coef": 0.1, "clip_range_vf": 0.2, "ent_coef": 0.01, **extra}
    whole = quiet(GRPO("MlpPolicy", "CartPole-v1", **hp)).learn(128)
    split = quiet(GRPO("MlpPolicy", "CartPole-v1", micro_batch_size=micro, **hp)).learn(128)
    assert split._n_updates == whole._n_updates == (2 if "target_kl" in extra else 4)  # target_kl stops epoch 1
    _assert_same_update(
        whole, split, ("train/value_loss", "train/kl_ref", "train/clip_fraction_pos", "train/grad_norm")
    )


def _text_pair(cls, micro, fast, **kwargs):
    """The same model twice, unsplit and split, trained on the same rollout (one ``train()``)."""
    buffer_class = None if fast else GRPODictRolloutBuffer
    hp = {**TEXT, "batch_size": N_STEPS * N_ENVS // 2, "rollout_buffer_class": buffer_class, **kwargs}
    whole = quiet(cls("CausalLMPolicy", _text_env(), **hp))
    split = quiet(cls("CausalLMPolicy", _text_env(), micro_batch_size=micro, **hp))
    assert isinstance(whole.rollout_buffer, SequenceRolloutBuffer) == fast
    split.policy.load_state_dict(whole.policy.state_dict())
    buf = collect_rollout(whole, N_STEPS)
    assert (buf.advantages != 0).any(), "some group must finish in the rollout"
    split.rollout_buffer = buf  # the same rollout, its minibatches drawn alike (the RNGs seeded alike below)
    before = params(whole)
    for model in (whole, split):
        np.random.seed(11)
        th.manual_seed(11)
        model.train()
    assert any(not th.equal(before[k], v) for k, v in params(whole).items()), "the update must move the weights"
    return whole, split


@pytest.mark.parametrize("fast", [True, False], ids=["sequences", "transitions"])
def test_grpo_group_advantages_and_kl_equal_unsplit_on_both_paths(fast):
    # sequences: 2 per micro-batch; transitions: 5 per micro-batch (not a divisor of the minibatch)
    whole, split = _text_pair(
        GRPO, 2 if fast else 5, fast, advantage="group", kl_coef=0.2, grad_var_coef=0.0, explore_alpha=0.0
    )
    _assert_same_update(whole, split, ("train/kl_ref",))


@pytest.mark.parametrize("fast", [True, False], ids=["sequences", "transitions"])
def test_dr_grpo_equals_unsplit_on_both_paths(fast):
    whole, split = _text_pair(DrGRPO, 1 if fast else 7, fast, ent_coef=0.01)
    _assert_same_update(whole, split)


@pytest.mark.parametrize(
    "cls, kwargs",
    [(DAPO, {"overlong_buffer": 2}), (CISPO, {"clip_range_low": 0.2}), (ReinforcePP, {"kl_coef": 0.1})],
    ids=["DAPO", "CISPO", "ReinforcePP"],
)
@pytest.mark.parametrize("fast", [True, False], ids=["sequences", "transitions"])
def test_token_mean_losses_equal_unsplit_on_both_paths(cls, kwargs, fast):
    """DAPO's, CISPO's and REINFORCE++'s token-level means: a micro-batch's loss is its mean weighted by its share of
    the tokens."""
    whole, split = _text_pair(cls, 2 if fast else 5, fast, ent_coef=0.01, **kwargs)
    _assert_same_update(whole, split)


@pytest.mark.parametrize("per_token", [False, True], ids=["sequence", "token"])
def test_gspo_sequence_mean_equals_unsplit_on_the_text_fast_path(per_token, monkeypatch):
    """GSPO's mean over sequences: a micro-batch of whole sequences weighs by its share of them; the same for
    GSPO-token's loss (taken here with the group advantage marked per token: one-turn episodes, one advantage each)."""
    if per_token:
        from sb3_grpo.common.advantages import forms

        monkeypatch.setitem(forms.ADVANTAGE_FORMS, "group", replace(forms.ADVANTAGE_FORMS["group"], per_token=True))
    whole, split = _text_pair(GSPO, 1, True, ent_coef=0.01, clip_range=0.2, clip_range_high=0.2)
    _assert_same_update(whole, split)


def test_gspo_refuses_micro_batches_that_would_cut_its_sequences():
    with pytest.raises(ValueError, match=r"GSPO's ratio is per sequence.*micro_batch_size=None"):
        GSPO("CausalLMPolicy", _text_env(), micro_batch_size=4, rollout_buffer_class=GRPODictRolloutBuffer, **TEXT)


def test_split_covers_the_minibatch_in_order():
    model = quiet(GRPO("CausalLMPolicy", _text_env(), batch_size=N_STEPS * N_ENVS, grad_var_coef=0.0, **TEXT))
    buf = collect_rollout(model, N_STEPS)
    minibatch = next(iter(model.batch_source.minibatches(buf, model.batch_size)))
    parts = model.batch_source.split(minibatch, 3)
    assert [p.inputs.input_ids.shape[0] for p in parts][:-1] == [3] * (len(parts) - 1)
    th.testing.assert_close(th.cat([p.actions for p in parts]), minibatch.actions, rtol=0, atol=0)
    assert sum(p.share.fraction for p in parts) == pytest.approx(1.0)
    assert {p.share.n_sequences for p in parts} == {minibatch.inputs.input_ids.shape[0]}


def _poison_second_micro_batch(model):
    """The KL reference's log-probs are NaN for the second micro-batch of each minibatch."""
    calls = {"n": 0}
    original = model.batch_source.reference_log_prob

    def reference_log_prob(batch):
        calls["n"] += 1
        out = original(batch)
        return out * math.nan if calls["n"] % 4 == 2 else out

    model.batch_source.reference_log_prob = reference_log_prob


def test_a_non_finite_micro_batch_obeys_nonfinite():
    hp = {**MLP, "kl_coef": 0.1, "micro_batch_size": 8}  # 4 micro-batches per minibatch
    model = quiet(GRPO("MlpPolicy", "CartPole-v1", nonfinite="raise", **hp))
    _poison_second_micro_batch(model)
    before = params(model)
    with pytest.raises(RuntimeError, match=r"non-finite loss at update 0"):
        model.learn(64)
    assert all(th.equal(before[k], v) for k, v in params(model).items())

    model = quiet(GRPO("MlpPolicy", "CartPole-v1", nonfinite="skip", **hp))
    _poison_second_micro_batch(model)
    before = params(model)
    model.learn(64)
    assert model.logger.name_to_value["train/skipped_nonfinite"] == 4  # 2 minibatches x 2 epochs, none stepped
    assert all(th.equal(before[k], v) for k, v in params(model).items())
    assert all(p.grad is None or not p.grad.any() for p in model.policy.parameters())


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"micro_batch_size": 0}, "micro_batch_size"),
        ({"micro_batch_size": 2.5}, "micro_batch_size"),
        ({"micro_batch_size": 8, "grad_var_coef": 0.01}, r"gradient-variance penalty.*grad_var_coef=0"),
    ],
)
def test_bad_micro_batch_settings_are_refused_by_name(kwargs, match):
    with pytest.raises((TypeError, ValueError), match=match):
        GRPO("MlpPolicy", "CartPole-v1", **{**MLP, **kwargs})


def test_the_penalty_is_refused_when_micro_batches_are_set_after_construction():
    model = quiet(GRPO("MlpPolicy", "CartPole-v1", **{**MLP, "grad_var_coef": 0.01}))
    model.micro_batch_size = 8
    with pytest.raises(ValueError, match="gradient-variance penalty"):
        model.learn(64)
