"""LoRA on a quantized base (bitsandbytes, 8-bit and 4-bit NF4), on bitsandbytes' CPU backend: only the float32
adapters and the value head train, the quantized base never moves, the KL reference is the base with the adapters
off, and a checkpoint holds the adapters and the quantization settings, not the base."""

from __future__ import annotations

import io
import shutil
import sys
import warnings
import zipfile

import pytest
import torch as th

pytest.importorskip("peft", reason="LoRA needs the lora extra: pip install 'textrl[lora]'")

from sb3_grpo import GRPO
from textrl_envs.assets import lm_path
from textrl_envs.sb3 import make_vec_env

LORA = {"r": 4, "lora_alpha": 8, "target_modules": ["c_attn"]}


def _bnb():
    return pytest.importorskip(
        "bitsandbytes", reason="quantized LoRA needs the quant extra: pip install 'textrl[quant]'"
    )


def _env():
    return make_vec_env("TextGen-v0", n_envs=4, group_size=2, seed=0, device="cpu", max_new_tokens=5)


def _grpo(env, model, **policy_kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return GRPO(
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
            policy_kwargs={"model": model, **policy_kwargs},
        )


def _windows():
    g = th.Generator().manual_seed(0)
    ids = th.randint(4, 1000, (3, 13), generator=g)
    mask = th.ones_like(ids)
    mask[0, :4] = 0
    act = th.zeros(3, 13, dtype=th.bool)
    act[:, -5:] = True
    return ids, mask, act


@pytest.fixture
def base_dir(tmp_path):
    return str(shutil.copytree(lm_path(), tmp_path / "base"))


@pytest.mark.parametrize("bits", ["8bit", "4bit"])
def test_adapters_train_on_a_quantized_base_that_never_moves(bits, base_dir, tmp_path):
    bnb = _bnb()
    env = _env()
    model = _grpo(env, base_dir, quantization=bits, lora=LORA)
    policy = model.policy
    layer = {"8bit": bnb.nn.Linear8bitLt, "4bit": bnb.nn.Linear4bit}[bits]
    assert isinstance(policy.lm.transformer.h[0].attn.c_attn.base_layer, layer)
    assert isinstance(policy.lm.transformer.h[0].mlp.c_fc, layer)  # every linear layer of the blocks is quantized
    if bits == "4bit":
        assert policy.quantization["bnb_4bit_quant_type"] == "nf4"
    trainable = {n: q.detach().clone() for n, q in policy.named_parameters() if q.requires_grad}
    assert trainable and all(("lora_" in n) or n.startswith("value_head") for n in trainable)
    assert all(q.dtype == th.float32 for q in trainable.values())  # the adapters train in full precision
    base = [t.detach().clone() for t in policy._base_tensors()]
    ids, mask, act = _windows()
    with th.no_grad():
        before = policy.evaluate_sequences(ids, mask, act)[0]

    model.learn(2 * 6 * 4)

    assert all(th.equal(a, b) for a, b in zip(base, policy._base_tensors()))  # the quantized base never moved
    moved = [n for n, q in policy.named_parameters() if q.requires_grad and not th.equal(q, trainable[n])]
    assert any("lora_A" in n for n in moved) and any("lora_B" in n for n in moved)
    logged = model.logger.name_to_value
    assert th.isfinite(th.tensor([logged["train/loss"], logged["train/kl_ref"]])).all()
    with th.no_grad():
        reference = policy.reference_evaluate_sequences(ids, mask, act)[0]
        after = policy.evaluate_sequences(ids, mask, act)[0]
    # the reference is the quantized base with the adapters off: the untrained policy (lora_B = 0), not the trained one
    assert th.allclose(reference, before, atol=1e-5) and not th.allclose(after, before, atol=1e-4)

    model.save(tmp_path / "q.zip")
    with zipfile.ZipFile(tmp_path / "q.zip") as archive:
        saved = th.load(io.BytesIO(archive.read("policy.pth")), weights_only=True)
    assert set(saved) == {*trainable, "base_fingerprint"}  # no quantized base weight, no quantization state
    assert model.policy_kwargs["quantization"] == bits
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = GRPO.load(tmp_path / "q.zip", env=env, device="cpu")
    assert loaded.policy.quantization == policy.quantization
    assert isinstance(loaded.policy.lm.transformer.h[0].attn.c_attn.base_layer, layer)
    with th.no_grad():
        assert th.equal(loaded.policy.evaluate_sequences(ids, mask, act)[0], after)


def test_a_bitsandbytes_config_is_saved_as_its_spec(base_dir):
    _bnb()
    from transformers import BitsAndBytesConfig

    from sb3_grpo.policies.quantization import quantization_spec

    config = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=th.bfloat16)
    spec = quantization_spec(config)
    assert spec == {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "bnb_4bit_compute_dtype": "bfloat16"}
    assert quantization_spec(BitsAndBytesConfig(**spec)) == spec
    assert quantization_spec("4bit") == {
        "load_in_4bit": True,
        "bnb_4bit_quant_type": "nf4",
        "bnb_4bit_use_double_quant": True,
    }
    assert quantization_spec("8bit") == {"load_in_8bit": True}
    model = _grpo(_env(), base_dir, quantization=config, lora=LORA)
    assert model.policy_kwargs["quantization"] == spec  # JSON in the saved file, not a pickled object


def test_quantization_errors_name_the_fix(base_dir):
    _bnb()
    env = _env()
    with pytest.raises(ValueError, match=r"quantization.*needs.*lora|add LoRA adapters"):
        _grpo(env, base_dir, quantization="4bit")
    with pytest.raises(ValueError, match=r"'3bit' is not known.*'8bit', '4bit'"):
        _grpo(env, base_dir, quantization="3bit", lora=LORA)
    with pytest.raises(ValueError, match=r"quantizes nothing"):
        _grpo(env, base_dir, quantization={"llm_int8_threshold": 5.0}, lora=LORA)
    from transformers import AutoModelForCausalLM

    with pytest.raises(ValueError, match=r"given as an object; pass its local directory or Hub id"):
        _grpo(env, AutoModelForCausalLM.from_pretrained(base_dir), quantization="8bit", lora=LORA)


def test_without_bitsandbytes_the_error_names_the_extra(monkeypatch, base_dir):
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # as if it were not installed
    with pytest.raises(ImportError, match=r"bitsandbytes.*textrl\[quant\]"):
        _grpo(_env(), base_dir, quantization="4bit", lora=LORA)
