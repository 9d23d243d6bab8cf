"""
CISPO (MiniMax 2025, "MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning Attention", arXiv 2506.13585,
section 3.1): clip the importance weight, not the update.

PPO's clip zeroes the gradient of a token whose ratio left ``[1 - eps, 1 + eps]``; the paper finds that these are
often rare tokens that matter ("However", "Recheck") and that dropping their gradient after the first update hurts.
CISPO keeps every token's gradient and only caps its importance weight, detached:
``J_t = sg(clip(r_t, 1 - eps_low, 1 + eps_high)) * A_t * log pi(a_t|s_t)``
(:func:`~sb3_grpo.objectives.cispo_objective`), averaged over the minibatch's tokens.

No critic, no KL term; the skeleton is :class:`~sb3_grpo.common.on_policy.GroupOnPolicyAlgorithm`.
"""

from __future__ import annotations

from typing import Any

import torch as th
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.logger import Logger
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.common.type_aliases import GymEnv, Schedule

from sb3_grpo.common.on_policy import GroupOnPolicyAlgorithm
from sb3_grpo.common.options.checks import CRITIC_FREE_ADVANTAGES, check_grpo_args
from sb3_grpo.common.type_aliases import Minibatch
from sb3_grpo.common.update.train_stats import LossTerms, TrainStats
from sb3_grpo.objectives import cispo_objective
from textrl_envs.validation import check_float

__all__ = ["CISPO"]


class CISPO(GroupOnPolicyAlgorithm):
    """
    CISPO: the policy gradient weighted by a clipped, detached importance ratio, every token's gradient kept; no critic.

    The loss of a minibatch of ``T`` tokens::

        w_t = sg(clip(r_t, 1 - eps_low, 1 + eps_high))
        L = -(1 / T) * sum_t w_t * A_t * log pi(a_t|s_t)  -  ent_coef * mean_t H_t

    with ``r_t = pi(a_t|s_t) / pi_old(a_t|s_t)`` and ``A_t`` the group advantage of ``t``'s episode. Its gradient is
    ``-(1 / T) sum_t w_t A_t grad log pi``: a token outside the range still moves, with its weight capped. The paper
    sets no lower bound (``clip_range_low=None``, the default) and tunes only ``eps_high``, whose value it does not
    give; the default ``0.28`` is DAPO's clip-higher bound, ours and untuned. It needs an env with groups.

    PPO's arguments mean what they mean for SB3's ``PPO``, except ``clip_range``, which has no effect (the bounds
    are ``clip_range_low`` and ``clip_range_high``), and ``vf_coef``, ``clip_range_vf`` and ``normalize_advantage``
    (no critic). ``train/clip_fraction`` is the share of tokens whose weight was capped.

    :param clip_range_low: ``eps_low``, the weight's floor is ``1 - eps_low`` (``None``: no floor, the paper's)
    :param clip_range_high: ``eps_high``, the weight's cap is ``1 + eps_high``
    :param advantage: ``"group"`` (the paper's, the default), ``"group_mean"``, ``"rloo"``, ``"self_critical"`` or
        ``"role"`` (two-player games: a running baseline per game and role)
    :param grad_norm_warn: warn (once per model) when the gradient norm before clipping exceeds this (None: never)
    :param nonfinite: ``"raise"`` or ``"skip"``: what to do with NaN/inf rewards, advantages, losses and gradients
    :param carry_over: train the steps of an episode whose group has not finished when the rollout ends in the first
        update after it has (:mod:`sb3_grpo.common.advantages.carry_over`; the text fast path); ``"auto"`` (the
        default): on where it applies, as :class:`~sb3_grpo.GRPO`'s
    :param engine: who computes a text rollout's tokens (:mod:`sb3_grpo.engines.turn_queues`): ``"step"`` (default,
        SB3's loop), ``"hf"`` (the policy's built-in decoder) or ``"vllm"`` (the vLLM extra); see
        :class:`~sb3_grpo.GRPO`
    """

    # Over 80 lines: PPO's signature plus CISPO's own arguments, kept in SB3's form
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
        clip_range_low: float | None = None,
        clip_range_high: float = 0.28,
        advantage: str = "group",
        grad_norm_warn: float | None = 1000.0,
        nonfinite: str = "raise",
        carry_over: bool | str = "auto",
        engine: str = "step",
    ):
        check_grpo_args(locals())  # PPO's arguments and the shared ones, before any model is built
        if advantage not in CRITIC_FREE_ADVANTAGES:
            raise ValueError(
                f"CISPO trains no critic, so its advantage is a group or role form: "
                f"one of {CRITIC_FREE_ADVANTAGES}, got "
                f"{advantage!r}; use GRPO(advantage='gae') or SB3's PPO for GAE"
            )
        if clip_range_low is not None:
            check_float("clip_range_low", clip_range_low, low=0, low_open=True, example=0.2)
        check_float("clip_range_high", clip_range_high, low=0, low_open=True, example=0.28)
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
            engine=engine,
        )
        self.clip_range_low = clip_range_low
        self.clip_range_high = clip_range_high
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
        """CISPO's loss of one minibatch (see the class), with its statistics recorded in ``stats``.

        :param minibatch: The minibatch.
        :param clip_range: Unused (the bounds are ``clip_range_low`` and ``clip_range_high``).
        :param clip_range_vf: Unused (no critic).
        :param stats: Where the per-minibatch figures go.
        :param measure_kl: Compute ``approx_kl`` (PPO's early-stopping estimate).
        """
        del clip_range, clip_range_vf  # CISPO's own bounds; no critic
        _, log_prob, entropy = self.batch_source.evaluate(minibatch)
        advantages = minibatch.advantages
        objective = cispo_objective(
            log_prob, minibatch.old_log_prob, advantages, self.clip_range_low, self.clip_range_high
        )
        # token-level: the sum over every token of the minibatch divided by their number (MiniMax-M1, eq. 4)
        policy_loss = -objective.mean()
        stats.pg_losses.append(policy_loss.item())
        with th.no_grad():
            ratio = th.exp(log_prob - minibatch.old_log_prob)
            low = float("inf") if self.clip_range_low is None else self.clip_range_low
            eps = th.where(ratio > 1, th.full_like(ratio, self.clip_range_high), th.full_like(ratio, low))
        stats.add_clip_fractions(ratio, eps, advantages)
        entropy_loss = -th.mean(-log_prob) if entropy is None else -th.mean(entropy)
        stats.entropy_losses.append(entropy_loss.item())
        loss = policy_loss + self._current_ent_coef * entropy_loss

        approx_kl_div = stats.add_approx_kl(log_prob, minibatch.old_log_prob) if measure_kl else None
        stats.last_loss = loss.item()
        return LossTerms(loss, approx_kl_div, {"pg_loss": stats.pg_losses[-1]}, stats.last_loss)

    def _record_own(self, logger: Logger, clip_range: float) -> None:
        del clip_range  # CISPO's bounds are its own
        logger.record("train/clip_range_low", float("nan") if self.clip_range_low is None else self.clip_range_low)
        logger.record("train/clip_range_high", self.clip_range_high)
