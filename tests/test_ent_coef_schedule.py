"""``ent_coef`` as an SB3 schedule on the shared skeleton: evaluated once per update, used in the loss, logged."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
from helpers import collect_rollout, quiet

from sb3_grpo import CISPO, DAPO, GRPO, GSPO, DrGRPO
from textrl_envs.sb3 import make_vec_env

N_ENVS, GROUP, N_STEPS = 4, 2, 16
HP = {"n_steps": N_STEPS, "n_epochs": 1, "batch_size": N_STEPS * N_ENVS, "seed": 3, "device": "cpu"}


def _env():
    return make_vec_env("TextGen-v0", n_envs=N_ENVS, group_size=GROUP, seed=0, device="cpu", max_new_tokens=6)


@pytest.mark.parametrize(
    "cls, kwargs",
    [(GRPO, {"advantage": "group", "grad_var_coef": 0.0}), (DrGRPO, {}), (DAPO, {}), (GSPO, {}), (CISPO, {})],
    ids=["GRPO", "DrGRPO", "DAPO", "GSPO", "CISPO"],
)
def test_the_scheduled_value_is_the_one_in_the_loss(cls, kwargs):
    model = quiet(cls("CausalLMPolicy", _env(), ent_coef=lambda progress: 0.5 * progress, **HP, **kwargs))
    collect_rollout(model, N_STEPS)
    model._current_progress_remaining = 0.4
    model.train()
    logged = model.logger.name_to_value
    assert logged["train/ent_coef"] == pytest.approx(0.2)
    # one minibatch: the loss is its policy loss plus the coefficient times its entropy loss
    expected = logged["train/policy_gradient_loss"] + 0.2 * logged["train/entropy_loss"]
    assert logged["train/loss"] == pytest.approx(expected, rel=1e-5, abs=1e-7)


def test_a_number_is_used_as_it_is():
    model = quiet(GRPO("CausalLMPolicy", _env(), ent_coef=0.01, advantage="group", **HP))
    collect_rollout(model, N_STEPS)
    model.train()
    assert model._current_ent_coef is model.ent_coef  # the same float: PPO's arithmetic, bit for bit
    assert model.logger.name_to_value["train/ent_coef"] == 0.01


@pytest.mark.parametrize(
    "value, match",
    [
        (lambda progress: float("nan"), r"ent_coef\(1\) \(the schedule's value at progress 1\)"),
        ("0.01", "ent_coef"),
    ],
)
def test_a_bad_schedule_is_refused_by_name(value, match):
    with pytest.raises((TypeError, ValueError), match=match):
        GRPO("CausalLMPolicy", _env(), ent_coef=value, advantage="group", **HP)
