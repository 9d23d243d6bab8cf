"""The built-in decoder of :class:`~sb3_grpo.policies.CausalLMPolicy`: a lean batched decode loop over the LM's own
KV cache, for the ``"hf"`` rollout engine (:mod:`sb3_grpo.engines.turn_queues`).

:class:`LiveBatch` holds the rows being decoded, each with its KV cache (one ``transformers.DynamicCache``, the rows
right-aligned with a 2-D mask over its columns, as the rollout cache keeps them), its next position and the
rollout step its next token is for. Rows join with one prefill of their windows (:meth:`LiveBatch.add`, spliced
into the batch; a window the policy's prefill memo holds, such as a prompt warmed at the rollout's start, is copied
from it) and leave when their turn ends (:meth:`LiveBatch.advance`) or the env changed their window
(:meth:`LiveBatch.remove`). Every :meth:`~LiveBatch.advance` is one single-token forward of all live rows, each drawing
its next token as the policy's :meth:`~sb3_grpo.policies.CausalLMPolicy.forward` draws it: the processed
distribution (temperature, top-k, top-p), inverse-transform sampling (:func:`.token_sampling.draw_tokens`) from the
uniform the caller's table holds for that row and step, the mode for greedy rows, and the exploration mixture's
uniform token where the table says the step explores. Rows that joined at different rollout steps share the
forwards (continuous batching), so a reset row never decodes alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch as th

from sb3_grpo.policies.token_sampling import categorical_tables, draw_tokens, token_log_probs
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
        #: whether a greedy row has joined (until then no draw needs the argmax, a pass over the vocabulary per step)
        self._any_greedy = False
        self.alive = th.zeros(0, dtype=th.bool, device=uniforms.device)  # slots holding a row (others: left, masked)
        self._n_alive = 0
        self.logits: th.Tensor | None = None  # [b, V] raw logits of each live row's next token
        self.values: th.Tensor | None = None  # [b] values of the states they are drawn in
        self.forwards = 0  # single-token forwards run (one per advance that continues any row)

    def __len__(self) -> int:
        return self._n_alive

    def live_rows(self) -> list[int]:
        """The env rows being decoded (the batch's slots may also hold rows that left: not these)."""
        return self._live(self.rows).tolist()

    def live_steps(self) -> list[int]:
        """The rollout step each live row's next token is for, in :meth:`live_rows`' order."""
        return self._live(self.steps).tolist()

    def _live(self, values: th.Tensor) -> th.Tensor:
        return values if self._n_alive == len(self.rows) else values[self.alive]

    # ---------------------------------------------------------------------------------------------------------
    # Joining and leaving
    # ---------------------------------------------------------------------------------------------------------

    def add(self, rows: th.Tensor, ids: th.Tensor, mask: th.Tensor, step: int, greedy: th.Tensor) -> None:
        """Prefill the windows of ``rows`` (env rows not live now), whose next token is for rollout step ``step``,
        and put them into the batch: into the slots of rows that left, in place, where their windows fit the cache,
        else appended (the whole cache copied)."""
        from transformers.cache_utils import DynamicLayer

        windows = [list(w) for w in self.policy._rollout_cache.memo.windows(ids, mask)] if self.remember_ends else []
        cache, mask, logits, values = self.policy._rollout_cache.prefill(ids, mask)
        other = sorted({type(layer).__name__ for layer in cache.layers if type(layer) is not DynamicLayer})
        if other:
            raise ValueError(
                f"engine='hf' splices rows into one KV cache, which this model's cache layers ({', '.join(other)}, "
                "e.g. sliding-window attention) do not allow; use engine='step'"
            )
        n = rows.shape[0]
        self._any_greedy = self._any_greedy or bool(greedy.any())
        steps = th.full((n,), step, dtype=th.long, device=rows.device)
        positions = mask.sum(dim=-1)
        if self.cache is None or len(self) == 0:
            self.cache, self.kv_mask, self.logits, self.values = cache, mask, logits, values
            self.rows, self.steps, self.positions = rows.clone(), steps, positions  # slots are written in place
            self.decoded, self.greedy = th.zeros_like(rows), greedy.clone()
            self.alive, self._n_alive = th.ones_like(rows, dtype=th.bool), n
            self.windows = windows
            return
        layers = [(layer.keys, layer.values) for layer in cache.layers]
        new = _Joining(layers, mask, logits, values, rows, steps, positions, greedy, windows)
        free = (~self.alive).nonzero().squeeze(1)
        if free.numel() and mask.shape[1] > self.kv_mask.shape[1]:
            self._compact()  # windows longer than the cache: no slot fits them
        elif free.numel():
            filled = min(n, int(free.numel()))
            self._fill(free[:filled], new.part(0, filled))
            if filled == n:
                return
            new = new.part(filled, n)
        self._append(new)

    def _fill(self, slots: th.Tensor, new: _Joining) -> None:
        """Write joining rows into the slots of rows that left, in place (left-padded to the cache's columns)."""
        length = self.kv_mask.shape[1]
        self.kv_mask[slots] = left_pad_columns(new.mask, length, dim=1)
        for layer, joining in zip(self.cache.layers, new.layers, strict=True):
            layer.keys[slots] = left_pad_columns(joining[0], length)
            layer.values[slots] = left_pad_columns(joining[1], length)
        self.logits[slots], self.values[slots] = new.logits, new.values
        self.rows[slots], self.steps[slots], self.positions[slots] = new.rows, new.steps, new.positions
        self.decoded[slots], self.greedy[slots] = 0, new.greedy
        self.alive[slots] = True
        self._n_alive += len(new.rows)
        if self.remember_ends:
            for slot, window in zip(slots.tolist(), new.windows, strict=True):
                self.windows[slot] = window

    def _append(self, new: _Joining) -> None:
        """Append joining rows to the batch (every layer's cache copied once, left-padded to the longer)."""
        length = max(self.kv_mask.shape[1], new.mask.shape[1])
        self.kv_mask = th.cat(
            [left_pad_columns(self.kv_mask, length, dim=1), left_pad_columns(new.mask, length, dim=1)]
        )
        for layer, (keys, values) in zip(self.cache.layers, new.layers, strict=True):
            layer.keys = th.cat([left_pad_columns(layer.keys, length), left_pad_columns(keys, length)])
            layer.values = th.cat([left_pad_columns(layer.values, length), left_pad_columns(values, length)])
        self.logits, self.values = th.cat([self.logits, new.logits]), th.cat([self.values, new.values])
        self.rows, self.steps = th.cat([self.rows, new.rows]), th.cat([self.steps, new.steps])
        self.positions = th.cat([self.positions, new.positions])
        self.decoded = th.cat([self.decoded, th.zeros_like(new.rows)])
        self.greedy = th.cat([self.greedy, new.greedy])
        self.alive = th.cat([self.alive, th.ones_like(new.rows, dtype=th.bool)])
        self._n_alive += len(new.rows)
        if self.remember_ends:
            self.windows = self.windows + new.windows

    def remove(self, rows: th.Tensor) -> None:
        """Drop these env rows from the batch (those not in it are ignored)."""
        if len(self) and rows.numel():
            self._leave(self.alive & th.isin(self.rows, rows))

    def _leave(self, leaving: th.Tensor) -> None:
        """These slots' rows leave the batch: their slots stay, masked, until rows join into them (or the batch is
        compacted, :meth:`_compact`), so that a row leaving copies no cache."""
        n = int(leaving.sum())
        if not n:
            return
        self.alive = self.alive & ~leaving
        self._n_alive -= n
        self.kv_mask[leaving] = 0
        if self.remember_ends:
            for slot in leaving.nonzero().squeeze(1).tolist():
                self.windows[slot] = []
        if self._n_alive == 0:
            self._clear()
        else:
            self._crop()

    def _clear(self) -> None:
        self.cache, self.kv_mask, self.logits, self.values = None, None, None, None
        empty = self.rows[:0]
        self.rows, self.steps, self.positions, self.decoded = empty, empty, empty, empty
        self.greedy, self.alive, self._n_alive, self.windows = self.greedy[:0], self.alive[:0], 0, []

    def _compact(self) -> None:
        """Drop the slots of rows that left (every layer's cache gathered once)."""
        keep = self.alive
        if bool(keep.all()):
            return
        self.kv_mask, self.logits, self.values = self.kv_mask[keep], self.logits[keep], self.values[keep]
        self.rows, self.steps, self.positions = self.rows[keep], self.steps[keep], self.positions[keep]
        self.decoded, self.greedy, self.alive = self.decoded[keep], self.greedy[keep], self.alive[keep]
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
        if 2 * len(self) < len(self.rows):
            self._compact()  # most slots empty: fewer rows to run than a copy of the cache costs
        policy = self.policy
        full = len(self) == len(self.rows)
        live = None if full else self.alive.nonzero().squeeze(1)

        def pick(t: th.Tensor) -> th.Tensor:
            return t if live is None else t[live]

        processed = policy._processed(pick(self.logits))
        values, steps, rows, greedy = pick(self.values), pick(self.steps), pick(self.rows), pick(self.greedy)
        chosen, log_normaliser = draw_tokens(processed, self.uniforms[steps, rows])
        if self._any_greedy:  # the distribution's mode, as the step engine's greedy members take it
            chosen = th.where(greedy, categorical_tables(processed)[1].argmax(dim=-1), chosen)
        chosen = th.where(self.explore[steps, rows], self.explore_tokens[steps, rows], chosen)
        write(rows, steps, chosen, token_log_probs(processed, log_normaliser, chosen), values)
        steps, decoded = steps + 1, pick(self.decoded) + 1
        ended = th.isin(chosen, self.stop_ids) | (steps >= self.n_steps) | (decoded >= self.max_turn_tokens)
        fits = pick(self.positions) < self.width  # the env's window can hold another token
        ended |= ~fits
        wanted = fits & ~th.isin(chosen, self.terminal_ids)  # rows whose end state's value may be read
        if live is None:
            self.steps, self.decoded, tokens = steps, decoded, chosen
        else:  # back into the slots; empty slots feed a masked dummy token
            self.steps[live], self.decoded[live] = steps, decoded
            tokens = th.zeros_like(self.rows)
            tokens[live] = chosen
            ended, wanted = self._slots(live, ended), self._slots(live, wanted)
        if self.remember_ends:
            slots = range(len(self.rows)) if live is None else live.tolist()
            for slot, token in zip(slots, chosen.tolist(), strict=True):
                self.windows[slot].append(token)
            if bool((ended & wanted).any()):
                return self._forward_and_remember(tokens, ended, wanted)
        any_ended = bool(ended.any())
        self._leave(ended)
        if len(self):
            self._forward(tokens)
        return any_ended

    def _slots(self, live: th.Tensor, values: th.Tensor) -> th.Tensor:
        """A per-slot mask from one value per live row (``False`` in the empty slots)."""
        out = th.zeros_like(self.alive)
        out[live] = values
        return out

    def _forward_and_remember(self, tokens: th.Tensor, ended: th.Tensor, wanted: th.Tensor) -> bool:
        """:meth:`advance`'s forward of the rows going on and of those whose turn ended in a state whose value may be
        read (``ended & wanted``), the latter's windows then put into the policy's prefill memo before they leave.
        Masks are per slot."""
        self._leave(ended & ~wanted)
        if len(self):
            self._forward(tokens)
            ending = (ended & self.alive).tolist()
            keys = [tuple(w) if e else () for w, e in zip(self.windows, ending, strict=True)]
            self.policy._rollout_cache.memo.remember(keys, self.cache, self.kv_mask, self.logits, self.values)
            self._leave(ended & self.alive)
        return True

    def _forward(self, tokens: th.Tensor) -> None:
        """One single-token forward of every slot (``tokens`` per slot): an empty slot sees only its own dummy token,
        whose column is masked afterwards, and keeps its position."""
        self.kv_mask = th.cat([self.kv_mask, th.ones_like(self.kv_mask[:, :1])], dim=1)
        hidden = self.policy._step_trunk(tokens[:, None], self.kv_mask, self.positions[:, None], self.cache)[:, -1]
        self.logits, self.values = self.policy._logits(hidden), self.policy._value(hidden, None, None)
        if len(self) == len(self.rows):
            self.positions = self.positions + 1
        else:
            self.kv_mask[:, -1] = self.alive.to(self.kv_mask.dtype)
            self.positions = self.positions + self.alive.to(self.positions.dtype)
        self.forwards += 1


class _Joining(NamedTuple):
    """Rows joining the batch, prefilled: each layer's ``(keys, values)`` and the per-row tensors."""

    layers: list[tuple[th.Tensor, th.Tensor]]
    mask: th.Tensor
    logits: th.Tensor
    values: th.Tensor
    rows: th.Tensor
    steps: th.Tensor
    positions: th.Tensor
    greedy: th.Tensor
    windows: list[list[int]]

    def part(self, start: int, stop: int) -> _Joining:
        """Rows ``start:stop`` of them."""
        cut = slice(start, stop)
        return _Joining([(k[cut], v[cut]) for k, v in self.layers], self.mask[cut], self.logits[cut],
                        self.values[cut], self.rows[cut], self.steps[cut], self.positions[cut], self.greedy[cut],
                        self.windows[cut])  # fmt: skip
