"""Shared prefixes in ``evaluate_actions``: the plan against a brute-force search, and the shared forward against one
forward row per window (outputs, gradients, and a stock ``PPO`` update)."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch as th
from helpers import params, quiet
from stable_baselines3 import PPO
from test_policies import V, W, count_lm_calls, make_policy, tiny_gpt2, tiny_llama

from sb3_grpo import CausalLMPolicy
from sb3_grpo.policies.windows import shared_prefixes
from textrl_envs.sb3 import make_vec_env


def episode_windows(seed: int, episodes: int = 4, per_episode: int = 5, strangers: int = 3):
    """Right-aligned windows: several states of a few episodes (prefixes of one another, some repeated), episodes
    that share a prompt but then differ, and unrelated rows; shuffled like an SB3 minibatch."""
    rng = np.random.default_rng(seed)
    rows = []
    prompt = rng.integers(4, V, 3).tolist()
    for e in range(episodes):
        tokens = (prompt if e % 2 else rng.integers(4, V, int(rng.integers(1, 4))).tolist()) + rng.integers(
            4, V, W
        ).tolist()
        tokens = tokens[:W]
        for _ in range(per_episode):
            rows.append(tokens[: int(rng.integers(1, W + 1))])
    rows += [rng.integers(4, V, int(rng.integers(1, W + 1))).tolist() for _ in range(strangers)]
    rng.shuffle(rows)
    ids = np.zeros((len(rows), W), np.int64)
    mask = np.zeros((len(rows), W), np.int64)
    for b, r in enumerate(rows):
        ids[b, W - len(r) :], mask[b, W - len(r) :] = r, 1
    return th.as_tensor(ids), th.as_tensor(mask), rows


@pytest.mark.parametrize("seed", range(20))
def test_plan_matches_a_brute_force_prefix_search(seed):
    ids, mask, rows = episode_windows(seed)
    plan = shared_prefixes(ids, mask)
    is_prefix = [[len(a) <= len(b) and b[: len(a)] == a for b in rows] for a in rows]
    maximal = {i for i in range(len(rows)) if not any(is_prefix[i][j] and rows[j] != rows[i] for j in range(len(rows)))}
    assert plan is not None
    parents, parent_of, column = (t.tolist() for t in plan)
    assert parents == sorted(parents) and len(set(parents)) == len(parents)
    # every parent is a window that is a prefix of no other (duplicates of one window: one of them)
    assert {tuple(rows[p]) for p in parents} == {tuple(rows[i]) for i in maximal}
    assert len(parents) == len({tuple(rows[i]) for i in maximal})
    width = max(len(r) for r in rows)
    for b, r in enumerate(rows):
        p = rows[parents[parent_of[b]]]
        assert is_prefix[b][parents[parent_of[b]]]
        start = width - len(p)  # the parent's first token in the trimmed window
        assert column[b] == start + len(r) - 1
        assert p[column[b] - start] == r[-1]


def test_plan_is_none_when_nothing_is_shared_or_a_mask_has_holes():
    ids = th.tensor([[0, 5, 6], [0, 7, 8], [9, 10, 11]])
    mask = (ids > 0).long()
    assert shared_prefixes(ids, mask) is None  # no row is a prefix of another
    assert shared_prefixes(ids[:1], mask[:1]) is None
    holes = th.tensor([[1, 0, 1], [0, 1, 1]])
    assert shared_prefixes(th.tensor([[5, 0, 6], [0, 5, 6]]), holes) is None
    twins = shared_prefixes(th.tensor([[0, 5, 6], [0, 5, 6]]), th.tensor([[0, 1, 1], [0, 1, 1]]))
    assert len(twins[0]) == 1 and twins[1].tolist() == [0, 0] and twins[2].tolist() == [1, 1]  # one forward


@pytest.mark.parametrize("build,separate_critic", [(tiny_gpt2, False), (tiny_llama, False), (tiny_gpt2, True)])
def test_shared_forward_equals_one_row_per_window_with_gradients(build, separate_critic):
    shared = make_policy(build(), separate_critic=separate_critic)
    plain = make_policy(build(), separate_critic=separate_critic, share_prefixes=False)
    plain.load_state_dict(shared.state_dict())
    ids, mask, rows = episode_windows(0)
    obs = {"input_ids": ids, "attention_mask": mask}
    actions = th.as_tensor(np.random.default_rng(1).integers(0, V, len(rows)))
    with count_lm_calls(shared) as calls:
        got = shared.evaluate_actions(obs, actions)
    plan = shared_prefixes(ids, mask)
    assert calls == [(len(plan[0]), max(len(r) for r in rows))]  # one forward of the parent windows only
    assert len(plan[0]) < len(rows)
    with count_lm_calls(plain) as calls:
        want = plain.evaluate_actions(obs, actions)
    assert calls[0][0] == len(rows)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a.detach(), b.detach(), atol=2e-5)
    for policy, out in ((shared, got), (plain, want)):
        policy.optimizer.zero_grad()
        (out[1].sum() + 0.5 * (out[0] ** 2).sum() - 0.01 * out[2].sum()).backward()
    for (name, p), q in zip(shared.named_parameters(), plain.parameters()):
        if p.grad is None:
            assert q.grad is None, name
            continue
        np.testing.assert_allclose(p.grad, q.grad, atol=2e-5, rtol=1e-4, err_msg=name)


def test_a_wrong_column_would_be_caught(monkeypatch):
    """The equality above is not vacuous: reading the parents one column off changes the outputs."""
    import sb3_grpo.policies.causal_lm as causal_lm

    policy = make_policy(tiny_gpt2())
    ids, mask, _ = episode_windows(0)
    parents, parent_of, column = shared_prefixes(ids, mask)
    with th.no_grad():
        want = policy._full_outputs(ids, mask)[0]
        assert th.allclose(policy._shared_outputs(ids, mask)[0], want, atol=2e-5)
        monkeypatch.setattr(causal_lm, "shared_prefixes", lambda i, m: (parents, parent_of, (column - 1).clamp(min=0)))
        shifted = policy._shared_outputs(ids, mask)[0]
    assert not th.allclose(shifted, want, atol=1e-3)


def test_stock_ppo_update_is_the_same_with_and_without_shared_prefixes():
    """Stock SB3 PPO on TextGen-v0 (random minibatches of single-token windows): the same parameters after two
    updates, to float rounding, and the shared run's forwards had fewer rows."""
    hp = {"n_steps": 12, "batch_size": 16, "n_epochs": 2, "learning_rate": 1e-3, "seed": 3, "device": "cpu"}

    def run(share: bool):
        env = make_vec_env("TextGen-v0", n_envs=4, seed=0, device="cpu", max_new_tokens=8)
        model = quiet(PPO(CausalLMPolicy, env, policy_kwargs={"share_prefixes": share}, **hp))
        rows = []
        hook = model.policy.lm.base_model.register_forward_pre_hook(
            lambda _m, _a, kw: rows.append(kw["input_ids"].shape[0]) if th.is_grad_enabled() else None,
            with_kwargs=True,
        )
        model.learn(2 * 12 * 4)
        hook.remove()
        return model, sum(rows)

    (shared, shared_rows), (plain, plain_rows) = run(True), run(False)
    assert shared.policy.share_prefixes and not plain.policy.share_prefixes
    assert shared_rows < plain_rows
    a, b = params(shared), params(plain)
    for k in a:
        th.testing.assert_close(a[k], b[k], atol=5e-6, rtol=1e-5)
