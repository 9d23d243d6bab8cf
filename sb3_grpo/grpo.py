"""
GRPO: PPO with a gradient-variance penalty, an adaptive asymmetric clip and uniform-mixture exploration,
plus group-relative advantages (DeepSeekMath's GRPO, RLOO, self-critical) and KL to a frozen reference.

The loss pieces live in :mod:`sb3_grpo.objectives`; this module is the stateful shell around them, an
SB3 :class:`~stable_baselines3.common.on_policy_algorithm.OnPolicyAlgorithm` that reuses SB3's buffers,
policies, schedules, logger and ``learn`` loop.
"""

from __future__ import annotations

import copy
import os
import warnings
from collections.abc import Iterator
from typing import Any, ClassVar, NamedTuple, TypeVar

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm
from stable_baselines3.common.policies import (
    ActorCriticCnnPolicy,
    ActorCriticPolicy,
    BasePolicy,
    MultiInputActorCriticPolicy,
)
from stable_baselines3.common.type_aliases import GymEnv, MaybeCallback, Schedule
from stable_baselines3.common.utils import FloatSchedule, explained_variance, obs_as_tensor
from stable_baselines3.common.vec_env import VecEnv
from torch.nn import functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from sb3_grpo import distributed
from sb3_grpo.buffers import (
    GROUPED_ENV_HINT,
    GRPO_BUFFERS,
    EpisodeGroupTracker,
    GRPODictRolloutBuffer,
    GRPORolloutBuffer,
    PolicyLogProbMixin,
    SequenceRolloutBuffer,
    SequenceSamples,
    is_text_space,
)
from sb3_grpo.objectives import (
    adaptive_clip_range,
    clip_fraction,
    clipped_surrogate,
    gradient_variance,
    group_advantages,
    kl_k3_weighted_mean,
    mixture_log_prob,
    pearson_corr,
    rloo_advantages,
    self_critical_advantages,
    uniform_log_prob,
    uniform_sample,
)

SelfGRPO = TypeVar("SelfGRPO", bound="GRPO")

ADVANTAGES = ("gae", "group", "rloo", "self_critical")
#: What GRPO does with NaN/inf rewards, advantages, losses or gradients (``nonfinite=``).
NONFINITE = ("raise", "skip")

# Ziegler et al. 2019 (arXiv 1909.08593), section 2.2: beta <- beta * (1 + K_beta * e), e clipped to +-0.2
KL_CONTROLLER_GAIN = 0.1
KL_CONTROLLER_CLIP = 0.2


class _Minibatch(NamedTuple):
    """One minibatch of the update, flat per transition, from either path.

    ``observations`` is set on the per-transition path (SB3 ``RolloutBuffer``), ``sequences`` on the text
    fast path (:class:`~sb3_grpo.buffers.SequenceRolloutBuffer`); the flat fields list the same
    transitions in the same order as the policy's outputs for them. ``old_log_prob`` is the behaviour
    distribution's (the exploration mixture's while ``alpha > 0``), ``old_policy_log_prob`` the acting
    policy's own (``None`` from a buffer that does not store it, e.g. a stock SB3 one put in by hand).
    """

    actions: th.Tensor
    old_values: th.Tensor
    old_log_prob: th.Tensor
    advantages: th.Tensor
    returns: th.Tensor
    observations: Any
    sequences: SequenceSamples | None
    old_policy_log_prob: th.Tensor | None = None


def _ignore_greedy(fn):
    """Adapt ``f(returns, group_ids)`` to the tracker's ``f(returns, group_ids, is_greedy)``."""

    def advantage_fn(returns: th.Tensor, group_ids: th.Tensor, _is_greedy: th.Tensor):
        return fn(returns, group_ids)

    return advantage_fn


def _env_group_size(env: VecEnv) -> int | None:
    """``group_size`` the VecEnv reports through ``get_attr`` (``None`` if it has none)."""
    try:
        sizes = env.get_attr("group_size")
    except (AttributeError, NotImplementedError, KeyError):
        return None
    values = {int(s) for s in sizes if s is not None}
    if len(values) != 1:
        return None
    return values.pop()


class GRPO(OnPolicyAlgorithm):
    """
    GRPO: gradient-regularized PPO with adaptive clipping, mixed exploration and group advantages.

    A drop-in for SB3's :class:`~stable_baselines3.PPO` (same arguments, defaults, logging, save/load)
    with these additions, each documented with its formula in :mod:`sb3_grpo.objectives`:

    - **Gradient-variance penalty** (``grad_var_coef = beta``): maximize ``L_CLIP - beta * Var``, i.e.
      minimize ``pg_loss + beta * Var``, where ``Var = (1/K) sum_k ||g_k - mean_j g_j||^2`` and ``g_k`` is
      the gradient of the clipped surrogate of slice ``k`` of ``K = grad_var_slices`` equal slices of the
      (randomly permuted) minibatch, over ``grad_var_params`` (see
      :func:`~sb3_grpo.objectives.gradient_variance`). The ``K`` slice gradients come from one
      vectorized backward pass with ``create_graph=True`` and ``Var`` is differentiated by double
      backprop; on CartPole's MLP an update costs about 2-3x a plain one (``scripts/bench_cartpole.py
      --cost-only 5``). For LMs restrict ``grad_var_params`` to a few layers (the graph of ``K``
      gradients over all parameters is kept until the backward).
    - **Adaptive clip** (``adaptive_clip = (s_pos, s_neg)``): per-sample range ``eps * s_pos`` where the
      (normalized) advantage is positive, ``eps * s_neg`` otherwise; ``eps`` follows ``clip_range`` and
      its schedule.
    - **Mixed exploration** (``explore_alpha``, ``explore_fraction``): act with
      ``(1 - alpha) * pi + alpha * uniform``; ``alpha`` decays linearly from ``explore_alpha`` to 0 over
      the first ``explore_fraction`` of training. The rollout stores the mixture's log-density, so the PPO
      ratio ``pi_new / pi_mix_old`` is an honest importance weight (so ``approx_kl`` and the clip
      fraction are nonzero from the first epoch while ``alpha > 0``; keep ``target_kl`` loose then). Since
      ``mu >= (1 - alpha) * pi_old``, a likely token's first ratio is about ``1 / (1 - alpha)``; above
      ``alpha = eps_pos / (1 + eps_pos)`` that is outside the clip range and positive advantages get no
      gradient, so GRPO warns at construction. Discrete, MultiDiscrete, MultiBinary
      and bounded Box actions (uniform density ``1 / volume`` on the box the policy samples in; SB3 clips
      Gaussian samples only when passing them to the env, so densities are compared before clipping).
    - **Advantage** (``advantage``): ``"gae"`` (PPO), or per completed group of episodes
      ``"group"`` (DeepSeekMath, arXiv 2402.03300: ``(r - mean_g) / (std_g + eps)``), ``"rloo"``
      (Ahmadian et al. 2024, arXiv 2402.14740) or ``"self_critical"`` (Rennie et al. 2017: the greedy
      member's reward is the baseline; env ``i`` with ``i % group_size == 0`` acts greedily and is not
      trained on). Group forms train no critic (no value loss), skip minibatch advantage normalization
      (the group form is already normalized; steps without a complete group must stay at 0), and need an
      env that reports ``group_size > 1`` and puts ``info["group_id"]`` in every step's info (see
      :class:`~sb3_grpo.buffers.EpisodeGroupTracker` for which steps get an advantage).
    - **KL to a reference** (``kl_coef``, ``kl_target``): ``kl_coef * KL`` is added to the loss, with
      ``KL = (1/N) sum_i w_i k3_i`` over the minibatch's ``N`` actions, ``k3 = exp(ref - logp) - (ref -
      logp) - 1`` at the current policy (Schulman 2020, "Approximating KL Divergence"; DeepSeekMath eq. 4)
      and ``w = pi_old(a|s) / mu(a|s)``, ``mu = (1 - alpha) * pi_old + alpha * uniform`` the distribution the
      action was drawn from (see :func:`~sb3_grpo.objectives.kl_k3_weighted_mean`). k3 is unbiased only for
      actions sampled from the policy; the importance weight makes the mean over mixture samples an
      unbiased estimate of the one over the policy's own samples (``E_mu[w f] = E_pi_old[f]``), so uniformly
      explored tokens, which the policy would rarely pick, count for little instead of dominating. The
      rollout buffer stores both log-probs per action, ``log_probs`` (``log mu``, used by the PPO ratio) and
      ``policy_log_probs`` (``log pi_old``): :class:`~sb3_grpo.buffers.GRPORolloutBuffer` /
      :class:`~sb3_grpo.buffers.GRPODictRolloutBuffer`, which GRPO builds in place of SB3's ``RolloutBuffer``
      / ``DictRolloutBuffer``, and :class:`~sb3_grpo.buffers.SequenceRolloutBuffer`. With ``alpha = 0`` every
      ``w`` is exactly 1 and ``KL`` is the plain mean. The weights correct each action, not the states:
      a state reached after an explored token is still in the average. ``KL`` is what the loss, the log
      (``train/kl_ref``) and the controller use. ``pi_ref`` is a frozen copy of the initial policy (or, if
      the policy defines ``reference_evaluate_actions(obs, actions)``, e.g. a LoRA model with its adapter
      switched off, that method). With ``kl_target``, ``kl_coef`` follows Ziegler et al.'s (arXiv
      1909.08593) proportional controller after each update:
      ``kl_coef *= 1 + 0.1 * clip(KL / kl_target - 1, -0.2, 0.2)``.

    With ``grad_var_coef=0, adaptive_clip=None, explore_alpha=0, advantage="gae", kl_coef=0`` every
    operation (and every random draw) is the one SB3's ``PPO`` performs, so the parameters after
    ``learn()`` are identical to PPO's for the same seed (tested).

    Non-finite rewards, advantages, losses or gradients raise a ``RuntimeError`` naming the quantity, the
    env / update / timestep, before the optimizer touches the weights (``nonfinite="raise"``, the default).
    With ``nonfinite="skip"`` they are dropped instead and counted: an episode whose reward is NaN/inf
    (or whose env set ``info["reward_nonfinite"]``, see the text envs' ``nonfinite_reward="skip"``) gets
    reward 0 and advantage 0 on its steps of the rollout, with its value target set to the old value (so
    it moves neither the policy nor the critic, up to advantage normalization), counted in
    ``rollout/skipped_episodes``; a minibatch with a non-finite loss or gradient takes no optimizer step,
    counted in ``train/skipped_nonfinite``. Either way no NaN reaches the weights.

    Launched with ``torchrun`` (or inside an initialised ``torch.distributed`` process group), ``GRPO``
    trains data-parallel: rank 0's weights are broadcast at setup, rank ``r`` is seeded with
    ``seed + 1000 * r``, gradients are averaged over the ranks before clipping and the optimizer step
    (a rank that skips a non-finite loss joins the average with no gradient), ``target_kl`` and the KL
    controller use cross-rank means, and only rank 0 logs and saves; ``num_timesteps`` counts the rank's
    own steps. See :mod:`sb3_grpo.distributed`.

    :param policy: The policy model to use (MlpPolicy, CnnPolicy, MultiInputPolicy, CausalLMPolicy, ...)
    :param env: The environment to learn from (if registered in Gym, can be str)
    :param learning_rate: The learning rate, it can be a function of the current progress remaining (1 to 0)
    :param n_steps: The number of steps to run for each environment per update
    :param batch_size: Minibatch size
    :param n_epochs: Number of epochs when optimizing the surrogate loss
    :param gamma: Discount factor
    :param gae_lambda: Factor for trade-off of bias vs variance for Generalized Advantage Estimator
    :param clip_range: Clipping parameter ``eps``, it can be a function of the current progress remaining
    :param clip_range_vf: Clipping parameter for the value function (None: no clipping)
    :param normalize_advantage: Whether to normalize the advantage per minibatch (``"gae"`` only)
    :param ent_coef: Entropy coefficient for the loss calculation
    :param vf_coef: Value function coefficient for the loss calculation (``"gae"`` only)
    :param max_grad_norm: The maximum value for the gradient clipping
    :param use_sde: Whether to use generalized State Dependent Exploration (gSDE)
    :param sde_sample_freq: Sample a new noise matrix every n steps when using gSDE
    :param rollout_buffer_class: Rollout buffer class to use. If ``None``, it will be automatically selected:
        :class:`~sb3_grpo.buffers.SequenceRolloutBuffer` for a ``CausalLMPolicy`` on a text env, else GRPO's
        subclass of SB3's ``RolloutBuffer`` / ``DictRolloutBuffer``; SB3's two stock classes, passed here, are
        replaced by those subclasses too (same data and minibatches, plus the policy's own log-probs). Another
        class works unless the KL term must be importance-weighted (``kl_coef > 0`` and ``explore_alpha > 0``),
        which needs a subclass of :class:`~sb3_grpo.buffers.PolicyLogProbMixin`.
    :param rollout_buffer_kwargs: Keyword arguments to pass to the rollout buffer on creation
    :param target_kl: Stop the epochs of an update early when ``approx_kl > 1.5 * target_kl`` (as PPO)
    :param stats_window_size: Window size for the rollout logging
    :param tensorboard_log: the log location for tensorboard (if None, no logging)
    :param policy_kwargs: additional arguments to be passed to the policy on creation
    :param verbose: Verbosity level: 0 for no output, 1 for info messages, 2 for debug messages
    :param seed: Seed for the pseudo random generators
    :param device: Device (cpu, cuda, ...) on which the code should be run
    :param _init_setup_model: Whether or not to build the network at the creation of the instance
    :param grad_var_coef: ``beta >= 0``, weight of the gradient-variance penalty (0 turns it off)
    :param grad_var_slices: ``K >= 2``, number of minibatch slices the variance is measured over
    :param grad_var_params: ``None`` (all trainable parameters) or a list of parameter-name prefixes
        (``policy.named_parameters()``), e.g. ``["action_net", "mlp_extractor.policy_net"]``
    :param adaptive_clip: ``(scale for A > 0, scale for A <= 0)``, both positive; ``None`` turns it off
    :param explore_alpha: initial uniform-mixture weight in ``[0, 1]`` (0 turns it off)
    :param explore_fraction: fraction of ``total_timesteps`` over which ``alpha`` decays to 0, in ``(0, 1]``
    :param advantage: ``"gae"``, ``"group"``, ``"rloo"`` or ``"self_critical"``
    :param kl_coef: weight of the k3 KL to the frozen reference policy (0 turns it off)
    :param kl_target: target KL for the adaptive controller of ``kl_coef`` (None: fixed ``kl_coef``)
    :param grad_norm_warn: warn (once per model) when the gradient norm before clipping exceeds this
        (None: never); ``train/grad_norm`` and ``train/grad_norm_max`` are logged at every update
    :param nonfinite: ``"raise"`` (default) or ``"skip"``: what to do with NaN/inf rewards, advantages,
        losses and gradients (see above)
    """

    policy_aliases: ClassVar[dict[str, type[BasePolicy]]] = {
        "MlpPolicy": ActorCriticPolicy,
        "CnnPolicy": ActorCriticCnnPolicy,
        "MultiInputPolicy": MultiInputActorCriticPolicy,
    }

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
        ent_coef: float = 0.0,
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
        grad_var_coef: float = 0.01,
        grad_var_slices: int = 4,
        grad_var_params: list[str] | None = None,
        adaptive_clip: tuple[float, float] | None = (1.1, 0.9),
        explore_alpha: float = 0.05,
        explore_fraction: float = 0.5,
        advantage: str = "gae",
        kl_coef: float = 0.0,
        kl_target: float | None = None,
        grad_norm_warn: float | None = 1000.0,
        nonfinite: str = "raise",
    ):
        # Validate GRPO's own arguments first: cheap, and before any model is built
        if advantage not in ADVANTAGES:
            raise ValueError(f"advantage={advantage!r} is not known; known: {', '.join(ADVANTAGES)}")
        if nonfinite not in NONFINITE:
            raise ValueError(
                f"nonfinite={nonfinite!r} is not known; use 'raise' (stop with an error, the default) or 'skip' "
                "(drop bad episodes and minibatches and count them in the logs)"
            )
        if grad_var_coef < 0:
            raise ValueError(f"grad_var_coef must be >= 0 (0 turns the penalty off), got {grad_var_coef}")
        if grad_var_coef > 0:
            if int(grad_var_slices) != grad_var_slices or grad_var_slices < 2:
                raise ValueError(f"grad_var_slices must be an integer >= 2, got {grad_var_slices}")
            if grad_var_slices > batch_size:
                raise ValueError(
                    f"grad_var_slices={grad_var_slices} is more than batch_size={batch_size} samples; "
                    "each slice needs at least one sample: lower grad_var_slices or raise batch_size"
                )
        if kl_coef < 0:
            raise ValueError(f"kl_coef must be >= 0 (0 turns the KL term off), got {kl_coef}")
        if kl_target is not None:
            if kl_target <= 0:
                raise ValueError(f"kl_target must be > 0 or None, got {kl_target}")
            if kl_coef <= 0:
                raise ValueError("kl_target adapts kl_coef multiplicatively; give a starting kl_coef > 0")
        if explore_alpha < 0 or explore_alpha > 1:
            raise ValueError(f"explore_alpha must be in [0, 1] (0 turns exploration off), got {explore_alpha}")
        if not 0 < explore_fraction <= 1:
            raise ValueError(f"explore_fraction must be in (0, 1], got {explore_fraction}")
        if adaptive_clip is not None:
            if len(adaptive_clip) != 2 or not all(float(s) > 0 for s in adaptive_clip):
                raise ValueError(
                    f"adaptive_clip must be a pair of positive scales (for A > 0, for A <= 0), e.g. (1.1, 0.9), "
                    f"or None; got {adaptive_clip}"
                )
            adaptive_clip = (float(adaptive_clip[0]), float(adaptive_clip[1]))

        # torch.distributed (torchrun): one GPU per rank, quiet ranks > 0 (see sb3_grpo.distributed); GRPO.load
        # builds with _init_setup_model=False and makes no collective call (rank 0 alone may load a model)
        self._sync_ranks_at_setup = _init_setup_model
        on_cpu = str(device) != "auto" and th.device(device).type == "cpu"
        if distributed.setup(backend="gloo" if on_cpu else None):
            device = distributed.local_device(device)
            if distributed.get_rank() > 0:
                verbose = 0

        super().__init__(
            policy,
            env,
            learning_rate=learning_rate,
            n_steps=n_steps,
            gamma=gamma,
            gae_lambda=gae_lambda,
            ent_coef=ent_coef,
            vf_coef=vf_coef,
            max_grad_norm=max_grad_norm,
            use_sde=use_sde,
            sde_sample_freq=sde_sample_freq,
            rollout_buffer_class=rollout_buffer_class,
            rollout_buffer_kwargs=rollout_buffer_kwargs,
            stats_window_size=stats_window_size,
            tensorboard_log=tensorboard_log,
            policy_kwargs=policy_kwargs,
            verbose=verbose,
            device=device,
            seed=seed,
            _init_setup_model=False,
            supported_action_spaces=(
                spaces.Box,
                spaces.Discrete,
                spaces.MultiDiscrete,
                spaces.MultiBinary,
            ),
        )

        # Same sanity checks as PPO
        if normalize_advantage:
            assert batch_size > 1, (
                "`batch_size` must be greater than 1. See https://github.com/DLR-RM/stable-baselines3/issues/440"
            )

        if self.env is not None:
            buffer_size = self.env.num_envs * self.n_steps
            assert buffer_size > 1 or (not normalize_advantage), (
                f"`n_steps * n_envs` must be greater than 1. Currently n_steps={self.n_steps} and n_envs={self.env.num_envs}"
            )
            untruncated_batches = buffer_size // batch_size
            if buffer_size % batch_size > 0:
                warnings.warn(
                    f"You have specified a mini-batch size of {batch_size},"
                    f" but because the `RolloutBuffer` is of size `n_steps * n_envs = {buffer_size}`,"
                    f" after every {untruncated_batches} untruncated mini-batches,"
                    f" there will be a truncated mini-batch of size {buffer_size % batch_size}\n"
                    f"We recommend using a `batch_size` that is a factor of `n_steps * n_envs`.\n"
                    f"Info: (n_steps={self.n_steps} and n_envs={self.env.num_envs})"
                )
        self.batch_size = batch_size
        self.n_epochs = n_epochs
        self.clip_range = clip_range
        self.clip_range_vf = clip_range_vf
        self.normalize_advantage = normalize_advantage
        self.target_kl = target_kl

        self.grad_var_coef = float(grad_var_coef)
        self.grad_var_slices = int(grad_var_slices)
        self.grad_var_params = list(grad_var_params) if grad_var_params is not None else None
        self.adaptive_clip = adaptive_clip
        self.explore_alpha = float(explore_alpha)
        self.explore_fraction = float(explore_fraction)
        self.advantage = advantage
        self.kl_coef = float(kl_coef)
        self.kl_target = kl_target
        self.grad_norm_warn = grad_norm_warn
        self.nonfinite = nonfinite

        if self.explore_alpha > 0 and getattr(self, "action_space", None) is not None:
            # raises a clear ValueError for unbounded Box or unsupported action spaces
            uniform_log_prob(self.action_space)
        self._warn_if_exploration_clips()
        if self.advantage != "gae" and self.env is not None:
            self._check_grouped_env(self.env)

        if _init_setup_model:
            self._setup_model()

    def _warn_if_exploration_clips(self) -> None:
        """Warn when the exploration mixture alone puts the first epoch's ratio outside the clip range.

        The stored old log-prob is the mixture's, ``mu >= (1 - alpha) * pi_old``, so before any update the ratio
        ``pi / mu`` of a likely token is about ``1 / (1 - alpha)``. Once that exceeds ``1 + eps_pos`` (``eps`` times
        the positive scale of ``adaptive_clip``), i.e. ``alpha > eps_pos / (1 + eps_pos)``, the clipped objective
        gives positive-advantage tokens no gradient from the first step on.
        """
        eps = self.clip_range(1.0) if callable(self.clip_range) else self.clip_range
        if self.explore_alpha <= 0 or not isinstance(eps, (int, float)):
            return
        eps_pos = float(eps) * (self.adaptive_clip[0] if self.adaptive_clip is not None else 1.0)
        threshold = eps_pos / (1.0 + eps_pos)
        if self.explore_alpha > threshold:
            warnings.warn(
                f"GRPO: explore_alpha={self.explore_alpha:g} makes the PPO ratio of likely tokens start near "
                f"1 / (1 - alpha) = {1.0 / (1.0 - self.explore_alpha):.3g}, above the clip bound 1 + {eps_pos:.3g}: "
                f"tokens with positive advantage would get no gradient. Use explore_alpha <= {threshold:.3g} "
                "or a wider clip_range",
                stacklevel=3,
            )

    # ------------------------------------------------------------------------------------------------------
    # Setup
    # ------------------------------------------------------------------------------------------------------
    def _get_policy_from_name(self, policy_name: str) -> type[BasePolicy]:
        if policy_name == "CausalLMPolicy":
            # imported lazily: it pulls in transformers, and sb3_grpo.policies is optional for MLP users
            try:
                from sb3_grpo.policies import CausalLMPolicy
            except ImportError as err:
                raise ValueError(f"policy 'CausalLMPolicy' is not available: {err}") from err
            return CausalLMPolicy
        return super()._get_policy_from_name(policy_name)

    def _check_grouped_env(self, env: VecEnv) -> int:
        group_size = _env_group_size(env)
        if group_size is None or group_size <= 1:
            raise ValueError(
                f"advantage={self.advantage!r} needs an env with group_size > 1, {GROUPED_ENV_HINT}; "
                f"this env reports group_size={group_size}. Use advantage='gae' for ungrouped envs."
            )
        if self.advantage == "self_critical" and env.num_envs % group_size != 0:
            raise ValueError(
                f"advantage='self_critical' makes env i with i % group_size == 0 act greedily, so n_envs "
                f"({env.num_envs}) must be a multiple of group_size ({group_size})"
            )
        return group_size

    def _setup_model(self) -> None:
        if (
            self.rollout_buffer_class is None
            and hasattr(self.policy_class, "evaluate_sequences")
            and is_text_space(self.observation_space, self.action_space)
        ):
            # the text fast path: whole sequences, one forward each at update time
            self.rollout_buffer_class = SequenceRolloutBuffer
        elif self.rollout_buffer_class is None:
            dict_obs = isinstance(self.observation_space, spaces.Dict)
            self.rollout_buffer_class = GRPODictRolloutBuffer if dict_obs else GRPORolloutBuffer
        else:  # SB3's stock classes: the same buffer plus the policy's own log-probs (the KL's importance weights)
            self.rollout_buffer_class = GRPO_BUFFERS.get(self.rollout_buffer_class, self.rollout_buffer_class)
        if (
            self.kl_coef > 0
            and self.explore_alpha > 0
            and not issubclass(self.rollout_buffer_class, PolicyLogProbMixin)
        ):
            raise ValueError(
                f"kl_coef > 0 with explore_alpha > 0 weights the KL estimate by pi / mu, so the rollout buffer must "
                f"store the policy's own log-probs beside the mixture's; {self.rollout_buffer_class.__name__} does "
                "not. Use rollout_buffer_class=None (GRPO's default), a subclass of "
                "sb3_grpo.buffers.PolicyLogProbMixin, or explore_alpha=0"
            )
        # GRPO.load() restores the saved exploration RNG before calling _setup_model: keep its state
        loaded_explore_rng = self.__dict__.get("_explore_rng")
        # torch.distributed: rank r seeds with seed + 1000 * r; rank 0's weights are broadcast below
        self._world_size = distributed.get_world_size() if distributed.setup() else 1
        self._rank = distributed.get_rank() if self._world_size > 1 else 0
        if self._world_size > 1:
            self.seed = distributed.rank_seed(self.seed, self._rank)
        super()._setup_model()
        if self._world_size > 1:
            self._setup_distributed(sync=getattr(self, "_sync_ranks_at_setup", False))

        # Initialize schedules for policy/value clipping (as PPO)
        self.clip_range = FloatSchedule(self.clip_range)
        if self.clip_range_vf is not None:
            if isinstance(self.clip_range_vf, (float, int)):
                assert self.clip_range_vf > 0, "`clip_range_vf` must be positive, pass `None` to deactivate vf clipping"
            self.clip_range_vf = FloatSchedule(self.clip_range_vf)

        if self.adaptive_clip is not None:  # saved as a JSON list
            self.adaptive_clip = (float(self.adaptive_clip[0]), float(self.adaptive_clip[1]))
        # GRPO state; nothing here draws from a random generator, so PPO's RNG stream is untouched
        self._grad_var_param_list = self._select_grad_var_params() if self.grad_var_coef > 0 else []
        self.ref_policy = None
        if self.kl_coef > 0 and not hasattr(self.policy, "reference_evaluate_actions"):
            self.ref_policy = copy.deepcopy(self.policy)
            self.ref_policy.set_training_mode(False)
            for param in self.ref_policy.parameters():
                param.requires_grad_(False)
        if isinstance(loaded_explore_rng, np.random.Generator) and self._world_size == 1:
            self._explore_rng = loaded_explore_rng
        else:
            self._explore_rng = np.random.default_rng(self.seed)
        self._rollout_explore_alpha = 0.0
        self._group_tracker: EpisodeGroupTracker | None = None
        self._grad_norm_warned = False
        self._grad_var_batched = True
        self._skipped_nonfinite = 0

    def _setup_distributed(self, sync: bool) -> None:
        """
        Log on rank 0 only; with ``sync`` (a new model, not ``load``) start every rank from rank 0's weights and
        check that the ranks can step in lockstep (collective calls: every rank must build the model).
        """
        if self._rank > 0:
            self.set_logger(distributed.null_logger())
        if not sync:
            return
        distributed.broadcast_module(self.policy, src=0)
        n_envs = self.env.num_envs if self.env is not None else 0
        if not distributed.all_equal(n_envs):
            raise ValueError(
                f"GRPO under torch.distributed needs the same number of envs on every rank (this rank, "
                f"{self._rank}, has {n_envs}); every rank must run the same n_envs, n_steps and total_timesteps, "
                "or the ranks fall out of lockstep and wait for each other forever"
            )

    def save(self, *args: Any, **kwargs: Any) -> None:
        """SB3's ``save``; under ``torch.distributed`` only rank 0 writes (the weights are the same everywhere)."""
        if getattr(self, "_rank", 0) > 0:
            return
        super().save(*args, **kwargs)

    def _idle_step(self) -> bool:
        """
        A distributed rank's step without a minibatch (it had fewer than the others this epoch): join the
        collectives of a real step with no contribution and take the same optimizer step.

        :return: False when the ranks stop the epochs early (``target_kl``).
        """
        if self.target_kl is not None and distributed.mean_across_ranks(0.0, 0.0) > 1.5 * self.target_kl:
            return False
        self._join_gradient_step()
        return True

    def _join_gradient_step(self) -> None:
        """Distributed, without a usable minibatch: join the gradient average with no gradient of this rank's, and
        take the optimizer step the other ranks take (none when the averaged gradient is non-finite)."""
        self.policy.optimizer.zero_grad()
        distributed.average_gradients(self.policy.parameters(), contributed=False)
        grad_norm = th.nn.utils.clip_grad_norm_(self.policy.parameters(), self.max_grad_norm)
        if th.isfinite(grad_norm):
            self.policy.optimizer.step()
        else:  # the contributing ranks raise or skip this step
            self.policy.optimizer.zero_grad()

    def set_random_seed(self, seed: int | None = None) -> None:
        """SB3's ``set_random_seed`` (Python, NumPy, torch, action space, env), plus GRPO's exploration RNG.

        :param seed: The seed (``None``: nothing is reseeded, as in SB3).
        """
        super().set_random_seed(seed)
        if seed is not None:
            self._explore_rng = np.random.default_rng(seed)

    def _select_grad_var_params(self) -> list[th.nn.Parameter]:
        named = [(name, p) for name, p in self.policy.named_parameters() if p.requires_grad]
        if self.grad_var_params is None:
            return [p for _, p in named]
        chosen = [p for name, p in named if any(name.startswith(prefix) for prefix in self.grad_var_params)]
        if not chosen:
            tops = sorted({name.split(".")[0] for name, _ in named})
            raise ValueError(
                f"grad_var_params={self.grad_var_params} matches no trainable parameter; "
                f"names start with: {', '.join(tops)}"
            )
        return chosen

    def _excluded_save_params(self) -> list[str]:
        return [
            *super()._excluded_save_params(),
            "ref_policy",
            "_group_tracker",
            "_grad_var_param_list",
            "_world_size",
            "_rank",
            "_sync_ranks_at_setup",
        ]

    def _get_torch_save_params(self) -> tuple[list[str], list[str]]:
        state_dicts, tensors = super()._get_torch_save_params()
        if getattr(self, "ref_policy", None) is not None:
            state_dicts = [*state_dicts, "ref_policy"]
        return state_dicts, tensors

    # ------------------------------------------------------------------------------------------------------
    # Rollout
    # ------------------------------------------------------------------------------------------------------
    def current_explore_alpha(self) -> float:
        """
        ``alpha = explore_alpha * max(0, 1 - progress / explore_fraction)``, with
        ``progress = 1 - _current_progress_remaining`` (0 at the start of ``learn``, 1 at the end).
        """
        if self.explore_alpha <= 0:
            return 0.0
        progress = 1.0 - self._current_progress_remaining
        return self.explore_alpha * max(0.0, 1.0 - progress / self.explore_fraction)

    def _greedy_envs(self, n_envs: int) -> np.ndarray | None:
        if self.advantage != "self_critical" or self._group_tracker is None:
            return None
        return self._group_tracker.greedy_envs

    def _get_group_tracker(self, env: VecEnv) -> EpisodeGroupTracker:
        if self._group_tracker is None or self._group_tracker.n_envs != env.num_envs:
            group_size = self._check_grouped_env(env)
            greedy = None
            if self.advantage == "group":
                advantage_fn = _ignore_greedy(group_advantages)
            elif self.advantage == "rloo":
                advantage_fn = _ignore_greedy(rloo_advantages)
            else:
                advantage_fn = self_critical_advantages
                greedy = np.arange(env.num_envs) % group_size == 0
            self._group_tracker = EpisodeGroupTracker(env.num_envs, group_size, advantage_fn, greedy_envs=greedy)
        return self._group_tracker

    def _sample_actions(
        self, obs_tensor: th.Tensor | dict[str, th.Tensor], alpha: float, greedy_envs: np.ndarray | None
    ) -> tuple[th.Tensor, th.Tensor, th.Tensor, th.Tensor]:
        """
        Actions, values, *behaviour* log-probs (``log mu(a|s)``, the mixture's where it explores) and the
        policy's own log-probs (``log pi(a|s)``) for one step. With ``alpha == 0`` and no greedy envs this is
        exactly ``self.policy(obs_tensor)`` (PPO's call, same random draws), with its log-probs twice.
        """
        actions, values, log_probs = self.policy(obs_tensor)
        if alpha <= 0 and greedy_envs is None:
            return actions, values, log_probs, log_probs
        n_envs = actions.shape[0]
        greedy = np.zeros(n_envs, dtype=bool) if greedy_envs is None else greedy_envs
        if greedy.any():
            greedy_actions, _, greedy_log_probs = self.policy(obs_tensor, deterministic=True)
            rows = th.as_tensor(greedy, device=actions.device)
            actions[rows] = greedy_actions[rows]
            log_probs[rows] = greedy_log_probs[rows]
        if alpha > 0:
            squashed = bool(getattr(self.policy, "squash_output", False))
            explore = (self._explore_rng.random(n_envs) < alpha) & ~greedy
            if explore.any():
                rows = th.as_tensor(explore, device=actions.device)
                uniform = uniform_sample(self.action_space, int(explore.sum()), self._explore_rng, squashed)
                actions[rows] = th.as_tensor(uniform, dtype=actions.dtype, device=actions.device).reshape(
                    actions[rows].shape
                )
                eval_actions = actions.long().flatten() if isinstance(self.action_space, spaces.Discrete) else actions
                # log pi of the uniform draws, from the distribution the policy already computed for this
                # step (get_distribution, not evaluate_actions: a CausalLMPolicy serves it from its cache)
                explore_log_probs = self.policy.get_distribution(obs_tensor).log_prob(eval_actions)
                log_probs[rows] = explore_log_probs.reshape(log_probs.shape)[rows]
            log_u = uniform_log_prob(self.action_space, actions, squashed)
            mixed = mixture_log_prob(log_probs, log_u, alpha)
            policy_log_probs = log_probs  # log pi of every action, explored or not
            log_probs = th.where(th.as_tensor(~greedy, device=log_probs.device), mixed, log_probs)
            return actions, values, log_probs, policy_log_probs
        return actions, values, log_probs, log_probs

    def collect_rollouts(
        self,
        env: VecEnv,
        callback: BaseCallback,
        rollout_buffer: RolloutBuffer,
        n_rollout_steps: int,
    ) -> bool:
        """
        Collect experiences and fill a ``RolloutBuffer``: SB3's ``OnPolicyAlgorithm.collect_rollouts`` step
        for step (same calls, same order), plus the uniform-mixture actions, the greedy members of
        self-critical groups, and the group bookkeeping that replaces GAE advantages by group advantages.

        :param env: The training environment
        :param callback: Callback that will be called at each step (and at the beginning and end of the rollout)
        :param rollout_buffer: Buffer to fill with rollouts
        :param n_rollout_steps: Number of experiences to collect per environment
        :return: True if function returned with at least `n_rollout_steps` collected, False if callback
            terminated rollout prematurely.
        """
        assert self._last_obs is not None, "No previous observation was provided"
        # Switch to eval mode (this affects batch norm / dropout)
        self.policy.set_training_mode(False)

        n_steps = 0
        rollout_buffer.reset()
        self._reset_episode_screen(env.num_envs, n_rollout_steps)
        # Sample new weights for the state dependent exploration
        if self.use_sde:
            self.policy.reset_noise(env.num_envs)

        alpha = self.current_explore_alpha()
        self._rollout_explore_alpha = alpha
        tracker = self._get_group_tracker(env) if self.advantage != "gae" else None
        if tracker is not None:
            tracker.reset_rollout(n_rollout_steps)
        greedy_envs = self._greedy_envs(env.num_envs)

        completion_lengths: list[int] = []  # text envs: tokens of each completion that ended in this rollout
        callback.on_rollout_start()

        while n_steps < n_rollout_steps:
            if self.use_sde and self.sde_sample_freq > 0 and n_steps % self.sde_sample_freq == 0:
                # Sample a new noise matrix
                self.policy.reset_noise(env.num_envs)

            with th.no_grad():
                # Convert to pytorch tensor or to TensorDict
                obs_tensor = obs_as_tensor(self._last_obs, self.device)  # type: ignore[arg-type]
                actions, values, log_probs, policy_log_probs = self._sample_actions(obs_tensor, alpha, greedy_envs)
            actions = actions.cpu().numpy()

            # Rescale and perform action
            clipped_actions = actions

            if isinstance(self.action_space, spaces.Box):
                if self.policy.squash_output:
                    # Unscale the actions to match env bounds if they were previously squashed to [-1, 1]
                    clipped_actions = self.policy.unscale_action(clipped_actions)
                else:
                    # Otherwise, clip the actions to avoid out of bound error
                    # as we are sampling from an unbounded Gaussian distribution
                    clipped_actions = np.clip(actions, self.action_space.low, self.action_space.high)

            new_obs, rewards, dones, infos = env.step(clipped_actions)
            rewards = self._screen_rewards(rewards, dones, infos, n_steps)

            self.num_timesteps += env.num_envs

            # Give access to local variables
            callback.update_locals(locals())
            if not callback.on_step():
                return False

            self._update_info_buffer(infos, dones)
            completion_lengths.extend(
                len(infos[idx]["completion_ids"]) for idx in np.flatnonzero(dones) if "completion_ids" in infos[idx]
            )
            n_steps += 1

            if tracker is not None:
                # raw rewards, before the timeout bootstrap below adds gamma * V(terminal obs)
                tracker.add(rewards, dones, infos)

            if isinstance(self.action_space, spaces.Discrete):
                # Reshape in case of discrete action
                actions = actions.reshape(-1, 1)

            # Handle timeout by bootstrapping with value function (SB3 GitHub issue #633)
            for idx, done in enumerate(dones):
                if (
                    done
                    and infos[idx].get("terminal_observation") is not None
                    and infos[idx].get("TimeLimit.truncated", False)
                ):
                    terminal_obs = self.policy.obs_to_tensor(infos[idx]["terminal_observation"])[0]
                    with th.no_grad():
                        terminal_value = self.policy.predict_values(terminal_obs)[0]  # type: ignore[arg-type]
                    rewards[idx] += self.gamma * terminal_value

            # the policy's own log-probs beside the behaviour's, for the importance-weighted KL (GRPO's buffers)
            own = {"policy_log_prob": policy_log_probs} if isinstance(rollout_buffer, PolicyLogProbMixin) else {}
            rollout_buffer.add(
                self._last_obs,  # type: ignore[arg-type]
                actions,
                rewards,
                self._last_episode_starts,  # type: ignore[arg-type]
                values,
                log_probs,
                **own,
            )
            self._last_obs = new_obs  # type: ignore[assignment]
            self._last_episode_starts = dones

        with th.no_grad():
            # Compute value for the last timestep
            values = self.policy.predict_values(obs_as_tensor(new_obs, self.device))  # type: ignore[arg-type]

        rollout_buffer.compute_returns_and_advantage(last_values=values, dones=dones)
        if completion_lengths:
            self.logger.record("rollout/completion_length", float(np.mean(completion_lengths)))

        if tracker is not None:
            group_adv, stats = tracker.compute()
            rollout_buffer.advantages[:] = group_adv
            self.logger.record("rollout/group_reward_mean", stats["group_reward_mean"])
            self.logger.record("rollout/group_reward_std", stats["group_reward_std"])
            self.logger.record("rollout/n_complete_groups", stats["n_groups"])
            self.logger.record("rollout/frac_steps_nonzero_advantage", stats["frac_steps_nonzero_advantage"])

        self._drop_skipped_episodes(rollout_buffer)
        if not np.all(np.isfinite(rollout_buffer.advantages)):
            n_bad_rewards = int(np.sum(~np.isfinite(rollout_buffer.rewards)))
            n_bad_values = int(np.sum(~np.isfinite(rollout_buffer.values)))
            raise RuntimeError(
                f"GRPO: non-finite advantages in the rollout ending at timestep {self.num_timesteps} "
                f"(update {self._n_updates}, advantage={self.advantage!r}); non-finite rewards: {n_bad_rewards}, "
                f"non-finite values: {n_bad_values}. Check the env's rewards and the value head."
            )

        callback.update_locals(locals())

        callback.on_rollout_end()

        return True

    def _reset_episode_screen(self, n_envs: int, n_rollout_steps: int) -> None:
        """Start the rollout's bookkeeping of episodes to drop (``nonfinite="skip"``)."""
        self._episode_first_row = np.zeros(n_envs, dtype=np.int64)
        self._skip_rows = np.zeros((n_rollout_steps, n_envs), dtype=bool)
        self._skipped_episodes = 0

    def _screen_rewards(self, rewards: np.ndarray, dones: np.ndarray, infos: list[dict], row: int) -> np.ndarray:
        """Check one step's rewards. ``"raise"``: a NaN/inf reward raises with its env, timestep and
        completion. ``"skip"``: it becomes 0, and the episode (also one flagged ``info["reward_nonfinite"]``
        by the env) is marked so that :meth:`_drop_skipped_episodes` zeroes its advantages."""
        bad = ~np.isfinite(rewards)
        if self.nonfinite == "raise":
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                where = f"; completion {infos[i]['completion']!r}" if "completion" in infos[i] else ""
                raise RuntimeError(
                    f"GRPO: env {i} returned a non-finite reward ({rewards[i]}) at timestep {self.num_timesteps + len(rewards)} "
                    f"(update {self._n_updates}){where}; non-finite rewards make non-finite advantages, so no update "
                    "was made. Fix the reward, or pass nonfinite='skip' to drop such episodes (and, for text envs, "
                    "nonfinite_reward='skip')"
                )
            return rewards
        flagged = bad | np.array([bool(info.get("reward_nonfinite", False)) for info in infos])
        if bad.any():
            rewards = np.where(bad, 0.0, rewards).astype(rewards.dtype)
        for i in np.flatnonzero(flagged):
            self._skip_rows[self._episode_first_row[i] : row + 1, i] = True
            self._skipped_episodes += 1
        ended = np.flatnonzero(dones)
        self._episode_first_row[ended] = row + 1
        return rewards

    def _drop_skipped_episodes(self, rollout_buffer: RolloutBuffer) -> None:
        """``nonfinite="skip"``: zero the advantages of dropped episodes and of any non-finite advantage, and
        set their value targets to the old values; log ``rollout/skipped_episodes``."""
        if self.nonfinite != "skip":
            return
        drop = self._skip_rows | ~np.isfinite(rollout_buffer.advantages) | ~np.isfinite(rollout_buffer.values)
        if drop.any():
            values = np.nan_to_num(rollout_buffer.values, nan=0.0, posinf=0.0, neginf=0.0)
            rollout_buffer.advantages[drop] = 0.0
            rollout_buffer.values[drop] = values[drop]
            rollout_buffer.returns[drop] = values[drop]
        self.logger.record("rollout/skipped_episodes", self._skipped_episodes)

    # ------------------------------------------------------------------------------------------------------
    # Update
    # ------------------------------------------------------------------------------------------------------
    def _minibatches(self) -> Iterator[_Minibatch]:
        """
        One epoch of minibatches: random transitions from a ``RolloutBuffer`` (PPO's path), or whole
        sequences from a :class:`~sb3_grpo.buffers.SequenceRolloutBuffer` (the text fast path).
        """
        if isinstance(self.rollout_buffer, SequenceRolloutBuffer):
            for seq in self.rollout_buffer.get_sequences(self.batch_size):
                m = seq.action_mask
                yield _Minibatch(
                    actions=seq.input_ids[m],
                    old_values=seq.old_values[m],
                    old_log_prob=seq.old_log_prob[m],
                    advantages=seq.advantages[m],
                    returns=seq.returns[m],
                    observations=None,
                    sequences=seq,
                    old_policy_log_prob=seq.old_policy_log_prob[m],
                )
            return
        for rollout_data in self.rollout_buffer.get(self.batch_size):
            actions = rollout_data.actions
            if isinstance(self.action_space, spaces.Discrete):
                # Convert discrete action from float to long
                actions = rollout_data.actions.long().flatten()
            yield _Minibatch(
                actions=actions,
                old_values=rollout_data.old_values,
                old_log_prob=rollout_data.old_log_prob,
                advantages=rollout_data.advantages,
                returns=rollout_data.returns,
                observations=rollout_data.observations,
                sequences=None,
                old_policy_log_prob=getattr(rollout_data, "old_policy_log_prob", None),
            )

    def _evaluate(self, batch: _Minibatch) -> tuple[th.Tensor, th.Tensor, th.Tensor | None]:
        """Values, log-probs and entropies of the minibatch's transitions under the current policy, flat."""
        if batch.sequences is None:
            values, log_prob, entropy = self.policy.evaluate_actions(batch.observations, batch.actions)
            return values.flatten(), log_prob, entropy
        seq = batch.sequences
        log_prob, entropy, values = self.policy.evaluate_sequences(  # type: ignore[operator]
            seq.input_ids, seq.attention_mask, seq.action_mask
        )
        m = seq.action_mask
        return values[m], log_prob[m], entropy[m]

    def _reference_log_prob(self, batch: _Minibatch) -> th.Tensor:
        """``log pi_ref(a|s)`` of the frozen reference policy for the minibatch's transitions (no gradient)."""
        with th.no_grad():
            if batch.sequences is None:
                if self.ref_policy is None:
                    _, ref_log_prob, _ = self.policy.reference_evaluate_actions(batch.observations, batch.actions)  # type: ignore[attr-defined]
                else:
                    _, ref_log_prob, _ = self.ref_policy.evaluate_actions(batch.observations, batch.actions)
                return ref_log_prob
            seq = batch.sequences
            if self.ref_policy is None:
                ref_log_prob, _, _ = self.policy.reference_evaluate_sequences(  # type: ignore[attr-defined]
                    seq.input_ids, seq.attention_mask, seq.action_mask
                )
            else:
                ref_log_prob, _, _ = self.ref_policy.evaluate_sequences(  # type: ignore[operator]
                    seq.input_ids, seq.attention_mask, seq.action_mask
                )
            return ref_log_prob[seq.action_mask]

    def _kl_to_reference(self, batch: _Minibatch, log_prob: th.Tensor) -> th.Tensor:
        """
        The minibatch's importance-weighted k3 estimate of ``KL(pi || pi_ref)``
        (:func:`~sb3_grpo.objectives.kl_k3_weighted_mean`, weights ``pi_old / mu`` from the rollout).

        :param batch: the minibatch
        :param log_prob: ``log pi(a|s)`` of its actions under the current policy (with gradient)
        """
        ref_log_prob = self._reference_log_prob(batch)
        if batch.old_policy_log_prob is None:
            if self._rollout_explore_alpha > 0:
                raise RuntimeError(
                    f"GRPO: the rollout was collected with explore_alpha={self._rollout_explore_alpha:.3g} but the "
                    f"rollout buffer ({type(self.rollout_buffer).__name__}) does not store the policy's own log-probs, "
                    "so the KL to the reference cannot be importance-weighted; use GRPO's buffers "
                    "(sb3_grpo.buffers.GRPORolloutBuffer, GRPODictRolloutBuffer, SequenceRolloutBuffer)"
                )
            return kl_k3_weighted_mean(log_prob, ref_log_prob)
        return kl_k3_weighted_mean(log_prob, ref_log_prob, batch.old_policy_log_prob, batch.old_log_prob)

    def _gradient_variance(self, slice_objectives: list[th.Tensor]) -> th.Tensor:
        """
        :func:`~sb3_grpo.objectives.gradient_variance` over ``grad_var_params``, as a differentiable tensor.
        The ``K`` slice gradients are computed in one vectorized backward pass; if the policy has an op
        without a batching rule, fall back (once, with a warning) to ``K`` separate passes: same value.
        """
        if self._grad_var_batched:
            try:
                return gradient_variance(slice_objectives, self._grad_var_param_list, create_graph=True, batched=True)
            except RuntimeError as err:
                self._grad_var_batched = False
                warnings.warn(
                    f"GRPO: vectorized slice gradients are not supported by this policy ({err}); computing the "
                    f"{len(slice_objectives)} slice gradients of the grad-variance penalty one by one",
                    stacklevel=3,
                )
        return gradient_variance(slice_objectives, self._grad_var_param_list, create_graph=True, batched=False)

    def _raise_non_finite(self, what: str, epoch: int, details: dict[str, float]) -> None:
        detail = ", ".join(f"{k}={v:.4g}" for k, v in details.items())
        raise RuntimeError(
            f"GRPO: non-finite {what} at update {self._n_updates} (epoch {epoch}, timestep {self.num_timesteps}); "
            f"{detail}. No optimizer step was taken. Lower the learning rate, check rewards/observations "
            "for inf/nan, or lower grad_var_coef / kl_coef."
        )

    def train(self) -> None:
        """
        Update policy using the currently gathered rollout buffer (PPO's loop, plus GRPO's terms).
        """
        # Switch to train mode (this affects batch norm / dropout)
        self.policy.set_training_mode(True)
        # Update optimizer learning rate
        self._update_learning_rate(self.policy.optimizer)
        # Compute current clip range
        clip_range = self.clip_range(self._current_progress_remaining)  # type: ignore[operator]
        # Optional: clip range for the value function
        if self.clip_range_vf is not None:
            clip_range_vf = self.clip_range_vf(self._current_progress_remaining)  # type: ignore[operator]

        use_critic = self.advantage == "gae"
        use_kl = self.kl_coef > 0
        entropy_losses = []
        pg_losses, value_losses = [], []
        clip_fractions, clip_fractions_pos, clip_fractions_neg = [], [], []
        grad_vars, kl_refs, grad_norms = [], [], []

        continue_training = True
        # train for n_epochs epochs
        for epoch in range(self.n_epochs):
            approx_kl_divs = []
            # Do a complete pass on the rollout buffer
            for rollout_data in distributed.pad_to_max(self._minibatches()):
                if rollout_data is None:  # distributed: this rank has fewer minibatches than another this epoch
                    if not self._idle_step():
                        continue_training = False
                        break
                    continue
                n_samples = len(rollout_data.actions)
                n_slices = min(self.grad_var_slices, n_samples)
                use_grad_var = self.grad_var_coef > 0 and n_slices >= 2
                if use_grad_var:
                    # the fused attention kernels (flash / memory-efficient) have no double backward: record
                    # attention with the math kernel so that Var can be differentiated (no-op for MLPs)
                    with sdpa_kernel(SDPBackend.MATH):
                        values, log_prob, entropy = self._evaluate(rollout_data)
                else:
                    values, log_prob, entropy = self._evaluate(rollout_data)
                # Normalize advantage (GAE only: group advantages are already normalized, and the steps
                # that have no complete group must keep advantage 0)
                advantages = rollout_data.advantages
                # Normalization does not make sense if mini batchsize == 1, see GH issue #325
                if self.normalize_advantage and use_critic and len(advantages) > 1:
                    advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)

                # Per-sample clip range: eps (PPO) or eps * scale(sign A) (adaptive clip)
                if self.adaptive_clip is None:
                    eps: float | th.Tensor = clip_range
                else:
                    eps = adaptive_clip_range(advantages, clip_range, self.adaptive_clip)

                # ratio between old and new policy, should be one at the first iteration
                # (not with mixed exploration: the old log-prob is the mixture's)
                ratio = th.exp(log_prob - rollout_data.old_log_prob)

                # clipped surrogate loss
                surrogate = clipped_surrogate(ratio, advantages, eps)
                policy_loss = -surrogate.mean()

                # Logging
                pg_losses.append(policy_loss.item())
                clip_fractions.append(clip_fraction(ratio, eps))
                with th.no_grad():
                    positive = advantages > 0
                    clip_fractions_pos.append(clip_fraction(ratio, eps, positive))
                    clip_fractions_neg.append(clip_fraction(ratio, eps, ~positive))

                if use_critic:
                    if self.clip_range_vf is None:
                        # No clipping
                        values_pred = values
                    else:
                        # Clip the difference between old and new value
                        # NOTE: this depends on the reward scaling
                        values_pred = rollout_data.old_values + th.clamp(
                            values - rollout_data.old_values, -clip_range_vf, clip_range_vf
                        )
                    # Value loss using the TD(gae_lambda) target
                    value_loss = F.mse_loss(rollout_data.returns, values_pred)
                    value_losses.append(value_loss.item())

                # Entropy loss favor exploration
                if entropy is None:
                    # Approximate entropy when no analytical form
                    entropy_loss = -th.mean(-log_prob)
                else:
                    entropy_loss = -th.mean(entropy)

                entropy_losses.append(entropy_loss.item())

                if use_critic:
                    loss = policy_loss + self.ent_coef * entropy_loss + self.vf_coef * value_loss
                else:
                    # group forms: no critic (DeepSeekMath GRPO), the value head is not trained
                    loss = policy_loss + self.ent_coef * entropy_loss

                details = {"pg_loss": policy_loss.item()}
                if use_grad_var:
                    # Var[grad L_CLIP] over K contiguous slices of the (randomly permuted) minibatch; its
                    # gradient comes from double backprop when loss.backward() runs
                    grad_var = self._gradient_variance([-part.mean() for part in th.tensor_split(surrogate, n_slices)])
                    grad_vars.append(grad_var.item())
                    details["grad_var"] = grad_vars[-1]
                    loss = loss + self.grad_var_coef * grad_var

                if use_kl:
                    # (1/N) sum w * k3 with w = pi_old / mu: the KL of the policy's own samples, from the
                    # mixture's (exactly the plain k3 mean when alpha = 0); the log and the controller use it too
                    kl_ref = self._kl_to_reference(rollout_data, log_prob)
                    kl_refs.append(kl_ref.item())
                    details["kl_ref"] = kl_refs[-1]
                    loss = loss + self.kl_coef * kl_ref

                # Calculate approximate form of reverse KL Divergence for early stopping
                # see issue #417: https://github.com/DLR-RM/stable-baselines3/issues/417
                # and discussion in PR #419: https://github.com/DLR-RM/stable-baselines3/pull/419
                # and Schulman blog: http://joschu.net/blog/kl-approx.html
                with th.no_grad():
                    log_ratio = log_prob - rollout_data.old_log_prob
                    approx_kl_div = th.mean((th.exp(log_ratio) - 1) - log_ratio).cpu().numpy()
                    approx_kl_divs.append(approx_kl_div)
                if self._world_size > 1 and self.target_kl is not None:
                    approx_kl_div = distributed.mean_across_ranks(float(approx_kl_div))  # all ranks stop together

                if self.target_kl is not None and approx_kl_div > 1.5 * self.target_kl:
                    continue_training = False
                    if self.verbose >= 1:
                        print(f"Early stopping at step {epoch} due to reaching max kl: {approx_kl_div:.2f}")
                    break

                if not th.isfinite(loss):
                    if self.nonfinite == "skip":  # no step on this minibatch; counted in train/skipped_nonfinite
                        self._skipped_nonfinite += 1
                        if self._world_size > 1:  # still join the other ranks' gradient average, with no gradient
                            self._join_gradient_step()
                        continue
                    self._raise_non_finite("loss", epoch, details)

                # Optimization step
                self.policy.optimizer.zero_grad()
                loss.backward()
                if self._world_size > 1:
                    distributed.average_gradients(self.policy.parameters())
                # Clip grad norm (the returned norm is the one before clipping)
                grad_norm = th.nn.utils.clip_grad_norm_(self.policy.parameters(), self.max_grad_norm)
                if not th.isfinite(grad_norm):
                    if self.nonfinite == "skip":  # drop the gradient: the weights and Adam's moments stay finite
                        self.policy.optimizer.zero_grad()
                        self._skipped_nonfinite += 1
                        continue
                    self._raise_non_finite("gradient", epoch, {**details, "grad_norm": grad_norm.item()})
                grad_norms.append(grad_norm.item())
                self.policy.optimizer.step()

            self._n_updates += 1
            if not continue_training:
                break

        explained_var = explained_variance(self.rollout_buffer.values.flatten(), self.rollout_buffer.returns.flatten())

        # Adaptive KL controller (Ziegler et al. 2019, arXiv 1909.08593, section 2.2)
        if use_kl and self.kl_target is not None and (kl_refs or self._world_size > 1):
            if self._world_size > 1:  # the same kl_coef on every rank
                kl_mean = distributed.mean_across_ranks(float(np.sum(kl_refs)), len(kl_refs))
            else:
                kl_mean = np.mean(kl_refs)
            if np.isfinite(kl_mean):
                error = np.clip(kl_mean / self.kl_target - 1.0, -KL_CONTROLLER_CLIP, KL_CONTROLLER_CLIP)
                self.kl_coef *= 1.0 + KL_CONTROLLER_GAIN * float(error)

        # Logs (PPO's first, same keys)
        self.logger.record("train/entropy_loss", np.mean(entropy_losses))
        self.logger.record("train/policy_gradient_loss", np.mean(pg_losses))
        if value_losses:
            self.logger.record("train/value_loss", np.mean(value_losses))
        self.logger.record("train/approx_kl", np.mean(approx_kl_divs))
        self.logger.record("train/clip_fraction", np.mean(clip_fractions))
        self.logger.record("train/loss", loss.item())
        if self.nonfinite == "skip":
            self.logger.record("train/skipped_nonfinite", self._skipped_nonfinite)
            self._skipped_nonfinite = 0
        self.logger.record("train/explained_variance", explained_var)
        if hasattr(self.policy, "log_std"):
            self.logger.record("train/std", th.exp(self.policy.log_std).mean().item())

        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        if self._world_size > 1:  # num_timesteps counts this rank's steps; every rank steps as many
            self.logger.record("time/global_timesteps", self.num_timesteps * self._world_size)
            self.logger.record("dist/world_size", self._world_size)
        self.logger.record("train/clip_range", clip_range)
        if self.clip_range_vf is not None:
            self.logger.record("train/clip_range_vf", clip_range_vf)

        # GRPO's own
        scale_pos, scale_neg = self.adaptive_clip if self.adaptive_clip is not None else (1.0, 1.0)
        self.logger.record("train/clip_range_pos", clip_range * scale_pos)
        self.logger.record("train/clip_range_neg", clip_range * scale_neg)
        self.logger.record("train/clip_fraction_pos", _nanmean(clip_fractions_pos))
        self.logger.record("train/clip_fraction_neg", _nanmean(clip_fractions_neg))
        self.logger.record("train/explore_alpha", self._rollout_explore_alpha)
        if grad_vars:
            self.logger.record("train/grad_var", np.mean(grad_vars))
        if use_kl:
            self.logger.record("train/kl_ref", _nanmean(kl_refs))
            self.logger.record("train/kl_coef", self.kl_coef)
        if grad_norms:
            self.logger.record("train/grad_norm", np.mean(grad_norms))
            self.logger.record("train/grad_norm_max", max(grad_norms))
            if self.grad_norm_warn is not None and max(grad_norms) > self.grad_norm_warn and not self._grad_norm_warned:
                self._grad_norm_warned = True  # once per model: the logs carry train/grad_norm(_max) every update
                warnings.warn(
                    f"GRPO: gradient norm {max(grad_norms):.3g} (before clipping to {self.max_grad_norm}) exceeds "
                    f"grad_norm_warn={self.grad_norm_warn} at update {self._n_updates}; consider a lower "
                    "learning rate or reward scaling",
                    stacklevel=2,
                )
        self.logger.record(
            "train/value_return_corr",
            pearson_corr(self.rollout_buffer.values, self.rollout_buffer.returns),
        )

    @classmethod
    def load(  # noqa: PYI019 (SB3's convention)
        cls: type[SelfGRPO],
        path: Any,
        env: GymEnv | None = None,
        device: th.device | str = "auto",
        custom_objects: dict[str, Any] | None = None,
        print_system_info: bool = False,
        force_reset: bool = True,
        **kwargs: Any,
    ) -> SelfGRPO:
        """
        SB3's ``load``, with clear errors for a path that does not exist or a file that is not a complete saved
        model (a torn write); see :func:`sb3_grpo.callbacks.latest_checkpoint` to find the newest complete one.
        """
        if isinstance(path, (str, os.PathLike)):
            from sb3_grpo.callbacks import is_complete_checkpoint

            path = os.fspath(path)
            candidates = [path] if path.endswith(".zip") else [path, path + ".zip"]
            found = next((c for c in candidates if os.path.isfile(c)), None)
            if found is None:
                raise FileNotFoundError(
                    f"no saved model at {' or '.join(map(repr, candidates))}; give the path of a file written by "
                    "model.save() or a checkpoint callback"
                )
            if not is_complete_checkpoint(found):
                raise ValueError(
                    f"{found!r} is not a complete saved model (truncated or corrupt, e.g. written by a process killed "
                    "mid-save without AtomicCheckpointCallback); load the newest complete checkpoint instead: "
                    "sb3_grpo.callbacks.latest_checkpoint(folder)"
                )
            path = found
        return super().load(
            path,
            env=env,
            device=device,
            custom_objects=custom_objects,
            print_system_info=print_system_info,
            force_reset=force_reset,
            **kwargs,
        )

    def learn(  # noqa: PYI019 (SB3's convention; typing.Self needs Python 3.11)
        self: SelfGRPO,
        total_timesteps: int,
        callback: MaybeCallback = None,
        log_interval: int = 1,
        tb_log_name: str = "GRPO",
        reset_num_timesteps: bool = True,
        progress_bar: bool = False,
    ) -> SelfGRPO:
        return super().learn(
            total_timesteps=total_timesteps,
            callback=callback,
            log_interval=log_interval,
            tb_log_name=tb_log_name,
            reset_num_timesteps=reset_num_timesteps,
            progress_bar=progress_bar,
        )


def _nanmean(values: list[float]) -> float:
    finite = [v for v in values if not np.isnan(v)]
    return float(np.mean(finite)) if finite else float("nan")
