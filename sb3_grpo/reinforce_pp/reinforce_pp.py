"""
REINFORCE++ (Hu 2025, "REINFORCE++: A Simple and Efficient Approach for Aligning Large Language Models", arXiv
2501.03262): REINFORCE with two of PPO's devices and no critic.

- **Token-level KL in the reward** (eq. 9): every token's reward is the env's minus ``beta * KL(t)``, ``KL(t) = log
  pi_old(a_t|s_t) - log pi_ref(a_t|s_t)`` to a frozen reference (the initial policy, or a LoRA policy with its
  adapters off), evaluated once over the rollout at its end (:mod:`.kl_reward`).
- **Global advantage normalisation** (eqs. 8 and 10): each token's advantage is its return-to-go in its episode,
  normalised with the mean and standard deviation over the whole batch, not per prompt group
  (:func:`~sb3_grpo.objectives.batch_normalized_returns`, ``advantage="reinforce_pp"``: :mod:`.token_returns`); one
  completion per prompt is enough.
- **PPO's clipped surrogate**, averaged over the minibatch's tokens.

No critic, no value loss, no KL term in the loss (it is in the reward); the skeleton is
:class:`~sb3_grpo.common.critic_free.CriticFreeAlgorithm`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch as th
from stable_baselines3.common.logger import Logger
from stable_baselines3.common.policies import ActorCriticPolicy, BasePolicy
from stable_baselines3.common.type_aliases import GymEnv
from stable_baselines3.common.vec_env import VecEnv

from sb3_grpo.common.advantages.group_trackers import EpisodeGroupTracker, warn_if_episodes_straddle
from sb3_grpo.common.critic_free import CriticFreeAlgorithm
from sb3_grpo.common.options.support import Supports
from sb3_grpo.common.type_aliases import Minibatch
from sb3_grpo.common.update.train_stats import TrainStats
from sb3_grpo.grpo.kl import frozen_copy
from sb3_grpo.objectives import clipped_surrogate
from sb3_grpo.reinforce_pp.kl_reward import rollout_kl
from sb3_grpo.reinforce_pp.token_returns import REINFORCE_PP_FORM, TokenReturnTracker
from textrl_envs.validation import check_float

__all__ = ["ReinforcePP"]


class ReinforcePP(CriticFreeAlgorithm):
    """
    REINFORCE++: the token-level KL penalty in the reward, returns-to-go normalised over the batch, PPO's clip.

    With ``r_t`` the env's reward of token ``t`` (an episode's reward at its last token), ``KL(t)`` the log-ratio of
    the acting policy to the reference at the token, and ``T`` the episode's last token::

        A_t = (G_t - mean(G)) / (std(G) + eps),   G_t = sum_{s=t}^{T} gamma^(s - t) * (r_s - kl_coef * KL(s))
        L = -mean_t min(rho_t * A_t, clip(rho_t, 1 - eps, 1 + eps) * A_t)  -  ent_coef * mean_t H_t

    with the mean and (population) standard deviation over every token of the rollout whose episode ended in it (of
    every rank's rollout under ``torchrun``) and ``rho_t = pi(a_t|s_t) / pi_old(a_t|s_t)``. A token of an episode that
    has not ended when the rollout ends gets advantage 0 (keep ``n_steps`` a few episode lengths). It needs no groups.

    PPO's arguments and the shared options are the skeleton's
    (:class:`~sb3_grpo.common.on_policy.GroupOnPolicyAlgorithm`; ``gamma`` defaults to REINFORCE++'s 1;
    ``vf_coef``, ``clip_range_vf``, ``gae_lambda`` and ``normalize_advantage`` have no effect); what it supports of
    the shared options is :attr:`supports`. Its own:

    :param gamma: the discount of the returns (REINFORCE++'s 1)
    :param kl_coef: ``beta``, the weight of the token-level KL penalty in the reward (0 turns it off; 0.01, ours and
        untuned)
    :param advantage: ``"reinforce_pp"``, its own form
    """

    supports = Supports(
        advantages=(REINFORCE_PP_FORM.name,),
        reward_redistribution=(),
        advantage_note="REINFORCE++'s advantage is each token's return-to-go normalised over the batch",
    )

    def __init__(
        self,
        policy: str | type[ActorCriticPolicy],
        env: GymEnv | str,
        *args: Any,
        gamma: float = 1.0,
        kl_coef: float = 0.01,
        advantage: str = REINFORCE_PP_FORM.name,
        _init_setup_model: bool = True,
        **kwargs: Any,
    ):
        check_float("kl_coef", kl_coef, low=0, hint="0 turns the KL penalty off; e.g. kl_coef=0.01")
        super().__init__(
            policy, env, *args, gamma=gamma, advantage=advantage, _init_setup_model=_init_setup_model, **kwargs
        )
        self.kl_coef = float(kl_coef)
        if _init_setup_model:
            self._setup_model()

    @classmethod
    def _check_load_arguments(cls, args: dict[str, Any]) -> None:
        super()._check_load_arguments(args)
        if "kl_coef" in args:
            check_float("kl_coef", args["kl_coef"], low=0, hint="0 turns the KL penalty off; e.g. kl_coef=0.01")

    def _setup_model(self) -> None:
        super()._setup_model()
        self._rollout_kl = float("nan")  # the last rollout's mean KL(t), logged as train/kl_ref
        if self.env is not None:  # the tokens of an episode that straddles two rollouts teach nothing in the first
            warn_if_episodes_straddle(self.env, self.advantage, self.n_steps)

    def _kl_reference(self) -> tuple[BasePolicy | None, bool]:
        """The frozen reference of the KL penalty: a copy of the initial policy, unless the policy has its own (LoRA,
        adapters off); none with ``kl_coef=0``."""
        own_reference = hasattr(self.policy, "reference_evaluate_actions")
        return (frozen_copy(self.policy) if self.kl_coef > 0 and not own_reference else None), self.kl_coef > 0

    def _excluded_save_params(self) -> list[str]:
        return [*super()._excluded_save_params(), "_rollout_kl"]

    def _rollout_group_tracker(self, env: VecEnv) -> EpisodeGroupTracker | None:
        """The returns' tracker, kept across rollouts, with the KL penalty of each rollout and the batch of every
        rank."""
        if self._group_tracker is None or self._group_tracker.n_envs != env.num_envs:
            penalty = self._kl_penalty if self.kl_coef > 0 else None
            self._group_tracker = TokenReturnTracker(env.num_envs, self.gamma, penalty, self._data_parallel.mean)
        return self._group_tracker

    def _kl_penalty(self) -> np.ndarray:
        """``kl_coef * KL(t)`` at every token of the rollout just collected (the tracker subtracts it)."""
        kl = rollout_kl(self.batch_source, self.rollout_buffer)
        self._rollout_kl = float(kl.mean())
        return self.kl_coef * kl

    def _policy_loss(
        self, minibatch: Minibatch, log_prob: th.Tensor, clip_range: float, stats: TrainStats
    ) -> th.Tensor:
        """PPO's clipped surrogate, averaged over the tokens (see the class)."""
        ratio = th.exp(log_prob - minibatch.old_log_prob)
        surrogate = clipped_surrogate(ratio, minibatch.advantages, clip_range)
        stats.add_clip_fractions(ratio, clip_range, minibatch.advantages)
        # a micro-batch's mean weighted by its share of the minibatch's tokens
        return -surrogate.mean() * (1.0 if minibatch.share is None else minibatch.share.fraction)

    def _after_update(self, stats: TrainStats) -> None:
        if self.kl_coef > 0:  # the KL of the rollout the update trained on, in the reward (train/kl_ref)
            stats.kl_refs.append(self._rollout_kl)

    def _record_own(self, logger: Logger, clip_range: float) -> None:
        del clip_range  # PPO's key, logged by the skeleton
        if self.kl_coef > 0:
            logger.record("train/kl_coef", self.kl_coef)
