"""The lean single-token forward of the rollout's decoding steps (``sb3_grpo.policies.lean_step``): the same hidden
states and KV cache as the model's own forward, to the bit, for each architecture it knows (GPT-2, Llama, Qwen2 with
grouped-query heads), with and without padded rows; refused (``None``) wherever the model is not the stock one; and a
rollout through it equals a rollout through the model's forward, bit for bit, on both engines."""

import copy
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch as th
from helpers import quiet
from test_engines import assert_rollouts_equal_to_the_bit, logged_rollouts
from test_policies import tiny_gpt2, tiny_llama, tiny_qwen2
from transformers import DynamicCache, OPTConfig, OPTModel, Qwen2Config, Qwen2Model

from sb3_grpo import GRPO
from sb3_grpo.policies import lean_step as lean_module
from sb3_grpo.policies.lean_step import lean_step
from sb3_grpo.policies.token_sampling import categorical_tables, draw_tokens, sample_categorical, token_log_probs
from textrl_envs.sb3 import make_vec_env

VOCAB = 300  # the vocabulary of the models built here (the tiny models have their config's)


def tiny_llama_lora():
    """The tiny Llama with peft LoRA adapters on every projection (dropout on, which eval mode turns off), their B
    matrices drawn at random so that the adapters change the outputs."""
    peft = pytest.importorskip("peft", reason="LoRA needs the lora extra (pip install peft)")
    lm = tiny_llama()
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    peft.get_peft_model(lm, peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.1, target_modules=targets))
    with th.no_grad():
        for name, param in lm.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5, generator=th.Generator().manual_seed(len(name)))
    return lm


#: The LM bodies (``base_model``) of the tiny models the policy tests use; Qwen2's and Llama's with grouped-query
#: attention (4 query heads over 2 key/value heads), Qwen2's with biased projections; the Llama with LoRA adapters.
MODELS = {"gpt2": tiny_gpt2, "llama": tiny_llama, "qwen2": tiny_qwen2, "llama-lora": tiny_llama_lora}


def _body(name, dtype=th.float32):
    return MODELS[name]().base_model.eval().to(dtype)


def _prefilled(model, padded):
    th.manual_seed(1)
    ids = th.randint(0, model.config.vocab_size, (5, 9))
    mask = th.ones_like(ids)
    if padded:  # left padding, as the rollout's windows and the decoder's spliced rows have
        mask[1, :4] = 0
        mask[3, :7] = 0
    cache = DynamicCache(config=model.config)
    model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0), cache=cache)
    return mask, cache


@pytest.mark.parametrize("dtype", [th.float32, th.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("padded", [True, False], ids=["padded", "unpadded"])
@pytest.mark.parametrize("name", list(MODELS))
@th.no_grad()
def test_lean_step_equals_the_models_forward_to_the_bit(name, padded, dtype):
    model = _body(name, dtype)
    step = lean_step(model)
    assert step is not None
    mask, cache = _prefilled(model, padded)
    lean_cache = copy.deepcopy(cache)
    for _ in range(3):
        token = th.randint(0, model.config.vocab_size, (5, 1))
        mask = th.cat([mask, th.ones_like(mask[:, :1])], dim=1)
        positions = mask.sum(-1, keepdim=True) - 1
        ref = model(input_ids=token, attention_mask=mask, position_ids=positions, cache=cache).last_hidden_state
        out = step(token, mask, positions, lean_cache)
        assert th.equal(out, ref)
        for a, b in zip(cache.layers, lean_cache.layers, strict=True):
            assert th.equal(a.keys, b.keys) and th.equal(a.values, b.values)


@th.no_grad()
def test_lean_step_reads_the_weights_at_each_call():
    model = _body("gpt2")
    step = lean_step(model)
    mask, cache = _prefilled(model, True)
    token, mask = th.zeros(5, 1, dtype=th.long), th.cat([mask, th.ones_like(mask[:, :1])], dim=1)
    positions = mask.sum(-1, keepdim=True) - 1
    before = step(token, mask, positions, copy.deepcopy(cache))
    model.h[0].mlp.c_fc.weight.add_(0.5)  # an optimizer step in place
    after = step(token, mask, positions, copy.deepcopy(cache))
    ref = model(input_ids=token, attention_mask=mask, position_ids=positions, cache=cache).last_hidden_state
    assert not th.equal(before, after) and th.equal(after, ref)


def test_lean_step_refuses_what_is_not_the_stock_model():
    model = tiny_gpt2().base_model.train()
    assert lean_step(model) is None  # training mode
    model.eval()
    assert lean_step(model) is not None
    handle = model.h[1].mlp.register_forward_hook(lambda *args: None)  # e.g. FSDP's or a user's hooks
    assert lean_step(model) is None
    handle.remove()
    model.h[0].attn.c_attn = th.nn.Linear(32, 96)  # a layer of another class (LoRA, quantized layers)
    assert lean_step(model) is None
    opt = OPTModel(
        OPTConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            num_hidden_layers=1,
            ffn_dim=64,
            num_attention_heads=2,
            max_position_embeddings=64,
            word_embed_proj_dim=32,
        )
    ).eval()
    assert lean_step(opt) is None  # an architecture it does not know
    windowed = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        use_sliding_window=True,
        sliding_window=4,
    )
    assert lean_step(Qwen2Model(windowed).eval()) is None


def test_lean_step_is_off_for_a_gpt2_with_lora_and_on_for_the_plain_policy():
    """GPT-2's step multiplies its weights itself, so LoRA layers there take the model's forward."""
    pytest.importorskip("peft", reason="LoRA needs the lora extra (pip install peft)")
    env = make_vec_env("TextGen-v0", n_envs=2, seed=0, device="cpu", max_new_tokens=4)
    plain = quiet(GRPO("CausalLMPolicy", env, n_steps=4, batch_size=8, device="cpu"))
    lora = quiet(
        GRPO(
            "CausalLMPolicy",
            env,
            n_steps=4,
            batch_size=8,
            device="cpu",
            policy_kwargs={"lora": {"r": 4, "target_modules": ["c_attn"]}},
        )
    )
    for model in (plain, lora):
        model.policy.set_training_mode(False)
    assert plain.policy._lean_decode is not None
    assert lora.policy._lean_decode is None
    plain.policy.set_training_mode(True)
    assert plain.policy._lean_decode is None  # the update's forwards are the model's own


@pytest.mark.parametrize("top_k", [None, 5])
def test_categorical_tables_equal_torchs_categorical(top_k):
    th.manual_seed(0)
    logits = th.randn(6, 40)
    if top_k:
        logits = logits.masked_fill(logits < th.topk(logits, top_k).values[:, -1:], float("-inf"))
    log_probs, probs = categorical_tables(logits)
    dist = th.distributions.Categorical(logits=logits)
    tokens = dist.sample()
    assert th.equal(probs, dist.probs)
    assert th.equal(log_probs.gather(-1, tokens[:, None]).squeeze(-1), dist.log_prob(tokens))


@pytest.mark.parametrize("top_k", [None, 5])
def test_draw_tokens_log_probs_equal_torchs_categorical(top_k):
    """The draw's log-normaliser is logsumexp's to the bit, so a token's log-prob is the distribution's; the draw is
    the inverse-transform draw of the distribution's own probabilities with the same uniforms (a draw at a cdf
    boundary could round either way: none here)."""
    th.manual_seed(0)
    logits = 4 * th.randn(64, 300)
    if top_k:
        logits = logits.masked_fill(logits < th.topk(logits, top_k).values[:, -1:], float("-inf"))
    u = th.rand(64, 1)
    tokens, log_normaliser = draw_tokens(logits, u)
    dist = th.distributions.Categorical(logits=logits)
    assert th.equal(log_normaliser, logits.logsumexp(-1))
    assert th.equal(token_log_probs(logits, log_normaliser, tokens), dist.log_prob(tokens))
    assert th.equal(tokens, sample_categorical(dist.probs, u))
    assert th.isfinite(dist.log_prob(tokens)).all()  # never a removed token
    th.manual_seed(3)
    drawn, _ = draw_tokens(logits)
    th.manual_seed(3)
    assert th.equal(drawn, sample_categorical(dist.probs))  # the same random stream as drawing from the probs


def _rollouts(engine, lean, monkeypatch):
    calls = {"n": 0}
    real = lean_module.lean_step

    def counted(body, *projection):
        step = real(body, *projection) if lean else None
        if step is None:
            return None

        def run(*args):
            calls["n"] += 1
            return step(*args)

        return run

    monkeypatch.setattr("sb3_grpo.policies.causal_lm.lean_step", counted)
    env = make_vec_env("TextGen-v0", n_envs=4, group_size=2, seed=7, device="cpu", max_new_tokens=8)
    _, rollouts = logged_rollouts(env, 12, 24, seed=3, engine=engine, explore_alpha=0.2, explore_fraction=1.0)
    return rollouts, calls["n"]


@pytest.mark.parametrize("engine", ["step", "hf"])
def test_rollouts_through_the_lean_step_equal_the_models_forward_to_the_bit(engine, monkeypatch):
    lean, used = _rollouts(engine, True, monkeypatch)
    plain, unused = _rollouts(engine, False, monkeypatch)
    assert used > 10 and unused == 0
    assert_rollouts_equal_to_the_bit(lean, plain)


def test_appended_columns_equal_cat_and_leave_earlier_views_unchanged():
    """The lean step's cache growth: the same tensor as ``th.cat`` after every append, through a refill when the
    room runs out, a cropped cache and rows gathered; the views handed out earlier keep their numbers."""
    from types import SimpleNamespace

    from sb3_grpo.policies.lean_step import SPARE_COLUMNS, _append_column

    gen = th.Generator().manual_seed(0)
    layer = SimpleNamespace(keys=th.randn(3, 2, 5, 4, generator=gen))
    expected = layer.keys.clone()
    views = []
    storages = []
    for step in range(SPARE_COLUMNS + 12):  # past the first buffer's room
        new = th.randn(layer.keys.shape[0], 2, 1, 4, generator=gen)
        layer.keys = _append_column(layer, "keys", new)
        expected = th.cat([expected, new], dim=-2)
        assert th.equal(layer.keys, expected)
        views.append((layer.keys, expected.clone()))
        storages.append(layer.keys.untyped_storage().data_ptr())
        if step == 7:  # the rollout cache crops leading columns: the buffer goes on past them, nothing copied
            layer.keys, expected = layer.keys[..., 2:, :], expected[..., 2:, :]
        if step == 9:  # the decoder writes a joining row into a left row's slot, in place
            row = th.randn(2, layer.keys.shape[-2], 4, generator=gen)
            layer.keys[1], expected[1] = row, row
        if step == 20:  # and gathers rows
            layer.keys, expected = layer.keys[[2, 0]], expected[[2, 0]]
    assert all(th.equal(view[[0, 2]], numbers[[0, 2]]) for view, numbers in views[:10])  # row 1 was rewritten
    assert all(th.equal(view, numbers) for view, numbers in views[10:])
    assert len(set(storages[:20])) == 1  # one buffer through the crop and the slot write (its room: 5 + 32 columns)
    assert storages[21] != storages[20]  # the gathered rows: a new buffer
