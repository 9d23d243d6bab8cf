"""The policy's update forward over whole sequences: :meth:`SequenceEvaluationMixin.evaluate_sequences`.

:class:`~sb3_grpo.policies.CausalLMPolicy` gets it from :class:`SequenceEvaluationMixin`: every generated token's
log-prob, entropy and value in one forward per sequence, through a packed forward (:mod:`sb3_grpo.policies.packing`)
when it pays and the model honours 4-D masks (checked once against the padded forward), else a padded one. The mixin
runs the LM only through the policy's ``_trunk``, ``_logits``, ``_distribution`` and critic, so its outputs follow the
same rules as rollout (see "Packed update forward" on :class:`~sb3_grpo.policies.CausalLMPolicy`).
"""

from __future__ import annotations

import warnings

import torch as th

from sb3_grpo.policies.packing import packed_batch, shared_prefix_groups, suffix_lengths, tightest_layout
from sb3_grpo.policies.windows import positions_from_mask, trim_padding

__all__ = ["MAX_SHARED_UNIT", "SequenceEvaluationMixin"]

#: The longest unit (a shared prefix and the tokens of the segments that share it) one packed row holds, in tokens,
#: when no single segment is longer: attention within a row grows with its square.
MAX_SHARED_UNIT = 1024


class SequenceEvaluationMixin:
    """``evaluate_sequences`` (the text fast path's update forward) and its packed / padded hidden states.

    Needs, on the policy it is mixed into: ``_parse_obs``, ``_trunk``, ``_logits``, ``_distribution``, ``lm``,
    ``separate_critic`` / ``critic`` / ``value_head``, ``pack_sequences``, ``_packing_verified`` and ``_autocast``.
    """

    def evaluate_sequences(
        self, input_ids: th.Tensor, attention_mask: th.Tensor, action_mask: th.Tensor
    ) -> tuple[th.Tensor, th.Tensor, th.Tensor]:
        """Every generated token's log-prob, entropy and value in one forward per sequence.

        For each ``(b, j)`` with ``action_mask[b, j]`` true, token ``input_ids[b, j]`` was generated as an action:
        ``log_prob[b, j] = log pi(input_ids[b, j] | tokens < j)`` from the logits at ``j - 1`` after the same
        temperature / top-k / top-p processing as rollout; ``entropy[b, j]`` is that distribution's entropy;
        ``values[b, j]`` is the value of the state whose last token is ``j - 1``. Zero elsewhere. Inputs are
        right-aligned windows (the episode's final window), with the same position-id rule as everywhere else.

        :param input_ids: ``[B, L]`` token ids (any numeric dtype).
        :param attention_mask: ``[B, L]`` mask.
        :param action_mask: ``[B, L]`` bool-like, true where the token was an action (never at column 0).
        :return: ``(log_prob, entropy, values)``, each ``[B, L]`` float32.
        """
        ids, mask = self._parse_obs({"input_ids": input_ids, "attention_mask": attention_mask})
        act = th.as_tensor(action_mask, device=ids.device).bool()
        if act.dim() == 1:
            act = act.unsqueeze(0)
        if bool(act[:, 0].any()):
            raise ValueError("action_mask[:, 0] is set, but an action needs at least one token before it")
        batch, length = ids.shape
        b_idx, j_idx = act.nonzero(as_tuple=True)  # positions of actions (in full coordinates)
        # the hidden state of the state whose last token is j - 1
        state_h = self._hidden_at(ids, mask, b_idx, j_idx - 1)
        dist = self._distribution(self._logits(state_h))
        zeros = th.zeros(batch, length, device=ids.device)
        log_prob = zeros.index_put((b_idx, j_idx), dist.log_prob(ids[b_idx, j_idx]))
        entropy = zeros.index_put((b_idx, j_idx), dist.entropy())
        if self.separate_critic:
            v_all = self.critic.values_per_position(ids, mask)
            v = v_all[b_idx, j_idx - 1]
        else:
            v = self.value_head(self._critic_hidden(state_h).float()).squeeze(-1)
        values = zeros.index_put((b_idx, j_idx), v)
        return log_prob, entropy, values

    def _hidden_at(self, ids: th.Tensor, mask: th.Tensor, rows: th.Tensor, cols: th.Tensor) -> th.Tensor:
        """Final hidden states ``[n, d]`` at window positions ``(rows[i], cols[i])``: packed when it pays, else
        padded."""
        # (the router loss needs each token's padding flag, which a packed row's mask does not give)
        pack = self.pack_sequences and not self._collecting_router_losses()
        packed = self._packed_hidden_at(ids, mask, rows, cols) if pack else None
        if packed is not None:
            return packed
        return self._padded_hidden_at(ids, mask, rows, cols)

    def _padded_hidden_at(self, ids: th.Tensor, mask: th.Tensor, rows: th.Tensor, cols: th.Tensor) -> th.Tensor:
        t_ids, t_mask = trim_padding(ids, mask)
        hidden = self._trunk(t_ids, t_mask, positions_from_mask(t_mask))  # [B, L - start, d]
        return hidden[rows, cols - (ids.shape[1] - t_ids.shape[1])]

    def _packed_hidden_at(self, ids: th.Tensor, mask: th.Tensor, rows: th.Tensor, cols: th.Tensor) -> th.Tensor | None:
        """:meth:`_hidden_at` through a packed forward (:mod:`~sb3_grpo.policies.packing`), or ``None`` when packing
        does not apply (attention other than sdpa / eager, rows that are not right-aligned, a query on padding, or a
        layout that would save less than a sixth of the positions) or failed its one-time check against the padded
        forward."""
        attn = getattr(self.lm.config, "_attn_implementation", None)
        if attn not in ("sdpa", "eager") or ids.shape[0] < 2:
            return None
        lengths = suffix_lengths(mask)
        if lengths is None or not bool(lengths.min() > 0):
            return None
        within = cols - (ids.shape[1] - lengths[rows])  # each query's position within its sequence
        if bool((within < 0).any()):
            return None
        longest = int(lengths.max())
        groups = shared_prefix_groups(ids, lengths, max(longest, MAX_SHARED_UNIT))
        units = groups.unit_lengths(lengths.cpu().numpy())
        capacity, layout = tightest_layout(units)
        if layout[2] * capacity * 6 > ids.shape[0] * longest * 5:
            return None
        mask_dtype = th.bool if attn == "sdpa" else next(self.lm.parameters()).dtype
        try:
            batch = packed_batch(ids, lengths, capacity, mask_dtype, layout=layout, groups=groups)
            hidden = self._trunk(batch.input_ids, batch.attention_mask, batch.position_ids)
            out = hidden[batch.slots(rows, within)]
        except (RuntimeError, ValueError, TypeError) as err:
            return self._packing_failed(f"the packed forward raised {type(err).__name__}: {err}")
        if not self._packing_verified:
            with th.no_grad():
                # the segments of the fullest packed row (where attention across segments would show): a padded
                # forward of a few rows, not of the whole batch
                seg_row = batch.row
                members = (seg_row == th.bincount(seg_row).argmax()).nonzero().squeeze(1)
                picked = th.isin(rows, members)
                local = th.searchsorted(members, rows[picked])
                padded = self._padded_hidden_at(ids[members], mask[members], local, cols[picked]).float()
                error = float((out[picked].detach().float() - padded).abs().max()) / max(
                    float(padded.abs().max()), 1e-6
                )
            full_precision = self._autocast is None and next(self.lm.parameters()).dtype == th.float32
            tolerance = 1e-3 if full_precision else 5e-2
            if not error <= tolerance:
                return self._packing_failed(
                    f"its hidden states differ from the padded forward's (relative error {error:.2e})"
                )
            self._packing_verified = True
        return out

    def _packing_failed(self, why: str) -> None:
        self.pack_sequences = False
        warnings.warn(
            f"CausalLMPolicy: packed sequences are not usable with this model ({why}); evaluating padded sequences "
            "from now on (pass pack_sequences=False to skip the attempt)",
            stacklevel=4,
        )
        return None
