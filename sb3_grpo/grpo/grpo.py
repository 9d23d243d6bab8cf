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

import copy
import os
import warnings
from typing import Any, ClassVar, NamedTuple, TypeVar

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm
from stable_baselines3.common.policies import ActorCriticPolicy, BasePolicy
from stable_baselines3.common.type_aliases import GymEnv, MaybeCallback, Schedule
from stable_baselines3.common.utils import FloatSchedule, explained_variance, obs_as_tensor
from stable_baselines3.common.vec_env import VecEnv
from torch.nn import functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from sb3_grpo import distributed
from sb3_grpo.common.batch_sources import make_batch_source, rollout_buffer_class_for
from sb3_grpo.common.buffers import PolicyLogProbMixin
from sb3_grpo.common.checkpoints import existing_checkpoint
from sb3_grpo.common.data_parallel import make_data_parallel
from sb3_grpo.common.type_aliases import Minibatch
from sb3_grpo.grpo.exploration import explore_alpha_at, sample_actions
from sb3_grpo.grpo.groups import EpisodeGroupTracker, check_grouped_env, make_group_tracker
from sb3_grpo.grpo.kl import adapt_kl_coef, kl_to_reference
from sb3_grpo.grpo.nonfinite import NonFiniteEpisodes, check_advantages, raise_non_finite
from sb3_grpo.grpo.penalty import GradVarPenalty, select_parameters
from sb3_grpo.grpo.policies import CnnPolicy, MlpPolicy, MultiInputPolicy
from sb3_grpo.grpo.stats import TrainStats
from sb3_grpo.grpo.validation import (
    check_buffer_for_kl,
    check_grpo_args,
    check_ppo_batching,
    warn_if_exploration_clips,
)
from sb3_grpo.objectives import (
    adaptive_clip_range,
    clip_fraction,
    clipped_surrogate,
    pearson_corr,
    uniform_log_prob,
)

SelfGRPO = TypeVar("SelfGRPO", bound="GRPO")


class _LossTerms(NamedTuple):
    """One minibatch's loss and what the step after it needs (the KL estimate for early stopping, the log)."""

    loss: th.Tensor
    approx_kl: np.ndarray
    details: dict[str, float]


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
      :class:`~sb3_grpo.grpo.groups.EpisodeGroupTracker` for which steps get an advantage).
    - **KL to a reference** (``kl_coef``, ``kl_target``): ``kl_coef * KL`` is added to the loss, with
      ``KL = (1/N) sum_i w_i k3_i`` over the minibatch's ``N`` actions, ``k3 = exp(ref - logp) - (ref -
      logp) - 1`` at the current policy (Schulman 2020, "Approximating KL Divergence"; DeepSeekMath eq. 4)
      and ``w = pi_old(a|s) / mu(a|s)``, ``mu = (1 - alpha) * pi_old + alpha * uniform`` the distribution the
      action was drawn from (see :func:`~sb3_grpo.objectives.kl_k3_weighted_mean`). k3 is unbiased only for
      actions sampled from the policy; the importance weight makes the mean over mixture samples an
      unbiased estimate of the one over the policy's own samples (``E_mu[w f] = E_pi_old[f]``), so uniformly
      explored tokens, which the policy would rarely pick, count for little instead of dominating. The
      rollout buffer stores both log-probs per action, ``log_probs`` (``log mu``, used by the PPO ratio) and
      ``policy_log_probs`` (``log pi_old``): :class:`~sb3_grpo.common.buffers.GRPORolloutBuffer` /
      :class:`~sb3_grpo.common.buffers.GRPODictRolloutBuffer`, which GRPO builds in place of SB3's ``RolloutBuffer``
      / ``DictRolloutBuffer``, and :class:`~sb3_grpo.common.buffers.SequenceRolloutBuffer`. With ``alpha = 0`` every
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
    own steps. See :mod:`sb3_grpo.distributed`; the update meets the other ranks only through
    :mod:`sb3_grpo.common.data_parallel`, and a ``GRPO`` built outside ``torchrun`` never touches ``torch.distributed``.

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
        "MlpPolicy": MlpPolicy,
        "CnnPolicy": CnnPolicy,
        "MultiInputPolicy": MultiInputPolicy,
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
        # GRPO's own arguments first: cheap, and before any model is built
        adaptive_clip = check_grpo_args(
            advantage=advantage,
            nonfinite=nonfinite,
            grad_var_coef=grad_var_coef,
            grad_var_slices=grad_var_slices,
            batch_size=batch_size,
            kl_coef=kl_coef,
            kl_target=kl_target,
            explore_alpha=explore_alpha,
            explore_fraction=explore_fraction,
            adaptive_clip=adaptive_clip,
        )
        # torch.distributed (torchrun): one GPU per rank, quiet ranks > 0 (see sb3_grpo.distributed); outside
        # torchrun this is the single-process seam and torch.distributed is never touched. GRPO.load builds with
        # _init_setup_model=False and makes no collective call (rank 0 alone may load a model).
        self._sync_ranks_at_setup = _init_setup_model
        on_cpu = str(device) != "auto" and th.device(device).type == "cpu"
        self._data_parallel = make_data_parallel(backend="gloo" if on_cpu else None)
        if self._data_parallel.world_size > 1:
            device = distributed.local_device(device)
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
        check_ppo_batching(batch_size, self.n_steps, self.env.num_envs if self.env is not None else None, normalize_advantage)
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
        warn_if_exploration_clips(self.explore_alpha, self.clip_range, self.adaptive_clip)
        if self.advantage != "gae" and self.env is not None:
            check_grouped_env(self.env, self.advantage)

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
        # GRPO.load() restores the saved exploration RNG before calling _setup_model: keep its state
        loaded_explore_rng = self.__dict__.get("_explore_rng")
        # torch.distributed: rank r seeds with seed + 1000 * r; rank 0's weights are broadcast below
        data_parallel = self._data_parallel
        self.seed = data_parallel.seed(self.seed)
        super()._setup_model()
        self._keep_model_out_of_saved_kwargs()
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
        self._grad_var = GradVarPenalty(params)
        self.ref_policy = None
        if self.kl_coef > 0 and not hasattr(self.policy, "reference_evaluate_actions"):
            self.ref_policy = copy.deepcopy(self.policy)
            self.ref_policy.set_training_mode(False)
            for param in self.ref_policy.parameters():
                param.requires_grad_(False)
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
        self._grad_norm_warned = False
        self._skipped_nonfinite = 0

    def _keep_model_out_of_saved_kwargs(self) -> None:
        """A model *object* in ``policy_kwargs["model"]`` is replaced by the policy's config spec (a new dict; the
        user's own is left alone), so SB3 saves JSON, not a pickled Hugging Face model; the weights are in the saved
        state dict. Paths and specs stay as they are."""
        model = self.policy_kwargs.get("model") if isinstance(self.policy_kwargs, dict) else None
        spec = getattr(self.policy, "lm_spec", None)
        if model is not None and spec is not None and not isinstance(model, (str, os.PathLike, dict)):
            self.policy_kwargs = {**self.policy_kwargs, "model": spec}

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
        return [
            *super()._excluded_save_params(),
            "ref_policy",
            "batch_source",
            "_data_parallel",
            "_group_tracker",
            "_grad_var",
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
        """The exploration mixture's weight now (:func:`~sb3_grpo.grpo.exploration.explore_alpha_at`)."""
        return explore_alpha_at(self.explore_alpha, self.explore_fraction, self._current_progress_remaining)

    def _rollout_group_tracker(self, env: VecEnv) -> EpisodeGroupTracker | None:
        """The group advantages' tracker for ``env`` (kept across rollouts), or ``None`` for GAE."""
        if self.advantage == "gae":
            return None
        if self._group_tracker is None or self._group_tracker.n_envs != env.num_envs:
            self._group_tracker = make_group_tracker(env, self.advantage)
        return self._group_tracker

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
        nonfinite = NonFiniteEpisodes(self.nonfinite, env.num_envs, n_rollout_steps)
        # Sample new weights for the state dependent exploration
        if self.use_sde:
            self.policy.reset_noise(env.num_envs)

        alpha = self.current_explore_alpha()
        self._rollout_explore_alpha = alpha
        tracker = self._rollout_group_tracker(env)
        if tracker is not None:
            tracker.reset_rollout(n_rollout_steps)
        greedy_envs = tracker.greedy_envs if tracker is not None and self.advantage == "self_critical" else None
        # the policy's own log-probs beside the behaviour's, for the importance-weighted KL (GRPO's buffers)
        stores_policy_log_prob = isinstance(rollout_buffer, PolicyLogProbMixin)

        completion_lengths: list[int] = []  # text envs: tokens of each completion that ended in this rollout
        callback.on_rollout_start()

        while n_steps < n_rollout_steps:
            if self.use_sde and self.sde_sample_freq > 0 and n_steps % self.sde_sample_freq == 0:
                # Sample a new noise matrix
                self.policy.reset_noise(env.num_envs)

            with th.no_grad():
                # Convert to pytorch tensor or to TensorDict
                obs_tensor = obs_as_tensor(self._last_obs, self.device)  # type: ignore[arg-type]
                actions, values, log_probs, policy_log_probs = sample_actions(
                    self.policy, obs_tensor, self.action_space, alpha, greedy_envs, self._explore_rng
                )
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
            rewards = nonfinite.check_rewards(rewards, dones, infos, n_steps, self.num_timesteps, self._n_updates)

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

            extra = {"policy_log_prob": policy_log_probs} if stores_policy_log_prob else {}
            rollout_buffer.add(
                self._last_obs,  # type: ignore[arg-type]
                actions,
                rewards,
                self._last_episode_starts,  # type: ignore[arg-type]
                values,
                log_probs,
                **extra,
            )
            self._last_obs = new_obs  # type: ignore[assignment]
            self._last_episode_starts = dones

        with th.no_grad():
            # Compute value for the last timestep
            values = self.policy.predict_values(obs_as_tensor(new_obs, self.device))  # type: ignore[arg-type]

        rollout_buffer.compute_returns_and_advantage(last_values=values, dones=dones)
        self._finish_rollout(rollout_buffer, tracker, nonfinite, completion_lengths)

        callback.update_locals(locals())

        callback.on_rollout_end()

        return True

    def _finish_rollout(
        self,
        rollout_buffer: RolloutBuffer,
        tracker: EpisodeGroupTracker | None,
        nonfinite: NonFiniteEpisodes,
        completion_lengths: list[int],
    ) -> None:
        """After GAE: group advantages in place of GAE's, episodes with non-finite rewards dropped, the check that
        every advantage is finite, and the rollout's GRPO logs."""
        if completion_lengths:
            self.logger.record("rollout/completion_length", float(np.mean(completion_lengths)))
        if tracker is not None:
            group_adv, stats = tracker.compute()
            rollout_buffer.advantages[:] = group_adv
            self.logger.record("rollout/group_reward_mean", stats["group_reward_mean"])
            self.logger.record("rollout/group_reward_std", stats["group_reward_std"])
            self.logger.record("rollout/n_complete_groups", stats["n_groups"])
            self.logger.record("rollout/frac_steps_nonzero_advantage", stats["frac_steps_nonzero_advantage"])
        nonfinite.drop(rollout_buffer)
        if self.nonfinite == "skip":
            self.logger.record("rollout/skipped_episodes", nonfinite.dropped_episodes)
        check_advantages(rollout_buffer, self.num_timesteps, self._n_updates, self.advantage)

    # ------------------------------------------------------------------------------------------------------
    # Update
    # ------------------------------------------------------------------------------------------------------
    def _loss(
        self, minibatch: Minibatch, clip_range: float, clip_range_vf: float | None, stats: TrainStats
    ) -> _LossTerms:
        """PPO's loss of one minibatch plus GRPO's terms (penalty, KL), with its statistics recorded in ``stats``."""
        n_slices = min(self.grad_var_slices, len(minibatch.actions))
        use_grad_var = self.grad_var_coef > 0 and n_slices >= 2
        use_critic = self.advantage == "gae"
        if use_grad_var:
            # the fused attention kernels (flash / memory-efficient) have no double backward: record
            # attention with the math kernel so that Var can be differentiated (no-op for MLPs)
            with sdpa_kernel(SDPBackend.MATH):
                values, log_prob, entropy = self.batch_source.evaluate(minibatch)
        else:
            values, log_prob, entropy = self.batch_source.evaluate(minibatch)
        # Normalize advantage (GAE only: group advantages are already normalized, and the steps
        # that have no complete group must keep advantage 0)
        advantages = minibatch.advantages
        # Normalization does not make sense if mini batchsize == 1, see GH issue #325
        if self.normalize_advantage and use_critic and len(advantages) > 1:
            advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)

        # Per-sample clip range: eps (PPO) or eps * scale(sign A) (adaptive clip)
        eps = clip_range if self.adaptive_clip is None else adaptive_clip_range(advantages, clip_range, self.adaptive_clip)

        # ratio between old and new policy, should be one at the first iteration
        # (not with mixed exploration: the old log-prob is the mixture's)
        ratio = th.exp(log_prob - minibatch.old_log_prob)
        # clipped surrogate loss
        surrogate = clipped_surrogate(ratio, advantages, eps)
        policy_loss = -surrogate.mean()

        stats.pg_losses.append(policy_loss.item())
        stats.clip_fractions.append(clip_fraction(ratio, eps))
        with th.no_grad():
            positive = advantages > 0
            stats.clip_fractions_pos.append(clip_fraction(ratio, eps, positive))
            stats.clip_fractions_neg.append(clip_fraction(ratio, eps, ~positive))

        # Entropy loss favor exploration (approximated when there is no analytical form)
        entropy_loss = -th.mean(-log_prob) if entropy is None else -th.mean(entropy)
        stats.entropy_losses.append(entropy_loss.item())
        if use_critic:
            if clip_range_vf is None:
                values_pred = values  # No clipping
            else:
                # Clip the difference between old and new value; NOTE: this depends on the reward scaling
                delta = th.clamp(values - minibatch.old_values, -clip_range_vf, clip_range_vf)
                values_pred = minibatch.old_values + delta
            # Value loss using the TD(gae_lambda) target
            value_loss = F.mse_loss(minibatch.returns, values_pred)
            stats.value_losses.append(value_loss.item())
            loss = policy_loss + self.ent_coef * entropy_loss + self.vf_coef * value_loss
        else:
            # group forms: no critic (DeepSeekMath GRPO), the value head is not trained
            loss = policy_loss + self.ent_coef * entropy_loss

        details = {"pg_loss": policy_loss.item()}
        if use_grad_var:
            # Var[grad L_CLIP] over K contiguous slices of the (randomly permuted) minibatch; its
            # gradient comes from double backprop when loss.backward() runs
            grad_var = self._grad_var([-part.mean() for part in th.tensor_split(surrogate, n_slices)])
            stats.grad_vars.append(grad_var.item())
            details["grad_var"] = stats.grad_vars[-1]
            loss = loss + self.grad_var_coef * grad_var
        if self.kl_coef > 0:
            # (1/N) sum w * k3 with w = pi_old / mu: the KL of the policy's own samples, from the
            # mixture's (exactly the plain k3 mean when alpha = 0); the log and the controller use it too
            kl_ref = kl_to_reference(
                self.batch_source,
                minibatch,
                log_prob,
                self._rollout_explore_alpha,
                type(self.rollout_buffer).__name__,
            )
            stats.kl_refs.append(kl_ref.item())
            details["kl_ref"] = stats.kl_refs[-1]
            loss = loss + self.kl_coef * kl_ref

        # Calculate approximate form of reverse KL Divergence for early stopping
        # see issue #417: https://github.com/DLR-RM/stable-baselines3/issues/417
        # and discussion in PR #419: https://github.com/DLR-RM/stable-baselines3/pull/419
        # and Schulman blog: http://joschu.net/blog/kl-approx.html
        with th.no_grad():
            log_ratio = log_prob - minibatch.old_log_prob
            approx_kl_div = th.mean((th.exp(log_ratio) - 1) - log_ratio).cpu().numpy()
            stats.approx_kl_divs.append(approx_kl_div)
        stats.last_loss = loss.item()
        return _LossTerms(loss, approx_kl_div, details)

    def _stop_early(self, terms: _LossTerms | None, epoch: int) -> bool:
        """``target_kl``: stop the epochs when ``approx_kl > 1.5 * target_kl`` (the mean over the ranks, so all stop
        together; an idle step, ``terms=None``, adds nothing to the mean)."""
        if self.target_kl is None:
            return False
        if terms is None:
            approx_kl_div = self._data_parallel.mean(0.0, 0.0)
        else:
            approx_kl_div = self._data_parallel.mean(terms.approx_kl)
        if approx_kl_div > 1.5 * self.target_kl:
            if self.verbose >= 1 and terms is not None:
                print(f"Early stopping at step {epoch} due to reaching max kl: {approx_kl_div:.2f}")
            return True
        return False

    def _optimizer_step(self, terms: _LossTerms | None, epoch: int, stats: TrainStats) -> None:
        """Backward, gradient average over the ranks, clipping and the optimizer step, unless the loss or the
        gradient is non-finite (``nonfinite``: raise, or skip and count). ``terms=None``: an idle step."""
        if terms is None or not th.isfinite(terms.loss):
            if terms is not None and self.nonfinite != "skip":
                raise_non_finite("loss", self._n_updates, epoch, self.num_timesteps, terms.details)
            if terms is not None:  # no step on this minibatch; counted in train/skipped_nonfinite
                self._skipped_nonfinite += 1
            self._data_parallel.idle_step(self.policy, self.max_grad_norm)  # join the other ranks' step
            return
        self.policy.optimizer.zero_grad()
        terms.loss.backward()
        self._data_parallel.average_gradients(self.policy.parameters())
        # Clip grad norm (the returned norm is the one before clipping)
        grad_norm = th.nn.utils.clip_grad_norm_(self.policy.parameters(), self.max_grad_norm)
        if not th.isfinite(grad_norm):
            if self.nonfinite != "skip":
                raise_non_finite(
                    "gradient", self._n_updates, epoch, self.num_timesteps, {**terms.details, "grad_norm": grad_norm.item()}
                )
            self.policy.optimizer.zero_grad()  # drop the gradient: the weights and Adam's moments stay finite
            self._skipped_nonfinite += 1
            return
        stats.grad_norms.append(grad_norm.item())
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
            # Do a complete pass on the rollout buffer (None: a data-parallel rank's idle step)
            for minibatch in self._data_parallel.epoch(self.batch_source.minibatches(self.rollout_buffer, self.batch_size)):
                terms = None if minibatch is None else self._loss(minibatch, clip_range, clip_range_vf, stats)
                if self._stop_early(terms, epoch):
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
        self._record_train(stats, clip_range, clip_range_vf)

    def _record_train(self, stats: TrainStats, clip_range: float, clip_range_vf: float | None) -> None:
        """Log the update: PPO's keys (same names), then GRPO's own."""
        explained_var = explained_variance(self.rollout_buffer.values.flatten(), self.rollout_buffer.returns.flatten())
        stats.record(self.logger, kl=self.kl_coef > 0)
        if self.nonfinite == "skip":
            self.logger.record("train/skipped_nonfinite", self._skipped_nonfinite)
            self._skipped_nonfinite = 0
        self.logger.record("train/explained_variance", explained_var)
        if hasattr(self.policy, "log_std"):
            self.logger.record("train/std", th.exp(self.policy.log_std).mean().item())
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        self._data_parallel.record(self.logger, self.num_timesteps)
        self.logger.record("train/clip_range", clip_range)
        if clip_range_vf is not None:
            self.logger.record("train/clip_range_vf", clip_range_vf)
        scale_pos, scale_neg = self.adaptive_clip if self.adaptive_clip is not None else (1.0, 1.0)
        self.logger.record("train/clip_range_pos", clip_range * scale_pos)
        self.logger.record("train/clip_range_neg", clip_range * scale_neg)
        self.logger.record("train/explore_alpha", self._rollout_explore_alpha)
        if self.kl_coef > 0:
            self.logger.record("train/kl_coef", self.kl_coef)
        if stats.grad_norms and self.grad_norm_warn is not None:
            biggest = max(stats.grad_norms)
            if biggest > self.grad_norm_warn and not self._grad_norm_warned:
                self._grad_norm_warned = True  # once per model: the logs carry train/grad_norm(_max) every update
                warnings.warn(
                    f"GRPO: gradient norm {biggest:.3g} (before clipping to {self.max_grad_norm}) exceeds "
                    f"grad_norm_warn={self.grad_norm_warn} at update {self._n_updates}; consider a lower "
                    "learning rate or reward scaling",
                    stacklevel=3,
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
            path = existing_checkpoint(path)
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
