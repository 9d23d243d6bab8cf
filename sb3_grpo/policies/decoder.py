"""The built-in decoder of :class:`~sb3_grpo.policies.CausalLMPolicy`: a lean batched decode loop over the LM's own
KV cache, for the ``"hf"`` rollout engine (:mod:`sb3_grpo.engines.turn_queues`).

:class:`LiveBatch` holds the rows being decoded, each with its KV cache (one ``transformers.DynamicCache``, the rows
right-aligned with a 2-D mask over its columns, as the rollout cache keeps them), its next position and the
rollout step its next token is for. Rows join with one prefill of their windows (:meth:`LiveBatch.add`, spliced
into the batch; a window the policy's prefill memo holds, such as a prompt warmed at the rollout's start, is copied
from it) and leave when their turn ends (:meth:`LiveBatch.advance`) or the env changed their window
(:meth:`LiveBatch.remove`). Every :meth:`~LiveBatch.advance` is one single-token forward of all live rows, each drawing
its next token as the policy's :meth:`~sb3_grpo.policies.CausalLMPolicy.forward` draws it: the processed
distribution (temperature, top-k, top-p), inverse-transform sampling (:func:`.token_sampling.sample_categorical`) from
the uniform the caller's table holds for that row and step, the mode for greedy rows, and the exploration mixture's
uniform token where the table says the step explores. Rows that joined at different rollout steps share the
forwards (continuous batching), so a reset row never decodes alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch as th

from sb3_grpo.policies.token_sampling import categorical_tables, sample_categorical
from sb3_grpo.policies.windows import left_pad_columns

__all__ = ["LiveBatch"]

#: ``write(rows, steps, tokens, log_probs, values)``: where :meth:`LiveBatch.advance` puts each drawn token.
Writer = Callable[[th.Tensor, th.Tensor, th.Tensor, th.Tensor, th.Tensor], None]


class LiveBatch:
    """The rows the built-in decoder is decoding, with their KV cache.

    :param policy: The :class:`~sb3_grpo.policies.CausalLMPolicy` (its ``_step_trunk``, ``_logits``, ``_value`` and
        ``_processed``).
    :param uniforms: ``[n_steps, n_envs, 1]`` the uniform draw of each (rollout step, row).
    :param explore: ``[n_steps, n_envs]`` the (step, row) draws replaced by the exploration mixture's uniform token.
    :param explore_tokens: ``[n_steps, n_envs]`` those tokens.
    :param stop_ids: ``[S]`` tokens that end a turn (EOS, the end of an agent turn; may be empty).
    :param max_turn_tokens: Tokens a row decodes after it joins before it leaves (the episode budget).
    :param width: The observation width (a row's positions stay below it).
    :param remember_ends: Run the forward of a row's last token too and put its window, keys/values, logits and value
        into the policy's prefill memo, so that the value of the state a turn ends in (GAE's bootstrap of a truncated
        episode, the rollout's last state) is a memo lookup rather than a prefill.
    :param terminal_ids: ``[T]`` tokens that terminate the episode (a single-turn episode's EOS): no value of the state
        after them is read, so ``remember_ends`` skips the rows they end (``None``: none).
    """

    def __init__(
        self,
        policy: Any,
        uniforms: th.Tensor,
        explore: th.Tensor,
        explore_tokens: th.Tensor,
        stop_ids: th.Tensor,
        max_turn_tokens: int,
        width: int,
        remember_ends: bool = False,
        terminal_ids: th.Tensor | None = None,
    ) -> None:
        self.policy = policy
        self.remember_ends = remember_ends
        self.terminal_ids = stop_ids[:0] if terminal_ids is None else terminal_ids
        self.windows: list[list[int]] = []  # each live row's valid token ids (the memo's key), with remember_ends
        self.uniforms = uniforms
        self.explore = explore
        self.explore_tokens = explore_tokens
        self.stop_ids = stop_ids
        self.max_turn_tokens = max_turn_tokens
        self.width = width
        self.n_steps = uniforms.shape[0]
        self.cache: Any = None
        self.kv_mask: th.Tensor | None = None
        empty = th.zeros(0, dtype=th.long, device=uniforms.device)
        self.rows, self.steps, self.positions, self.decoded = empty, empty, empty, empty
        self.greedy = th.zeros(0, dtype=th.bool, device=uniforms.device)
        self.logits: th.Tensor | None = None  # [b, V] raw logits of each live row's next token
        self.values: th.Tensor | None = None  # [b] values of the states they are drawn in
        self.forwards = 0  # single-token forwards run (one per advance that continues any row)

    def __len__(self) -> int:
        return int(self.rows.shape[0])

    def live_rows(self) -> list[int]:
        return self.rows.tolist()

    # ---------------------------------------------------------------------------------------------------------
    # Joining and leaving
    # ---------------------------------------------------------------------------------------------------------

    def add(self, rows: th.Tensor, ids: th.Tensor, mask: th.Tensor, step: int, greedy: th.Tensor) -> None:
        """Prefill the windows of ``rows`` (env rows not live now), whose next token is for rollout step ``step``,
        and splice them into the batch."""
        from transformers.cache_utils import DynamicLayer

        windows = [list(w) for w in self.policy._rollout_cache.memo.windows(ids, mask)] if self.remember_ends else []
        cache, mask, logits, values = self.policy._rollout_cache.prefill(ids, mask)
        other = sorted({type(layer).__name__ for layer in cache.layers if type(layer) is not DynamicLayer})
        if other:
            raise ValueError(
                f"engine='hf' splices rows into one KV cache, which this model's cache layers ({', '.join(other)}, "
                "e.g. sliding-window attention) do not allow; use engine='step'"
            )
        if self.remember_ends:
            self.windows = windows if self.cache is None or len(self) == 0 else self.windows + windows
        n = rows.shape[0]
        steps = th.full((n,), step, dtype=th.long, device=rows.device)
        positions = mask.sum(dim=-1)
        if self.cache is None or len(self) == 0:
            self.cache, self.kv_mask, self.logits, self.values = cache, mask, logits, values
            self.rows, self.steps, self.positions = rows, steps, positions
            self.decoded, self.greedy = th.zeros_like(rows), greedy
            return
        length = max(self.kv_mask.shape[1], mask.shape[1])
        self.kv_mask = th.cat([left_pad_columns(self.kv_mask, length, dim=1), left_pad_columns(mask, length, dim=1)])
        for layer, new in zip(self.cache.layers, cache.layers, strict=True):
            layer.keys = th.cat([left_pad_columns(layer.keys, length), left_pad_columns(new.keys, length)])
            layer.values = th.cat([left_pad_columns(layer.values, length), left_pad_columns(new.values, length)])
        self.logits, self.values = th.cat([self.logits, logits]), th.cat([self.values, values])
        self.rows, self.steps = th.cat([self.rows, rows]), th.cat([self.steps, steps])
        self.positions = th.cat([self.positions, positions])
        self.decoded, self.greedy = th.cat([self.decoded, th.zeros_like(rows)]), th.cat([self.greedy, greedy])

    def remove(self, rows: th.Tensor) -> None:
        """Drop these env rows from the batch (those not in it are ignored)."""
        if len(self) and rows.numel():
            self._keep(~th.isin(self.rows, rows))

    def _keep(self, keep: th.Tensor) -> None:
        if bool(keep.all()):
            return
        self.kv_mask, self.logits, self.values = self.kv_mask[keep], self.logits[keep], self.values[keep]
        self.rows, self.steps, self.positions = self.rows[keep], self.steps[keep], self.positions[keep]
        self.decoded, self.greedy = self.decoded[keep], self.greedy[keep]
        if self.remember_ends:
            self.windows = [w for w, k in zip(self.windows, keep.tolist(), strict=True) if k]
        for layer in self.cache.layers:
            layer.keys, layer.values = layer.keys[keep], layer.values[keep]
        self._crop()

    def _crop(self) -> None:
        """Remove leading cache columns masked for every row."""
        any_valid = self.kv_mask.any(dim=0)
        if not bool(any_valid.any()):
            return
        start = int(any_valid.nonzero()[0, 0])
        if start:
            self.kv_mask = self.kv_mask[:, start:]
            for layer in self.cache.layers:
                layer.keys, layer.values = layer.keys[..., start:, :], layer.values[..., start:, :]

    # ---------------------------------------------------------------------------------------------------------
    # Decoding
    # ---------------------------------------------------------------------------------------------------------

    def advance(self, write: Writer) -> bool:
        """Draw every live row's next token (``write`` stores it), drop the rows whose turn ended, and run the
        single-token forward of the others. Returns whether any row's turn ended."""
        policy = self.policy
        log_probs, probs = categorical_tables(policy._processed(self.logits))
        values = self.values
        steps, rows = self.steps, self.rows
        chosen = sample_categorical(probs, self.uniforms[steps, rows])
        chosen = th.where(self.greedy, probs.argmax(dim=-1), chosen)
        chosen = th.where(self.explore[steps, rows], self.explore_tokens[steps, rows], chosen)
        write(rows, steps, chosen, log_probs.gather(-1, chosen[:, None]).squeeze(-1), values)
        self.steps, self.decoded = steps + 1, self.decoded + 1
        ended = th.isin(chosen, self.stop_ids) | (self.steps >= self.n_steps) | (self.decoded >= self.max_turn_tokens)
        fits = self.positions < self.width  # the env's window can hold another token
        ended |= ~fits
        if self.remember_ends:
            for window, token in zip(self.windows, chosen.tolist(), strict=True):
                window.append(token)
            # the rows whose end state's value may be read: those not terminated by their token
            wanted = fits & ~th.isin(chosen, self.terminal_ids)
            if bool((ended & wanted).any()):
                return self._forward_and_remember(chosen, ended, wanted)
        keep = ~ended
        if not bool(keep.any()):
            self.cache, self.kv_mask, self.logits, self.values = None, None, None, None
            empty = self.rows[:0]
            self.rows, self.steps, self.positions, self.decoded, self.greedy = (
                empty,
                empty,
                empty,
                empty,
                self.greedy[:0],
            )
            return True
        any_ended = not bool(keep.all())
        self._keep(keep)
        self._forward(chosen[keep])
        return any_ended

    def _forward_and_remember(self, chosen: th.Tensor, ended: th.Tensor, kept: th.Tensor) -> bool:
        """:meth:`advance`'s forward of the ``kept`` rows (those going on, and those whose turn ended in a state whose
        value may be read), the latter's windows then put into the policy's prefill memo before they leave."""
        chosen, ended = chosen[kept], ended[kept]
        self._keep(kept)
        if len(self):
            self._forward(chosen)
            keys = [tuple(w) if e else () for w, e in zip(self.windows, ended.tolist(), strict=True)]
            self.policy._rollout_cache.memo.remember(keys, self.cache, self.kv_mask, self.logits, self.values)
            self._keep(~ended)
        if not len(self):
            self.cache = None
        return True

    def _forward(self, chosen: th.Tensor) -> None:
        self.kv_mask = th.cat([self.kv_mask, th.ones_like(self.kv_mask[:, :1])], dim=1)
        hidden = self.policy._step_trunk(chosen[:, None], self.kv_mask, self.positions[:, None], self.cache)[:, -1]
        self.logits, self.values = self.policy._logits(hidden), self.policy._value(hidden, None, None)
        self.positions = self.positions + 1
        self.forwards += 1
