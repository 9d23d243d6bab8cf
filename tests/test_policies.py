"""Tests for sb3_grpo.policies.CausalLMPolicy (tiny models built from configs; no downloads)."""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import shutil
import zipfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from stable_baselines3 import A2C, PPO
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)
from transformers.modeling_layers import GradientCheckpointingLayer

from sb3_grpo import GRPO
from sb3_grpo.policies import (
    CausalLMPolicy,
    PortableModel,
    extends_by_one,
    left_pad_columns,
    positions_from_mask,
    process_logits,
    sample_categorical,
)
from sb3_grpo.policies.kv_cache import SHARED_PREFILL_MIN
from sb3_grpo.policies.windows import common_prefix_length
from textrl_envs.sb3 import make_vec_env

V = 60  # env vocabulary (len(tokenizer))
LM_V = 64  # the LM's vocabulary may be larger
EOS = 3
MAX_PROMPT, MAX_NEW = 6, 8
W = MAX_PROMPT + MAX_NEW


def tiny_gpt2(vocab: int = LM_V, **config: object) -> GPT2LMHeadModel:
    th.manual_seed(0)
    cfg = GPT2Config(
        vocab_size=vocab,
        n_layer=2,
        n_embd=32,
        n_head=2,
        n_positions=64,
        bos_token_id=1,
        eos_token_id=EOS,
        **config,
    )
    return GPT2LMHeadModel(cfg)


def _tiny_decoder(model_cls, config_cls, vocab: int):
    """A 2-layer Llama-style decoder (grouped-query attention, rotary positions) from a tiny config."""
    th.manual_seed(0)
    cfg = config_cls(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        bos_token_id=1,
        eos_token_id=EOS,
        pad_token_id=0,
    )
    return model_cls(cfg)


def tiny_llama(vocab: int = LM_V) -> LlamaForCausalLM:
    return _tiny_decoder(LlamaForCausalLM, LlamaConfig, vocab)


def tiny_qwen2(vocab: int = LM_V) -> Qwen2ForCausalLM:
    return _tiny_decoder(Qwen2ForCausalLM, Qwen2Config, vocab)


@contextlib.contextmanager
def count_lm_calls(policy: CausalLMPolicy):
    """Collect the input shapes of every LM body forward inside the block (the model's own forward and the rollout's
    lean decoding step alike)."""
    calls = []
    hook = policy.lm.base_model.register_forward_pre_hook(
        lambda _m, _a, kw: calls.append(tuple(kw["input_ids"].shape)), with_kwargs=True
    )
    lean = policy.__dict__.get("_lean_decode")
    if lean is not None:

        def counted(ids, *args):
            calls.append(tuple(ids.shape))
            return lean(ids, *args)

        policy._lean_decode = counted
    try:
        yield calls
    finally:
        hook.remove()
        if lean is not None:
            policy._lean_decode = lean


def obs_space(width: int = W) -> spaces.Dict:
    return spaces.Dict(
        {
            "input_ids": spaces.Box(0, V - 1, (width,), np.int64),
            "attention_mask": spaces.Box(0, 1, (width,), np.int64),
        }
    )


def make_policy(model=None, **kwargs) -> CausalLMPolicy:
    return CausalLMPolicy(
        obs_space(),
        spaces.Discrete(V),
        lambda _: 1e-3,
        model=model or tiny_gpt2(),
        **kwargs,
    )


def vocab_tokenizer():
    """A word-level tokenizer of exactly ``V`` tokens (``<pad>`` 0, ``<unk>`` 1, ``<bos>`` 2, ``<eos>`` ``EOS``, then
    ``w4 .. w{V-1}``), built offline, so the real text env has the action space ``Discrete(V)`` of these tests."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<unk>": 1, "<bos>": 2, "<eos>": EOS, **{f"w{i}": i for i in range(4, V)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>", unk_token="<unk>")


#: Prompts of 1 to MAX_PROMPT random words, so resets change the padding of the window.
_RNG = np.random.default_rng(0)
PROMPTS = [" ".join(f"w{i}" for i in _RNG.integers(4, V, _RNG.integers(1, MAX_PROMPT + 1))) for _ in range(24)]


def share_of_w7(_prompts, completions):
    """Reward: the share of the completion's words that are ``w7``."""
    return [float(np.mean([w == "w7" for w in c.split()])) if c.split() else 0.0 for c in completions]


def text_vec_env(n_envs=4, group_size=1, seed=0):
    """The real, cheap text env (TextGenVectorEnv behind the SB3 adapter) with this module's vocabulary and window:
    ``Discrete(V)`` actions, ``W = MAX_PROMPT + MAX_NEW``, episodes end at ``EOS`` or after ``MAX_NEW`` tokens."""
    return make_vec_env(
        None,
        n_envs=n_envs,
        group_size=group_size,
        device="cpu",
        seed=seed,
        prompts=PROMPTS,
        reward=share_of_w7,
        tokenizer=vocab_tokenizer(),
        max_prompt_tokens=MAX_PROMPT,
        max_new_tokens=MAX_NEW,
    )

    def env_method(self, method_name, *args, indices=None, **kwargs):
        return [None] * self.num_envs

    def env_is_wrapped(self, wrapper_class, indices=None):
        return [False] * self.num_envs


# ------------------------------------------------------------------------------------------------------------------
# Pure functions
# ------------------------------------------------------------------------------------------------------------------


def test_positions_from_mask_ignores_padding():
    mask = th.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 0, 1]])
    assert positions_from_mask(mask).tolist() == [
        [0, 0, 0, 1, 2],
        [0, 1, 2, 3, 4],
        [0, 0, 0, 0, 0],
    ]


def test_extends_by_one():
    old_ids = th.tensor([[0, 0, 5, 6], [0, 0, 5, 6], [9, 8, 5, 6], [0, 0, 5, 6]])
    old_mask = th.tensor([[0, 0, 1, 1], [0, 0, 1, 1], [1, 1, 1, 1], [0, 0, 1, 1]])
    new_ids = th.tensor([[0, 5, 6, 7], [0, 5, 7, 7], [8, 5, 6, 7], [0, 0, 5, 6]])
    new_mask = th.tensor([[0, 1, 1, 1], [0, 1, 1, 1], [1, 1, 1, 1], [0, 0, 1, 1]])
    # row 0 extends; row 1 changed a token; row 2 lost a valid token off the left edge; row 3 did not move
    assert extends_by_one(old_ids, old_mask, new_ids, new_mask).tolist() == [
        True,
        False,
        False,
        False,
    ]


def test_left_pad_columns():
    t = th.ones(2, 1, 3, 2)
    out = left_pad_columns(t, 5)
    assert out.shape == (2, 1, 5, 2) and out[:, :, :2].abs().sum() == 0 and out[:, :, 2:].eq(1).all()
    assert left_pad_columns(t, 2) is t


def test_process_logits_matches_hand_computation():
    logits = th.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, 3.0]])
    temperature, top_k, top_p = 0.7, 4, 0.8
    # by hand: scale, keep the 4 largest, then the smallest prefix (by probability) whose mass reaches 0.8
    z = logits[0].numpy() / temperature
    keep = np.argsort(-z)[:top_k]
    p = np.exp(z[keep] - z[keep].max())
    p /= p.sum()
    order = np.argsort(-p)
    cum = np.cumsum(p[order])
    n_keep = int(np.searchsorted(cum, top_p - 1e-12) + 1)
    kept = keep[order[:n_keep]]
    expected = np.full(6, -np.inf)
    expected[kept] = z[kept] - np.log(np.exp(z[kept]).sum())
    got = th.log_softmax(process_logits(logits, temperature, top_k, top_p), -1)[0].numpy()
    assert np.array_equal(np.isinf(got), np.isinf(expected))
    np.testing.assert_allclose(got[~np.isinf(got)], expected[~np.isinf(expected)], atol=1e-6)
    # identity when all controls are off
    assert th.equal(process_logits(logits), logits)


def test_sample_categorical_draws_from_the_given_distribution():
    th.manual_seed(0)
    probs = th.softmax(2 * th.randn(3, 12), dim=-1)
    probs[1, [0, 5, 11]] = 0  # removed tokens (top-k / top-p), including the first and the last
    probs[2, :-1] = 0  # a single token left
    n = 100_000
    draws = sample_categorical(probs.repeat(n, 1)).reshape(n, 3)
    for r in range(3):
        freq = th.bincount(draws[:, r], minlength=12).double() / n
        want = (probs[r] / probs[r].sum()).double()
        assert freq[want == 0].sum() == 0  # never a token of probability 0
        # within 5 standard errors of every token's probability
        assert ((freq - want).abs() <= 5 * (want * (1 - want) / n).sqrt() + 1e-9).all(), r
    assert sample_categorical(th.tensor([[0.0, 3.0, 1.0]])).shape == (1,)  # weights need not sum to 1
    # a draw at the very top of the cdf (what float rounding of u * total can give) takes the last token that has
    # probability, never a removed token after it
    top = th.ones(3, 1)
    edge = th.tensor([[0.2, 0.5, 0.3, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0, 0.0], [0.1, 0.2, 0.3, 0.2, 0.2]])
    assert sample_categorical(edge, top).tolist() == [2, 2, 4]
    assert sample_categorical(edge, th.zeros(3, 1)).tolist() == [0, 2, 0]
    nan = sample_categorical(th.full((2, 5), math.nan))  # a broken model: in range, for the caller's check to report
    assert bool(((nan >= 0) & (nan < 5)).all())


def test_policy_log_probs_use_the_processed_distribution():
    th.manual_seed(1)
    policy = make_policy(temperature=0.5, top_k=5, top_p=0.9)
    env = text_vec_env(n_envs=3)
    obs = {k: th.as_tensor(v) for k, v in env.reset().items()}
    with th.no_grad():
        actions, _, log_prob = policy(obs)
        raw = policy._full_outputs(*policy._parse_obs(obs))[0]
        _, log_prob_eval, entropy = policy.evaluate_actions(obs, actions)
    z = raw / 0.5
    kth = z.topk(5, dim=-1).values[:, -1:]
    z = z.masked_fill(z < kth, float("-inf"))
    probs = z.softmax(-1)
    sorted_p, idx = probs.sort(-1, descending=True)
    before = sorted_p.cumsum(-1) - sorted_p  # mass strictly before each token
    keep_sorted = before < 0.9
    keep = th.zeros_like(keep_sorted).scatter(-1, idx, keep_sorted)
    hand = th.log_softmax(z.masked_fill(~keep, float("-inf")), -1)
    np.testing.assert_allclose(log_prob, hand.gather(1, actions[:, None]).squeeze(1), atol=1e-5)
    np.testing.assert_allclose(log_prob_eval, log_prob, atol=1e-5)
    p = hand.exp()
    hand_entropy = -(p * hand.clamp(min=-1e30)).sum(-1)
    np.testing.assert_allclose(entropy, hand_entropy, atol=1e-5)
    assert bool(keep.sum(-1).le(5).all())
    assert bool(th.isfinite(log_prob).all())


# ------------------------------------------------------------------------------------------------------------------
# (a) cached rollout == full recompute
# ------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "factory,group_size,kwargs",
    [
        (tiny_gpt2, 1, {"top_k": 20}),
        (tiny_llama, 2, {"top_p": 0.9}),
        (tiny_qwen2, 3, {"separate_critic": True}),
    ],
)
def test_cached_rollout_matches_full_recompute(factory, group_size, kwargs):
    th.manual_seed(0)
    policy = make_policy(factory(), **kwargs)
    env = text_vec_env(n_envs=6, group_size=group_size, seed=3)
    obs = env.reset()
    policy.set_training_mode(False)
    worst = 0.0
    n_reused = 0
    for step in range(40):
        obs_t = {k: th.as_tensor(v) for k, v in obs.items()}
        with th.no_grad():
            actions, values, log_prob = policy(obs_t)
            ref_values, ref_log_prob, _ = policy.evaluate_actions(obs_t, actions)
        worst = max(
            worst,
            (values - ref_values).abs().max().item(),
            (log_prob - ref_log_prob).abs().max().item(),
        )
        state = policy._rollout_cache.states[env.num_envs]
        assert state.kv_mask.shape[1] <= 2 * W  # bounded (at most one masked hole per replaced token)
        actions = actions.numpy().copy()
        if step % 3 == 0:  # an outside sampler (e.g. exploration mixing) replaces some tokens
            actions[:2] = np.random.default_rng(step).integers(4, V, 2)
        obs, _, dones, infos = env.step(actions)
        n_reused += int((~th.as_tensor(dones)).sum())
        for i, done in enumerate(dones):  # SB3's bootstrap on truncation: a batch of one, other cache slot
            if done and infos[i]["TimeLimit.truncated"]:
                term = policy.obs_to_tensor(infos[i]["terminal_observation"])[0]
                with th.no_grad():
                    with count_lm_calls(policy) as calls:
                        v_term = policy.predict_values(term)
                    # a look-ahead row of the batch cache (a lookup), or one token past a cached row (one step)
                    assert calls == [] or calls == [(1, 1)]
                    v_ref = policy.evaluate_actions(term, th.zeros(1, dtype=th.long))[0]
                worst = max(worst, (v_term - v_ref).abs().max().item())
        if step == 10:  # the same observation twice (predict, then forward): served from before the look-ahead
            with th.no_grad(), count_lm_calls(policy) as calls:
                v_again = policy.predict_values(obs_t)
            assert calls == [] and th.allclose(v_again, values, atol=0)
        if step == 20:  # an outside call with unrelated observations of the same batch size
            other = text_vec_env(n_envs=6, seed=99).reset()
            with th.no_grad():
                policy.predict(other)
    # SB3's final bootstrap call: served by a one-token step on the batch cache
    obs_t = {k: th.as_tensor(v) for k, v in obs.items()}
    with th.no_grad():
        v_last = policy.predict_values(obs_t)
        v_ref = policy.evaluate_actions(obs_t, th.zeros(env.num_envs, dtype=th.long))[0]
    worst = max(worst, (v_last - v_ref).abs().max().item())
    assert worst < 1e-5
    assert n_reused > 100


def test_collect_rollouts_buffer_matches_evaluate_actions():
    env = text_vec_env(n_envs=4, group_size=2, seed=5)
    model = PPO(
        CausalLMPolicy,
        env,
        n_steps=24,
        batch_size=32,
        n_epochs=1,
        seed=0,
        policy_kwargs={"model": tiny_qwen2(), "temperature": 0.8},
    )
    _, callback = model._setup_learn(24, None)
    assert model.collect_rollouts(env, callback, model.rollout_buffer, n_rollout_steps=24)
    buf = model.rollout_buffer
    # float32, as older SB3 releases store them
    obs = {k: th.as_tensor(v.reshape(-1, W)).float() for k, v in buf.observations.items()}
    actions = th.as_tensor(buf.actions.reshape(-1))
    with th.no_grad():
        values, log_prob, _ = model.policy.evaluate_actions(obs, actions)
    np.testing.assert_allclose(log_prob.numpy(), buf.log_probs.reshape(-1), atol=1e-5)
    np.testing.assert_allclose(values.numpy().reshape(-1), buf.values.reshape(-1), atol=1e-5)


def test_cache_invalidated_when_weights_change():
    policy = make_policy()
    env = text_vec_env(n_envs=3)
    obs = {k: th.as_tensor(v) for k, v in env.reset().items()}
    with th.no_grad():
        v1 = policy.predict_values(obs)
        with th.no_grad():
            policy.value_head.bias.add_(1.0)  # an in-place update, like optimizer.step()
        v2 = policy.predict_values(obs)
    np.testing.assert_allclose(v2 - v1, th.ones_like(v1), atol=1e-5)
    policy.set_training_mode(True)
    assert not policy._rollout_cache.states


def _windows(rows: list[list[int]]) -> dict[str, th.Tensor]:
    ids, mask = th.zeros(len(rows), W, dtype=th.long), th.zeros(len(rows), W, dtype=th.long)
    for b, row in enumerate(rows):
        ids[b, W - len(row) :], mask[b, W - len(row) :] = th.tensor(row), 1
    return {"input_ids": ids, "attention_mask": mask}


@pytest.mark.parametrize("factory", [tiny_gpt2, tiny_llama])
def test_a_prompt_seen_before_is_served_from_the_prefill_memo(factory):
    """A group member starting on its group's prompt a few steps after the others needs no forward for it."""
    policy = make_policy(factory())
    full = make_policy(factory(), use_cache=False)
    full.load_state_dict(policy.state_dict())
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13], [14]]
    with th.no_grad():
        actions, _, _ = policy(_windows(prompts))
        rows = [p + [int(a)] for p, a in zip(prompts, actions)]
        rows[0] = prompts[2]  # env 0 auto-reset onto the prompt env 2 began with
        with count_lm_calls(policy) as calls:
            _, values, _ = policy(_windows(rows))
        assert calls == [(4, 1)]  # only the look-ahead step: env 0's prompt came from the memo
        _, want_values, _ = full(_windows(rows))
        chosen = policy.get_distribution(_windows(rows)).distribution.logits
        np.testing.assert_allclose(chosen, full.get_distribution(_windows(rows)).distribution.logits, atol=1e-5)
        np.testing.assert_allclose(values, want_values, atol=1e-5)
        policy.value_head.bias.add_(1.0)  # new parameters: the memo is stale
        with count_lm_calls(policy) as calls:
            policy(_windows([prompts[2]] * 2))
        assert calls[0] == (1, 4)  # prefilled again (once: the two rows share the window)


# ------------------------------------------------------------------------------------------------------------------
# (b) one forward per sequence == per-transition evaluate_actions
# ------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"temperature": 0.7, "top_k": 10, "top_p": 0.95}, {"separate_critic": True}],
)
def test_evaluate_sequences_matches_evaluate_actions(kwargs):
    th.manual_seed(2)
    policy = make_policy(tiny_llama(), **kwargs)
    rng = np.random.default_rng(0)
    batch = 3
    ids = np.zeros((batch, W), np.int64)
    mask = np.zeros((batch, W), np.int64)
    act = np.zeros((batch, W), bool)
    transitions = []  # (b, j, window ids, window mask)
    for b in range(batch):
        n_prompt, n_new = (
            int(rng.integers(1, MAX_PROMPT + 1)),
            int(rng.integers(1, MAX_NEW + 1)),
        )
        seq = rng.integers(4, V, n_prompt + n_new)
        if kwargs.get("top_k"):  # actions must lie in the support of the processed distribution
            for t in range(n_new):
                window = np.zeros(W, np.int64)
                wmask = np.zeros(W, np.int64)
                prefix = seq[: n_prompt + t]
                window[W - len(prefix) :], wmask[W - len(prefix) :] = prefix, 1
                with th.no_grad():
                    a, _, _ = policy(
                        {
                            "input_ids": th.as_tensor(window[None]),
                            "attention_mask": th.as_tensor(wmask[None]),
                        }
                    )
                seq[n_prompt + t] = int(a)
        start = W - len(seq)
        ids[b, start:], mask[b, start:] = seq, 1
        act[b, start + n_prompt :] = True
        for t in range(n_new):
            window, wmask = np.zeros(W, np.int64), np.zeros(W, np.int64)
            prefix = seq[: n_prompt + t]
            window[W - len(prefix) :], wmask[W - len(prefix) :] = prefix, 1
            transitions.append((b, start + n_prompt + t, window, wmask, seq[n_prompt + t]))
    log_prob, entropy, values = policy.evaluate_sequences(th.as_tensor(ids), th.as_tensor(mask), th.as_tensor(act))
    assert log_prob.shape == entropy.shape == values.shape == (batch, W)
    obs = {
        "input_ids": th.as_tensor(np.stack([t[2] for t in transitions])).float(),
        "attention_mask": th.as_tensor(np.stack([t[3] for t in transitions])).float(),
    }
    v_ref, lp_ref, ent_ref = policy.evaluate_actions(obs, th.as_tensor([t[4] for t in transitions]))
    bj = (
        th.as_tensor([t[0] for t in transitions]),
        th.as_tensor([t[1] for t in transitions]),
    )
    np.testing.assert_allclose(log_prob[bj].detach(), lp_ref.detach(), atol=1e-5)
    np.testing.assert_allclose(entropy[bj].detach(), ent_ref.detach(), atol=1e-5)
    np.testing.assert_allclose(values[bj].detach(), v_ref.detach().squeeze(1), atol=1e-5)
    off = ~th.as_tensor(act)
    assert log_prob[off].abs().sum() == 0 and values[off].abs().sum() == 0 and entropy[off].abs().sum() == 0
    # differentiable: one backward reaches the LM and the critic
    (log_prob.sum() + values.sum()).backward()
    assert policy.lm.get_input_embeddings().weight.grad is not None
    assert policy.value_head.weight.grad is not None


# ------------------------------------------------------------------------------------------------------------------
# (c) stock SB3 algorithms train it
# ------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("factory", [tiny_gpt2, tiny_qwen2])
def test_ppo_learns_without_crashing(factory):
    env = text_vec_env(n_envs=4)
    lm = factory()
    before = lm.get_input_embeddings().weight.detach().clone()
    model = PPO(
        CausalLMPolicy,
        env,
        n_steps=16,
        batch_size=32,
        n_epochs=2,
        seed=0,
        policy_kwargs={"model": lm},
    )
    model.learn(64)
    assert model.num_timesteps >= 64
    assert not th.equal(before, model.policy.lm.get_input_embeddings().weight)  # the LM itself was trained


def test_a2c_learns_without_crashing():
    env = text_vec_env(n_envs=2)
    model = A2C(
        CausalLMPolicy,
        env,
        n_steps=4,
        seed=0,
        policy_kwargs={
            "model": tiny_llama(),
            "separate_critic": True,
            "gradient_checkpointing": True,
        },
    )
    model.policy.set_training_mode(True)
    checkpointed = [m for m in model.policy.lm.modules() if isinstance(m, GradientCheckpointingLayer)]
    assert checkpointed and all(m.training for m in checkpointed)  # checkpointing active in the update ...
    assert not any(m.training for m in model.policy.lm.modules() if isinstance(m, th.nn.Dropout))  # ... no dropout
    model.learn(16)
    assert model.num_timesteps >= 16


def test_optimizer_covers_lm_and_head_and_dropout_is_off():
    policy = make_policy()
    in_optim = {id(p) for g in policy.optimizer.param_groups for p in g["params"]}
    assert all(id(p) in in_optim for p in policy.lm.parameters())
    assert all(id(p) in in_optim for p in policy.value_head.parameters())
    policy.set_training_mode(True)
    assert not any(m.training for m in policy.lm.modules())


# ------------------------------------------------------------------------------------------------------------------
# (d) ortho_init leaves the pretrained LM alone
# ------------------------------------------------------------------------------------------------------------------


def test_ortho_init_leaves_lm_weights_untouched():
    lm = tiny_gpt2()
    before = {k: v.clone() for k, v in lm.state_dict().items()}
    policy = make_policy(lm, ortho_init=True)
    after = policy.lm.state_dict()
    assert all(th.equal(before[k], after[k]) for k in before)
    policy = make_policy(tiny_gpt2(), value_head_init_std=0.02)
    assert policy.value_head.bias.abs().sum() == 0


# ------------------------------------------------------------------------------------------------------------------
# (e) save / load
# ------------------------------------------------------------------------------------------------------------------


def _predictions(model, obs):
    with th.no_grad():
        ids, mask = model.policy._parse_obs({k: th.as_tensor(v) for k, v in obs.items()})
        logits, values = model.policy._full_outputs(ids, mask)
    return logits.numpy(), values.numpy(), model.predict(obs, deterministic=True)[0]


@pytest.mark.parametrize("algo", ["ppo", "grpo"])
def test_save_load_round_trip_from_model_object(tmp_path, algo):
    """A model object saves as its config (weights in the state dict): stock PPO through PortableModel.of(lm), GRPO
    from the bare object, which it swaps for the policy's spec itself; nothing is pickled either way."""
    env = text_vec_env(n_envs=2)
    lm = tiny_llama()
    given = PortableModel.of(lm) if algo == "ppo" else lm
    user_kwargs = {"model": given, "top_k": 7}
    cls = PPO if algo == "ppo" else functools.partial(GRPO, explore_alpha=0.0, grad_var_coef=0.0)
    model = cls(
        CausalLMPolicy,
        env,
        n_steps=8,
        batch_size=16,
        n_epochs=1,
        seed=0,
        policy_kwargs=user_kwargs,
    )
    assert user_kwargs["model"] is given and model.policy.lm is lm  # the user's dict is left alone; model used in place
    before = {k: v.clone() for k, v in model.policy.state_dict().items()}
    model.learn(16)
    after = model.policy.state_dict()
    assert any(not th.equal(before[k], after[k]) for k in before if k.startswith("lm."))  # trained, so saving matters
    path = tmp_path / f"{algo}_lm.zip"
    model.save(path)
    with zipfile.ZipFile(path) as zf:
        data = json.loads(zf.read("data"))
    kwargs = data["policy_kwargs"]
    assert ":serialized:" not in kwargs  # plain JSON: nothing pickled
    assert kwargs["model"]["config"]["model_type"] == "llama"
    loaded = (PPO if algo == "ppo" else GRPO).load(path, env=env)
    obs = env.reset()
    for a, b in zip(_predictions(model, obs), _predictions(loaded, obs), strict=True):
        np.testing.assert_array_equal(a, b)
    # the policy-level save/load (BaseModel.save) works the same way
    model.policy.save(str(tmp_path / "policy.pt"))
    policy = CausalLMPolicy.load(str(tmp_path / "policy.pt"))
    assert all(
        th.equal(a, b)
        for a, b in zip(
            policy.state_dict().values(),
            model.policy.state_dict().values(),
            strict=True,
        )
    )


def test_save_load_from_path_and_missing_directory(tmp_path):
    lm_dir = tmp_path / "lm"
    tiny_gpt2().save_pretrained(lm_dir)
    env = text_vec_env(n_envs=2)
    model = PPO(
        CausalLMPolicy,
        env,
        n_steps=8,
        batch_size=16,
        n_epochs=1,
        seed=0,
        policy_kwargs={"model": str(lm_dir)},
    )
    model.learn(16)  # weights now differ from the directory's
    model.save(tmp_path / "ppo.zip")
    loaded = PPO.load(tmp_path / "ppo.zip", env=env)
    obs = env.reset()
    for a, b in zip(_predictions(model, obs), _predictions(loaded, obs), strict=True):
        np.testing.assert_array_equal(a, b)
    shutil.rmtree(lm_dir)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        PPO.load(tmp_path / "ppo.zip", env=env)


# ------------------------------------------------------------------------------------------------------------------
# (g) bad inputs
# ------------------------------------------------------------------------------------------------------------------


def test_logits_are_the_lm_logits_of_the_action_tokens():
    """The LM's vocabulary (64) is larger than the action space (60): the policy applies only the first 60 rows of
    the output layer; the logits, log-probs and their gradients are those of the LM's full logits sliced."""
    policy = make_policy(tiny_gpt2())
    assert policy.lm_vocab == LM_V > V
    ids = th.randint(4, V, (3, 7))
    mask = th.ones_like(ids)
    hidden = policy._trunk(ids, mask, positions_from_mask(mask))
    ours = policy._logits(hidden)
    full = policy.lm(input_ids=ids, attention_mask=mask).logits[..., :V]
    th.testing.assert_close(ours, full)
    (g_ours,) = th.autograd.grad(ours.logsumexp(-1).sum(), policy.lm.lm_head.weight, retain_graph=True)
    (g_full,) = th.autograd.grad(full.logsumexp(-1).sum(), policy.lm.lm_head.weight)
    th.testing.assert_close(g_ours, g_full)


def test_vocabulary_smaller_than_action_space_is_an_error():
    with pytest.raises(ValueError, match=rf"{V - 10}.*Discrete\({V}\)"):
        make_policy(tiny_gpt2(vocab=V - 10))


def test_observation_without_required_keys_is_an_error():
    bad_space = spaces.Dict({"tokens": spaces.Box(0, V - 1, (W,), np.int64)})
    with pytest.raises(ValueError, match="input_ids.*attention_mask.*tokens"):
        CausalLMPolicy(bad_space, spaces.Discrete(V), lambda _: 1e-3, model=tiny_gpt2())
    policy = make_policy()
    with pytest.raises(ValueError, match="input_ids.*attention_mask.*tokens"):
        policy.predict_values({"tokens": th.zeros(1, W)})


def test_missing_peft_error_names_the_extra(monkeypatch):
    """Runs with and without peft installed (test_lora.py is skipped without it): the import is made to fail here."""
    import builtins

    real_import = builtins.__import__

    def no_peft(name, *args, **kwargs):
        if name == "peft" or name.startswith("peft."):
            raise ImportError("No module named 'peft'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_peft)
    with pytest.raises(ImportError, match=r"needs the optional dependency peft.*pip install .*textrl\[lora\]"):
        make_policy(lora={"r": 4, "target_modules": ["c_attn"], "fan_in_fan_out": True})


def test_missing_default_model_or_bad_path_is_clear(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        make_policy(str(tmp_path / "nope"))
    try:
        from textrl_envs.assets import lm_path

        lm_path()
    except (ImportError, AttributeError, FileNotFoundError):
        with pytest.raises(FileNotFoundError, match="bundled LM"):
            CausalLMPolicy(obs_space(), spaces.Discrete(V), lambda _: 1e-3, model=None)
    else:  # the bundled LM is built: model=None loads it
        policy = CausalLMPolicy(obs_space(), spaces.Discrete(V), lambda _: 1e-3, model=None)
        assert policy.lm_vocab >= V


def test_policy_save_load_keeps_dtype(tmp_path):
    policy = make_policy(tiny_gpt2(), dtype="bfloat16")
    assert policy.lm.dtype == th.bfloat16 and policy.value_head.weight.dtype == th.float32
    policy.save(str(tmp_path / "p.pt"))
    loaded = CausalLMPolicy.load(str(tmp_path / "p.pt"))
    assert loaded.lm.dtype == th.bfloat16
    obs = {k: th.as_tensor(v) for k, v in text_vec_env(n_envs=2).reset().items()}
    with th.no_grad():
        assert th.equal(policy.predict_values(obs), loaded.predict_values(obs))


@pytest.mark.parametrize("budget", ["none", "full after the first call"])
def test_prefill_memo_that_keeps_nothing_still_gives_the_full_recompute(budget):
    policy = make_policy()
    full = make_policy(use_cache=False)
    full.load_state_dict(policy.state_dict())
    memo = policy._rollout_cache.memo
    if budget == "none":
        memo.max_bytes = 1  # nothing fits: every prefill computes
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13], [14]]
    with th.no_grad():
        actions, _, _ = policy(_windows(prompts))
        if budget != "none":  # the memo holds the prompts but keeps no new window: a hit and a miss it cannot keep
            memo.remember = lambda *args: None
        rows = [p + [int(a)] for p, a in zip(prompts, actions)]
        rows[0], rows[1] = prompts[2], [20, 21]
        _, values, _ = policy(_windows(rows))
        _, want, _ = full(_windows(rows))
    assert len(memo) == (0 if budget == "none" else 4)
    np.testing.assert_allclose(values, want, atol=1e-5)


def test_a_model_whose_cache_cannot_be_spliced_warns_once_and_recomputes():
    """Sliding-window attention gives cache layers the rollout cache cannot splice per row: the policy says so once,
    naming the model and the cost, and recomputes every window in full (the same outputs as ``use_cache=False``)."""
    import warnings

    from transformers import MistralConfig, MistralForCausalLM

    def tiny_mistral():
        th.manual_seed(0)
        cfg = MistralConfig(vocab_size=LM_V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, sliding_window=4,
                            bos_token_id=1, eos_token_id=EOS, pad_token_id=0)  # fmt: skip
        return MistralForCausalLM(cfg)

    policy, recompute = make_policy(tiny_mistral()), make_policy(tiny_mistral(), use_cache=False)
    rng = np.random.default_rng(0)
    obs = {"input_ids": rng.integers(4, V, (3, W)), "attention_mask": np.ones((3, W), np.int64)}
    tensors = policy.obs_to_tensor(obs)[0]
    with th.no_grad():  # the rollout's mode, where the cache is used
        with pytest.warns(UserWarning, match=r"MistralForCausalLM: .*SlidingWindowLayer.*recomputes every window"):
            values = policy.predict_values(tensors)
        assert not policy._rollout_cache.supported
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # once per policy
            again = policy.predict_values(tensors)
        expected = recompute.predict_values(tensors)
    th.testing.assert_close(values, expected)
    th.testing.assert_close(again, expected)


@pytest.mark.parametrize("factory", [tiny_gpt2, tiny_llama])
def test_rows_starting_on_the_same_prompt_share_one_prefill(factory):
    """A prompt group's members that start together (the first rollout step, or the same auto-reset step) need one
    forward of their prompt, not one each; the outputs are the full recompute's."""
    policy = make_policy(factory())
    full = make_policy(factory(), use_cache=False)
    full.load_state_dict(policy.state_dict())
    prompts = [[5, 6, 7]] * 3 + [[8, 9]] * 3  # two groups of three
    with th.no_grad(), count_lm_calls(policy) as calls:
        _, values, _ = policy(_windows(prompts))
    assert calls == [(2, 3), (6, 1)]  # one row per distinct prompt (trimmed to its longest), then the look-ahead
    with th.no_grad():
        _, want, _ = full(_windows(prompts))
        np.testing.assert_allclose(values, want, atol=1e-5)
        mixed = [[5, 6, 7], [10, 11], [5, 6, 7], [10, 11]]  # one prompt from the memo, one new one twice
        with count_lm_calls(policy) as calls:
            _, values, _ = policy(_windows(mixed))
        assert calls == [(1, 2), (4, 1)]
        _, want, _ = full(_windows(mixed))
        np.testing.assert_allclose(values, want, atol=1e-5)


def test_common_prefix_length_by_brute_force():
    gen = th.Generator().manual_seed(0)
    for _ in range(200):
        lengths = th.randint(1, 9, (3,), generator=gen).tolist()
        rows = [th.randint(1, 4, (n,), generator=gen).tolist() for n in lengths]
        for row in rows[1:]:
            if th.rand(1, generator=gen) < 0.5:  # often a long shared start
                row[: len(rows[0])] = rows[0][: len(row)]
        w = _windows(rows)
        want = 0
        while want < min(map(len, rows)) - 1 and len({row[want] for row in rows}) == 1:
            want += 1
        assert common_prefix_length(w["input_ids"], w["attention_mask"]) == want, rows
    holed = _windows([[5, 6, 7], [5, 6, 8]])
    holed["attention_mask"][0, -2] = 0  # not a suffix of ones: nothing is assumed
    assert common_prefix_length(holed["input_ids"], holed["attention_mask"]) == 0


@pytest.mark.parametrize("factory", [tiny_gpt2, tiny_llama])
def test_prompts_that_begin_alike_run_their_shared_tokens_once(factory):
    """Prompts with a common start (a chat template's system message) prefill it once, then each prompt's own tokens
    over a copy of its cache; the outputs, then and at the decoding steps after, are the full recompute's."""
    policy = make_policy(factory())
    full = make_policy(factory(), use_cache=False)
    full.load_state_dict(policy.state_dict())
    system = [3, 1, 4, 1, 5, 9, 2, 6, 5]  # 9 shared tokens: at least SHARED_PREFILL_MIN
    assert len(system) >= SHARED_PREFILL_MIN
    rows = [system + [7], system + [8, 10, 11], system + [12, 13]]
    with th.no_grad():
        with count_lm_calls(policy) as calls:
            _, values, _ = policy(_windows(rows))
        assert calls == [(1, 9), (3, 3), (3, 1)]  # the shared tokens, each prompt's own ones, the look-ahead
        for step in range(3):  # the prefill's outputs, then two decoding steps (the longest row fills the window)
            _, want, _ = full(_windows(rows))
            np.testing.assert_allclose(values, want, atol=1e-5)
            logits = policy.get_distribution(_windows(rows)).distribution.logits
            np.testing.assert_allclose(logits, full.get_distribution(_windows(rows)).distribution.logits, atol=1e-5)
            if step < 2:
                rows = [row + [20 + step + b] for b, row in enumerate(rows)]  # decode on from the shared prefill
                _, values, _ = policy(_windows(rows))
        prompts = [system + [12, 13], system + [7], system + [8, 10, 11]]  # every env reset onto a prompt seen before
        with count_lm_calls(policy) as calls:
            _, values, _ = policy(_windows(prompts))
        assert calls == [(3, 1)]  # the prompts came from the prefill memo: it kept what the shared prefill computed
        np.testing.assert_allclose(values, full(_windows(prompts))[1], atol=1e-5)


@pytest.mark.parametrize("factory", [tiny_gpt2, tiny_llama])
def test_a_new_prompt_that_begins_with_a_kept_opening_runs_only_its_own_tokens(factory):
    """The shared start of a prefill is kept as an opening: an env that auto-resets onto a new prompt beginning with
    it (mid-rollout, alone) runs only the prompt's own tokens, and a later batch whose shared start extends it runs
    only the tokens after it; the outputs, then and at the decoding step after, are the full recompute's. New
    parameters drop the openings."""
    policy = make_policy(factory())
    full = make_policy(factory(), use_cache=False)
    full.load_state_dict(policy.state_dict())
    system = [3, 1, 4, 1, 5, 9, 2, 6, 5]
    prompts = [system + [7], system + [8, 10, 11], system + [12, 13]]

    def check(rows):
        _, want_values, _ = full(_windows(rows))
        np.testing.assert_allclose(policy(_windows(rows))[1], want_values, atol=1e-5)
        logits = policy.get_distribution(_windows(rows)).distribution.logits
        np.testing.assert_allclose(logits, full.get_distribution(_windows(rows)).distribution.logits, atol=1e-5)

    with th.no_grad():
        actions, _, _ = policy(_windows(prompts))
        rows = [p + [int(a)] for p, a in zip(prompts, actions)]
        rows[1] = system + [30, 31]  # env 1 auto-reset onto a prompt no env began with
        with count_lm_calls(policy) as calls:
            policy(_windows(rows))
        assert calls == [(1, 2), (3, 1)]  # its own two tokens over the kept opening, then the look-ahead
        check(rows)
        rows = [row + [40 + b] for b, row in enumerate(rows)]  # a decoding step on from it
        check(rows)
        longer = [system + [50, 51, 52], system + [50, 51, 53, 54]]  # they share 11 tokens: 9 kept, 2 to run
        with count_lm_calls(policy) as calls:
            policy(_windows(longer))
        assert calls == [(1, 2), (2, 2), (2, 1)]  # the shared tokens after the opening, each row's own, look-ahead
        check(longer)
        policy.value_head.bias.add_(1.0)  # new parameters: the openings are stale
        full.value_head.bias.add_(1.0)
        with count_lm_calls(policy) as calls:
            policy(_windows([system + [60]]))
        assert calls[0] == (1, 10)  # the whole prompt
        check([system + [60]])


@pytest.mark.parametrize("factory", [tiny_gpt2, tiny_llama])
def test_prompts_queued_ahead_join_the_next_prefill_and_are_then_copied(factory):
    """Windows queued with prefetch_prompts run in the forward of the next prefill after the first (a few at a time),
    so the episodes that start on them later copy them from the memo; the outputs are the full recompute's. New
    parameters drop the queue."""
    from sb3_grpo.policies.kv_cache import PREFETCH_ROWS

    policy = make_policy(factory())
    full = make_policy(factory(), use_cache=False)
    full.load_state_dict(policy.state_dict())
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    ahead = [[14, 15], [16, 17, 18], [19]] + [[30 + i] for i in range(PREFETCH_ROWS)]  # more than one prefill takes
    with th.no_grad():
        assert policy.prefetch_prompts(_windows(ahead + [prompts[0]])) == len(ahead) + 1
        with count_lm_calls(policy) as calls:
            actions, _, _ = policy(_windows(prompts))
        assert calls == [(3, 4), (3, 1)]  # the rollout's first prefill runs its own windows only, then the look-ahead
        rows = [p + [int(a)] for p, a in zip(prompts, actions)]
        rows[1] = [20, 21]  # env 1 starts an episode on a prompt not queued: its prefill takes PREFETCH_ROWS queued
        with count_lm_calls(policy) as calls:
            _, values, _ = policy(_windows(rows))
        assert calls == [(1 + PREFETCH_ROWS, 3), (3, 1)]  # the queue's first windows ([5, 6, 7] is in the memo)
        np.testing.assert_allclose(values, full(_windows(rows))[1], atol=1e-5)
        rows[0], rows[2] = ahead[1], ahead[2]  # two episodes start on queued prompts: copied, no forward
        with count_lm_calls(policy) as calls:
            _, values, _ = policy(_windows(rows))
        assert calls == [(3, 1)]
        np.testing.assert_allclose(values, full(_windows(rows))[1], atol=1e-5)
        logits = policy.get_distribution(_windows(rows)).distribution.logits
        np.testing.assert_allclose(logits, full.get_distribution(_windows(rows)).distribution.logits, atol=1e-5)
        assert len(policy._rollout_cache.memo.pending) == len(ahead) - (PREFETCH_ROWS - 1)
        policy.value_head.bias.add_(1.0)  # new parameters: the queue is stale
        with count_lm_calls(policy) as calls:
            policy(_windows([[40, 41], [42]]))
        assert calls[0] == (2, 2) and not policy._rollout_cache.memo.pending


def test_the_prefill_memo_assembles_shared_entries_as_padded_rows():
    """A batch assembled from memo entries (group members share one) is each entry's keys and values right-aligned
    in its rows, zeros before them: the left-padded rows concatenated."""
    from transformers import LlamaConfig

    from sb3_grpo.policies.prefill_memo import PrefillMemo
    from sb3_grpo.policies.windows import left_pad_columns

    g = th.Generator().manual_seed(0)

    def entry(n):
        layers = [(th.randn(1, 2, n, 4, generator=g), th.randn(1, 2, n, 4, generator=g)) for _ in range(3)]
        return layers, th.randn(5, generator=g), th.randn((), generator=g)

    a, b, c = entry(3), entry(5), entry(1)
    entries = [a, a, b, a, c, c, c, b, a]  # runs of one entry side by side (a group's members) and entries apart
    config = LlamaConfig(num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=2, hidden_size=8)
    cache, kv_mask, logits, values = PrefillMemo.assemble(entries, config)
    for i, layer in enumerate(cache.layers):
        for got, j in ((layer.keys, 0), (layer.values, 1)):
            want = th.cat([left_pad_columns(e[0][i][j], 5) for e in entries])
            assert th.equal(got, want)
    a_mask, b_mask, c_mask = [0, 0, 1, 1, 1], [1] * 5, [0, 0, 0, 0, 1]
    assert kv_mask.tolist() == [a_mask, a_mask, b_mask, a_mask, c_mask, c_mask, c_mask, b_mask, a_mask]
    assert th.equal(logits, th.stack([e[1] for e in entries])) and th.equal(values, th.stack([e[2] for e in entries]))


def test_the_prefill_memo_keeps_the_longest_openings_recently_used():
    from transformers import DynamicCache

    from sb3_grpo.policies.prefill_memo import MAX_OPENINGS, PrefillMemo

    def cache(n, value=0.0):
        c = DynamicCache()
        c.update(th.full((1, 2, n, 4), value), th.full((1, 2, n, 4), -value), 0)
        return c

    memo = PrefillMemo(max_bytes=10 * (2 * 2 * 12 * 4 * 4))  # keys and values of 12 tokens: a tenth of it
    assert memo.opening((1, 2, 3)) is None
    memo.remember_opening((1, 2), cache(2, 1.0))
    memo.remember_opening((1, 2, 3, 4), cache(4, 2.0))
    length, layers = memo.opening((1, 2, 3, 4, 5))
    assert length == 4 and float(layers[0][0].max()) == 2.0 and float(layers[0][1].min()) == -2.0  # the longest
    assert memo.opening((1, 2, 3))[0] == 2  # the longest it begins with
    assert memo.opening((1, 3)) is None and memo.opening((1,)) is None
    memo.remember_opening(tuple(range(100, 113)), cache(13))  # over a tenth of the budget: not kept
    assert memo.opening(tuple(range(100, 114))) is None
    for i in range(MAX_OPENINGS):
        memo.opening((1, 2, 3, 4))  # used: the last out
        memo.remember_opening((50 + i, 0), cache(2))
    assert memo.opening((1, 2, 3, 4))[0] == 4 and memo.opening((1, 2, 3)) is None  # (1, 2) was the oldest
    assert memo.opening((50 + MAX_OPENINGS - 1, 0)) is not None and memo.opening((50, 0)) is None
    memo.clear()
    assert memo.opening((1, 2, 3, 4)) is None


def test_the_prefill_memo_budget_follows_the_models_keys_and_values():
    from transformers import LlamaConfig

    from sb3_grpo.policies.prefill_memo import MEMO_MAX_BYTES, MEMO_MIN_BYTES, MEMO_TOKENS, memo_budget

    # SmolLM2-135M's shape: 30 layers, 3 key-value heads of 64: 2 * 30 * 3 * 64 * 4 bytes = 46,080 bytes a token
    smol = LlamaConfig(num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, hidden_size=576)
    assert memo_budget(smol, 4) == 46_080 * MEMO_TOKENS
    assert memo_budget(LlamaConfig(num_hidden_layers=1, num_attention_heads=1, hidden_size=8), 4) == MEMO_MIN_BYTES
    assert memo_budget(LlamaConfig(num_hidden_layers=80, num_attention_heads=64, hidden_size=8192), 2) == MEMO_MAX_BYTES
    assert make_policy()._rollout_cache.memo.max_bytes == MEMO_MIN_BYTES  # a tiny model keeps the old budget
