"""
GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization", arXiv 2507.18071): the importance ratio, its clip and
the objective taken per sequence instead of per token.

A completion's reward is one number; GSPO argues that a token-level ratio ``pi(y_t) / pi_old(y_t)`` is a noisy
importance weight for it, which accumulates over long completions. It uses the length-normalised sequence ratio
``s_i = (pi(y_i|x) / pi_old(y_i|x)) ** (1 / |y_i|)`` (:func:`~sb3_grpo.objectives.sequence_ratio`), clips it per
sequence to ``[1 - eps_low, 1 + eps_high]`` with the paper's ``3e-4`` and ``4e-4`` (section 5.1), and averages the
clipped surrogate over the sequences (:func:`~sb3_grpo.objectives.gspo_objective`).

No critic, no KL term; the skeleton is :class:`~sb3_grpo.common.on_policy.GroupOnPolicyAlgorithm`.
"""

from __future__ import annotations

from typing import Any

import torch as th
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.logger import Logger
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.common.type_aliases import GymEnv, Schedule

from sb3_grpo.common.advantages.forms import advantage_form
from sb3_grpo.common.on_policy import GroupOnPolicyAlgorithm
from sb3_grpo.common.options.checks import CRITIC_FREE_ADVANTAGES, check_grpo_args
from sb3_grpo.common.type_aliases import Minibatch, sequence_index
from sb3_grpo.common.update.train_stats import LossTerms, TrainStats
from sb3_grpo.dapo.dapo import decoupled_eps
from sb3_grpo.objectives import gspo_objective, gspo_token_objective, sequence_mean, sequence_ratio
from textrl_envs.validation import check_float

__all__ = ["GSPO"]


class GSPO(GroupOnPolicyAlgorithm):
    """
    GSPO: PPO's clipped surrogate on whole sequences, with the length-normalised sequence ratio, no critic.

    The loss of a minibatch of ``S`` sequences ``i`` (an episode's steps in the rollout) and tokens ``t``::

        s_i = exp((1 / |y_i|) * sum_{t in i} (log pi(a_t|s_t) - log pi_old(a_t|s_t)))
        L = -(1 / S) * sum_i min(s_i * A_i, clip(s_i, 1 - eps_low, 1 + eps_high) * A_i)  -  ent_coef * mean_t H_t

    with ``A_i`` the group advantage of sequence ``i``'s episode. With ``advantage="group_turn"`` (an advantage per
    turn of an interactive episode) the loss is GSPO-token's (section 4.3,
    :func:`~sb3_grpo.objectives.gspo_token_objective`): each token's surrogate uses its own turn's advantage and the
    ratio ``sg[s_i] * pi(a_t) / sg[pi(a_t)]`` (the value of ``s_i``), averaged within the sequence and then over
    sequences; with one advantage per sequence the two are the same. On the text fast path a minibatch holds whole
    sequences, so ``|y_i|`` is every token of the episode in the rollout; on the per-transition path it holds sampled
    steps, so ``s_i`` is the geometric mean of the ratios of the steps of ``i`` that the minibatch drew (with one
    minibatch of the whole rollout the two paths are the same, tested). It needs an env with groups.

    PPO's arguments mean what they mean for SB3's ``PPO``; ``clip_range`` (and its schedule) is ``eps_low`` unless
    ``clip_range_low`` is given, and defaults to the paper's ``3e-4``. ``vf_coef``, ``clip_range_vf`` and
    ``normalize_advantage`` have no effect. ``train/clip_fraction`` is the share of *sequences* whose ratio was
    clipped (the paper reports token shares: each token of a clipped sequence counts).

    :param clip_range_low: ``eps_low`` (``None``: ``clip_range``'s value)
    :param clip_range_high: ``eps_high`` (the paper's ``4e-4``)
    :param advantage: ``"group"`` (the paper's, the default), ``"group_mean"``, ``"rloo"``, ``"self_critical"``,
        ``"group_turn"`` (interactive envs: per-turn credit, with GSPO-token's loss) or ``"role"`` (two-player games:
        a running baseline per game and role)
    :param grad_norm_warn: warn (once per model) when the gradient norm before clipping exceeds this (None: never)
    :param nonfinite: ``"raise"`` or ``"skip"``: what to do with NaN/inf rewards, advantages, losses and gradients
    :param carry_over: train the steps of an episode whose group has not finished when the rollout ends in the first
        update after it has (:mod:`sb3_grpo.common.advantages.carry_over`; the text fast path); ``"auto"`` (the
        default): on where it applies, as :class:`~sb3_grpo.GRPO`'s
    :param engine: who computes a text rollout's tokens (:mod:`sb3_grpo.engines.turn_queues`): ``"step"`` (default,
        SB3's loop), ``"hf"`` (the policy's built-in decoder) or ``"vllm"`` (the vLLM extra); see
        :class:`~sb3_grpo.GRPO`
    """

    # Over 80 lines: PPO's signature plus GSPO's own arguments, kept in SB3's form
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
        clip_range: float | Schedule = 3e-4,
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
        clip_range_high: float = 4e-4,
        advantage: str = "group",
        grad_norm_warn: float | None = 1000.0,
        nonfinite: str = "raise",
        carry_over: bool | str = "auto",
        engine: str = "step",
    ):
        check_grpo_args(locals())  # PPO's arguments and the shared ones, before any model is built
        if advantage not in CRITIC_FREE_ADVANTAGES:
            raise ValueError(
                f"GSPO trains no critic, so its advantage is a group or role form: "
                f"one of {CRITIC_FREE_ADVANTAGES}, got "
                f"{advantage!r}; use GRPO(advantage='gae') or SB3's PPO for GAE"
            )
        if clip_range_low is not None:
            check_float("clip_range_low", clip_range_low, low=0, low_open=True, example=3e-4)
        check_float("clip_range_high", clip_range_high, low=0, low_open=True, example=4e-4)
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

    def _clip_bounds(self, clip_range: float) -> tuple[float, float]:
        """``(eps_low, eps_high)`` of this update (``eps_low`` follows ``clip_range`` unless given)."""
        return (clip_range if self.clip_range_low is None else self.clip_range_low), self.clip_range_high

    def _minibatch_loss(
        self,
        minibatch: Minibatch,
        clip_range: float,
        clip_range_vf: float | None,
        stats: TrainStats,
        measure_kl: bool = True,
    ) -> LossTerms:
        """GSPO's loss of one minibatch (see the class), with its statistics recorded in ``stats``.

        :param minibatch: The minibatch, with its sequences (``Minibatch.sequence_ids``).
        :param clip_range: The update's ``clip_range`` (``eps_low`` unless ``clip_range_low`` is given).
        :param clip_range_vf: Unused (no critic).
        :param stats: Where the per-minibatch figures go.
        :param measure_kl: Compute ``approx_kl`` (PPO's early-stopping estimate, per token).
        """
        del clip_range_vf  # no critic
        if minibatch.sequence_ids is None:
            raise ValueError(
                "GSPO's ratio is per sequence, and this rollout buffer does not say which sequence a step belongs to; "
                "use rollout_buffer_class=None (the default), or a subclass of "
                "sb3_grpo.common.buffers.PolicyLogProbMixin"
            )
        _, log_prob, entropy = self.batch_source.evaluate(minibatch)
        low, high = self._clip_bounds(clip_range)
        index, n_sequences = sequence_index(minibatch.sequence_ids)
        # s_i: the geometric mean of the sequence's token ratios (GSPO, eq. 7); A_i: its episode's advantage
        ratio = sequence_ratio(log_prob, minibatch.old_log_prob, index, n_sequences)
        advantages = sequence_mean(minibatch.advantages, index, n_sequences)
        if advantage_form(self.advantage).per_token:  # an advantage per turn: GSPO-token (section 4.3)
            policy_loss = -gspo_token_objective(
                log_prob, minibatch.old_log_prob, minibatch.advantages, index, n_sequences, low, high
            )
        else:
            policy_loss = -gspo_objective(ratio, advantages, low, high)
        stats.pg_losses.append(policy_loss.item())
        stats.add_clip_fractions(ratio, decoupled_eps(ratio.detach(), low, high), advantages)
        entropy_loss = -th.mean(-log_prob) if entropy is None else -th.mean(entropy)
        stats.entropy_losses.append(entropy_loss.item())
        loss = policy_loss + self._current_ent_coef * entropy_loss

        approx_kl_div = stats.add_approx_kl(log_prob, minibatch.old_log_prob) if measure_kl else None
        stats.last_loss = loss.item()
        return LossTerms(loss, approx_kl_div, {"pg_loss": stats.pg_losses[-1]}, stats.last_loss)

    def _record_own(self, logger: Logger, clip_range: float) -> None:
        low, high = self._clip_bounds(clip_range)
        logger.record("train/clip_range_low", low)
        logger.record("train/clip_range_high", high)
