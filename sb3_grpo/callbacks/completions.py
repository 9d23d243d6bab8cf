""":class:`CompletionLogger`: a sample of the finished episodes' text, every N rollouts, to tensorboard, the trackers
and a JSONL file; and each component's mean of a composite reward."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from stable_baselines3.common.callbacks import BaseCallback

from sb3_grpo.callbacks._common import check_positive_int, env_chain
from sb3_grpo.callbacks.trackers import SB3_FORMATS, Table

__all__ = [
    "COMPLETION_COLUMNS",
    "CompletionLogger",
    "completion_row",
    "composite_rewards",
    "markdown_table",
    "table_rows",
]

#: The columns of a completion row, in the order of the tables.
COMPLETION_COLUMNS = (
    "timestep",
    "rollout",
    "env",
    "group_id",
    "episode_id",
    "prompt",
    "completion",
    "reward",
    "reward_components",
    "length",
    "turns",
    "transcript",
)


def _plain(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    return value


def transcript_text(transcript: Sequence[Mapping[str, Any]] | None) -> str | None:
    """An interactive episode's transcript as lines ``role: text``."""
    if transcript is None:
        return None
    return "\n".join(f"{m.get('role', '?')}: {m.get('text', '')}" for m in transcript)


def completion_row(info: Mapping[str, Any], env_index: int, timestep: int, rollout: int) -> dict[str, Any]:
    """One finished episode's row, from what the env already put in its final ``info`` (no decoding here).

    :param info: The info of the step that ended the episode (``prompt``, ``completion``, ``completion_ids``,
        ``reward``; ``reward_components`` for a composite reward; ``turns`` and ``transcript`` for interactive
        episodes; ``group_id``, ``episode_id`` from the SB3 adapter).
    :param env_index: The env that played it.
    :param timestep: The training timestep of the sample.
    :param rollout: The rollout's number (0 for the first).
    :return: A dict with the keys of :data:`COMPLETION_COLUMNS`.
    """
    reward = info.get("reward")
    if reward is None and isinstance(info.get("episode"), Mapping):
        reward = info["episode"].get("r")
    ids = info.get("completion_ids")
    transcript = info.get("transcript")
    parts = info.get("reward_components")
    return {
        "timestep": int(timestep),
        "rollout": int(rollout),
        "env": int(env_index),
        "group_id": _plain(info.get("group_id")),
        "episode_id": _plain(info.get("episode_id")),
        "prompt": info.get("prompt"),
        "completion": info.get("completion"),
        "reward": None if reward is None else float(reward),
        "reward_components": None if parts is None else {str(k): float(v) for k, v in parts.items()},
        "length": None if ids is None else len(ids),
        "turns": _plain(info.get("turns")),
        "transcript": None if transcript is None else [dict(m) for m in transcript],
    }


def table_rows(rows: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[dict[str, Any]]]:
    """The columns and rows of the tables (tensorboard, trackers): :data:`COMPLETION_COLUMNS` that some row fills, a
    transcript as lines, and each reward component as its own column ``reward.<label>`` after ``reward``."""
    labels = list(dict.fromkeys(k for row in rows for k in (row.get("reward_components") or {})))
    columns: list[str] = []
    for c in COMPLETION_COLUMNS:
        if c == "reward_components":
            columns += [f"reward.{label}" for label in labels]
        elif any(row.get(c) is not None for row in rows):
            columns.append(c)
    shown = []
    for row in rows:
        flat = {**row, "transcript": transcript_text(row.get("transcript"))}
        for label, value in (row.get("reward_components") or {}).items():
            flat[f"reward.{label}"] = value
        shown.append(flat)
    return columns, shown


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value).replace("|", "\\|").replace("\n", "<br>")


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    """``rows`` as a Markdown table (what tensorboard's text tab renders)."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(_cell(row.get(c)) for c in columns) + " |")
    return "\n".join(lines)


def composite_rewards(env: Any) -> list[Any]:
    """The reward models of ``env`` (an SB3 VecEnv or a gymnasium env, wrappers included) that report component
    means (:meth:`~textrl_envs.rewards.CompositeReward.component_reader`), each once."""
    found: list[Any] = []
    for obj in env_chain(env):
        reward = getattr(getattr(obj, "text_spec", None), "reward", None)
        if callable(getattr(reward, "component_reader", None)) and all(reward is not r for r in found):
            found.append(reward)
    return found


class CompletionLogger(BaseCallback):
    """Every ``every_n_rollouts`` rollouts, log a sample of the episodes that finished in it: prompt, completion (or
    an interactive episode's transcript), reward, its components (a composite reward's unweighted score of each
    component for that episode), length in tokens, turns, group and episode id.

    The text is what the env already decoded for its reward (the final ``info`` of each episode), so logging costs no
    decoding. Rewards scored in the background have landed in the infos by the end of the rollout, when the sample is
    written. The sample goes to

    * a JSONL file, one object per episode (``path``; default ``completions.jsonl`` in the logger's folder), the
      components as ``"reward_components": {label: score}``;
    * tensorboard's text tab as a Markdown table (``completions/samples``), through SB3's own tensorboard format;
    * the trackers of :func:`~sb3_grpo.callbacks.configure_logger` as a table (``completions/table``: a
      ``wandb.Table``, an MLflow ``log_table`` artifact).

    The logger writes the table at its next dump, at the end of the rollout's iteration (with ``log_interval > 1``
    only the latest sample reaches tensorboard and the trackers; the JSONL file has every one). With
    ``log_components`` every rollout also logs ``reward/<label>``: each component's mean score (unweighted) over the
    rollout's episodes, for an env whose reward is a :class:`~textrl_envs.rewards.CompositeReward`.

    :param every_n_rollouts: Rollouts between two samples (the first rollout is sampled).
    :param n_samples: Episodes per sample (fewer when fewer finished), drawn uniformly without replacement.
    :param path: The JSONL file (appended to), or ``None`` for ``completions.jsonl`` in the logger's folder (no file
        when the logger has none).
    :param seed: Seed of the draws.
    :param log_components: Log the component means of a composite reward.
    :param key: The logger keys' prefix (``<key>/samples``, ``<key>/table``), for two loggers in one run.
    :param verbose: 1 prints where the samples go.
    """

    def __init__(
        self,
        every_n_rollouts: int = 1,
        n_samples: int = 8,
        path: str | os.PathLike | None = None,
        seed: int = 0,
        log_components: bool = True,
        key: str = "completions",
        verbose: int = 0,
    ) -> None:
        super().__init__(verbose)
        if not isinstance(key, str) or not key:
            raise ValueError(f"key must be a non-empty str (the prefix of the logged keys), got {key!r}")
        self.key = key
        self.every_n_rollouts = check_positive_int("every_n_rollouts", every_n_rollouts)
        self.n_samples = check_positive_int("n_samples", n_samples)
        self.path = Path(path) if path is not None else None
        self.log_components = log_components
        self._rng = np.random.default_rng(seed)
        self._rollout = -1
        self._collecting = False
        self._seen = 0
        self._kept: list[tuple[int, dict]] = []
        self._readers: list[Any] = []  # one ComponentMeanReader per composite reward of the env
        #: The rows written, by rollout (the latest last).
        self.samples: list[list[dict[str, Any]]] = []

    def _init_callback(self) -> None:
        if self.path is None:
            folder = self.logger.get_dir() if self.logger is not None else None
            if folder:
                self.path = Path(folder) / "completions.jsonl"
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if self.verbose >= 1:
                print(f"CompletionLogger: samples to {self.path}")
        rewards = composite_rewards(self.training_env) if self.log_components else []
        self._readers = [reward.component_reader() for reward in rewards]  # counting from this training run

    def _on_rollout_start(self) -> None:
        self._rollout += 1
        self._collecting = self._rollout % self.every_n_rollouts == 0
        self._seen, self._kept = 0, []

    def _on_step(self) -> bool:
        if not self._collecting:
            return True
        dones, infos = self.locals.get("dones"), self.locals.get("infos")
        if dones is None or infos is None:
            return True
        for i in np.flatnonzero(np.asarray(dones)):
            info = infos[i]
            if "completion" not in info:
                continue
            # reservoir sampling: every finished episode of the rollout equally likely to be kept
            self._seen += 1
            if len(self._kept) < self.n_samples:
                self._kept.append((int(i), info))
            else:
                j = int(self._rng.integers(self._seen))
                if j < self.n_samples:
                    self._kept[j] = (int(i), info)
        return True

    def _on_rollout_end(self) -> None:
        for reader in self._readers:
            for label, mean in reader.pop().items():
                self.logger.record(f"reward/{label}", mean)
        if not self._collecting or not self._kept:
            return
        rows = [completion_row(info, i, self.num_timesteps, self._rollout) for i, info in self._kept]
        self._kept = []
        self.samples.append(rows)
        if self.path is not None:
            with open(self.path, "a", encoding="utf-8") as f:
                for row in rows:
                    f.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
        columns, shown = table_rows(rows)
        not_tensorboard = tuple(f for f in SB3_FORMATS if f != "tensorboard") + ("wandb", "mlflow")
        self.logger.record(f"{self.key}/samples", markdown_table(shown, columns), exclude=not_tensorboard)
        table = Table(columns=tuple(columns), rows=[tuple(row.get(c) for c in columns) for row in shown])
        self.logger.record(f"{self.key}/table", table, exclude=SB3_FORMATS)
