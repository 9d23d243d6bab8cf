"""Tool calls in a model family's own format: how tools are announced, and how calls are read from the model's text.

Two families' formats, the ones their instruct models were trained on:

* ``"hermes"`` (Hermes 2 Pro, Qwen2 and Qwen2.5, and the chat templates that render ``tools=`` with
  ``<tool_call>``): one JSON object per call, ``<tool_call>{"name": "multiply", "arguments": {"a": 3, "b": 4}}
  </tool_call>``, several tags for several calls.
* ``"smollm2"`` (SmolLM2-Instruct, trained on its own function-calling data; its chat template does not render
  ``tools=``): one tag holding a JSON list, ``<tool_call>[{"name": "multiply", "arguments": {"a": 3, "b": 4}}]
  </tool_call>``.

:func:`detect_format` chooses from the tokenizer's chat template. A template that renders ``tools=`` itself (Qwen2.5's)
describes the tools; for one that does not (SmolLM2's, and the plain fallback of :mod:`textrl_envs.tools.rendering`)
:meth:`ToolCallFormat.system_prompt` writes the description into the system message, in the family's format.

Reading is forgiving about whitespace and strict about structure: a tag whose content is not the format's JSON is a
*malformed* call (:class:`ToolCall` with an ``error``), which the model is told about, never an exception.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["FORMATS", "ToolCall", "ToolCallFormat", "detect_format", "renders_tools"]

_TAG = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", flags=re.S)


@dataclass(frozen=True)
class ToolCall:
    """One call read from the model's text.

    :param name: The tool's name (``None`` when it could not be read).
    :param arguments: Its arguments, as JSON decoded them (``None`` when they could not be read).
    :param error: What is wrong with the call's form (``None``: well formed).
    """

    name: str | None
    arguments: Any
    error: str | None = None


def _one_call(item: Any) -> ToolCall:
    """A decoded JSON value as one call ``{"name": str, "arguments": object}`` (arguments may be JSON text)."""
    if not isinstance(item, Mapping):
        return ToolCall(None, None, f'a call must be a JSON object {{"name": ..., "arguments": {{...}}}}, got {item!r}')
    name, arguments = item.get("name"), item.get("arguments", item.get("parameters", {}))
    if not isinstance(name, str) or not name:
        return ToolCall(None, arguments, 'a call needs "name": the name of a tool')
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return ToolCall(name, None, f"the arguments of {name!r} are not JSON: {arguments!r}")
    return ToolCall(name, arguments)


@dataclass(frozen=True)
class ToolCallFormat:
    """A family's tool-call format.

    :param name: ``"hermes"`` or ``"smollm2"``.
    :param listed: Whether one tag holds a JSON list of calls (SmolLM2) rather than one call (Hermes).
    """

    name: str
    listed: bool

    def find(self, text: str) -> list[ToolCall]:
        """The calls in ``text``, in order (empty: the text calls no tool, it is an answer)."""
        calls: list[ToolCall] = []
        for match in _TAG.finditer(text):
            body, closed = match.group(1).strip(), bool(match.group(2))
            if not closed:
                calls.append(ToolCall(None, None, "a <tool_call> tag is not closed with </tool_call>"))
                continue
            try:
                value = json.loads(body)
            except json.JSONDecodeError as err:
                calls.append(ToolCall(None, None, f"the call is not valid JSON ({err.msg}): {body[:80]!r}"))
                continue
            if not isinstance(value, list):
                calls.append(_one_call(value))
            elif value:
                calls.extend(_one_call(v) for v in value)
            else:
                calls.append(ToolCall(None, None, "the <tool_call> tag holds an empty list: no call"))
        return calls

    def example(self, name: str, arguments: Mapping[str, Any]) -> str:
        """How a call of ``name`` with ``arguments`` is written in this format."""
        call = {"name": name, "arguments": dict(arguments)}
        return f"<tool_call>{json.dumps([call] if self.listed else call)}</tool_call>"

    def system_prompt(self, schemas: Sequence[Mapping[str, Any]]) -> str:
        """The system message that describes ``schemas`` (the tools' JSON schemas) and how to call them, for a chat
        template that does not render ``tools=`` itself."""
        if self.listed:
            listing = json.dumps([s["function"] for s in schemas])
            how = (
                "To call functions, write them as a JSON list inside <tool_call></tool_call> tags: "
                '<tool_call>[{"name": "function name", "arguments": {"argument": "value"}}]</tool_call>. '
                "Call none when you can answer; then write only the answer."
            )
            return f"You can call these functions: <tools>{listing}</tools>\n{how}"
        listing = "\n".join(json.dumps(s) for s in schemas)
        how = (
            "For each function call, write a JSON object with its name and arguments inside <tool_call></tool_call> "
            'tags: <tool_call>{"name": "function name", "arguments": {"argument": "value"}}</tool_call>. When you can '
            "answer, write the answer without a tag."
        )
        return f"You can call the functions described within <tools></tools>:\n<tools>\n{listing}\n</tools>\n{how}"


#: The formats by name.
FORMATS: dict[str, ToolCallFormat] = {
    "hermes": ToolCallFormat("hermes", listed=False),
    "smollm2": ToolCallFormat("smollm2", listed=True),
}


def detect_format(chat_template: str | None) -> ToolCallFormat:
    """The tool-call format of the model family whose chat template this is: SmolLM2's for SmolLM2's template, Hermes'
    otherwise (Qwen2 and Qwen2.5, Hermes, and the templates that render ``tools=`` with ``<tool_call>`` tags)."""
    if chat_template and "SmolLM" in chat_template:
        return FORMATS["smollm2"]
    return FORMATS["hermes"]


def renders_tools(chat_template: str | None) -> bool:
    """Whether the template renders the ``tools`` it is given (it names the variable), as Qwen2.5's does."""
    return bool(chat_template) and re.search(r"\btools\b", chat_template) is not None
