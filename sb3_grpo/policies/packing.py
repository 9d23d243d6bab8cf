"""Sequence packing for the update's forward pass: several short sequences share one row of the batch.

The text fast path evaluates every episode segment of a rollout as its own sequence (its prompt and the
completion so far). Padded to the longest, a batch of segments whose lengths vary (episodes ending on EOS,
prompts of different lengths) spends much of its forward on padding. Packing lays the segments end to end
into rows of ``capacity`` tokens (first-fit decreasing), restarts the position ids at each segment, and
gives the model a block-diagonal causal 4-D attention mask so that no token sees another segment. The
hidden state of every real token is then what the padded forward gives (up to float rounding), for fewer
positions; "padding-free" training in TRL and the packed batches of Krell et al. 2021, "Efficient
Sequence Packing without Cross-contamination", rest on the same idea.

The layout functions are pure (numpy on the host, a few integers per segment); :func:`packed_batch` builds
the device tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch as th

__all__ = ["PackedBatch", "first_fit_decreasing", "packed_batch", "suffix_lengths"]


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


@dataclass
class PackedBatch:
    """Device tensors of a packed batch.

    :param input_ids: ``[R, C]`` token ids (0 in unused slots).
    :param position_ids: ``[R, C]`` position of each token within its segment (0 in unused slots).
    :param attention_mask: ``[R, 1, C, C]`` block-diagonal causal mask: bool (True = attend) or additive
        float (0 = attend, the dtype's minimum = blocked); an unused slot attends only to itself.
    :param row: ``[B]`` row of each segment.
    :param offset: ``[B]`` first slot of each segment in its row.
    """

    input_ids: th.Tensor
    position_ids: th.Tensor
    attention_mask: th.Tensor
    row: th.Tensor
    offset: th.Tensor


def packed_batch(
    ids: th.Tensor,
    lengths: th.Tensor,
    capacity: int,
    mask_dtype: th.dtype = th.bool,
    layout: tuple[np.ndarray, np.ndarray, int] | None = None,
) -> PackedBatch:
    """Pack the valid suffix of each row of ``ids`` (``lengths[b]`` tokens) into rows of ``capacity`` slots.

    :param ids: ``[B, L]`` right-aligned token ids.
    :param lengths: ``[B]`` valid tokens per row (see :func:`suffix_lengths`), each in ``1..capacity``.
    :param capacity: slots per packed row (at least ``lengths.max()``).
    :param mask_dtype: ``th.bool`` (for SDPA-style attention) or a float dtype (additive mask, for eager attention).
    :param layout: :func:`first_fit_decreasing` of ``lengths`` and ``capacity``, if already computed.
    :return: the :class:`PackedBatch`.
    """
    device, width = ids.device, ids.shape[1]
    n = lengths.cpu().numpy().astype(np.int64)
    row, offset, rows = first_fit_decreasing(n, capacity) if layout is None else layout
    total = int(n.sum())
    begin = np.cumsum(n) - n  # each segment's first index in the concatenation of all segments
    within = np.arange(total, dtype=np.int64) - np.repeat(begin, n)  # position of each token in its segment
    segment = np.repeat(np.arange(n.size, dtype=np.int64), n)
    dest = np.repeat(row * capacity + offset, n) + within  # flat slot of each token in the packed batch
    seg_flat = np.full(rows * capacity, -1, dtype=np.int64)
    pos_flat = np.zeros(rows * capacity, dtype=np.int64)
    src_flat = np.zeros(rows * capacity, dtype=np.int64)
    seg_flat[dest] = segment
    pos_flat[dest] = within
    src_flat[dest] = segment * width + (width - np.repeat(n, n)) + within  # flat index into ids

    seg = th.as_tensor(seg_flat.reshape(rows, capacity), device=device)
    positions = th.as_tensor(pos_flat.reshape(rows, capacity), device=device)
    used = seg >= 0
    packed_ids = ids.reshape(-1)[th.as_tensor(src_flat, device=device)].reshape(rows, capacity)
    packed_ids = packed_ids.masked_fill(~used, 0)
    cols = th.arange(capacity, device=device)
    allowed = (seg[:, :, None] == seg[:, None, :]) & (cols[:, None] >= cols[None, :]) & used[:, None, :]
    allowed |= th.eye(capacity, dtype=th.bool, device=device) & ~used[:, :, None]  # unused slots: themselves only
    allowed = allowed.unsqueeze(1)
    if mask_dtype == th.bool:
        attention = allowed
    else:
        attention = th.zeros(allowed.shape, dtype=mask_dtype, device=device).masked_fill(
            ~allowed, th.finfo(mask_dtype).min
        )
    return PackedBatch(
        packed_ids,
        positions,
        attention,
        th.as_tensor(row, device=device),
        th.as_tensor(offset, device=device),
    )
