"""Interactive episodes on the policy's side: the rollout cache extends a row by the action *and* the environment's
reply in one forward (equal to a full recompute), and the fast path's one-forward-per-sequence update knows whose
tokens are whose (equal to the per-transition path on the same rollout)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch as th
from test_policies import EOS, FakeTextVecEnv, V, count_lm_calls, make_policy, tiny_gpt2, tiny_llama, tiny_qwen2

from sb3_grpo.policies import extends_by_one, extension_lengths, realign_columns

# ------------------------------------------------------------------------------------------------------------------
# Pure functions
# ------------------------------------------------------------------------------------------------------------------


def test_extension_lengths_by_hand():
    old_ids = th.tensor([[0, 0, 0, 5, 6], [0, 0, 0, 5, 6], [0, 0, 0, 5, 6], [0, 9, 8, 5, 6], [0, 0, 0, 5, 6]])
    old_mask = th.tensor([[0, 0, 0, 1, 1], [0, 0, 0, 1, 1], [0, 0, 0, 1, 1], [0, 1, 1, 1, 1], [0, 0, 0, 1, 1]])
    new_ids = th.tensor([[0, 0, 5, 6, 7], [5, 6, 7, 8, 9], [0, 5, 7, 7, 7], [8, 5, 6, 1, 2], [0, 0, 0, 5, 6]])
    new_mask = th.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 1, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 1, 1]])
    # one token; three tokens (action + a 2-token reply); a changed token; a valid token lost off the left edge;
    # the same window (not an extension)
    assert extension_lengths(old_ids, old_mask, new_ids, new_mask).tolist() == [1, 3, 0, 0, 0]
    # k == 1 agrees with extends_by_one on random windows
    rng = np.random.default_rng(0)
    for _ in range(200):
        n_old = int(rng.integers(1, 6))
        old = th.zeros(1, 6, dtype=th.long)
        old[0, 6 - n_old :] = th.as_tensor(rng.integers(1, 4, n_old))
        om = (old > 0).long()
        k = int(rng.integers(1, 4))
        new = th.cat([old[:, k:], th.as_tensor(rng.integers(1, 4, (1, k)))], dim=1)
        if rng.random() < 0.3:
            new[0, int(rng.integers(6))] = int(rng.integers(0, 4))
        nm = (new > 0).long()
        got = int(extension_lengths(old, om, new, nm)[0])
        # brute force over every shift: the window moved left by k, k new valid tokens, nothing valid dropped
        truth = [
            k
            for k in range(1, 6)
            if th.equal(new[0, :-k], old[0, k:])
            and th.equal(nm[0, :-k], om[0, k:])
            and bool(nm[0, -k:].all())
            and not bool(om[0, :k].any())
        ]
        truth = truth[0] if truth else 0
        assert got == truth, (old, new)
        assert bool(extends_by_one(old, om, new, nm)[0]) == (got == 1)


def test_realign_columns_moves_unused_new_columns_to_the_front():
    kv_mask = th.tensor([[1, 1, 0, 0, 1], [0, 1, 1, 1, 1], [1, 1, 0, 0, 0]])  # body of 2, then 3 new columns
    index = realign_columns(kv_mask, tail=3, lead=th.tensor([2, 0, 3]))
    assert index.tolist() == [[2, 3, 0, 1, 4], [0, 1, 2, 3, 4], [2, 3, 4, 0, 1]]
    assert kv_mask.gather(1, index).tolist() == [[0, 0, 1, 1, 1], [0, 1, 1, 1, 1], [0, 0, 0, 1, 1]]


# ------------------------------------------------------------------------------------------------------------------
# A fake interactive env: the env writes a reply of 1-3 tokens into the window after some actions
# ------------------------------------------------------------------------------------------------------------------

MAX_REPLY = 3


class FakeTurnVecEnv(FakeTextVecEnv):
    """:class:`FakeTextVecEnv` whose env answers: after an action ``a`` with ``a % 4 == 0`` (a turn end) it appends a
    reply of ``1 + a % 3`` tokens. Every token after the prompt counts against ``max_new``; a reply may overshoot it,
    which pushes the oldest tokens out on the left and ends the episode (truncated). Episodes also end at EOS."""

    def __init__(self, **kwargs):
        kwargs.setdefault("max_prompt", 2)  # W = 14, the width make_policy expects
        kwargs.setdefault("max_new", 12)
        super().__init__(**kwargs)
        self.replies = 0

    def _append(self, env: int, tokens) -> None:
        k = len(tokens)
        self.ids[env] = np.roll(self.ids[env], -k)
        self.mask[env] = np.roll(self.mask[env], -k)
        self.ids[env, -k:], self.mask[env, -k:] = tokens, 1

    def step_wait(self):
        rewards = np.zeros(self.num_envs, np.float32)
        dones = np.zeros(self.num_envs, bool)
        infos = [{} for _ in range(self.num_envs)]
        for env, a in enumerate(self._actions.tolist()):
            self._append(env, [a])
            self.generated[env] += 1
            if a % 4 == 0 and a != EOS:
                reply = [4 + (a + i) % (self.vocab - 4) for i in range(1 + a % 3)]
                self._append(env, reply)
                self.generated[env] += len(reply)
                self.replies += 1
                rewards[env] = 0.1 * len(reply)
            eos, out_of_budget = a == EOS, self.generated[env] >= self.max_new
            if eos or out_of_budget:
                dones[env] = True
                infos[env]["terminal_observation"] = {
                    "input_ids": self.ids[env].copy(),
                    "attention_mask": self.mask[env].copy(),
                }
                infos[env]["TimeLimit.truncated"] = bool(out_of_budget and not eos)
                self.episode[env] += 1
                self._reset_row(env)
        return self._obs(), rewards, dones, infos


# ------------------------------------------------------------------------------------------------------------------
# The cache: one forward over the k new tokens == a full recompute
# ------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "factory,group_size,kwargs",
    [(tiny_gpt2, 1, {}), (tiny_llama, 2, {"top_k": 20}), (tiny_qwen2, 3, {"separate_critic": True})],
)
def test_cache_extended_by_replies_equals_full_recompute(factory, group_size, kwargs):
    th.manual_seed(0)
    policy = make_policy(factory(), **kwargs)
    env = FakeTurnVecEnv(n_envs=6, group_size=group_size, seed=4)
    width = env.width
    obs = env.reset()
    policy.set_training_mode(False)
    worst, multi, calls_all = 0.0, 0, []
    rng = np.random.default_rng(1)
    for step in range(60):
        obs_t = {k: th.as_tensor(v) for k, v in obs.items()}
        with th.no_grad(), count_lm_calls(policy) as calls:
            actions, values, log_prob = policy(obs_t)
        calls_all += calls
        multi += sum(1 for b, n in calls if b == env.num_envs and n > 1)
        with th.no_grad():
            ref_values, ref_log_prob, _ = policy.evaluate_actions(obs_t, actions)
        worst = max(worst, (values - ref_values).abs().max().item(), (log_prob - ref_log_prob).abs().max().item())
        state = policy._rollout_cache.states[env.num_envs]
        assert state.kv_mask.shape[1] <= 2 * width  # realigned: the unused new columns are cropped, not kept as holes
        actions = actions.numpy().copy()
        turn_end = rng.random(env.num_envs) < 0.35  # end turns often (the tiny random LMs rarely pick a % 4 == 0)
        actions[turn_end] = 4 * rng.integers(1, V // 4, int(turn_end.sum()))
        if step % 7 == 0:
            actions[0] = EOS
        obs, _, dones, infos = env.step(actions)
        for i, done in enumerate(dones):  # SB3's bootstrap on truncation (a terminal window may have overflowed)
            if done and infos[i]["TimeLimit.truncated"]:
                term = policy.obs_to_tensor(infos[i]["terminal_observation"])[0]
                with th.no_grad():
                    v_term = policy.predict_values(term)
                    v_ref = policy.evaluate_actions(term, th.zeros(1, dtype=th.long))[0]
                worst = max(worst, (v_term - v_ref).abs().max().item())
    assert worst < 1e-5
    assert env.replies > 40 and multi > 10, (env.replies, multi)  # replies were served by multi-token extensions
    # never a full recompute of a long window: every forward covers at most a reply, or a (short) prompt
    assert max(n for _, n in calls_all) <= max(1 + MAX_REPLY, env.max_prompt)  # a replaced action + its reply
