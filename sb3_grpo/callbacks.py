"""
SB3 callbacks for long training runs: crash-safe checkpoints, early stopping, rollback, schedules, monitors.

Every class here is a plain :class:`~stable_baselines3.common.callbacks.BaseCallback`, so they work with
``GRPO``, stock ``PPO`` and any other SB3 algorithm, and combine in a list::

    from sb3_grpo import GRPO
    from sb3_grpo.callbacks import AtomicCheckpointCallback, EarlyStoppingCallback, latest_checkpoint

    model = GRPO("MlpPolicy", "CartPole-v1")
    model.learn(100_000, callback=[
        AtomicCheckpointCallback(save_freq=5_000, save_path="ckpt"),
        EarlyStoppingCallback(eval_env, patience=5, eval_freq=10_000, best_model_path="ckpt/best_model.zip"),
    ])
    # after a crash: resume from the newest checkpoint that is a complete file
    model = GRPO.load(latest_checkpoint("ckpt"), env=env)
    model.learn(100_000 - model.num_timesteps, reset_num_timesteps=False, callback=...)

* :class:`AtomicCheckpointCallback`: SB3's ``CheckpointCallback`` written atomically (temp file in the same
  folder, ``fsync``, ``os.replace``), so a process killed mid-write (even by SIGKILL) never leaves a file under a
  checkpoint name that does not load; it also never saves non-finite weights. :func:`atomic_save` and
  :func:`latest_checkpoint` are the building blocks.
* :class:`EarlyStoppingCallback`: stop when the evaluation reward has not improved for ``patience``
  evaluations; keep (and restore, and save) the best model.
* :class:`RollbackCallback`: go back to the best earlier state when the evaluation reward collapses or the
  weights become non-finite.
* :class:`MaxNewTokensCurriculum`: short completions first, longer later (text envs).
* :class:`GammaSchedule`: ``gamma_t = gamma_min + (gamma_max - gamma_min) * t / T``.
* :class:`TrainingMonitor`: warn when the gradient norm or the KL (to the reference, or between
  iterations) passes a threshold.

Evaluations, rollbacks and schedules act at rollout boundaries (``on_rollout_start``), never in the middle of a
rollout, so an on-policy update never mixes data from two policies.
"""

from __future__ import annotations

import copy
import math
import os
import re
import warnings
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch as th
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback, CheckpointCallback
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.vec_env import DummyVecEnv, VecEnv

__all__ = [
    "AtomicCheckpointCallback",
    "EarlyStoppingCallback",
    "GammaSchedule",
    "MaxNewTokensCurriculum",
    "RollbackCallback",
    "TrainingAlertWarning",
    "TrainingMonitor",
    "atomic_save",
    "atomic_write",
    "latest_checkpoint",
    "nonfinite_parameters",
]

#: Suffix of the temporary files :func:`atomic_write` writes before renaming them into place.
TMP_SUFFIX = ".tmp"


class TrainingAlertWarning(UserWarning):
    """A training quantity (gradient norm, KL, evaluation reward) crossed a threshold set on a callback."""


# ---------------------------------------------------------------------------------------------------------
# Atomic files
# ---------------------------------------------------------------------------------------------------------
def _fsync_path(path: str | os.PathLike, directory: bool = False) -> None:
    flags = os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if directory else 0)
    try:
        fd = os.open(path, flags)
    except OSError:  # e.g. directories cannot be opened on some platforms
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike, write: Callable[[str], Any]) -> Path | None:
    """Write a file so that ``path`` is either the old file, absent, or the complete new file.

    ``write(tmp)`` writes to a temporary file in the same folder (named ``.<name>.<pid>.tmp``, so no
    glob for ``*.zip`` / ``*.pkl`` matches it); it is then flushed to disk (``fsync``) and renamed over
    ``path`` with :func:`os.replace` (atomic on POSIX and Windows), and the folder is synced. If ``write``
    raises, the temporary file is removed and the error propagates; if the process dies, at most a stale
    temporary file remains (:class:`AtomicCheckpointCallback` removes those of dead processes).

    :param path: The final file path.
    :param write: Writes the content to the path it is given (its suffix is ``.tmp``: writers that append a
        default extension to suffix-less paths, as SB3's do, leave it alone).
    :return: ``path`` as a :class:`~pathlib.Path`, or ``None`` if ``write`` wrote nothing (e.g. a
        ``torch.distributed`` rank other than 0, where ``GRPO.save`` is a no-op).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{os.getpid()}{TMP_SUFFIX}"
    try:
        write(str(tmp))
        if not tmp.exists():
            return None
        _fsync_path(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_path(path.parent, directory=True)
    return path


def nonfinite_parameters(module: th.nn.Module) -> list[str]:
    """Names of the parameters and buffers of ``module`` that hold a NaN or an infinity."""
    bad = []
    for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
        if tensor.is_floating_point() and not bool(th.isfinite(tensor).all()):
            bad.append(name)
    return bad


def atomic_save(model: BaseAlgorithm, path: str | os.PathLike) -> Path | None:
    """``model.save(path)``, atomically (see :func:`atomic_write`), refusing non-finite weights.

    :param model: An SB3 algorithm.
    :param path: Where to save; ``.zip`` is appended when the name has no suffix (as SB3 does).
    :return: The path written (``None`` when ``model.save`` wrote nothing, e.g. a distributed rank > 0).
    :raises ValueError: if a policy parameter is NaN/inf (nothing is written: a checkpoint must never
        carry them).
    """
    path = Path(path)
    if path.suffix == "":
        path = path.with_suffix(".zip")
    bad = nonfinite_parameters(model.policy)
    if bad:
        raise ValueError(
            f"not saving {path}: the policy has non-finite values in {', '.join(bad[:5])}"
            f"{' ...' if len(bad) > 5 else ''}; roll back to an earlier checkpoint (RollbackCallback) or train "
            "with GRPO(nonfinite='skip')"
        )
    return atomic_write(path, model.save)


def _checkpoint_steps(name: str, name_prefix: str) -> int | None:
    match = re.fullmatch(re.escape(name_prefix) + r"_(\d+)_steps\.zip", name)
    return int(match.group(1)) if match else None


def is_complete_checkpoint(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a complete SB3 model zip (a valid archive with ``data`` and ``policy.pth`` whose
    CRCs check out). Cheap: nothing is unpickled or loaded into a model."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = set(archive.namelist())
            return {"data", "policy.pth"} <= names and archive.testzip() is None
    except (OSError, zipfile.BadZipFile, EOFError, ValueError):
        return False


def latest_checkpoint(
    save_path: str | os.PathLike, name_prefix: str = "rl_model", max_steps: int | None = None
) -> Path | None:
    """The newest complete checkpoint ``<save_path>/<name_prefix>_<steps>_steps.zip`` (SB3's naming).

    Files that are not complete archives (see :func:`is_complete_checkpoint`) and temporary files are
    skipped, so this is what to resume from after a crash.

    :param save_path: The checkpoint folder.
    :param name_prefix: The callback's ``name_prefix``.
    :param max_steps: Only checkpoints of at most this many timesteps (``None``: any).
    :return: The path, or ``None`` if there is none.
    """
    folder = Path(save_path)
    if not folder.is_dir():
        return None
    found = []
    for entry in folder.iterdir():
        steps = _checkpoint_steps(entry.name, name_prefix)
        if steps is not None and (max_steps is None or steps <= max_steps):
            found.append((steps, entry))
    for _, entry in sorted(found, reverse=True):
        if is_complete_checkpoint(entry):
            return entry
    return None


def _check_positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return int(value)


# ---------------------------------------------------------------------------------------------------------
# Checkpoints
# ---------------------------------------------------------------------------------------------------------
class AtomicCheckpointCallback(CheckpointCallback):
    """SB3's :class:`~stable_baselines3.common.callbacks.CheckpointCallback`, crash-safe.

    Same arguments, same file names (``<name_prefix>_<steps>_steps.zip``, plus ``<name_prefix>_vecnormalize_
    <steps>_steps.pkl`` and ``<name_prefix>_replay_buffer_<steps>_steps.pkl`` when asked), but every file is
    written with :func:`atomic_write`: to a temporary file in the same folder, ``fsync``-ed, then renamed into
    place. A process killed at any moment (SIGKILL included) leaves only complete checkpoints under checkpoint
    names, so :func:`latest_checkpoint` always finds one that loads; a run loses at most ``save_freq`` calls.

    It never writes a model with NaN/inf weights: such a save is skipped with a warning (counted in
    ``n_skipped_nonfinite`` and logged as ``checkpoint/skipped_nonfinite``). Temporary files left by dead
    processes are removed when training starts.

    :param save_freq: Save every ``save_freq`` calls of the callback (each call is one ``env.step()``, so
        ``n_envs`` timesteps).
    :param save_path: The checkpoint folder (created if needed).
    :param name_prefix: Common prefix of the files.
    :param save_replay_buffer: Also save the replay buffer (off-policy algorithms).
    :param save_vecnormalize: Also save the ``VecNormalize`` statistics, when the env has them.
    :param keep_last: Keep only the newest ``keep_last`` checkpoints (and their companion files);
        ``None`` keeps all.
    :param verbose: 2 prints every save.
    """

    def __init__(
        self,
        save_freq: int,
        save_path: str | os.PathLike,
        name_prefix: str = "rl_model",
        save_replay_buffer: bool = False,
        save_vecnormalize: bool = False,
        keep_last: int | None = None,
        verbose: int = 0,
    ):
        _check_positive_int("save_freq", save_freq)
        if keep_last is not None:
            _check_positive_int("keep_last", keep_last)
        if not name_prefix or os.sep in name_prefix:
            raise ValueError(
                f"name_prefix must be a non-empty file name prefix without {os.sep!r}, got {name_prefix!r}"
            )
        super().__init__(
            save_freq,
            os.fspath(save_path),
            name_prefix=name_prefix,
            save_replay_buffer=save_replay_buffer,
            save_vecnormalize=save_vecnormalize,
            verbose=verbose,
        )
        self.keep_last = keep_last
        self.n_skipped_nonfinite = 0
        self.last_checkpoint: Path | None = None

    def _init_callback(self) -> None:
        super()._init_callback()
        self._remove_stale_temp_files()

    def _remove_stale_temp_files(self) -> None:
        pattern = re.compile(r"\." + re.escape(self.name_prefix) + r"_.*\.(\d+)" + re.escape(TMP_SUFFIX))
        for entry in Path(self.save_path).iterdir():
            match = pattern.fullmatch(entry.name)
            if match is None:
                continue
            pid = int(match.group(1))
            if pid != os.getpid() and _pid_alive(pid):
                continue  # another live process is writing it
            entry.unlink(missing_ok=True)

    def save_checkpoint(self) -> Path | None:
        """Write a checkpoint now (what ``_on_step`` does every ``save_freq`` calls).

        :return: The model path, or ``None`` if it was skipped (non-finite weights) or not written.
        """
        bad = nonfinite_parameters(self.model.policy)
        if bad:
            self.n_skipped_nonfinite += 1
            self.logger.record("checkpoint/skipped_nonfinite", self.n_skipped_nonfinite)
            warnings.warn(
                f"AtomicCheckpointCallback: not saving a checkpoint at {self.num_timesteps} timesteps: the policy "
                f"has non-finite values in {', '.join(bad[:5])}; the last good checkpoint is {self.last_checkpoint}",
                TrainingAlertWarning,
                stacklevel=2,
            )
            return None
        model_path = atomic_write(self._checkpoint_path(extension="zip"), self.model.save)
        if model_path is None:
            return None
        if self.verbose >= 2:
            print(f"Saving model checkpoint to {model_path}")
        replay_buffer = getattr(self.model, "replay_buffer", None)
        if self.save_replay_buffer and replay_buffer is not None:
            path = atomic_write(self._checkpoint_path("replay_buffer_", extension="pkl"), self.model.save_replay_buffer)  # type: ignore[attr-defined]
            if self.verbose >= 2:
                print(f"Saving model replay buffer checkpoint to {path}")
        vec_normalize = self.model.get_vec_normalize_env()
        if self.save_vecnormalize and vec_normalize is not None:
            path = atomic_write(self._checkpoint_path("vecnormalize_", extension="pkl"), vec_normalize.save)
            if self.verbose >= 2:
                print(f"Saving model VecNormalize to {path}")
        self.last_checkpoint = model_path
        if self.keep_last is not None:
            self._prune()
        return model_path

    def _on_step(self) -> bool:
        if self.n_calls % self.save_freq == 0:
            self.save_checkpoint()
        return True

    def _prune(self) -> None:
        folder = Path(self.save_path)
        steps = sorted(
            s for s in (_checkpoint_steps(e.name, self.name_prefix) for e in folder.iterdir()) if s is not None
        )
        for old in steps[: -self.keep_last]:
            for kind, ext in (("", "zip"), ("replay_buffer_", "pkl"), ("vecnormalize_", "pkl")):
                (folder / f"{self.name_prefix}_{kind}{old}_steps.{ext}").unlink(missing_ok=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    return True


# ---------------------------------------------------------------------------------------------------------
# Evaluation-driven callbacks
# ---------------------------------------------------------------------------------------------------------
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
        self.eval_freq = _check_positive_int("eval_freq", eval_freq)
        self.n_eval_episodes = _check_positive_int("n_eval_episodes", n_eval_episodes)
        self.deterministic = deterministic
        self.evaluations: list[tuple[int, float]] = []
        self._next_eval = 0
        self._stop = False

    def _init_callback(self) -> None:
        self._next_eval = self.num_timesteps + self.eval_freq

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
        self.patience = _check_positive_int("patience", patience)
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
                    f"Early stopping at {self.num_timesteps} timesteps: no improvement over {self.best_mean_reward:.3f} "
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
        self.max_rollbacks = _check_positive_int("max_rollbacks", max_rollbacks)
        self.best_mean_reward = -math.inf
        self.n_rollbacks = 0
        self.rollbacks: list[tuple[int, str]] = []
        self._good: dict[str, Any] | None = None

    def _init_callback(self) -> None:
        super()._init_callback()
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
                    reason = f"evaluation reward {mean:.4g} fell more than {limit:.4g} below the best {self.best_mean_reward:.4g}"
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
def _progress(callback: BaseCallback, total_timesteps: int | None) -> float:
    """``t / T`` in [0, 1]: ``t`` the model's timesteps, ``T`` the given total or the one ``learn`` was given."""
    total = total_timesteps if total_timesteps is not None else getattr(callback.model, "_total_timesteps", 0)
    if not total:
        return 0.0
    return float(min(1.0, max(0.0, callback.model.num_timesteps / total)))


class GammaSchedule(BaseCallback):
    """Discount factor schedule ``gamma_t = gamma_min + (gamma_max - gamma_min) * t / T``.

    ``t`` is the model's ``num_timesteps`` and ``T`` is ``total_timesteps`` (default: the total of the current
    ``learn`` call, counted from 0 or, with ``reset_num_timesteps=False``, from where the model was); ``t / T``
    is clipped to [0, 1]. Before each rollout the value is written to ``model.gamma`` (used for the timeout
    bootstrap) and ``model.rollout_buffer.gamma`` (used for the returns and GAE), and logged as ``train/gamma``.

    :param gamma_min: Discount at ``t = 0``, in [0, 1].
    :param gamma_max: Discount at ``t = T``, in [0, 1] (it may be below ``gamma_min`` for a decreasing schedule).
    :param total_timesteps: ``T`` (``None``: the ``learn`` call's).
    """

    def __init__(self, gamma_min: float, gamma_max: float, total_timesteps: int | None = None, verbose: int = 0):
        super().__init__(verbose)
        for name, value in (("gamma_min", gamma_min), ("gamma_max", gamma_max)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be a discount factor in [0, 1], got {value!r}")
        if total_timesteps is not None:
            _check_positive_int("total_timesteps", total_timesteps)
        self.gamma_min, self.gamma_max = float(gamma_min), float(gamma_max)
        self.total_timesteps = total_timesteps

    def value(self, progress: float) -> float:
        """``gamma_min + (gamma_max - gamma_min) * progress``."""
        return self.gamma_min + (self.gamma_max - self.gamma_min) * progress

    def _apply(self) -> None:
        gamma = self.value(_progress(self, self.total_timesteps))
        self.model.gamma = gamma
        buffer = getattr(self.model, "rollout_buffer", None)
        if buffer is not None:
            buffer.gamma = gamma
        self.logger.record("train/gamma", gamma)

    def _on_training_start(self) -> None:
        self._apply()

    def _on_rollout_start(self) -> None:
        self._apply()

    def _on_step(self) -> bool:
        return True


class MaxNewTokensCurriculum(BaseCallback):
    """Short completions first, longer later: lower the text env's episode budget at rollout boundaries.

    The env keeps its observation width (``max_prompt_tokens + max_new_tokens`` it was built with); the
    curriculum only lowers the number of tokens an episode may generate, via the env's
    ``set_max_new_tokens(n)`` (:meth:`textrl_envs.vector.TextGenVectorEnv.set_max_new_tokens`, reached
    through ``VecEnv.env_method``). So build the env with the largest budget of the curriculum.

    ``schedule`` is either a list of ``(timestep, max_new_tokens)`` stages (from ``timestep`` on, episodes get
    that budget; the first stage should start at 0) or a callable ``f(progress) -> int`` of the training
    progress ``t / T`` in [0, 1] (see :meth:`linear`). ``None`` from the callable means the env's full budget.
    The budget in use is logged as ``rollout/max_new_tokens``; at the end of training the env's full budget is
    restored (``restore_at_end``).

    :param schedule: Stages or a callable, see above.
    :param total_timesteps: ``T`` for a callable schedule (``None``: the ``learn`` call's total).
    :param restore_at_end: Give the env its full budget back when training ends.
    """

    def __init__(
        self,
        schedule: Sequence[tuple[int, int]] | Callable[[float], int | None],
        total_timesteps: int | None = None,
        restore_at_end: bool = True,
        verbose: int = 0,
    ):
        super().__init__(verbose)
        if callable(schedule):
            self._stages = None
            self._fn = schedule
        else:
            try:
                stages = sorted((int(t), int(n)) for t, n in schedule)
            except (TypeError, ValueError):
                raise ValueError(
                    f"schedule must be a list of (timestep, max_new_tokens) pairs, e.g. [(0, 4), (5000, 8)], or a "
                    f"callable progress -> max_new_tokens; got {schedule!r}"
                ) from None
            if not stages:
                raise ValueError("schedule is empty; give at least one (timestep, max_new_tokens) stage, e.g. [(0, 4)]")
            for t, n in stages:
                if t < 0 or n < 1:
                    raise ValueError(f"stage ({t}, {n}): timesteps must be >= 0 and max_new_tokens >= 1")
            self._stages, self._fn = stages, None
        if total_timesteps is not None:
            _check_positive_int("total_timesteps", total_timesteps)
        self.total_timesteps = total_timesteps
        self.restore_at_end = restore_at_end
        self.current: int | None = None

    @staticmethod
    def linear(start: int, end: int) -> Callable[[float], int]:
        """A schedule ``round(start + (end - start) * progress)``, for ``schedule=``."""
        _check_positive_int("start", start)
        _check_positive_int("end", end)

        def budget(progress: float) -> int:
            return round(start + (end - start) * progress)

        return budget

    def budget(self) -> int | None:
        """The budget the schedule gives now."""
        if self._stages is not None:
            n = self._stages[0][1]
            for t, m in self._stages:
                if self.model.num_timesteps >= t:
                    n = m
            return n
        return self._fn(_progress(self, self.total_timesteps))  # type: ignore[misc]

    def _set(self, n: int | None) -> None:
        env = self.training_env
        try:
            env.env_method("set_max_new_tokens", n)
        except AttributeError:
            raise TypeError(
                f"MaxNewTokensCurriculum needs a text env with set_max_new_tokens (textrl_envs.sb3.make_vec_env or "
                f"gym.make of a textrl_envs id); the training env {type(env).__name__} has none"
            ) from None
        self.current = n
        if n is not None:
            self.logger.record("rollout/max_new_tokens", n)

    def _on_training_start(self) -> None:
        self._set(self.budget())

    def _on_rollout_start(self) -> None:
        n = self.budget()
        if n != self.current:
            self._set(n)

    def _on_training_end(self) -> None:
        if self.restore_at_end:
            self._set(None)

    def _on_step(self) -> bool:
        return True


# ---------------------------------------------------------------------------------------------------------
# Monitors
# ---------------------------------------------------------------------------------------------------------
class TrainingMonitor(BaseCallback):
    """Warn when the gradient norm or the KL of an update passes a threshold.

    Reads what the algorithm logged for its last update (``GRPO`` logs ``train/grad_norm_max`` /
    ``train/grad_norm`` (before clipping), ``train/kl_ref`` (KL to the reference policy, with ``kl_coef > 0``)
    and ``train/approx_kl`` (between iterations); stock ``PPO`` only the last) after each update, i.e. at the
    next rollout start and at the end of training. Each crossing issues a :class:`TrainingAlertWarning`, is
    appended to ``alerts`` as ``(update, key, value, limit)`` and counted in ``monitor/alerts``; with
    ``stop_on_alert=True`` training stops at the next step.

    :param max_grad_norm: Gradient norm above which to warn (``None``: not checked).
    :param kl_target: KL to the reference policy above which to warn (``None``: not checked).
    :param approx_kl_target: ``approx_kl`` between iterations above which to warn (``None``: not checked).
    :param stop_on_alert: Stop training at the first alert.
    """

    def __init__(
        self,
        max_grad_norm: float | None = None,
        kl_target: float | None = None,
        approx_kl_target: float | None = None,
        stop_on_alert: bool = False,
        verbose: int = 0,
    ):
        super().__init__(verbose)
        limits = {"max_grad_norm": max_grad_norm, "kl_target": kl_target, "approx_kl_target": approx_kl_target}
        for name, value in limits.items():
            if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0 or None, got {value!r}")
        if all(v is None for v in limits.values()):
            raise ValueError("TrainingMonitor needs at least one of max_grad_norm, kl_target, approx_kl_target")
        self.max_grad_norm, self.kl_target, self.approx_kl_target = max_grad_norm, kl_target, approx_kl_target
        self.stop_on_alert = stop_on_alert
        self.alerts: list[tuple[int, str, float, float]] = []
        self._checked_update = -1
        self._stop = False

    def _checks(self) -> list[tuple[tuple[str, ...], float | None, str]]:
        return [
            (
                ("train/grad_norm_max", "train/grad_norm"),
                self.max_grad_norm,
                "lower the learning rate or scale the rewards",
            ),
            (("train/kl_ref",), self.kl_target, "raise kl_coef (or set kl_target on GRPO) or lower the learning rate"),
            (("train/approx_kl",), self.approx_kl_target, "lower the learning rate or n_epochs, or set target_kl"),
        ]

    def check(self) -> list[tuple[int, str, float, float]]:
        """Check the last update's logged values now; return the new alerts."""
        n_updates = int(getattr(self.model, "_n_updates", 0))
        if n_updates == self._checked_update or n_updates == 0:
            return []
        self._checked_update = n_updates
        logged = self.model.logger.name_to_value
        new = []
        for keys, limit, advice in self._checks():
            key = next((k for k in keys if k in logged), None)
            if limit is None or key is None:
                continue
            value = float(logged[key])
            if not math.isfinite(value) or value > limit:
                new.append((n_updates, key, value, float(limit)))
                warnings.warn(
                    f"TrainingMonitor: {key} = {value:.4g} exceeds {limit:g} at update {n_updates} "
                    f"({self.model.num_timesteps} timesteps); {advice}",
                    TrainingAlertWarning,
                    stacklevel=2,
                )
        if new:
            self.alerts.extend(new)
            self.logger.record("monitor/alerts", len(self.alerts))
            if self.stop_on_alert:
                self._stop = True
        return new

    def _on_rollout_start(self) -> None:
        self.check()

    def _on_training_end(self) -> None:
        self.check()

    def _on_step(self) -> bool:
        return not self._stop
