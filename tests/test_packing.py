"""Packed update forward: the layout functions, and packed == padded evaluate_sequences (values and gradients)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch as th
from test_policies import V, W, count_lm_calls, make_policy, tiny_gpt2, tiny_llama, tiny_qwen2

from sb3_grpo.policies.packing import first_fit_decreasing, packed_batch, suffix_lengths

# -- layout -------------------------------------------------------------------------------------------------------


def test_suffix_lengths():
    mask = th.tensor([[0, 0, 1, 1], [1, 1, 1, 1], [0, 0, 0, 1]])
    assert suffix_lengths(mask).tolist() == [2, 4, 1]
    assert suffix_lengths(th.tensor([[0, 1, 0, 1]])) is None  # a hole: not right-aligned
    assert suffix_lengths(th.tensor([[1, 1, 0, 0]])) is None  # left-aligned


def test_first_fit_decreasing_is_a_valid_tight_layout():
    rng = np.random.default_rng(0)
    for _ in range(50):
        capacity = int(rng.integers(1, 30))
        lengths = rng.integers(1, capacity + 1, int(rng.integers(1, 40)))
        row, offset, rows = first_fit_decreasing(lengths, capacity)
        slots = np.zeros((rows, capacity), dtype=np.int64)
        for r, o, n in zip(row, offset, lengths):
            assert 0 <= o and o + n <= capacity
            slots[r, o : o + n] += 1
        assert slots.max() == 1  # no overlap
        assert rows <= max(1, -(-2 * lengths.sum() // capacity))  # first fit uses at most twice the minimum
        assert rows >= -(-lengths.sum() // capacity)
    assert first_fit_decreasing(np.array([3, 1, 2, 2]), 4)[2] == 2  # 3+1, 2+2
    with pytest.raises(ValueError, match="1..4"):
        first_fit_decreasing(np.array([5]), 4)


def test_packed_batch_matches_a_brute_force_construction():
    ids = th.tensor([[0, 0, 5, 6], [7, 8, 9, 10], [0, 0, 0, 11], [0, 12, 13, 14]])
    lengths = suffix_lengths((ids > 0).long())
    batch = packed_batch(ids, lengths, 4)
    for mask_dtype in (th.bool, th.float32):
        other = packed_batch(ids, lengths, 4, mask_dtype)
        assert th.equal(other.input_ids, batch.input_ids)
        if mask_dtype == th.float32:
            assert th.equal(other.attention_mask == 0, batch.attention_mask)
    seqs = [[5, 6], [7, 8, 9, 10], [11], [12, 13, 14]]
    for b, seq in enumerate(seqs):
        r, o = int(batch.row[b]), int(batch.offset[b])
        assert batch.input_ids[r, o : o + len(seq)].tolist() == seq
        assert batch.position_ids[r, o : o + len(seq)].tolist() == list(range(len(seq)))
    # brute force mask: slot q attends to slot k iff same segment and k <= q; unused slots only to themselves
    owner = th.full(batch.input_ids.shape, -1)
    for b, seq in enumerate(seqs):
        owner[int(batch.row[b]), int(batch.offset[b]) : int(batch.offset[b]) + len(seq)] = b
    rows, cap = owner.shape
    for r in range(rows):
        for q in range(cap):
            for k in range(cap):
                want = (owner[r, q] >= 0 and owner[r, q] == owner[r, k] and k <= q) or (owner[r, q] < 0 and q == k)
                assert bool(batch.attention_mask[r, 0, q, k]) == want


# -- packed == padded ---------------------------------------------------------------------------------------------


def ragged_batch(seed: int = 0, batch: int = 10):
    """Right-aligned windows of very different lengths (most short), actions after a random prompt."""
    rng = np.random.default_rng(seed)
    ids = np.zeros((batch, W), np.int64)
    mask = np.zeros((batch, W), np.int64)
    act = np.zeros((batch, W), bool)
    for b in range(batch):
        n = int(rng.integers(2, 6)) if b else W  # one full-width row; the others pack several to a row
        ids[b, W - n :], mask[b, W - n :] = rng.integers(4, V, n), 1
        act[b, W - n + int(rng.integers(1, n)) :] = True
    return th.as_tensor(ids), th.as_tensor(mask), th.as_tensor(act)


def eager_gpt2():
    return tiny_gpt2(attn_implementation="eager")


@pytest.mark.parametrize("build", [tiny_gpt2, tiny_llama, tiny_qwen2, eager_gpt2])
def test_packed_forward_equals_padded_forward_and_gradients(build):
    packed, padded = make_policy(build()), make_policy(build(), pack_sequences=False)
    padded.load_state_dict(packed.state_dict())
    ids, mask, act = ragged_batch()
    with count_lm_calls(packed) as calls, warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback warning
        out_packed = packed.evaluate_sequences(ids, mask, act)
    assert calls[0][0] < ids.shape[0] and calls[0][1] == W  # the packed forward ran: fewer rows
    assert packed.pack_sequences and packed._packing_verified
    out_padded = padded.evaluate_sequences(ids, mask, act)
    for a, b in zip(out_packed, out_padded):
        np.testing.assert_allclose(a.detach(), b.detach(), atol=2e-5)
    # gradients of a loss on all three outputs
    for policy, out in ((packed, out_packed), (padded, out_padded)):
        policy.optimizer.zero_grad()
        (out[0].sum() + 0.1 * out[1].sum() + (out[2] ** 2).sum()).backward()
    for (name, p), q in zip(packed.named_parameters(), padded.parameters()):
        if p.grad is None:
            assert q.grad is None, name
            continue
        np.testing.assert_allclose(p.grad, q.grad, atol=2e-5, rtol=1e-4, err_msg=name)


def test_packing_skipped_when_it_would_not_pay():
    policy = make_policy(tiny_gpt2())
    ids, mask, act = ragged_batch()
    mask[:] = 1  # every row full width: nothing to pack
    act[:, 0] = False
    with count_lm_calls(policy) as calls:
        policy.evaluate_sequences(ids, mask, act)
    assert calls == [tuple(ids.shape)]


def test_model_ignoring_4d_masks_falls_back_with_a_warning():
    policy = make_policy(tiny_gpt2())
    reference = make_policy(tiny_gpt2(), pack_sequences=False)
    reference.load_state_dict(policy.state_dict())
    trunk = policy._trunk

    def no_4d_masks(ids, mask, position_ids, cache=None):  # a model that drops custom 4-D masks
        if mask.dim() == 4:
            mask = th.ones(ids.shape, dtype=th.long)
        return trunk(ids, mask, position_ids, cache=cache)

    policy._trunk = no_4d_masks
    ids, mask, act = ragged_batch(1)
    with pytest.warns(UserWarning, match="packed sequences are not usable.*differ from the padded"):
        got = policy.evaluate_sequences(ids, mask, act)
    assert not policy.pack_sequences
    want = reference.evaluate_sequences(ids, mask, act)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a.detach(), b.detach(), atol=1e-6)
