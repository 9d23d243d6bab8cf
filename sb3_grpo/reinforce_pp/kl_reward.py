"""REINFORCE++'s token-level KL penalty in the reward (Hu 2025, arXiv 2501.03262, eq. 9):
``KL(t) = log pi_old(a_t|s_t) - log pi_ref(a_t|s_t)``, the log-ratio of the policy that acted to the frozen reference
at each token of the rollout, of which ``kl_coef * KL(t)`` is subtracted from the token's reward.

:func:`rollout_kl` evaluates the reference once over the whole rollout, at its end, through the update path's
reference (:mod:`sb3_grpo.common.update.batch_sources`): the text fast path's sequences, one forward per chunk of
them, or the per-transition path's observations, one forward per step.
"""

from __future__ import annotations

import numpy as np
import torch as th
from stable_baselines3.common.buffers import DictRolloutBuffer, RolloutBuffer

from sb3_grpo.common.buffers import SequenceRolloutBuffer, episode_segments
from sb3_grpo.common.type_aliases import SequenceSamples
from sb3_grpo.common.update.batch_sources import BatchSource

__all__ = ["reference_log_probs", "rollout_kl"]

#: Sequences per forward of the reference over a text rollout.
SEQUENCES_PER_FORWARD = 32


def rollout_kl(batch_source: BatchSource, buffer: RolloutBuffer) -> np.ndarray:
    """``(n_steps, n_envs)``: ``log pi_old(a_t|s_t) - log pi_ref(a_t|s_t)`` at every step of the filled ``buffer``
    (``log pi_old`` the log-probs the buffer stores: the policy's own, REINFORCE++ does not explore).

    :param batch_source: The update path, with the KL reference (``batch_source.reference``).
    :param buffer: The rollout's buffer (filled, not yet served to the update).
    """
    return buffer.log_probs - reference_log_probs(batch_source, buffer)


def reference_log_probs(batch_source: BatchSource, buffer: RolloutBuffer) -> np.ndarray:
    """``(n_steps, n_envs)``: the reference's ``log pi_ref(a_t|s_t)`` of every stored action (no gradient).

    :param batch_source: The update path, with the KL reference.
    :param buffer: The rollout's buffer.
    """
    out = np.zeros((buffer.buffer_size, buffer.n_envs), dtype=np.float32)
    with th.no_grad():
        if isinstance(buffer, SequenceRolloutBuffer):
            segments = episode_segments(buffer.episode_starts)
            buffer.check_windows(segments)
            for lo in range(0, len(segments), SEQUENCES_PER_FORWARD):
                samples = buffer.sequence_samples(segments[lo : lo + SEQUENCES_PER_FORWARD])
                log_prob = _sequence_reference(batch_source, samples)
                flat = samples.index[samples.action_mask].cpu().numpy()  # env * n_steps + step
                out[flat % buffer.buffer_size, flat // buffer.buffer_size] = log_prob.cpu().numpy()
            return out
        for t in range(buffer.buffer_size):
            if isinstance(buffer, DictRolloutBuffer):
                obs = {key: buffer.to_torch(value[t]) for key, value in buffer.observations.items()}
            else:
                obs = buffer.to_torch(buffer.observations[t])
            actions = buffer.to_torch(buffer.actions[t])
            if batch_source.discrete:
                actions = actions.long().flatten()
            _, log_prob, _ = batch_source.reference(obs, actions)
            out[t] = log_prob.flatten().cpu().numpy()
    return out


def _sequence_reference(batch_source: BatchSource, samples: SequenceSamples) -> th.Tensor:
    log_prob, _, _ = batch_source.reference(samples.input_ids, samples.attention_mask, samples.action_mask)
    return log_prob[samples.action_mask]
