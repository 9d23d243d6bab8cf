"""Crash-safe checkpoints: :class:`AtomicCheckpointCallback` (SB3's ``CheckpointCallback``, written atomically), and
:class:`ElasticCheckpointCallback`, which also resumes a restarted run (``torchrun --max-restarts``) by itself."""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path
from typing import Any

from stable_baselines3.common.callbacks import CheckpointCallback

from sb3_grpo.callbacks._common import TrainingAlertWarning, check_positive_int
from sb3_grpo.common.checkpoints.files import _checkpoint_steps, nonfinite_parameters, resume_in_place
from sb3_grpo.common.checkpoints.run_record import OTHER_RUN, add_run_record, claim_folder, run_record
from sb3_grpo.file_io import TMP_SUFFIX, atomic_write
from textrl_envs.validation import check_choice

__all__ = ["AtomicCheckpointCallback", "ElasticCheckpointCallback"]


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
    :param other_run: What to do when training starts with the folder holding another run's checkpoints (every
        checkpoint records its run's configuration; see :func:`~sb3_grpo.common.checkpoints.run_record.claim_folder`):
        ``"refuse"`` (the default: a ``ValueError`` naming the settings that differ), ``"resume"`` (take the folder
        over and write on), ``"overwrite"`` (move the other run's checkpoints into a ``replaced-...`` subfolder
        first).
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
        other_run: str = "refuse",
    ):
        check_positive_int("save_freq", save_freq)
        check_choice("other_run", other_run, OTHER_RUN)
        if keep_last is not None:
            check_positive_int("keep_last", keep_last)
        if not name_prefix or os.sep in name_prefix:
            raise ValueError(
                f"name_prefix must be a non-empty file name prefix without {os.sep!r}, got {name_prefix!r}"
            )
        if not isinstance(save_path, (str, os.PathLike)) or not os.fspath(save_path):
            raise TypeError(f"save_path must be a folder path (str), got {save_path!r}; e.g. save_path='runs/ckpt'")
        if os.path.exists(save_path) and not os.path.isdir(save_path):
            raise ValueError(
                f"save_path {os.fspath(save_path)!r} is a file, not a folder; give the folder the checkpoints go to "
                "(it is created), e.g. save_path='runs/ckpt'"
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
        self.other_run = other_run
        self.n_skipped_nonfinite = 0
        self.last_checkpoint: Path | None = None
        self._run_record: dict[str, Any] | None = None  # this run's configuration, read when training starts

    def _init_callback(self) -> None:
        super()._init_callback()
        self._remove_stale_temp_files()
        claim_folder(self.save_path, self.name_prefix, self.model, self.other_run)
        self._run_record = run_record(self.model)

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
        record = self._run_record or run_record(self.model)

        def save(tmp: str) -> None:
            self.model.save(tmp)
            add_run_record(tmp, record)  # which run wrote it: another run given this folder is refused

        model_path = atomic_write(self._checkpoint_path(extension="zip"), save)
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


class ElasticCheckpointCallback(AtomicCheckpointCallback):
    """Atomic checkpoints after every ``save_freq`` updates, and a restarted script resumes from the newest one.

    For ``torchrun --max-restarts N``: when a rank dies, torchrun stops the others and runs the script again on
    every rank; ``model.learn(total_timesteps, callback=ElasticCheckpointCallback(...))`` then loads the newest
    complete checkpoint into the new model before training (weights, optimizer state, ``num_timesteps``, the update
    count, the schedules' position, the exploration RNG, the adaptive ``kl_coef``:
    :func:`~sb3_grpo.common.checkpoints.files.resume_in_place`), and ``learn`` trains on to the same
    ``total_timesteps``. On a first start there is no checkpoint and nothing changes. It works the same without torchrun
    (run the script again after a crash).

    The checkpoints are written at the start of a rollout, after the previous update, so a resumed run has the
    step count and the number of updates of a run that never died and loses at most ``save_freq`` updates of work.
    Its parameters differ from that run's: the envs restart their episodes (and their seeds) and the global RNG
    streams of torch and NumPy start again, since SB3 saves neither. Every rank must see the same folder; only rank
    0 writes (``data_parallel="ddp"``).

    :param save_freq: Save after every ``save_freq`` updates (rollouts).
    :param save_path: The checkpoint folder (created if needed), read again at a restart.
    :param name_prefix: Common prefix of the files.
    :param keep_last: Keep only the newest ``keep_last`` checkpoints; ``None`` keeps all.
    :param verbose: 1 prints where a run resumed from; 2 also every save.
    :param other_run: What to do when the folder holds another run's checkpoints (another configuration, e.g. another
        learning rate or algorithm): ``"refuse"`` (the default), ``"resume"`` (resume from them anyway; never across
        algorithms, windows or envs), ``"overwrite"`` (move them aside and start afresh); see
        :class:`AtomicCheckpointCallback`.
    :param trusted: Read the checkpoint's pickled entries without the allow-list (runs code from the file; see
        :func:`~sb3_grpo.common.checkpoints.files.resume_in_place`). By default a checkpoint that names code is refused.
    """

    def __init__(
        self,
        save_freq: int,
        save_path: str | os.PathLike,
        name_prefix: str = "rl_model",
        keep_last: int | None = None,
        verbose: int = 0,
        trusted: bool = False,
        other_run: str = "refuse",
    ):
        super().__init__(
            save_freq, save_path, name_prefix=name_prefix, keep_last=keep_last, verbose=verbose, other_run=other_run
        )
        self.resumed_from: Path | None = None
        self.trusted = bool(trusted)
        self._rollouts = 0

    def _init_callback(self) -> None:
        super()._init_callback()
        self.resumed_from = resume_in_place(self.model, self.save_path, self.name_prefix, trusted=self.trusted)
        if self.resumed_from is not None and self.verbose >= 1:
            print(f"Resumed from {self.resumed_from} at {self.model.num_timesteps} timesteps")

    def _on_rollout_start(self) -> None:
        # after the previous rollout's update: the state a restart resumes from (not at the run's first rollout)
        if self._rollouts > 0 and self._rollouts % self.save_freq == 0:
            self.save_checkpoint()
        self._rollouts += 1

    def _on_step(self) -> bool:
        return True


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
