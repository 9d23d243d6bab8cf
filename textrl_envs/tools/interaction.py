"""Tool use as an interactive task: the model calls Python functions in its family's format and reads their results.

:class:`ToolCalling` is an :class:`~textrl_envs.interaction.Interaction`. The env binds it to its tokenizer and chat
template when it is built (:meth:`ToolCalling.bind`): the tools are described to the model through the template
(:func:`~textrl_envs.tools.rendering.prompt_with_tools`), the call format is the template's family's
(:func:`~textrl_envs.tools.formats.detect_format`), and an agent turn ends at the template's end-of-turn token. Each
turn that calls tools gets the results as ``tool`` messages rendered by the template
(:func:`~textrl_envs.tools.rendering.render_reply`); the first turn that calls none is the answer, and ends the
episode. Every call is checked and run by :func:`~textrl_envs.tools.running.run_call`: a malformed call, an unknown
tool, wrong arguments, a tool that raises or hangs are each an ``error: ...`` message the model reads, never a crash.

The episode's conversation (:meth:`ToolCalling.messages`: the assistant turns, with their parsed ``tool_calls``, and
the ``tool`` messages) is what a TRL-style reward gets as its completion, so the env's reward sees the whole
transcript; the interaction itself pays nothing per turn.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from textrl_envs.interaction import Interaction, Reply
from textrl_envs.tools.formats import FORMATS, ToolCallFormat, detect_format
from textrl_envs.tools.rendering import FALLBACK_TEMPLATE, prompt_with_tools, render_reply
from textrl_envs.tools.running import ToolOutcome, run_call
from textrl_envs.tools.schema import tool_schemas

__all__ = ["ToolCalling"]

#: The ways to pick a call format: from the chat template, or by name.
TOOL_FORMATS = ("auto", *FORMATS)


@dataclass(frozen=True)
class _Binding:
    """What an interaction bound to an env knows of its chat."""

    tokenizer: Any
    template: str
    fmt: ToolCallFormat
    end_of_turn: str
    template_kwargs: dict[str, Any]


class ToolCalling(Interaction):
    """Answer an agent's tool calls with the tools' results, until it answers without a call.

    :param tools: Python functions with type hints and an ``Args:`` docstring
        (:func:`~textrl_envs.tools.schema.tool_schemas`).
    :param timeout: Seconds one call may run (``None``: no limit); a call past it is answered ``error: ... did not
        return``.
    :param tool_format: ``"auto"`` (the chat template's family, :func:`~textrl_envs.tools.formats.detect_format`),
        ``"hermes"`` or ``"smollm2"``.
    :param max_calls: Calls answered per turn; the rest of a turn's calls are answered ``error: too many calls``.
    :param max_result_chars: The longest tool result kept, in characters.
    """

    writes_chat = True  # the tool results are rendered here, in the chat template's format

    def __init__(
        self,
        tools: Sequence[Callable],
        *,
        timeout: float | None = 5.0,
        tool_format: str = "auto",
        max_calls: int = 4,
        max_result_chars: int = 500,
    ) -> None:
        self.tools = list(tools) if isinstance(tools, (list, tuple)) else tools
        self._tools = tool_schemas(self.tools)
        if timeout is not None and not (isinstance(timeout, (int, float)) and math.isfinite(timeout) and timeout > 0):
            raise ValueError(f"timeout must be None or a positive number of seconds, got {timeout!r}")
        if tool_format not in TOOL_FORMATS:
            raise ValueError(f"tool_format must be one of {TOOL_FORMATS}, got {tool_format!r}")
        for name, value in (("max_calls", max_calls), ("max_result_chars", max_result_chars)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        self.timeout, self.tool_format = timeout, tool_format
        self.max_calls, self.max_result_chars = max_calls, max_result_chars
        self._binding: _Binding | None = None

    # -- binding to the env's chat ------------------------------------------------------------------------------

    def bind(self, tokenizer: Any, chat_template: str | None) -> ToolCalling:
        """A copy of this interaction for an env with ``tokenizer`` and ``chat_template`` (``None``: the tokenizer's
        own, else :data:`~textrl_envs.tools.rendering.FALLBACK_TEMPLATE`).

        :raises ValueError: when the template cannot render a tool result.
        """
        from textrl_envs.chat import end_of_turn_id

        own = getattr(tokenizer, "chat_template", None)
        template = chat_template or (own if isinstance(own, str) and own else None) or FALLBACK_TEMPLATE
        fmt = detect_format(template) if self.tool_format == "auto" else FORMATS[self.tool_format]
        eot = end_of_turn_id(tokenizer, template)
        end_of_turn = tokenizer.decode([eot]) if eot is not None else ""
        schemas = [schema for _, schema in self._tools.values()]
        _, template_kwargs = prompt_with_tools([], schemas, fmt, template)
        bound = copy.copy(self)
        bound._binding = _Binding(tokenizer, template, fmt, end_of_turn, template_kwargs)
        render_reply(tokenizer, template, [{"role": "tool", "name": "t", "content": "1"}], end_of_turn, template_kwargs)
        return bound

    def _bound(self) -> _Binding:
        if self._binding is None:
            raise RuntimeError(
                "ToolCalling is not bound to an env's chat template yet: give it to an env (interaction=... or "
                "tools=...), which binds it when it is built"
            )
        return self._binding

    @property
    def chat_template(self) -> str | None:
        """The chat template the env renders with (``None`` until bound)."""
        return None if self._binding is None else self._binding.template

    @property
    def chat_template_kwargs(self) -> dict[str, Any]:
        """The template's extra arguments: ``tools`` for a template that renders them."""
        return {} if self._binding is None else dict(self._binding.template_kwargs)

    @property
    def call_format(self) -> ToolCallFormat | None:
        """The call format (``None`` until bound)."""
        return None if self._binding is None else self._binding.fmt

    @property
    def schemas(self) -> list[dict[str, Any]]:
        """The tools' JSON schemas, in order."""
        return [schema for _, schema in self._tools.values()]

    def prompt_messages(self, messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """The prompt's messages with the tools described (for a template that does not render ``tools=``)."""
        binding = self._bound()
        return prompt_with_tools(messages, self.schemas, binding.fmt, binding.template)[0]

    # -- the protocol ---------------------------------------------------------------------------------------------

    def start(self, prompt: str, metadata: Mapping[str, Any], rng: np.random.Generator) -> dict[str, Any]:  # noqa: ARG002  (the protocol's signature)
        self._bound()
        return {"messages": [], "calls": 0, "errors": 0}

    def reply(self, state: dict[str, Any], text: str, turn: int) -> Reply:  # noqa: ARG002  (the protocol's signature)
        binding = self._bound()
        calls = binding.fmt.find(text)
        if not calls:  # an answer: the episode is over, the env's reward scores the transcript
            state["messages"].append({"role": "assistant", "content": text})
            return Reply(None, 0.0, True)
        outcomes = [run_call(c, self._tools, self.timeout, self.max_result_chars) for c in calls[: self.max_calls]]
        outcomes += [
            ToolOutcome(c.name, "malformed", f"error: too many calls in one turn (at most {self.max_calls})")
            for c in calls[self.max_calls :]
        ]
        tool_calls = [
            {"type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in calls
            if c.error is None
        ]
        state["messages"].append({"role": "assistant", "content": text, "tool_calls": tool_calls})
        results = [{"role": "tool", "name": o.name or "unknown", "content": o.content} for o in outcomes]
        state["messages"].extend(results)
        state["calls"] += len(outcomes)
        state["errors"] += sum(o.status != "ok" for o in outcomes)
        shown = render_reply(binding.tokenizer, binding.template, results, binding.end_of_turn, binding.template_kwargs)
        return Reply(shown, 0.0, False)

    def messages(self, state: dict[str, Any]) -> list[dict[str, Any]]:
        """The conversation after the prompt: assistant turns (with their parsed ``tool_calls``) and ``tool``
        messages, TRL's conversational completion of a tool episode."""
        return copy.deepcopy(state["messages"])

    def episode_info(self, state: dict[str, Any]) -> dict[str, int]:
        """``tool_calls`` (calls answered) and ``tool_errors`` (those that were not ``"ok"``)."""
        return {"tool_calls": int(state["calls"]), "tool_errors": int(state["errors"])}

    def __repr__(self) -> str:
        names = ", ".join(self._tools)
        return f"ToolCalling(tools=[{names}], timeout={self.timeout}, tool_format={self.tool_format!r})"
