"""Files that are either complete or absent, and values made JSON-able: one of each for the whole package.

:func:`atomic_write` is what checkpoints (:mod:`sb3_grpo.callbacks`) and the benchmarks' ``results.json`` use;
:func:`to_jsonable` is what saved specs (LoRA, model configs) and the benchmark configs use.
"""

from __future__ import annotations

import enum
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["TMP_SUFFIX", "atomic_write", "to_jsonable", "write_json_atomic"]

#: Suffix of the temporary files :func:`atomic_write` writes before renaming them into place.
TMP_SUFFIX = ".tmp"


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
    temporary file remains (:class:`~sb3_grpo.callbacks.AtomicCheckpointCallback` removes those of dead processes).

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


def to_jsonable(value: Any) -> Any:
    """``value`` as plain JSON types, so that it compares equal to itself after a JSON round trip.

    Enums become their values, sets sorted lists, tuples lists, dict keys strings, numpy scalars and arrays
    Python numbers and lists; anything else that JSON cannot hold becomes ``str(value)``.

    :param value: Any value.
    :return: The JSON-able value.
    """
    if isinstance(value, enum.Enum):
        return to_jsonable(value.value)
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        return sorted((to_jsonable(v) for v in value), key=str)
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return to_jsonable(value.tolist())
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    return str(value)


def write_json_atomic(path: str | os.PathLike, data: Any) -> None:
    """Write ``data`` as indented JSON to ``path`` through :func:`atomic_write` (temp file, ``fsync``, rename).

    :param path: Target file.
    :param data: Data; :func:`to_jsonable` converts what JSON cannot hold (NaN is written as ``NaN``).
    """

    def write(tmp: str) -> None:
        with open(tmp, "w") as f:
            json.dump(to_jsonable(data), f, indent=1)
            f.write("\n")

    atomic_write(path, write)
