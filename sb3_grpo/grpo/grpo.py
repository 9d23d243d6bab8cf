"""
GRPO: PPO with a gradient-variance penalty, an adaptive asymmetric clip and uniform-mixture exploration,
plus group-relative advantages (DeepSeekMath's GRPO, RLOO, self-critical) and KL to a frozen reference.

The PPO skeleton (rollout, epochs, optimizer step, save/load) is the package's
:class:`~sb3_grpo.common.on_policy.GroupOnPolicyAlgorithm`; this module holds what is GRPO's own: its arguments
(:class:`~sb3_grpo.grpo.extras.GRPOExtras`), and the loss of a minibatch written out in one method
(:meth:`GRPO._minibatch_loss`, in the order of SB3's ``PPO.train``). The pieces it calls are the pure functions of
:mod:`sb3_grpo.objectives`, the penalty's state (:mod:`.penalty`), the KL term (:mod:`.kl`) and the exploration
schedule (:mod:`.exploration`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch as th
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.logger import Logger
from stable_baselines3.common.policies import ActorCriticPolicy, BasePolicy
from stable_baselines3.common.type_aliases import GymEnv
from torch.nn import functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from sb3_grpo.common.advantages.forms import BUILT_IN_FORMS, advantage_form
from sb3_grpo.common.on_policy import GroupOnPolicyAlgorithm
from sb3_grpo.common.options.support import Supports
from sb3_grpo.common.type_aliases import Minibatch
from sb3_grpo.common.update.train_stats import LossTerms, TrainStats
from sb3_grpo.grpo.arguments import (
    GRPO_CHECKS,
    check_buffer_for_kl,
    check_grpo_args,
    warn_if_exploration_clips,
    warn_if_slices_exceed_batch,
)
from sb3_grpo.grpo.exploration import explore_alpha_at
from sb3_grpo.grpo.extras import GRPOExtras
from sb3_grpo.grpo.kl import adapt_kl_coef, frozen_copy, kl_to_reference
from sb3_grpo.grpo.penalty import GradVarPenalty, select_parameters, slice_sizes
from sb3_grpo.objectives import adaptive_clip_range, clipped_surrogate, uniform_log_prob

__all__ = ["GRPO"]


class GRPO(GroupOnPolicyAlgorithm):
    """
    GRPO: gradient-regularized PPO with adaptive clipping, mixed exploration and group advantages.

    A drop-in for SB3's :class:`~stable_baselines3.PPO` (same arguments, defaults, logging, save/load) with these
    additions, each with its formula in :mod:`sb3_grpo.objectives`:

    - **Gradient-variance penalty** (``grad_var_coef = beta``): minimize ``pg_loss + beta * Var``, the variance of the
      clipped surrogate's gradients over ``K = grad_var_slices`` slices of the minibatch, differentiated by double
      backprop (:mod:`sb3_grpo.grpo.penalty`). For LMs restrict ``grad_var_params`` to a few layers.
    - **Adaptive clip** (``adaptive_clip = (s_pos, s_neg)``): the clip range ``eps * s_pos`` where the advantage is
      positive, ``eps * s_neg`` otherwise.
    - **Mixed exploration** (``explore_alpha``, ``explore_fraction``): act with ``(1 - alpha) * pi + alpha *
      uniform``, ``alpha`` decaying linearly to 0; the ratio divides by the mixture's density
      (:mod:`sb3_grpo.grpo.exploration`).
    - **KL to a reference** (``kl_coef``, ``kl_target``): the k3 estimate to a frozen copy of the initial policy (or a
      LoRA policy with its adapters off), importance-weighted under exploration, with Ziegler et al.'s controller
      when ``kl_target`` is set (:mod:`sb3_grpo.grpo.kl`).
    - **Advantage forms** (``advantage``): PPO's GAE, or a form without a critic, DeepSeekMath's ``"group"`` and the
      others of :mod:`sb3_grpo.common.advantages.forms`.

    With ``grad_var_coef=0, adaptive_clip=None, explore_alpha=0, advantage="gae", kl_coef=0``
    (:data:`~sb3_grpo.grpo.extras.EXTRAS_OFF`) every operation and every random draw is the one SB3's ``PPO``
    performs: the parameters after ``learn()`` are PPO's, bit for bit (tested).

    PPO's arguments mean what they mean for SB3's ``PPO``, and the shared options (``advantage``, ``nonfinite``,
    ``carry_over``, ``micro_batch_size``, ``data_parallel``, ``engine``, ...) are the skeleton's
    (:class:`~sb3_grpo.common.on_policy.GroupOnPolicyAlgorithm`); GRPO supports every value of each. Its own:

    :param grad_var_coef: ``beta >= 0``, weight of the gradient-variance penalty (0 turns it off)
    :param grad_var_slices: ``K >= 2``, number of minibatch slices the variance is measured over
    :param grad_var_params: ``None`` (all trainable parameters) or a list of parameter-name prefixes
        (``policy.named_parameters()``), e.g. ``["action_net", "mlp_extractor.policy_net"]``
    :param grad_var_normalize: penalize ``Var / sg(mean_k ||g_k||^2)`` (scale-free, in [0, 1]) instead of ``Var``
    :param adaptive_clip: ``(scale for A > 0, scale for A <= 0)``, both positive; ``None`` turns it off
    :param explore_alpha: initial uniform-mixture weight in ``[0, 1]`` (0 turns it off)
    :param explore_fraction: fraction of ``total_timesteps`` over which ``alpha`` decays to 0, in ``(0, 1]``
    :param kl_coef: weight of the k3 KL to the frozen reference policy (0 turns it off)
    :param kl_target: target KL for the adaptive controller of ``kl_coef`` (None: fixed ``kl_coef``)
    """

    supports = Supports(advantages=BUILT_IN_FORMS)

    def __init__(
        self,
        policy: str | type[ActorCriticPolicy],
        env: GymEnv | str,
        *args: Any,
        grad_var_coef: float = 0.01,
        grad_var_slices: int = 4,
        grad_var_params: list[str] | None = None,
        grad_var_normalize: bool = False,
        adaptive_clip: tuple[float, float] | None = (1.1, 0.9),
        explore_alpha: float = 0.05,
        explore_fraction: float = 0.5,
        kl_coef: float = 0.0,
        kl_target: float | None = None,
        _init_setup_model: bool = True,
        **kwargs: Any,
    ):
        # GRPO's own arguments first (with micro_batch_size, which the penalty excludes), then the skeleton checks
        # PPO's and the shared ones, all before any model is built
        adaptive_clip = check_grpo_args({**locals(), "micro_batch_size": kwargs.get("micro_batch_size")})
        super().__init__(policy, env, *args, _init_setup_model=_init_setup_model, **kwargs)
        warn_if_slices_exceed_batch(grad_var_coef, grad_var_slices, self.batch_size)
        self.grad_var_coef = float(grad_var_coef)
        self.grad_var_slices = int(grad_var_slices)
        self.grad_var_params = list(grad_var_params) if grad_var_params is not None else None
        self.grad_var_normalize = bool(grad_var_normalize)
        self.adaptive_clip = adaptive_clip
        self.explore_alpha = float(explore_alpha)
        self.explore_fraction = float(explore_fraction)
        self.kl_coef = float(kl_coef)
        self.kl_target = kl_target

        if self.explore_alpha > 0 and self.env is not None:
            # raises a clear ValueError for unbounded Box or unsupported action spaces
            uniform_log_prob(self.action_space)
        warn_if_exploration_clips(self.explore_alpha, self.clip_range, self.adaptive_clip)

        if _init_setup_model:
            self._setup_model()

    @classmethod
    def check_arguments(cls, args: Mapping[str, Any]) -> None:
        """The skeleton's checks (:meth:`~sb3_grpo.common.on_policy.GroupOnPolicyAlgorithm.check_arguments`) and
        GRPO's own (:func:`~sb3_grpo.grpo.arguments.check_grpo_args`)."""
        check_grpo_args(args)
        super().check_arguments(args)

    @classmethod
    def _check_load_arguments(cls, args: dict[str, Any]) -> None:
        super()._check_load_arguments(args)
        for name, value in args.items():
            if name in GRPO_CHECKS:
                GRPO_CHECKS[name](name, value)

    @property
    def extras(self) -> GRPOExtras:
        """GRPO's mechanisms as they are set now (:class:`~sb3_grpo.grpo.extras.GRPOExtras`); with
        :data:`~sb3_grpo.grpo.extras.EXTRAS_OFF`'s settings ``GRPO`` computes what SB3's ``PPO`` does."""
        return GRPOExtras(**{name: getattr(self, name) for name in GRPOExtras.names()})

    # ------------------------------------------------------------------------------------------------------
    # Setup
    # ------------------------------------------------------------------------------------------------------
    def _check_buffer_class(self, buffer_class: type[RolloutBuffer]) -> None:
        super()._check_buffer_class(buffer_class)
        check_buffer_for_kl(buffer_class, self.kl_coef, self.explore_alpha)

    def _kl_reference(self) -> tuple[BasePolicy | None, bool]:
        """The KL reference: a frozen copy of the initial policy, unless the policy has its own (LoRA, adapters off)."""
        own_reference = hasattr(self.policy, "reference_evaluate_actions")
        return (frozen_copy(self.policy) if self.kl_coef > 0 and not own_reference else None), self.kl_coef > 0

    def _setup_model(self) -> None:
        super()._setup_model()
        if self.adaptive_clip is not None:  # saved as a JSON list
            self.adaptive_clip = (float(self.adaptive_clip[0]), float(self.adaptive_clip[1]))
        if self.grad_var_coef > 0 and getattr(self.policy, "gradient_checkpointing", False):
            raise ValueError(
                f"grad_var_coef={self.grad_var_coef:g} with policy_kwargs={{'gradient_checkpointing': True}}: the "
                "gradient-variance penalty differentiates the gradients themselves (a double backward), which "
                "torch.utils.checkpoint cannot do; pass grad_var_coef=0 to keep gradient checkpointing, or drop "
                "gradient_checkpointing to keep the penalty"
            )
        params = select_parameters(self.policy, self.grad_var_params) if self.grad_var_coef > 0 else []
        self._grad_var = GradVarPenalty(params, normalize=self.grad_var_normalize)

    def _excluded_save_params(self) -> list[str]:
        return [*super()._excluded_save_params(), "_grad_var"]

    # ------------------------------------------------------------------------------------------------------
    # Rollout
    # ------------------------------------------------------------------------------------------------------
    def current_explore_alpha(self) -> float:
        """The exploration mixture's weight now (:func:`~sb3_grpo.grpo.exploration.explore_alpha_at`)."""
        return explore_alpha_at(self.explore_alpha, self.explore_fraction, self._current_progress_remaining)

    def _rollout_alpha(self, progress_remaining: float) -> float:
        return explore_alpha_at(self.explore_alpha, self.explore_fraction, progress_remaining)

    def _computes_as_ppo(self) -> bool:
        return self.extras.computes_as_ppo

    # ------------------------------------------------------------------------------------------------------
    # Update
    # ------------------------------------------------------------------------------------------------------
    def _normalized_advantages(self, advantages: th.Tensor) -> th.Tensor:
        """PPO's per-minibatch advantage normalisation (GAE only: group advantages are already normalized, and the
        steps that have no complete group must keep advantage 0)."""
        # Normalization does not make sense if mini batchsize == 1, see GH issue #325
        if self.normalize_advantage and advantage_form(self.advantage).critic and len(advantages) > 1:
            advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        return advantages

    def _prepare_minibatch(self, minibatch: Minibatch) -> Minibatch:
        """The whole minibatch's advantages normalised once, before it is split into micro-batches."""
        if self.grad_var_coef > 0:  # set after construction: the same refusal as the constructor's
            check_grpo_args({"micro_batch_size": self.micro_batch_size, "grad_var_coef": self.grad_var_coef})
        return minibatch._replace(advantages=self._normalized_advantages(minibatch.advantages))

    def _minibatch_loss(
        self,
        minibatch: Minibatch,
        clip_range: float,
        clip_range_vf: float | None,
        stats: TrainStats,
        measure_kl: bool = True,
    ) -> LossTerms:
        """PPO's loss of one minibatch (SB3's ``PPO.train``, CleanRL's names) plus GRPO's terms: the adaptive clip,
        ``grad_var_coef * Var`` and ``kl_coef * KL``; its statistics recorded in ``stats``.

        :param minibatch: The minibatch.
        :param clip_range: The update's ``eps``.
        :param clip_range_vf: The update's value clip range (``None``: no value clipping).
        :param stats: Where the per-minibatch figures go.
        :param measure_kl: Compute ``approx_kl`` (PPO's early-stopping estimate). Without ``target_kl`` only the last
            epoch's are logged, so the other epochs skip it (``LossTerms.approx_kl`` is then ``None``).
        """
        n_slices = min(self.grad_var_slices, len(minibatch.actions))
        use_grad_var = self.grad_var_coef > 0 and n_slices >= 2
        use_critic = advantage_form(self.advantage).critic
        values, log_prob, entropy, slice_log_probs = evaluate_minibatch(
            self.batch_source, minibatch, n_slices if use_grad_var else 0
        )
        # Normalize advantage (GAE only: group advantages are already normalized, and the steps
        # that have no complete group must keep advantage 0)
        advantages = minibatch.advantages
        share = minibatch.share  # None: the whole minibatch; a micro-batch's advantages are normalised already
        if share is None:
            advantages = self._normalized_advantages(advantages)

        # Per-sample clip range: eps (PPO) or eps * scale(sign A) (adaptive clip)
        eps = (
            clip_range
            if self.adaptive_clip is None
            else adaptive_clip_range(advantages, clip_range, self.adaptive_clip)
        )

        # ratio between old and new policy, should be one at the first iteration
        # (not with mixed exploration: the old log-prob is the mixture's)
        ratio = th.exp(log_prob - minibatch.old_log_prob)
        # clipped surrogate loss
        surrogate = clipped_surrogate(ratio, advantages, eps)
        policy_loss = -surrogate.mean()
        # a micro-batch's share of the minibatch's means: its mean weighted by its share of the transitions
        shared = (lambda term: term) if share is None else (lambda term: term * share.fraction)
        policy_loss = shared(policy_loss)

        stats.pg_losses.append(policy_loss.item())
        stats.add_clip_fractions(ratio, eps, advantages)

        # Entropy loss favor exploration (approximated when there is no analytical form)
        entropy_loss = shared(-th.mean(-log_prob) if entropy is None else -th.mean(entropy))
        stats.entropy_losses.append(entropy_loss.item())
        if use_critic:
            if clip_range_vf is None:
                values_pred = values  # No clipping
            else:
                # Clip the difference between old and new value; NOTE: this depends on the reward scaling
                values_pred = minibatch.old_values + th.clamp(
                    values - minibatch.old_values, -clip_range_vf, clip_range_vf
                )
            # Value loss using the TD(gae_lambda) target
            value_loss = shared(F.mse_loss(minibatch.returns, values_pred))
            stats.value_losses.append(value_loss.item())
            loss = policy_loss + self._current_ent_coef * entropy_loss + self.vf_coef * value_loss
        else:
            # group forms: no critic (DeepSeekMath GRPO), the value head is not trained
            loss = policy_loss + self._current_ent_coef * entropy_loss
        details = {"pg_loss": stats.pg_losses[-1]}

        if use_grad_var:
            # Var[grad L_CLIP] over K contiguous slices of the (randomly permuted) minibatch, each slice's objective
            # from its own forward only (the same figures as slices of `surrogate`, but none of their graphs goes
            # through the other slices); its gradient comes from double backprop when loss.backward() runs
            objectives = slice_objectives(slice_log_probs, minibatch.old_log_prob, advantages, eps)
            grad_var = self._grad_var(objectives, separate_graphs=self.batch_source.separate_slices)
            stats.grad_vars.append(grad_var.item())
            details["grad_var"] = stats.grad_vars[-1]
            loss = loss + self.grad_var_coef * grad_var
        if self.kl_coef > 0:
            # (1/N) sum w * k3 with w = pi_old / mu: the KL of the policy's own samples, from the
            # mixture's (exactly the plain k3 mean when alpha = 0); the log and the controller use it too
            buffer_name = type(self.rollout_buffer).__name__
            kl_ref = shared(
                kl_to_reference(self.batch_source, minibatch, log_prob, self._rollout_explore_alpha, buffer_name)
            )
            stats.kl_refs.append(kl_ref.item())
            details["kl_ref"] = stats.kl_refs[-1]
            loss = loss + self.kl_coef * kl_ref

        # Calculate approximate form of reverse KL Divergence for early stopping (as SB3's PPO)
        approx_kl_div = stats.add_approx_kl(log_prob, minibatch.old_log_prob) if measure_kl else None
        stats.last_loss = loss.item()
        return LossTerms(loss, approx_kl_div, details, stats.last_loss)

    def _after_update(self, stats: TrainStats) -> None:
        if self.kl_coef > 0 and self.kl_target is not None:
            # Adaptive KL controller (Ziegler et al. 2019, arXiv 1909.08593, section 2.2), the same on every rank
            kl_mean = self._data_parallel.mean(float(np.sum(stats.kl_refs)), len(stats.kl_refs))
            self.kl_coef = adapt_kl_coef(self.kl_coef, kl_mean, self.kl_target)

    def _record_own(self, logger: Logger, clip_range: float) -> None:
        scale_pos, scale_neg = self.adaptive_clip if self.adaptive_clip is not None else (1.0, 1.0)
        logger.record("train/clip_range_pos", clip_range * scale_pos)
        logger.record("train/clip_range_neg", clip_range * scale_neg)
        logger.record("train/explore_alpha", self._rollout_explore_alpha)
        if self.kl_coef > 0:
            logger.record("train/kl_coef", self.kl_coef)


def evaluate_minibatch(
    batch_source: Any, minibatch: Minibatch, n_slices: int
) -> tuple[th.Tensor, th.Tensor, th.Tensor | None, list[th.Tensor]]:
    """The policy's ``(values, log_prob, entropy)`` on the minibatch, in one forward, or (``n_slices >= 2``: the
    gradient-variance penalty) one forward per slice, with the slices' log-probs (else ``[]``).

    :param batch_source: The update path (:mod:`sb3_grpo.common.update.batch_sources`) that evaluates the minibatch.
    :param minibatch: The minibatch.
    :param n_slices: The penalty's slices (below 2: one forward, no slices).
    """
    if n_slices >= 2:
        # each slice in its own forward (large policies), so that each slice gradient walks its own graph; the
        # fused attention kernels (flash / memory-efficient) have no double backward: record attention with the
        # math kernel so that Var can be differentiated (no-op for MLPs)
        sizes = slice_sizes(len(minibatch.actions), n_slices)
        with sdpa_kernel(SDPBackend.MATH):
            parts = batch_source.evaluate_slices(minibatch, sizes)
        values, log_prob = th.cat([p[0] for p in parts]), th.cat([p[1] for p in parts])
        entropy = None if any(p[2] is None for p in parts) else th.cat([p[2] for p in parts])
        return values, log_prob, entropy, [p[1] for p in parts]
    values, log_prob, entropy = batch_source.evaluate(minibatch)
    return values, log_prob, entropy, []


def slice_objectives(
    log_probs: list[th.Tensor], old_log_prob: th.Tensor, advantages: th.Tensor, eps: float | th.Tensor
) -> list[th.Tensor]:
    """``L_k = -mean(clipped surrogate)`` of each slice, from that slice's log-probs only.

    :param log_probs: The slices' ``log pi(a|s)`` (with gradient), consecutive.
    :param old_log_prob: The whole minibatch's old log-probs.
    :param advantages: The whole minibatch's (normalized) advantages.
    :param eps: The clip range, a float or per sample.
    """
    objectives, lo = [], 0
    for part in log_probs:
        hi = lo + len(part)
        part_eps = eps[lo:hi] if isinstance(eps, th.Tensor) else eps
        ratio = th.exp(part - old_log_prob[lo:hi])
        objectives.append(-clipped_surrogate(ratio, advantages[lo:hi], part_eps).mean())
        lo = hi
    return objectives
