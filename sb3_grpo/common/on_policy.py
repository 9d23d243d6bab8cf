"""
The on-policy skeleton that every algorithm of the package shares: SB3's PPO loop, with the package's machinery.

:class:`GroupOnPolicyAlgorithm` is SB3's :class:`~stable_baselines3.common.on_policy_algorithm.OnPolicyAlgorithm`
with PPO's arguments and ``collect_rollouts`` step for step, plus what any algorithm here reuses:

- group advantages (``advantage="group" | "group_mean" | "rloo" | "self_critical" | "group_turn"``) and
  role-conditioned ones (``"role"``), :mod:`sb3_grpo.common.advantages.group_trackers`,
  ``carry_over`` (:mod:`sb3_grpo.common.advantages.carry_over`) and rewards scored in the background
  (:mod:`sb3_grpo.common.rollout.deferred_rewards`), all through the rollout's state
  (:mod:`sb3_grpo.common.rollout.extras`);
- the two update paths (:mod:`sb3_grpo.common.update.batch_sources`), whose minibatches know their sequences, and
  micro-batches (``micro_batch_size``: gradient accumulation, one optimizer step per minibatch);
- non-finite handling (``nonfinite``, :mod:`sb3_grpo.common.rollout.nonfinite`) and the gradient-norm log and warning;
- fp16 loss scaling (``torch.amp.GradScaler``) for a policy with ``autocast_dtype="float16"``: a step whose
  gradient overflowed is skipped and counted (``train/skipped_overflow``), the scale halved;
- the data-parallel seam (:mod:`sb3_grpo.common.data_parallel`): rank 0 logs and saves.

A subclass (sb3-contrib's pattern) calls ``super().__init__(..., _init_setup_model=_init_setup_model)``, sets its own
arguments, and calls ``self._setup_model()`` when ``_init_setup_model``; it writes its loss in
:meth:`~GroupOnPolicyAlgorithm._minibatch_loss` (for a micro-batch, its share of the minibatch's loss:
``Minibatch.share``; whole-minibatch statistics go in :meth:`~GroupOnPolicyAlgorithm._prepare_minibatch`) and may
add terms to the update's log in :meth:`~GroupOnPolicyAlgorithm._record_own`. :class:`~sb3_grpo.GRPO`,
:class:`~sb3_grpo.DrGRPO`, :class:`~sb3_grpo.DAPO`, :class:`~sb3_grpo.GSPO` and :class:`~sb3_grpo.CISPO` are the ones
in the package.
"""

from __future__ import annotations

import io
import math
import os
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.base_class import maybe_make_env
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
from sb3_grpo.common.checkpoints.files import existing_checkpoint
from sb3_grpo.common.data_parallel import DATA_PARALLEL, make_data_parallel
from sb3_grpo.common.options.checks import (
    check_argument_values,
    check_carry_over,
    check_learn_args,
    check_ppo_batching,
    resolve_carry_over,
)
from sb3_grpo.common.rollout.extras import RolloutExtras, bootstrap_truncated, env_actions
from sb3_grpo.common.rollout.nonfinite import raise_non_finite
from sb3_grpo.common.rollout.redistribution import RewardRedistribution, check_redistribution_env
from sb3_grpo.common.type_aliases import Minibatch
from sb3_grpo.common.update.batch_sources import make_batch_source, rollout_buffer_class_for
from sb3_grpo.common.update.host_memory import release_free_heap
from sb3_grpo.common.update.train_stats import LossTerms, MicroBatchStats, TrainStats
from sb3_grpo.engines.turn_queues import check_engine, check_engine_policy
from sb3_grpo.engines.vllm_engine import VLLMEngine, check_vllm_model, vllm_options
from sb3_grpo.file_io import atomic_write, is_atomic_temp
from sb3_grpo.objectives import pearson_corr
from sb3_grpo.policies.models import BASE_WEIGHTS, base_missing_message, portable_policy_kwargs
from textrl_envs.validation import check_choice, check_int

__all__ = ["GroupOnPolicyAlgorithm"]

SelfGroupOnPolicy = TypeVar("SelfGroupOnPolicy", bound="GroupOnPolicyAlgorithm")


class GroupOnPolicyAlgorithm(OnPolicyAlgorithm):
    """
    SB3's on-policy skeleton with PPO's arguments, group advantages, carry-over, deferred rewards, non-finite
    handling and the data-parallel seam; a subclass defines the loss of a minibatch (:meth:`_minibatch_loss`).

    PPO's arguments mean what they mean for SB3's ``PPO``; the shared ones beyond them:

    :param ent_coef: the entropy coefficient, a number or (unlike SB3's PPO) a schedule, a callable of the progress
        remaining as ``clip_range`` takes (e.g. ``lambda p: 0.01 * p``); evaluated once per update, logged as
        ``train/ent_coef``. A number is used as it is, so the loss is computed exactly as SB3's PPO computes it
    :param advantage: ``"gae"`` (PPO's), or a group form: ``"group"`` (DeepSeekMath), ``"group_mean"`` (the group
        mean as baseline, no std division: Dr.GRPO), ``"rloo"``, ``"self_critical"``, ``"group_turn"`` (interactive
        episodes, credit per turn) or ``"role"`` (two-player games: SPIRAL's running baseline per game and the side
        the learner played, no group needed) (:mod:`sb3_grpo.common.advantages.group_trackers`)
    :param grad_norm_warn: warn (once per model) when the gradient norm before clipping exceeds this (None: never)
    :param reward_redistribution: ``None`` (off), ``"attention"`` or ``"uniform"``: spread each episode's reward over
        its steps before returns and advantages, its total kept (:mod:`sb3_grpo.common.rollout.redistribution`)
    :param nonfinite: ``"raise"`` or ``"skip"``: what to do with NaN/inf rewards, advantages, losses and gradients
    :param carry_over: group forms on the text fast path: train the steps of an episode whose group has not finished
        when the rollout ends in the first update after it has (:mod:`sb3_grpo.common.advantages.carry_over`);
        ``"auto"``: on where it applies (:func:`~sb3_grpo.common.options.checks.resolve_carry_over`)
    :param micro_batch_size: split each minibatch's forward and backward into micro-batches of this many transitions
        (whole sequences on the text fast path) and accumulate their gradients: one optimizer step per minibatch, the
        same update as unsplit to float rounding, with the peak memory of a micro-batch (``None``: no split)
    :param data_parallel: under ``torchrun``: ``"ddp"`` (every rank holds the whole policy, gradients averaged by
        one all-reduce) or ``"fsdp"`` (parameters, gradients and optimizer state sharded over the ranks with FSDP2,
        :class:`~sb3_grpo.common.data_parallel.FullyShardedDataParallel`); no effect on one process
    :param engine: who computes a text rollout's tokens (:mod:`sb3_grpo.engines.turn_queues`): ``"step"`` (SB3's loop,
        one token per policy call; the reference) or ``"hf"`` (the policy's built-in decoder, a whole turn per row at a
        time, the env still stepped token by token: the same tokens from the same draws)
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
        # torch.distributed (torchrun): one GPU per rank, quiet ranks > 0 (see sb3_grpo.distributed); outside
        # torchrun this is the single-process seam and torch.distributed is never touched. load() builds with
        # _init_setup_model=False and makes no collective call (rank 0 alone may load a model).
        self._sync_ranks_at_setup = _init_setup_model
        on_cpu = str(device) != "auto" and th.device(device).type == "cpu"
        self.data_parallel = check_choice("data_parallel", data_parallel, DATA_PARALLEL)
        self._data_parallel = make_data_parallel(backend="gloo" if on_cpu else None, mode=data_parallel)
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

        self.advantage = advantage
        self.grad_norm_warn = grad_norm_warn
        self.nonfinite = nonfinite
        self.carry_over = carry_over
        if micro_batch_size is not None:
            check_int("micro_batch_size", micro_batch_size, low=1, example=8)
        self.micro_batch_size = micro_batch_size
        self.engine = check_engine(engine)
        self.reward_redistribution = reward_redistribution
        if reward_redistribution is not None and self.env is not None:
            check_redistribution_env(self.env, reward_redistribution)

    # ------------------------------------------------------------------------------------------------------
    # What a subclass defines
    # ------------------------------------------------------------------------------------------------------
    def _minibatch_loss(
        self,
        minibatch: Minibatch,
        clip_range: float,
        clip_range_vf: float | None,
        stats: TrainStats,
        measure_kl: bool,
    ) -> LossTerms:
        """The loss of one minibatch, with its statistics recorded in ``stats``.

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

    def _rollout_alpha(self) -> float:
        """The weight of the uniform mixture the rollout acts with (0: the policy's own draws)."""
        return 0.0

    def _kl_reference(self) -> tuple[BasePolicy | None, bool]:
        """``(frozen reference policy or None, whether the update has a KL term)``; none here."""
        return None, False

    def _check_buffer_class(self, buffer_class: type[RolloutBuffer]) -> None:
        """Refuse a rollout buffer class the model's settings cannot use, before anything is built."""
        check_carry_over(buffer_class, getattr(self, "carry_over", False))

    def _record_own(self, logger: Logger, clip_range: float) -> None:
        """Log the subclass's own figures of an update, after PPO's keys (nothing here)."""

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
        importance_cap = getattr(vllm_options(getattr(self, "engine", "step")), "importance_cap", None)
        #: whether carry_over is on (``"auto"`` resolved for this model's advantage, buffer and engine)
        self.carry_over_on = resolve_carry_over(
            getattr(self, "carry_over", False), self.advantage, self.rollout_buffer_class, importance_cap
        )
        if self.env is not None:
            # a grouped form warns when n_steps < the episodes' length (unless carry_over trains those steps later)
            check_advantage_env(self.env, self.advantage, None if self.carry_over_on else self.n_steps)
        # load() restores the saved exploration RNG before calling _setup_model: keep its state
        loaded_explore_rng = self.__dict__.get("_explore_rng")
        # torch.distributed: rank r seeds with seed + 1000 * r; rank 0's weights are broadcast below
        data_parallel = self._data_parallel
        self.seed = data_parallel.seed(self.seed)
        # load(path, base_model=...): a LoRA checkpoint's base model, found at a new place
        self.policy_kwargs = _relocated_base(self.policy_kwargs, self.__dict__.pop("base_model", None))
        self.policy_kwargs = _moved_model_folder(self.policy_kwargs, self.__dict__.get("_lm_spec"))
        super()._setup_model()
        check_engine_policy(getattr(self, "engine", "step"), self.policy, self.action_space)
        self._vllm = None  # engine="vllm": the in-process vLLM engine, built once the model is complete (below)
        # a model object in policy_kwargs is saved as its config (the weights are in the state dict), not pickled
        self._lm_spec = getattr(self.policy, "lm_spec", None)
        self.policy_kwargs = portable_policy_kwargs(
            self.policy_kwargs, self._lm_spec, getattr(self.policy, "quantization", None)
        )
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

        # nothing here draws from a random generator, so PPO's RNG stream is untouched
        self.ref_policy, kl = self._kl_reference()
        if getattr(self, "_sync_ranks_at_setup", False):
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
        if getattr(self, "reward_redistribution", None) == "attention" and not hasattr(self.policy, "lm"):
            raise ValueError(
                f"reward_redistribution='attention' reads the attention of the policy's language model, but "
                f"{type(self.policy).__name__} has none; use a CausalLMPolicy, or reward_redistribution='uniform'"
            )
        self._grad_norm_warned = False
        self._skipped_nonfinite = 0
        # fp16 autocast: scale the loss so that small gradients do not underflow (bf16 has fp32's range: no scaler)
        fp16 = getattr(self.policy, "autocast_dtype", None) == "float16"
        if fp16 and getattr(self, "data_parallel", "ddp") == "fsdp":
            raise ValueError(
                "fp16 loss scaling is not supported with data_parallel='fsdp' (its gradients are sharded); use "
                "autocast_dtype='bfloat16' (no scaling needed) or data_parallel='ddp'"
            )
        self._grad_scaler = th.amp.GradScaler(self.device.type) if fp16 else None
        self._skipped_overflow = 0
        self._current_ent_coef = self.current_ent_coef()
        options = vllm_options(getattr(self, "engine", "step"))
        if options is not None:
            check_vllm_model(self)
            n_envs = self.env.num_envs if self.env is not None else 1
            self._vllm = VLLMEngine(self.policy, options, n_envs, seed=self.seed)

    def current_ent_coef(self) -> float:
        """The entropy coefficient now: ``ent_coef`` itself when it is a number, else its schedule at the current
        progress remaining."""
        if callable(self.ent_coef):
            return float(self.ent_coef(self._current_progress_remaining))
        return self.ent_coef

    def save(
        self,
        path: str | os.PathLike | io.BufferedIOBase,
        exclude: Iterable[str] | None = None,
        include: Iterable[str] | None = None,
    ) -> None:
        """SB3's ``save`` (same signature), written atomically: to a temporary file in the same folder, flushed to
        disk, then renamed over ``path`` (:func:`~sb3_grpo.file_io.atomic_write`), so a save that fails (a full
        disk, Ctrl-C, a killed process) leaves the previous file at ``path`` intact. As in SB3, ``.zip`` is appended
        to a name without a suffix; a file object is written directly. Under ``torch.distributed`` only rank 0
        writes (the weights are the same everywhere; under ``data_parallel="fsdp"`` every rank must call it: the full
        state is gathered to rank 0 first). ``rollout_buffer_class`` is saved as given (``None`` when the
        algorithm chose it), so SB3's stock ``PPO`` can load the file and train on.

        :param path: The file (or a writable binary file object).
        :param exclude: Names of parameters not to save (SB3's).
        :param include: Names of parameters to save that are excluded by default (SB3's).
        :raises ValueError: for an empty path or a folder.
        :raises OSError: naming ``path`` when the file cannot be written (the previous one is kept).
        """
        self._full_state = self._data_parallel.full_state(self)  # FSDP: gathered from every rank's shards
        self._tracker_state = self._group_tracker_state()
        try:
            if not self._data_parallel.is_main:
                return
            resolved = self.rollout_buffer_class
            self.rollout_buffer_class = self.__dict__.get("_given_buffer_class", resolved)
            try:
                self._save_atomically(path, exclude, include)
            finally:
                self.rollout_buffer_class = resolved
        finally:
            self._full_state = None

    def _save_atomically(
        self, path: str | os.PathLike | io.BufferedIOBase, exclude: Iterable[str] | None, include: Iterable[str] | None
    ) -> None:
        if not isinstance(path, (str, os.PathLike)) or is_atomic_temp(path):  # a file object, or atomic_save's temp
            super().save(path, exclude=exclude, include=include)
            return
        target = Path(os.path.expanduser(os.fspath(path)))
        if os.fspath(path) == "" or target.is_dir():
            raise ValueError(
                f"save: path {os.fspath(path)!r} is {'empty' if os.fspath(path) == '' else 'a folder'}; give a file "
                "path, e.g. model.save('runs/model.zip')"
            )
        if target.suffix == "":
            target = target.with_suffix(".zip")
        atomic_write(
            target, lambda tmp: super(GroupOnPolicyAlgorithm, self).save(tmp, exclude=exclude, include=include)
        )

    def get_parameters(self) -> dict[str, dict]:
        """SB3's ``get_parameters`` (the state dicts ``save`` writes); under ``data_parallel="fsdp"``, while saving,
        the full state gathered from the shards."""
        full = self.__dict__.get("_full_state")
        return super().get_parameters() if full is None else full

    def set_parameters(
        self, load_path_or_dict: str | dict[str, Any], exact_match: bool = True, device: th.device | str = "auto"
    ) -> None:
        """SB3's ``set_parameters``; parameters saved without a KL reference (the model was trained with
        ``kl_coef=0``) load into a model that has one (``load(path, kl_coef=0.1)``): the reference then starts as the
        loaded policy, as a fresh model's starts as its initial policy."""
        ref = getattr(self, "ref_policy", None)
        if isinstance(load_path_or_dict, dict) and ref is not None and "ref_policy" not in load_path_or_dict:
            if exact_match:
                missing = set(self._get_torch_save_params()[0]) - set(load_path_or_dict) - {"ref_policy"}
                if missing:
                    raise ValueError(f"the parameters to load lack {sorted(missing)}; give a complete saved model")
            super().set_parameters(load_path_or_dict, exact_match=False, device=device)
            ref.load_state_dict(self.policy.state_dict())
        else:
            super().set_parameters(load_path_or_dict, exact_match=exact_match, device=device)
        if getattr(self, "_vllm", None) is not None:
            self._vllm.pushed_at = None  # new weights: pushed to vLLM before the next rollout

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
        own += ["_redistribution_steps"]
        own += ["_grad_scaler", "_full_state", "_given_buffer_class", "_vllm"]
        return [*super()._excluded_save_params(), *own]

    def _get_torch_save_params(self) -> tuple[list[str], list[str]]:
        state_dicts, tensors = super()._get_torch_save_params()
        if getattr(self, "ref_policy", None) is not None:
            state_dicts = [*state_dicts, "ref_policy"]
        return state_dicts, tensors

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
        return self.__dict__.get("_tracker_state")

    def _rollout_redistribution(self, env: VecEnv, n_rollout_steps: int) -> RewardRedistribution | None:
        """``reward_redistribution``'s bookkeeping for a rollout of ``env`` (``None``: off); each env's running episode
        length is kept across rollouts."""
        rule = getattr(self, "reward_redistribution", None)
        if rule is None:
            return None
        steps = getattr(self, "_redistribution_steps", None)
        if steps is None or len(steps) != env.num_envs:
            steps = self._redistribution_steps = np.zeros(env.num_envs, dtype=np.int64)
        return RewardRedistribution(rule, env.num_envs, n_rollout_steps, steps)

    def _computes_as_ppo(self) -> bool:
        """Whether this model must compute exactly what SB3's PPO computes, bit for bit (no shortcut that rounds
        floats differently may run then). Here: never; :class:`~sb3_grpo.GRPO` with every extra off does."""
        return False

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
        (same calls, same order), plus the rollout's extras (:class:`~sb3_grpo.common.rollout.extras.RolloutExtras`).

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
        self._rollout_explore_alpha = self._rollout_alpha()
        turn_engine = getattr(self, "_vllm", None)
        if turn_engine is not None and turn_engine.pushed_at != self._n_updates:
            turn_engine.push(self.policy, self._n_updates)  # the weights of the last update (or a load)
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
            engine=getattr(self, "engine", "step"),
            redistribution=self._rollout_redistribution(env, n_rollout_steps),
            turn_engine=turn_engine,
        )

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
        self._data_parallel.release(self.policy)  # FSDP: the rollout's gathered blocks are not needed any more

        callback.update_locals(locals())

        callback.on_rollout_end()

        return True

    # ------------------------------------------------------------------------------------------------------
    # Update
    # ------------------------------------------------------------------------------------------------------
    def _optimizer_step(
        self, terms: LossTerms | None, epoch: int, stats: TrainStats, accumulated: bool = False
    ) -> None:
        """Backward, gradient average over the ranks, clipping and the optimizer step, unless the loss or the
        gradient is non-finite (``nonfinite``: raise, or skip and count). ``terms=None``: an idle step.
        ``accumulated``: the micro-batches' backwards have already filled the gradients (:meth:`_micro_batch_loss`)."""
        if terms is None or not math.isfinite(terms.value):
            if terms is not None and self.nonfinite != "skip":
                raise_non_finite("loss", self._n_updates, epoch, self.num_timesteps, terms.details)
            if terms is not None:  # no step on this minibatch; counted in train/skipped_nonfinite
                self._skipped_nonfinite += 1
            # join the other ranks' step
            self._data_parallel.idle_step(self.policy, self.max_grad_norm, getattr(self, "_grad_scaler", None))
            return
        if not accumulated:
            self.policy.optimizer.zero_grad()
            self._backward(terms.loss)
        if not self.policy.optimizer.state:  # the first step allocates the optimizer's state: the update's peak
            release_free_heap()
        self._data_parallel.average_gradients(self.policy.parameters())
        scaler = getattr(self, "_grad_scaler", None)
        if scaler is not None:  # the true gradient (an overflow anywhere is in every rank's average: all skip)
            scaler.unscale_(self.policy.optimizer)
        # Clip grad norm (the returned norm is the one before clipping)
        grad_norm = self._data_parallel.clip_grad_norm(self.policy.parameters(), self.max_grad_norm)
        if not math.isfinite(grad_norm):
            if scaler is not None:
                # fp16 loss scaling: an overflow is expected; no step, the scale halves, counted
                scaler.update()
                self.policy.optimizer.zero_grad()
                self._skipped_overflow += 1
                return
            if self.nonfinite != "skip":
                details = {**terms.details, "grad_norm": grad_norm}
                raise_non_finite("gradient", self._n_updates, epoch, self.num_timesteps, details)
            self.policy.optimizer.zero_grad()  # drop the gradient: the weights and Adam's moments stay finite
            self._skipped_nonfinite += 1
            return
        stats.grad_norms.append(grad_norm)
        if scaler is not None:
            scaler.step(self.policy.optimizer)  # the unscaled gradient, checked finite above
            scaler.update()
        else:
            self.policy.optimizer.step()

    def _backward(self, loss: th.Tensor) -> None:
        """``loss.backward()``, of the scaled loss under fp16 loss scaling."""
        scaler = getattr(self, "_grad_scaler", None)
        (loss if scaler is None else scaler.scale(loss)).backward()

    def _micro_batch_loss(
        self,
        minibatch: Minibatch,
        clip_range: float,
        clip_range_vf: float | None,
        stats: TrainStats,
        measure_kl: bool,
    ) -> LossTerms:
        """The minibatch's loss in micro-batches of ``micro_batch_size``, each one's backward run as soon as its loss
        is known (gradients accumulate; the optimizer step follows in :meth:`_optimizer_step`).

        Each micro-batch's :meth:`_minibatch_loss` is its share of the minibatch's loss (``Minibatch.share``): the
        shares and their gradients add up to the unsplit minibatch's. The figures recorded in ``stats`` are the whole
        minibatch's. After a non-finite share no backward runs (the rest are evaluated without a gradient, for the
        log); the returned loss is then non-finite and :meth:`_optimizer_step` raises or skips as ``nonfinite`` says.
        """
        minibatch = self._prepare_minibatch(minibatch)
        micro_stats = MicroBatchStats()
        self.policy.optimizer.zero_grad()
        total, details, finite = 0.0, {}, True
        for part in self.batch_source.split(minibatch, self.micro_batch_size):
            with th.enable_grad() if finite else th.no_grad():
                terms = self._loss_with_router_aux(part, clip_range, clip_range_vf, micro_stats, measure_kl)
            total += terms.value
            for key, value in terms.details.items():
                details[key] = details.get(key, 0.0) + value
            if finite and math.isfinite(terms.value):
                self._backward(terms.loss)
            else:
                finite = False
            del terms  # the micro-batch's graph goes before the next forward
        if not finite:
            self.policy.optimizer.zero_grad()  # a partial sum must not reach the step
        approx_kl = micro_stats.merge_into(stats, total)
        return LossTerms(th.tensor(total), approx_kl, details, total)

    def _loss_with_router_aux(
        self,
        minibatch: Minibatch,
        clip_range: float,
        clip_range_vf: float | None,
        stats: TrainStats,
        measure_kl: bool,
    ) -> LossTerms:
        """:meth:`_minibatch_loss`, plus ``router_aux_loss_coef * aux`` for a policy whose LM is a mixture-of-experts
        architecture with ``policy_kwargs["router_aux_loss_coef"] > 0`` (TRL's name): ``aux`` is the mean over the
        minibatch's forwards of their routers' load-balancing loss (Fedus et al. 2021;
        :func:`~sb3_grpo.policies.moe.load_balancing_loss`), a micro-batch's weighted by its share; logged as
        ``train/router_aux_loss``. With the coefficient 0 (the default) it is :meth:`_minibatch_loss` itself."""
        coef = float(getattr(self.policy, "router_aux_loss_coef", 0.0) or 0.0)
        if coef == 0.0:
            return self._minibatch_loss(minibatch, clip_range, clip_range_vf, stats, measure_kl)
        with self.policy.router_aux_losses() as losses:
            terms = self._minibatch_loss(minibatch, clip_range, clip_range_vf, stats, measure_kl)
        if not losses:  # e.g. evaluated without gradients (a non-finite micro-batch's log)
            return terms
        aux = th.stack(losses).mean()
        self.__dict__.setdefault("_router_aux_values", []).append(float(aux.detach()))
        term = coef * aux * (1.0 if minibatch.share is None else minibatch.share.fraction)
        details = {**terms.details, "router_aux_loss": float(term.detach())}
        return LossTerms(terms.loss + term, terms.approx_kl, details, terms.value + float(term.detach()))

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

    def _after_update(self, stats: TrainStats) -> None:
        """Called once per update, after its epochs and before its log (nothing here)."""

    def train(self) -> None:
        """
        Update policy using the currently gathered rollout buffer (PPO's loop; the loss is :meth:`_minibatch_loss`).
        """
        # Switch to train mode (this affects batch norm / dropout)
        self.policy.set_training_mode(True)
        # Update optimizer learning rate
        self._update_learning_rate(self.policy.optimizer)
        # The entropy coefficient of this update: a number as it is (PPO's exact float), or its schedule's value
        self._current_ent_coef = self.current_ent_coef()
        # Compute current clip range
        clip_range = self.clip_range(self._current_progress_remaining)  # type: ignore[operator]
        # Optional: clip range for the value function
        clip_range_vf = None
        if self.clip_range_vf is not None:
            clip_range_vf = self.clip_range_vf(self._current_progress_remaining)  # type: ignore[operator]

        stats = TrainStats()
        continue_training = True
        # every rank runs the same forwards and backwards here (FSDP: the blocks are resharded after each of them)
        with self._data_parallel.updating(self.policy):
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
                    split = minibatch is not None and getattr(self, "micro_batch_size", None) is not None
                    if split:  # forward and backward micro-batch by micro-batch, the gradients accumulated
                        terms = self._micro_batch_loss(minibatch, clip_range, clip_range_vf, stats, measure_kl)
                    elif minibatch is not None:
                        terms = self._loss_with_router_aux(minibatch, clip_range, clip_range_vf, stats, measure_kl)
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

    def _record_update(self, stats: TrainStats, clip_range: float, clip_range_vf: float | None) -> None:
        """Log one update: PPO's keys (same names), the subclass's own (:meth:`_record_own`), and warn (once per
        model) when the gradient norm before clipping passed ``grad_norm_warn``."""
        logger, buffer = self.logger, self.rollout_buffer
        explained_var = explained_variance(buffer.values.flatten(), buffer.returns.flatten())
        stats.record(logger, kl=self.batch_source.reference is not None)
        if self.nonfinite == "skip":
            logger.record("train/skipped_nonfinite", self._skipped_nonfinite)
            self._skipped_nonfinite = 0
        if getattr(self, "_grad_scaler", None) is not None:
            logger.record("train/skipped_overflow", self._skipped_overflow)
            logger.record("train/loss_scale", self._grad_scaler.get_scale())
            self._skipped_overflow = 0
        logger.record("train/explained_variance", explained_var)
        router_aux = self.__dict__.pop("_router_aux_values", None)
        if router_aux:
            logger.record("train/router_aux_loss", float(np.mean(router_aux)))
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

    @classmethod
    def load(  # noqa: PYI019 (SB3's convention)
        cls: type[SelfGroupOnPolicy],
        path: Any,
        env: GymEnv | None = None,
        device: th.device | str = "auto",
        custom_objects: dict[str, Any] | None = None,
        print_system_info: bool = False,
        force_reset: bool = True,
        **kwargs: Any,
    ) -> SelfGroupOnPolicy:
        """
        SB3's ``load``, with clear errors for a path that does not exist or a file that is not a complete saved
        model (a torn write); see :func:`sb3_grpo.callbacks.latest_checkpoint` to find the newest complete one.

        The arguments set on load (``kwargs`` and the values of ``custom_objects``, e.g. ``kl_coef=0.1``) run the same
        checks as the constructor's (:meth:`_check_load_arguments`): a NaN or an out-of-range value is refused, naming
        it. As in
        SB3, ``device="cuda"`` on a machine without CUDA loads on the CPU (with a warning).

        A LoRA model's checkpoint holds its adapters, not its base model, which loads again by its name or path (Hub
        ids at the saved revision, from the Hugging Face cache with ``HF_HUB_OFFLINE=1``). A base that has moved is
        given with ``base_model="<directory or Hub id>"`` (one more keyword argument); a base that cannot be found
        is an error naming it and these ways out, and one whose weights differ from those the adapters were trained on
        is refused.
        """
        # callables in custom_objects stand in for schedules that cannot be unpickled (rl-zoo's
        # {"clip_range": lambda _: 0.0}): placeholders, not settings, so only the other values are checked
        placed = {k: v for k, v in (custom_objects or {}).items() if not callable(v)}
        cls._check_load_arguments({**placed, **kwargs})
        device = _available_device(device)
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

    @classmethod
    def _check_load_arguments(cls, args: dict[str, Any]) -> None:
        """Check the arguments ``load`` sets (``kwargs``, ``custom_objects``) one by one, with the constructor's checks
        (:func:`~sb3_grpo.common.options.checks.check_argument_values`); a subclass with arguments of its own extends
        it.

        :raises TypeError: naming an argument of a wrong type.
        :raises ValueError: naming an argument with a wrong value.
        """
        check_argument_values(args)

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


def _relocated_base(policy_kwargs: Any, base_model: Any) -> Any:
    """On ``load(path, base_model=...)``: ``policy_kwargs["model"]`` pointed at ``base_model`` (a directory or Hub id),
    where a LoRA checkpoint's base model is now; the checkpoint's fingerprint of the base checks it is the same."""
    if base_model is None:
        return policy_kwargs
    if not isinstance(base_model, (str, os.PathLike)) or not os.fspath(base_model):
        raise TypeError(f"load(base_model=...) must be a model directory or a Hub id (str), got {base_model!r}")
    model = policy_kwargs.get("model") if isinstance(policy_kwargs, dict) else None
    if isinstance(model, dict) and model.get("weights") == BASE_WEIGHTS:
        return {**policy_kwargs, "model": {**model, "name_or_path": os.fspath(base_model)}}
    if isinstance(model, (str, os.PathLike)):
        return {**policy_kwargs, "model": os.fspath(base_model)}
    raise ValueError(
        "load(base_model=...) names where a LoRA checkpoint's base model is, but this checkpoint holds its full model "
        "weights (it needs no base); load it without base_model"
    )


def _moved_model_folder(policy_kwargs: Any, lm_spec: Any) -> Any:
    """On ``load``: a ``policy_kwargs["model"]`` folder that no longer exists (moved, deleted) is replaced by the LM's
    config saved with the model (``_lm_spec``), with a warning; the weights come from the checkpoint, so the model
    loads the same. A LoRA checkpoint without its base weights cannot: that is an error naming the base."""
    model = policy_kwargs.get("model") if isinstance(policy_kwargs, dict) else None
    if not isinstance(model, (str, os.PathLike)) or os.path.isdir(model) or not isinstance(lm_spec, dict):
        return policy_kwargs
    if lm_spec.get("weights") == BASE_WEIGHTS:
        raise FileNotFoundError(base_missing_message(os.fspath(model), lm_spec.get("revision")))
    warnings.warn(
        f"the model folder {os.fspath(model)!r} this model was built from no longer exists; building the LM from the "
        "config saved in the checkpoint (the weights are the checkpoint's, so the model is the same)",
        UserWarning,
        stacklevel=4,
    )
    return {**policy_kwargs, "model": lm_spec}


def _available_device(device: th.device | str) -> th.device | str:
    """``device``, or the CPU (with a warning) for a CUDA device on a machine without CUDA, as SB3's ``load`` does."""
    try:
        wanted = th.device(device)
    except (RuntimeError, TypeError):
        return device  # the constructor's check names it
    if wanted.type == "cuda" and not th.cuda.is_available():
        warnings.warn(
            f"load(device={str(device)!r}): CUDA is not available here, loading on the CPU (as SB3 does); pass "
            "device='cpu' to silence this",
            stacklevel=3,
        )
        return "cpu"
    return device
