"""What :class:`~sb3_grpo.policies.CausalLMPolicy` checks: its arguments, its window against the model, and the
layout of every observation it reads.

- :func:`check_policy_args`: the sampling controls and sizes (type, finiteness, range), with the shared checks of
  :mod:`textrl_envs.validation`, at construction.
- :func:`check_window_fits`: the env's window ``W`` against the model's context (``n_positions`` /
  ``max_position_embeddings``), at construction: a longer window would fail mid-rollout inside the position
  embedding.
- :func:`check_layout`: every batch of observations has the text envs' layout (:mod:`textrl_envs.core`): integer
  token ids, and an attention mask that is one run of ones ending at the last column (right-aligned, left padding).
  Wrappers that change observations break it (``VecFrameStack`` puts padding in the middle, ``VecNormalize``
  turns ids into floats); the policy refuses them by name instead of training on garbage. It runs at every
  rollout step, so it is a few reductions over the ``(B, W)`` mask and one host sync.
"""

from __future__ import annotations

from typing import Any

import torch as th
from gymnasium import spaces

from textrl_envs.validation import check_bool, check_float, check_int

__all__ = [
    "CONTEXT_KEYS",
    "check_layout",
    "check_policy_args",
    "check_token_range",
    "check_window_fits",
    "model_context",
]

#: Config attributes that hold a model's context length (positions it has embeddings for), in order of preference.
CONTEXT_KEYS = ("n_positions", "max_position_embeddings", "n_ctx", "seq_length")


def check_policy_args(
    temperature: Any,
    top_k: Any,
    top_p: Any,
    critic_hidden: Any,
    value_head_init_std: Any,
    flags: dict[str, Any],
) -> None:
    """Check the policy's sampling controls and sizes.

    :param temperature: > 0, finite.
    :param top_k: ``None`` or an int >= 0 (0 keeps every token).
    :param top_p: ``None`` or a number in ``(0, 1]``.
    :param critic_hidden: the separate critic's width, an int >= 1.
    :param value_head_init_std: ``None`` or a finite number > 0.
    :param flags: boolean arguments by name (``use_cache``, ``separate_critic``, ...).
    :raises TypeError: naming the first argument of a wrong type.
    :raises ValueError: naming the first argument out of range (NaN and infinities included).
    """
    check_float("temperature", temperature, low=0, low_open=True, hint="e.g. temperature=1.0 (sample from the LM)")
    if top_k is not None:
        check_int("top_k", top_k, low=0, hint="None or 0 keeps every token; e.g. top_k=50")
    if top_p is not None:
        check_float("top_p", top_p, low=0, high=1, low_open=True, hint="None or 1.0 keeps every token; e.g. top_p=0.9")
    check_int("critic_hidden", critic_hidden, low=1, example=256)
    if value_head_init_std is not None:
        check_float("value_head_init_std", value_head_init_std, low=0, low_open=True, example=0.01)
    for name, value in flags.items():
        check_bool(name, value)


def model_context(config: Any) -> tuple[str, int] | None:
    """``(attribute, length)`` of the model's context from its config, or ``None`` when it states none."""
    for key in CONTEXT_KEYS:
        value = getattr(config, key, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return key, value
    return None


def check_window_fits(observation_space: spaces.Dict, config: Any) -> None:
    """Refuse an env whose window ``W`` is longer than the model's context.

    Position ids run up to ``W - 1`` (``cumsum(mask) - 1``), so a model with ``n`` positions reads windows of at most
    ``n`` tokens.

    :param observation_space: The env's ``Dict`` observation space (``input_ids`` of shape ``(W,)``).
    :param config: The model's config.
    :raises ValueError: with both figures and what to change.
    """
    context = model_context(config)
    width = int(observation_space["input_ids"].shape[-1])
    if context is not None and width > context[1]:
        key, n = context
        raise ValueError(
            f"the env's window is W = max_prompt_tokens + max_new_tokens = {width} tokens, longer than the model's "
            f"context of {n} positions (config.{key}); lower max_prompt_tokens + max_new_tokens to at most {n}, or use "
            "a model with a longer context"
        )


def _layout_error(ids: th.Tensor, mask: th.Tensor) -> str:
    """What is wrong with a batch that failed :func:`check_layout`, and the likely cause (slow path)."""
    if ids.is_floating_point() and not bool((ids == ids.round()).all()):
        return (
            f"input_ids are not integer token ids (e.g. {float(ids[ids != ids.round()][0]):.4g}): a VecNormalize "
            "wrapper with norm_obs=True normalizes the observations; token ids cannot be normalized, so use "
            "VecNormalize(venv, norm_obs=False) (reward normalization is fine) or no VecNormalize"
        )
    if not bool(((mask == 0) | (mask == 1)).all()):
        return (
            "attention_mask holds values other than 0 and 1 (a VecNormalize wrapper with norm_obs=True normalizes "
            "the observations); use VecNormalize(venv, norm_obs=False) or no VecNormalize"
        )
    empty = (mask == 0).all(dim=1)
    if bool(empty.any()):
        row = int(empty.nonzero()[0, 0])
        return (
            f"attention_mask row {row} is all zeros: every observation holds at least its prompt's tokens. Pass the "
            "env's observations unchanged (a zero-filled array, e.g. a buffer never written, is not an observation)"
        )
    row = int(((mask[:, :-1] > mask[:, 1:]).any(dim=1) | (mask[:, -1] != 1)).nonzero()[0, 0])
    shown = "".join(str(int(v)) for v in mask[row].tolist())
    return (
        f"attention_mask row {row} is not one run of ones ending at the last column (mask {shown}): observations "
        "must be right-aligned token windows (newest token last, padding on the left). A VecFrameStack wrapper "
        "concatenates windows and puts padding in the middle; remove it (the window already holds the whole "
        "sequence so far)"
    )


def check_token_range(ids: th.Tensor, n_embeddings: int) -> None:
    """Refuse token ids outside the model's embedding table (they would fail deep inside the model's forward).

    :param ids: ``[B, W]`` integer token ids (padding already set to 0).
    :param n_embeddings: Rows of the model's input embedding table.
    :raises ValueError: naming the first bad id and what to check.
    """
    bad = (ids < 0) | (ids >= n_embeddings)
    if bool(bad.any()):
        value = int(ids[bad][0])
        raise ValueError(
            f"input_ids hold token id {value}, outside the model's vocabulary [0, {n_embeddings - 1}]: the env's "
            "tokenizer and the policy's model do not match (build the env with the model's tokenizer), or the "
            "observation was not made by the env"
        )


def check_layout(ids: th.Tensor, mask: th.Tensor) -> None:
    """Refuse observations that are not right-aligned integer token windows (see the module docstring).

    Floats are accepted when integral (SB3's rollout buffer stores observations as float32).

    :param ids: ``[B, W]`` token ids as given (before any cast).
    :param mask: ``[B, W]`` attention mask as given.
    :raises ValueError: naming what is wrong and the wrapper that usually causes it.
    """
    if ids.shape != mask.shape or ids.dim() != 2 or ids.shape[1] == 0:
        raise ValueError(
            f"input_ids {tuple(ids.shape)} and attention_mask {tuple(mask.shape)} must have the same shape "
            "(batch, W) with W >= 1; give the env's observations unchanged"
        )
    # one comparison with the layout the mask's own count implies: n ones at the right, zeros before (n >= 1)
    count = mask.sum(dim=1, keepdim=True).clamp(min=1)
    right_aligned = th.arange(mask.shape[1], device=mask.device) >= mask.shape[1] - count
    ok = th.equal(mask, right_aligned.to(mask.dtype))
    if ok and ids.is_floating_point():
        ok = bool((ids == ids.round()).all())
    if not ok:
        raise ValueError(f"CausalLMPolicy cannot read these observations: {_layout_error(ids, mask)}")
