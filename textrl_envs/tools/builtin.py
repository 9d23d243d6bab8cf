"""The tools of ``ToolUse-v0``: integer arithmetic the model could not do reliably in its head."""

from __future__ import annotations

__all__ = ["add", "multiply"]


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first term.
        b: The second term.
    """
    return a + b


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b
