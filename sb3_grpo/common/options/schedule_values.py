"""SB3 schedules checked each time they are evaluated, not only at the start and the end of training.

A learning-rate (or clip-range, or entropy-coefficient) schedule is a callable of the progress remaining. The
constructor checks its values at progress 1 and 0 (:func:`textrl_envs.validation.check_schedule`); one that returns
NaN in between used to reach the optimizer and corrupt the weights, and the error came later, blaming the
observations. :func:`scheduled_value` evaluates a schedule and checks what it returns, naming the schedule and the
progress, before the update uses it; :func:`plain_number` turns a NumPy number given for such an argument into a
Python float, as SB3's schedules want.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from textrl_envs.validation import check_float

__all__ = ["plain_number", "scheduled_value"]


def plain_number(value: Any) -> Any:
    """A NumPy number (``np.float32(1e-4)``) as a Python ``float``; anything else as it is (SB3's ``FloatSchedule``
    takes Python numbers and callables only)."""
    if isinstance(value, np.generic) and isinstance(value, numbers.Real) and not isinstance(value, np.bool_):
        return float(value)
    return value


def scheduled_value(name: str, schedule: Any, progress_remaining: float, **bounds: Any) -> float:
    """``schedule(progress_remaining)`` (a number as it is), checked: a finite float within ``bounds``.

    :param name: The argument the schedule sets (``"learning_rate"``), for the message.
    :param schedule: A callable of the progress remaining, or a number.
    :param progress_remaining: SB3's ``_current_progress_remaining`` (1 at the start, 0 at the end).
    :param bounds: :func:`~textrl_envs.validation.check_float`'s bounds (``low``, ``low_open``, ...).
    :raises ValueError: (or ``TypeError``) naming the schedule, the progress and the value, before anything is updated.
    """
    value = schedule(progress_remaining) if callable(schedule) else schedule
    return check_float(
        f"{name} at progress_remaining={progress_remaining:.4g} (its schedule's value now)",
        value,
        hint="nothing was updated with it; fix the schedule so that it returns such a number for every progress in "
        "[0, 1] (training can resume from the last checkpoint)",
        **bounds,
    )
