"""The one validation layer: small pure checks of what a user passes, shared by every entry point.

The env spec (:mod:`textrl_envs.core`), the single and the vector env, the SB3 adapter, and in ``sb3_grpo`` the
algorithm (``sb3_grpo.common.options.checks``), the policy (``sb3_grpo.policies.policy_kwargs``), the CLI and the
comparison config all check their arguments with these functions, before any work starts. Each returns the value in its
plain Python form or raises:

- ``TypeError`` when the value has the wrong type (a string where a number belongs, ``True`` for a count);
- ``ValueError`` when it has the right type but a wrong value: out of range, not one of the choices, and for
  numbers NaN or infinite (a non-finite number never silently enters training). The class raised,
  :class:`ArgumentValueError`, is also an ``AssertionError``, as SB3's own checks of the same values are.

Every message names the argument, shows what was given (value and type), says what is expected and what to do::

    max_new_tokens must be an int >= 1, got '8' (str); pass e.g. max_new_tokens=24

Nothing here imports torch or transformers, so both packages import it without cost or cycles.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = [
    "SEED_MAX",
    "ArgumentValueError",
    "check_bool",
    "check_choice",
    "check_float",
    "check_int",
    "check_mapping",
    "check_prefill",
    "check_schedule",
    "check_seed",
    "given",
    "range_text",
]


class ArgumentValueError(ValueError, AssertionError):
    """A wrong value for an argument (out of range, not a choice, non-finite).

    A ``ValueError``, and also an ``AssertionError`` because SB3 refuses some of the same values with ``assert``
    (e.g. a negative ``clip_range_vf``): code written against SB3 that catches ``AssertionError`` keeps working.
    """


#: Largest seed every seeded generator here accepts (NumPy's legacy ``np.random.seed`` takes ``< 2**32``).
SEED_MAX = 2**32 - 1


def given(value: Any) -> str:
    """How a message shows a value: its ``repr`` (shortened) and its type."""
    text = repr(value)
    if len(text) > 80:
        text = text[:77] + "..."
    return f"{text} ({type(value).__name__})"


def _todo(name: str, example: Any, hint: str) -> str:
    if hint:
        return f"; {hint}"
    if example is not None:
        return f"; pass e.g. {name}={example!r}"
    return ""


def _num(x: float) -> str:
    return str(x) if isinstance(x, int) else f"{x:g}"


def range_text(
    low: float | None = None, high: float | None = None, low_open: bool = False, high_open: bool = False
) -> str:
    """``"in [0, 1]"``, ``">= 1"``, ``"> 0"``, ... (empty without bounds)."""
    if low is not None and high is not None:
        return f"in {'(' if low_open else '['}{_num(low)}, {_num(high)}{')' if high_open else ']'}"
    if low is not None:
        return f"{'>' if low_open else '>='} {_num(low)}"
    if high is not None:
        return f"{'<' if high_open else '<='} {_num(high)}"
    return ""


def _in_range(x: float, low: float | None, high: float | None, low_open: bool, high_open: bool) -> bool:
    if low is not None and (x <= low if low_open else x < low):
        return False
    return not (high is not None and (x >= high if high_open else x > high))


def check_int(
    name: str,
    value: Any,
    *,
    low: int | None = None,
    high: int | None = None,
    example: Any = None,
    hint: str = "",
) -> int:
    """``value`` as an ``int`` (Python or NumPy integers; not ``bool``, not an integral float or a string).

    :param name: The argument's name, as the user wrote it.
    :param value: What the user passed.
    :param low: Smallest allowed value (``None``: no bound).
    :param high: Largest allowed value (``None``: no bound).
    :param example: A good value, for the message's "pass e.g. ..." (ignored when ``hint`` is given).
    :param hint: What to do, when a better instruction than the example exists.
    :raises TypeError: for a non-integer.
    :raises ValueError: for an integer out of range.
    """
    expected = " ".join(filter(None, ("an int", range_text(low, high))))
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be {expected}, got {given(value)}{_todo(name, example, hint)}")
    if not _in_range(int(value), low, high, False, False):
        raise ArgumentValueError(f"{name} must be {expected}, got {int(value)}{_todo(name, example, hint)}")
    return int(value)


def check_float(
    name: str,
    value: Any,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    allow_inf: bool = False,
    example: Any = None,
    hint: str = "",
) -> float:
    """``value`` as a finite ``float`` (ints and NumPy numbers accepted; not ``bool``, not a string).

    :param name: The argument's name.
    :param value: What the user passed.
    :param low: Lower bound (``None``: none); exclusive with ``low_open``.
    :param high: Upper bound (``None``: none); exclusive with ``high_open``.
    :param low_open: ``value`` must be greater than ``low``.
    :param high_open: ``value`` must be less than ``high``.
    :param allow_inf: accept ``+inf`` (never NaN), for arguments where infinity means "no limit".
    :param example: A good value, for the message.
    :param hint: What to do, when a better instruction than the example exists.
    :raises TypeError: for a non-number.
    :raises ValueError: for NaN, an infinity (unless allowed), or a number out of range.
    """
    bounds = range_text(low, high, low_open, high_open)
    expected = " ".join(filter(None, ("a finite number" if not allow_inf else "a number", bounds)))
    todo = _todo(name, example, hint)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be {expected}, got {given(value)}{todo}")
    try:
        x = float(value)
    except OverflowError:  # an int too large for a float
        x = math.copysign(math.inf, value)
    if math.isnan(x) or (math.isinf(x) and not (allow_inf and x > 0)):
        raise ArgumentValueError(f"{name} must be {expected}, got {x}: non-finite numbers never enter training{todo}")
    if not _in_range(x, low, high, low_open, high_open):
        raise ArgumentValueError(f"{name} must be {expected}, got {value!r}{todo}")
    return x


def check_schedule(name: str, value: Any, **bounds: Any) -> float | Callable[[float], float]:
    """A number or an SB3 schedule (a callable of the progress remaining, 1 at the start, 0 at the end).

    A number is checked as by :func:`check_float`; a callable is evaluated at the start and the end of training
    (progress 1 and 0) and both values are checked, so a schedule that returns NaN or a string fails now.

    :param name: The argument's name.
    :param value: A number or a callable ``f(progress_remaining) -> number``.
    :param bounds: :func:`check_float`'s keyword arguments.
    :return: The number as a float, or the callable itself.
    """
    if callable(value):
        for progress in (1.0, 0.0):
            check_float(
                f"{name}({progress:g}) (the schedule's value at progress {progress:g})", value(progress), **bounds
            )
        return value
    hint = bounds.pop("hint", "") or "pass a number or a schedule (a callable of the progress remaining)"
    return check_float(name, value, hint=hint, **bounds)


def check_choice(name: str, value: Any, choices: Iterable[Any], hint: str = "") -> Any:
    """``value`` if it is one of ``choices`` (compared with ``==``, so only hashable types are safe).

    :raises ValueError: naming the choices (a near miss is suggested).
    """
    options = tuple(choices)
    try:
        ok = value in options
    except TypeError:  # e.g. an unhashable value against a set-like
        ok = False
    if ok:
        return value
    suggestion = ""
    if isinstance(value, str):
        import difflib

        close = difflib.get_close_matches(value, [str(c) for c in options], n=1)
        suggestion = f" (did you mean {close[0]!r}?)" if close else ""
    raise ArgumentValueError(f"{name} must be one of {options}, got {value!r}{suggestion}{'; ' + hint if hint else ''}")


def check_bool(name: str, value: Any) -> bool:
    """``value`` if it is a ``bool`` (or a NumPy bool): not ``0``/``1``, not the string ``"False"``.

    :raises TypeError: otherwise.
    """
    if type(value).__name__ in ("bool", "bool_"):
        return bool(value)
    raise TypeError(f"{name} must be True or False, got {given(value)}")


def check_prefill(name: str, value: Any, what: str, hint: str = "") -> str:
    """``value`` if it is text the env writes at the start of a model's reply (an assistant prefill) and ends at its
    last word: the model writes the space before ``what`` (its answer, its move) with that token itself. ``hint``
    follows the type error's "must be a str".

    :raises TypeError: not a str.
    :raises ValueError: it ends in whitespace.
    """
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str{hint}, got {given(value)}")
    if value != value.rstrip():
        raise ValueError(
            f"{name}={value!r} ends in whitespace: end it at the last word ({value.rstrip()!r}); the model writes the "
            f"space before its {what} with the {what}'s own token"
        )
    return value


def check_mapping(name: str, value: Any, hint: str = "", allow_none: bool = True) -> dict[str, Any] | None:
    """``value`` as a ``dict`` with ``str`` keys (``None`` passes when ``allow_none``).

    :raises TypeError: for anything else.
    """
    if value is None and allow_none:
        return None
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise TypeError(
            f"{name} must be a dict with str keys{' or None' if allow_none else ''}, got {given(value)}"
            f"{'; ' + hint if hint else ''}"
        )
    return dict(value)


def check_seed(name: str, value: Any) -> int | None:
    """A seed: ``None`` (random) or an int in ``[0, 2**32 - 1]``.

    :raises TypeError: for a non-integer (a string, a float).
    :raises ValueError: for a negative or too large integer.
    """
    if value is None:
        return None
    return check_int(name, value, low=0, high=SEED_MAX, hint=f"pass None (random) or an int, e.g. {name}=0")
