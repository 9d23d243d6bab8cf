"""Evaluation-driven callbacks: :class:`EarlyStoppingCallback` and :class:`RollbackCallback`."""

from __future__ import annotations

import copy
import math
import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.vec_env import DummyVecEnv, VecEnv

from sb3_grpo.callbacks._common import TrainingAlertWarning, check_positive_int
from sb3_grpo.common.checkpoints.files import atomic_save, latest_checkpoint, nonfinite_parameters

__all__ = ["EarlyStoppingCallback", "RollbackCallback"]


def _as_vec_env(env: Any, what: str) -> VecEnv:
    if isinstance(env, VecEnv):
        return env
    if hasattr(env, "reset") and hasattr(env, "step"):
        return DummyVecEnv([lambda: env])
    raise TypeError(f"{what} must be a gymnasium Env or an SB3 VecEnv, got {type(env).__name__}")


class _PeriodicEvaluation(BaseCallback):
    """Evaluate the policy every ``eval_freq`` timesteps, at the start of a rollout (shared machinery)."""

    def __init__(
        self,
        eval_env: Any,
        eval_freq: int,
        n_eval_episodes: int = 5,
        deterministic: bool = True,
        verbose: int = 0,
    ):
        super().__init__(verbose)
        self.eval_env = _as_vec_env(eval_env, "eval_env") if eval_env is not None else None
        self.eval_freq = check_positive_int("eval_freq", eval_freq)
        self.n_eval_episodes = check_positive_int("n_eval_episodes", n_eval_episodes)
        self.deterministic = deterministic
        self.evaluations: list[tuple[int, float]] = []
        self._next_eval = 0
        self._stop = False

    def _init_callback(self) -> None:
        self._next_eval = self.num_timesteps + self.eval_freq
        self._check_eval_env()

    def _check_eval_env(self) -> None:
        """Refuse, when training starts, an eval env whose spaces are not the model's (it would fail only at the
        first evaluation, mid-training)."""
        if self.eval_env is None:
            return
        model_spaces = (self.model.observation_space, self.model.action_space)
        env_spaces = (self.eval_env.observation_space, self.eval_env.action_space)
        if not _same_spaces(model_spaces, env_spaces):
            raise ValueError(
                f"{type(self).__name__}: eval_env's spaces (observation {env_spaces[0]}, action {env_spaces[1]}) are "
                f"not the model's (observation {model_spaces[0]}, action {model_spaces[1]}); pass an eval env made "
                "like the training env (same id and settings)"
            )

    def _evaluate(self) -> float:
        """Mean episode reward of the current policy on ``eval_env`` (logged as ``eval/mean_reward``)."""
        assert self.eval_env is not None
        rewards, _ = evaluate_policy(
            self.model,
            self.eval_env,
            n_eval_episodes=self.n_eval_episodes,
            deterministic=self.deterministic,
            return_episode_rewards=True,
            warn=False,
        )
        mean = float(np.mean(rewards)) if len(rewards) else float("nan")
        self.evaluations.append((self.num_timesteps, mean))
        self.logger.record("eval/mean_reward", mean)
        if self.verbose >= 1:
            print(f"Eval num_timesteps={self.num_timesteps}, episode_reward={mean:.3f}")
        return mean

    def _due(self) -> bool:
        if self.eval_env is None or self.num_timesteps < self._next_eval:
            return False
        self._next_eval = self.num_timesteps + self.eval_freq
        return True

    def _on_step(self) -> bool:
        return not self._stop


def _same_spaces(a: tuple[Any, Any], b: tuple[Any, Any]) -> bool:
    """Whether two (observation, action) space pairs are equal, as SB3's ``check_for_correct_spaces`` compares them
    (a text env's window width must match too)."""
    try:
        return all(x == y for x, y in zip(a, b))
    except Exception:  # noqa: BLE001  (spaces that cannot be compared: let the evaluation say what is wrong)
        return True


def _check_file_target(what: str, path: Path) -> None:
    """Refuse a file path that is a folder or whose folder is a file, before training starts."""
    if path.is_dir():
        raise ValueError(f"{what} {str(path)!r} is a folder; give a file path, e.g. {what}='runs/best_model.zip'")
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if parent.exists() and not parent.is_dir():
        raise ValueError(f"{what} {str(path)!r}: {str(parent)!r} is a file, not a folder; choose another path")


def _snapshot(model: BaseAlgorithm) -> dict[str, Any]:
    """A CPU copy of the policy's and the optimizer's state."""
    policy = {k: v.detach().to("cpu", copy=True) for k, v in model.policy.state_dict().items()}
    optimizer = copy.deepcopy(model.policy.optimizer.state_dict()) if getattr(model.policy, "optimizer", None) else None
    return {"policy": policy, "optimizer": optimizer, "num_timesteps": model.num_timesteps}


def _restore(model: BaseAlgorithm, snapshot: dict[str, Any]) -> None:
    model.policy.load_state_dict(snapshot["policy"])
    if snapshot["optimizer"] is not None:
        model.policy.optimizer.load_state_dict(copy.deepcopy(snapshot["optimizer"]))
    reset_cache = getattr(model.policy, "reset_cache", None)
    if callable(reset_cache):  # CausalLMPolicy: cached keys/values belong to the replaced weights
        reset_cache()


class EarlyStoppingCallback(_PeriodicEvaluation):
    """Stop training when the evaluation reward has not improved for ``patience`` evaluations.

    Every ``eval_freq`` timesteps (checked at the start of each rollout), the policy plays
    ``n_eval_episodes`` episodes on ``eval_env``; an evaluation improves when its mean reward exceeds the best
    so far by more than ``min_delta``. The best model is kept: in memory (and put back into the model when
    training ends, with ``restore_best=True``) and, with ``best_model_path``, saved atomically
    (:func:`atomic_save`) at each improvement. Training stops at the next step after the ``patience``-th
    evaluation in a row without improvement; ``stopped_early`` then is True.

    :param eval_env: The evaluation env (a gymnasium Env or an SB3 VecEnv), separate from the training env.
    :param patience: Evaluations without improvement before stopping (>= 1).
    :param eval_freq: Timesteps between evaluations.
    :param n_eval_episodes: Episodes per evaluation.
    :param min_delta: Smallest increase of the mean reward that counts as an improvement (>= 0).
    :param best_model_path: Where to save the best model (``None``: memory only).
    :param restore_best: Load the best weights (and optimizer state) into the model when training ends.
    :param deterministic: Evaluate with deterministic actions.
    :param verbose: 1 prints every evaluation and the stop.
    """

    def __init__(
        self,
        eval_env: Any,
        patience: int,
        eval_freq: int,
        n_eval_episodes: int = 5,
        min_delta: float = 0.0,
        best_model_path: str | os.PathLike | None = None,
        restore_best: bool = True,
        deterministic: bool = True,
        verbose: int = 0,
    ):
        if eval_env is None:
            raise ValueError("EarlyStoppingCallback needs an eval_env (a separate env to evaluate the policy on)")
        super().__init__(eval_env, eval_freq, n_eval_episodes, deterministic, verbose)
        self.patience = check_positive_int("patience", patience)
        if not (isinstance(min_delta, (int, float)) and math.isfinite(min_delta) and min_delta >= 0):
            raise ValueError(f"min_delta must be a finite number >= 0, got {min_delta!r}")
        self.min_delta = float(min_delta)
        self.best_model_path = Path(best_model_path) if best_model_path is not None else None
        self.restore_best = restore_best
        self.best_mean_reward = -math.inf
        self.best_timestep: int | None = None
        self.n_no_improvement = 0
        self.stopped_early = False
        self._best: dict[str, Any] | None = None

    def _init_callback(self) -> None:
        super()._init_callback()
        if self.best_model_path is not None:
            _check_file_target("best_model_path", self.best_model_path)

    def _on_rollout_start(self) -> None:
        if not self._due():
            return
        mean = self._evaluate()
        if math.isfinite(mean) and mean > self.best_mean_reward + self.min_delta:
            self.best_mean_reward, self.best_timestep, self.n_no_improvement = mean, self.num_timesteps, 0
            self._best = _snapshot(self.model)
            if self.best_model_path is not None:
                atomic_save(self.model, self.best_model_path)
        else:
            self.n_no_improvement += 1
        self.logger.record("eval/best_mean_reward", self.best_mean_reward)
        self.logger.record("eval/evals_without_improvement", self.n_no_improvement)
        if self.n_no_improvement >= self.patience:
            self._stop = self.stopped_early = True
            if self.verbose >= 1:
                print(
                    f"Early stopping at {self.num_timesteps} timesteps: "
                    f"no improvement over {self.best_mean_reward:.3f} "
                    f"(at {self.best_timestep} timesteps) in {self.n_no_improvement} evaluations"
                )

    def _on_training_end(self) -> None:
        if self.restore_best and self._best is not None:
            _restore(self.model, self._best)


class RollbackCallback(_PeriodicEvaluation):
    """Roll the policy back to its best earlier state when training collapses.

    Two triggers, checked at the start of each rollout (so no update mixes two policies' data):

    * **collapse**: every ``eval_freq`` timesteps the policy is evaluated on ``eval_env``; when the mean reward
      falls more than ``threshold`` below the best evaluation so far (``threshold * |best|`` with
      ``relative=True``), or is not finite;
    * **non-finite weights** (``check_finite``): any NaN/inf in the policy's parameters or buffers, or a
      non-finite ``train/loss`` in the logs.

    The state rolled back to is the policy and optimizer state at the best evaluation (kept in memory), or,
    with ``checkpoint_dir``, the newest complete checkpoint of that folder saved no later than that
    evaluation (see :class:`AtomicCheckpointCallback`), loaded with ``model.set_parameters``. Without an
    ``eval_env`` only the non-finite trigger is active and the state is the one at the last finite check.
    The timestep counter is not rolled back. After ``max_rollbacks`` rollbacks training stops (the collapse
    keeps coming back: lower the learning rate), after a last rollback so that the model ends with good
    weights. Logged: ``rollback/count``.

    :param eval_env: The evaluation env (``None``: only the non-finite trigger).
    :param eval_freq: Timesteps between evaluations.
    :param threshold: Drop below the best mean reward that triggers a rollback (> 0).
    :param relative: Read ``threshold`` as a fraction of ``|best mean reward|``.
    :param n_eval_episodes: Episodes per evaluation.
    :param checkpoint_dir: Roll back to checkpoints of this folder instead of the in-memory state.
    :param name_prefix: The checkpoints' ``name_prefix``.
    :param check_finite: Also roll back on non-finite weights or loss.
    :param max_rollbacks: Stop training after this many rollbacks.
    :param deterministic: Evaluate with deterministic actions.
    :param verbose: 1 prints every evaluation and rollback.
    """

    def __init__(
        self,
        eval_env: Any = None,
        eval_freq: int = 10_000,
        threshold: float = 1.0,
        relative: bool = False,
        n_eval_episodes: int = 5,
        checkpoint_dir: str | os.PathLike | None = None,
        name_prefix: str = "rl_model",
        check_finite: bool = True,
        max_rollbacks: int = 3,
        deterministic: bool = True,
        verbose: int = 0,
    ):
        super().__init__(eval_env, eval_freq, n_eval_episodes, deterministic, verbose)
        if not (isinstance(threshold, (int, float)) and math.isfinite(threshold) and threshold > 0):
            raise ValueError(
                f"threshold must be a finite number > 0 (the reward drop that triggers a rollback), got {threshold!r}"
            )
        if eval_env is None and not check_finite:
            raise ValueError("RollbackCallback with neither an eval_env nor check_finite=True never rolls back")
        self.threshold = float(threshold)
        self.relative = relative
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir is not None else None
        self.name_prefix = name_prefix
        self.check_finite = check_finite
        self.max_rollbacks = check_positive_int("max_rollbacks", max_rollbacks)
        self.best_mean_reward = -math.inf
        self.n_rollbacks = 0
        self.rollbacks: list[tuple[int, str]] = []
        self._good: dict[str, Any] | None = None

    def _init_callback(self) -> None:
        super()._init_callback()
        if self.checkpoint_dir is not None and not self.checkpoint_dir.is_dir():
            raise ValueError(
                f"RollbackCallback: checkpoint_dir {str(self.checkpoint_dir)!r} "
                f"{'is not a folder' if self.checkpoint_dir.exists() else 'does not exist'}, so every rollback would "
                "silently use the in-memory state; give the save_path of your AtomicCheckpointCallback (placed "
                "before this callback in the CallbackList, so it creates the folder first), or checkpoint_dir=None "
                "to roll back in memory"
            )
        if not nonfinite_parameters(self.model.policy):
            self._good = _snapshot(self.model)

    def _nonfinite_reason(self) -> str | None:
        bad = nonfinite_parameters(self.model.policy)
        if bad:
            return f"non-finite weights in {', '.join(bad[:3])}"
        loss = self.model.logger.name_to_value.get("train/loss")
        if loss is not None and not math.isfinite(float(loss)):
            return f"non-finite train/loss ({loss})"
        return None

    def _on_rollout_start(self) -> None:
        reason = self._nonfinite_reason() if self.check_finite else None
        if reason is None and self._due():
            mean = self._evaluate()
            if not math.isfinite(mean):
                reason = f"non-finite evaluation reward ({mean})"
            else:
                limit = self.threshold * abs(self.best_mean_reward) if self.relative else self.threshold
                if math.isfinite(self.best_mean_reward) and mean < self.best_mean_reward - limit:
                    reason = (
                        f"evaluation reward {mean:.4g} fell more than {limit:.4g} below the best "
                        f"{self.best_mean_reward:.4g}"
                    )
                elif mean >= self.best_mean_reward:
                    self.best_mean_reward = mean
                    self._good = _snapshot(self.model)
        elif reason is None and self.eval_env is None:
            self._good = _snapshot(self.model)  # no evaluations: the last finite state is the good one
        if reason is not None:
            self._roll_back(reason)

    def _roll_back(self, reason: str) -> None:
        if self.n_rollbacks >= self.max_rollbacks:
            source = self._rollback_to()  # stop with good weights, not the collapsed ones
            warnings.warn(
                f"RollbackCallback: {reason} at {self.num_timesteps} timesteps after {self.n_rollbacks} rollbacks "
                f"(max_rollbacks={self.max_rollbacks}); stopping training with the weights of {source}. Lower the "
                "learning rate or check the reward.",
                TrainingAlertWarning,
                stacklevel=2,
            )
            self._stop = True
            return
        source = self._rollback_to()
        if source is None:
            warnings.warn(
                f"RollbackCallback: {reason} at {self.num_timesteps} timesteps, but there is no earlier good state "
                "to roll back to; stopping training",
                TrainingAlertWarning,
                stacklevel=2,
            )
            self._stop = True
            return
        self.n_rollbacks += 1
        self.rollbacks.append((self.num_timesteps, reason))
        self.logger.record("rollback/count", self.n_rollbacks)
        warnings.warn(
            f"RollbackCallback: {reason} at {self.num_timesteps} timesteps; rolled back to {source}",
            TrainingAlertWarning,
            stacklevel=2,
        )

    def _rollback_to(self) -> str | None:
        if self.checkpoint_dir is not None:
            limit = self._good["num_timesteps"] if self._good is not None else None
            path = latest_checkpoint(self.checkpoint_dir, self.name_prefix, max_steps=limit)
            if path is not None:
                self.model.set_parameters(str(path), exact_match=True, device=self.model.device)
                reset_cache = getattr(self.model.policy, "reset_cache", None)
                if callable(reset_cache):
                    reset_cache()
                return str(path)
        if self._good is None:
            return None
        _restore(self.model, self._good)
        return f"the state at {self._good['num_timesteps']} timesteps"


# ---------------------------------------------------------------------------------------------------------
# Schedules
# ---------------------------------------------------------------------------------------------------------
