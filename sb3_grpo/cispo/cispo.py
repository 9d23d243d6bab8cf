"""
CISPO (MiniMax 2025, "MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning Attention", arXiv 2506.13585,
section 3.1): clip the importance weight, not the update.

PPO's clip zeroes the gradient of a token whose ratio left ``[1 - eps, 1 + eps]``; the paper finds that these are
often rare tokens that matter ("However", "Recheck") and that dropping their gradient after the first update hurts.
CISPO keeps every token's gradient and only caps its importance weight, detached:
``J_t = sg(clip(r_t, 1 - eps_low, 1 + eps_high)) * A_t * log pi(a_t|s_t)``
(:func:`~sb3_grpo.objectives.cispo_objective`), averaged over the minibatch's tokens.

No critic, no KL term; the skeleton is :class:`~sb3_grpo.common.critic_free.CriticFreeAlgorithm`.
"""

from __future__ import annotations

from typing import Any

import torch as th
from stable_baselines3.common.logger import Logger
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.common.type_aliases import GymEnv

from sb3_grpo.common.advantages.forms import CRITIC_FREE_FORMS
from sb3_grpo.common.critic_free import CriticFreeAlgorithm
from sb3_grpo.common.options.checks import check_clip_bounds
from sb3_grpo.common.options.support import Supports
from sb3_grpo.common.type_aliases import Minibatch
from sb3_grpo.common.update.train_stats import TrainStats
from sb3_grpo.objectives import cispo_objective, decoupled_eps

__all__ = ["CISPO"]


class CISPO(CriticFreeAlgorithm):
    """
    CISPO: the policy gradient weighted by a clipped, detached importance ratio, every token's gradient kept; no critic.

    The loss of a minibatch of ``T`` tokens::

        w_t = sg(clip(r_t, 1 - eps_low, 1 + eps_high))
        L = -(1 / T) * sum_t w_t * A_t * log pi(a_t|s_t)  -  ent_coef * mean_t H_t

    with ``r_t = pi(a_t|s_t) / pi_old(a_t|s_t)`` and ``A_t`` the group advantage of ``t``'s episode. Its gradient is
    ``-(1 / T) sum_t w_t A_t grad log pi``: a token outside the range still moves, with its weight capped. The paper
    sets no lower bound (``clip_range_low=None``, the default) and tunes only ``eps_high``, whose value it does not
    give; the default ``0.28`` is DAPO's clip-higher bound, ours and untuned. ``train/clip_fraction`` is the share of
    tokens whose weight was capped. It needs an env with groups.

    PPO's arguments and the shared options are the skeleton's
    (:class:`~sb3_grpo.common.on_policy.GroupOnPolicyAlgorithm`; ``clip_range`` has no effect, the bounds being
    ``clip_range_low`` and ``clip_range_high``, nor do ``vf_coef``, ``clip_range_vf`` and ``normalize_advantage``); what
    it supports of the shared options is :attr:`supports`. Its own:

    :param clip_range_low: ``eps_low``, the weight's floor is ``1 - eps_low`` (``None``: no floor, the paper's)
    :param clip_range_high: ``eps_high``, the weight's cap is ``1 + eps_high``
    :param advantage: ``"group"`` (the paper's, the default), or another form without a critic
    """

    supports = Supports(advantages=CRITIC_FREE_FORMS, reward_redistribution=())

    def __init__(
        self,
        policy: str | type[ActorCriticPolicy],
        env: GymEnv | str,
        *args: Any,
        clip_range_low: float | None = None,
        clip_range_high: float = 0.28,
        advantage: str = "group",
        _init_setup_model: bool = True,
        **kwargs: Any,
    ):
        check_clip_bounds(clip_range_low, clip_range_high, low_example=0.2, high_example=0.28)
        super().__init__(policy, env, *args, advantage=advantage, _init_setup_model=_init_setup_model, **kwargs)
        self.clip_range_low = clip_range_low
        self.clip_range_high = clip_range_high
        if _init_setup_model:
            self._setup_model()

    def _policy_loss(
        self, minibatch: Minibatch, log_prob: th.Tensor, clip_range: float, stats: TrainStats
    ) -> th.Tensor:
        """CISPO's policy term (see the class); ``clip_range`` is unused, the bounds being CISPO's own."""
        del clip_range  # CISPO's own bounds
        advantages = minibatch.advantages
        objective = cispo_objective(
            log_prob, minibatch.old_log_prob, advantages, self.clip_range_low, self.clip_range_high
        )
        with th.no_grad():
            ratio = th.exp(log_prob - minibatch.old_log_prob)
            low = float("inf") if self.clip_range_low is None else self.clip_range_low
        stats.add_clip_fractions(ratio, decoupled_eps(ratio, low, self.clip_range_high), advantages)
        # token-level: the sum over every token of the minibatch divided by their number (MiniMax-M1, eq. 4); a
        # micro-batch's mean weighted by its share of the minibatch's tokens
        return -objective.mean() * (1.0 if minibatch.share is None else minibatch.share.fraction)

    def _record_own(self, logger: Logger, clip_range: float) -> None:
        del clip_range  # CISPO's bounds are its own
        logger.record("train/clip_range_low", float("nan") if self.clip_range_low is None else self.clip_range_low)
        logger.record("train/clip_range_high", self.clip_range_high)
