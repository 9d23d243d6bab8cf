"""
DAPO's reward shaping and group filtering, in the group tracker: :class:`ShapedGroupTracker`.

- **Soft overlong punishment** (:func:`~sb3_grpo.objectives.overlong_penalty`): on an episode's last step its reward,
  as the group advantage sees it, gets the penalty of its length. The length ``|y|`` is the episode's steps, i.e. the
  tokens the policy emitted (its EOS included), counted across rollouts; it is what ``max_completion_tokens`` bounds
  (a text env's ``max_new_tokens``, an interactive env's agent steps). ``info["completion_ids"]`` is not used: on an
  interactive env it also holds the env's replies, which the policy did not write. Only the group advantage sees the
  penalty: the buffer's rewards and SB3's episode log (``rollout/ep_rew_mean``) keep the env's rewards.
- **Groups without signal** (:func:`~sb3_grpo.objectives.informative_groups`): with ``drop_uninformative`` the members
  of a completed group whose returns are all equal are marked not valid (their advantage would be 0 anyway), so
  :attr:`~sb3_grpo.common.advantages.group_trackers.EpisodeGroupTracker.resolved` says ``None`` for them and DAPO leaves
  their sequences out of the update (``carry_over`` drops their held steps too).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch as th

from sb3_grpo.common.advantages.group_trackers import EpisodeGroupTracker, GroupAdvantageFn
from sb3_grpo.objectives import informative_groups, overlong_penalty

__all__ = ["ShapedGroupTracker"]


class ShapedGroupTracker(EpisodeGroupTracker):
    """
    :class:`~sb3_grpo.common.advantages.group_trackers.EpisodeGroupTracker` with DAPO's overlong penalty on episode
    returns and its filter of groups whose returns are all equal.

    :param n_envs: number of envs of the VecEnv
    :param group_size: episodes per group round
    :param advantage_fn: the group advantage, as for the base tracker
    :param greedy_envs: envs that act greedily (self-critical), or ``None``
    :param overlong: ``(L_max, L_cache, penalty_factor)`` of :func:`~sb3_grpo.objectives.overlong_penalty`, or
        ``None`` (no penalty)
    :param drop_uninformative: mark the members of groups whose returns are all equal not valid
    """

    def __init__(
        self,
        n_envs: int,
        group_size: int,
        advantage_fn: GroupAdvantageFn,
        greedy_envs: np.ndarray | None = None,
        overlong: tuple[int, int, float] | None = None,
        drop_uninformative: bool = False,
    ):
        self.overlong = overlong
        self.drop_uninformative = drop_uninformative
        super().__init__(n_envs, group_size, self._filtered(advantage_fn), greedy_envs=greedy_envs)
        self.running_lengths = np.zeros(n_envs, dtype=np.int64)
        #: penalties of the episodes that ended in the rollout being recorded
        self.penalties: list[float] = []
        #: after :meth:`compute`: completed groups with and without signal in that rollout
        self.n_informative = 0
        self.n_uninformative = 0

    @classmethod
    def like(cls, tracker: EpisodeGroupTracker, **kwargs: Any) -> ShapedGroupTracker:
        """A shaped tracker with the settings of ``tracker`` (e.g. one of
        :func:`~sb3_grpo.common.advantages.forms.make_group_tracker`).

        :param tracker: The tracker to copy the envs, group size, advantage and greedy envs from.
        :param kwargs: ``overlong`` and ``drop_uninformative``.
        """
        return cls(tracker.n_envs, tracker.group_size, tracker.advantage_fn, tracker.greedy_envs, **kwargs)

    def _filtered(self, advantage_fn: GroupAdvantageFn) -> GroupAdvantageFn:
        def advantage(returns: th.Tensor, group_ids: th.Tensor, is_greedy: th.Tensor):
            adv, valid = advantage_fn(returns, group_ids, is_greedy)
            informative = informative_groups(returns, group_ids)
            self.n_informative = int(th.unique(group_ids[informative]).numel())
            self.n_uninformative = int(th.unique(group_ids[~informative]).numel())
            if self.drop_uninformative:
                valid = valid & informative
                adv = th.where(valid, adv, th.zeros_like(adv))
            return adv, valid

        return advantage

    def reset_rollout(self, n_steps: int) -> None:
        super().reset_rollout(n_steps)
        self.penalties = []

    def add(self, rewards: np.ndarray, dones: np.ndarray, infos: Sequence[dict[str, Any]]) -> None:
        """Record one step, the overlong penalty added to the reward of each episode that ends in it."""
        self.running_lengths += 1
        if self.overlong is not None and dones.any():
            ended = np.flatnonzero(dones)
            penalty = overlong_penalty(self.running_lengths[ended], *self.overlong)
            rewards = np.asarray(rewards, dtype=np.float64).copy()
            rewards[ended] += penalty
            self.penalties.extend(penalty.tolist())
        self.running_lengths[np.asarray(dones, dtype=bool)] = 0
        super().add(rewards, dones, infos)

    def compute(self) -> tuple[np.ndarray, dict[str, float]]:
        self.n_informative = self.n_uninformative = 0
        return super().compute()

    def dropped_segments(self) -> set[tuple[int, int]]:
        """``(env, t0)`` of the rollout's segments whose episode is a member of a completed group that is not valid
        (no signal, or a greedy member): the update leaves them out."""
        return {(env, t0) for env, t0, _, key in self.segments if key in self.resolved and self.resolved[key] is None}

    def kept_segments(self) -> np.ndarray:
        """``(env, t0, t1)`` of the rollout's segments whose group advantage is known and valid."""
        rows = [(env, t0, t1) for env, t0, t1, key in self.segments if self.resolved.get(key) is not None]
        return np.array(rows, dtype=np.int64).reshape(-1, 3)
