"""The built-in turn decoder of :class:`~sb3_grpo.policies.CausalLMPolicy`: a lean batched decode loop that computes
a whole turn of tokens per row, for the ``"hf"`` rollout engine (:mod:`sb3_grpo.common.engines`).

:func:`decode_turns` prefills the rows' windows once and then runs one single-token forward per token over the LM's
own KV cache (a ``transformers.DynamicCache``), drawing each token as the policy's :meth:`forward` draws it: the
processed distribution (temperature, top-k, top-p), inverse-transform sampling (:func:`.sampling.sample_categorical`)
from uniforms the caller gives, the mode for greedy rows, and the exploration mixture's uniform tokens where the
caller says a step explores. It stops a row at a stop token (EOS, the end of a turn) and the whole batch when every
row has stopped or ``max_tokens`` tokens are drawn. Nothing here touches the rollout cache of the step-by-step path.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch as th

from sb3_grpo.policies.sampling import sample_categorical
from sb3_grpo.policies.windows import positions_from_mask, trim_padding

__all__ = ["DecodedTurns", "decode_turns"]


class DecodedTurns(NamedTuple):
    """The tokens of a turn per row, with what the rollout buffer stores for each.

    :ivar tokens: ``[R, L]`` token ids; row ``r``'s first ``lengths[r]`` are its turn.
    :ivar log_probs: ``[R, L]`` the policy's log-probs of the tokens (processed distribution).
    :ivar values: ``[R, L]`` the critic's values of the states the tokens were drawn in.
    :ivar lengths: ``[R]`` tokens of each row's turn (at least 1).
    """

    tokens: th.Tensor
    log_probs: th.Tensor
    values: th.Tensor
    lengths: th.Tensor


def decode_turns(
    policy: Any,
    ids: th.Tensor,
    mask: th.Tensor,
    uniforms: th.Tensor,
    greedy: th.Tensor,
    explore: th.Tensor,
    explore_tokens: th.Tensor,
    stop_ids: th.Tensor,
) -> DecodedTurns:
    """Decode up to ``L = uniforms.shape[1]`` tokens for each row of the windows ``ids`` / ``mask``.

    :param policy: The :class:`~sb3_grpo.policies.CausalLMPolicy` (its ``_trunk``, ``_logits``, ``_value`` and
        ``_distribution``).
    :param ids: ``[R, W]`` right-aligned windows (token ids, padding 0).
    :param mask: ``[R, W]`` their attention masks.
    :param uniforms: ``[R, L, 1]`` the uniform draw of each token (on ``[0, 1)``).
    :param greedy: ``[R]`` rows that take the most likely token.
    :param explore: ``[R, L]`` tokens replaced by ``explore_tokens`` (the exploration mixture's uniform draws).
    :param explore_tokens: ``[R, L]`` the replacing tokens.
    :param stop_ids: ``[S]`` tokens that end a row's turn (may be empty).
    """
    from transformers import DynamicCache

    n_rows, n_tokens = uniforms.shape[0], uniforms.shape[1]
    width = ids.shape[1]
    ids, mask = trim_padding(ids, mask)
    cache = DynamicCache(config=policy.lm.config)
    hidden = policy._trunk(ids, mask, positions_from_mask(mask), cache=cache)[:, -1]
    positions = mask.sum(dim=-1, keepdim=True)  # the next token's position
    tokens = th.zeros((n_rows, n_tokens), dtype=th.long, device=ids.device)
    log_probs = th.zeros((n_rows, n_tokens), dtype=th.float32, device=ids.device)
    values = th.zeros((n_rows, n_tokens), dtype=th.float32, device=ids.device)
    lengths = th.zeros(n_rows, dtype=th.long, device=ids.device)
    alive = th.ones(n_rows, dtype=th.bool, device=ids.device)
    for j in range(n_tokens):
        dist = policy._distribution(policy._logits(hidden))
        values[:, j] = policy._value(hidden, ids, mask)
        chosen = sample_categorical(dist.distribution.probs, uniforms[:, j])
        chosen = th.where(greedy, dist.mode(), chosen)
        chosen = th.where(explore[:, j], explore_tokens[:, j], chosen)
        tokens[:, j] = chosen
        log_probs[:, j] = dist.log_prob(chosen)
        lengths += alive
        alive &= ~th.isin(chosen, stop_ids)
        if j == n_tokens - 1 or not bool(alive.any()):
            break
        mask = th.cat([mask, th.ones_like(mask[:, :1])], dim=1)
        ids = th.cat([ids, chosen[:, None]], dim=1)
        # a stopped row's forwards are never read: its positions are only kept inside the LM's range
        hidden = policy._trunk(chosen[:, None], mask, positions.clamp(max=width - 1), cache=cache)[:, -1]
        positions = positions + 1
    return DecodedTurns(tokens, log_probs, values, lengths)
