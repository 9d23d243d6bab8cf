"""Packed update forward: the layout functions, and packed == padded evaluate_sequences (values and gradients)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch as th
from test_policies import V, W, count_lm_calls, make_policy, tiny_gpt2, tiny_llama, tiny_qwen2

from sb3_grpo.policies.packing import (
    PrefixGroups,
    first_fit_decreasing,
    packed_batch,
    shared_prefix_groups,
    suffix_lengths,
    tightest_layout,
)

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


def packed_equals_padded(build, ids, mask, act) -> tuple[int, int]:
    """Check that a packed policy's ``evaluate_sequences`` and the gradients of a loss on all three outputs equal a
    padded twin's; the ``(rows, width)`` of the packed forward."""
    packed, padded = make_policy(build()), make_policy(build(), pack_sequences=False)
    padded.load_state_dict(packed.state_dict())
    with count_lm_calls(packed) as calls, warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback warning
        out_packed = packed.evaluate_sequences(ids, mask, act)
    assert packed.pack_sequences and packed._packing_verified
    out_padded = padded.evaluate_sequences(ids, mask, act)
    for a, b in zip(out_packed, out_padded):
        np.testing.assert_allclose(a.detach(), b.detach(), atol=2e-5)
    for policy, out in ((packed, out_packed), (padded, out_padded)):
        policy.optimizer.zero_grad()
        (out[0].sum() + 0.1 * out[1].sum() + (out[2] ** 2).sum()).backward()
    for (name, p), q in zip(packed.named_parameters(), padded.parameters()):
        if p.grad is None:
            assert q.grad is None, name
            continue
        np.testing.assert_allclose(p.grad, q.grad, atol=2e-5, rtol=1e-4, err_msg=name)
    return calls[0]


@pytest.mark.parametrize("build", [tiny_gpt2, tiny_llama, tiny_qwen2, eager_gpt2])
def test_packed_forward_equals_padded_forward_and_gradients(build):
    ids, mask, act = ragged_batch()
    rows, width = packed_equals_padded(build, ids, mask, act)
    assert rows * width < ids.numel()  # the packed forward ran: fewer positions


def test_packing_skipped_when_it_would_not_pay():
    policy = make_policy(tiny_gpt2())
    ids, mask, act = ragged_batch()
    mask[:] = 1  # every row full width, and no two rows begin alike: nothing to pack or share
    ids[:, :2] = th.stack([th.arange(ids.shape[0]) // V + 4, th.arange(ids.shape[0]) % V], dim=1)
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


# -- shared prefixes ------------------------------------------------------------------------------------------------


def grouped_batch(seed: int = 0, groups: int = 3, size: int = 4):
    """GRPO-like right-aligned windows: ``groups`` prompts (sharing a common head) with ``size`` completions each."""
    rng = np.random.default_rng(seed)
    head = rng.integers(4, V, 3)
    rows = []
    for _ in range(groups):
        prompt = np.concatenate([head, rng.integers(4, V, int(rng.integers(2, 5)))])
        for _ in range(size):
            completion = rng.integers(4, V, int(rng.integers(1, 5)))
            rows.append((prompt, completion))
    width = max(len(p) + len(c) for p, c in rows)
    ids = np.zeros((len(rows), width), np.int64)
    mask = np.zeros((len(rows), width), np.int64)
    act = np.zeros((len(rows), width), bool)
    for b, (prompt, completion) in enumerate(rows):
        seq = np.concatenate([prompt, completion])
        ids[b, width - len(seq) :], mask[b, width - len(seq) :] = seq, 1
        act[b, width - len(completion) :] = True
    order = rng.permutation(len(rows))  # a shuffled minibatch: group members are not neighbours
    return th.as_tensor(ids[order]), th.as_tensor(mask[order]), th.as_tensor(act[order])


def brute_force_savings(seqs: list[list[int]], max_unit: int) -> int:
    """The most slots any grouping into runs of the sorted order saves (every partition tried)."""
    seqs = sorted(seqs)

    def lcp(a, b):
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        return n

    def best(i):
        if i == len(seqs):
            return 0
        top = best(i + 1)
        for j in range(i + 2, len(seqs) + 1):
            shared = min(lcp(seqs[k], seqs[k + 1]) for k in range(i, j - 1))
            unit = sum(len(s) for s in seqs[i:j]) - (j - i - 1) * shared
            if unit <= max_unit:
                top = max(top, (j - i - 1) * shared + best(j))
        return top

    return best(0)


def test_shared_prefix_groups_share_exactly_and_save_the_most():
    rng = np.random.default_rng(3)
    for _ in range(40):
        count = int(rng.integers(1, 8))
        seqs = [rng.integers(0, 3, int(rng.integers(1, 6))).tolist() for _ in range(count)]
        width = max(map(len, seqs))
        ids = th.zeros(count, width, dtype=th.long)
        for b, s in enumerate(seqs):
            ids[b, width - len(s) :] = th.tensor(s)
        lengths = th.tensor([len(s) for s in seqs])
        max_unit = width + int(rng.integers(0, 8))
        groups = shared_prefix_groups(ids, lengths, max_unit)
        for g, shared in enumerate(groups.shared.tolist()):
            members = [seqs[b] for b in np.flatnonzero(groups.group == g)]
            assert all(m[:shared] == members[0][:shared] and len(m) >= shared for m in members)
        units = groups.unit_lengths(lengths.numpy())
        assert units.max() <= max_unit
        assert int(lengths.sum()) - int(units.sum()) == brute_force_savings(seqs, max_unit)


def test_packed_batch_with_shared_prefixes_matches_a_brute_force_construction():
    seqs = [[5, 6, 7, 8], [5, 6, 9], [5, 6, 7, 8, 10], [11, 12]]
    width = 5
    ids = th.zeros(len(seqs), width, dtype=th.long)
    for b, s in enumerate(seqs):
        ids[b, width - len(s) :] = th.tensor(s)
    lengths = th.tensor([len(s) for s in seqs])
    groups = PrefixGroups(np.array([0, 0, 0, 1]), np.array([2, 0]))
    units = groups.unit_lengths(lengths.numpy())
    assert units.tolist() == [2 + 2 + 1 + 3, 2]
    batch = packed_batch(ids, lengths, int(units.max()), groups=groups)
    owner = {}  # (row, slot) -> (segment or "prefix of group g", position)
    for b, s in enumerate(seqs):
        for w, token in enumerate(s):
            r, c = (int(x) for x in batch.slots(th.tensor([b]), th.tensor([w])))
            assert int(batch.input_ids[r, c]) == token and int(batch.position_ids[r, c]) == w
            key = ("prefix", int(groups.group[b])) if w < groups.shared[groups.group[b]] else ("own", b)
            assert owner.setdefault((r, c), key) == key  # a prefix slot is shared, an own slot is not
    rows, cap = batch.input_ids.shape
    assert rows * cap < sum(map(len, seqs)) + cap  # the prefix [5, 6] is laid down once
    for r in range(rows):
        for q in range(cap):
            for k in range(cap):
                a, b = owner.get((r, q)), owner.get((r, k))
                if a is None:
                    want = q == k
                elif b is None or k > q:
                    want = False
                elif b[0] == "prefix":
                    want = a[0] == "prefix" and a[1] == b[1] or a[0] == "own" and groups.group[a[1]] == b[1]
                else:
                    want = a == b
                assert bool(batch.attention_mask[r, 0, q, k]) == want, (r, q, k)


@pytest.mark.parametrize("build", [tiny_llama, eager_gpt2])
def test_shared_prefix_forward_equals_padded_forward_and_gradients(build):
    ids, mask, act = grouped_batch()
    rows, width = packed_equals_padded(build, ids, mask, act)
    assert rows * width < int(mask.sum())  # fewer positions than tokens: prompts computed once per group


def test_tightest_layout_is_valid_and_never_worse_than_the_longest_width():
    rng = np.random.default_rng(5)
    for _ in range(30):
        lengths = rng.integers(1, 40, int(rng.integers(1, 20)))
        capacity, (row, offset, rows) = tightest_layout(lengths)
        assert lengths.max() <= capacity <= 2 * lengths.max()
        assert np.all(offset + lengths <= capacity)
        plain = first_fit_decreasing(lengths, int(lengths.max()))
        assert rows * capacity <= plain[2] * int(lengths.max())
    # two units of 3 and two of 2: rows of 5 hold them in 2 rows (10 slots) where rows of 3 need 4 (12 slots)
    assert tightest_layout(np.array([3, 3, 2, 2]))[0] == 5
