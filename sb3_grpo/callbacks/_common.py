"""What the callbacks share: the alert warning class and argument checks."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["TrainingAlertWarning", "check_positive_int"]


class TrainingAlertWarning(UserWarning):
    """A training quantity (gradient norm, KL, evaluation reward) crossed a threshold set on a callback."""


def check_positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return int(value)


# ---------------------------------------------------------------------------------------------------------
# Checkpoints
# ---------------------------------------------------------------------------------------------------------
