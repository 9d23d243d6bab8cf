"""Which run owns a checkpoint folder: every checkpoint the callbacks write records the configuration of its run, so
that another run given the same folder does not resume from them, or prune them, by mistake.

:func:`run_identity` describes a model's run: the algorithm, the policy, the spaces and every hyperparameter SB3 saves
(not the counters, the statistics or the last observation), as plain JSON; :func:`config_hash` hashes it.
:func:`add_run_record` writes it into a checkpoint zip as one more entry (:data:`RECORD_ENTRY`, which SB3's ``load``
ignores). :func:`claim_folder` compares this run's with the record of the folder's newest checkpoint and, for a
different run, refuses the folder, resumes anyway, or moves the other run's checkpoints aside, as the caller asks.
The checkpoint callbacks (:class:`~sb3_grpo.callbacks.AtomicCheckpointCallback`,
:class:`~sb3_grpo.callbacks.ElasticCheckpointCallback`) do both.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
import zipfile
from pathlib import Path
from typing import Any

__all__ = [
    "OTHER_RUN",
    "RECORD_ENTRY",
    "add_run_record",
    "claim_folder",
    "config_hash",
    "read_run_record",
    "run_identity",
    "run_record",
]

#: What a checkpoint callback does with a folder that another run's checkpoints are in.
OTHER_RUN = ("refuse", "resume", "overwrite")
#: The checkpoint zip's entry that holds its run's record.
RECORD_ENTRY = "sb3_grpo_run.json"

# attributes that change while a run trains (gamma under GammaSchedule, kl_coef under kl_target's adaptive control:
# a model loaded from the run's own checkpoint holds their values of that moment), or say nothing about what it
# computes
_VOLATILE = {"num_timesteps", "start_time", "verbose", "tensorboard_log", "ep_info_buffer", "ep_success_buffer",
             "lr_schedule", "carry_over_on", "gamma", "kl_coef"}  # fmt: skip


def _describe(value: Any, where: str) -> Any:
    """``value`` as JSON that is the same in every process that builds the same run (code by its name only)."""
    from sb3_grpo.common.checkpoints.safetensors_format import encode

    try:
        return encode(value, None, where)
    except ValueError:
        kind = value if isinstance(value, type) else type(value)
        name = getattr(value, "__qualname__", None) or kind.__qualname__
        return {":code:": f"{getattr(value, '__module__', kind.__module__)}.{name}"}


def run_identity(model: Any) -> dict[str, Any]:
    """The run's configuration: ``{"algorithm": "module:Class", "config": {attribute: JSON}}``.

    The attributes are those SB3 saves, less the ones that change as it trains; the seed is the run's (rank 0's under
    ``torch.distributed``), so every rank of one run describes it the same.
    """
    from sb3_grpo import distributed

    excluded = set(model._excluded_save_params()) | _VOLATILE
    config = {}
    for key, value in sorted(model.__dict__.items()):
        if key.startswith("_") or key in excluded:
            continue
        if key == "seed" and isinstance(value, int):
            value -= distributed.SEED_STRIDE * distributed.get_rank()
        config[key] = _describe(value, key)
    cls = type(model)
    return {"algorithm": f"{cls.__module__}:{cls.__qualname__}", "config": config}


def config_hash(identity: dict[str, Any]) -> str:
    """A short hash of a :func:`run_identity` (hex)."""
    text = json.dumps(identity, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def run_record(model: Any) -> dict[str, Any]:
    """The record a checkpoint of ``model``'s run holds: ``{"config_hash", "algorithm", "config"}``."""
    identity = run_identity(model)
    return {"config_hash": config_hash(identity), **identity}


def add_run_record(path: str | os.PathLike, record: dict[str, Any]) -> None:
    """Add ``record`` to the checkpoint zip ``path`` (nothing when no file was written, e.g. a rank > 0)."""
    if os.path.isfile(path):
        with zipfile.ZipFile(path, "a") as archive:
            archive.writestr(RECORD_ENTRY, json.dumps(record, sort_keys=True))


def read_run_record(path: str | os.PathLike) -> dict[str, Any] | None:
    """The run record of a checkpoint zip (``None`` when it has none, e.g. one saved by ``model.save``)."""
    try:
        with zipfile.ZipFile(path) as archive:
            record = json.loads(archive.read(RECORD_ENTRY).decode("utf-8"))
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("config_hash"), str) else None


def _differences(ours: dict[str, Any], theirs: dict[str, Any]) -> list[str]:
    """The first settings that differ between two identities, as ``name: this run's value, the folder's``."""

    def short(value: Any) -> str:
        text = json.dumps(value, sort_keys=True)
        return text if len(text) <= 60 else text[:57] + "..."

    out = []
    if ours.get("algorithm") != theirs.get("algorithm"):
        out.append(f"algorithm {ours.get('algorithm')} (the folder's: {theirs.get('algorithm')})")
    mine, other = ours.get("config", {}), theirs.get("config", {})
    for key in sorted(set(mine) | set(other)):
        if mine.get(key) != other.get(key):
            out.append(f"{key}={short(mine.get(key))} (the folder's: {short(other.get(key))})")
    return out


def _move_aside(folder: Path, name_prefix: str) -> Path:
    """Move the checkpoints of ``name_prefix`` (and their companion files) into a new subfolder."""
    aside = folder / f"replaced-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    aside.mkdir()
    pattern = re.compile(re.escape(name_prefix) + r"_(.+_)?\d+_steps\.(zip|pkl)")
    for entry in folder.iterdir():
        if entry.is_file() and pattern.fullmatch(entry.name):
            entry.rename(aside / entry.name)
    return aside


def claim_folder(folder: str | os.PathLike, name_prefix: str, model: Any, other_run: str = "refuse") -> str:
    """Check that ``folder``'s checkpoints are this run's, or refuse them: what the checkpoint callbacks do when
    training starts.

    A folder whose newest checkpoint holds no record (none yet, or saved by ``model.save`` or SB3's own callback) is
    this run's. One whose record is this run's configuration is this run's already (a restart). Another run's folder
    is refused (``other_run="refuse"``); with ``"resume"`` this run continues from its checkpoints anyway when the
    algorithm is the same (its own checkpoints then record it); with ``"overwrite"`` the other run's checkpoints are
    moved into ``<folder>/replaced-<time>-<pid>/`` and this run starts afresh. Only rank 0 moves files.

    :return: ``"new"``, ``"same"``, ``"resume"`` or ``"overwrite"``: what happened.
    :raises ValueError: for another run's folder (refused), naming the settings that differ and the ways out.
    """
    from sb3_grpo import distributed
    from sb3_grpo.common.checkpoints.files import latest_checkpoint

    if other_run not in OTHER_RUN:
        raise ValueError(f"other_run must be one of {OTHER_RUN}, got {other_run!r}")
    newest = latest_checkpoint(folder, name_prefix)
    record = None if newest is None else read_run_record(newest)
    if record is None:
        return "new"
    ours = run_record(model)
    if record["config_hash"] == ours["config_hash"]:
        return "same"
    if other_run == "refuse" or (other_run == "resume" and record.get("algorithm") != ours["algorithm"]):
        differences = _differences(ours, record)
        raise ValueError(
            f"the checkpoint folder {os.fspath(folder)!r} belongs to another run (config hash {record['config_hash']} "
            f"in {newest.name}, this run's {ours['config_hash']}): {'; '.join(differences[:6]) or 'other settings'}. "
            + (
                "A checkpoint of another algorithm cannot be resumed; "
                if other_run == "resume"
                else "Pass other_run='resume' to continue from its checkpoints anyway, "
            )
            + "other_run='overwrite' to move them aside and start afresh, or another save_path"
        )
    if other_run == "overwrite":
        if distributed.is_main_process():
            _move_aside(Path(folder), name_prefix)
        if distributed.is_active():
            import torch.distributed as dist

            dist.barrier()  # no rank looks for checkpoints while rank 0 moves them aside
    return other_run
