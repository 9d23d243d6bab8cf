"""One entry point for every load path: a checkpoint file turned into what SB3's ``load`` reads, with no code of the
file run.

:func:`checkpoint_source` is what ``GRPO.load`` (and every algorithm of this package), ``sb3-grpo sample``,
``human-eval export --env`` and :func:`~sb3_grpo.common.checkpoints.files.resume_in_place` go through: an SB3
``.zip`` has its pickled entries decoded by the restricted unpickler
(:func:`~sb3_grpo.common.checkpoints.unpickling.safe_custom_objects`), a ``.safetensors`` file is read as JSON and
tensors (:func:`~sb3_grpo.common.checkpoints.safetensors_format.safetensors_source`).
:func:`load_model` does the same for any SB3 algorithm class, stock ``PPO`` included.
"""

from __future__ import annotations

import io
import os
from typing import Any

from sb3_grpo.common.checkpoints.safetensors_format import is_safetensors_path, safetensors_source
from sb3_grpo.common.checkpoints.unpickling import safe_custom_objects

__all__ = ["checkpoint_source", "load_model"]


def checkpoint_source(
    path: Any, custom_objects: dict[str, Any] | None = None, trusted: bool = False
) -> tuple[Any, dict[str, Any] | None]:
    """``(what to give SB3's load as its path, its custom_objects)`` for a checkpoint.

    :param path: An SB3 ``.zip`` (path or binary file object) or a ``.safetensors`` file of this package.
    :param custom_objects: The caller's ``custom_objects`` (they win over what the file holds).
    :param trusted: For a ``.zip``: let SB3 unpickle its entries itself (runs any code they name); for a
        ``.safetensors`` file: resolve class names outside the allow-list.
    :raises UntrustedCheckpointError: (a ``ValueError``) naming an entry that would run code, unless ``trusted``.
    """
    if is_safetensors_path(path):
        return safetensors_source(path, custom_objects, trusted=trusted)
    if isinstance(path, (str, os.PathLike)) or isinstance(path, io.IOBase):
        return path, safe_custom_objects(path, custom_objects, trusted=trusted)
    return path, custom_objects


def load_model(cls: type, path: Any, trusted: bool = False, **kwargs: Any) -> Any:
    """``cls.load(path, **kwargs)`` for any SB3 algorithm class, through :func:`checkpoint_source`.

    The algorithms of this package take ``trusted`` themselves; a stock class (``PPO``) gets the decoded
    ``custom_objects``.

    :param cls: The algorithm class.
    :param path: The checkpoint (``.zip`` or ``.safetensors``).
    :param trusted: See :func:`checkpoint_source`.
    """
    import inspect

    if "trusted" in inspect.signature(cls.load).parameters:  # an algorithm of this package: it reads safely itself
        return cls.load(path, trusted=trusted, **kwargs)
    source, custom_objects = checkpoint_source(path, kwargs.pop("custom_objects", None), trusted=trusted)
    return cls.load(source, custom_objects=custom_objects, **kwargs)
