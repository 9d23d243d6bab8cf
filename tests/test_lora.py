"""LoRA through peft: adapters-only training, the adapter-off KL reference, GRPO with kl_coef > 0, save/load."""

from __future__ import annotations

import json
import os
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch as th
from gymnasium import spaces

peft = pytest.importorskip("peft")

from helpers import TINY_LORA as LORA
from helpers import TINY_OBS as OBS
from helpers import TINY_V as V
from helpers import TINY_W as W
from helpers import tiny_gpt2

from sb3_grpo import GRPO
from sb3_grpo.policies import CausalLMPolicy, lora_spec

ACT = spaces.Discrete(V)


def policy(lora=LORA, model=None) -> CausalLMPolicy:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return CausalLMPolicy(OBS, ACT, lambda _: 1e-3, model=model or tiny_gpt2(), lora=lora)


def batch(n: int = 3, seed: int = 0):
    g = th.Generator().manual_seed(seed)
    ids = th.randint(4, V, (n, W), generator=g)
    mask = th.ones(n, W, dtype=th.long)
    mask[0, :5] = 0
    act = th.zeros(n, W, dtype=th.bool)
    act[:, -4:] = True
    return ids, mask, act


def perturb_adapters(p: CausalLMPolicy) -> None:
    with th.no_grad():
        for name, param in p.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)


def test_only_adapters_and_value_head_train():
    p = policy()
    trainable = [n for n, q in p.named_parameters() if q.requires_grad]
    assert trainable and all(("lora_" in n) or n.startswith("value_head") for n in trainable)
    assert any(n.startswith("value_head") for n in trainable)
    optimized = {id(q) for group in p.optimizer.param_groups for q in group["params"]}
    assert optimized == {id(q) for q in p.parameters() if q.requires_grad}


def test_reference_is_the_base_model():
    base = tiny_gpt2()
    p = policy(model=tiny_gpt2())
    perturb_adapters(p)  # adapters now change the outputs
    ids, mask, act = batch()
    ref_lp, _, _ = p.reference_evaluate_sequences(ids, mask, act)
    lora_lp, _, _ = p.evaluate_sequences(ids, mask, act)
    plain = CausalLMPolicy(OBS, ACT, lambda _: 1e-3, model=base)
    base_lp, _, _ = plain.evaluate_sequences(ids, mask, act)
    assert th.allclose(ref_lp, base_lp, atol=1e-5)
    assert not th.allclose(lora_lp, base_lp, atol=1e-3)
    # the per-transition form agrees, and the adapters are back on afterwards
    obs = {"input_ids": ids[:, :-1], "attention_mask": mask[:, :-1]}
    _, ref_a, _ = p.reference_evaluate_actions(obs, ids[:, -1])
    assert th.allclose(ref_a, base_lp[:, -1], atol=1e-5)
    assert th.allclose(p.evaluate_sequences(ids, mask, act)[0], lora_lp)
    # no reference methods without LoRA: GRPO keeps its frozen copy then
    assert not hasattr(plain, "reference_evaluate_actions")


def test_kl_is_zero_at_init():
    p = policy()  # peft initialises lora_B to 0: the adapted model is the base model
    ids, mask, act = batch()
    lp, _, _ = p.evaluate_sequences(ids, mask, act)
    ref, _, _ = p.reference_evaluate_sequences(ids, mask, act)
    assert th.allclose(lp, ref, atol=1e-6)


def test_lora_spec_is_json_and_round_trips():
    spec = lora_spec(peft.LoraConfig(r=16, target_modules={"c_attn", "c_proj"}, lora_dropout=0.0))
    assert json.loads(json.dumps(spec)) == spec
    assert spec["r"] == 16 and spec["target_modules"] == ["c_attn", "c_proj"]
    assert lora_spec(peft.LoraConfig(**spec)) == spec
    with pytest.raises(ValueError, match="LoraConfig"):
        lora_spec({"rank": 4})


def test_grpo_with_kl_and_save_load(tmp_path):
    from textrl_envs.sb3 import make_vec_env

    env = make_vec_env("TextGen-v0", n_envs=4, group_size=2, seed=0, device="cpu", max_new_tokens=5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = GRPO(
            "CausalLMPolicy",
            env,
            n_steps=6,
            batch_size=12,
            n_epochs=2,
            learning_rate=1e-2,
            seed=0,
            advantage="group",
            kl_coef=0.1,
            grad_var_coef=0.0,
            policy_kwargs={"lora": {"r": 4, "target_modules": ["c_attn"], "fan_in_fan_out": True}},
        )
        assert model.ref_policy is None  # the reference is the adapter-off model, not a copy
        frozen = {n: q.detach().clone() for n, q in model.policy.named_parameters() if not q.requires_grad}
        trained = {n: q.detach().clone() for n, q in model.policy.named_parameters() if q.requires_grad}
        model.learn(2 * 6 * 4)
        moved = [n for n, q in model.policy.named_parameters() if q.requires_grad and not th.equal(q, trained[n])]
        # the adapters learned (lora_B starts at 0: once it moves, the adapted model differs from the base)
        assert any("lora_A" in n for n in moved) and any("lora_B" in n for n in moved)
        assert th.isfinite(th.tensor(model.logger.name_to_value["train/kl_ref"]))
        for n, q in model.policy.named_parameters():
            if not q.requires_grad:
                assert th.equal(q, frozen[n]), n  # the base model never moves
        model.save(tmp_path / "lora.zip")
        loaded = GRPO.load(tmp_path / "lora.zip", env=env, device="cpu")
    assert loaded.policy.lora == model.policy.lora
    a, b = model.policy.state_dict(), loaded.policy.state_dict()
    assert a.keys() == b.keys() and any("lora_A" in k for k in a)
    assert all(th.equal(a[k], b[k]) for k in a)
    ids, mask, act = batch()
    assert th.equal(
        model.policy.evaluate_sequences(ids, mask, act)[0], loaded.policy.evaluate_sequences(ids, mask, act)[0]
    )
