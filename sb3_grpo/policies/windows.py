"""The window math of the rollout KV cache, as small pure functions over tensors.

A window is a right-aligned, left-padded ``[B, W]`` batch of token ids with its mask. The policy's full-recompute
path and :class:`~sb3_grpo.policies.kv_cache.RolloutCache` share these rules (:func:`positions_from_mask`,
:func:`trim_padding`); the cache classifies rows with :func:`extension_lengths` / :func:`extends_by_one` and moves
cache columns with :func:`realign_columns` and :func:`left_pad_columns`. The tests pin each one down;
``sb3_grpo.policies`` re-exports them.
"""

from __future__ import annotations

import torch as th

__all__ = [
    "extends_by_one",
    "extension_lengths",
    "left_pad_columns",
    "positions_from_mask",
    "realign_columns",
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
