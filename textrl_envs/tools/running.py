"""Running one tool call: every way it can go wrong is an outcome the model reads, never an exception.

:func:`run_call` checks the call (its form, the tool's name, its arguments against the tool's JSON schema), runs the
tool in a worker thread with a timeout (:func:`textrl_envs.rewards.base.call_with_timeout`: a tool that hangs is
abandoned, its daemon thread never keeps the process alive) and turns what happened into a :class:`ToolOutcome`: the
text of the ``tool`` message and a status that the episode's info counts.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from textrl_envs.rewards.base import call_with_timeout
from textrl_envs.tools.formats import ToolCall
from textrl_envs.tools.schema import argument_errors

__all__ = ["OUTCOMES", "ToolOutcome", "run_call"]

#: What a call can come to: it ran (``"ok"``), or it was malformed, named no tool, had wrong arguments, raised, or
#: ran past its timeout.
OUTCOMES = ("ok", "malformed", "unknown_tool", "bad_arguments", "raised", "timeout")


@dataclass(frozen=True)
class ToolOutcome:
    """What one call came to.

    :param name: The tool called (``None`` for a call whose name could not be read).
    :param status: One of :data:`OUTCOMES`.
    :param content: The ``tool`` message's text: the result (JSON for anything but a str), or ``"error: ..."`` saying
        what went wrong.
    :param arguments: The arguments the model wrote (``None`` when they could not be read).
    """

    name: str | None
    status: str
    content: str
    arguments: Any = None


class _ToolTimeout(TimeoutError):
    """A tool ran past its timeout (a TimeoutError the tool raises itself is an ordinary error)."""


def _result_text(result: Any, limit: int) -> str:
    if isinstance(result, str):
        text = result
    else:
        try:
            text = json.dumps(result)
        except (TypeError, ValueError):
            text = str(result)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def run_call(
    call: ToolCall,
    tools: Mapping[str, tuple[Callable, Mapping[str, Any]]],
    timeout: float | None,
    max_chars: int = 2000,
) -> ToolOutcome:
    """Check and run one call.

    :param call: The call read from the model's text.
    :param tools: The tools by name, with their schemas (:func:`~textrl_envs.tools.schema.tool_schemas`).
    :param timeout: Seconds the tool may run (``None``: no limit).
    :param max_chars: The longest result text kept (longer ones are cut, ending with ``...``).
    """
    if call.error is not None:
        return ToolOutcome(call.name, "malformed", f"error: {call.error}", call.arguments)
    if call.name not in tools:
        known = ", ".join(tools)
        return ToolOutcome(call.name, "unknown_tool", f"error: there is no tool {call.name!r}; tools: {known}")
    fn, schema = tools[call.name]
    errors = argument_errors(schema, call.arguments)
    if errors:
        return ToolOutcome(call.name, "bad_arguments", f"error: {call.name}: " + "; ".join(errors), call.arguments)

    def run() -> Any:
        return fn(**call.arguments)

    try:
        if timeout is None:
            result = run()
        else:
            result = call_with_timeout(run, timeout, lambda: _ToolTimeout())
    except _ToolTimeout:
        return ToolOutcome(
            call.name, "timeout", f"error: {call.name} did not return within {timeout:g} s", call.arguments
        )
    except (Exception, SystemExit) as exc:  # the tool's own failure is the model's to read
        return ToolOutcome(
            call.name, "raised", f"error: {call.name} raised {type(exc).__name__}: {exc}", call.arguments
        )
    return ToolOutcome(call.name, "ok", _result_text(result, max_chars), call.arguments)
