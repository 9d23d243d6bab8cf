"""
The on-policy skeleton every algorithm of the package shares: SB3's ``OnPolicyAlgorithm`` with PPO's arguments.

:class:`GroupOnPolicyAlgorithm` keeps SB3's loop (``collect_rollouts``, ``train``'s epochs and minibatches, the
optimizer step, the update's log) and calls the rooms that own the rest: the advantage forms
(:mod:`sb3_grpo.common.advantages`), the rollout's additions (:mod:`sb3_grpo.common.rollout`), the rollout engine
(:func:`sb3_grpo.engines.make_engine`, made once at set-up), the two update paths (:mod:`sb3_grpo.common.update`), fp16
loss scaling (:mod:`sb3_grpo.common.update.loss_scaling`), the router term of mixture-of-experts LMs
(:mod:`sb3_grpo.common.update.router_aux`), saving and loading
(:class:`~sb3_grpo.common.checkpoints.save_load.CheckpointMixin`), the options an algorithm supports
(:class:`~sb3_grpo.common.options.support.SupportedOptions`) and ``torch.distributed``
(:mod:`sb3_grpo.common.data_parallel`).

A subclass (sb3-contrib's pattern) calls ``super().__init__(..., _init_setup_model=False)``, sets its own arguments,
and calls ``self._setup_model()`` when ``_init_setup_model``. It writes its loss in ``_minibatch_loss`` (for a
micro-batch, its share of the minibatch's loss: ``Minibatch.share``; whole-minibatch statistics go in
``_prepare_minibatch``), or, without a critic, subclasses :class:`~sb3_grpo.common.critic_free.CriticFreeAlgorithm`
and writes only its policy term. It may log its own figures in ``_record_own``. The other hooks, each a no-op here:
``_rollout_alpha`` (the exploration mixture's weight), ``_kl_reference`` (a frozen KL reference),
``_check_buffer_class``, ``_after_update`` and ``_computes_as_ppo``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.logger import Logger
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

from sb3_grpo import distributed
from sb3_grpo.common.advantages.carry_over import CarryOver
from sb3_grpo.common.advantages.forms import advantage_form, check_advantage_env, make_group_tracker
from sb3_grpo.common.advantages.group_trackers import EpisodeGroupTracker
from sb3_grpo.common.checkpoints.save_load import CheckpointMixin
from sb3_grpo.common.data_parallel import make_data_parallel
from sb3_grpo.common.options.checks import check_carry_over, check_learn_args, check_ppo_batching, resolve_carry_over
from sb3_grpo.common.options.schedule_values import plain_number, scheduled_value
from sb3_grpo.common.options.support import SupportedOptions
from sb3_grpo.common.rollout.nonfinite import raise_non_finite
from sb3_grpo.common.rollout.redistribution import (
    RewardRedistribution,
    check_redistribution_env,
    check_redistribution_policy,
)
from sb3_grpo.common.rollout.rollout_extras import RolloutExtras, bootstrap_truncated, env_actions, last_values
from sb3_grpo.common.rollout.trainer_state_push import push_trainer_state
from sb3_grpo.common.type_aliases import Minibatch
from sb3_grpo.common.update.batch_sources import make_batch_source, rollout_buffer_class_for
from sb3_grpo.common.update.host_memory import release_free_heap
from sb3_grpo.common.update.loss_scaling import (
    grad_scaler_for,
    scaled_backward,
    skip_overflowed_step,
    step_optimizer,
    unscale_gradients,
)
from sb3_grpo.common.update.router_aux import with_router_aux
from sb3_grpo.common.update.train_stats import LossTerms, MicroBatchStats, TrainStats
from sb3_grpo.engines import engine_importance_cap, make_engine
from sb3_grpo.objectives import pearson_corr
from sb3_grpo.policies.tokenizer_identity import check_policy_tokenizer

__all__ = ["GroupOnPolicyAlgorithm"]

SelfGroupOnPolicy = TypeVar("SelfGroupOnPolicy", bound="GroupOnPolicyAlgorithm")


class GroupOnPolicyAlgorithm(CheckpointMixin, SupportedOptions, OnPolicyAlgorithm):
    """
    SB3's on-policy skeleton with PPO's arguments and the options every algorithm of the package shares; a subclass
    defines the loss of a minibatch.

    PPO's arguments mean what they mean for SB3's ``PPO``. On a text env a step is one token: a rollout holds
    ``n_steps * n_envs`` tokens, ``learn(total_timesteps)`` counts tokens too (in whole rollouts), and ``batch_size``
    counts transitions, i.e. tokens (on the text fast path, whole sequences of about that many tokens), where TRL's
    ``per_device_train_batch_size`` counts completions. The shared options beyond PPO's arguments:

    :param ent_coef: the entropy coefficient, a number or (unlike SB3's PPO) a schedule, a callable of the progress
        remaining as ``clip_range`` takes (e.g. ``lambda p: 0.01 * p``); evaluated once per update, logged as
        ``train/ent_coef``. A number is used as it is, so the loss is computed exactly as SB3's PPO computes it
    :param advantage: ``"gae"`` (PPO's, with a critic) or a form without a critic: ``"group"`` (DeepSeekMath),
        ``"group_mean"`` (Dr. GRPO's), ``"rloo"``, ``"self_critical"``, ``"group_turn"`` (interactive episodes, credit
        per turn) or ``"role"`` (two-player games, no group needed); see :mod:`sb3_grpo.common.advantages.forms`
    :param grad_norm_warn: warn (once per model) when the gradient norm before clipping exceeds this (None: never);
        ``train/grad_norm`` and ``train/grad_norm_max`` are logged at every update
    :param nonfinite: ``"raise"`` (stop with an error naming the quantity and where, before the optimizer touches the
        weights) or ``"skip"`` (drop and count): what to do with NaN/inf rewards, advantages, losses and gradients
    :param carry_over: forms without a critic on the text fast path: train the steps of an episode whose advantage is
        not known when the rollout ends in the first update after it is (:mod:`sb3_grpo.common.advantages.carry_over`);
        ``"auto"``: on where it applies (:func:`~sb3_grpo.common.options.checks.resolve_carry_over`; ``carry_over_on``
        says what it resolved to); ``False``: every update uses only its own rollout, as PPO's do
    :param micro_batch_size: split each minibatch's forward and backward into micro-batches of this many transitions
        (on the text fast path: this many whole sequences, i.e. completions; a size, where TRL's
        ``gradient_accumulation_steps`` is a count) and accumulate their gradients: one optimizer step per minibatch,
        the same update as unsplit to float rounding, with the peak memory of a micro-batch (``None``: no split)
    :param data_parallel: under ``torchrun``: ``"ddp"`` (every rank holds the whole policy, gradients averaged by
        one all-reduce) or ``"fsdp"`` (parameters, gradients and optimizer state sharded over the ranks with FSDP2,
        :class:`~sb3_grpo.common.data_parallel.FullyShardedDataParallel`); no effect on one process
    :param engine: who computes a text rollout's tokens (:mod:`sb3_grpo.engines`): ``"step"`` (SB3's loop, one token
        per policy call; the reference), ``"hf"`` (the policy's built-in decoder, a whole turn per row at a time: the
        same tokens from the same draws) or ``"vllm"`` (vLLM in the training process, an extra; or
        :class:`~sb3_grpo.engines.vllm_engine.VLLMOptions`); the env is stepped token by token with each
    :param reward_redistribution: ``None`` (off), ``"attention"`` or ``"uniform"``: spread each episode's reward over
        its steps before returns and advantages, its total kept (:mod:`sb3_grpo.common.rollout.redistribution`)
    """

    policy_aliases: ClassVar[dict[str, type[BasePolicy]]] = {
        "MlpPolicy": ActorCriticPolicy,
        "CnnPolicy": ActorCriticCnnPolicy,
        "MultiInputPolicy": MultiInputActorCriticPolicy,
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
        advantage: str = "gae",
        grad_norm_warn: float | None = 1000.0,
        nonfinite: str = "raise",
        carry_over: bool | str = "auto",
        micro_batch_size: int | None = None,
        data_parallel: str = "ddp",
        engine: str = "step",
        reward_redistribution: str | None = None,
    ):
        # every argument (type, finiteness, range) and whether this algorithm supports the shared options' values is
        # checked first, before any model is built; a subclass checks its own arguments before calling this
        self.check_arguments(locals())
        # torch.distributed (torchrun): one GPU per rank, quiet ranks > 0 (see sb3_grpo.distributed); outside
        # torchrun this is the single-process seam and torch.distributed is never touched. load() builds with
        # _init_setup_model=False and makes no collective call (rank 0 alone may load a model).
        self._sync_ranks_at_setup = _init_setup_model
        on_cpu = str(device) != "auto" and th.device(device).type == "cpu"
        self.data_parallel = data_parallel
        self._data_parallel = make_data_parallel(backend="gloo" if on_cpu else None, mode=data_parallel)
        device = self._data_parallel.device(device)
        verbose = verbose if self._data_parallel.is_main else 0
        # a NumPy number (np.float32(1e-4)) as a Python float: SB3's schedules take nothing else
        learning_rate, clip_range, clip_range_vf = map(plain_number, (learning_rate, clip_range, clip_range_vf))

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

        self.advantage = advantage
        self.grad_norm_warn = grad_norm_warn
        self.nonfinite = nonfinite
        self.carry_over = carry_over
        self.micro_batch_size = micro_batch_size
        self.engine = engine
        self.reward_redistribution = reward_redistribution
        if reward_redistribution is not None and self.env is not None:
            check_redistribution_env(self.env, reward_redistribution)
        # kept across set-ups, and restored by load() before _setup_model reads them
        self._explore_rng: np.random.Generator | None = None  # the exploration RNG (a saved model's, once loaded)
        self._lm_spec: dict[str, Any] | None = None  # the LM's spec, saved with the model (CheckpointMixin)
        self._tracker_state: dict[str, Any] | None = None  # what the advantage tracker keeps across updates
        self._full_state: dict[str, dict] | None = None  # while saving under FSDP: the gathered state

    # ------------------------------------------------------------------------------------------------------
    # What a subclass defines
    # ------------------------------------------------------------------------------------------------------
    def _minibatch_loss(
        self, minibatch: Minibatch, clip_range: float, clip_range_vf: float | None, stats: TrainStats, measure_kl: bool
    ) -> LossTerms:
        """The loss of one minibatch, with its statistics recorded in ``stats`` (an algorithm without a critic inherits
        it from :class:`~sb3_grpo.common.critic_free.CriticFreeAlgorithm`).

        :param minibatch: The minibatch (per transition, with its sequences: ``Minibatch.sequence_ids``).
        :param clip_range: The update's ``eps``.
        :param clip_range_vf: The update's value clip range (``None``: no value clipping).
        :param stats: Where the per-minibatch figures go.
        :param measure_kl: Compute ``approx_kl`` (PPO's early-stopping estimate); else ``LossTerms.approx_kl`` is
            ``None``.
        """
        raise NotImplementedError(f"{type(self).__name__} must define _minibatch_loss")

    def _prepare_minibatch(self, minibatch: Minibatch) -> Minibatch:
        """The minibatch before it is split into micro-batches (``micro_batch_size``): where the loss uses a statistic
        of the whole minibatch (GRPO: the advantages' normalisation), computed here over all of it (nothing here).

        :param minibatch: The whole minibatch.
        """
        return minibatch

    def _rollout_alpha(self, progress_remaining: float) -> float:  # noqa: ARG002 (the hook's signature)
        """The weight of the uniform mixture a rollout acts with at ``progress_remaining`` (0: the policy's own
        draws)."""
        return 0.0

    def _kl_reference(self) -> tuple[BasePolicy | None, bool]:
        """``(frozen reference policy or None, whether the update has a KL term)``; none here."""
        return None, False

    def _check_buffer_class(self, buffer_class: type[RolloutBuffer]) -> None:
        """Refuse a rollout buffer class the model's settings cannot use, before anything is built."""
        check_carry_over(buffer_class, self.carry_over)

    def _record_own(self, logger: Logger, clip_range: float) -> None:
        """Log the subclass's own figures of an update, after PPO's keys (nothing here)."""

    def _after_update(self, stats: TrainStats) -> None:
        """Called once per update, after its epochs and before its log (nothing here)."""

    def _computes_as_ppo(self) -> bool:
        """Whether this model must compute exactly what SB3's PPO computes, bit for bit (no shortcut that rounds
        floats differently may run then). Here: never; :class:`~sb3_grpo.GRPO` with every extra off does."""
        return False

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
        # what the user gave (None: chosen here) is what save() stores, so stock PPO can load the file too
        self._given_buffer_class = self.rollout_buffer_class
        self.rollout_buffer_class = rollout_buffer_class_for(
            self.rollout_buffer_class, self.policy_class, self.observation_space, self.action_space
        )
        self._check_buffer_class(self.rollout_buffer_class)
        #: whether carry_over is on (``"auto"`` resolved for this model's advantage, buffer and engine)
        self.carry_over_on = resolve_carry_over(
            self.carry_over, self.advantage, self.rollout_buffer_class, engine_importance_cap(self.engine)
        )
        if self.env is not None:
            # a grouped form warns when n_steps < the episodes' length (unless carry_over trains those steps later)
            check_advantage_env(self.env, self.advantage, None if self.carry_over_on else self.n_steps)
        loaded_explore_rng = self._explore_rng  # load() restores the saved exploration RNG before _setup_model
        # torch.distributed: rank r seeds with seed + 1000 * r; rank 0's weights are broadcast below
        data_parallel = self._data_parallel
        self.seed = data_parallel.seed(self.seed)
        self.policy_kwargs = self._policy_kwargs_to_build()  # a loaded LoRA base or model folder at its new place
        super()._setup_model()
        check_policy_tokenizer(self.policy, self.env)  # the model's own tokenizer against the env's
        self._keep_portable_policy_kwargs()
        if not data_parallel.is_main:
            self.set_logger(distributed.null_logger())
        if self._sync_ranks_at_setup:
            data_parallel.start(self.policy, self.env.num_envs if self.env is not None else 0)

        # Initialize schedules for policy/value clipping (as PPO)
        self.clip_range = FloatSchedule(self.clip_range)
        if self.clip_range_vf is not None:
            if isinstance(self.clip_range_vf, (float, int)):
                assert self.clip_range_vf > 0, "`clip_range_vf` must be positive, pass `None` to deactivate vf clipping"
            self.clip_range_vf = FloatSchedule(self.clip_range_vf)

        # nothing here draws from a random generator, so PPO's RNG stream is untouched
        self.ref_policy, kl = self._kl_reference()
        if self._sync_ranks_at_setup:
            data_parallel.shard(self.policy)  # FSDP: after the reference's copy (an FSDP module cannot be copied)
        self.batch_source = make_batch_source(
            self.rollout_buffer_class,
            self.policy,
            self.ref_policy,
            discrete=isinstance(self.action_space, spaces.Discrete),
            kl=kl,
        )
        if isinstance(loaded_explore_rng, np.random.Generator) and data_parallel.world_size == 1:
            self._explore_rng = loaded_explore_rng
        else:
            self._explore_rng = np.random.default_rng(self.seed)
        self._rollout_explore_alpha = 0.0
        self._group_tracker: EpisodeGroupTracker | None = None
        self._carry = CarryOver() if self.carry_over_on else None
        self._redistribution_steps: np.ndarray | None = None  # per env: steps of its running episode so far
        check_redistribution_policy(self.reward_redistribution, self.policy)
        self._grad_norm_warned = False
        self._skipped_nonfinite = 0
        # fp16 autocast: scale the loss so that small gradients do not underflow (bf16 has fp32's range: no scaler)
        self._grad_scaler = grad_scaler_for(self.policy, self.device, self.data_parallel)
        self._skipped_overflow = 0
        self._router_aux_values: list[float] = []  # the update's router load-balancing losses (MoE LMs)
        self._current_ent_coef = self.current_ent_coef()
        self._rollout_engine = make_engine(
            self.engine,
            self.policy,
            self.action_space,
            self.env.num_envs if self.env is not None else 1,
            self.seed,
            explore_alpha=self._rollout_alpha(1.0),
            greedy_members=advantage_form(self.advantage).greedy_member,
            carry_over=self.carry_over,
        )

    def current_ent_coef(self) -> float:
        """The entropy coefficient now: ``ent_coef`` itself when it is a number, else its schedule at the current
        progress remaining."""
        if callable(self.ent_coef):
            return scheduled_value("ent_coef", self.ent_coef, self._current_progress_remaining)
        return self.ent_coef

    def set_random_seed(self, seed: int | None = None) -> None:
        """SB3's ``set_random_seed`` (Python, NumPy, torch, action space, env), plus the exploration RNG.

        :param seed: The seed (``None``: nothing is reseeded, as in SB3).
        """
        super().set_random_seed(seed)
        if seed is not None:
            self._explore_rng = np.random.default_rng(seed)

    def _excluded_save_params(self) -> list[str]:
        # (the loss scaler is rebuilt by _setup_model: a loaded model starts again from the initial scale)
        own = ["ref_policy", "batch_source", "_data_parallel", "_group_tracker", "_sync_ranks_at_setup", "_carry"]
        own += ["_redistribution_steps", "_grad_scaler", "_router_aux_values", "_rollout_engine"]
        return [*super()._excluded_save_params(), *own]

    # ------------------------------------------------------------------------------------------------------
    # Rollout
    # ------------------------------------------------------------------------------------------------------
    def _rollout_group_tracker(self, env: VecEnv) -> EpisodeGroupTracker | None:
        """The advantage form's tracker for ``env`` (kept across rollouts), or ``None`` for GAE."""
        if advantage_form(self.advantage).critic:
            return None
        if self._group_tracker is None or self._group_tracker.n_envs != env.num_envs:
            state = self._group_tracker_state()  # the running tracker's, or a loaded model's
            self._group_tracker = make_group_tracker(env, self.advantage)
            if state is not None and hasattr(self._group_tracker, "load_state_dict"):
                self._group_tracker.load_state_dict(state)
        return self._group_tracker

    def _group_tracker_state(self) -> dict[str, Any] | None:
        """What the group tracker keeps across updates and a saved model holds (the role baselines of
        ``advantage="role"``): the live tracker's, else the one this model was loaded with, else ``None``."""
        tracker = self._group_tracker
        if tracker is not None and hasattr(tracker, "state_dict"):
            return tracker.state_dict()
        return self._tracker_state

    def _rollout_redistribution(self, env: VecEnv, n_rollout_steps: int) -> RewardRedistribution | None:
        """``reward_redistribution``'s bookkeeping for a rollout of ``env`` (``None``: off); each env's running episode
        length is kept across rollouts."""
        if self.reward_redistribution is None:
            return None
        steps = self._redistribution_steps
        if steps is None or len(steps) != env.num_envs:
            steps = self._redistribution_steps = np.zeros(env.num_envs, dtype=np.int64)
        return RewardRedistribution(self.reward_redistribution, env.num_envs, n_rollout_steps, steps)

    # Over 80 lines: SB3's OnPolicyAlgorithm.collect_rollouts step for step, kept in its shape so that the two read side
    # by side (the PPO equivalence rests on it); the additions are one call each into RolloutExtras
    def collect_rollouts(
        self,
        env: VecEnv,
        callback: BaseCallback,
        rollout_buffer: RolloutBuffer,
        n_rollout_steps: int,
    ) -> bool:
        """
        Collect experiences and fill a ``RolloutBuffer``: SB3's ``OnPolicyAlgorithm.collect_rollouts`` step for step
        (same calls, same order), plus the rollout's extras
        (:class:`~sb3_grpo.common.rollout.rollout_extras.RolloutExtras`).

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
        # the mixture's weight is fixed for the whole rollout (and kept for the update's log)
        self._rollout_explore_alpha = self._rollout_alpha(self._current_progress_remaining)
        self._rollout_engine.before_rollout(self.policy, self._n_updates)  # vLLM: the last update's weights
        extras = RolloutExtras.start(
            self.action_space,
            self._rollout_explore_alpha,
            self._rollout_group_tracker(env),
            advantage_form(self.advantage).greedy_member,
            self.nonfinite,
            rollout_buffer,
            env,
            n_rollout_steps,
            self._explore_rng,
            policy=self.policy,
            carry=self._carry,
            on_accelerator=self.device.type != "cpu",
            exact_ppo=self._computes_as_ppo(),
            engine=self._rollout_engine,
            redistribution=self._rollout_redistribution(env, n_rollout_steps),
        )

        push_trainer_state(self, env)  # the rewards' trainer_state= (TRL's), as of this rollout
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
            # Compute value for the last timestep (GAE only, and only where an episode goes on)
            by_rows = extras.batched_bootstrap
            values = last_values(self.policy, new_obs, dones, extras.needs_values, by_rows, self.device)

        extras.land_rewards(rollout_buffer)  # rewards scored in the background, before returns and advantages
        rollout_buffer.compute_returns_and_advantage(last_values=values, dones=dones)
        extras.finish(rollout_buffer, self.logger, self.num_timesteps, self._n_updates, self.advantage)
        self._data_parallel.release(self.policy)  # FSDP: the rollout's gathered blocks are not needed any more

        callback.update_locals(locals())

        callback.on_rollout_end()

        return True

    # ------------------------------------------------------------------------------------------------------
    # Update
    # ------------------------------------------------------------------------------------------------------
    def train(self) -> None:
        """
        Update policy using the currently gathered rollout buffer (PPO's loop; the loss is a subclass's
        ``_minibatch_loss``).
        """
        # Switch to train mode (this affects batch norm / dropout)
        self.policy.set_training_mode(True)
        # Update optimizer learning rate (its schedule's value checked first: a NaN never reaches the optimizer)
        progress = self._current_progress_remaining
        scheduled_value("learning_rate", self.lr_schedule, progress, low=0)
        self._update_learning_rate(self.policy.optimizer)
        # The entropy coefficient of this update: a number as it is (PPO's exact float), or its schedule's value
        self._current_ent_coef = self.current_ent_coef()
        # Compute current clip range
        clip_range = scheduled_value("clip_range", self.clip_range, progress, low=0, low_open=True)
        # Optional: clip range for the value function
        clip_range_vf = None
        if self.clip_range_vf is not None:
            clip_range_vf = scheduled_value("clip_range_vf", self.clip_range_vf, progress, low=0, low_open=True)

        stats = TrainStats()
        continue_training = True
        # every rank runs the same forwards and backwards here (FSDP: the blocks are resharded after each of them)
        with self._data_parallel.updating(self.policy):
            # train for n_epochs epochs
            for epoch in range(self.n_epochs):
                stats.approx_kl_divs = []
                # approx_kl: every epoch's for target_kl, else only the last epoch's (the only ones logged, as PPO logs)
                measure_kl = self.target_kl is not None or epoch == self.n_epochs - 1

                def loss(part: Minibatch, part_stats: TrainStats, kl: bool = measure_kl) -> LossTerms:
                    """A minibatch's (or a micro-batch's) loss, with the router term where it applies."""
                    return self._loss_with_router_aux(part, clip_range, clip_range_vf, part_stats, kl)

                # Do a complete pass on the rollout buffer (None: a data-parallel rank's idle step)
                for minibatch in self._data_parallel.epoch(
                    self.batch_source.minibatches(self.rollout_buffer, self.batch_size)
                ):
                    terms = None
                    split = minibatch is not None and self.micro_batch_size is not None
                    if split:  # forward and backward micro-batch by micro-batch, the gradients accumulated
                        terms = self._micro_batch_loss(minibatch, loss, stats)
                    elif minibatch is not None:
                        terms = loss(minibatch, stats)
                    if self._stop_early(terms, epoch):
                        if split:
                            self.policy.optimizer.zero_grad()  # the accumulated gradient takes no step
                        continue_training = False
                        break
                    self._optimizer_step(terms, epoch, stats, accumulated=split)

                self._n_updates += 1
                if not continue_training:
                    break

        self._after_update(stats)
        self._record_update(stats, clip_range, clip_range_vf)

    def _loss_with_router_aux(
        self, minibatch: Minibatch, clip_range: float, clip_range_vf: float | None, stats: TrainStats, measure_kl: bool
    ) -> LossTerms:
        """The subclass's ``_minibatch_loss``, plus the router load-balancing term of a mixture-of-experts LM built
        with ``router_aux_loss_coef > 0`` (:func:`~sb3_grpo.common.update.router_aux.with_router_aux`)."""
        return with_router_aux(
            self.policy,
            lambda: self._minibatch_loss(minibatch, clip_range, clip_range_vf, stats, measure_kl),
            minibatch.share,
            self._router_aux_values,
        )

    def _micro_batch_loss(
        self, minibatch: Minibatch, loss: Callable[[Minibatch, TrainStats], LossTerms], stats: TrainStats
    ) -> LossTerms:
        """The minibatch's loss in micro-batches of ``micro_batch_size``, each one's backward run as soon as its loss
        (``loss(micro_batch, stats)``) is known (gradients accumulate; the optimizer step follows in
        :meth:`_optimizer_step`).

        Each micro-batch's loss is its share of the minibatch's (``Minibatch.share``): the shares and their gradients
        add up to the unsplit minibatch's. The figures recorded in ``stats`` are the whole minibatch's. After a
        non-finite share no backward runs (the rest are evaluated without a gradient, for the log); the returned loss
        is then non-finite and :meth:`_optimizer_step` raises or skips as ``nonfinite`` says.
        """
        minibatch = self._prepare_minibatch(minibatch)
        micro_stats = MicroBatchStats()
        self.policy.optimizer.zero_grad()
        total, details, finite = 0.0, {}, True
        for part in self.batch_source.split(minibatch, self.micro_batch_size):
            with th.enable_grad() if finite else th.no_grad():
                terms = loss(part, micro_stats)
            total += terms.value
            for key, value in terms.details.items():
                details[key] = details.get(key, 0.0) + value
            if finite and math.isfinite(terms.value):
                scaled_backward(terms.loss, self._grad_scaler)
            else:
                finite = False
            del terms  # the micro-batch's graph goes before the next forward
        if not finite:
            self.policy.optimizer.zero_grad()  # a partial sum must not reach the step
        approx_kl = micro_stats.merge_into(stats, total)
        return LossTerms(th.tensor(total), approx_kl, details, total)

    def _optimizer_step(
        self, terms: LossTerms | None, epoch: int, stats: TrainStats, accumulated: bool = False
    ) -> None:
        """Backward, gradient average over the ranks, clipping and the optimizer step, unless the loss or the
        gradient is non-finite (``nonfinite``: raise, or skip and count). ``terms=None``: an idle step.
        ``accumulated``: the micro-batches' backwards have already filled the gradients (:meth:`_micro_batch_loss`)."""
        optimizer = self.policy.optimizer
        if terms is None or not math.isfinite(terms.value):
            if terms is not None and self.nonfinite != "skip":
                raise_non_finite("loss", self._n_updates, epoch, self.num_timesteps, terms.details)
            if terms is not None:  # no step on this minibatch; counted in train/skipped_nonfinite
                self._skipped_nonfinite += 1
            # join the other ranks' step
            self._data_parallel.idle_step(self.policy, self.max_grad_norm, self._grad_scaler)
            return
        if not accumulated:
            optimizer.zero_grad()
            scaled_backward(terms.loss, self._grad_scaler)
        if not optimizer.state:  # the first step allocates the optimizer's state: the update's peak
            release_free_heap()
        self._data_parallel.average_gradients(self.policy.parameters())
        unscale_gradients(self._grad_scaler, optimizer)
        # Clip grad norm (the returned norm is the one before clipping)
        grad_norm = self._data_parallel.clip_grad_norm(self.policy.parameters(), self.max_grad_norm)
        if not math.isfinite(grad_norm):
            if skip_overflowed_step(self._grad_scaler, optimizer):  # fp16: an overflow, expected; the scale halves
                self._skipped_overflow += 1
                return
            if self.nonfinite != "skip":
                details = {**terms.details, "grad_norm": grad_norm}
                raise_non_finite("gradient", self._n_updates, epoch, self.num_timesteps, details)
            optimizer.zero_grad()  # drop the gradient: the weights and Adam's moments stay finite
            self._skipped_nonfinite += 1
            return
        stats.grad_norms.append(grad_norm)
        step_optimizer(self._grad_scaler, optimizer)  # the unscaled gradient, checked finite above

    def _stop_early(self, terms: LossTerms | None, epoch: int) -> bool:
        """PPO's ``target_kl``: stop the epochs when ``approx_kl > 1.5 * target_kl``; under ``torch.distributed`` the
        mean over the ranks, so all stop together (an idle step, ``terms=None``, adds nothing to the mean)."""
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

    def _record_update(self, stats: TrainStats, clip_range: float, clip_range_vf: float | None) -> None:
        """Log one update: PPO's keys (same names), the subclass's own (``_record_own``), and warn (once per model)
        when the gradient norm before clipping passed ``grad_norm_warn``."""
        logger, buffer = self.logger, self.rollout_buffer
        stats.record(logger, kl=self.batch_source.reference is not None)
        if self.nonfinite == "skip":
            logger.record("train/skipped_nonfinite", self._skipped_nonfinite)
            self._skipped_nonfinite = 0
        if self._grad_scaler is not None:
            logger.record("train/skipped_overflow", self._skipped_overflow)
            logger.record("train/loss_scale", self._grad_scaler.get_scale())
            self._skipped_overflow = 0
        if advantage_form(self.advantage).critic:  # a form without a critic trains no value head: no fit to log
            logger.record(
                "train/explained_variance", explained_variance(buffer.values.flatten(), buffer.returns.flatten())
            )
        if self._router_aux_values:
            logger.record("train/router_aux_loss", float(np.mean(self._router_aux_values)))
            self._router_aux_values.clear()
        if hasattr(self.policy, "log_std"):
            logger.record("train/std", th.exp(self.policy.log_std).mean().item())
        logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        self._data_parallel.record(logger, self.num_timesteps)
        logger.record("train/clip_range", clip_range)
        logger.record("train/ent_coef", self._current_ent_coef)
        if clip_range_vf is not None:
            logger.record("train/clip_range_vf", clip_range_vf)
        self._record_own(logger, clip_range)
        if stats.grad_norms and self.grad_norm_warn is not None:
            biggest = max(stats.grad_norms)
            if biggest > self.grad_norm_warn and not self._grad_norm_warned:
                self._grad_norm_warned = True  # once per model: the logs carry train/grad_norm(_max) every update
                warnings.warn(
                    f"{type(self).__name__}: gradient norm {biggest:.3g} (before clipping to {self.max_grad_norm}) "
                    f"exceeds grad_norm_warn={self.grad_norm_warn} at update {self._n_updates}; consider a lower "
                    "learning rate or reward scaling",
                    stacklevel=3,
                )
        logger.record("train/value_return_corr", pearson_corr(buffer.values, buffer.returns))

    @distributed.peer_errors()  # a stalled or dead rank: one clear error on the others
    def learn(  # noqa: PYI019 (SB3's convention; typing.Self needs Python 3.11)
        self: SelfGroupOnPolicy,
        total_timesteps: int,
        callback: MaybeCallback = None,
        log_interval: int = 1,
        tb_log_name: str | None = None,
        reset_num_timesteps: bool = True,
        progress_bar: bool = False,
    ) -> SelfGroupOnPolicy:
        """SB3's ``learn``; ``tb_log_name`` defaults to the class's name (``"GRPO"``, ``"DrGRPO"``).

        Its arguments are checked first (:func:`~sb3_grpo.common.options.checks.check_learn_args`): a NaN or negative
        ``total_timesteps``, ``log_interval=0`` or a callback of the wrong type is refused, naming it, instead of
        training nothing or failing mid-run.
        """
        total_timesteps = check_learn_args(total_timesteps, callback, log_interval, tb_log_name)
        return super().learn(
            total_timesteps=total_timesteps,
            callback=callback,
            log_interval=log_interval,
            tb_log_name=type(self).__name__ if tb_log_name is None else tb_log_name,
            reset_num_timesteps=reset_num_timesteps,
            progress_bar=progress_bar,
        )
