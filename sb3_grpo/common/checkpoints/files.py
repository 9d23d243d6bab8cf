"""Checkpoint files: saved atomically, never with non-finite weights, found again after a crash.

:func:`atomic_save` writes through :func:`~sb3_grpo.file_io.atomic_write` (temp file, ``fsync``, rename);
:func:`is_complete_checkpoint` tells a complete SB3 zip from a torn one without loading it; :func:`latest_checkpoint`
finds the newest complete one, and :func:`existing_checkpoint` turns a path given to ``load`` into the file to read,
with a clear error when there is none. :mod:`sb3_grpo.callbacks` re-exports the public names.
"""

from __future__ import annotations

import json
import os
import re
import zipfile
from pathlib import Path

import torch as th
from stable_baselines3.common.base_class import BaseAlgorithm

from sb3_grpo.common.checkpoints.safetensors_format import is_safetensors_path, safetensors_algorithm, save_safetensors
from sb3_grpo.common.checkpoints.unpickling import safe_custom_objects
from sb3_grpo.file_io import atomic_write

__all__ = [
    "RESUMED_STATE",
    "atomic_save",
    "existing_checkpoint",
    "is_complete_checkpoint",
    "latest_checkpoint",
    "nonfinite_parameters",
    "resume_in_place",
]

#: What :func:`resume_in_place` restores besides the weights and the optimizer: the counters and schedules' position,
#: the exploration RNG and the adaptive KL coefficient (the arguments and the env stay the running script's).
RESUMED_STATE = (
    "num_timesteps",
    "_n_updates",
    "_episode_num",
    "_current_progress_remaining",
    "_explore_rng",
    "kl_coef",
)


def nonfinite_parameters(module: th.nn.Module) -> list[str]:
    """Names of the parameters and buffers of ``module`` that hold a NaN or an infinity."""
    bad = []
    for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
        if tensor.is_floating_point() and not bool(th.isfinite(tensor).all()):
            bad.append(name)
    return bad


def atomic_save(model: BaseAlgorithm, path: str | os.PathLike) -> Path | None:
    """``model.save(path)``, atomically (see :func:`atomic_write`), refusing non-finite weights. A path ending in
    ``.safetensors`` is written in the format that cannot run code (:mod:`.safetensors_format`).

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
    if is_safetensors_path(path):  # written atomically by the format itself
        if hasattr(model, "_save_atomically"):  # an algorithm of this package: its save() prepares its state
            from sb3_grpo import distributed

            model.save(path)
            return path if distributed.is_main_process() else None
        return save_safetensors(model, path)
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
    :return: The path, or ``None`` if there is none (no folder, or no checkpoint file in it at all).
    :raises ValueError: when the folder holds checkpoints of other prefixes only (a resume would otherwise start from
        scratch, and ``keep_last`` prune the old ones): it names the prefixes found.
    """
    folder = Path(save_path)
    if not folder.is_dir():
        return None
    found, others, own = [], set(), False
    for entry in folder.iterdir():
        steps = _checkpoint_steps(entry.name, name_prefix)
        own = own or steps is not None
        if steps is not None and (max_steps is None or steps <= max_steps):
            found.append((steps, entry))
        elif steps is None:
            other = re.fullmatch(r"(.+)_\d+_steps\.zip", entry.name)
            if other is not None and not entry.name.startswith("."):
                others.add(other.group(1))
    if not own and others:
        raise ValueError(
            f"latest_checkpoint: {str(folder)!r} has no {name_prefix}_<steps>_steps.zip but checkpoints with the "
            f"prefix(es) {', '.join(map(repr, sorted(others)))}; pass name_prefix= one of them (the checkpoint "
            "callback's name_prefix), or another folder"
        )
    for _, entry in sorted(found, reverse=True):
        if is_complete_checkpoint(entry):
            return entry
    return None


def existing_checkpoint(path: str | os.PathLike) -> str:
    """The file ``load(path)`` should read: ``path``, or ``path + ".zip"`` as SB3 would try, if it is a complete
    saved model.

    :raises FileNotFoundError: when neither exists.
    :raises ValueError: when the file is not a complete saved model (a torn write).
    """
    path = os.fspath(path)
    if is_safetensors_path(path):
        if not os.path.isfile(path):
            raise FileNotFoundError(f"no saved model at {path!r}; give the path of a file written by model.save()")
        safetensors_algorithm(path)  # a safetensors file of this format (else a ValueError saying so)
        return path
    candidates = [path] if path.endswith(".zip") else [path, path + ".zip"]
    found = next((c for c in candidates if os.path.isfile(c)), None)
    if found is None:
        raise FileNotFoundError(
            f"no saved model at {' or '.join(map(repr, candidates))}; give the path of a file written by "
            "model.save() or a checkpoint callback"
        )
    if not is_complete_checkpoint(found):
        raise ValueError(
            f"{found!r} is not a complete saved model (truncated or corrupt, e.g. written by a process killed "
            "mid-save without AtomicCheckpointCallback); load the newest complete checkpoint instead: "
            "sb3_grpo.callbacks.latest_checkpoint(folder)"
        )
    problem = _data_problem(found)
    if problem:
        raise ValueError(
            f"{found!r} is not a saved model: its 'data' entry {problem}; load a file written by model.save() or a "
            "checkpoint callback (the newest complete one: sb3_grpo.callbacks.latest_checkpoint(folder))"
        )
    return found


def resume_in_place(
    model: BaseAlgorithm, save_path: str | os.PathLike, name_prefix: str = "rl_model", trusted: bool = False
) -> Path | None:
    """Load the newest complete checkpoint of ``save_path`` into ``model`` itself: weights, optimizer state and
    :data:`RESUMED_STATE`. Under ``torch.distributed`` every rank must call it and find the same checkpoint.

    :param model: The freshly built model of the (restarted) script.
    :param save_path: The checkpoint folder.
    :param name_prefix: The checkpoints' name prefix.
    :param trusted: Unpickle the checkpoint's entries without the allow-list (runs code from the file); by default
        only :data:`RESUMED_STATE` is read, through :func:`~sb3_grpo.common.checkpoints.unpickling.safe_custom_objects`.
    :return: The checkpoint loaded, or ``None`` when there is none (a first start: nothing changes).
    :raises RuntimeError: when the ranks see different newest checkpoints (a folder that is not shared).
    """
    from stable_baselines3.common.save_util import load_from_zip_file

    from sb3_grpo import distributed

    path = latest_checkpoint(save_path, name_prefix)
    steps = -1 if path is None else _checkpoint_steps(path.name, name_prefix)
    if not distributed.all_equal(steps):
        raise RuntimeError(
            f"resume: this rank's newest checkpoint in {os.fspath(save_path)!r} is {path} and another rank's is not "
            "the same; every rank must see the same checkpoint folder (a shared file system)"
        )
    if path is None:
        return None
    needed = (*RESUMED_STATE, "observation_space", "action_space")
    custom_objects = safe_custom_objects(path, trusted=trusted, needed=needed)
    data, _, _ = load_from_zip_file(path, device=model.device, custom_objects=custom_objects)
    for what in ("observation_space", "action_space"):
        if what in data and data[what] != getattr(model, what):
            raise ValueError(
                f"resume: the checkpoint {os.fspath(path)!r} was trained with the {what} {data[what]}, this model has "
                f"{getattr(model, what)} (another env, window or tokenizer): it is another run's; give this run its "
                "own checkpoint folder"
            )
    model.set_parameters(os.fspath(path), exact_match=True, device=model.device)
    for key in RESUMED_STATE:
        if key in data and hasattr(model, key):
            setattr(model, key, data[key])
    model._num_timesteps_at_start = model.num_timesteps
    return path


def _data_problem(path: str) -> str | None:
    """What is wrong with the ``data`` entry (SB3's JSON of the model's attributes) of a model zip, or ``None``."""
    try:
        with zipfile.ZipFile(path) as archive:
            data = json.loads(archive.read("data").decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        return f"is not JSON ({type(err).__name__}: {err})"
    except (OSError, zipfile.BadZipFile, KeyError) as err:
        return f"cannot be read ({err})"
    if not isinstance(data, dict) or "policy_class" not in data:
        return "holds no model attributes (no 'policy_class')"
    return None
