"""The sample tuples that GRPO's buffers yield and its update consumes (sb3-contrib's ``type_aliases.py``)."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch as th

__all__ = ["GRPORolloutBufferSamples", "MicroBatchShare", "Minibatch", "SequenceSamples", "sequence_index"]


class GRPORolloutBufferSamples(NamedTuple):
    """SB3's ``RolloutBufferSamples`` / ``DictRolloutBufferSamples`` fields, same order, plus
    ``old_policy_log_prob``: the acting policy's ``log pi_old(a|s)`` (``old_log_prob`` is the behaviour
    distribution's, the exploration mixture's while ``explore_alpha > 0``), and ``segment_id``: the id of the
    transition's sequence (the run of one episode's steps in the rollout, unique in the rollout)."""

    observations: Any
    actions: th.Tensor
    old_values: th.Tensor
    old_log_prob: th.Tensor
    advantages: th.Tensor
    returns: th.Tensor
    old_policy_log_prob: th.Tensor
    segment_id: th.Tensor | None = None


class SequenceSamples(NamedTuple):
    """
    A minibatch of whole sequences for the text fast path.

    Every tensor is ``[S, W]``: ``S`` sequences (the steps of one episode within the rollout), each in its
    final window of width ``W``. At a position ``j`` where ``action_mask[s, j]`` is true, ``input_ids[s, j]``
    is the action taken in the state whose newest token is at ``j - 1``, and the per-transition fields are
    stored there (zero elsewhere). ``index`` is the transition's flat index in ``RolloutBuffer`` order
    (``env * n_steps + step``), ``-1`` elsewhere. ``x[action_mask]`` lists the transitions sequence by
    sequence, step by step, the same order for every field. ``old_log_prob`` is the behaviour distribution's
    log-prob (the exploration mixture's while ``explore_alpha > 0``), ``old_policy_log_prob`` the acting
    policy's own.
    """

    input_ids: th.Tensor
    attention_mask: th.Tensor
    action_mask: th.Tensor
    old_values: th.Tensor
    old_log_prob: th.Tensor
    advantages: th.Tensor
    returns: th.Tensor
    index: th.Tensor
    old_policy_log_prob: th.Tensor


class MicroBatchShare(NamedTuple):
    """Where a micro-batch sits in its minibatch (``micro_batch_size``): the loss of a micro-batch is its share of
    the minibatch's loss, so that the shares' gradients add up to the minibatch's gradient.

    ``fraction`` is the micro-batch's transitions over the minibatch's (the weight of a mean over transitions);
    ``n_sequences`` the whole minibatch's sequences (a per-sequence normaliser's count; ``None`` when the buffer does
    not give sequences).
    """

    fraction: float
    n_sequences: int | None


class Minibatch(NamedTuple):
    """One minibatch of the update, flat per transition, from either batch source.

    The flat fields list the same transitions in the same order as the policy's outputs for them.
    ``old_log_prob`` is the behaviour distribution's (the exploration mixture's while ``alpha > 0``),
    ``old_policy_log_prob`` the acting policy's own (``None`` from a buffer that does not store it, e.g. a stock
    SB3 one put in by hand). ``inputs`` is what the batch source needs to evaluate the minibatch: the
    observations (per-transition path) or the :class:`SequenceSamples` (the text fast path).

    ``sequence_ids`` says which sequence each transition belongs to (one episode's steps in the rollout; ``None``
    from a buffer that does not say): equal ids, same sequence. Both paths give it, so a per-sequence or
    length-normalised loss reads the same on each (:func:`sequence_index`). On the text fast path a minibatch holds
    whole sequences; on the per-transition path it holds the sequences' sampled steps.

    ``share`` is ``None`` for a whole minibatch; a micro-batch (``micro_batch_size``) carries its
    :class:`MicroBatchShare`, and its ``advantages`` are already those the whole minibatch's loss uses (normalised
    with the whole minibatch's mean and standard deviation where the algorithm normalises them).
    """

    actions: th.Tensor
    old_values: th.Tensor
    old_log_prob: th.Tensor
    advantages: th.Tensor
    returns: th.Tensor
    inputs: Any
    old_policy_log_prob: th.Tensor | None = None
    sequence_ids: th.Tensor | None = None
    share: MicroBatchShare | None = None


def sequence_index(sequence_ids: th.Tensor) -> tuple[th.Tensor, int]:
    """Each transition's sequence as a row ``0 .. S - 1`` of the minibatch's ``S`` sequences (ordered by id), and ``S``.

    :param sequence_ids: ``Minibatch.sequence_ids``.
    """
    unique, index = th.unique(sequence_ids, return_inverse=True)
    return index, int(unique.numel())
