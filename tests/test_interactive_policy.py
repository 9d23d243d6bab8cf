"""Interactive episodes on the policy's side: the rollout cache extends a row by the action *and* the environment's
reply in one forward (equal to a full recompute), and the fast path's one-forward-per-sequence update knows whose
tokens are whose (equal to the per-transition path on the same rollout)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch as th
from test_policies import (
    EOS,
    MAX_NEW,
    MAX_PROMPT,
    PROMPTS,
    V,
    W,
    count_lm_calls,
    make_policy,
    tiny_gpt2,
    tiny_llama,
    tiny_qwen2,
    vocab_tokenizer,
)

from sb3_grpo.grpo.extras import EXTRAS_OFF
from sb3_grpo.policies import extends_by_one, extension_lengths, realign_columns
from sb3_grpo.policies.kv_cache import extension_pays
from textrl_envs.interaction import Interaction, Reply
from textrl_envs.sb3 import make_vec_env

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
# The real text env, interactive: the env writes a reply of 1-3 words after each turn
# ------------------------------------------------------------------------------------------------------------------

MAX_REPLY = 3


class Chatter(Interaction):
    """Replies ``1 + len(text) % 3`` words to every turn (deterministic in the turn's text), never ends the episode:
    episodes end at ``max_turns`` or when the budget is spent, sometimes by a reply that overshoots it (which pushes
    the oldest tokens out of the final window)."""

    def reply(self, state, text, turn):
        words = [f"w{4 + (len(text) * 7 + turn + i) % (V - 4)}" for i in range(1 + len(text) % MAX_REPLY)]
        return Reply(" ".join(words), reward=0.1 * turn)


def turn_vec_env(n_envs=6, group_size=1, seed=0, max_new=MAX_NEW):
    """:func:`test_policies.text_vec_env` made interactive: turns of at most 2 tokens, each answered by
    :class:`Chatter`, up to 4 turns, every token after the prompt counted against ``max_new``."""
    return make_vec_env(
        None,
        n_envs=n_envs,
        group_size=group_size,
        device="cpu",
        seed=seed,
        prompts=PROMPTS,
        interaction=Chatter(),
        max_turns=4,
        max_turn_tokens=2,
        tokenizer=vocab_tokenizer(),
        max_prompt_tokens=MAX_PROMPT,
        max_new_tokens=max_new,
    )


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
    policy._rollout_cache.cheaper_path = False  # always extend (these windows are short enough to be recomputed)
    env = turn_vec_env(n_envs=6, group_size=group_size, seed=4)
    width = MAX_PROMPT + MAX_NEW
    replies = 0
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
        if step % 3 == 0:  # an outside sampler (e.g. exploration mixing) replaces some tokens, EOS among them
            actions[:2] = rng.integers(4, V, 2)
            actions[2] = EOS
        obs, rewards, dones, infos = env.step(actions)
        replies += int((rewards > 0).sum())
        for i, done in enumerate(dones):  # SB3's bootstrap on truncation (a terminal window may have overflowed)
            if done and infos[i]["TimeLimit.truncated"]:
                term = policy.obs_to_tensor(infos[i]["terminal_observation"])[0]
                with th.no_grad():
                    v_term = policy.predict_values(term)
                    v_ref = policy.evaluate_actions(term, th.zeros(1, dtype=th.long))[0]
                worst = max(worst, (v_term - v_ref).abs().max().item())
    assert worst < 1e-5
    assert replies > 40 and multi > 10, (replies, multi)  # the replies were served by multi-token extensions
    # never a full recompute of a long window: every forward covers at most a reply, or a (short) prompt
    assert max(n for _, n in calls_all) <= max(1 + MAX_REPLY, MAX_PROMPT)  # a replaced action + its reply


# ------------------------------------------------------------------------------------------------------------------
# The fast path: the agent's positions only, equal to the per-transition path on the same rollout
# ------------------------------------------------------------------------------------------------------------------

FAST_OFF = {k: v for k, v in EXTRAS_OFF.switches().items() if k != "advantage"}


def _guess_env(seed=0, group_size=2):
    from textrl_envs.sb3 import make_vec_env

    return make_vec_env("GuessNumber-v0", n_envs=4, group_size=group_size, seed=seed, device="cpu")


def _grpo(advantage="gae", **kw):
    from helpers import quiet
    from test_sequence_path import HP

    from sb3_grpo import GRPO

    return quiet(GRPO("CausalLMPolicy", _guess_env(), **{**HP, **kw}, **{**FAST_OFF, "advantage": advantage}))


def test_sequences_put_each_action_after_its_observation_and_skip_the_replies():
    from helpers import collect_rollout
    from test_sequence_path import N_ENVS, N_STEPS

    from sb3_grpo.common.buffers import episode_segments

    model = _grpo()
    buf = collect_rollout(model, N_STEPS)
    seg = episode_segments(buf.episode_starts)
    samples = buf.sequence_samples(seg)
    w = buf.token_ids.shape[-1]
    seen, env_tokens = set(), 0
    for s in range(len(seg)):
        cols = th.nonzero(samples.action_mask[s]).flatten().tolist()
        valid = th.nonzero(samples.attention_mask[s]).flatten()
        first_action = cols[0]
        env_tokens += sum(1 for j in range(first_action, w) if j not in cols)  # replies between the actions
        for j in cols:
            flat = int(samples.index[s, j])
            env, step = divmod(flat, N_STEPS)
            seen.add(flat)
            obs_ids, obs_mask = buf.token_ids[step, env], buf.token_mask[step, env]
            n = int(obs_mask.sum())
            # the state before the action is exactly the n tokens left of it in the final window
            assert th.equal(obs_ids[w - n :], samples.input_ids[s, j - n : j]) and int(valid[0]) <= j - n
            assert int(samples.input_ids[s, j]) == int(buf.actions[step, env, 0])
            assert float(samples.advantages[s, j]) == pytest.approx(float(buf.advantages[step, env]))
            assert float(samples.returns[s, j]) == pytest.approx(float(buf.returns[step, env]))
            assert float(samples.old_values[s, j]) == pytest.approx(float(buf.values[step, env]))
            assert float(samples.old_log_prob[s, j]) == pytest.approx(float(buf.log_probs[step, env]))
    assert seen == set(range(N_STEPS * N_ENVS)), "every transition appears exactly once"
    assert env_tokens > 20, "the rollout should hold the env's replies between the agent's tokens"


@pytest.mark.parametrize("advantage", ["gae", "group"])
def test_interactive_update_is_the_same_on_both_paths(advantage):
    """GuessNumber-v0, one rollout, one minibatch per epoch: the fast path's update (one forward per sequence, the
    env's tokens as context, packed) equals the per-transition path's, for GAE and for group advantages."""
    from helpers import collect_rollout, params, per_transition_copy
    from stable_baselines3.common.buffers import DictRolloutBuffer
    from test_sequence_path import N_ENVS, N_STEPS

    hp = {"batch_size": N_STEPS * N_ENVS, "n_epochs": 2, "seed": 2}  # a seed whose groups' returns differ
    if advantage != "gae":
        hp["carry_over"] = False  # it holds the fast path's straddling steps only
    fast = _grpo(advantage, **hp)
    slow = _grpo(advantage, rollout_buffer_class=DictRolloutBuffer, **hp)
    slow.policy.load_state_dict(fast.policy.state_dict())
    buf = collect_rollout(fast, N_STEPS)
    assert buf.rewards.any() and np.abs(buf.advantages).sum() > 0
    slow.rollout_buffer = per_transition_copy(slow, buf)
    # the outputs themselves first: per position, the same numbers as evaluate_actions on the stored windows
    batch = next(fast.batch_source.minibatches(buf, N_STEPS * N_ENVS))
    with th.no_grad():
        values, log_prob, entropy = fast.batch_source.evaluate(batch)
        index = batch.inputs.index[batch.inputs.action_mask]
        env, step = index // N_STEPS, index % N_STEPS
        obs = {"input_ids": buf.token_ids[step, env], "attention_mask": buf.token_mask[step, env]}
        ref_values, ref_log_prob, ref_entropy = fast.policy.evaluate_actions(obs, batch.actions)
    th.testing.assert_close(log_prob, ref_log_prob, atol=1e-5, rtol=1e-5)
    th.testing.assert_close(entropy, ref_entropy, atol=1e-5, rtol=1e-5)
    th.testing.assert_close(values, ref_values.flatten(), atol=1e-5, rtol=1e-5)
    th.testing.assert_close(log_prob, batch.old_log_prob, atol=1e-5, rtol=1e-5)  # the rollout's (cached) log-probs
    before = params(fast)
    fast.train()
    slow.train()
    after_fast, after_slow = params(fast), params(slow)
    assert any(not th.equal(before[k], after_fast[k]) for k in before)
    for k in after_fast:
        th.testing.assert_close(after_fast[k], after_slow[k], atol=2e-6, rtol=1e-5)
    for key in ("train/policy_gradient_loss", "train/value_loss", "train/entropy_loss", "train/loss"):
        assert fast.logger.name_to_value[key] == pytest.approx(slow.logger.name_to_value[key], rel=1e-5, abs=1e-6)


def test_packing_applies_to_interactive_sequences():
    """Interactive sequences (actions with the env's replies between them) pack like single-turn ones: the packed
    forward runs on fewer rows and gives the padded forward's log-probs, entropies and values."""
    from helpers import collect_rollout
    from test_sequence_path import N_ENVS, N_STEPS

    from sb3_grpo import CausalLMPolicy

    model = _grpo()
    buf = collect_rollout(model, N_STEPS)
    seq = next(model.batch_source.minibatches(buf, N_STEPS * N_ENVS)).inputs
    ids, mask, act = [seq.input_ids], [seq.attention_mask], [seq.action_mask]
    w = ids[0].shape[1]
    for s in range(ids[0].shape[0]):  # and each sequence cut after its second action: a ragged batch
        cols = th.nonzero(seq.action_mask[s]).flatten()
        if len(cols) < 2:
            continue
        cut = int(cols[1]) + 1
        shift = w - cut
        row_ids, row_mask, row_act = (
            th.zeros_like(x[:1, :]) for x in (seq.input_ids, seq.attention_mask, seq.action_mask)
        )
        row_ids[0, shift:], row_mask[0, shift:], row_act[0, shift:] = (
            x[s, :cut] for x in (seq.input_ids, seq.attention_mask, seq.action_mask)
        )
        ids.append(row_ids), mask.append(row_mask), act.append(row_act)
    ids, mask, act = th.cat(ids), th.cat(mask), th.cat(act)
    padded = CausalLMPolicy(model.observation_space, model.action_space, lambda _: 1e-3, pack_sequences=False)
    padded.load_state_dict(model.policy.state_dict())
    with th.no_grad(), count_lm_calls(model.policy) as calls:
        packed_out = model.policy.evaluate_sequences(ids, mask, act)
    assert calls[0][0] < ids.shape[0] and model.policy._packing_verified  # the packed forward ran, on fewer rows
    with th.no_grad():
        padded_out = padded.evaluate_sequences(ids, mask, act)
    for a, b in zip(packed_out, padded_out):
        th.testing.assert_close(a, b, atol=2e-5, rtol=1e-5)


def test_fast_path_refuses_windows_that_do_not_nest():
    """A rollout whose windows lost tokens on the left while the agent acted cannot be rebuilt from one final window:
    the sequence buffer says so instead of training on wrong contexts."""
    from gymnasium import spaces

    from sb3_grpo.common.buffers import SequenceRolloutBuffer

    width = 8
    space = spaces.Dict({k: spaces.Box(0, V - 1, (width,), np.int64) for k in ("input_ids", "attention_mask")})
    windows = {  # case 0 appends: an action, then an action and a 2-token reply; case 1 then also loses token 5
        0: [[0, 0, 0, 0, 0, 0, 5, 6], [0, 0, 0, 0, 0, 5, 6, 7], [0, 0, 5, 6, 7, 8, 9, 10]],
        1: [[0, 0, 0, 0, 0, 0, 5, 6], [0, 0, 0, 0, 0, 5, 6, 7], [0, 0, 0, 6, 7, 8, 9, 10]],
    }
    actions = [7, 8, 4]
    for case, want in ((0, None), (1, "needs every step's observation to be the beginning")):
        buf = SequenceRolloutBuffer(3, space, spaces.Discrete(V), "cpu", n_envs=1)
        for t in range(3):
            ids = np.array([windows[case][t]])
            obs = {"input_ids": ids, "attention_mask": (ids > 0).astype(np.int64)}
            one = th.zeros(1)
            buf.add(obs, np.array([[actions[t]]]), np.zeros(1), np.array([t == 0]), one, one)
        buf.compute_returns_and_advantage(th.zeros(1), np.zeros(1))
        if want is None:
            seq = next(buf.get_sequences())
            assert seq.input_ids[0].tolist() == [0, 5, 6, 7, 8, 9, 10, 4]
            assert seq.action_mask[0].tolist() == [False] * 3 + [True, True, False, False, True]  # 9, 10: the reply
        else:
            with pytest.raises(ValueError, match=want):
                next(buf.get_sequences())


def test_extension_pays_by_hand():
    # the multi-token step runs every row over `tail` columns: batch * (tail - 1) positions beyond a one-token step
    assert extension_pays(tail=3, batch=6, redo_positions=13)  # 12 < 13: extend
    assert not extension_pays(tail=3, batch=6, redo_positions=12)  # a prefill of 12 positions is no dearer
    assert not extension_pays(tail=8, batch=16, redo_positions=60)  # a large batch, one short reply row


@pytest.mark.parametrize("length,extends", [(13, True), (8, False)])
def test_a_reply_row_is_extended_or_recomputed_whichever_computes_fewer_positions(length, extends):
    """Row 0 adds 3 tokens (an action and a 2-token reply), the others one: extended in one step over the batch when
    that is fewer positions than a prefill of row 0's window, else row 0 is prefilled alone. Same outputs."""
    th.manual_seed(0)
    policy = make_policy(tiny_gpt2())
    policy.set_training_mode(False)
    batch, rng = 6, np.random.default_rng(0)
    ids, mask = th.zeros(batch, W, dtype=th.long), th.zeros(batch, W, dtype=th.long)
    for b in range(batch):
        n = length - 3 if b == 0 else 6
        ids[b, W - n :], mask[b, W - n :] = th.as_tensor(rng.integers(4, V, n)), 1
    with th.no_grad():
        policy.get_distribution({"input_ids": ids, "attention_mask": mask})  # the cache holds these windows
    grow = th.as_tensor(rng.integers(4, V, (batch, 3)))
    new_ids = th.cat([ids[:, 3:], grow], dim=1)
    new_mask = th.cat([mask[:, 3:], th.ones(batch, 3, dtype=th.long)], dim=1)
    for b in range(1, batch):  # one token for the others
        new_ids[b], new_mask[b] = th.cat([ids[b, 1:], grow[b, :1]]), th.cat([mask[b, 1:], th.ones(1, dtype=th.long)])
    assert int(new_mask[0].sum()) == length
    obs = {"input_ids": new_ids, "attention_mask": new_mask}
    with th.no_grad(), count_lm_calls(policy) as calls:
        got = policy.get_distribution(obs).distribution.logits
    if extends:
        assert calls == [(batch, 3)]  # one step over the batch, 3 new columns
    else:
        assert sorted(calls) == [(1, length), (batch, 1)]  # row 0 prefilled; the others' one-token step
    with th.no_grad():
        want = policy.evaluate_actions(obs, th.zeros(batch, dtype=th.long))[1]  # log-prob of token 0, full recompute
    th.testing.assert_close(got.log_softmax(-1)[:, 0], want, atol=1e-5, rtol=1e-5)
