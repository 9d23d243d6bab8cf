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
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.common.type_aliases import GymEnv, Schedule

from sb3_grpo.common.advantages.group_trackers import env_episode_limit
from sb3_grpo.common.on_policy import GroupOnPolicyAlgorithm
from sb3_grpo.common.options.checks import check_grpo_args
from sb3_grpo.common.type_aliases import Minibatch, sequence_index
from sb3_grpo.common.update.train_stats import LossTerms, TrainStats
from sb3_grpo.objectives import clipped_surrogate, constant_normalized_sum
from textrl_envs.validation import check_int

__all__ = ["DrGRPO"]

#: The advantage forms Dr. GRPO takes: the group forms (it trains no critic).
DR_GRPO_ADVANTAGES = ("group_mean", "group", "rloo", "self_critical", "group_turn", "role")


class DrGRPO(GroupOnPolicyAlgorithm):
    """
    Dr. GRPO: PPO's clipped surrogate with group-mean advantages and a constant length normaliser, no critic.

    The loss of a minibatch of ``S`` sequences (an episode's steps in the rollout; whole sequences on the text fast
    path, their sampled steps on the per-transition path) and tokens ``t``::

        L = -(1 / (S * L_max)) * sum_t min(r_t * A_t, clip(r_t, 1 - eps, 1 + eps) * A_t)  -  ent_coef * mean_t H_t

    with ``r_t = pi(a_t|s_t) / pi_old(a_t|s_t)`` and ``A_t`` the advantage of ``t``'s episode. It needs an env with
    groups (``group_size > 1``, e.g. ``textrl_envs.sb3.make_vec_env("TextGen-v0", n_envs=8, group_size=4)``).

    PPO's arguments mean what they mean for SB3's ``PPO`` (``vf_coef``, ``clip_range_vf`` and
    ``normalize_advantage`` have no effect: there is no critic, and group advantages are not renormalised).

    :param advantage: ``"group_mean"`` (Dr. GRPO's, the default), or ``"group"``, ``"rloo"``, ``"self_critical"``,
        ``"group_turn"`` (interactive envs: per-turn leave-one-out credit, see :class:`~sb3_grpo.GRPO`) or ``"role"``
        (two-player games: a running baseline per game and role)
    :param max_completion_tokens: ``L_max``, the constant normaliser; ``None``: the env's episode budget (a text env's
        ``max_new_tokens``, an interactive env's agent steps)
    :param grad_norm_warn: warn (once per model) when the gradient norm before clipping exceeds this (None: never)
    :param nonfinite: ``"raise"`` or ``"skip"``: what to do with NaN/inf rewards, advantages, losses and gradients
    :param carry_over: train the steps of an episode whose group has not finished when the rollout ends in the first
        update after it has (:mod:`sb3_grpo.common.advantages.carry_over`; the text fast path); ``"auto"`` (the
        default): on where it applies, as :class:`~sb3_grpo.GRPO`'s
    :param micro_batch_size: split each minibatch's forward and backward into micro-batches of this many transitions
        (whole sequences on the text fast path), one optimizer step per minibatch; the normaliser's ``S`` stays the
        whole minibatch's sequence count, so the update equals the unsplit one to float rounding (``None``: no split)
    :param data_parallel: under ``torchrun``: ``"ddp"`` (default) or ``"fsdp"`` (see :class:`~sb3_grpo.GRPO`)
    :param engine: who computes a text rollout's tokens (:mod:`sb3_grpo.engines.turn_queues`): ``"step"`` (default,
        SB3's loop), ``"hf"`` (the policy's built-in decoder) or ``"vllm"`` (the vLLM extra); see
        :class:`~sb3_grpo.GRPO`
    """

    # Over 80 lines: PPO's signature plus Dr. GRPO's own arguments, kept in SB3's form
    def __init__(
        self,
        policy: str | type[ActorCriticPolicy],
        env: GymEnv | str,
        learning_rate: float | Schedule = 3e-4,
        n_steps: int = 2048,
        batch_size: int = 64,
        n_epochs: int = 10,
        gamma: float = 0.99,
        gae_lambda: float = 0.95,
        clip_range: float | Schedule = 0.2,
        clip_range_vf: float | Schedule | None = None,
        normalize_advantage: bool = True,
        ent_coef: float | Schedule = 0.0,
        vf_coef: float = 0.5,
        max_grad_norm: float = 0.5,
        use_sde: bool = False,
        sde_sample_freq: int = -1,
        rollout_buffer_class: type[RolloutBuffer] | None = None,
        rollout_buffer_kwargs: dict[str, Any] | None = None,
        target_kl: float | None = None,
        stats_window_size: int = 100,
        tensorboard_log: str | None = None,
        policy_kwargs: dict[str, Any] | None = None,
        verbose: int = 0,
        seed: int | None = None,
        device: th.device | str = "auto",
        _init_setup_model: bool = True,
        *,
        advantage: str = "group_mean",
        max_completion_tokens: int | None = None,
        grad_norm_warn: float | None = 1000.0,
        nonfinite: str = "raise",
        carry_over: bool | str = "auto",
        micro_batch_size: int | None = None,
        data_parallel: str = "ddp",
        engine: str = "step",
    ):
        check_grpo_args(locals())  # PPO's arguments and the shared ones, before any model is built
        if advantage not in DR_GRPO_ADVANTAGES:
            raise ValueError(
                f"DrGRPO trains no critic, so its advantage is a group or role form: one of {DR_GRPO_ADVANTAGES}, got "
                f"{advantage!r}; use GRPO(advantage='gae') or SB3's PPO for GAE"
            )
        if max_completion_tokens is not None:
            check_int("max_completion_tokens", max_completion_tokens, low=1, example=64)
        super().__init__(
            policy,
            env,
            learning_rate=learning_rate,
            n_steps=n_steps,
            batch_size=batch_size,
            n_epochs=n_epochs,
            gamma=gamma,
            gae_lambda=gae_lambda,
            clip_range=clip_range,
            clip_range_vf=clip_range_vf,
            normalize_advantage=normalize_advantage,
            ent_coef=ent_coef,
            vf_coef=vf_coef,
            max_grad_norm=max_grad_norm,
            use_sde=use_sde,
            sde_sample_freq=sde_sample_freq,
            rollout_buffer_class=rollout_buffer_class,
            rollout_buffer_kwargs=rollout_buffer_kwargs,
            target_kl=target_kl,
            stats_window_size=stats_window_size,
            tensorboard_log=tensorboard_log,
            policy_kwargs=policy_kwargs,
            verbose=verbose,
            seed=seed,
            device=device,
            _init_setup_model=_init_setup_model,
            advantage=advantage,
            grad_norm_warn=grad_norm_warn,
            nonfinite=nonfinite,
            carry_over=carry_over,
            micro_batch_size=micro_batch_size,
            data_parallel=data_parallel,
            engine=engine,
        )
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

    def _minibatch_loss(
        self,
        minibatch: Minibatch,
        clip_range: float,
        clip_range_vf: float | None,
        stats: TrainStats,
        measure_kl: bool = True,
    ) -> LossTerms:
        """Dr. GRPO's loss of one minibatch (see the class), with its statistics recorded in ``stats``.

        :param minibatch: The minibatch, with its sequences (``Minibatch.sequence_ids``).
        :param clip_range: The update's ``eps``.
        :param clip_range_vf: Unused (no critic).
        :param stats: Where the per-minibatch figures go.
        :param measure_kl: Compute ``approx_kl`` (PPO's early-stopping estimate).
        """
        del clip_range_vf  # no critic
        if minibatch.sequence_ids is None:
            raise ValueError(
                "DrGRPO normalises by the minibatch's sequences, and this rollout buffer does not give them; use "
                "rollout_buffer_class=None (the default), or a subclass of sb3_grpo.common.buffers.PolicyLogProbMixin"
            )
        _, log_prob, entropy = self.batch_source.evaluate(minibatch)
        advantages = minibatch.advantages
        ratio = th.exp(log_prob - minibatch.old_log_prob)
        surrogate = clipped_surrogate(ratio, advantages, clip_range)
        share = minibatch.share  # a micro-batch: S is the whole minibatch's, its sum is its share of the whole's
        n_sequences = sequence_index(minibatch.sequence_ids)[1] if share is None else share.n_sequences
        policy_loss = -constant_normalized_sum(surrogate, n_sequences, self.max_completion_tokens)
        stats.pg_losses.append(policy_loss.item())
        stats.add_clip_fractions(ratio, clip_range, advantages)
        entropy_loss = -th.mean(-log_prob) if entropy is None else -th.mean(entropy)
        if share is not None:  # the entropy's mean over transitions, weighted by the micro-batch's share of them
            entropy_loss = entropy_loss * share.fraction
        stats.entropy_losses.append(entropy_loss.item())
        loss = policy_loss + self._current_ent_coef * entropy_loss

        approx_kl_div = stats.add_approx_kl(log_prob, minibatch.old_log_prob) if measure_kl else None
        stats.last_loss = loss.item()
        return LossTerms(loss, approx_kl_div, {"pg_loss": stats.pg_losses[-1]}, stats.last_loss)
