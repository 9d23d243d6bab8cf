"""
Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training: A Critical Perspective", arXiv 2503.20783): GRPO
without its two normalisations that bias the update.

- The advantage is the group-mean baseline alone, ``A_i = r_i - mean_g r`` (``advantage="group_mean"``,
  :func:`~sb3_grpo.objectives.group_mean_advantages`): no division by the group's standard deviation, which weighs
  prompts whose completions barely differ (too easy, too hard) more.
- The clipped surrogate is summed over the minibatch's tokens and divided by a constant, ``S * L`` (``S`` sequences
  in the minibatch, ``L = max_completion_tokens``, :func:`~sb3_grpo.objectives.constant_normalized_sum`), instead of
  averaged per sequence, whose ``1 / |o_i|`` penalises a long wrong completion less per token than a short one.

Everything else is PPO's clipped objective on the package's shared skeleton
(:class:`~sb3_grpo.common.on_policy.GroupOnPolicyAlgorithm`): no critic, no value loss, no KL term, PPO's symmetric
clip; group advantages, ``carry_over``, background rewards and both update paths as for :class:`~sb3_grpo.GRPO`.
"""

from __future__ import annotations

from typing import Any

import torch as th
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.common.type_aliases import GymEnv

from sb3_grpo.common.advantages.forms import CRITIC_FREE_FORMS
from sb3_grpo.common.advantages.group_trackers import env_episode_limit
from sb3_grpo.common.critic_free import CriticFreeAlgorithm
from sb3_grpo.common.options.support import Supports
from sb3_grpo.common.type_aliases import Minibatch, sequence_index
from sb3_grpo.common.update.train_stats import TrainStats
from sb3_grpo.objectives import clipped_surrogate, constant_normalized_sum
from textrl_envs.validation import check_int

__all__ = ["DrGRPO"]


class DrGRPO(CriticFreeAlgorithm):
    """
    Dr. GRPO: PPO's clipped surrogate with group-mean advantages and a constant length normaliser, no critic.

    The loss of a minibatch of ``S`` sequences (an episode's steps in the rollout; whole sequences on the text fast
    path, their sampled steps on the per-transition path) and tokens ``t``::

        L = -(1 / (S * L_max)) * sum_t min(r_t * A_t, clip(r_t, 1 - eps, 1 + eps) * A_t)  -  ent_coef * mean_t H_t

    with ``r_t = pi(a_t|s_t) / pi_old(a_t|s_t)`` and ``A_t`` the advantage of ``t``'s episode. It needs an env with
    groups (``group_size > 1``, e.g. ``textrl_envs.sb3.make_vec_env("TextGen-v0", n_envs=8, group_size=4)``). With
    micro-batches ``S`` stays the whole minibatch's sequence count, so the update equals the unsplit one.

    PPO's arguments and the shared options are the skeleton's
    (:class:`~sb3_grpo.common.on_policy.GroupOnPolicyAlgorithm`; ``vf_coef``, ``clip_range_vf`` and
    ``normalize_advantage`` have no effect: there is no critic); what it supports of the shared options is
    :attr:`supports`. Its own:

    :param advantage: ``"group_mean"`` (Dr. GRPO's, the default), or another form without a critic
    :param max_completion_tokens: ``L_max``, the constant normaliser; ``None``: the env's episode budget (a text env's
        ``max_new_tokens``, an interactive env's agent steps)
    """

    supports = Supports(advantages=CRITIC_FREE_FORMS, reward_redistribution=())

    def __init__(
        self,
        policy: str | type[ActorCriticPolicy],
        env: GymEnv | str,
        *args: Any,
        advantage: str = "group_mean",
        max_completion_tokens: int | None = None,
        _init_setup_model: bool = True,
        **kwargs: Any,
    ):
        if max_completion_tokens is not None:
            check_int("max_completion_tokens", max_completion_tokens, low=1, example=64)
        super().__init__(policy, env, *args, advantage=advantage, _init_setup_model=_init_setup_model, **kwargs)
        if max_completion_tokens is None and self.env is not None:
            max_completion_tokens = env_episode_limit(self.env)
        if max_completion_tokens is None and self.env is not None:
            raise ValueError(
                "DrGRPO divides the summed surrogate by S * max_completion_tokens, and this env does not say how long "
                "its episodes may be; pass max_completion_tokens= (e.g. the completion budget, max_new_tokens)"
            )
        self.max_completion_tokens = max_completion_tokens
        if _init_setup_model:
            self._setup_model()

    def _policy_loss(
        self, minibatch: Minibatch, log_prob: th.Tensor, clip_range: float, stats: TrainStats
    ) -> th.Tensor:
        """Dr. GRPO's policy term (see the class)."""
        if minibatch.sequence_ids is None:
            raise ValueError(
                "DrGRPO normalises by the minibatch's sequences, and this rollout buffer does not give them; use "
                "rollout_buffer_class=None (the default), or a subclass of sb3_grpo.common.buffers.PolicyLogProbMixin"
            )
        advantages = minibatch.advantages
        ratio = th.exp(log_prob - minibatch.old_log_prob)
        surrogate = clipped_surrogate(ratio, advantages, clip_range)
        share = minibatch.share  # a micro-batch: S is the whole minibatch's, its sum is its share of the whole's
        n_sequences = sequence_index(minibatch.sequence_ids)[1] if share is None else share.n_sequences
        stats.add_clip_fractions(ratio, clip_range, advantages)
        return -constant_normalized_sum(surrogate, n_sequences, self.max_completion_tokens)
