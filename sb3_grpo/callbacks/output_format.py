"""What the output formats of :mod:`sb3_grpo.callbacks.trackers` and :mod:`sb3_grpo.callbacks.prometheus` share:
the :class:`Table` value, the base class that sorts a dump's values, and config values as plain values."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping
from typing import Any

import numpy as np
from stable_baselines3.common.logger import HParam, KVWriter

__all__ = ["SB3_FORMATS", "Table", "TrackerOutputFormat", "config_value", "extra_error"]

#: The names of SB3's built-in output formats (what ``exclude=`` takes to keep a value out of all of them).
SB3_FORMATS = ("stdout", "log", "json", "csv", "tensorboard")


@dataclasses.dataclass(frozen=True)
class Table:
    """A table to log: ``columns`` (names) and ``rows`` (one sequence of values per row, in column order).

    Record it with ``exclude=SB3_FORMATS`` (SB3's own formats do not take tables); trackers log it as a table.
    """

    columns: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "columns", tuple(str(c) for c in self.columns))
        object.__setattr__(self, "rows", tuple(tuple(r) for r in self.rows))
        bad = [i for i, r in enumerate(self.rows) if len(r) != len(self.columns)]
        if bad:
            raise ValueError(
                f"Table rows {bad[:5]} do not have {len(self.columns)} values (one per column {list(self.columns)})"
            )

    def as_dict(self) -> dict[str, list[Any]]:
        """Column name -> the column's values."""
        return {c: [r[i] for r in self.rows] for i, c in enumerate(self.columns)}


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def _scalar(value: Any) -> float | None:
    """A loggable scalar of ``value`` (numbers, bools, 0-d arrays and tensors), else ``None``."""
    if isinstance(value, (bool, np.bool_)):
        return float(value)
    if _is_number(value):
        return float(value)
    if hasattr(value, "ndim") and getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
        item = value.item()
        return float(item) if _is_number(item) or isinstance(item, bool) else None
    return None


def config_value(value: Any) -> bool | int | float | str | None:
    """A config entry as a plain value: numbers and strings as they are, schedules by their initial value."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if _is_number(value):
        return value.item() if hasattr(value, "item") else value
    if isinstance(value, (tuple, list)) and all(v is None or isinstance(v, (bool, str, int, float)) for v in value):
        return str(list(value))
    if isinstance(value, Mapping):
        return str({str(k): config_value(v) for k, v in value.items()})
    if type(value).__name__ == "device":  # torch.device
        return str(value)
    if callable(value) and not inspect.isclass(value):
        try:  # an SB3 schedule (progress_remaining -> value): its value at the start of training
            start = value(1.0)
        except Exception:  # noqa: BLE001  (not a schedule: fall back to its name)
            start = None
        if _is_number(start):
            return float(start)
    name = getattr(value, "__name__", None)
    return name if isinstance(name, str) else type(value).__name__


def extra_error(library: str, extra: str) -> ImportError:
    return ImportError(
        f"the {library!r} output format needs {library}, which is not installed; "
        f"pip install 'textrl[{extra}]' (or pip install {library})"
    )


class TrackerOutputFormat(KVWriter):
    """What the tracker formats share: which values go where, and the config logged once.

    A subclass writes :meth:`_log_scalars`, :meth:`_log_table`, :meth:`_log_text` and :meth:`log_config`.
    """

    #: The format's name (what ``exclude=`` and :func:`configure_logger` call it).
    name = ""

    def write(self, key_values: dict[str, Any], key_excluded: dict[str, tuple[str, ...]], step: int = 0) -> None:
        scalars: dict[str, float] = {}
        for key, value in key_values.items():
            excluded = key_excluded.get(key)
            if excluded is not None and self.name in excluded:
                continue
            if isinstance(value, HParam):
                self.log_config(dict(value.hparam_dict))
                continue
            if isinstance(value, Table):
                self._log_table(key, value, step)
                continue
            if isinstance(value, str):
                self._log_text(key, value, step)
                continue
            number = _scalar(value)
            if number is not None:
                scalars[key] = number
        if scalars:
            self._log_scalars(scalars, step)

    def log_config(self, config: Mapping[str, Any]) -> None:  # pragma: no cover - every subclass writes it
        raise NotImplementedError

    def _log_scalars(self, scalars: dict[str, float], step: int) -> None:  # pragma: no cover
        raise NotImplementedError

    def _log_table(self, key: str, table: Table, step: int) -> None:  # pragma: no cover
        raise NotImplementedError

    def _log_text(self, key: str, text: str, step: int) -> None:  # pragma: no cover
        raise NotImplementedError
