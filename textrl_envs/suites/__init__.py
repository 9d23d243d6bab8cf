"""Adapters for external task libraries, each an optional extra of ``textrl``.

* :mod:`textrl_envs.suites.reasoning`: every `reasoning-gym <https://github.com/open-thought/reasoning-gym>`_
  task generator as one env id (``pip install "textrl[reasoning]"``).

The ids are registered from the one list of tasks (:data:`textrl_envs.tasks.TASKS`) like every other id;
``import textrl_envs`` never imports these modules, and a suite's module imports its library only when an
env is made, through :func:`import_extra`, so a missing extra is an error that names the ``pip install``.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any


def import_extra(module: str, task: Any, package: str) -> ModuleType:
    """Import the library a suite task needs, or raise an error that says how to install it.

    :param module: The module to import, e.g. ``"reasoning_gym"``.
    :param task: The suite's :class:`~textrl_envs.tasks.Task` (its id and extra go into the message).
    :param package: The PyPI name of the library, e.g. ``"reasoning-gym"``.
    :return: The imported module.
    :raises ImportError: naming the id, the missing package and ``pip install "textrl[<extra>]"``.
    """
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ImportError(
            f"{task.env_id} needs the optional package {package!r}, which could not be imported ({err}); "
            f"install it with: {task.install_hint}"
        ) from err
