"""The window math of the rollout KV cache, as small pure functions over tensors.

A window is a right-aligned, left-padded ``[B, W]`` batch of token ids with its mask. The policy's full-recompute
path and :class:`~sb3_grpo.policies.kv_cache.RolloutCache` share these rules (:func:`positions_from_mask`,
:func:`trim_padding`); the cache classifies rows with :func:`extension_lengths` / :func:`extends_by_one` and moves
cache columns with :func:`realign_columns` and :func:`left_pad_columns`. The tests pin each one down;
``sb3_grpo.policies`` re-exports them. :func:`shared_prefixes` finds the windows of an update's minibatch that are
prefixes of another window, so that one forward serves them all.
"""

from __future__ import annotations

import numpy as np
import torch as th

__all__ = [
    "common_prefix_length",
    "extends_by_one",
    "extension_lengths",
    "last_tokens_block",
    "left_pad_columns",
    "positions_from_mask",
    "realign_columns",
    "shared_prefixes",
    "trim_padding",
]


def positions_from_mask(attention_mask: th.Tensor) -> th.Tensor:
    """Position ids from an attention mask: ``cumsum - 1``, clamped at 0.

    A token's position is the number of valid tokens before it, so it does not depend on how much left
    padding the window carries. Every path of the policy (full recompute, cached step, whole sequences)
    uses this rule, which is what makes them agree.

    :param attention_mask: ``[B, L]`` mask, 1 for real tokens, 0 for padding.
    :return: ``[B, L]`` long tensor of position ids (0 on leading padding).
    """
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def extends_by_one(old_ids: th.Tensor, old_mask: th.Tensor, new_ids: th.Tensor, new_mask: th.Tensor) -> th.Tensor:
    """Which rows of a new right-aligned window extend the old window by exactly one token.

    True for row ``b`` when the window shifted left by one (``new[:-1] == old[1:]`` for ids and mask), the
    new last token is valid, and nothing valid fell off the left edge (``old_mask[0] == 0``), i.e. the valid
    tokens of the new window are the valid tokens of the old one plus one.

    :param old_ids: ``[B, W]`` ids of the cached window.
    :param old_mask: ``[B, W]`` its mask.
    :param new_ids: ``[B, W]`` ids of the new window.
    :param new_mask: ``[B, W]`` its mask.
    :return: ``[B]`` bool tensor.
    """
    if old_ids.shape != new_ids.shape:
        return th.zeros(new_ids.shape[0], dtype=th.bool, device=new_ids.device)
    same_ids = (new_ids[:, :-1] == old_ids[:, 1:]).all(dim=1)
    same_mask = (new_mask[:, :-1] == old_mask[:, 1:]).all(dim=1)
    return same_ids & same_mask & (new_mask[:, -1] == 1) & (old_mask[:, 0] == 0)


def extension_lengths(old_ids: th.Tensor, old_mask: th.Tensor, new_ids: th.Tensor, new_mask: th.Tensor) -> th.Tensor:
    """By how many tokens each row of a new right-aligned window extends the old window (0: it does not).

    Row ``b`` extends by ``k >= 1`` when the window shifted left by ``k`` (``new[:, :-k] == old[:, k:]`` for ids and
    mask), its last ``k`` tokens are valid, and nothing valid fell off the left edge (``old_mask[:, :k] == 0``),
    i.e. the valid tokens of the new window are those of the old one plus ``k`` more; ``k`` is then the difference
    of their valid counts. ``k = 1`` is :func:`extends_by_one`.

    :param old_ids: ``[B, W]`` ids of the cached window.
    :param old_mask: ``[B, W]`` its mask.
    :param new_ids: ``[B, W]`` ids of the new window.
    :param new_mask: ``[B, W]`` its mask.
    :return: ``[B]`` long tensor, ``k`` or 0.
    """
    batch, width = new_ids.shape
    if old_ids.shape != new_ids.shape or width < 2:
        return th.zeros(batch, dtype=th.long, device=new_ids.device)
    k = new_mask.long().sum(dim=1) - old_mask.long().sum(dim=1)
    shift = k.clamp(1, width - 1).unsqueeze(1)
    col = th.arange(width, device=new_ids.device).unsqueeze(0)
    src = (col + shift).clamp(max=width - 1)  # new column c holds old column c + k
    kept = col < width - shift
    same = (new_ids == old_ids.gather(1, src)) & (new_mask == old_mask.gather(1, src))
    tail_valid = ((new_mask == 1) | kept).all(dim=1)
    dropped = ((old_mask != 0) & (col < shift)).any(dim=1)
    ok = (same | ~kept).all(dim=1) & tail_valid & ~dropped
    return th.where(ok & (k >= 1) & (k < width), k, th.zeros_like(k))


def realign_columns(kv_mask: th.Tensor, tail: int, lead: th.Tensor) -> th.Tensor:
    """Column order that moves each row's ``lead[b]`` masked columns, the first of its last ``tail``, to the front.

    After a forward over ``tail`` new columns in which row ``b`` used only the last ``tail - lead[b]``, the
    remaining masked ones would stay as holes in the middle of the row's cache; reading the row through the
    returned index puts them first, where :meth:`~sb3_grpo.policies.kv_cache.RolloutCache._crop` can drop them.
    Attention does not depend on the order of cached columns (positions are explicit), so the cache means the same.

    :param kv_mask: ``[B, L]`` cache mask, its last ``tail`` columns just written.
    :param tail: Columns written by the last forward.
    :param lead: ``[B]`` how many of them are masked for each row (``0 <= lead[b] <= tail``).
    :return: ``[B, L]`` long index: new column ``c`` of row ``b`` is old column ``index[b, c]``.
    """
    length = kv_mask.shape[1]
    col = th.arange(length, device=kv_mask.device).unsqueeze(0)
    lead = lead.unsqueeze(1)
    body = length - tail  # the columns before the forward
    return th.where(col < lead, body + col, th.where(col < body + lead, col - lead, col))


def left_pad_columns(t: th.Tensor, length: int, dim: int = -2) -> th.Tensor:
    """Pad ``t`` with zeros on the left of dimension ``dim`` up to ``length`` (no-op if already as long).

    :param t: tensor, e.g. cached keys ``[B, H, K, D]``.
    :param length: the target size of ``dim``.
    :param dim: the sequence dimension.
    :return: the padded tensor.
    """
    missing = length - t.shape[dim]
    if missing <= 0:
        return t
    shape = list(t.shape)
    shape[dim] = missing
    return th.cat([t.new_zeros(shape), t], dim=dim)


def trim_padding(ids: th.Tensor, mask: th.Tensor) -> tuple[th.Tensor, th.Tensor]:
    """Drop leading columns that are padding in every row (exactly neutral: masked keys weigh 0)."""
    any_valid = mask.any(dim=0)
    start = int(any_valid.nonzero()[0, 0]) if bool(any_valid.any()) else mask.shape[1] - 1
    return ids[:, start:], mask[:, start:]


def last_tokens_block(ids: th.Tensor, counts: th.Tensor, width: int) -> tuple[th.Tensor, th.Tensor]:
    """The last ``width`` columns of ``ids`` as a block of new tokens for a cached forward: row ``b``'s last
    ``counts[b]`` tokens at the block's end, masked dummy tokens (id 0) before them.

    :param ids: ``[B, L]`` right-aligned ids.
    :param counts: ``[B]`` each row's new tokens (``0 <= counts[b] <= width``).
    :param width: The block's width (the largest count).
    :return: ``(tokens, mask)``, both ``[B, width]`` long.
    """
    col = th.arange(width, device=ids.device).unsqueeze(0)
    mask = (col >= (width - counts).unsqueeze(1)).long()
    return th.where(mask.bool(), ids[:, -width:], th.zeros_like(ids[:, -width:])), mask


def common_prefix_length(ids: th.Tensor, mask: th.Tensor) -> int:
    """How many leading valid tokens every row of a right-aligned batch shares, leaving each row at least one token
    of its own (0 when the masks are not suffixes of ones, or a row is empty).

    The prompts of a text task usually begin alike (a chat template's system message, an instruction); a prefill
    can run those tokens once and each row's own tokens over a copy of their cache.

    :param ids: ``[B, L]`` right-aligned ids.
    :param mask: ``[B, L]`` attention mask, a suffix of ones in each row.
    """
    batch, width = ids.shape
    lengths = mask.sum(dim=1)
    shortest = int(lengths.min()) if batch else 0
    if shortest < 2 or not bool((mask == (th.arange(width, device=mask.device) >= width - lengths[:, None])).all()):
        return 0
    starts = width - lengths
    cols = th.arange(shortest - 1, device=ids.device)
    left = ids.gather(1, starts[:, None] + cols[None, :])  # each row's first tokens, left-aligned
    same = (left == left[:1]).all(dim=0)
    return int(same.long().cumprod(0).sum())


def shared_prefixes(ids: th.Tensor, mask: th.Tensor) -> tuple[th.Tensor, th.Tensor, th.Tensor] | None:
    """Which windows of a batch are prefixes of another window of the batch, and where they sit in it.

    A minibatch of single-token transitions from a text rollout holds many states of one episode: the window of
    step ``t`` is a prefix of the window of step ``t + k``. Under a causal LM the hidden state at the last token of a
    prefix is the same inside the longer window as on its own (its position ids count valid tokens, as
    :func:`positions_from_mask` does), so one forward of the longest windows serves every prefix of them.

    Rows are compared by their valid tokens, left-aligned. Sorted lexicographically, with padding below every
    token, a row that is a prefix of another row is a prefix of the next row in that order, and following that chain
    ends at a row that is a prefix of no other: the *parent* whose forward serves the chain. Exact comparison, no
    hashing; the work is a sort of the ``[B, L]`` ids on the host.

    :param ids: ``[B, L]`` right-aligned ids (token ids ``>= 0``).
    :param mask: ``[B, L]`` attention mask, a suffix of ones in each row.
    :return: ``(parents, parent_of, column)``, long tensors on ``ids``' device: the rows to run (``[P]``, in
        increasing order), each row's parent (an index into ``parents``, ``[B]``), and the column of its last token
        in the parents' window once :func:`trim_padding` has cut it to its longest row (``[B]``). ``None`` when no
        row is a prefix of another (nothing to share) or a mask is not a suffix of ones.
    """
    batch, width = ids.shape
    if batch < 2:
        return None
    m = mask.detach().to("cpu", th.bool).numpy()
    lengths = m.sum(axis=1)
    cols = np.arange(width)
    if lengths.min() < 1 or not (m == (cols[None, :] >= width - lengths[:, None])).all():
        return None
    # left-align the valid tokens; -1 (below every token id) after them, so a prefix sorts before its extensions
    a = ids.detach().to("cpu", th.long).numpy()
    gather = np.minimum(width - lengths[:, None] + cols[None, :], width - 1)
    left = np.where(cols[None, :] < lengths[:, None], np.take_along_axis(a, gather, axis=1), -1)
    order = np.lexsort(left.T[::-1])  # column 0 is the primary key
    ranked = left[order]
    covered = cols[None, :] >= lengths[order][:-1, None]
    child = np.append(((ranked[:-1] == ranked[1:]) | covered).all(axis=1), False)
    if not child.any():
        return None
    # each position's parent: the first position at or after it that is not a prefix of its successor
    ends = np.where(child, batch, np.arange(batch))
    parent_pos = np.minimum.accumulate(ends[::-1])[::-1]
    parents = np.unique(order[parent_pos])
    parent_row = np.empty(batch, dtype=np.int64)
    parent_row[order] = order[parent_pos]
    parent_of = np.searchsorted(parents, parent_row)
    column = lengths.max() - lengths[parent_row] + lengths - 1  # the longest row is a parent
    device = ids.device
    return tuple(th.as_tensor(x, dtype=th.long, device=device) for x in (parents, parent_of, column))
