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
* :class:`ElasticCheckpointCallback`: atomic checkpoints after updates, and a restarted script (``torchrun
  --max-restarts``, or a rerun after a crash) resumes from the newest one by itself.
* :class:`EarlyStoppingCallback`: stop when the evaluation reward has not improved for ``patience``
  evaluations; keep (and restore, and save) the best model.
* :class:`RollbackCallback`: go back to the best earlier state when the evaluation reward collapses or the
  weights become non-finite.
* :class:`LMEvalCallback`: evaluate a language model on held-out prompts during training (greedy and sampled
  reward, pass@k, mean@k, length, distinct-n, repetition, perplexity); keep the best.
* :class:`MaxNewTokensCurriculum`: short completions first, longer later (text envs).
* :class:`PassRateCurriculum`: stop drawing (or down-weight) prompts the policy now always or never solves, by
  each prompt's recent pass rate (text envs).
* :class:`StagedCurriculum`: stages of tasks: from each stage's timestep on, only that stage's prompts are drawn.
* :class:`LevelCurriculum`: difficulty levels (reasoning-gym's own knobs): the next level once the current one is
  passed.
* :class:`GammaSchedule`: ``gamma_t = gamma_min + (gamma_max - gamma_min) * t / T``.
* :class:`TrainingMonitor`: warn when the gradient norm or the KL (to the reference, or between
  iterations) passes a threshold, or the value-return correlation falls below one.
* :class:`PrometheusOutputFormat`: the run's scalars as Prometheus gauges on a local port (``"prometheus"`` in
  :func:`configure_logger`), and :func:`write_alert_rules`, a Prometheus rules file for the same thresholds.
* :func:`configure_logger`: SB3's ``configure`` that also knows the trackers ``"wandb"`` and ``"mlflow"``
  (:class:`WandbOutputFormat`, :class:`MLflowOutputFormat`, optional extras), with the run's config.
* :class:`TrainerStateCallback`: the ``trainer_state`` TRL-style rewards read, for stock SB3 algorithms (those of
  this package set it themselves).
* :class:`CompletionLogger`: every N rollouts, a sample of the finished episodes' text (prompt, completion or
  transcript, reward, turns, group) to a JSONL file, tensorboard's text tab and the trackers' tables; and the
  component means of a composite reward.

Evaluations, rollbacks and schedules act at rollout boundaries (``on_rollout_start``), never in the middle of a
rollout, so an on-policy update never mixes data from two policies.
"""

from sb3_grpo.callbacks._common import TrainingAlertWarning
from sb3_grpo.callbacks.checkpoint import AtomicCheckpointCallback, ElasticCheckpointCallback
from sb3_grpo.callbacks.completions import CompletionLogger
from sb3_grpo.callbacks.curriculum import LevelCurriculum, PassRateCurriculum, StagedCurriculum
from sb3_grpo.callbacks.evaluation import EarlyStoppingCallback, RollbackCallback
from sb3_grpo.callbacks.lm_eval import LMEvalCallback
from sb3_grpo.callbacks.monitor import TrainingMonitor
from sb3_grpo.callbacks.prometheus import PrometheusOutputFormat, alert_rules, write_alert_rules
from sb3_grpo.callbacks.schedules import GammaSchedule, MaxNewTokensCurriculum
from sb3_grpo.callbacks.trackers import (
    SB3_FORMATS,
    MLflowOutputFormat,
    Table,
    WandbOutputFormat,
    configure_logger,
    log_config,
    run_config,
)
from sb3_grpo.callbacks.trainer_state import TrainerStateCallback
from sb3_grpo.common.checkpoints.files import (
    atomic_save,
    is_complete_checkpoint,
    latest_checkpoint,
    nonfinite_parameters,
)
from sb3_grpo.file_io import TMP_SUFFIX, atomic_write

__all__ = [
    "SB3_FORMATS",
    "TMP_SUFFIX",
    "AtomicCheckpointCallback",
    "CompletionLogger",
    "ElasticCheckpointCallback",
    "EarlyStoppingCallback",
    "GammaSchedule",
    "LMEvalCallback",
    "MLflowOutputFormat",
    "LevelCurriculum",
    "MaxNewTokensCurriculum",
    "PassRateCurriculum",
    "PrometheusOutputFormat",
    "RollbackCallback",
    "StagedCurriculum",
    "Table",
    "TrainingAlertWarning",
    "TrainerStateCallback",
    "TrainingMonitor",
    "WandbOutputFormat",
    "alert_rules",
    "atomic_save",
    "atomic_write",
    "configure_logger",
    "is_complete_checkpoint",
    "latest_checkpoint",
    "log_config",
    "nonfinite_parameters",
    "run_config",
    "write_alert_rules",
]
