"""The update's two paths behind one interface: where minibatches come from and how they are evaluated.

GRPO's ``train`` reads the same for both; the path is chosen once, when the model is set up:

- :class:`TransitionBatches`: PPO's path. SB3's random minibatches of transitions, each evaluated by the policy
  on its own observation (``evaluate_actions``).
- :class:`SequenceBatches`: the text fast path. Minibatches of whole episode segments from a
  :class:`~sb3_grpo.common.buffers.SequenceRolloutBuffer`, every generated token's log-prob, entropy and value
  from one forward per sequence (``CausalLMPolicy.evaluate_sequences``).

Both yield :class:`~sb3_grpo.common.type_aliases.Minibatch` tuples whose flat fields list the same transitions
in the same order as :meth:`evaluate` returns the policy's outputs for them, and both give the frozen KL
reference policy's log-probs of the same transitions (:meth:`reference_log_prob`). ``evaluate_slices`` returns the
same outputs as ``K`` contiguous slices (``torch.tensor_split``'s), each from its own forward, for the
gradient-variance penalty (:mod:`sb3_grpo.grpo.penalty`). ``split`` cuts a minibatch into micro-batches
(``micro_batch_size``): transitions on the per-transition path, whole sequences on the text fast path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch as th
from gymnasium import spaces
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.policies import BasePolicy

from sb3_grpo.common.buffers import (
    GRPO_BUFFERS,
    GRPODictRolloutBuffer,
    GRPORolloutBuffer,
    SequenceRolloutBuffer,
    is_text_space,
)
from sb3_grpo.common.type_aliases import MicroBatchShare, Minibatch, SequenceSamples, sequence_index

__all__ = [
    "BatchSource",
    "SequenceBatches",
    "TransitionBatches",
    "make_batch_source",
    "rollout_buffer_class_for",
]

#: Trainable parameters from which :class:`TransitionBatches` evaluates the penalty's slices in separate forwards.
SEPARATE_SLICES_MIN_PARAMS = 1 << 17

#: The policy's outputs for some transitions, flat: values, log-probs, entropies (``None``: no analytical form).
Outputs = tuple[th.Tensor, th.Tensor, th.Tensor | None]

#: ``(observations or sequences, actions) -> (values or log-probs, ...)``: the policy's evaluation under the
#: KL reference (a frozen copy's method, or the LoRA policy's adapters-off method).
ReferenceFn = Callable[..., tuple[th.Tensor, th.Tensor, Any]]


def _shares(minibatch: Minibatch, sizes: list[int]) -> list[MicroBatchShare]:
    """The :class:`~sb3_grpo.common.type_aliases.MicroBatchShare` of micro-batches of ``sizes`` transitions."""
    total = len(minibatch.actions)
    n_sequences = None if minibatch.sequence_ids is None else sequence_index(minibatch.sequence_ids)[1]
    return [MicroBatchShare(size / total, n_sequences) for size in sizes]


def _split_flat(minibatch: Minibatch, sizes: list[int]) -> list[dict[str, Any]]:
    """The minibatch's flat per-transition fields, in consecutive parts of ``sizes`` transitions."""
    names = ("actions", "old_values", "old_log_prob", "advantages", "returns", "old_policy_log_prob", "sequence_ids")
    columns = {name: getattr(minibatch, name) for name in names}
    parts: list[dict[str, Any]] = [{} for _ in sizes]
    for name, column in columns.items():
        pieces = [None] * len(sizes) if column is None else column.split(sizes)
        for part, piece in zip(parts, pieces, strict=True):
            part[name] = piece
    return parts


class TransitionBatches:
    """PPO's update path: SB3's random minibatches of transitions from a ``RolloutBuffer`` / ``DictRolloutBuffer``.

    :param policy: The policy being trained (``evaluate_actions``).
    :param reference: ``evaluate_actions`` of the KL reference (``None``: no KL term).
    :param discrete: Whether actions are ``Discrete`` (stored as floats by SB3, turned into a flat long tensor).
    """

    def __init__(self, policy: BasePolicy, reference: ReferenceFn | None, discrete: bool) -> None:
        self.policy = policy
        self.reference = reference
        self.discrete = discrete
        # one forward per slice pays off when a backward through the minibatch costs more than a few extra calls
        n_params = sum(p.numel() for p in policy.parameters() if p.requires_grad)
        self.separate_slices = n_params >= SEPARATE_SLICES_MIN_PARAMS

    def minibatches(self, buffer: RolloutBuffer, batch_size: int) -> Iterator[Minibatch]:
        """One epoch of minibatches of ``batch_size`` random transitions (SB3's ``get``, same random draws).

        :param buffer: The filled rollout buffer.
        :param batch_size: Transitions per minibatch.
        """
        for samples in buffer.get(batch_size):
            actions = samples.actions
            if self.discrete:
                # Convert discrete action from float to long
                actions = samples.actions.long().flatten()
            yield Minibatch(
                actions=actions,
                old_values=samples.old_values,
                old_log_prob=samples.old_log_prob,
                advantages=samples.advantages,
                returns=samples.returns,
                inputs=samples.observations,
                old_policy_log_prob=getattr(samples, "old_policy_log_prob", None),
                sequence_ids=getattr(samples, "segment_id", None),
            )

    def evaluate(self, minibatch: Minibatch) -> tuple[th.Tensor, th.Tensor, th.Tensor | None]:
        """Values, log-probs and entropies of the minibatch's transitions under the current policy, flat."""
        values, log_prob, entropy = self.policy.evaluate_actions(minibatch.inputs, minibatch.actions)
        return values.flatten(), log_prob, entropy

    def evaluate_slices(self, minibatch: Minibatch, sizes: list[int]) -> list[Outputs]:
        """:meth:`evaluate` in consecutive slices of ``sizes`` transitions: one forward per slice when
        :attr:`separate_slices` (a policy of at least :data:`SEPARATE_SLICES_MIN_PARAMS` parameters), else one forward
        of the minibatch, split (for a small MLP, fewer calls cost less than smaller backwards save).

        :param minibatch: The minibatch.
        :param sizes: Transitions per slice (summing to the minibatch's).
        """
        if not self.separate_slices:
            values, log_prob, entropy = self.evaluate(minibatch)
            entropies = [None] * len(sizes) if entropy is None else entropy.split(sizes)
            return list(zip(values.split(sizes), log_prob.split(sizes), entropies, strict=True))
        inputs = minibatch.inputs
        if isinstance(inputs, dict):
            split = zip(*(value.split(sizes) for value in inputs.values()), strict=True)
            parts = [dict(zip(inputs, values, strict=True)) for values in split]
        else:
            parts = inputs.split(sizes)
        out = []
        for obs, actions in zip(parts, minibatch.actions.split(sizes), strict=True):
            values, log_prob, entropy = self.policy.evaluate_actions(obs, actions)
            out.append((values.flatten(), log_prob, entropy))
        return out

    def reference_log_prob(self, minibatch: Minibatch) -> th.Tensor:
        """``log pi_ref(a|s)`` of the KL reference for the minibatch's transitions (no gradient)."""
        with th.no_grad():
            _, ref_log_prob, _ = self.reference(minibatch.inputs, minibatch.actions)
        return ref_log_prob

    def split(self, minibatch: Minibatch, micro_batch_size: int) -> list[Minibatch]:
        """The minibatch in consecutive micro-batches of ``micro_batch_size`` transitions (the last may be smaller),
        each with its :class:`~sb3_grpo.common.type_aliases.MicroBatchShare`.

        :param minibatch: The minibatch.
        :param micro_batch_size: Transitions per micro-batch.
        """
        n = len(minibatch.actions)
        sizes = [min(micro_batch_size, n - lo) for lo in range(0, n, micro_batch_size)]
        inputs = minibatch.inputs
        if isinstance(inputs, dict):
            split = zip(*(value.split(sizes) for value in inputs.values()), strict=True)
            obs_parts: list[Any] = [dict(zip(inputs, values, strict=True)) for values in split]
        else:
            obs_parts = list(inputs.split(sizes))
        return [
            Minibatch(inputs=obs, share=share, **flat)
            for obs, share, flat in zip(
                obs_parts, _shares(minibatch, sizes), _split_flat(minibatch, sizes), strict=True
            )
        ]


class SequenceBatches:
    """The text fast path: minibatches of whole sequences, one forward per sequence.

    :param policy: A policy with ``evaluate_sequences`` (:class:`~sb3_grpo.policies.CausalLMPolicy`).
    :param reference: ``evaluate_sequences`` of the KL reference (``None``: no KL term).
    """

    #: The slices of :meth:`evaluate_slices` come from separate forwards (always, for an LM).
    separate_slices = True

    def __init__(self, policy: BasePolicy, reference: ReferenceFn | None) -> None:
        self.policy = policy
        self.reference = reference

    def minibatches(self, buffer: SequenceRolloutBuffer, batch_size: int) -> Iterator[Minibatch]:
        """One epoch of minibatches of whole sequences, about ``batch_size`` transitions each, in random order.

        :param buffer: The filled sequence buffer.
        :param batch_size: Transitions per minibatch, approximately (sequences are never split).
        """
        for seq in buffer.get_sequences(batch_size):
            m = seq.action_mask
            rows = th.arange(m.shape[0], device=m.device)[:, None].expand_as(m)
            yield Minibatch(
                actions=seq.input_ids[m],
                old_values=seq.old_values[m],
                old_log_prob=seq.old_log_prob[m],
                advantages=seq.advantages[m],
                returns=seq.returns[m],
                inputs=seq,
                old_policy_log_prob=seq.old_policy_log_prob[m],
                sequence_ids=rows[m],  # a minibatch holds whole sequences: its rows
            )

    def evaluate(self, minibatch: Minibatch) -> tuple[th.Tensor, th.Tensor, th.Tensor | None]:
        """Values, log-probs and entropies of the minibatch's transitions under the current policy, flat."""
        seq = minibatch.inputs
        log_prob, entropy, values = self.policy.evaluate_sequences(seq.input_ids, seq.attention_mask, seq.action_mask)
        m = seq.action_mask
        return values[m], log_prob[m], entropy[m]

    def evaluate_slices(self, minibatch: Minibatch, sizes: list[int]) -> list[Outputs]:
        """:meth:`evaluate` in consecutive slices of ``sizes`` transitions, one forward per slice: the sequences that
        hold a slice's transitions (a sequence cut by a slice boundary is evaluated in both of its slices, each
        keeping its own tokens).

        :param minibatch: The minibatch.
        :param sizes: Transitions per slice (summing to the minibatch's).
        """
        seq = minibatch.inputs
        counts = seq.action_mask.sum(1).tolist()  # transitions per sequence, in the flat order
        out, row, first, lo = [], 0, 0, 0  # first: the flat index of sequence `row`'s first transition
        for size in sizes:
            hi = lo + size
            while first + counts[row] <= lo:  # skip the sequences that end before this slice
                first += counts[row]
                row += 1
            end_row, end_first = row, first
            while end_first < hi:  # the sequences that hold a transition of [lo, hi)
                end_first += counts[end_row]
                end_row += 1
            part = SequenceSamples(*(field[row:end_row] for field in seq))
            values, log_prob, entropy = self.evaluate(minibatch._replace(inputs=part))
            keep = slice(lo - first, hi - first)
            out.append((values[keep], log_prob[keep], entropy[keep]))
            lo = hi
        return out

    def reference_log_prob(self, minibatch: Minibatch) -> th.Tensor:
        """``log pi_ref(a|s)`` of the KL reference for the minibatch's transitions (no gradient)."""
        seq = minibatch.inputs
        with th.no_grad():
            ref_log_prob, _, _ = self.reference(seq.input_ids, seq.attention_mask, seq.action_mask)
        return ref_log_prob[seq.action_mask]

    def split(self, minibatch: Minibatch, micro_batch_size: int) -> list[Minibatch]:
        """The minibatch in consecutive micro-batches of ``micro_batch_size`` whole sequences (the last may hold
        fewer), each with its :class:`~sb3_grpo.common.type_aliases.MicroBatchShare`.

        :param minibatch: The minibatch.
        :param micro_batch_size: Sequences per micro-batch.
        """
        seq = minibatch.inputs
        counts = seq.action_mask.sum(1).tolist()  # transitions per sequence, in the flat order
        bounds = list(range(0, len(counts), micro_batch_size)) + [len(counts)]
        rows = list(zip(bounds[:-1], bounds[1:], strict=True))
        sizes = [int(sum(counts[lo:hi])) for lo, hi in rows]
        return [
            Minibatch(inputs=SequenceSamples(*(field[lo:hi] for field in seq)), share=share, **flat)
            for (lo, hi), share, flat in zip(
                rows, _shares(minibatch, sizes), _split_flat(minibatch, sizes), strict=True
            )
        ]


BatchSource = TransitionBatches | SequenceBatches


def make_batch_source(
    buffer_class: type[RolloutBuffer], policy: BasePolicy, ref_policy: BasePolicy | None, discrete: bool, kl: bool
) -> BatchSource:
    """The batch source of a rollout buffer class: :class:`SequenceBatches` for a sequence buffer, else
    :class:`TransitionBatches`.

    :param buffer_class: The algorithm's rollout buffer class.
    :param policy: The policy being trained.
    :param ref_policy: The frozen KL reference policy, or ``None`` when there is none (no KL term, or a policy that
        defines its own reference, e.g. a LoRA policy with its adapters off).
    :param discrete: Whether the action space is ``Discrete``.
    :param kl: Whether the update has a KL term (then a reference is needed).
    """
    sequences = issubclass(buffer_class, SequenceRolloutBuffer)
    reference = None
    if kl:
        if ref_policy is not None:
            reference = ref_policy.evaluate_sequences if sequences else ref_policy.evaluate_actions
        else:
            reference = policy.reference_evaluate_sequences if sequences else policy.reference_evaluate_actions
    if sequences:
        return SequenceBatches(policy, reference)
    return TransitionBatches(policy, reference, discrete)


def rollout_buffer_class_for(
    requested: type[RolloutBuffer] | None,
    policy_class: type[BasePolicy],
    observation_space: spaces.Space,
    action_space: spaces.Space,
) -> type[RolloutBuffer]:
    """The rollout buffer class, and with it the update path.

    ``None`` chooses: the text fast path's :class:`~sb3_grpo.common.buffers.SequenceRolloutBuffer` for a policy with
    ``evaluate_sequences`` on a text env, else GRPO's subclass of SB3's ``RolloutBuffer`` / ``DictRolloutBuffer``.
    SB3's stock classes, requested by name, are replaced by those subclasses too (the same buffer plus the policy's
    own log-probs, the KL's importance weights); any other class is used as it is.

    :param requested: The ``rollout_buffer_class`` argument.
    :param policy_class: The policy class.
    :param observation_space: The env's observation space.
    :param action_space: The env's action space.
    """
    if requested is not None:
        return GRPO_BUFFERS.get(requested, requested)
    if hasattr(policy_class, "evaluate_sequences") and is_text_space(observation_space, action_space):
        return SequenceRolloutBuffer
    return GRPODictRolloutBuffer if isinstance(observation_space, spaces.Dict) else GRPORolloutBuffer
