"""The rollout KV cache of :class:`~sb3_grpo.policies.CausalLMPolicy`: one single-token forward per rollout step.

:class:`RolloutCache` keeps, per batch size (the last two used), a ``transformers.DynamicCache`` with every row's
keys/values right-aligned in one batch, classifies each row of a call against the cached window, and brings the
cache to the new windows with at most one batched single-token step plus one prefill of the rows that changed
otherwise. It sees the policy only through the callables it is given: the LM body (``trunk``), the output layer
(``logits``), the critic (``value``) and the parameters (for the version check). The design is documented on
:class:`~sb3_grpo.policies.CausalLMPolicy` and below.

The window rules it shares with the policy's full-recompute path, and the cache math, are small pure functions in
:mod:`sb3_grpo.policies.windows` (:func:`positions_from_mask`, :func:`trim_padding`, :func:`extends_by_one`,
:func:`extension_lengths`, :func:`left_pad_columns`, :func:`realign_columns`) that the tests pin down; the memo of
prefilled windows is :class:`~sb3_grpo.policies.prefill_memo.PrefillMemo`. This module and ``sb3_grpo.policies``
re-export them.

Incremental decoding in detail
------------------------------
Under ``torch.no_grad`` (rollout, ``predict_values``, ``predict``) and with
``use_cache=True``, the policy keeps one ``transformers.DynamicCache`` per batch size (the last two used) holding
every row's keys/values right-aligned in one batch, with an explicit 2-D mask over the cache columns. The cache is
a :class:`RolloutCache` (``self._rollout_cache``), which runs
the LM through the policy's ``_trunk``, ``_logits`` and ``_value``. Each row of a call is classified against the
cached window (:meth:`RolloutCache._classify`):

- ``same``: the cached window; its stored logits and value are returned, no forward;
- ``extend``: the cached window plus ``k >= 1`` tokens (:func:`extension_lengths`: ``new[:-k] == old[k:]`` for
  ids and mask, the last ``k`` new tokens valid, nothing valid dropped off the left edge). ``k = 1`` is the
  action of a single-turn episode; in an interactive episode the step that ends the agent's turn appends the
  action *and* the environment's reply, ``k = 1 + len(reply)``;
- ``replace``: the window *before* the look-ahead (below) plus ``k >= 1`` tokens that do not start with the
  look-ahead one; the look-ahead column is masked out for that row (a masked hole), then it is treated as
  ``extend``;
- ``back``: the window before the look-ahead itself (e.g. ``predict`` then ``forward`` on one observation): the
  look-ahead column is masked out and the outputs kept from before the look-ahead are returned;
- ``redo``: anything else (auto-reset, new group prompt, an outside call with other observations).

All ``extend``/``replace`` rows share one batched forward over the cache. When every row adds one token it is a
single-token step (2-D mask ``[cache mask, new column]``, position ``n_valid - 1``; other rows feed a masked dummy
token). When some row adds more (an interactive reply), it is one forward over ``K = max k`` new columns: row
``b``'s ``k_b`` tokens sit in the last ``k_b`` of them, at positions ``n_valid - k_b .. n_valid - 1``, the columns
before them are masked dummies; afterwards each row's columns are realigned (:func:`realign_columns`) so that its
masked new columns lead the row (and get cropped) instead of leaving holes. Extending a row by ``k`` tokens thus
costs a forward over ``k`` positions instead of a prefill of the whole window (``textrl-bench perf``'s interactive
row measures both on ``GuessNumber-v0``); since that forward runs every row of the batch over ``K`` columns, the
rows that add several tokens are prefilled instead when their windows are fewer positions (:func:`extension_pays`:
a large batch, short windows). ``redo`` rows get one
prefill over those rows only; their cache is left-padded with masked slots and spliced into the batch cache. A
prefilled window's keys/values, logits and value are remembered (:class:`PrefillMemo`, 64 MiB,
least recently used out first, emptied whenever the parameters change), so a window seen before under the same
parameters, typically a prompt that another member of the group, or an earlier episode, began with, is copied
instead of recomputed.

*Look-ahead.* After ``forward`` samples the actions, it immediately runs the single-token step for
``window + action`` of every row (:meth:`RolloutCache.look_ahead`).
In ``collect_rollouts`` the next observation of every continuing env is exactly that, so the next ``forward`` finds
those rows ``same``: still one batched forward per generated token, just computed one call earlier. The payoff is
SB3's bootstrap of truncated episodes, which calls ``predict_values(terminal_obs)`` one env at a time: the terminal
window is a look-ahead row, so it is a lookup (:meth:`RolloutCache._serve_from_other_batches`)
rather than a batch-of-one forward per finished env. Calls with a new batch size whose rows all match cached rows
(same, one token past, or replaced) are served from those rows too.

*Fast paths of the rollout loop.* A call whose rows are all ``same`` (the usual call after a look-ahead) returns the
stored outputs after one classification, and the look-ahead itself needs none: every row of ``window + action`` is
``extend`` by construction (a full window, whose next one would drop a token, gets no look-ahead), so it goes straight
to the batched single-token step. Mixed exploration (GRPO) replaces some sampled tokens before the look-ahead
(``CausalLMPolicy.forward(action_filter=...)``), so the look-ahead already holds the tokens taken and no ``replace``
rows follow.

*Prefills batched across rows and steps.* With EOS on, some env auto-resets at nearly every step, and each reset
would cost a prefill forward at that step. Before a rollout, GRPO (unless every extra is off: then it must round
floats exactly as PPO does) hands the policy the env's prompt windows
(:meth:`RolloutCache.warm`, through ``CausalLMPolicy.warm_prefills``; when the env has at most a few prompts per env):
they are prefilled in one batched forward into the :class:`PrefillMemo`, so every reset during the rollout copies its
prompt's keys/values from the memo instead of running a forward. The outputs are the prefill's (a batched forward of
other rows: equal up to float rounding, as every memo entry is); only the number of forwards changes. A table too
large for that (most of it would go unused) is not prefilled; GRPO queues instead the prompts the env's groups will
draw in their next rounds (:meth:`RolloutCache.prefetch`), and each prefill after the rollout's first runs
:data:`PREFETCH_ROWS` of them in its forward, so the episodes that start on them later copy them.

*Shared starts prefilled once.* The prompts of a text task usually begin alike (a chat template's system message,
an instruction). A prefill whose rows share their first :data:`SHARED_PREFILL_MIN` tokens or more runs those once,
copies their keys/values to every row, and runs each row's own tokens over them
(:meth:`RolloutCache._compute_shared_prefill`); the result is laid out as a full prefill's, so the memo keeps it.
The memo also keeps those shared tokens' keys and values as an *opening* (:meth:`PrefillMemo.remember_opening`, a
few, emptied with the memo): a later prefill of prompts that begin with one runs only the tokens after it, over a copy
of its cache. That is what an env's auto-reset onto a new prompt costs in the middle of a rollout with EOS on: a
prefill of one row, whose system message and instruction's first words (27 of the 56 tokens of a SmolLM2 chat prompt
of ``Arithmetic-v0``) now come from the opening.

Leading cache columns masked for every row are cropped after each step, so the cache stays within ``W`` columns
(plus at most one hole per replaced token in an episode). The cache is dropped when the parameters change (a
version counter over the parameters' in-place update counters, plus ``set_training_mode(True)``) and is never
used with gradients (``evaluate_actions``, ``evaluate_sequences`` always recompute in full). Models whose cache
layers are not plain ``DynamicLayer`` (sliding windows, linear attention) fall back to full recomputation.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch as th

from sb3_grpo.policies.prefill_memo import PrefillMemo, cache_of
from sb3_grpo.policies.windows import (
    common_prefix_length,
    extends_by_one,
    extension_lengths,
    last_tokens_block,
    left_pad_columns,
    positions_from_mask,
    realign_columns,
    trim_padding,
)

__all__ = [
    "PREFETCH_ROWS",
    "SHARED_PREFILL_MIN",
    "PrefillMemo",
    "RolloutCache",
    "extends_by_one",
    "extension_pays",
    "extension_lengths",
    "gather_columns",
    "left_pad_columns",
    "positions_from_mask",
    "realign_columns",
    "trim_padding",
]


# --------------------------------------------------------------------------------------------------------------
# Rollout cache state
# --------------------------------------------------------------------------------------------------------------


class _CacheUnsupported(Exception):
    """The model's cache layers cannot be spliced / cropped per row (e.g. sliding-window layers)."""


@dataclass
class _BatchCache:
    """KV cache and bookkeeping for one batch of envs (one batch size).

    Invariants: ``cache`` holds, for every row, the keys/values of exactly the valid tokens of ``ids[b]`` in order;
    ``kv_mask[b]`` marks which cache columns are real for row ``b`` (right-aligned: a suffix, except for the masked
    hole a replaced look-ahead token leaves); leading columns masked for every row are cropped, so ``K`` stays
    within ``W`` plus at most one hole per step of an episode; ``logits``/``values`` are the outputs for ``ids``;
    ``version`` is the parameter version they were computed with. After a look-ahead step, ``prev_ids`` /
    ``prev_mask`` hold the window before it (the look-ahead token is the last cache column), else ``None``.
    """

    cache: Any
    kv_mask: th.Tensor
    ids: th.Tensor
    mask: th.Tensor
    logits: th.Tensor
    values: th.Tensor
    version: int
    prev_ids: th.Tensor | None = None
    prev_mask: th.Tensor | None = None
    prev_logits: th.Tensor | None = None
    prev_values: th.Tensor | None = None


def gather_columns(cache: Any, kv_mask: th.Tensor, index: th.Tensor) -> th.Tensor:
    """Read every row's cache columns through ``index`` (``[B, L]``: new column ``c`` of row ``b`` is old column
    ``index[b, c]``): the keys and values of ``cache`` in place, and the mask returned."""
    for layer in cache.layers:
        b, h, length, d = layer.keys.shape
        gather = index.view(b, 1, length, 1).expand(b, h, length, d)
        layer.keys, layer.values = layer.keys.gather(2, gather), layer.values.gather(2, gather)
    return kv_mask.gather(1, index)


class _Rows(NamedTuple):
    """How each row of a call relates to the cached window (see :meth:`RolloutCache._classify`)."""

    same: th.Tensor
    extend: th.Tensor
    replace: th.Tensor
    back: th.Tensor
    redo: th.Tensor
    k: th.Tensor


# --------------------------------------------------------------------------------------------------------------
# The cache
# --------------------------------------------------------------------------------------------------------------


#: A prefill runs the leading tokens its rows share once when there are at least this many (a chat template's system
#: message is 20-30 tokens); below it, the extra forward costs more than it saves.
SHARED_PREFILL_MIN = 8
#: A prefill that runs takes at most this many windows queued ahead (:meth:`RolloutCache.prefetch`) into its forward.
PREFETCH_ROWS = 8


def extension_pays(tail: int, batch: int, redo_positions: int) -> bool:
    """Whether extending the rows that add several tokens (an interactive reply) computes fewer positions than a
    prefill of those rows' whole windows.

    The multi-token step runs every row of the batch over ``tail`` new columns (rows adding fewer tokens feed masked
    dummies) and then re-aligns the whole cache, so beyond the one-token step that every row takes anyway it costs
    ``batch * (tail - 1)`` positions; a prefill of the extended rows costs their valid tokens. Both give the same
    outputs (each equals a full recompute, tested), so the cheaper is taken.

    :param tail: The most tokens a row adds (``max k``, at least 2).
    :param batch: Rows in the batch.
    :param redo_positions: Valid tokens of the rows that add several tokens (their windows' lengths).
    """
    return batch * (tail - 1) < redo_positions


def distinct_rows(windows: list[tuple[int, ...]], rows: list[int]) -> list[int]:
    """``rows`` without those whose window an earlier row of ``rows`` has: one forward per distinct window (the members
    of a prompt group that start an episode in the same step share it through the memo).

    >>> distinct_rows([(1, 2), (3,), (1, 2)], [0, 1, 2])
    [0, 1]
    """
    first: dict[tuple[int, ...], int] = {}
    for i in rows:
        first.setdefault(windows[i], i)
    return list(first.values())


class RolloutCache:
    """The rollout KV cache of one policy: a ``_BatchCache`` per batch size (the last two used).

    The policy asks it for the outputs of a batch of windows (:meth:`outputs`) under ``no_grad`` and, after sampling,
    to look one token ahead (:meth:`look_ahead`); it drops everything on :meth:`reset` and whenever the parameters
    changed (a version counter over the parameters' in-place update counters). Each row of a call is classified
    against the cached window (:meth:`_classify`) and brought up to date by :meth:`_advance`; a new batch size
    whose rows all match cached rows is served from those (:meth:`_serve_from_other_batches`). Models whose cache
    layers are not plain ``DynamicLayer`` (sliding windows, linear attention) set ``supported`` to False, with
    one warning (per cache, so per policy) that names the model and says what it costs.

    :param trunk: ``trunk(ids, mask, position_ids, cache=None) -> [B, L, d]``: the LM body's final hidden states,
        filling ``cache`` (a ``DynamicCache``) when given.
    :param logits: ``logits(hidden) -> [B, V]``: raw next-token logits (float32).
    :param value: ``value(hidden_last, ids, mask) -> [B]``: values of the states given by whole windows.
    :param parameters: ``parameters() -> iterable of tensors``: the policy's parameters (for the version check).
    :param lm_config: the LM's config (for ``DynamicCache(config=...)``).
    :param model_name: the LM's class name, for the warning when its cache cannot be kept (``None``: the config's
        ``model_type``).
    :param step_trunk: ``trunk`` for one new token per row (the decoding steps), e.g. a lean forward of the same
        numbers (``None``: ``trunk``).
    :param memo_bytes: The prefill memo's budget (``None``: :class:`~sb3_grpo.policies.prefill_memo.PrefillMemo`'s
        default).
    """

    def __init__(
        self,
        trunk: Callable[..., th.Tensor],
        logits: Callable[[th.Tensor], th.Tensor],
        value: Callable[[th.Tensor, th.Tensor, th.Tensor], th.Tensor],
        parameters: Callable[[], Iterable[th.Tensor]],
        lm_config: Any,
        model_name: str | None = None,
        step_trunk: Callable[..., th.Tensor] | None = None,
        memo_bytes: int | None = None,
    ):
        self._model_name = model_name or str(getattr(lm_config, "model_type", None) or type(lm_config).__name__)
        self._trunk = trunk
        self._step_trunk = step_trunk or trunk
        self._logits = logits
        self._value = value
        self._parameters = parameters
        self._lm_config = lm_config
        self.states: OrderedDict[int, _BatchCache] = OrderedDict()
        self.supported = True
        #: The most tokens one forward extends a row by (``None``: any); a longer extension is recomputed. Only a
        #: measuring knob: ``textrl-bench perf`` sets 1 for the baseline that recomputes a row after every reply.
        self.max_extend: int | None = None
        #: Recompute the rows that a reply extends when that is fewer positions (:func:`extension_pays`); ``False``
        #: always extends (a measuring and testing knob).
        self.cheaper_path = True
        self._param_list: list[th.Tensor] | None = None
        self.memo = PrefillMemo() if memo_bytes is None else PrefillMemo(memo_bytes)
        self._prefetch_waits = False  # the next prefill takes no queued windows (prefetch)

    def reset(self) -> None:
        """Drop every batch's cache and the prefill memo (the next call recomputes all rows)."""
        self.states.clear()
        self.memo.clear()

    def outputs(self, ids: th.Tensor, mask: th.Tensor) -> tuple[th.Tensor, th.Tensor] | None:
        """Logits ``[B, V]`` and values ``[B]`` for whole windows, from the cache (call under ``no_grad``).

        :return: ``None`` when the model's cache layers cannot be spliced / cropped per row; the cache is then
            dropped and ``supported`` is False, so the caller recomputes in full from now on.
        """
        try:
            return self._cached_outputs(ids, mask)
        except _CacheUnsupported:
            self.reset()
            return None

    def warm(self, ids: th.Tensor, mask: th.Tensor) -> int:
        """Prefill windows the memo lacks, in one batched forward (call under ``no_grad``): the prompts an env will
        start episodes on, so that its auto-resets copy them instead of running a prefill each.

        :return: How many windows were computed.
        """
        self._refresh_memo()
        windows = self.memo.windows(ids, mask)
        missing = distinct_rows(
            windows, [i for i, window in enumerate(windows) if window and self.memo.get(window) is None]
        )
        if not missing or not self.supported:
            return 0
        rows = th.as_tensor(missing, device=ids.device)
        try:
            computed = self._compute_prefill(ids[rows], mask[rows])
        except _CacheUnsupported:
            self.reset()
            return 0
        self.memo.remember([windows[i] for i in missing], *computed)
        return len(missing)

    def prefill(self, ids: th.Tensor, mask: th.Tensor) -> tuple[Any, th.Tensor, th.Tensor, th.Tensor]:
        """``(cache, kv_mask, logits, values)`` of these windows, right-aligned in a new ``DynamicCache``: copied from
        the prefill memo where it holds them under the current parameters, else one batched forward (remembered).
        For the built-in decoder (:mod:`sb3_grpo.policies.decoder`); call under ``no_grad``."""
        self._refresh_memo()
        if not self.supported:
            return self._compute_prefill(ids, mask)
        return self._prefill(ids, mask)

    def prefetch(self, ids: th.Tensor, mask: th.Tensor) -> int:
        """Queue windows to prefill with the prefills that run next (call under ``no_grad``): while the parameters
        stay the same, each prefill that has windows to compute, after the first, also computes up to
        :data:`PREFETCH_ROWS` of the queued ones, the first queued first, in the same forward. GRPO queues the prompts
        the env's groups will draw next, at the start of a rollout, so that when an episode starts on a new prompt
        its prefill also runs the prompts of the episodes that start after it, and those copy theirs from the memo:
        one forward for several prompts instead of one each. The first prefill, the rollout's own start, takes none:
        where every episode runs to the rollout's end, the next episodes start after the update, under other
        parameters, and prompts computed for them would be wasted.

        :return: How many windows are queued.
        """
        self._refresh_memo()
        for window, row_ids, row_mask in zip(self.memo.windows(ids, mask), ids, mask, strict=True):
            if window and self.memo.get(window) is None:
                self.memo.pending.setdefault(window, (row_ids, row_mask))
        self._prefetch_waits = True
        return len(self.memo.pending)

    def _take_pending(
        self, computing: set[tuple[int, ...]], width: int
    ) -> list[tuple[tuple[int, ...], th.Tensor, th.Tensor]]:
        """Up to :data:`PREFETCH_ROWS` queued windows (:meth:`prefetch`), taken off the queue, that a prefill
        computing ``computing`` at ``width`` columns runs too (those already in the memo or computed by it leave the
        queue; those of another width stay)."""
        taken, pending = [], self.memo.pending
        for window in list(pending):
            if len(taken) == PREFETCH_ROWS:
                break
            row_ids, row_mask = pending[window]
            if row_ids.shape[0] != width:
                continue
            del pending[window]
            if window not in computing and self.memo.get(window) is None:
                taken.append((window, row_ids, row_mask))
        return taken

    def _refresh_memo(self) -> int:
        """Empty the prefill memo if it was filled under other parameters; returns the parameters' version
        (:meth:`_param_version`)."""
        version = self._param_version()
        if self.memo.version != version:
            self.memo.clear()
            self.memo.version = version
        return version

    def _param_version(self) -> int:
        # In-place updates (optimizer.step, load_state_dict, copy_) bump each tensor's version counter.
        params = self._param_list
        if params is None or params[0] is not next(iter(self._parameters())):
            params = self._param_list = list(self._parameters())
        return sum(p._version for p in params)

    def _prefill(
        self, ids: th.Tensor, mask: th.Tensor, windows: list[tuple[int, ...]] | None = None
    ) -> tuple[Any, th.Tensor, th.Tensor, th.Tensor]:
        """Cache, mask, logits and values of some rows: ``(cache, kv_mask, logits, values)``.

        Rows whose window the :class:`PrefillMemo` holds (for the current parameters: :meth:`_cached_outputs`
        empties it when they change) are copied from it; the others get one full forward, and are remembered.

        :param windows: The rows' memo keys (:meth:`PrefillMemo.windows`), when the caller has them.
        """
        if windows is None:
            windows = self.memo.windows(ids, mask)
        found = [self.memo.get(w) for w in windows]
        missing = [i for i, entry in enumerate(found) if entry is None]
        distinct = distinct_rows(windows, missing)  # a group's members starting together share one forward
        queued = []
        if distinct and self._prefetch_waits:  # the rollout's first prefill: its own windows only (see prefetch)
            self._prefetch_waits = False
        elif distinct:
            queued = self._take_pending({windows[i] for i in distinct}, ids.shape[1])
        if not queued and len(missing) == len(found) and len(distinct) == len(missing):
            computed = self._compute_prefill(ids, mask)
            self.memo.remember(windows, *computed)
            return computed
        if distinct:
            rows = th.as_tensor(distinct, device=ids.device)
            rows_ids, rows_mask = ids[rows], mask[rows]
            if queued:  # windows queued ahead of the episodes that will start on them join this forward
                rows_ids = th.cat([rows_ids, th.stack([q_ids for _, q_ids, _ in queued])])
                rows_mask = th.cat([rows_mask, th.stack([q_mask for _, _, q_mask in queued])])
            computed = self._compute_prefill(rows_ids, rows_mask)
            self.memo.remember([windows[i] for i in distinct] + [window for window, _, _ in queued], *computed)
            for i in missing:  # the distinct rows and the rows that share their windows
                found[i] = self.memo.get(windows[i])
            if any(entry is None for entry in found):  # not kept (an empty window, over the budget): no shortcut
                return self._compute_prefill(ids, mask)
        return self.memo.assemble(found, self._lm_config)  # type: ignore[arg-type]

    def _compute_prefill(self, ids: th.Tensor, mask: th.Tensor) -> tuple[Any, th.Tensor, th.Tensor, th.Tensor]:
        """Full forward of some rows, building their cache: ``(cache, kv_mask, logits, values)``. Rows that begin
        alike (:data:`SHARED_PREFILL_MIN` tokens or more) run those tokens once (:meth:`_compute_shared_prefill`), as
        does a single row that begins with an opening the memo kept from such a prefill."""
        from transformers import DynamicCache

        t_ids, t_mask = trim_padding(ids, mask)
        split = common_prefix_length(t_ids, t_mask)
        if t_ids.shape[0] == 1 and split:  # one row: only an opening remembered from an earlier prefill runs apart
            found = self.memo.opening(tuple(t_ids[0, :split].tolist()))  # (trimmed: no padding left)
            split = 0 if found is None else found[0]
        if split >= SHARED_PREFILL_MIN:
            return self._compute_shared_prefill(t_ids, t_mask, split, ids, mask)
        cache = DynamicCache(config=self._lm_config)
        hidden = self._trunk(t_ids, t_mask, positions_from_mask(t_mask), cache=cache)[:, -1]
        if not self._cache_layers_ok(cache):
            raise _CacheUnsupported
        return (
            cache,
            t_mask.clone(),
            self._logits(hidden),
            self._value(hidden, ids, mask),
        )

    def _compute_shared_prefill(
        self, ids: th.Tensor, mask: th.Tensor, split: int, full_ids: th.Tensor, full_mask: th.Tensor
    ) -> tuple[Any, th.Tensor, th.Tensor, th.Tensor]:
        """:meth:`_compute_prefill` of rows whose first ``split`` valid tokens are the same: one forward of those
        tokens, its cache copied to every row, then one forward of each row's own tokens over it (each row's tokens in
        the last columns of the new block, masked dummies before them, as :meth:`_step` feeds replies). The columns
        are then put back in the prefill's layout (each row's valid columns last and contiguous), so the result is
        the full prefill's, up to float rounding.

        The shared tokens' keys and values are remembered as an opening (:meth:`PrefillMemo.remember_opening`); where
        the memo holds an opening they begin with, the forward runs only the tokens after it, over a copy of its cache.

        :param ids: ``[B, L]`` the rows, padding trimmed; ``mask`` their mask.
        :param split: The shared leading tokens (:func:`~sb3_grpo.policies.windows.common_prefix_length`).
        :param full_ids: The rows as given (for the value head); ``full_mask`` their mask.
        """
        batch = ids.shape[0]
        own = mask.sum(dim=1) - split  # each row's tokens after the shared ones (>= 1)
        tail = int(own.max())
        longest = int(own.argmax())  # its shared tokens sit just left of its own `tail` ones
        shared = ids[longest : longest + 1, ids.shape[1] - tail - split : ids.shape[1] - tail]
        tokens = tuple(shared[0].tolist())
        cache, done = self._opening_cache(tokens)
        if done < split:
            ones = th.ones_like(shared)
            self._trunk(shared[:, done:], ones, positions_from_mask(ones)[:, done:], cache=cache)
            if not self._cache_layers_ok(cache):
                raise _CacheUnsupported
            self.memo.remember_opening(tokens, cache)
        for layer in cache.layers:
            layer.keys = layer.keys.expand(batch, -1, -1, -1).contiguous()
            layer.values = layer.values.expand(batch, -1, -1, -1).contiguous()
        new_tok, new_mask = last_tokens_block(ids, own, tail)
        new_mask = new_mask.to(mask.dtype)
        kv_mask = th.cat([th.ones(batch, split, dtype=mask.dtype, device=ids.device), new_mask], dim=1)
        hidden = self._trunk(new_tok, kv_mask, positions_from_mask(kv_mask)[:, split:], cache=cache)[:, -1]
        kv_mask = gather_columns(cache, kv_mask, realign_columns(kv_mask, tail, tail - own))
        return cache, kv_mask, self._logits(hidden), self._value(hidden, full_ids, full_mask)

    def _opening_cache(self, tokens: tuple[int, ...]) -> tuple[Any, int]:
        """A new cache of one row holding the longest opening the memo keeps that ``tokens`` begin with, and its
        length (an empty cache and 0 where it keeps none)."""
        from transformers import DynamicCache

        found = self.memo.opening(tokens)
        if found is None:
            return DynamicCache(config=self._lm_config), 0
        length, layers = found
        return cache_of([(keys.clone(), values.clone()) for keys, values in layers], self._lm_config), length

    def _cache_layers_ok(self, cache: Any) -> bool:
        from transformers.cache_utils import DynamicLayer

        other = sorted({type(layer).__name__ for layer in cache.layers if type(layer) is not DynamicLayer})
        if other and self.supported:
            warnings.warn(
                f"{self._model_name}: the rollout KV cache cannot keep this model's cache layers ({', '.join(other)}, "
                "e.g. sliding-window attention), so the policy recomputes every window in full at each step (a "
                "forward over the whole prompt and completion per generated token instead of over one token); pass "
                "use_cache=False to CausalLMPolicy to say so and skip this warning",
                UserWarning,
                stacklevel=2,
            )
        if other:
            self.supported = False  # e.g. sliding-window layers: splicing/cropping would be wrong
        return not other

    def _cached_outputs(self, ids: th.Tensor, mask: th.Tensor) -> tuple[th.Tensor, th.Tensor]:
        batch = ids.shape[0]
        version = self._refresh_memo()  # every prefill of this call runs with these parameters
        state = self.states.pop(batch, None)
        if state is not None and (
            state.version != version or state.ids.shape != ids.shape or state.ids.device != ids.device
        ):
            state = None
        if state is not None and th.equal(state.ids, ids) and th.equal(state.mask, mask):
            # the usual call of a rollout step: the windows the look-ahead predicted, served as they are (nothing to
            # crop: the look-ahead only appended a column); _classify and _advance see only calls with some row changed
            state.ids, state.mask = ids, mask
            state.prev_ids = state.prev_mask = state.prev_logits = state.prev_values = None
            self.states[batch] = state
            return state.logits, state.values
        rows = None if state is None else self._classify(state, ids, mask)
        if rows is None or not bool(rows.redo.logical_not().any()):
            # nothing to reuse in this slot (e.g. a new batch size): try rows of the other cached batches
            served = self._serve_from_other_batches(ids, mask, version)
            if isinstance(served, tuple):
                return served
            if served is not None:
                state, rows = served, None
        if state is None:
            state = self._new_state(ids, mask, version)
        else:
            self._advance(state, ids, mask, rows)
        state.version = version
        self._crop(state)
        self.states[batch] = state
        while len(self.states) > 2:
            self.states.popitem(last=False)
        return state.logits, state.values

    def _classify(self, state: _BatchCache, ids: th.Tensor, mask: th.Tensor) -> _Rows:
        """Per row: ``same`` (the cached window), ``extend`` (cached window + ``k`` tokens), ``replace`` (the window
        before the look-ahead + ``k`` tokens not starting with the look-ahead one), ``back`` (the window before the
        look-ahead itself), ``redo`` (anything else); ``k`` per row (0 unless ``extend`` or ``replace``)."""
        same = (state.ids == ids).all(dim=1) & (state.mask == mask).all(dim=1)
        k = extension_lengths(state.ids, state.mask, ids, mask)
        extend = (k > 0) & ~same
        replace = back = th.zeros_like(same)
        if state.prev_ids is not None:
            k_prev = extension_lengths(state.prev_ids, state.prev_mask, ids, mask)
            replace = (k_prev > 0) & ~same & ~extend
            back = (state.prev_ids == ids).all(dim=1) & (state.prev_mask == mask).all(dim=1) & ~same
            k = th.where(replace, k_prev, k)
        if self.max_extend is not None:
            extend, replace = extend & (k <= self.max_extend), replace & (k <= self.max_extend)
        if self.cheaper_path:
            multi = (extend | replace) & (k > 1)
            if bool(multi.any()) and not extension_pays(int(k[multi].max()), ids.shape[0], int(mask[multi].sum())):
                extend, replace = extend & ~multi, replace & ~multi
        k = th.where(extend | replace, k, th.zeros_like(k))
        return _Rows(same, extend, replace, back, ~(same | extend | replace | back), k)

    def _new_state(self, ids: th.Tensor, mask: th.Tensor, version: int) -> _BatchCache:
        cache, kv_mask, logits, values = self._prefill(ids, mask)
        return _BatchCache(cache, kv_mask, ids, mask, logits, values, version)

    def _advance(self, state: _BatchCache, ids: th.Tensor, mask: th.Tensor, rows: _Rows | None = None) -> None:
        """Bring every row of ``state`` to the new windows: reuse, one batched forward over the new tokens, and/or a
        prefill.

        :param rows: :meth:`_classify`'s result for these windows, if the caller has it.
        """
        rows = self._classify(state, ids, mask) if rows is None else rows
        replace, back, redo = rows.replace, rows.back, rows.redo
        logits, values = (
            state.logits.clone(),
            state.values.clone(),
        )  # rows in `same` keep theirs
        if bool((replace | back).any()):  # drop the look-ahead token of these rows: its column becomes a masked hole
            state.kv_mask = state.kv_mask.clone()
            state.kv_mask[replace | back, -1] = 0
            logits[back], values[back] = (
                state.prev_logits[back],
                state.prev_values[back],
            )
        step = rows.extend | replace
        if bool(step.any()):
            hidden = self._step(state, ids, mask, step, rows.k)[step]
            logits[step], values[step] = self._logits(hidden), self._value(hidden, ids[step], mask[step])
        if bool(redo.any()):
            every_row = bool(redo.all())
            rows_r = redo.nonzero().squeeze(1)
            windows = self.memo.windows(ids[rows_r], mask[rows_r])
            # some rows (an auto-reset's prompt): copied from the memo in place when it holds them all
            if every_row or not self._copy_from_memo(state, rows_r.tolist(), windows, logits, values):
                cache_r, kv_mask_r, logits_r, values_r = self._prefill(ids[rows_r], mask[rows_r], windows)
                logits[rows_r], values[rows_r] = logits_r, values_r
                if every_row:
                    state.cache, state.kv_mask = cache_r, kv_mask_r
                else:
                    self._splice(state, rows_r, cache_r, kv_mask_r)
        state.ids, state.mask, state.logits, state.values = ids, mask, logits, values
        state.prev_ids = state.prev_mask = state.prev_logits = state.prev_values = None

    def _step(
        self,
        state: _BatchCache,
        ids: th.Tensor,
        mask: th.Tensor,
        step: th.Tensor | None,
        k: th.Tensor | None,
    ) -> th.Tensor:
        """One batched forward over the new tokens of the ``step`` rows (``k[b]`` each), extending the cache; returns
        every row's hidden state at its last token, ``[B, d]`` (the caller takes the ``step`` rows' logits and values
        from it). Other rows feed masked dummy tokens. ``step=None`` (with ``k=None``): every row adds one token (the
        look-ahead), with no classification and no host sync."""
        tail = 1 if k is None else int(k.max())
        n_valid = mask.sum(dim=1, keepdim=True)
        if step is None:
            new_tok, new_mask = ids[:, -1:], th.ones_like(mask[:, -1:])
            pos = (n_valid - 1).clamp(min=0)
        elif tail == 1:  # every row adds one token: the single-token step of a single-turn rollout
            new_tok = th.where(step, ids[:, -1], th.zeros_like(ids[:, -1])).unsqueeze(1)
            new_mask = step.long().unsqueeze(1)
            pos = (n_valid - 1).clamp(min=0)
        else:  # some row adds an interactive reply: row b's k[b] tokens in the last k[b] of `tail` new columns
            new_tok, new_mask = last_tokens_block(ids, k, tail)  # masked dummy columns before each row's tokens
            pos = (n_valid - tail + th.arange(tail, device=ids.device).unsqueeze(0)).clamp(min=0)
        kv_mask = th.cat([state.kv_mask, new_mask], dim=1)
        trunk = self._step_trunk if tail == 1 else self._trunk
        hidden = trunk(new_tok, kv_mask, pos, cache=state.cache)[:, -1]
        state.kv_mask = kv_mask
        if tail > 1:
            self._reorder(state, realign_columns(kv_mask, tail, tail - k))
        return hidden

    @staticmethod
    def _reorder(state: _BatchCache, index: th.Tensor) -> None:
        """Read every row's cache columns (keys, values and mask) through ``index`` (``[B, L]``)."""
        state.kv_mask = gather_columns(state.cache, state.kv_mask, index)

    def look_ahead(self, ids: th.Tensor, mask: th.Tensor, actions: th.Tensor) -> None:
        """Extend the batch cache by the tokens just chosen, computing the *next* step's outputs now.

        In ``collect_rollouts`` the next observation of a continuing env is this window plus its action, and the
        terminal observation of a finished env is too; so the next ``forward`` finds those rows ``same`` and SB3's
        per-env ``predict_values(terminal_obs)`` bootstrap is a lookup instead of a batch-of-one forward. A row
        whose next window turns out different (an outside caller chose another token) masks the look-ahead column
        and takes a normal step; any other change is recomputed as usual.
        """
        state = self.states.get(ids.shape[0])
        if state is None or state.ids is not ids or bool(mask[:, 0].any()):
            return  # not the state of this call, or a full window (the next one would drop a token)
        prev = (ids, mask, state.logits, state.values)
        next_ids = th.cat([ids[:, 1:], actions.reshape(-1, 1).long()], dim=1)
        next_mask = th.cat([mask[:, 1:], th.ones_like(mask[:, :1])], dim=1)
        # every row extends its window by one token (no full window: checked above), so no classification: the step
        # :meth:`_advance` would take for all-``extend`` rows; its outputs are kept as they come (at a real model's
        # vocabulary a copy of the logits would be a pass over megabytes a step)
        hidden = self._step(state, next_ids, next_mask, None, None)
        logits, values = self._logits(hidden), self._value(hidden, next_ids, next_mask)
        state.ids, state.mask, state.logits, state.values = next_ids, next_mask, logits, values
        state.prev_ids, state.prev_mask, state.prev_logits, state.prev_values = prev

    def _serve_from_other_batches(
        self, ids: th.Tensor, mask: th.Tensor, version: int
    ) -> tuple[th.Tensor, th.Tensor] | _BatchCache | None:
        """Serve a batch (typically of a new size) from rows of another cached batch, when every row matches one.

        SB3 bootstraps truncated episodes with ``predict_values(terminal_obs)``, one env at a time; each terminal
        window is a batch-cache row plus its action, i.e. a look-ahead row (returned as is: ``(logits, values)``)
        or one token past a cached row (its keys/values are copied into a new small cache and one single-token step
        does the rest). Returns ``None`` when some row matches no cached row.
        """
        from transformers import DynamicCache

        for other in reversed(list(self.states.values())):
            if other.version != version or other.ids.shape[1] != ids.shape[1] or other.ids.device != ids.device:
                continue
            same = (ids[:, None] == other.ids[None]).all(-1) & (mask[:, None] == other.mask[None]).all(-1)
            if bool(same.any(dim=1).all()):
                src = same.float().argmax(dim=1)
                return other.logits[src], other.values[src]
            ext = self._extends_matrix(other.ids, other.mask, ids, mask)
            rep = (
                self._extends_matrix(other.prev_ids, other.prev_mask, ids, mask)
                if other.prev_ids is not None
                else th.zeros_like(ext)
            )
            ok = same | ext | rep  # [B_new, B_cached]
            if not bool(ok.any(dim=1).all()):
                continue
            src = ok.float().argmax(dim=1)
            rows = th.arange(ids.shape[0], device=ids.device)
            from_prev = ~(same | ext)[rows, src]  # served from the window before the look-ahead
            kv_mask = other.kv_mask[src].clone()
            kv_mask[from_prev, -1] = 0  # the look-ahead token is not part of these rows
            c_ids, c_mask = other.ids[src].clone(), other.mask[src].clone()
            if bool(from_prev.any()):
                c_ids[from_prev], c_mask[from_prev] = (
                    other.prev_ids[src][from_prev],
                    other.prev_mask[src][from_prev],
                )
            cache = DynamicCache()
            for i, layer in enumerate(other.cache.layers):
                cache.update(layer.keys[src], layer.values[src], i)
            return _BatchCache(
                cache,
                kv_mask,
                c_ids,
                c_mask,
                other.logits[src],
                other.values[src],
                version,
            )
        return None

    @staticmethod
    def _extends_matrix(old_ids: th.Tensor, old_mask: th.Tensor, ids: th.Tensor, mask: th.Tensor) -> th.Tensor:
        """``[B_new, B_old]``: new row ``i`` extends old row ``j`` by one token (see :func:`extends_by_one`)."""
        return (
            (ids[:, None, :-1] == old_ids[None, :, 1:]).all(-1)
            & (mask[:, None, :-1] == old_mask[None, :, 1:]).all(-1)
            & (mask[:, None, -1] == 1)
            & (old_mask[None, :, 0] == 0)
        )

    def _copy_from_memo(
        self, state: _BatchCache, rows: list[int], windows: list[tuple[int, ...]], logits: th.Tensor, values: th.Tensor
    ) -> bool:
        """Write the keys/values, logits and values of batch rows ``rows`` (memo keys ``windows``) straight from the
        :class:`PrefillMemo` into the batch cache, in place (right-aligned, zeros and a masked slot before each
        window): what :meth:`_prefill` and :meth:`_splice` write, without building a cache of those rows first. Taken
        when the memo holds every such window (an auto-reset's prompt, prefilled before the rollout) and each fits the
        batch cache's length.

        :return: Whether it did (otherwise nothing was written).
        """
        entries = [self.memo.get(w) for w in windows]
        length = state.kv_mask.shape[1]
        if any(e is None or e[0][0][0].shape[-2] > length for e in entries):
            return False
        for row, (layers, row_logits, row_value) in zip(rows, entries, strict=True):
            start = length - layers[0][0].shape[-2]
            state.kv_mask[row, :start] = 0
            state.kv_mask[row, start:] = 1
            for layer, (keys, vals) in zip(state.cache.layers, layers, strict=True):
                layer.keys[row, :, :start] = 0
                layer.keys[row, :, start:] = keys[0]
                layer.values[row, :, :start] = 0
                layer.values[row, :, start:] = vals[0]
            logits[row], values[row] = row_logits, row_value
        return True

    @staticmethod
    def _splice(state: _BatchCache, rows: th.Tensor, cache_r: Any, kv_mask_r: th.Tensor) -> None:
        """Write recomputed rows into the batch cache, left-padding whichever is shorter with masked slots."""
        length = max(state.kv_mask.shape[1], kv_mask_r.shape[1])
        kv_mask = left_pad_columns(state.kv_mask, length, dim=1)
        kv_mask[rows] = left_pad_columns(kv_mask_r, length, dim=1)
        state.kv_mask = kv_mask
        for layer, layer_r in zip(state.cache.layers, cache_r.layers, strict=True):
            keys = left_pad_columns(layer.keys, length)
            vals = left_pad_columns(layer.values, length)
            keys[rows] = left_pad_columns(layer_r.keys, length)
            vals[rows] = left_pad_columns(layer_r.values, length)
            layer.keys, layer.values = keys, vals

    @staticmethod
    def _crop(state: _BatchCache) -> None:
        """Remove leading cache columns masked for every row, so the cache stays within the window width."""
        any_valid = state.kv_mask.any(dim=0)
        if not bool(any_valid.any()):
            return
        start = int(any_valid.nonzero()[0, 0])
        if start == 0:
            return
        state.kv_mask = state.kv_mask[:, start:]
        for layer in state.cache.layers:
            layer.keys = layer.keys[..., start:, :]
            layer.values = layer.values[..., start:, :]
