"""Reward redistribution (``reward_redistribution=``): the spreading rule by hand, the attention weights against a
hand computation of a tiny GPT-2's last layer, and the rewards GRPO writes into its buffer, recomputed by brute force
from the rollout's own steps (each episode's total kept, to float tolerance)."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import math

import numpy as np
import pytest
import torch as th
from helpers import quiet
from stable_baselines3.common.callbacks import BaseCallback

from sb3_grpo import GRPO
from sb3_grpo.common.rollout.redistribution import final_token_attention, redistribute_return
from textrl_envs.sb3 import make_vec_env


def test_redistribute_return_by_hand():
    np.testing.assert_allclose(redistribute_return(2.0, np.array([1.0, 3.0, 0.0, 4.0])), [0.25, 0.75, 0.0, 1.0])
    np.testing.assert_allclose(redistribute_return(-0.6, np.array([0.0, 0.0, 0.0])), [-0.2, -0.2, -0.2])  # uniform
    assert redistribute_return(1.7, np.random.default_rng(0).random(96)).sum() == pytest.approx(1.7, abs=1e-12)
    with pytest.raises(ValueError, match=">= 0"):
        redistribute_return(1.0, np.array([0.5, -0.1]))
    with pytest.raises(ValueError, match="non-empty"):
        redistribute_return(1.0, np.array([]))


def tiny_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    th.manual_seed(0)
    cfg = GPT2Config(vocab_size=11, n_positions=8, n_embd=4, n_layer=2, n_head=2, attn_implementation="sdpa")
    return GPT2LMHeadModel(cfg).eval()


def hand_attention(lm, ids, mask):
    """The last block's attention from the final position, mean over heads, by hand: ln_1, c_attn, scaled dot
    products, the causal and padding masks, softmax."""
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with th.no_grad():
        hidden = lm.transformer(input_ids=ids, attention_mask=mask, position_ids=pos, output_hidden_states=True)
    block = lm.transformer.h[-1]
    x = block.ln_1(hidden.hidden_states[-2])  # the input of the last block
    q, k, _ = block.attn.c_attn(x).split(lm.config.n_embd, dim=-1)
    heads, d = lm.config.n_head, lm.config.n_embd // lm.config.n_head
    out = []
    for b in range(ids.shape[0]):
        rows = []
        for h in range(heads):
            qh, kh = q[b, -1, h * d : (h + 1) * d], k[b, :, h * d : (h + 1) * d]
            scores = [float(qh @ kh[j]) / math.sqrt(d) if mask[b, j] else -math.inf for j in range(ids.shape[1])]
            m = max(scores)
            e = [math.exp(s - m) for s in scores]
            rows.append([v / sum(e) for v in e])
        out.append(np.mean(rows, axis=0))
    return out


def test_final_token_attention_equals_a_hand_computation():
    lm = tiny_gpt2()
    ids = th.tensor([[0, 0, 5, 3, 7, 2], [4, 9, 1, 6, 8, 10]])
    mask = th.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    got = final_token_attention(lm, ids, mask, [3, 5])
    want = hand_attention(lm, ids, mask)
    np.testing.assert_allclose(got[0], want[0][-3:], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(got[1], want[1][-5:], rtol=1e-5, atol=1e-7)
    assert lm.config._attn_implementation == "sdpa"  # the kernel is restored
    # the episode's reward spread by those weights
    spread = redistribute_return(1.5, got[0])
    np.testing.assert_allclose(spread, 1.5 * want[0][-3:] / want[0][-3:].sum(), rtol=1e-5)


def char_reward(prompts, completions, **kwargs):  # noqa: ARG001  (a reward's signature)
    return [0.3 * (len(c) % 5) - 0.4 for c in completions]


class RewardLog(BaseCallback):
    """Each rollout's raw rewards and, at its end (before the update changes the policy), the buffer's rewards and
    the brute-force expectation: each episode that ends in the rollout has its raw rewards over its rows of the
    rollout replaced by their sum times ``weights_of(policy's lm, final window, episode steps, rows)`` normalised."""

    def __init__(self, weights_of):
        super().__init__()
        self.weights_of = weights_of
        self.rollouts, self._steps, self._so_far = [], [], None

    def _on_rollout_start(self):
        self._steps = []

    def _on_step(self):
        dones, infos = self.locals["dones"].copy(), self.locals["infos"]
        finals = [info.get("terminal_observation") for info in infos]
        self._steps.append((np.array(self.locals["rewards"], dtype=np.float64), dones, finals))
        return True

    def _on_rollout_end(self):
        n_envs = len(self._steps[0][1])
        if self._so_far is None:
            self._so_far = np.zeros(n_envs, dtype=int)
        raw = np.stack([s[0] for s in self._steps])
        want, start = raw.copy(), np.zeros(n_envs, dtype=int)
        for t, (_, dones, finals) in enumerate(self._steps):
            self._so_far += 1
            for e in np.flatnonzero(dones):
                rows = t - start[e] + 1
                w = np.asarray(self.weights_of(self.model.policy.lm, finals[e], self._so_far[e], rows), np.float64)
                want[start[e] : t + 1, e] = raw[start[e] : t + 1, e].sum() * w / w.sum()
                start[e], self._so_far[e] = t + 1, 0
        self.rollouts.append((raw, self.model.rollout_buffer.rewards.copy(), want, len(self._steps)))


N_ENVS, N_STEPS, BUDGET = 4, 7, 5


def _check(rule, weights_of):
    env = make_vec_env("TextGen-v0", n_envs=N_ENVS, seed=0, max_new_tokens=BUDGET, reward=char_reward,
                       reward_worker=False)  # fmt: skip
    # gamma=0: no bootstrap value is added to a truncated episode's last reward, so the buffer holds the env's rewards
    model = quiet(GRPO("CausalLMPolicy", env, n_steps=N_STEPS, batch_size=N_STEPS * N_ENVS, n_epochs=1, gamma=0.0,
                       reward_redistribution=rule, seed=0))  # fmt: skip
    log = RewardLog(weights_of)
    model.learn(N_STEPS * N_ENVS * 3, callback=log)
    assert len(log.rollouts) == 3
    for raw, got, want, _ in log.rollouts:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got.sum(0), raw.sum(0), rtol=1e-5, atol=1e-5)  # each rollout's totals kept
        assert not np.allclose(got, raw)  # something moved


def test_uniform_redistribution_in_the_buffer_grpo_fills():
    _check("uniform", lambda _lm, _final, _steps, rows: np.ones(rows))


def test_attention_redistribution_in_the_buffer_grpo_fills():
    def weights(lm, final, steps, rows):
        ids = th.as_tensor(final["input_ids"])[None]
        mask = th.as_tensor(final["attention_mask"])[None]
        w = hand_attention(lm, ids, mask)[0][-steps:]  # the episode's completion tokens
        return w[-rows:]  # its rows of this rollout (the earlier ones were in the previous rollout)

    _check("attention", weights)


def test_bad_redistribution_arguments():
    env = make_vec_env("TextGen-v0", n_envs=2, max_new_tokens=4)
    with pytest.raises(ValueError, match="reward_redistribution"):
        GRPO("CausalLMPolicy", env, reward_redistribution="rudder", n_steps=8, batch_size=16)
    with pytest.raises(ValueError, match="interactive"):
        GRPO("CausalLMPolicy", make_vec_env("GuessNumber-v0", n_envs=2), reward_redistribution="attention",
             n_steps=8, batch_size=16)  # fmt: skip
    with pytest.raises(ValueError, match="CausalLMPolicy"):
        GRPO("MlpPolicy", "CartPole-v1", reward_redistribution="attention", n_steps=8, batch_size=8)
