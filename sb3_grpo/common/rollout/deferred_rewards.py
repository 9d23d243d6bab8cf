"""Rewards scored in the background during GRPO's rollout, landed in the buffer before the update.

When the env offers it (:meth:`textrl_envs.vector.TextGenVectorEnv.defer_rewards`, through the SB3 adapter and its
monitor), GRPO's ``collect_rollouts`` has finished episodes scored by the env's background thread
(:mod:`textrl_envs.reward_worker`) while the policy computes the next tokens. ``step`` then returns reward 0 for those
episodes and a ticket in their infos; :class:`DeferredRewards` remembers where each one is in the rollout and, when
the rollout's steps are done and before returns and advantages are computed, adds the real reward there: in the
buffer's rewards (where SB3 already added ``gamma * V(terminal obs)`` for a truncated episode: the sum is the same),
in the group tracker's raw rewards, in the info dict (``info["reward"]``) and in the monitor's episode record
(``info["episode"]["r"]``, the dict SB3 keeps for ``rollout/ep_rew_mean``). The reward's timeout and NaN/inf rules
are the env's, as for a reward scored in ``step``: an error is raised here, at the end of the rollout; an episode the
env flags (``nonfinite_reward="skip"``) is dropped under ``nonfinite="skip"`` as it would have been.

What changes for the user: callbacks see reward 0 (and ``info["reward_ticket"]``) at the step an episode ends; the
episode's reward is in the buffer, the infos and the logs by the time the rollout ends. An env built with
``reward_worker=False``, an env without the method, or a monitor that writes a file (its rows are written at the
step) keep rewards in ``step``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.vec_env import VecEnv, VecMonitor

from sb3_grpo.common.advantages.group_trackers import EpisodeGroupTracker
from sb3_grpo.common.rollout.nonfinite import NonFiniteEpisodes

__all__ = ["DeferredRewards"]


def _deferring_env(env: VecEnv) -> Any:
    """The object of ``env``'s wrapper chain with ``defer_rewards``, or ``None`` (also when a monitor writes a file,
    whose rows would get the placeholder rewards)."""
    while env is not None:
        if isinstance(env, VecMonitor) and env.results_writer is not None:
            return None
        if callable(getattr(type(env), "defer_rewards", None)):
            return env
        env = getattr(env, "venv", None)
    return None


class DeferredRewards:
    """One rollout's rewards that the env scores in the background.

    :param target: The env object with ``defer_rewards`` / ``collect_rewards`` (deferral already on).
    """

    def __init__(self, target: Any) -> None:
        self.target = target
        # (ticket, env) -> (buffer row, first row of the episode in the rollout, the step's info dict)
        self.pending: dict[tuple[int, int], tuple[int, int, dict]] = {}

    @classmethod
    def start(cls, env: VecEnv) -> DeferredRewards | None:
        """Turn deferral on for a rollout of ``env``, or ``None`` when the env does not offer it."""
        target = _deferring_env(env)
        if target is None:
            return None
        target.collect_rewards(wait=True)  # leftovers of a rollout that a callback stopped: not ours
        return cls(target) if target.defer_rewards(True) else None

    def note(self, row: int, dones: np.ndarray, infos: list[dict], first_rows: np.ndarray) -> None:
        """Remember where the episodes that ended at buffer row ``row`` are (those with a ticket).

        :param first_rows: The first row in this rollout of each env's episode that ended at ``row``.
        """
        for i in np.flatnonzero(dones):
            ticket = infos[i].get("reward_ticket")
            if ticket is not None:
                self.pending[(int(ticket), int(i))] = (row, int(first_rows[i]), infos[i])

    def stop(self) -> None:
        """The rollout ended early: forget what is pending and score in ``step`` again."""
        self.target.collect_rewards(wait=True)
        self.target.defer_rewards(False)
        self.pending.clear()

    def land(
        self,
        rollout_buffer: RolloutBuffer,
        tracker: EpisodeGroupTracker | None,
        nonfinite: NonFiniteEpisodes,
        raw_rewards: np.ndarray | None = None,
    ) -> None:
        """Wait for every pending reward and put it where a reward scored in ``step`` would have been; turn deferral
        off (the env scores in ``step`` again outside GRPO's rollouts).

        :param raw_rewards: ``(n_steps, n_envs)`` raw rewards kept beside the buffer's (reward redistribution), or
            ``None``.

        :raises Exception: a reward's error (raised, timed out, or NaN/inf under the env's ``"raise"``).
        """
        try:
            results = self.target.collect_rewards(wait=True)
        finally:
            self.target.defer_rewards(False)
        for result in results:
            parts = result.components or [None] * len(result.rewards)
            for env, reward, flagged, part in zip(
                result.envs.tolist(), result.rewards, result.nonfinite, parts, strict=True
            ):
                row, first_row, info = self.pending.pop((result.ticket, env))
                if part is not None:
                    info["reward_components"] = part
                value = np.float32(reward)  # what the SB3 adapter returns
                rollout_buffer.rewards[row, env] += value
                if tracker is not None:
                    tracker.rewards[row, env] += float(value)
                if raw_rewards is not None:
                    raw_rewards[row, env] += float(value)
                info["reward"] = float(info.get("reward", 0.0)) + float(reward)  # 0 or an interactive turn's
                if "episode" in info:  # VecMonitor's record (float32, as it sums the step rewards)
                    info["episode"]["r"] = np.float32(info["episode"]["r"]) + value
                if flagged:
                    info["reward_nonfinite"] = True
                    nonfinite.drop_episode(env, first_row, row)
        if self.pending:
            raise RuntimeError(f"{len(self.pending)} deferred rewards never arrived: {sorted(self.pending)[:4]}")
