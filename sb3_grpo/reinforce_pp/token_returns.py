"""REINFORCE++'s advantage form, ``advantage="reinforce_pp"``: each token's return-to-go in its episode, normalised over
the whole batch (:func:`~sb3_grpo.objectives.batch_normalized_returns`), registered in the package's registry of forms.

:class:`TokenReturnTracker` is its per-step bookkeeping: it records a rollout's rewards and episode ends, and at the
rollout's end subtracts the token-level KL penalty (given by the algorithm, :mod:`.kl_reward`) from the rewards before
the returns. The form needs no groups (one completion per prompt is enough) and gives every token an advantage of its
own, so ``carry_over`` does not apply to it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch as th

from sb3_grpo.common.advantages.forms import AdvantageForm, register_advantage
from sb3_grpo.common.advantages.group_trackers import EpisodeGroupTracker
from sb3_grpo.objectives import batch_normalized_returns

__all__ = ["REINFORCE_PP_FORM", "TokenReturnTracker"]


def _per_token(_returns: th.Tensor, _group_ids: th.Tensor, _is_greedy: th.Tensor):
    raise AssertionError("TokenReturnTracker computes an advantage per token, not per episode")


class TokenReturnTracker(EpisodeGroupTracker):
    """Per-step bookkeeping of ``advantage="reinforce_pp"``: the rollout's rewards and ends, and at its end every
    token's batch-normalised return-to-go (REINFORCE++, Hu 2025, arXiv 2501.03262, eqs. 8-10). A token of an episode
    that has not ended when the rollout ends gets advantage 0 (its return is not known yet).

    :param n_envs: The VecEnv's envs.
    :param gamma: The discount of the returns (REINFORCE++: 1).
    :param penalty: Called at the rollout's end: the ``(n_steps, n_envs)`` penalty subtracted from each token's reward
        (``beta * KL(t)``); ``None``: none.
    :param mean_over_ranks: ``(total, count) -> global mean`` over the data-parallel ranks (``None``: this process).
    """

    def __init__(
        self,
        n_envs: int,
        gamma: float = 1.0,
        penalty: Callable[[], np.ndarray] | None = None,
        mean_over_ranks: Callable[[float, float], float] | None = None,
    ) -> None:
        super().__init__(n_envs, 1, _per_token)
        self.gamma = gamma
        self.penalty = penalty
        self.mean_over_ranks = mean_over_ranks

    def add(self, rewards: np.ndarray, dones: np.ndarray, infos: Sequence[dict[str, Any]]) -> None:  # noqa: ARG002
        # (the trackers' signature: the infos name a group, which this form does not need)
        """Record one step of the VecEnv (its rewards and ends; no group needed)."""
        self.rewards[self.pos] = rewards
        self.dones[self.pos] = dones
        self.pos += 1

    def compute(self) -> tuple[np.ndarray, dict[str, float]]:
        """Every recorded token's advantage.

        :return: ``(advantages, stats)``: ``advantages`` of shape ``(n_steps, n_envs)`` (float32), and the statistics
            of :meth:`EpisodeGroupTracker.compute` (``n_groups`` counts the episodes that ended; the reward figures
            are their summed rewards, without the penalty).
        """
        n_steps = self.pos
        rewards = self.rewards[:n_steps]
        shaped = rewards if self.penalty is None else rewards - self.penalty()[:n_steps]
        ends = th.as_tensor(self.dones[:n_steps])
        advantages, valid = batch_normalized_returns(
            th.as_tensor(shaped), ends, self.gamma, mean_over_ranks=self.mean_over_ranks
        )
        totals = _episode_totals(rewards, self.dones[:n_steps])
        self.resolved, self.segments = {}, []
        adv = advantages.numpy()
        return adv, {
            "group_reward_mean": float(np.mean(totals)) if totals else float("nan"),
            "group_reward_std": float(np.std(totals, ddof=1)) if len(totals) > 1 else float("nan"),
            "n_groups": float(len(totals)),
            "frac_steps_nonzero_advantage": float(np.mean(adv != 0)) if adv.size else 0.0,
        }

    def live_keys(self) -> set[int]:
        """No episode is held for later (``carry_over`` does not apply)."""
        return set()


def _episode_totals(rewards: np.ndarray, dones: np.ndarray) -> list[float]:
    """The summed rewards, within the rollout, of the episodes that end in it."""
    totals = []
    for env in range(rewards.shape[1]):
        start = 0
        for t in np.flatnonzero(dones[:, env]).tolist():
            totals.append(float(rewards[start : t + 1, env].sum()))
            start = t + 1
    return totals


#: ``advantage="reinforce_pp"`` in the registry of forms (without the KL penalty, which the algorithm adds).
REINFORCE_PP_FORM = register_advantage(
    AdvantageForm(
        "reinforce_pp",
        lambda n_envs, _group_size: TokenReturnTracker(n_envs),
        grouped=False,
        per_token=True,
        summary="each token's return-to-go, normalised over the whole batch (REINFORCE++, arXiv 2501.03262)",
        owner="ReinforcePP",
    )
)
