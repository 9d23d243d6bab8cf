"""GRPO's ``carry_over``: the steps of an episode whose group advantage is not known when its rollout ends are trained
on in the update after it becomes known, instead of with advantage 0 in their own rollout's update.

A group advantage needs the returns of every member of the group
(:class:`~sb3_grpo.common.advantages.group_trackers.EpisodeGroupTracker`). An episode still running when the rollout
ends, or one that ended while another member of its group still runs, has none yet: without ``carry_over`` its steps of
this rollout get advantage 0 and teach nothing (the share of steps that do teach is logged as
``rollout/frac_steps_nonzero_advantage``; on TextGen-v0 with ``n_steps`` equal to the completion budget it is about
half). With ``carry_over`` those steps are set aside, as whole sequences of the text fast path
(:class:`~sb3_grpo.common.buffers.SequenceSamples`, the episode's window as it stood at the rollout's end), and join the
minibatches of the first update after their group completes, with the episode's advantage. Every step is then trained on
exactly once, with its episode's advantage; the price is staleness: a step carried over ``k`` rollouts is trained by a
policy ``k`` updates newer than the one that sampled it, which the PPO ratio against the stored behaviour log-prob (and
its clip) accounts for, as in PPO's later epochs.

What is never trained on: the steps of episodes whose group never completes (its oldest pending groups dropped past
the tracker's ``max_pending_groups``), of greedy members (``advantage="self_critical"``), and of episodes dropped for a
non-finite reward (``nonfinite="skip"``). Held sequences live on the buffer's device and are not saved with the model
(the tracker's pending groups are not either).
"""

from __future__ import annotations

import math

import numpy as np
import torch as th

from sb3_grpo.common.advantages.group_trackers import EpisodeGroupTracker
from sb3_grpo.common.buffers import SequenceRolloutBuffer
from sb3_grpo.common.type_aliases import SequenceSamples

__all__ = ["CarryOver"]


class CarryOver:
    """The sequences held for a later update, by episode key (:attr:`EpisodeGroupTracker.segments`). It follows the
    keys of the tracker :meth:`settle` last got; a new tracker (another number of envs) starts an empty store."""

    def __init__(self) -> None:
        self.tracker: EpisodeGroupTracker | None = None
        self.held: dict[int, list[SequenceSamples]] = {}

    def held_steps(self) -> int:
        """Transitions held for a later update."""
        return sum(int(s.action_mask.sum()) for rows in self.held.values() for s in rows)

    def settle(
        self, buffer: SequenceRolloutBuffer, tracker: EpisodeGroupTracker, dropped_rows: np.ndarray | None = None
    ) -> dict[str, float]:
        """After the tracker's :meth:`~EpisodeGroupTracker.compute` for the rollout in ``buffer``: hand the buffer the
        held sequences whose advantage is now known (with it), and hold this rollout's segments whose advantage is
        not (the buffer leaves them out of this update).

        :param buffer: The filled rollout buffer, its advantages written.
        :param tracker: The tracker that computed them.
        :param dropped_rows: ``[n_steps, n_envs]`` steps of episodes dropped for a non-finite reward (not carried).
        :return: ``carried_steps`` (held transitions trained on in this update) and ``deferred_steps`` (this rollout's
            transitions held for a later one).
        """
        if tracker is not self.tracker:
            self.tracker, self.held = tracker, {}
        dropped = set()
        if dropped_rows is not None:
            dropped = {key for env, t0, t1, key in tracker.segments if bool(dropped_rows[t0:t1, env].any())}
        ready = []
        for key, advantage in tracker.resolved.items():
            rows = self.held.pop(key, None)
            if rows is None or advantage is None or key in dropped or not math.isfinite(advantage):
                continue
            ready.extend(s._replace(advantages=s.action_mask.to(s.advantages.dtype) * advantage) for s in rows)
        live = tracker.live_keys() - dropped
        waiting = [(env, t0, t1, key) for env, t0, t1, key in tracker.segments if key in live]
        if waiting:
            samples = buffer.sequence_samples(np.array([w[:3] for w in waiting], dtype=np.int64))
            samples = samples._replace(index=th.full_like(samples.index, -1))  # no longer rows of a buffer
            for i, (_, _, _, key) in enumerate(waiting):
                self.held.setdefault(key, []).append(SequenceSamples(*(field[i : i + 1] for field in samples)))
        for key in set(self.held) - live:  # dropped (non-finite reward), or its pending group dropped by the tracker
            del self.held[key]
        carried_in = SequenceSamples(*(th.cat(f) for f in zip(*ready, strict=True))) if ready else None
        buffer.carry(carried_in, {(env, t0) for env, t0, _, _ in waiting})
        return {
            "carried_steps": float(sum(int(s.action_mask.sum()) for s in ready)),
            "deferred_steps": float(sum(t1 - t0 for _, t0, t1, _ in waiting)),
        }
