"""The mixture-of-experts policy (LoRA experts mixed by a gate) against brute-force computations, and the router
load-balancing loss of a Hugging Face MoE architecture against the model's own ``aux_loss``."""

from __future__ import annotations

import os
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch as th
from gymnasium import spaces

pytest.importorskip("peft", reason="the experts are LoRA adapters: pip install 'textrl[lora]'")


from sb3_grpo import GRPO
from sb3_grpo.policies import CausalLMPolicy
from sb3_grpo.policies.kv_cache import SHARED_PREFILL_MIN
from sb3_grpo.policies.moe import load_balancing_loss, mixture_log_probs, moe_spec, router_shape
from sb3_grpo.policies.token_sampling import sample_categorical
from sb3_grpo.policies.windows import positions_from_mask
from tests.helpers import TINY_LORA as LORA
from tests.helpers import TINY_OBS as OBS
from tests.helpers import TINY_V as V
from tests.helpers import TINY_W as W
from tests.helpers import quiet, tiny_gpt2
from textrl_envs.sb3 import make_vec_env

ACT = spaces.Discrete(V)


def moe_policy(experts: int = 3, perturb: bool = True, **kwargs) -> CausalLMPolicy:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p = CausalLMPolicy(OBS, ACT, lambda _: 1e-3, model=tiny_gpt2(), lora=LORA, moe={"experts": experts}, **kwargs)
    if perturb:  # LoRA starts every expert at the base (B = 0): make them differ
        g = th.Generator().manual_seed(1)
        with th.no_grad():
            for name, param in p.named_parameters():
                if "lora_B" in name:
                    param.copy_(th.randn(param.shape, generator=g) * 0.5)
    return p


def windows(n: int = 3, seed: int = 0):
    g = th.Generator().manual_seed(seed)
    ids = th.randint(4, V, (n, W), generator=g)
    mask = th.ones(n, W, dtype=th.long)
    mask[0, :5] = 0
    ids = ids.masked_fill(mask == 0, 0)
    return ids, mask


def brute_force_mixture(p: CausalLMPolicy, ids: th.Tensor, mask: th.Tensor) -> th.Tensor:
    """``[B, V]`` mixture probabilities at the last position: each expert run alone through peft's ``set_adapter``
    and the full ``lm(...)`` forward, the gate on expert 0's final hidden state, mixed in probability space."""
    peft_model = p.__dict__["_peft_model"]
    pos = positions_from_mask(mask)
    names = ["default"] + [f"expert_{k}" for k in range(1, p.moe["experts"])]
    probs, gate = [], None
    with th.no_grad():
        for name in names:
            peft_model.set_adapter(name)
            out = p.lm(input_ids=ids, attention_mask=mask, position_ids=pos, output_hidden_states=True)
            probs.append(th.softmax(out.logits[:, -1, :V].double(), dim=-1))
            if gate is None:
                gate = th.softmax(p.moe_gate(out.hidden_states[-1][:, -1]).double(), dim=-1)
        peft_model.set_adapter("default")
    p._activate_expert("default")  # peft's set_adapter froze the other experts: every expert trains again
    return sum(gate[:, k : k + 1] * probs[k] for k in range(len(names)))


# ------------------------------------------------------------------------------------------------------------------
# The math
# ------------------------------------------------------------------------------------------------------------------


def test_mixture_log_probs_is_the_log_of_the_gated_sum():
    g = th.Generator().manual_seed(0)
    logits = th.randn(5, 3, 11, generator=g, dtype=th.float64) * 3
    gate = th.randn(5, 3, generator=g, dtype=th.float64)
    brute = sum(th.softmax(gate, -1)[:, k : k + 1] * th.softmax(logits[:, k], -1) for k in range(3))
    assert th.allclose(mixture_log_probs(logits, gate).exp(), brute, rtol=1e-12, atol=0)
    # a token that only one expert considers keeps its log-prob (no underflow to -inf)
    logits[:, 1:, 0] = -1e4
    out = mixture_log_probs(logits, gate)
    assert th.isfinite(out).all()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (0, "experts"),
        ({"experts": 2.5}, "experts"),
        ({"k": 2}, "unknown keys"),
        ("4", "number of experts"),
        ({"experts": 2, "gate_init_std": -1.0}, "gate_init_std"),
    ],
)
def test_bad_moe_values_are_refused(value, message):
    with pytest.raises(ValueError, match=message):
        moe_spec(value)


def test_moe_needs_lora():
    with pytest.raises(ValueError, match=r"policy_kwargs\['lora'\]"):
        CausalLMPolicy(OBS, ACT, lambda _: 1e-3, model=tiny_gpt2(), moe={"experts": 2})
    with pytest.raises(ValueError, match="gradient_checkpointing"):
        CausalLMPolicy(OBS, ACT, lambda _: 1e-3, model=tiny_gpt2(), lora=LORA, moe=2, gradient_checkpointing=True)


# ------------------------------------------------------------------------------------------------------------------
# The policy's mixture
# ------------------------------------------------------------------------------------------------------------------


def test_log_probs_equal_the_brute_force_mixture():
    p = moe_policy(3)
    ids, mask = windows()
    brute = brute_force_mixture(p, ids, mask)
    obs = {"input_ids": ids, "attention_mask": mask}
    with th.no_grad():
        dist = p.get_distribution(obs)
        ours = dist.distribution.probs.double()
    assert th.allclose(ours, brute, rtol=1e-4, atol=1e-7)
    # the experts differ, so the mixture is no single expert's distribution
    assert not th.allclose(brute, th.softmax(p.lm(input_ids=ids, attention_mask=mask).logits[:, -1, :V], -1).double())
    actions = th.tensor([3, 17, 42])
    _, log_prob, entropy = p.evaluate_actions(obs, actions)
    assert th.allclose(log_prob.double(), brute[th.arange(3), actions].log(), atol=1e-5)
    assert th.allclose(entropy.double(), -(brute * brute.log()).sum(-1), atol=1e-5)


def test_sampling_draws_from_the_processed_mixture():
    """The inverse-transform draw of ``forward`` is the one of the brute-force mixture, tempered then top-k'd."""
    p = moe_policy(3, temperature=0.7, top_k=5)
    ids, mask = windows(6, seed=3)
    brute = brute_force_mixture(p, ids, mask)
    tempered = brute ** (1 / 0.7)
    kth = tempered.topk(5, dim=-1).values[:, -1:]
    processed = th.where(tempered >= kth, tempered, th.zeros_like(tempered))
    processed = processed / processed.sum(-1, keepdim=True)
    for seed in range(4):
        th.manual_seed(seed)
        with th.no_grad():
            actions, _, log_prob = p.forward({"input_ids": ids, "attention_mask": mask})
        th.manual_seed(seed)
        u = th.rand(6, 1)
        assert th.equal(actions, sample_categorical(processed.float(), u))
        assert th.allclose(log_prob.double(), processed[th.arange(6), actions].log(), atol=1e-5)


def test_one_expert_is_plain_lora():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain = CausalLMPolicy(OBS, ACT, lambda _: 1e-3, model=tiny_gpt2(), lora=LORA)
    one = moe_policy(1)
    with th.no_grad():
        for name, param in plain.named_parameters():
            param.copy_(dict(one.named_parameters())[name])
    ids, mask = windows()
    act = th.zeros_like(mask, dtype=th.bool)
    act[:, -4:] = True
    for a, b in zip(plain.evaluate_sequences(ids, mask, act), one.evaluate_sequences(ids, mask, act), strict=True):
        assert th.allclose(a, b, atol=1e-6)


@pytest.mark.parametrize("shared_start", [False, True])
def test_sequence_path_equals_per_token_path_and_the_rollout_cache(shared_start):
    """Rollout with the KV cache (each expert's keys/values in its own layers), the per-transition update and the
    one-forward-per-sequence update give the same log-probs and values: the PPO ratio starts at 1. With a shared
    start, the prompts' first 8 tokens are the same, and the prefill runs them once for every expert."""
    p = moe_policy(3)
    steps = 5
    ids, mask = windows(4, seed=5)
    mask[:, :steps] = 0  # room for the generated tokens: each prompt is W - steps tokens or fewer
    ids = ids.masked_fill(mask == 0, 0)
    if shared_start:
        ids[:, steps : steps + SHARED_PREFILL_MIN] = ids[0, steps : steps + SHARED_PREFILL_MIN]
    rollout_lp, rollout_v, obs_seen = [], [], []
    th.manual_seed(0)
    with th.no_grad():
        for _ in range(steps):
            obs = {"input_ids": ids.clone(), "attention_mask": mask.clone()}
            obs_seen.append(obs)
            actions, values, log_prob = p.forward(obs)
            rollout_lp.append(log_prob)
            rollout_v.append(values.squeeze(-1))
            ids = th.cat([ids[:, 1:], actions[:, None]], 1)
            mask = th.cat([mask[:, 1:], th.ones_like(mask[:, :1])], 1)
    assert p._rollout_cache.states, "the rollout cache was used"
    act = th.zeros_like(mask, dtype=th.bool)
    act[:, -steps:] = True
    seq_lp, _, seq_v = p.evaluate_sequences(ids, mask, act)
    for t in range(steps):
        col = W - steps + t
        values, log_prob, _ = p.evaluate_actions(obs_seen[t], ids[:, col])
        assert th.allclose(log_prob, seq_lp[:, col], atol=1e-5)
        assert th.allclose(values.squeeze(-1), seq_v[:, col], atol=1e-5)
        assert th.allclose(rollout_lp[t], seq_lp[:, col], atol=1e-5)
        assert th.allclose(rollout_v[t], seq_v[:, col], atol=1e-5)


def test_reference_is_the_base_and_every_expert_stays_trainable():
    p = moe_policy(3)
    base = tiny_gpt2().eval()  # the same weights as the policy's base, never adapted (no dropout)
    ids, mask = windows()
    actions = th.tensor([5, 6, 7])
    with th.no_grad():
        _, ref_lp, _ = p.reference_evaluate_actions({"input_ids": ids, "attention_mask": mask}, actions)
        logits = base(input_ids=ids, attention_mask=mask, position_ids=positions_from_mask(mask)).logits[:, -1, :V]
    assert th.allclose(ref_lp, th.log_softmax(logits, -1)[th.arange(3), actions], atol=1e-5)
    trainable = [n for n, q in p.named_parameters() if q.requires_grad]
    assert sum("lora_" in n for n in trainable) == 3 * 2 * 2  # experts x layers x (A, B)
    _, lp, _ = p.evaluate_actions({"input_ids": ids, "attention_mask": mask}, actions)
    assert not th.allclose(lp, ref_lp)


def test_gradients_reach_the_gate_and_every_expert():
    p = moe_policy(3)
    ids, mask = windows()
    _, log_prob, _ = p.evaluate_actions({"input_ids": ids, "attention_mask": mask}, th.tensor([5, 6, 7]))
    log_prob.sum().backward()
    grads = {n: q.grad for n, q in p.named_parameters() if q.requires_grad}
    for name, grad in grads.items():
        if name.startswith("value_head"):
            continue
        assert grad is not None and float(grad.abs().sum()) > 0, name
    for k in ("default", "expert_1", "expert_2"):
        assert any(f"lora_A.{k}." in n for n in grads) and any(f"lora_B.{k}." in n for n in grads)


def test_save_pretrained_and_vllm_are_refused_for_a_mixture(tmp_path):
    p = moe_policy(2)
    with pytest.raises(ValueError, match="model.save"):
        p.save_pretrained(tmp_path / "out")
    with pytest.raises(ValueError, match=r"engine='vllm'.*experts.*engine='hf'"):
        GRPO(
            "CausalLMPolicy",
            _text_env(),
            n_steps=4,
            batch_size=16,
            engine="vllm",
            explore_alpha=0.0,
            policy_kwargs={"lora": BUNDLED_LORA, "moe": {"experts": 2}},
        )


# ------------------------------------------------------------------------------------------------------------------
# Learning with the bundled LM: ratio 1, save/load, both engines
# ------------------------------------------------------------------------------------------------------------------

BUNDLED_LORA = {"r": 4, "lora_alpha": 8, "target_modules": ["c_attn"], "fan_in_fan_out": True}


def _text_env():
    return make_vec_env("TextGen-v0", n_envs=4, group_size=2, seed=0, device="cpu", max_new_tokens=5)


def _grpo(engine: str = "step", learning_rate: float = 1e-2, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return quiet(
            GRPO(
                "CausalLMPolicy",
                _text_env(),
                n_steps=6,
                batch_size=12,
                n_epochs=1,
                learning_rate=learning_rate,
                seed=0,
                advantage="group",
                grad_var_coef=0.0,
                explore_alpha=0.0,
                kl_coef=0.05,
                engine=engine,
                policy_kwargs={"lora": BUNDLED_LORA, "moe": {"experts": 2}, **kwargs},
            )
        )


@pytest.mark.parametrize("engine", ["step", "hf"])
def test_rollout_log_probs_are_the_update_log_probs(engine):
    """After a rollout, the update's fast path scores every stored action with the log-prob the rollout stored:
    the PPO ratio is 1 at the start of an update (learning rate 0 keeps the policy where it rolled out)."""
    model = _grpo(engine, learning_rate=0.0)
    g = th.Generator().manual_seed(1)
    with th.no_grad():  # experts that differ (LoRA starts them all at the base)
        for name, param in model.policy.named_parameters():
            if "lora_B" in name:
                param.copy_(th.randn(param.shape, generator=g) * 0.5)
    model.learn(6 * 4)
    model.policy.set_training_mode(True)
    with th.no_grad():
        for minibatch in model.batch_source.minibatches(model.rollout_buffer, 12):
            _, log_prob, _ = model.batch_source.evaluate(minibatch)
            assert th.allclose(log_prob, minibatch.old_log_prob, atol=1e-4)


def test_learn_runs_and_a_checkpoint_holds_adapters_gate_and_value_head(tmp_path):
    model = _grpo()
    model.learn(2 * 6 * 4)
    assert model.num_timesteps == 48 and "train/kl_ref" in model.logger.name_to_value
    path = tmp_path / "moe.zip"
    model.save(path)
    import io
    import zipfile

    with zipfile.ZipFile(path) as archive:
        state = th.load(io.BytesIO(archive.read("policy.pth")), weights_only=True)
    assert {"moe_gate.weight", "moe_gate.bias", "value_head.weight", "base_fingerprint"} <= set(state)
    assert any(".expert_1." in k for k in state) and any(".default." in k for k in state)
    assert all("lora_" in k or not k.startswith("lm.") for k in state), "no base weight in the checkpoint"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = GRPO.load(path, env=_text_env(), device="cpu")
    assert loaded.policy.moe == {"experts": 2, "gate_init_std": None}
    g = th.Generator().manual_seed(0)
    ids = th.randint(4, 1000, (3, 13), generator=g)
    mask = th.ones_like(ids)
    mask[0, :4] = 0
    act = th.zeros(3, 13, dtype=th.bool)
    act[:, -5:] = True
    with th.no_grad():
        for a, b in zip(
            model.policy.evaluate_sequences(ids, mask, act),
            loaded.policy.evaluate_sequences(ids, mask, act),
            strict=True,
        ):
            assert th.equal(a, b)


# ------------------------------------------------------------------------------------------------------------------
# The router loss of a Hugging Face MoE architecture
# ------------------------------------------------------------------------------------------------------------------

TOKENIZER_LEN = 1229


def tiny_moe_lm(kind: str = "qwen2_moe"):
    from transformers import AutoModelForCausalLM, MixtralConfig, Qwen2MoeConfig

    th.manual_seed(0)
    common = {
        "vocab_size": TOKENIZER_LEN,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "intermediate_size": 48,
        "max_position_embeddings": 128,
    }
    if kind == "mixtral":
        config = MixtralConfig(**common, num_local_experts=4, num_experts_per_tok=2)
    else:
        config = Qwen2MoeConfig(
            **common, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24, shared_expert_intermediate_size=24
        )
    lm = AutoModelForCausalLM.from_config(config)
    with th.no_grad():  # routers start at 0 in some architectures: give them something to balance
        for name, param in lm.named_parameters():
            if "gate" in name and param.dim() == 2 and param.shape[0] == 4:
                param.normal_(0, 0.5)
    return lm


@pytest.mark.parametrize("kind", ["qwen2_moe", "mixtral"])
def test_load_balancing_loss_equals_the_models_aux_loss(kind):
    lm = tiny_moe_lm(kind)
    assert router_shape(lm.config) == (4, 2)
    g = th.Generator().manual_seed(0)
    ids = th.randint(4, TOKENIZER_LEN, (3, 9), generator=g)
    mask = th.ones_like(ids)
    mask[0, :3] = 0
    out = lm(input_ids=ids, attention_mask=mask, position_ids=positions_from_mask(mask), output_router_logits=True)
    ours = load_balancing_loss(out.router_logits, 4, 2, mask)
    assert th.allclose(ours, out.aux_loss, rtol=1e-6)
    assert not th.allclose(load_balancing_loss(out.router_logits, 4, 2, None), out.aux_loss)  # padding matters


def test_router_aux_loss_needs_an_moe_model():
    with pytest.raises(ValueError, match="router_aux_loss_coef"):
        CausalLMPolicy(OBS, ACT, lambda _: 1e-3, model=tiny_gpt2(), router_aux_loss_coef=0.1)


def _moe_arch_grpo(coef: float):
    return _grpo(lora=None, moe=None, model=tiny_moe_lm(), router_aux_loss_coef=coef)


def test_policy_router_loss_is_the_models_aux_loss_on_the_update_forward():
    """The update forward's recorded loss is the full model's ``aux_loss`` on the same (trimmed) windows; packing is
    off meanwhile, and nothing is recorded without gradients or outside the context."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        obs = spaces.Dict({k: spaces.Box(0, TOKENIZER_LEN - 1, (W,), dtype="int64") for k in OBS.spaces})
        p = CausalLMPolicy(
            obs, spaces.Discrete(TOKENIZER_LEN), lambda _: 1e-3, model=tiny_moe_lm(), router_aux_loss_coef=0.1
        )
    g = th.Generator().manual_seed(0)
    ids = th.randint(4, TOKENIZER_LEN, (4, W), generator=g)
    mask = th.ones_like(ids)
    mask[0, :6], mask[1, :9], mask[2, :9] = 0, 0, 0
    ids = ids.masked_fill(mask == 0, 0)
    act = th.zeros_like(mask, dtype=th.bool)
    act[:, -3:] = True
    with p.router_aux_losses() as losses:
        p.evaluate_sequences(ids, mask, act)
        with th.no_grad():
            p.evaluate_sequences(ids, mask, act)
    p.evaluate_sequences(ids, mask, act)
    assert len(losses) == 1
    start = int((mask.sum(0) == 0).sum())  # the columns that are padding in every row are trimmed
    t_ids, t_mask = ids[:, start:], mask[:, start:]
    out = p.lm(
        input_ids=t_ids, attention_mask=t_mask, position_ids=positions_from_mask(t_mask), output_router_logits=True
    )
    assert th.allclose(losses[0], out.aux_loss, rtol=1e-5)


def test_router_aux_loss_term_is_the_coefficient_times_the_routers_loss():
    coef = 0.25
    model = _moe_arch_grpo(coef)
    model.learn(6 * 4)
    model.policy.set_training_mode(True)
    minibatch = next(iter(model.batch_source.minibatches(model.rollout_buffer, 12)))
    args = (0.2, None)
    from sb3_grpo.common.update.train_stats import TrainStats

    with_aux = model._loss_with_router_aux(minibatch, *args, TrainStats(), False)
    without = model._minibatch_loss(minibatch, *args, TrainStats(), False)
    with model.policy.router_aux_losses() as losses:  # the update forward's routers, as the previous test pins
        model.batch_source.evaluate(minibatch)
    expected = coef * th.stack(losses).mean().detach()
    assert float((with_aux.loss - without.loss).detach()) == pytest.approx(float(expected), rel=1e-4)
    assert with_aux.details["router_aux_loss"] == pytest.approx(float(expected), rel=1e-4)
    model.policy.router_aux_loss_coef = 0.0
    off = model._loss_with_router_aux(minibatch, *args, TrainStats(), False)
    assert th.equal(off.loss, without.loss) and "router_aux_loss" not in off.details


def test_zero_router_coefficient_leaves_the_update_unchanged():
    """Coefficient 0 trains exactly as a policy built without it; a positive one moves the routers differently."""

    def trained(**kwargs):
        model = _grpo(lora=None, moe=None, model=tiny_moe_lm(), **kwargs)
        model.learn(6 * 4)
        return model

    a, b = trained(router_aux_loss_coef=0.0), trained()
    for (name, pa), pb in zip(a.policy.state_dict().items(), b.policy.state_dict().values(), strict=True):
        assert th.equal(pa, pb), name
    assert "train/router_aux_loss" not in a.logger.name_to_value
    c = trained(router_aux_loss_coef=1.0)
    assert c.logger.name_to_value["train/router_aux_loss"] > 0
    router = [k for k in a.policy.state_dict() if k.endswith("mlp.gate.weight")]
    assert router and not th.equal(a.policy.state_dict()[router[0]], c.policy.state_dict()[router[0]])


def test_packed_update_forward_equals_the_padded_one():
    """Segments of different lengths packed end to end (each expert's forward gets the block-diagonal mask): the
    same log-probs, entropies and values as the padded forward."""
    packed, padded = moe_policy(3), moe_policy(3, pack_sequences=False)
    padded.load_state_dict(packed.state_dict())
    g = th.Generator().manual_seed(2)
    ids = th.randint(4, V, (6, W), generator=g)
    mask = th.zeros(6, W, dtype=th.long)
    for row, length in enumerate((14, 3, 4, 3, 5, 4)):
        mask[row, W - length :] = 1
    ids = ids.masked_fill(mask == 0, 0)
    act = (mask == 1) & (th.arange(W) >= W - 2)
    out_packed = packed.evaluate_sequences(ids, mask, act)
    assert packed._packing_verified, "the packed forward ran"
    for a, b in zip(out_packed, padded.evaluate_sequences(ids, mask, act), strict=True):
        assert th.allclose(a, b, atol=1e-5)
