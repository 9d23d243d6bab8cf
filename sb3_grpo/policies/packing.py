"""Sequence packing for the update's forward pass: several short sequences share one row of the batch.

The text fast path evaluates every episode segment of a rollout as its own sequence (its prompt and the
completion so far). Padded to the longest, a batch of segments whose lengths vary (episodes ending on EOS,
prompts of different lengths) spends much of its forward on padding. Packing lays the segments end to end
into rows of ``capacity`` tokens (first-fit decreasing), restarts the position ids at each segment, and
gives the model a block-diagonal causal 4-D attention mask so that no token sees another segment. The
hidden state of every real token is then what the padded forward gives (up to float rounding), for fewer
positions; "padding-free" training in TRL and the packed batches of Krell et al. 2021, "Efficient
Sequence Packing without Cross-contamination", rest on the same idea.

Segments that begin with the same tokens (the completions of one group share their prompt; every prompt may share a
system prompt) can also share those tokens (:func:`shared_prefix_groups`): a group's common prefix is laid down once,
followed by each member's own tokens, and the mask lets a member's tokens see the prefix and their own earlier tokens
only. Under a causal LM each token's hidden state is then still the one its own sequence gives, and the gradient is the
same sum, for a prefix computed once instead of once per member (the shared-prompt forward that "Prefix Grouper",
Liu et al. 2025, proposes for GRPO).

The layout functions are pure (numpy on the host, a few integers per segment); :func:`packed_batch` builds
the device tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch as th

__all__ = [
    "PackedBatch",
    "PrefixGroups",
    "first_fit_decreasing",
    "packed_batch",
    "shared_prefix_groups",
    "suffix_lengths",
    "tightest_layout",
]


def suffix_lengths(mask: th.Tensor) -> th.Tensor | None:
    """Valid-token counts of right-aligned rows, or ``None`` if some row's mask is not a suffix of ones.

    :param mask: ``[B, L]`` attention mask.
    :return: ``[B]`` long tensor of lengths (on ``mask``'s device), or ``None``.
    """
    lengths = mask.long().sum(dim=1)
    cols = th.arange(mask.shape[1], device=mask.device)
    expected = cols[None, :] >= (mask.shape[1] - lengths)[:, None]
    if not bool((expected == mask.bool()).all()):
        return None
    return lengths


def first_fit_decreasing(lengths: np.ndarray, capacity: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Assign items to rows of ``capacity`` slots: longest first, each into the first row with room.

    :param lengths: ``(B,)`` item sizes, each in ``1..capacity``.
    :param capacity: slots per row.
    :return: ``(row, offset, rows)``: each item's row and first slot, and the number of rows used.
    :raises ValueError: if an item does not fit in an empty row.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.size and (lengths.min() < 1 or lengths.max() > capacity):
        raise ValueError(f"item sizes must be in 1..{capacity}, got {lengths.min()}..{lengths.max()}")
    row = np.zeros(lengths.size, dtype=np.int64)
    offset = np.zeros(lengths.size, dtype=np.int64)
    used = np.zeros(lengths.size, dtype=np.int64)  # slots used per row (at most one row per item)
    rows = 0
    for i in np.argsort(-lengths, kind="stable").tolist():
        n = int(lengths[i])
        fits = np.flatnonzero(used[:rows] + n <= capacity)
        r = int(fits[0]) if fits.size else rows
        rows = max(rows, r + 1)
        row[i], offset[i] = r, used[r]
        used[r] += n
    return row, offset, rows


def tightest_layout(lengths: np.ndarray) -> tuple[int, tuple[np.ndarray, np.ndarray, int]]:
    """The row width, from the longest item to twice it, whose :func:`first_fit_decreasing` layout has the fewest
    slots (the narrowest on ties: attention grows with the width), and that layout.

    :param lengths: ``(B,)`` item sizes, at least 1.
    :return: ``(capacity, layout)``.
    """
    longest = int(np.max(lengths))
    best = None
    for capacity in sorted({longest * k // 4 for k in range(4, 9)}):
        layout = first_fit_decreasing(lengths, capacity)
        if best is None or layout[2] * capacity < best[1][2] * best[0]:
            best = (capacity, layout)
    return best


@dataclass(frozen=True)
class PrefixGroups:
    """Segments grouped by a common prefix: the rows of group ``g`` all begin with the same ``shared[g]`` tokens.

    :param group: ``(B,)`` each segment's group, ``0..G-1``.
    :param shared: ``(G,)`` tokens that the group's segments share (0: nothing shared, as for a group of one).
    """

    group: np.ndarray
    shared: np.ndarray

    @staticmethod
    def singletons(count: int) -> PrefixGroups:
        """Every segment its own group: plain packing."""
        return PrefixGroups(np.arange(count, dtype=np.int64), np.zeros(count, dtype=np.int64))

    def unit_lengths(self, lengths: np.ndarray) -> np.ndarray:
        """``(G,)`` slots of each group's unit: its prefix once, then each member's remaining tokens."""
        lengths = np.asarray(lengths, dtype=np.int64)
        members = np.bincount(self.group, minlength=self.shared.size)
        return (
            np.bincount(self.group, weights=lengths, minlength=self.shared.size).astype(np.int64)
            - (members - 1) * self.shared
        )


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(a.size, b.size)
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if differ.size else n


def shared_prefix_groups(ids: th.Tensor, lengths: th.Tensor, max_unit: int) -> PrefixGroups:
    """Group the segments so that laying each group's common prefix down once saves the most slots.

    Sorted by their tokens, segments with a common prefix are neighbours; the groups are runs of that order, chosen by
    dynamic programming to maximise the slots saved (a run of ``m`` segments sharing ``p`` tokens saves
    ``(m - 1) * p``), each unit at most ``max_unit`` slots (a unit is one row's attention span). Exact comparison of
    the ids: nothing is shared that is not equal.

    :param ids: ``[B, L]`` right-aligned token ids.
    :param lengths: ``[B]`` valid tokens per row.
    :param max_unit: the longest unit allowed (at least ``lengths.max()``).
    """
    n = lengths.cpu().numpy().astype(np.int64)
    host = ids.cpu().numpy()
    width = host.shape[1]
    seqs = [host[b, width - n[b] :] for b in range(n.size)]
    order = sorted(range(n.size), key=lambda b: tuple(seqs[b].tolist()))
    lcp = np.array([_common_prefix(seqs[a], seqs[b]) for a, b in zip(order, order[1:])], dtype=np.int64)
    sizes = n[order]
    total = np.concatenate([[0], np.cumsum(sizes)])
    # best[j]: the most slots saved by grouping the first j segments (of the sorted order); start[j]: where the last
    # run of that grouping begins
    best = np.zeros(n.size + 1, dtype=np.int64)
    start = np.zeros(n.size + 1, dtype=np.int64)
    for j in range(1, n.size + 1):
        best[j], start[j] = best[j - 1], j - 1  # segment j - 1 alone
        if j < 2:
            continue
        # runs [i, j) with i < j - 1: the shared length is the least common prefix of neighbours in the run
        shared = np.minimum.accumulate(lcp[: j - 1][::-1])[::-1]  # shared[i] = min(lcp[i:j-1])
        i = np.arange(j - 1)
        saved = (j - 1 - i) * shared
        unit = total[j] - total[i] - saved
        gain = np.where(unit <= max_unit, best[i] + saved, -1)
        k = int(np.argmax(gain))
        if gain[k] > best[j]:
            best[j], start[j] = gain[k], k
    group = np.zeros(n.size, dtype=np.int64)
    shared_of = []
    j = n.size
    runs = []
    while j > 0:
        runs.append((int(start[j]), j))
        j = int(start[j])
    for g, (i, j) in enumerate(reversed(runs)):
        group[np.asarray(order[i:j])] = g
        shared_of.append(int(lcp[i : j - 1].min()) if j - i > 1 else 0)
    return PrefixGroups(group, np.asarray(shared_of, dtype=np.int64))


@dataclass
class PackedBatch:
    """Device tensors of a packed batch.

    :param input_ids: ``[R, C]`` token ids (0 in unused slots).
    :param position_ids: ``[R, C]`` position of each token within its segment (0 in unused slots).
    :param attention_mask: ``[R, 1, C, C]`` causal mask within each segment (and its group's shared prefix): bool
        (True = attend) or additive float (0 = attend, the dtype's minimum = blocked); an unused slot attends only to
        itself.
    :param row: ``[B]`` row of each segment.
    :param offset: ``[B]`` first slot of each segment's unit in its row (its shared prefix, or the segment itself).
    :param shared: ``[B]`` tokens of each segment that are its group's shared prefix.
    :param own: ``[B]`` slot of each segment's first own token (its token at position ``shared``).
    """

    input_ids: th.Tensor
    position_ids: th.Tensor
    attention_mask: th.Tensor
    row: th.Tensor
    offset: th.Tensor
    shared: th.Tensor
    own: th.Tensor

    def slots(self, segments: th.Tensor, positions: th.Tensor) -> tuple[th.Tensor, th.Tensor]:
        """``(row, column)`` in the packed batch of token ``positions[i]`` (within its sequence) of segment
        ``segments[i]``."""
        shared = self.shared[segments]
        col = th.where(positions < shared, self.offset[segments] + positions, self.own[segments] + positions - shared)
        return self.row[segments], col


def packed_batch(
    ids: th.Tensor,
    lengths: th.Tensor,
    capacity: int,
    mask_dtype: th.dtype = th.bool,
    layout: tuple[np.ndarray, np.ndarray, int] | None = None,
    groups: PrefixGroups | None = None,
) -> PackedBatch:
    """Pack the valid suffix of each row of ``ids`` (``lengths[b]`` tokens) into rows of ``capacity`` slots.

    :param ids: ``[B, L]`` right-aligned token ids.
    :param lengths: ``[B]`` valid tokens per row (see :func:`suffix_lengths`), each in ``1..capacity``.
    :param capacity: slots per packed row (at least the longest unit: ``lengths.max()`` without ``groups``).
    :param mask_dtype: ``th.bool`` (for SDPA-style attention) or a float dtype (additive mask, for eager attention).
    :param layout: :func:`first_fit_decreasing` of the units' lengths and ``capacity``, if already computed.
    :param groups: segments whose common prefix is laid down once (:func:`shared_prefix_groups`); ``None``: none.
    :return: the :class:`PackedBatch`.
    """
    device, width = ids.device, ids.shape[1]
    n = lengths.cpu().numpy().astype(np.int64)
    groups = PrefixGroups.singletons(n.size) if groups is None else groups
    units = groups.unit_lengths(n)
    row, offset, rows = first_fit_decreasing(units, capacity) if layout is None else layout
    # each segment's tokens: the shared prefix (laid down by the group's first member only), then its own tokens
    first = np.full(units.size, n.size, dtype=np.int64)
    np.minimum.at(first, groups.group, np.arange(n.size))
    shared = groups.shared[groups.group]
    lays_prefix = first[groups.group] == np.arange(n.size)
    start = np.where(lays_prefix, 0, shared)  # first position each segment lays down
    count = n - start
    own_before = np.zeros(n.size, dtype=np.int64)  # own tokens laid down before this segment's, in its unit
    seen = np.zeros(units.size, dtype=np.int64)
    for b in range(n.size):
        g = groups.group[b]
        own_before[b] = seen[g]
        seen[g] += n[b] - shared[b]
    unit_offset = row * capacity + offset  # flat slot of each unit
    own = unit_offset[groups.group] + groups.shared[groups.group] + own_before  # flat slot of position `shared`
    total = int(count.sum())
    begin = np.cumsum(count) - count
    seg = np.repeat(np.arange(n.size, dtype=np.int64), count)
    position = np.repeat(start, count) + np.arange(total, dtype=np.int64) - np.repeat(begin, count)
    in_prefix = position < shared[seg]
    dest = np.where(in_prefix, unit_offset[groups.group[seg]] + position, own[seg] + position - shared[seg])
    unit_flat = np.full(rows * capacity, -1, dtype=np.int64)
    branch_flat = np.full(rows * capacity, -1, dtype=np.int64)  # -1: the shared prefix (or an unused slot)
    pos_flat = np.zeros(rows * capacity, dtype=np.int64)
    src_flat = np.zeros(rows * capacity, dtype=np.int64)
    unit_flat[dest] = groups.group[seg]
    branch_flat[dest] = np.where(in_prefix, -1, seg)
    pos_flat[dest] = position
    src_flat[dest] = seg * width + (width - n[seg]) + position  # flat index into ids

    unit_of = th.as_tensor(unit_flat.reshape(rows, capacity), device=device)
    branch = th.as_tensor(branch_flat.reshape(rows, capacity), device=device)
    positions = th.as_tensor(pos_flat.reshape(rows, capacity), device=device)
    used = unit_of >= 0
    packed_ids = ids.reshape(-1)[th.as_tensor(src_flat, device=device)].reshape(rows, capacity)
    packed_ids = packed_ids.masked_fill(~used, 0)
    cols = th.arange(capacity, device=device)
    same_path = (branch[:, None, :] < 0) | (branch[:, :, None] == branch[:, None, :])  # key: prefix or own branch
    allowed = (unit_of[:, :, None] == unit_of[:, None, :]) & (cols[:, None] >= cols[None, :]) & used[:, None, :]
    allowed &= same_path
    allowed |= th.eye(capacity, dtype=th.bool, device=device) & ~used[:, :, None]  # unused slots: themselves only
    allowed = allowed.unsqueeze(1)
    if mask_dtype == th.bool:
        attention = allowed
    else:
        attention = th.zeros(allowed.shape, dtype=mask_dtype, device=device).masked_fill(
            ~allowed, th.finfo(mask_dtype).min
        )
    seg_row, seg_offset = row[groups.group], offset[groups.group]
    return PackedBatch(
        packed_ids,
        positions,
        attention,
        th.as_tensor(seg_row, device=device),
        th.as_tensor(seg_offset, device=device),
        th.as_tensor(shared, device=device),
        th.as_tensor(own - seg_row * capacity, device=device),
    )
