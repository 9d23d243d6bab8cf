"""The prefill memo of the rollout KV cache: keys/values, logits and value of recently prefilled windows.

:class:`~sb3_grpo.policies.kv_cache.RolloutCache` copies a window it has prefilled before under the same parameters
from here instead of running a forward (see :mod:`sb3_grpo.policies.kv_cache` for where that happens).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch as th

__all__ = ["FROZEN_MEMO_BYTES", "MAX_OPENINGS", "MEMO_TOKENS", "PrefillMemo", "cache_of", "memo_budget"]

#: The prefill memo keeps about this many tokens' keys and values (a few dozen prompt windows of a real model), within
#: :data:`MEMO_MIN_BYTES` and :data:`MEMO_MAX_BYTES`.
MEMO_TOKENS = 16_384
MEMO_MIN_BYTES = 64 * 2**20
MEMO_MAX_BYTES = 2**30
#: The prefill memo's budget in a frozen copy of a policy (a league's opponent snapshot): its parameters never change,
#: so no update empties its memo, and at the learner's budget every snapshot would keep that much of game
#: conversations that seldom recur; this much keeps the few windows that do (a game's opening).
FROZEN_MEMO_BYTES = MEMO_MIN_BYTES
#: The memo keeps the keys and values of this many shared openings (the tokens a batch's prompts begin with), the most
#: recently used, so that a later prefill of prompts that begin the same way runs only the tokens after them.
MAX_OPENINGS = 4


def memo_budget(lm_config: Any, dtype_bytes: int) -> int:
    """The prefill memo's budget for an LM: :data:`MEMO_TOKENS` tokens of its keys and values (``2 * layers *
    key-value heads * head size * dtype_bytes`` a token), at least 64 MiB (a small LM's whole prompt set) and at most
    1 GiB. SmolLM2-135M in float32 keeps about 750 MB, some 280 of its chat prompts of Arithmetic-v0's size.

    :param lm_config: The LM's Hugging Face config.
    :param dtype_bytes: Bytes of one cached number (4 for float32).
    """
    layers = getattr(lm_config, "num_hidden_layers", None) or getattr(lm_config, "n_layer", None) or 1
    heads = getattr(lm_config, "num_attention_heads", None) or getattr(lm_config, "n_head", None) or 1
    kv_heads = getattr(lm_config, "num_key_value_heads", None) or heads
    hidden = getattr(lm_config, "hidden_size", None) or getattr(lm_config, "n_embd", None) or 1
    head_dim = getattr(lm_config, "head_dim", None) or hidden // heads
    per_token = 2 * int(layers) * int(kv_heads) * int(head_dim) * int(dtype_bytes)
    return int(min(MEMO_MAX_BYTES, max(MEMO_MIN_BYTES, per_token * MEMO_TOKENS)))


class PrefillMemo:
    """Keys/values, logits and value of recently prefilled windows, for the current parameters.

    A window's keys/values depend only on its valid tokens (positions count valid tokens, and no other token is
    attended to), so a window that comes back while the parameters are unchanged needs no forward. In RL on text
    that is the rule rather than the exception: every member of a prompt group starts its episode on the same
    prompt (each at its own step, so each start is a separate prefill), and prompt sets are small next to the
    number of episodes. The memo keeps the most recently used windows up to ``max_bytes`` of keys/values, and is
    cleared whenever the parameters change (:class:`~sb3_grpo.policies.kv_cache.RolloutCache` checks the version at
    every prefill).

    Beside whole windows it keeps a few *openings*: the leading tokens that the rows of a prefill shared (a chat
    template's system message and the instruction's first words), with their keys and values. A later prefill of
    prompts that begin with one, typically a single env's auto-reset onto a new prompt in the middle of a rollout,
    runs only the tokens after it (:meth:`~sb3_grpo.policies.kv_cache.RolloutCache._compute_shared_prefill`).

    :param max_bytes: budget for the stored keys and values of whole windows (least recently used windows are
        evicted first); the openings, at most :data:`MAX_OPENINGS`, each at most a tenth of it, come on top.
    """

    def __init__(self, max_bytes: int = 64 * 2**20):
        self.max_bytes = max_bytes
        self.version: int | None = None
        self._entries: OrderedDict[tuple[int, ...], tuple[list[tuple[th.Tensor, th.Tensor]], th.Tensor, th.Tensor]] = (
            OrderedDict()
        )
        self._bytes = 0
        self._openings: OrderedDict[tuple[int, ...], list[tuple[th.Tensor, th.Tensor]]] = OrderedDict()
        #: Windows queued to be prefilled with the next prefills that run (``window -> (ids [W], mask [W])``, first
        #: queued first): :meth:`~sb3_grpo.policies.kv_cache.RolloutCache.prefetch`.
        self.pending: OrderedDict[tuple[int, ...], tuple[th.Tensor, th.Tensor]] = OrderedDict()

    def clear(self) -> None:
        self._entries.clear()
        self._bytes = 0
        self._openings.clear()
        self.pending.clear()

    def __len__(self) -> int:
        return len(self._entries)

    @staticmethod
    def windows(ids: th.Tensor, mask: th.Tensor) -> list[tuple[int, ...]]:
        """The key of each row: its valid token ids, in order."""
        return [
            tuple(i for i, m in zip(row_ids, row_mask) if m) for row_ids, row_mask in zip(ids.tolist(), mask.tolist())
        ]

    def get(self, window: tuple[int, ...]):
        entry = self._entries.get(window)
        if entry is not None:
            self._entries.move_to_end(window)
        return entry

    def remember(
        self, windows: list[tuple[int, ...]], cache: Any, kv_mask: th.Tensor, logits: th.Tensor, values: th.Tensor
    ) -> None:
        """Store each row of a freshly prefilled batch (right-aligned: row ``b``'s tokens are its last columns)."""
        for b, window in enumerate(windows):
            if window in self._entries or not window:
                continue
            n = len(window)
            if int(kv_mask[b, -n:].sum()) != n:  # not a plain right-aligned prefill: do not guess
                continue
            layers = [
                (layer.keys[b : b + 1, :, -n:].clone(), layer.values[b : b + 1, :, -n:].clone())
                for layer in cache.layers
            ]
            size = self._nbytes(layers)
            if size > self.max_bytes:
                continue
            self._entries[window] = (layers, logits[b].clone(), values[b].clone())
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, (old, _, _) = self._entries.popitem(last=False)
                self._bytes -= self._nbytes(old)

    def opening(self, tokens: tuple[int, ...]) -> tuple[int, list[tuple[th.Tensor, th.Tensor]]] | None:
        """The longest remembered opening that ``tokens`` begin with (all of ``tokens`` at most): ``(its length, each
        cache layer's keys and values [1, H, length, D])``, or ``None``."""
        best = max((key for key in self._openings if tokens[: len(key)] == key), key=len, default=None)
        if best is None:
            return None
        self._openings.move_to_end(best)
        return len(best), self._openings[best]

    def remember_opening(self, tokens: tuple[int, ...], cache: Any) -> None:
        """Keep the keys and values of ``tokens``, a prefill's shared leading tokens, from ``cache`` (one row, exactly
        ``len(tokens)`` columns), unless they exceed a tenth of the budget."""
        if not tokens or self._nbytes([(layer.keys, layer.values) for layer in cache.layers]) > self.max_bytes // 10:
            return
        self._openings[tokens] = [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]
        self._openings.move_to_end(tokens)
        while len(self._openings) > MAX_OPENINGS:
            self._openings.popitem(last=False)

    @staticmethod
    def _nbytes(layers: list[tuple[th.Tensor, th.Tensor]]) -> int:
        return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in layers)

    @staticmethod
    def assemble(entries: list, lm_config: Any) -> tuple[Any, th.Tensor, th.Tensor, th.Tensor]:
        """One right-aligned batch ``(cache, kv_mask, logits, values)`` from memo entries, in order."""
        length = max(layers[0][0].shape[-2] for layers, _, _ in entries)
        runs: list[tuple[list, int, int]] = []  # (entry's layers, first row, end): consecutive rows of one entry
        for b, entry in enumerate(entries):  # the members of a prompt group share one, usually side by side
            if runs and runs[-1][0] is entry[0] and runs[-1][2] == b:
                runs[-1] = (entry[0], runs[-1][1], b + 1)
            else:
                runs.append((entry[0], b, b + 1))
        per_layer = []
        for i in range(len(entries[0][0])):
            keys = _right_aligned([(layers[i][0], lo, hi) for layers, lo, hi in runs], len(entries), length)
            values = _right_aligned([(layers[i][1], lo, hi) for layers, lo, hi in runs], len(entries), length)
            per_layer.append((keys, values))
        cache = cache_of(per_layer, lm_config)
        first = entries[0][0][0][0]
        kv_mask = th.zeros(len(entries), length, dtype=th.long, device=first.device)
        for b, (layers, _, _) in enumerate(entries):
            kv_mask[b, length - layers[0][0].shape[-2] :] = 1
        logits = th.stack([e[1] for e in entries])
        values = th.stack([e[2] for e in entries])
        return cache, kv_mask, logits, values


def cache_of(layers: list[tuple[th.Tensor, th.Tensor]], lm_config: Any) -> Any:
    """A ``transformers.DynamicCache`` holding these keys and values, one ``(keys, values)`` per cache layer (a mixture
    of experts keeps K cache layers per model layer, so there may be more than the config's layers)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=lm_config)
    while len(cache.layers) < len(layers):
        cache.layers.append(type(cache.layers[0])())
    for i, (keys, values) in enumerate(layers):
        cache.update(keys, values, i)
    return cache


def _right_aligned(parts: list[tuple[th.Tensor, int, int]], batch: int, length: int) -> th.Tensor:
    """``[batch, H, length, D]`` with each ``(part [1, H, n, D], lo, hi)`` in the last ``n`` columns of rows ``lo`` to
    ``hi - 1`` and zeros before them (every row given once): one write of each part, broadcast over its rows."""
    first = parts[0][0]
    out = first.new_empty(batch, first.shape[1], length, first.shape[-1])
    for part, lo, hi in parts:
        start = length - part.shape[-2]
        out[lo:hi, :, :start] = 0
        out[lo:hi, :, start:] = part
    return out
