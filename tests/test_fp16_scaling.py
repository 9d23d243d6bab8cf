"""fp16 loss scaling: ``autocast_dtype="float16"`` trains with a ``torch.amp.GradScaler``; overflowed steps are
skipped and counted, never raised."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch as th
from helpers import collect_rollout, params, quiet

from sb3_grpo import GRPO
from textrl_envs.sb3 import make_vec_env

N_ENVS, N_STEPS = 4, 8
HP = {
    "n_steps": N_STEPS,
    "batch_size": N_ENVS * N_STEPS,
    "n_epochs": 1,
    "learning_rate": 1e-3,
    "seed": 2,
    "device": "cpu",
    "advantage": "group",
    "grad_var_coef": 0.0,
    "explore_alpha": 0.0,
}


def _model(autocast=None, **kwargs):
    env = make_vec_env("TextGen-v0", n_envs=N_ENVS, group_size=2, seed=0, device="cpu", max_new_tokens=4)
    policy_kwargs = {} if autocast is None else {"autocast_dtype": autocast}
    return quiet(GRPO("CausalLMPolicy", env, policy_kwargs=policy_kwargs, **{**HP, **kwargs}))


def test_only_fp16_autocast_gets_a_loss_scaler():
    assert isinstance(_model("float16")._grad_scaler, th.amp.GradScaler)
    assert _model("bfloat16")._grad_scaler is None and _model()._grad_scaler is None


@pytest.mark.parametrize("nonfinite", ["raise", "skip"])
def test_an_overflowed_step_is_skipped_counted_and_leaves_the_weights(nonfinite):
    model = _model("float16", nonfinite=nonfinite)
    model._grad_scaler = th.amp.GradScaler("cpu", init_scale=2.0**100)  # the scaled fp16 gradients overflow
    collect_rollout(model, N_STEPS)
    before = params(model)
    model.train()  # no error, whatever nonfinite says: an overflow is expected under loss scaling
    logged = model.logger.name_to_value
    assert logged["train/skipped_overflow"] == 1
    assert logged["train/loss_scale"] == 2.0**99  # halved
    assert all(th.equal(before[k], v) for k, v in params(model).items())
    assert not model.policy.optimizer.state  # Adam never stepped
    assert logged.get("train/skipped_nonfinite", 0) == 0


def test_gradients_are_unscaled_before_clipping_and_the_step():
    """The same update in fp32 and under fp16 autocast with a scale of 2**10: the logged gradient norm (before
    clipping) is the true one, not 1024 times it, and the weights move alike."""
    fp32, fp16 = _model(), _model("float16", max_grad_norm=1e9)
    fp32.max_grad_norm = 1e9
    fp16.policy.load_state_dict(fp32.policy.state_dict())
    fp16._grad_scaler = th.amp.GradScaler("cpu", init_scale=2.0**10)
    fp16.rollout_buffer = collect_rollout(fp32, N_STEPS)
    before = params(fp32)
    for model in (fp32, fp16):
        np.random.seed(0)
        model.train()
    assert fp16.logger.name_to_value["train/skipped_overflow"] == 0
    norm32, norm16 = fp32.logger.name_to_value["train/grad_norm"], fp16.logger.name_to_value["train/grad_norm"]
    assert norm16 == pytest.approx(norm32, rel=2e-2)
    moved32 = sum(float((v - before[k]).abs().sum()) for k, v in params(fp32).items())
    moved16 = sum(float((v - before[k]).abs().sum()) for k, v in params(fp16).items())
    assert moved32 > 0 and moved16 == pytest.approx(moved32, rel=5e-2)


def test_a_normal_fp16_run_trains_saves_and_loads(tmp_path):
    model = _model("float16", n_epochs=4)
    before = params(model)
    model.learn(3 * N_ENVS * N_STEPS)
    logged = model.logger.name_to_value
    assert logged["train/skipped_overflow"] < 4, "the scale must settle below overflow within an update"
    after = params(model)
    assert all(th.isfinite(v).all() for v in after.values())
    assert any(not th.equal(before[k], after[k]) for k in before)
    model.save(tmp_path / "fp16")
    loaded = GRPO.load(tmp_path / "fp16", device="cpu")
    assert isinstance(loaded._grad_scaler, th.amp.GradScaler)
