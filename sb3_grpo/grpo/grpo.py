"""
GRPO: PPO with a gradient-variance penalty, an adaptive asymmetric clip and uniform-mixture exploration,
plus group-relative advantages (DeepSeekMath's GRPO, RLOO, self-critical) and KL to a frozen reference.

This module is the PPO skeleton (sb3-contrib's layout): ``__init__``, ``_setup_model``, ``collect_rollouts``,
``train``, ``learn``, ``load``. What is GRPO's own lives beside it: argument checks (:mod:`.validation`),
exploration (:mod:`.exploration`), group advantages (:mod:`.groups`), the KL-to-reference term (:mod:`.kl`),
non-finite handling (:mod:`.nonfinite`) and the update's statistics (:mod:`.stats`); the loss pieces are the pure
functions of :mod:`sb3_grpo.objectives`; buffers, the two update paths and the data-parallel seam are in
:mod:`sb3_grpo.common`.
"""

from __future__ import annotations

import math
import os
from typing import Any, ClassVar, TypeVar

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.base_class import maybe_make_env
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm
from stable_baselines3.common.policies import ActorCriticPolicy, BasePolicy
from stable_baselines3.common.type_aliases import GymEnv, MaybeCallback, Schedule
from stable_baselines3.common.utils import FloatSchedule, obs_as_tensor
from stable_baselines3.common.vec_env import VecEnv

from sb3_grpo import distributed
from sb3_grpo.common.batch_sources import make_batch_source, rollout_buffer_class_for
from sb3_grpo.common.checkpoints import existing_checkpoint
from sb3_grpo.common.data_parallel import make_data_parallel
from sb3_grpo.common.host_memory import release_free_heap
from sb3_grpo.common.carry_over import CarryOver
from sb3_grpo.grpo.exploration import explore_alpha_at
from sb3_grpo.common.groups import EpisodeGroupTracker, check_grouped_env, make_group_tracker
from sb3_grpo.grpo.kl import adapt_kl_coef, frozen_copy
from sb3_grpo.grpo.loss import LossTerms, minibatch_loss, stop_early
from sb3_grpo.common.nonfinite import raise_non_finite
from sb3_grpo.grpo.penalty import GradVarPenalty, select_parameters
from sb3_grpo.grpo.policies import CnnPolicy, MlpPolicy, MultiInputPolicy
from sb3_grpo.common.rollout import RolloutExtras, bootstrap_truncated, env_actions
from sb3_grpo.grpo.stats import TrainStats, record_update
from sb3_grpo.grpo.validation import (
    check_buffer_for_kl,
    check_carry_over,
    check_grpo_args,
    check_ppo_batching,
    warn_if_exploration_clips,
)
from sb3_grpo.objectives import uniform_log_prob
from sb3_grpo.policies.models import portable_policy_kwargs

SelfGRPO = TypeVar("SelfGRPO", bound="GRPO")


class GRPO(OnPolicyAlgorithm):
    """
    GRPO: gradient-regularized PPO with adaptive clipping, mixed exploration and group advantages.

    A drop-in for SB3's :class:`~stable_baselines3.PPO` (same arguments, defaults, logging, save/load)
    with these additions, each documented with its formula in :mod:`sb3_grpo.objectives`:

    - **Gradient-variance penalty** (``grad_var_coef = beta``): minimize ``pg_loss + beta * Var``, where
      ``Var = (1/K) sum_k ||g_k - mean_j g_j||^2`` over the gradients of the clipped surrogate of ``K =
      grad_var_slices`` slices of the minibatch, over ``grad_var_params``; differentiated by double backprop
      (:mod:`sb3_grpo.grpo.penalty`, :func:`~sb3_grpo.objectives.gradient_variance`). For LMs restrict
      ``grad_var_params`` to a few layers: the graph of ``K`` gradients is kept until the backward.
    - **Adaptive clip** (``adaptive_clip = (s_pos, s_neg)``): per-sample range ``eps * s_pos`` where the
      (normalized) advantage is positive, ``eps * s_neg`` otherwise; ``eps`` follows ``clip_range`` and its schedule.
    - **Mixed exploration** (``explore_alpha``, ``explore_fraction``): act with ``(1 - alpha) * pi + alpha *
      uniform``, ``alpha`` decaying linearly to 0 over the first ``explore_fraction`` of training; the rollout stores
      the mixture's log-density, so the PPO ratio is an honest importance weight (:mod:`sb3_grpo.grpo.exploration`,
      which also says why ``alpha`` above ``eps_pos / (1 + eps_pos)`` is warned about). Discrete, MultiDiscrete,
      MultiBinary and bounded Box actions.
    - **Advantage** (``advantage``): ``"gae"`` (PPO), or per completed group of episodes ``"group"``
      (DeepSeekMath, arXiv 2402.03300: ``(r - mean_g) / (std_g + eps)``), ``"rloo"`` (Ahmadian et al. 2024,
      arXiv 2402.14740) or ``"self_critical"`` (Rennie et al. 2017: the greedy member's reward is the baseline;
      env ``i`` with ``i % group_size == 0`` acts greedily and is not trained on). Group forms train no critic,
      skip minibatch advantage normalization, and need an env that reports ``group_size > 1`` and puts
      ``info["group_id"]`` in every step's info (:mod:`sb3_grpo.common.groups`).
    - **KL to a reference** (``kl_coef``, ``kl_target``): ``kl_coef * KL`` is added to the loss, the k3 estimate
      importance-weighted by ``pi_old / mu`` under mixed exploration, with Ziegler et al.'s controller of
      ``kl_coef`` when ``kl_target`` is set (:mod:`sb3_grpo.grpo.kl`). The reference is a frozen copy of the initial
      policy, or the policy's own ``reference_evaluate_actions`` (a LoRA model with its adapters off).

    Drop-in with its defaults on: every action space SB3 supports (Box of any shape included), the classic-control
    envs, and SB3's identity checks, where it ends at least where ``PPO`` does (``tests/test_dropin.py``); a
    ``batch_size`` below ``grad_var_slices`` warns and measures the penalty over fewer slices (none below 2 samples).

    With ``grad_var_coef=0, adaptive_clip=None, explore_alpha=0, advantage="gae", kl_coef=0`` every
    operation (and every random draw) is the one SB3's ``PPO`` performs, so the parameters after
    ``learn()`` are identical to PPO's for the same seed (tested).

    The update has two paths, chosen once at setup (:mod:`sb3_grpo.common.batch_sources`): SB3's per-transition
    minibatches, or, for a ``CausalLMPolicy`` on a text env, the text fast path's whole sequences with one forward
    each (:class:`~sb3_grpo.common.buffers.SequenceRolloutBuffer`).

    Non-finite rewards, advantages, losses or gradients raise a ``RuntimeError`` naming the quantity and where,
    before the optimizer touches the weights (``nonfinite="raise"``); ``nonfinite="skip"`` drops and counts them
    instead (:mod:`sb3_grpo.common.nonfinite`). Either way no NaN reaches the weights.

    Launched with ``torchrun``, ``GRPO`` trains data-parallel (:mod:`sb3_grpo.distributed`): rank 0's weights are
    broadcast, rank ``r`` is seeded with ``seed + 1000 * r``, gradients are averaged, ``target_kl`` and the KL
    controller use cross-rank means, and only rank 0 logs and saves. The update meets the other ranks only through
    :mod:`sb3_grpo.common.data_parallel`; a ``GRPO`` built outside ``torchrun`` never touches ``torch.distributed``.

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
        :class:`~sb3_grpo.common.buffers.SequenceRolloutBuffer` for a ``CausalLMPolicy`` on a text env, else GRPO's
        subclass of SB3's ``RolloutBuffer`` / ``DictRolloutBuffer``; SB3's two stock classes, passed here, are
        replaced by those subclasses too (same data and minibatches, plus the policy's own log-probs). Another
        class works unless the KL term must be importance-weighted (``kl_coef > 0`` and ``explore_alpha > 0``),
        which needs a subclass of :class:`~sb3_grpo.common.buffers.PolicyLogProbMixin`.
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
    :param grad_var_normalize: penalize ``Var / sg(mean_k ||g_k||^2)`` (scale-free, in [0, 1]) instead of ``Var``
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
    :param carry_over: group forms on the text fast path: train the steps of an episode whose group has not finished
        when the rollout ends in the first update after it has, with the episode's advantage, instead of with
        advantage 0 in their own rollout's update (:mod:`sb3_grpo.common.carry_over`). Off: GRPO's updates use only their own
        rollout, as PPO's do.
    """

    policy_aliases: ClassVar[dict[str, type[BasePolicy]]] = {
        "MlpPolicy": MlpPolicy,
        "CnnPolicy": CnnPolicy,
        "MultiInputPolicy": MultiInputPolicy,
    }

    # Over 80 lines: PPO's signature and its super().__init__ call, kept in SB3's form so that the two read side by side
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
        grad_var_normalize: bool = False,
        adaptive_clip: tuple[float, float] | None = (1.1, 0.9),
        explore_alpha: float = 0.05,
        explore_fraction: float = 0.5,
        advantage: str = "gae",
        kl_coef: float = 0.0,
        kl_target: float | None = None,
        grad_norm_warn: float | None = 1000.0,
        nonfinite: str = "raise",
        carry_over: bool = False,
    ):
        # every argument (PPO's and GRPO's: type, finiteness, range) is checked first, before any model is built
        adaptive_clip = check_grpo_args(locals())
        # torch.distributed (torchrun): one GPU per rank, quiet ranks > 0 (see sb3_grpo.distributed); outside
        # torchrun this is the single-process seam and torch.distributed is never touched. GRPO.load builds with
        # _init_setup_model=False and makes no collective call (rank 0 alone may load a model).
        self._sync_ranks_at_setup = _init_setup_model
        on_cpu = str(device) != "auto" and th.device(device).type == "cpu"
        self._data_parallel = make_data_parallel(backend="gloo" if on_cpu else None)
        device = self._data_parallel.device(device)
        verbose = verbose if self._data_parallel.is_main else 0

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
        check_ppo_batching(
            batch_size, self.n_steps, self.env.num_envs if self.env is not None else None, normalize_advantage
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
        self.grad_var_normalize = bool(grad_var_normalize)
        self.adaptive_clip = adaptive_clip
        self.explore_alpha = float(explore_alpha)
        self.explore_fraction = float(explore_fraction)
        self.advantage = advantage
        self.kl_coef = float(kl_coef)
        self.kl_target = kl_target
        self.grad_norm_warn = grad_norm_warn
        self.nonfinite = nonfinite
        self.carry_over = carry_over

        if self.explore_alpha > 0 and getattr(self, "action_space", None) is not None:
            # raises a clear ValueError for unbounded Box or unsupported action spaces
            uniform_log_prob(self.action_space)
        warn_if_exploration_clips(self.explore_alpha, self.clip_range, self.adaptive_clip)
        if self.advantage != "gae" and self.env is not None:
            # warns when n_steps < the episodes' length (unless carry_over trains those steps later)
            check_grouped_env(self.env, self.advantage, None if carry_over else self.n_steps)

        if _init_setup_model:
            self._setup_model()

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

    def _setup_model(self) -> None:
        self.rollout_buffer_class = rollout_buffer_class_for(
            self.rollout_buffer_class, self.policy_class, self.observation_space, self.action_space
        )
        check_buffer_for_kl(self.rollout_buffer_class, self.kl_coef, self.explore_alpha)
        check_carry_over(self.rollout_buffer_class, getattr(self, "carry_over", False))
        # GRPO.load() restores the saved exploration RNG before calling _setup_model: keep its state
        loaded_explore_rng = self.__dict__.get("_explore_rng")
        # torch.distributed: rank r seeds with seed + 1000 * r; rank 0's weights are broadcast below
        data_parallel = self._data_parallel
        self.seed = data_parallel.seed(self.seed)
        super()._setup_model()
        # a model object in policy_kwargs is saved as its config (the weights are in the state dict), not pickled
        self.policy_kwargs = portable_policy_kwargs(self.policy_kwargs, getattr(self.policy, "lm_spec", None))
        if not data_parallel.is_main:
            self.set_logger(distributed.null_logger())
        if getattr(self, "_sync_ranks_at_setup", False):
            data_parallel.start(self.policy, self.env.num_envs if self.env is not None else 0)

        # Initialize schedules for policy/value clipping (as PPO)
        self.clip_range = FloatSchedule(self.clip_range)
        if self.clip_range_vf is not None:
            if isinstance(self.clip_range_vf, (float, int)):
                assert self.clip_range_vf > 0, "`clip_range_vf` must be positive, pass `None` to deactivate vf clipping"
            self.clip_range_vf = FloatSchedule(self.clip_range_vf)

        if self.adaptive_clip is not None:  # saved as a JSON list
            self.adaptive_clip = (float(self.adaptive_clip[0]), float(self.adaptive_clip[1]))
        # GRPO state; nothing here draws from a random generator, so PPO's RNG stream is untouched
        params = select_parameters(self.policy, self.grad_var_params) if self.grad_var_coef > 0 else []
        self._grad_var = GradVarPenalty(params, normalize=getattr(self, "grad_var_normalize", False))
        # the KL reference: a frozen copy of the initial policy, unless the policy has its own (LoRA, adapters off)
        own_reference = hasattr(self.policy, "reference_evaluate_actions")
        self.ref_policy = frozen_copy(self.policy) if self.kl_coef > 0 and not own_reference else None
        self.batch_source = make_batch_source(
            self.rollout_buffer_class,
            self.policy,
            self.ref_policy,
            discrete=isinstance(self.action_space, spaces.Discrete),
            kl=self.kl_coef > 0,
        )
        if isinstance(loaded_explore_rng, np.random.Generator) and data_parallel.world_size == 1:
            self._explore_rng = loaded_explore_rng
        else:
            self._explore_rng = np.random.default_rng(self.seed)
        self._rollout_explore_alpha = 0.0
        self._group_tracker: EpisodeGroupTracker | None = None
        self._carry = CarryOver() if getattr(self, "carry_over", False) else None
        self._grad_norm_warned = False
        self._skipped_nonfinite = 0

    def save(self, *args: Any, **kwargs: Any) -> None:
        """SB3's ``save``; under ``torch.distributed`` only rank 0 writes (the weights are the same everywhere)."""
        if not self._data_parallel.is_main:
            return
        super().save(*args, **kwargs)

    def set_random_seed(self, seed: int | None = None) -> None:
        """SB3's ``set_random_seed`` (Python, NumPy, torch, action space, env), plus GRPO's exploration RNG.

        :param seed: The seed (``None``: nothing is reseeded, as in SB3).
        """
        super().set_random_seed(seed)
        if seed is not None:
            self._explore_rng = np.random.default_rng(seed)

    def _excluded_save_params(self) -> list[str]:
        own = [
            "ref_policy",
            "batch_source",
            "_data_parallel",
            "_group_tracker",
            "_grad_var",
            "_sync_ranks_at_setup",
            "_carry",
        ]
        return [*super()._excluded_save_params(), *own]

    def _get_torch_save_params(self) -> tuple[list[str], list[str]]:
        state_dicts, tensors = super()._get_torch_save_params()
        if getattr(self, "ref_policy", None) is not None:
            state_dicts = [*state_dicts, "ref_policy"]
        return state_dicts, tensors

    # ------------------------------------------------------------------------------------------------------
    # Rollout
    # ------------------------------------------------------------------------------------------------------
    def current_explore_alpha(self) -> float:
        """The exploration mixture's weight now (:func:`~sb3_grpo.grpo.exploration.explore_alpha_at`)."""
        return explore_alpha_at(self.explore_alpha, self.explore_fraction, self._current_progress_remaining)

    def _rollout_group_tracker(self, env: VecEnv) -> EpisodeGroupTracker | None:
        """The group advantages' tracker for ``env`` (kept across rollouts), or ``None`` for GAE."""
        if self.advantage == "gae":
            return None
        if self._group_tracker is None or self._group_tracker.n_envs != env.num_envs:
            self._group_tracker = make_group_tracker(env, self.advantage)
        return self._group_tracker

    # Over 80 lines: SB3's OnPolicyAlgorithm.collect_rollouts step for step, kept in its shape so that the two read side
    # by side (the PPO equivalence rests on it); GRPO's additions are one call each into RolloutExtras
    def collect_rollouts(
        self,
        env: VecEnv,
        callback: BaseCallback,
        rollout_buffer: RolloutBuffer,
        n_rollout_steps: int,
    ) -> bool:
        """
        Collect experiences and fill a ``RolloutBuffer``: SB3's ``OnPolicyAlgorithm.collect_rollouts`` step for step
        (same calls, same order), plus GRPO's extras (:class:`~sb3_grpo.common.rollout.RolloutExtras`).

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
        # Sample new weights for the state dependent exploration
        if self.use_sde:
            self.policy.reset_noise(env.num_envs)
        extras = RolloutExtras.start(self, env, rollout_buffer, n_rollout_steps)

        callback.on_rollout_start()

        while n_steps < n_rollout_steps:
            if self.use_sde and self.sde_sample_freq > 0 and n_steps % self.sde_sample_freq == 0:
                # Sample a new noise matrix
                self.policy.reset_noise(env.num_envs)

            with th.no_grad():
                # Convert to pytorch tensor or to TensorDict
                obs_tensor = obs_as_tensor(self._last_obs, self.device)  # type: ignore[arg-type]
                actions, values, log_probs, policy_log_probs = extras.sample(
                    self.policy, obs_tensor, n_steps, self.num_timesteps, self._n_updates
                )
            actions = actions.cpu().numpy()

            # Rescale and perform action
            clipped_actions = env_actions(self.policy, self.action_space, actions)
            new_obs, rewards, dones, infos = env.step(clipped_actions)
            rewards = extras.check_rewards(rewards, dones, infos, n_steps, self.num_timesteps, self._n_updates)

            self.num_timesteps += env.num_envs

            # Give access to local variables
            callback.update_locals(locals())
            if not callback.on_step():
                return extras.stop()  # False, as SB3 returns (and no reward is left being scored)

            self._update_info_buffer(infos, dones)
            extras.record_step(n_steps, rewards, dones, infos)
            n_steps += 1

            if isinstance(self.action_space, spaces.Discrete):
                # Reshape in case of discrete action
                actions = actions.reshape(-1, 1)

            if extras.needs_values:  # GAE only: group advantages use the rewards as they are
                bootstrap_truncated(self.policy, self.gamma, rewards, dones, infos, extras.batched_bootstrap)

            rollout_buffer.add(
                self._last_obs,  # type: ignore[arg-type]
                actions,
                rewards,
                self._last_episode_starts,  # type: ignore[arg-type]
                values,
                log_probs,
                **extras.buffer_extra(policy_log_probs),
            )
            self._last_obs = new_obs  # type: ignore[assignment]
            self._last_episode_starts = dones

        with th.no_grad():
            # Compute value for the last timestep (GAE only: group advantages do not bootstrap)
            if extras.needs_values:
                values = self.policy.predict_values(obs_as_tensor(new_obs, self.device))  # type: ignore[arg-type]
            else:
                values = th.zeros((env.num_envs, 1), device=self.device)

        extras.land_rewards(rollout_buffer)  # rewards scored in the background, before returns and advantages
        rollout_buffer.compute_returns_and_advantage(last_values=values, dones=dones)
        extras.finish(rollout_buffer, self.logger, self.num_timesteps, self._n_updates, self.advantage)

        callback.update_locals(locals())

        callback.on_rollout_end()

        return True

    # ------------------------------------------------------------------------------------------------------
    # Update
    # ------------------------------------------------------------------------------------------------------
    def _optimizer_step(self, terms: LossTerms | None, epoch: int, stats: TrainStats) -> None:
        """Backward, gradient average over the ranks, clipping and the optimizer step, unless the loss or the
        gradient is non-finite (``nonfinite``: raise, or skip and count). ``terms=None``: an idle step."""
        if terms is None or not math.isfinite(terms.value):
            if terms is not None and self.nonfinite != "skip":
                raise_non_finite("loss", self._n_updates, epoch, self.num_timesteps, terms.details)
            if terms is not None:  # no step on this minibatch; counted in train/skipped_nonfinite
                self._skipped_nonfinite += 1
            self._data_parallel.idle_step(self.policy, self.max_grad_norm)  # join the other ranks' step
            return
        self.policy.optimizer.zero_grad()
        terms.loss.backward()
        if not self.policy.optimizer.state:  # the first step allocates the optimizer's state: the update's peak
            release_free_heap()
        self._data_parallel.average_gradients(self.policy.parameters())
        # Clip grad norm (the returned norm is the one before clipping)
        grad_norm = th.nn.utils.clip_grad_norm_(self.policy.parameters(), self.max_grad_norm).item()
        if not math.isfinite(grad_norm):
            if self.nonfinite != "skip":
                details = {**terms.details, "grad_norm": grad_norm}
                raise_non_finite("gradient", self._n_updates, epoch, self.num_timesteps, details)
            self.policy.optimizer.zero_grad()  # drop the gradient: the weights and Adam's moments stay finite
            self._skipped_nonfinite += 1
            return
        stats.grad_norms.append(grad_norm)
        self.policy.optimizer.step()

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
        clip_range_vf = None
        if self.clip_range_vf is not None:
            clip_range_vf = self.clip_range_vf(self._current_progress_remaining)  # type: ignore[operator]

        stats = TrainStats()
        continue_training = True
        # train for n_epochs epochs
        for epoch in range(self.n_epochs):
            stats.approx_kl_divs = []
            # approx_kl: every epoch's for target_kl, else only the last epoch's (the only ones logged, as PPO logs)
            measure_kl = self.target_kl is not None or epoch == self.n_epochs - 1
            # Do a complete pass on the rollout buffer (None: a data-parallel rank's idle step)
            for minibatch in self._data_parallel.epoch(
                self.batch_source.minibatches(self.rollout_buffer, self.batch_size)
            ):
                terms = None
                if minibatch is not None:
                    terms = minibatch_loss(self, minibatch, clip_range, clip_range_vf, stats, measure_kl)
                if stop_early(self, terms, epoch):
                    continue_training = False
                    break
                self._optimizer_step(terms, epoch, stats)

            self._n_updates += 1
            if not continue_training:
                break

        if self.kl_coef > 0 and self.kl_target is not None:
            # Adaptive KL controller (Ziegler et al. 2019, arXiv 1909.08593, section 2.2), the same on every rank
            kl_mean = self._data_parallel.mean(float(np.sum(stats.kl_refs)), len(stats.kl_refs))
            self.kl_coef = adapt_kl_coef(self.kl_coef, kl_mean, self.kl_target)
        record_update(self, stats, clip_range, clip_range_vf)

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
            path = existing_checkpoint(path)
        if isinstance(env, str):  # an env id, as the constructor takes it (SB3's load wants an env object)
            env = maybe_make_env(env, 0)
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
