"""Mixed precision (autocast) and gradient checkpointing on CausalLMPolicy's fast path."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch as th
from gymnasium import spaces
from transformers import GPT2Config, GPT2LMHeadModel

from sb3_grpo import GRPO
from sb3_grpo.policies import CausalLMPolicy

V, W = 60, 14
OBS = spaces.Dict(
    {
        "input_ids": spaces.Box(0, V - 1, (W,), dtype="int64"),
        "attention_mask": spaces.Box(0, 1, (W,), dtype="int64"),
    }
)
ACT = spaces.Discrete(V)


def make(**kw) -> CausalLMPolicy:
    th.manual_seed(0)
    lm = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_layer=2, n_embd=32, n_head=2, n_positions=64))
    th.manual_seed(1)
    return CausalLMPolicy(OBS, ACT, lambda _: 1e-3, model=lm, **kw)


def batch(n: int = 3):
    g = th.Generator().manual_seed(0)
    ids = th.randint(4, V, (n, W), generator=g)
    mask = th.ones(n, W, dtype=th.long)
    mask[0, :5] = 0
    act = th.zeros(n, W, dtype=th.bool)
    act[:, -5:] = True
    return ids, mask, act


# Tolerances about 7x the errors measured on this test's model (log-probs: 6.6e-4 bf16, 6.9e-5 fp16; values 2.7e-3 and
# 3.1e-4; rollout log-probs 1.1e-3 and 1.1e-4): bf16 keeps 8 bits of mantissa, fp16 11.
TOLERANCE = {"bfloat16": 5e-3, "float16": 5e-4}


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_autocast_close_to_fp32_and_outputs_fp32(dtype):
    ref, amp = make(), make(autocast_dtype=dtype)
    ids, mask, act = batch()
    lp32, ent32, v32 = ref.evaluate_sequences(ids, mask, act)
    inside = []  # the dtype the LM's matmuls run in: autocast took effect
    amp.lm.transformer.h[0].mlp.c_fc.register_forward_hook(lambda _m, _i, out: inside.append(out.dtype))
    lp, ent, v = amp.evaluate_sequences(ids, mask, act)
    assert set(inside) == {getattr(th, dtype)}
    assert not th.equal(lp[act], lp32[act])  # it computed in lower precision, not fp32 under another name
    assert lp.dtype == ent.dtype == v.dtype == th.float32
    tol = TOLERANCE[dtype]
    assert th.allclose(lp, lp32, atol=tol) and th.allclose(ent, ent32, atol=tol) and th.allclose(v, v32, atol=4 * tol)
    # rollout path (KV cache) too
    obs = {"input_ids": ids, "attention_mask": mask}
    inside.clear()
    with th.no_grad():
        actions, values, log_prob = amp(obs)
    assert set(inside) == {getattr(th, dtype)}
    assert values.dtype == log_prob.dtype == th.float32
    _, ref_lp, _ = ref.evaluate_actions(obs, actions)
    assert th.allclose(log_prob, ref_lp, atol=2 * tol)
    # gradients flow and are fp32 (the weights stay fp32)
    (-lp[act].mean() + v[act].pow(2).mean()).backward()
    assert all(p.grad is None or p.grad.dtype == th.float32 for p in amp.parameters())
    assert amp.value_head.weight.grad is not None


def test_autocast_dtype_validated_and_saved():
    with pytest.raises(ValueError, match="autocast_dtype"):
        make(autocast_dtype="float64")
    assert make(autocast_dtype="bfloat16")._get_constructor_parameters()["autocast_dtype"] == "bfloat16"


def test_gradient_checkpointing_fast_path_same_gradients():
    plain, ckpt = make(), make(gradient_checkpointing=True)
    ids, mask, act = batch()
    grads, kept = [], []
    for p in (plain, ckpt):
        p.set_training_mode(True)
        saved = [0]  # elements the forward keeps for the backward: what checkpointing trades for recompute

        def count(t, saved=saved):
            saved[0] += t.numel()
            return t

        with th.autograd.graph.saved_tensors_hooks(count, lambda t: t):
            lp, _, v = p.evaluate_sequences(ids, mask, act)
        kept.append(saved[0])
        (-lp[act].mean() + v[act].pow(2).mean()).backward()
        grads.append([q.grad.clone() for q in p.parameters() if q.grad is not None])
    assert kept[1] < kept[0] / 4  # checkpointing took effect (measured: 14,030 against 114,630 elements)
    assert len(grads[0]) == len(grads[1])
    assert all(th.allclose(a, b, atol=1e-6) for a, b in zip(*grads))


def test_grpo_update_under_autocast_and_checkpointing():
    from textrl_envs.sb3 import make_vec_env

    env = make_vec_env("TextGen-v0", n_envs=4, seed=0, device="cpu", max_new_tokens=5)
    model = GRPO(
        "CausalLMPolicy",
        env,
        n_steps=6,
        batch_size=12,
        n_epochs=1,
        seed=0,
        grad_var_coef=0.0,
        policy_kwargs={"autocast_dtype": "bfloat16", "gradient_checkpointing": True},
    )
    model.learn(6 * 4)
    assert model.rollout_buffer.log_probs.dtype.name == "float32"
    assert model.rollout_buffer.advantages.dtype.name == "float32"
    assert th.isfinite(th.tensor(model.logger.name_to_value["train/loss"]))
