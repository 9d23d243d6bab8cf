"""Non-finite numbers never reach the weights: GRPO's handling of NaN/inf rewards, advantages, losses, gradients.

``nonfinite="raise"`` (the default) stops with an error naming the quantity, the env / update / timestep, before
the optimizer touches the weights. ``nonfinite="skip"`` drops instead and counts: an episode whose reward is
NaN/inf (or whose env set ``info["reward_nonfinite"]``) gets reward 0 and advantage 0 on its steps of the rollout,
with its value target set to the old value (:class:`NonFiniteEpisodes`); a minibatch with a non-finite loss or
gradient takes no optimizer step.
"""

from __future__ import annotations

import math

import numpy as np
import torch as th
from stable_baselines3.common.buffers import RolloutBuffer

__all__ = ["NonFiniteEpisodes", "check_advantages", "check_log_probs", "raise_non_finite"]


class NonFiniteEpisodes:
    """One rollout's bookkeeping of the episodes with a non-finite reward.

    :param nonfinite: ``"raise"`` or ``"skip"``.
    :param n_envs: Envs of the VecEnv.
    :param n_rollout_steps: Steps per env in the rollout.
    """

    def __init__(self, nonfinite: str, n_envs: int, n_rollout_steps: int) -> None:
        self.nonfinite = nonfinite
        self.episode_first_row = np.zeros(n_envs, dtype=np.int64)
        self.ended_first_row = np.zeros(n_envs, dtype=np.int64)  # of the episodes that ended at the last step
        self.dropped_rows = np.zeros((n_rollout_steps, n_envs), dtype=bool)
        self.dropped_episodes = 0

    def check_rewards(
        self, rewards: np.ndarray, dones: np.ndarray, infos: list[dict], row: int, timestep: int, n_updates: int
    ) -> np.ndarray:
        """Check one step's rewards. ``"raise"``: a NaN/inf reward raises with its env, timestep and completion.
        ``"skip"``: it becomes 0, and the episode (also one flagged ``info["reward_nonfinite"]`` by the env) is
        marked so that :meth:`drop` zeroes its advantages.

        :param rewards: The step's rewards.
        :param dones: The step's dones.
        :param infos: The step's infos.
        :param row: The step's index in the rollout.
        :param timestep: ``num_timesteps`` before the step (for the message).
        :param n_updates: Updates so far (for the message).
        :return: The rewards to store.
        """
        if self.nonfinite == "raise":
            if not np.isfinite(rewards).all():
                bad = ~np.isfinite(rewards)
                i = int(np.flatnonzero(bad)[0])
                where = f"; completion {infos[i]['completion']!r}" if "completion" in infos[i] else ""
                raise RuntimeError(
                    f"GRPO: env {i} returned a non-finite reward ({rewards[i]}) at timestep "
                    f"{timestep + len(rewards)} (update {n_updates}){where}; non-finite rewards make non-finite "
                    "advantages, so no update was made. Fix the reward, or pass nonfinite='skip' to drop such "
                    "episodes (and, for text envs, nonfinite_reward='skip')"
                )
            return rewards
        bad = ~np.isfinite(rewards)
        flagged = bad | np.array([bool(info.get("reward_nonfinite", False)) for info in infos])
        if bad.any():
            rewards = np.where(bad, 0.0, rewards).astype(rewards.dtype)
        for i in np.flatnonzero(flagged):
            self.drop_episode(i, self.episode_first_row[i], row)
        ended = np.flatnonzero(dones)
        self.ended_first_row[ended] = self.episode_first_row[ended]
        self.episode_first_row[ended] = row + 1
        return rewards

    def drop_episode(self, env: int, first_row: int, row: int) -> None:
        """``"skip"``: drop env ``env``'s episode of rows ``first_row .. row`` (its reward was NaN/inf, or the env
        flagged it); a reward that arrives after its step (scored in the background) is dropped this way too."""
        if self.nonfinite != "skip":
            return
        self.dropped_rows[first_row : row + 1, env] = True
        self.dropped_episodes += 1

    def drop(self, rollout_buffer: RolloutBuffer) -> None:
        """``"skip"``: zero the advantages of dropped episodes and of any non-finite advantage, and set their value
        targets to the old values."""
        if self.nonfinite != "skip":
            return
        drop = self.dropped_rows | ~np.isfinite(rollout_buffer.advantages) | ~np.isfinite(rollout_buffer.values)
        if drop.any():
            values = np.nan_to_num(rollout_buffer.values, nan=0.0, posinf=0.0, neginf=0.0)
            rollout_buffer.advantages[drop] = 0.0
            rollout_buffer.values[drop] = values[drop]
            rollout_buffer.returns[drop] = values[drop]


def check_log_probs(log_probs: th.Tensor, row: int, timestep: int, n_updates: int) -> None:
    """Raise when a rollout step's behaviour log-probs are not all finite: the policy's distribution had NaN/inf
    parameters (the draw skips torch's own checks, :func:`~sb3_grpo.engines.step.sample_actions`),
    and its actions are not draws of any distribution. Raised in both ``nonfinite`` modes: the policy itself is
    broken, not one episode.

    :param log_probs: The step's behaviour log-probs (one per env).
    :param row: The step's index in the rollout.
    :param timestep: ``num_timesteps`` before the step (for the message).
    :param n_updates: Updates so far (for the message).
    :raises RuntimeError: naming the first env and its log-prob.
    """
    if math.isfinite(log_probs.sum().item()):  # one reduction (a sum of finite log-probs overflows only past 1e38)
        return
    finite = th.isfinite(log_probs)
    if bool(finite.all()):
        return
    env = int(th.nonzero(~finite.reshape(len(finite), -1).all(dim=1))[0])
    raise RuntimeError(
        f"GRPO: the policy's action distribution is not finite for env {env} at rollout step {row} (timestep "
        f"{timestep}, update {n_updates}): the log-prob of its action is {log_probs.reshape(len(finite), -1)[env]}. "
        "Its parameters (logits, or the Gaussian's mean / std) are NaN or inf: check the observations for NaN/inf "
        "and the loaded weights, or lower the learning rate."
    )


def check_advantages(rollout_buffer: RolloutBuffer, timestep: int, n_updates: int, advantage: str) -> None:
    """Raise when a rollout's advantages are not all finite (after :meth:`NonFiniteEpisodes.drop`).

    :raises RuntimeError: with the counts of non-finite rewards and values.
    """
    if np.all(np.isfinite(rollout_buffer.advantages)):
        return
    n_bad_rewards = int(np.sum(~np.isfinite(rollout_buffer.rewards)))
    n_bad_values = int(np.sum(~np.isfinite(rollout_buffer.values)))
    raise RuntimeError(
        f"GRPO: non-finite advantages in the rollout ending at timestep {timestep} "
        f"(update {n_updates}, advantage={advantage!r}); non-finite rewards: {n_bad_rewards}, "
        f"non-finite values: {n_bad_values}. Check the env's rewards and the value head."
    )


def raise_non_finite(what: str, n_updates: int, epoch: int, timestep: int, details: dict[str, float]) -> None:
    """Raise the error of a non-finite loss or gradient (no optimizer step was taken).

    :raises RuntimeError: always.
    """
    detail = ", ".join(f"{k}={v:.4g}" for k, v in details.items())
    raise RuntimeError(
        f"GRPO: non-finite {what} at update {n_updates} (epoch {epoch}, timestep {timestep}); "
        f"{detail}. No optimizer step was taken. Lower the learning rate, check rewards/observations "
        "for inf/nan, or lower grad_var_coef / kl_coef."
    )
