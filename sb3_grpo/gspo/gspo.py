"""
GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization", arXiv 2507.18071): the importance ratio, its clip and
the objective taken per sequence instead of per token.

A completion's reward is one number; GSPO argues that a token-level ratio ``pi(y_t) / pi_old(y_t)`` is a noisy
importance weight for it, which accumulates over long completions. It uses the length-normalised sequence ratio
``s_i = (pi(y_i|x) / pi_old(y_i|x)) ** (1 / |y_i|)`` (:func:`~sb3_grpo.objectives.sequence_ratio`), clips it per
sequence to ``[1 - eps_low, 1 + eps_high]`` with the paper's ``3e-4`` and ``4e-4`` (section 5.1), and averages the
clipped surrogate over the sequences (:func:`~sb3_grpo.objectives.gspo_objective`).

No critic, no KL term; the skeleton is :class:`~sb3_grpo.common.critic_free.CriticFreeAlgorithm`.
"""

from __future__ import annotations

from typing import Any

import torch as th
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.logger import Logger
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.common.type_aliases import GymEnv, Schedule

from sb3_grpo.common.advantages.forms import CRITIC_FREE_FORMS, advantage_form
from sb3_grpo.common.buffers import SequenceRolloutBuffer
from sb3_grpo.common.critic_free import CriticFreeAlgorithm
from sb3_grpo.common.options.checks import check_clip_bounds
from sb3_grpo.common.options.support import Supports
from sb3_grpo.common.type_aliases import Minibatch, sequence_index
from sb3_grpo.common.update.train_stats import TrainStats
from sb3_grpo.objectives import decoupled_eps, gspo_objective, gspo_token_objective, sequence_mean, sequence_ratio

__all__ = ["GSPO"]


class GSPO(CriticFreeAlgorithm):
    """
    GSPO: PPO's clipped surrogate on whole sequences, with the length-normalised sequence ratio, no critic.

    The loss of a minibatch of ``S`` sequences ``i`` (an episode's steps in the rollout) and tokens ``t``::

        s_i = exp((1 / |y_i|) * sum_{t in i} (log pi(a_t|s_t) - log pi_old(a_t|s_t)))
        L = -(1 / S) * sum_i min(s_i * A_i, clip(s_i, 1 - eps_low, 1 + eps_high) * A_i)  -  ent_coef * mean_t H_t

    with ``A_i`` the group advantage of sequence ``i``'s episode. With an advantage per turn (``"group_turn"``) the
    loss is GSPO-token's (section 4.3, :func:`~sb3_grpo.objectives.gspo_token_objective`): each token's surrogate uses
    its own turn's advantage and the ratio ``sg[s_i] * pi(a_t) / sg[pi(a_t)]``. On the text fast path a minibatch
    holds whole sequences; on the per-transition path its sampled steps, so ``s_i`` is the geometric mean of the
    ratios of the steps of ``i`` that the minibatch drew. ``train/clip_fraction`` is the share of *sequences* whose
    ratio was clipped. It needs an env with groups.

    PPO's arguments and the shared options are the skeleton's
    (:class:`~sb3_grpo.common.on_policy.GroupOnPolicyAlgorithm`; ``clip_range`` and its schedule are ``eps_low`` unless
    ``clip_range_low`` is given, and default to the paper's ``3e-4``; ``vf_coef``, ``clip_range_vf`` and
    ``normalize_advantage`` have no effect); what it supports of the shared options is :attr:`supports` (micro-batches
    on the text fast path, whose micro-batches hold whole sequences). Its own:

    :param clip_range: ``eps_low`` unless ``clip_range_low`` is given (the paper's ``3e-4``), or its schedule
    :param clip_range_low: ``eps_low`` (``None``: ``clip_range``'s value)
    :param clip_range_high: ``eps_high`` (the paper's ``4e-4``)
    :param advantage: ``"group"`` (the paper's, the default), or another form without a critic
    """

    supports = Supports(advantages=CRITIC_FREE_FORMS, reward_redistribution=())

    def __init__(
        self,
        policy: str | type[ActorCriticPolicy],
        env: GymEnv | str,
        *args: Any,
        clip_range: float | Schedule = 3e-4,
        clip_range_low: float | None = None,
        clip_range_high: float = 4e-4,
        advantage: str = "group",
        _init_setup_model: bool = True,
        **kwargs: Any,
    ):
        check_clip_bounds(clip_range_low, clip_range_high, low_example=3e-4, high_example=4e-4)
        super().__init__(
            policy,
            env,
            *args,
            clip_range=clip_range,
            advantage=advantage,
            _init_setup_model=_init_setup_model,
            **kwargs,
        )
        self.clip_range_low = clip_range_low
        self.clip_range_high = clip_range_high
        if _init_setup_model:
            self._setup_model()

    def _check_buffer_class(self, buffer_class: type[RolloutBuffer]) -> None:
        super()._check_buffer_class(buffer_class)
        if self.micro_batch_size is not None and not issubclass(buffer_class, SequenceRolloutBuffer):
            raise ValueError(
                f"GSPO's ratio is per sequence, so a micro-batch must hold whole sequences, which the text fast path's "
                f"do; the rollout buffer here is {buffer_class.__name__}, whose micro-batches cut sequences. Use a "
                "CausalLMPolicy on a text env with rollout_buffer_class=None (the default), or micro_batch_size=None"
            )

    def _clip_bounds(self, clip_range: float) -> tuple[float, float]:
        """``(eps_low, eps_high)`` of this update (``eps_low`` follows ``clip_range`` unless given)."""
        return (clip_range if self.clip_range_low is None else self.clip_range_low), self.clip_range_high

    def _policy_loss(
        self, minibatch: Minibatch, log_prob: th.Tensor, clip_range: float, stats: TrainStats
    ) -> th.Tensor:
        """GSPO's policy term (see the class); ``clip_range`` is ``eps_low`` unless ``clip_range_low`` is given."""
        if minibatch.sequence_ids is None:
            raise ValueError(
                "GSPO's ratio is per sequence, and this rollout buffer does not say which sequence a step belongs to; "
                "use rollout_buffer_class=None (the default), or a subclass of "
                "sb3_grpo.common.buffers.PolicyLogProbMixin"
            )
        low, high = self._clip_bounds(clip_range)
        index, n_sequences = sequence_index(minibatch.sequence_ids)
        # s_i: the geometric mean of the sequence's token ratios (GSPO, eq. 7); A_i: its episode's advantage
        ratio = sequence_ratio(log_prob, minibatch.old_log_prob, index, n_sequences)
        advantages = sequence_mean(minibatch.advantages, index, n_sequences)
        stats.add_clip_fractions(ratio, decoupled_eps(ratio.detach(), low, high), advantages)
        if advantage_form(self.advantage).per_token:  # an advantage per turn: GSPO-token (section 4.3)
            policy_loss = -gspo_token_objective(
                log_prob, minibatch.old_log_prob, minibatch.advantages, index, n_sequences, low, high
            )
        else:
            policy_loss = -gspo_objective(ratio, advantages, low, high)
        share = minibatch.share  # a micro-batch of whole sequences: its mean over sequences weighted by its share
        return policy_loss if share is None else policy_loss * (n_sequences / share.n_sequences)

    def _record_own(self, logger: Logger, clip_range: float) -> None:
        low, high = self._clip_bounds(clip_range)
        logger.record("train/clip_range_low", low)
        logger.record("train/clip_range_high", high)
